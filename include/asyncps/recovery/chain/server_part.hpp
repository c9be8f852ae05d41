// asyncps — recovery::chain_replication, server part: the chain protocol of one member.
//
// The chain master decides every server's predecessor and successor (`chain_config`). Strict:
// entries (worker pushes and clocks, in the order the head applied them) flow down the chain
// and acks (log positions) flow back up; a worker's push is acked once the tail has it.
// Relaxed: the head copies its whole state down the chain every `replicate_every` pushes.
// Everything here runs in `basic_server`'s hooks (declared in recovery.hpp), on its executor:
// sans-io, with no coroutine, timer or socket of its own. The links to the master and the
// successor are schedules on the part's timers (`ctx.arm_timer`, hook `on_timer`) and connects
// the server makes for it (`ctx.connect`, hooks `on_connected` / `on_connect_failed`), so a
// test steps a member event by event (tests/unit/policy_steps_test.cpp).
//
// This file holds the class, its hooks and its small helpers; the longer members are defined at
// its end, in server_part_links.ipp (the links to the master and the successor, the master's
// configuration, a predecessor's hello) and server_part_log.ipp (entries, state transfers,
// commits and acks).
#pragma once

#include <algorithm>
#include <any>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "asyncps/detail/codec/shard_state.hpp"
#include "asyncps/detail/ring.hpp"
#include "asyncps/detail/server/hooks.hpp"
#include "asyncps/detail/text.hpp"
#include "asyncps/error.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery/chain/errors.hpp"
#include "asyncps/recovery/chain/messages.hpp"
#include "asyncps/recovery/chain/options.hpp"
#include "asyncps/recovery/chain/server_state.hpp"
#include "asyncps/recovery/chain/server_stats.hpp"
#include "asyncps/shard_state.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::recovery {

/// recovery::chain_replication, server part: options, this member's endpoints, the chain
/// protocol (master link, predecessor and successor links, log, acks) and its counters.
///
/// Copying a part copies its options and endpoints only (run-time state starts empty), so one
/// configured part may be copied into several servers. Thread safety: on the server's executor.
template <chain_mode Mode>
class chain_server_part {
 public:
  chain_options options{};  ///< heartbeats and the relaxed interval

  /// This server's place in its shard's chain: the master's and every member's endpoint
  /// (`Endpoint` = the transport's `endpoint_type`). Call before `async_serve`, which otherwise
  /// fails with `errc::invalid_argument` (also when `self >= members.size()` or the endpoint
  /// type is not the transport's).
  template <class Endpoint>
  void set_chain(chain_endpoints<Endpoint> c) {
    self_ = c.self;
    members_ = c.members.size();
    endpoints_ = std::move(c);
  }
  /// As above, from the parts: `set_chain(master, members, self)`.
  template <class Endpoint>
  void set_chain(std::type_identity_t<Endpoint> master, std::vector<Endpoint> members,
                 std::uint32_t self) {
    set_chain(chain_endpoints<Endpoint>{std::move(master), std::move(members), self});
  }
  /// Whether the master made this server its chain's head (it then serves workers; other
  /// members refuse them with `chain_errc::not_head`).
  bool is_head() const noexcept { return rt_.value.head; }
  /// Whether this server is its chain's head without the shard's state: it joined a running
  /// chain (registered after the shard's chain had started), and every member that held the
  /// state failed before it got a state transfer. It then refuses every worker with
  /// `chain_errc::shard_lost` instead of serving its initial values; nothing clears it but a state
  /// transfer. See docs/recovery/chain_replication.md ("When a whole chain dies").
  bool shard_lost() const noexcept { return rt_.value.lost; }
  /// Pushes and clocks applied by this server (its log position).
  std::uint64_t log_position() const noexcept { return rt_.value.log_index; }
  /// Strict: the log position the tail has acknowledged (what workers were acked).
  std::uint64_t committed() const noexcept { return rt_.value.committed; }
  /// The counters.
  const chain_stats& stats() const noexcept { return rt_.value.stats; }

  // ---- hooks (see recovery.hpp, server hooks) ----

  /// Checks the endpoints and starts the link to the chain master.
  template <class Ctx>
  std::error_code on_serve(Ctx ctx) {
    if (endpoints<Ctx>() == nullptr || self_ >= members_) {
      ctx.log("chain replication needs set_chain(...) with this server among the members");
      return errc::invalid_argument;
    }
    connect_master(ctx);
    return {};
  }
  /// Only the head serves workers; a head without the shard's state (`shard_lost()`) refuses
  /// them with `chain_errc::shard_lost`.
  template <class Ctx>
  std::error_code on_hello(Ctx ctx, const frame_header&, std::string& detail) {
    const auto& r = rt_.value;
    if (r.head && !r.lost) return {};
    detail = " (server " + std::to_string(self_) + " of shard " +
             std::to_string(ctx.options().shard) + ")";
    if (!r.head) return chain_errc::not_head;
    detail = " (shard " + std::to_string(ctx.options().shard) +
             ": every server of its chain that held its state failed; server " +
             std::to_string(self_) + " is head since chain epoch " + std::to_string(r.lost_epoch) +
             " without it, and the pushes applied to the shard are gone)";
    return chain_errc::shard_lost;
  }
  /// A member that is not the head refuses workers with `chain_errc::not_head`: routine (the worker
  /// tries the shard's next server), neither logged nor counted as a rejected request.
  bool routine_refusal(std::error_code refusal) const noexcept {
    return refusal == chain_errc::not_head;
  }
  /// Strict: the clock jump of a rejoining worker is replicated like any other clock (the
  /// log must hold every state change).
  template <class Ctx>
  void on_rejoin(Ctx ctx, std::uint32_t worker, clock_value from, clock_value to) {
    if constexpr (strict) {
      for (clock_value k = from; k < to; ++k) {
        message c;
        c.header.type = message_type::clock;
        c.header.sender = worker;
        c.header.clock = k;
        c.header.seq = ctx.last_seq(worker);
        append_entry(ctx, c);
      }
    }
  }
  /// A `chain_hello` from the configured predecessor claims the session.
  template <class Ctx>
  std::optional<std::error_code> on_unknown_peer(Ctx ctx, detail::session_base& s, const message& m,
                                                 std::string& detail) {
    if (m.header.type != protocol::chain_hello_type) return std::nullopt;
    return greet_predecessor(ctx, s, m, detail);
  }
  /// Drops a push (or numbered clock) resent after a failover that this server applied.
  template <class Ctx>
  bool on_push(Ctx ctx, detail::session_base& s, const frame_header& h) {
    const bool numbered = h.type == message_type::push || h.seq != 0;
    if (!numbered || h.seq > ctx.last_seq(s.worker)) return false;
    ++rt_.value.stats.duplicates;
    if (h.has(frame_flags::want_ack)) {
      rt_.value.pending_acks.push_back(
          detail::chain_pending_ack{rt_.value.log_index, s.worker, h.seq});
      release_acks(ctx);
    }
    return true;
  }
  /// A worker's push or clock the head just applied: strict, log it and ack it once the
  /// tail has it; relaxed, count it toward the next state copy. The part sends every ack.
  template <class Ctx>
  bool on_applied(Ctx ctx, detail::session_base& s, const message& m) {
    auto& r = rt_.value;
    if constexpr (strict) {
      append_entry(ctx, m);
      if (m.header.has(frame_flags::want_ack))
        r.pending_acks.push_back(detail::chain_pending_ack{r.log_index, s.worker, m.header.seq});
      release_acks(ctx);
    } else {
      ++r.log_index;
      ++r.stats.entries;
      if (m.header.has(frame_flags::want_ack)) ctx.ack(s, m.header.seq);
      if (++r.since_copy >= options.replicate_every && r.succ != nullptr && r.succ->ready)
        send_state(ctx, *r.succ);
    }
    return true;
  }
  /// Messages from the master, the predecessor and the successor.
  template <class Ctx>
  std::error_code on_peer_message(Ctx ctx, detail::session_base& s, message& m,
                                  std::string& detail) {
    const auto& h = m.header;
    auto& r = rt_.value;
    if (h.type == message_type::heartbeat) return {};
    if (h.type == message_type::error || h.type == message_type::bye) {
      protocol::error e;
      if (h.type == message_type::error && !protocol::decode(m, e, detail))
        ctx.log(std::string(s.role == role_master ? "chain master" : "chain peer") +
                " closed the connection: " + asyncps::detail::peer_text(e.reason));
      ctx.close_after_flush(s);
      return {};
    }
    switch (s.role) {
      case role_master:
        if (h.type == protocol::chain_config_type) {
          protocol::chain_config c;
          if (auto ec = protocol::decode(m, c, detail)) return ec;
          if (c.shard != ctx.options().shard || c.member != self_) break;
          on_config(ctx, c);
          return {};
        }
        break;
      case role_successor:
        if (h.type != message_type::ack) break;
        if (!s.ready) {
          successor_ready(ctx, s, h.seq, h.has(protocol::chain_needs_state_flag));
        } else if constexpr (strict) {
          if (h.seq > r.log_index) {
            detail = " (successor acknowledges log position " + std::to_string(h.seq) +
                     ", this server is at " + std::to_string(r.log_index) + ")";
            return errc::unexpected_message;
          }
          commit(ctx, h.seq);
        }
        return {};
      case role_predecessor: return apply_entry(ctx, s, m, detail);
      default: break;
    }
    detail = " (type " + std::to_string(static_cast<int>(h.type)) + " on a chain link)";
    return errc::unexpected_message;
  }
  /// Forgets a link that ended (the master's is made again at its next heartbeat; the
  /// successor's at once).
  template <class Ctx>
  void on_session_closed(Ctx ctx, detail::session_base& s) {
    auto& r = rt_.value;
    if (r.pred == &s) r.pred = nullptr;
    if (r.succ == &s) {
      r.succ = nullptr;
      wake_successor_link(ctx);
    }
    if (r.master == &s) r.master = nullptr;
  }
  /// The links' timers: heartbeats to the master and the successor, reconnects with backoff.
  template <class Ctx>
  void on_timer(Ctx ctx, std::uint32_t timer);
  /// A connect this part asked for made a link: registers with the master, or greets the
  /// successor (closed instead when the configuration moved on meanwhile).
  template <class Ctx>
  void on_connected(Ctx ctx, detail::session_base& s);
  /// A connect this part asked for failed: retried after a backoff.
  template <class Ctx>
  void on_connect_failed(Ctx ctx, std::uint8_t role, std::error_code ec);
  /// Only the head serves workers (not one without the shard's state).
  bool serves_workers() const noexcept { return rt_.value.head && !rt_.value.lost; }
  /// Log lines name the member: "asyncps server <shard>.<member>".
  std::string log_suffix() const { return "." + std::to_string(self_); }
  /// "chain predecessor 1", "chain successor 2", "chain master".
  std::string peer_name(const detail::session_base& s) const {
    switch (s.role) {
      case role_predecessor: return "chain predecessor " + std::to_string(s.peer);
      case role_successor: return "chain successor " + std::to_string(s.peer);
      case role_master: return "chain master";
      default: return "chain peer";
    }
  }

 private:
  static constexpr bool strict = Mode == chain_mode::strict;
  static constexpr std::uint32_t no_member = detail::chain_no_member;
  enum : std::uint8_t { role_none, role_master, role_predecessor, role_successor };

  template <class Ctx>
  const chain_endpoints<typename Ctx::endpoint_type>* endpoints() const {
    return std::any_cast<chain_endpoints<typename Ctx::endpoint_type>>(&endpoints_);
  }
  static std::string member_name(std::uint32_t m) {
    return m == no_member ? std::string("none") : std::to_string(m);
  }
  template <class Ctx>
  message chain_message(Ctx ctx, message_type type, std::uint64_t seq) const {
    message m;
    m.header.type = type;
    m.header.sender = ctx.options().shard;
    m.header.seq = seq;
    return m;
  }
  template <class Ctx>
  message chain_hello(Ctx ctx) const {
    return protocol::encode(protocol::chain_hello{.shard = ctx.options().shard,
                                                  .member = self_,
                                                  .fingerprint = ctx.fingerprint(),
                                                  .epoch = rt_.value.epoch},
                            [&](std::size_t n) { return ctx.allocate(n); });
  }

  // ---- the links and the configuration (defined in server_part_links.ipp) ----

  // The link to the chain master: registers, sends heartbeats every heartbeat_interval
  // (timer `master_timer`), and registers again when the link drops (the master then treats
  // this server as a new member: it rejoins as the tail), connecting with backoff.
  template <class Ctx>
  void connect_master(Ctx ctx);
  // The link to the configured successor (timer `successor_timer`): kept while one is
  // configured and this server has the state to feed it, reconnected with backoff, sent
  // heartbeats once synced. One step of its schedule:
  template <class Ctx>
  void successor_link_step(Ctx ctx);
  // Runs the successor link's next step soon (a new successor, a lost link, a state
  // installed), unless a connect is in flight (its completion runs it).
  template <class Ctx>
  void wake_successor_link(Ctx ctx);
  static constexpr std::uint32_t master_timer = 0;  // the part's timers (ctx.arm_timer)
  static constexpr std::uint32_t successor_timer = 1;

  // Drops everything this server did as a chain member: it rejoins from a state transfer.
  template <class Ctx>
  void leave_chain(Ctx ctx);

  template <class Ctx>
  void on_config(Ctx ctx, const protocol::chain_config& h);

  template <class Ctx>
  std::error_code greet_predecessor(Ctx ctx, detail::session_base& s, const message& m,
                                    std::string& detail);

  // ---- the log: entries, state transfers, commits, acks (defined in server_part_log.ipp) ----

  // An entry (or a state transfer) from the predecessor.
  template <class Ctx>
  std::error_code apply_entry(Ctx ctx, detail::session_base& s, message& m, std::string& detail);

  template <class Ctx>
  std::error_code install_state(Ctx ctx, detail::session_base& s, message& m, std::string& detail);

  // The successor answered our chain_hello with its log position: bring it up to date.
  template <class Ctx>
  void successor_ready(Ctx ctx, detail::session_base& s, std::uint64_t their_index,
                       bool needs_state);

  template <class Ctx>
  void send_state(Ctx ctx, detail::session_base& s);

  // Strict: entry `m` was applied here; it takes the next log position and goes down.
  template <class Ctx>
  void append_entry(Ctx ctx, const message& m);

  // Log positions up to `index` are applied by the tail: forget them, tell the predecessor,
  // ack the workers whose pushes they were.
  template <class Ctx>
  void commit(Ctx ctx, std::uint64_t index);

  template <class Ctx>
  void release_acks(Ctx ctx);

  std::any endpoints_{};  // chain_endpoints<transport endpoint>
  std::uint32_t self_ = 0;
  std::size_t members_ = 0;
  detail::fresh_on_copy<detail::chain_runtime> rt_{};
};

}  // namespace asyncps::recovery

#include "asyncps/recovery/chain/server_part_links.ipp"
#include "asyncps/recovery/chain/server_part_log.ipp"
