// asyncps — recovery::chain_replication, server part: the chain protocol of one member.
//
// The chain master decides every server's predecessor and successor (`chain_config`). Strict:
// entries (worker pushes and clocks, in the order the head applied them) flow down the chain
// and acks (log positions) flow back up; a worker's push is acked once the tail has it.
// Relaxed: the head copies its whole state down the chain every `replicate_every` pushes.
// Everything here runs in `basic_server`'s hooks (declared in recovery.hpp) or in the coroutines
// they spawn (`ctx.spawn`: the links to the master and the successor), on its executor.
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

#include <asio/awaitable.hpp>

#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/ring.hpp"
#include "asyncps/detail/server_hooks.hpp"
#include "asyncps/detail/shard_state_codec.hpp"
#include "asyncps/detail/text.hpp"
#include "asyncps/error.hpp"
#include "asyncps/protocol.hpp"
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
  /// members refuse them with `errc::not_head`).
  bool is_head() const noexcept { return rt_.value.head; }
  /// Whether this server is its chain's head without the shard's state: it joined a running
  /// chain (registered after the shard's chain had started), and every member that held the
  /// state failed before it got a state transfer. It then refuses every worker with
  /// `errc::shard_lost` instead of serving its initial values; nothing clears it but a state
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
    ctx.spawn(master_link(ctx));
    return {};
  }
  /// Only the head serves workers; a head without the shard's state (`shard_lost()`) refuses
  /// them with `errc::shard_lost`.
  template <class Ctx>
  std::error_code on_hello(Ctx ctx, const frame_header&, std::string& detail) {
    const auto& r = rt_.value;
    if (r.head && !r.lost) return {};
    detail = " (server " + std::to_string(self_) + " of shard " +
             std::to_string(ctx.options().shard) + ")";
    if (!r.head) return errc::not_head;
    detail = " (shard " + std::to_string(ctx.options().shard) +
             ": every server of its chain that held its state failed; server " +
             std::to_string(self_) + " is head since chain epoch " + std::to_string(r.lost_epoch) +
             " without it, and the pushes applied to the shard are gone)";
    return errc::shard_lost;
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
    if (m.header.type != message_type::chain_hello) return std::nullopt;
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
        if (h.type == message_type::chain_config) {
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
          successor_ready(ctx, s, h.seq, h.has(frame_flags::state));
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
  /// Forgets a link that ended.
  template <class Ctx>
  void on_session_closed(Ctx, detail::session_base& s) {
    auto& r = rt_.value;
    if (r.pred == &s) r.pred = nullptr;
    if (r.succ == &s) {
      r.succ = nullptr;
      r.succ_wake();
    }
    if (r.master == &s) r.master = nullptr;
  }
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

  // Registers with the chain master, sends it heartbeats, and registers again when the link
  // drops (the master then treats this server as a new member: it rejoins as the tail).
  template <class Ctx>
  asio::awaitable<void> master_link(Ctx ctx) {
    auto& r = rt_.value;
    typename Ctx::timer_type timer(ctx.executor());
    std::chrono::milliseconds backoff{10};
    while (!ctx.stopped()) {
      if (r.master == nullptr) {
        auto [ec, conn] = co_await ctx.async_connect(endpoints<Ctx>()->master);
        if (!ec && !ctx.stopped()) {
          r.master = &ctx.add_peer(std::move(conn), role_master);
          r.first_config = true;
          ctx.send_peer(*r.master, chain_hello(ctx));
          backoff = std::chrono::milliseconds(10);
        } else {
          if (!ec) conn.close();
          backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
        }
      } else {
        ctx.send_peer(*r.master, chain_message(ctx, message_type::heartbeat, 0));
      }
      timer.expires_after(r.master == nullptr ? backoff : options.heartbeat_interval);
      co_await timer.async_wait(detail::use_tuple);
    }
  }

  // Keeps a connection to the configured successor (reconnecting while it stays configured).
  template <class Ctx>
  asio::awaitable<void> successor_link(Ctx ctx) {
    auto& r = rt_.value;
    typename Ctx::timer_type timer(ctx.executor());
    r.succ_wake =
        detail::chain_waker{&timer, [](void* t) { static_cast<decltype(&timer)>(t)->cancel(); }};
    std::chrono::milliseconds backoff{1};
    while (!ctx.stopped() && r.succ_member != no_member) {
      if (r.succ == nullptr && !r.fresh) {
        const std::uint32_t target = r.succ_member;
        auto [ec, conn] = co_await ctx.async_connect(endpoints<Ctx>()->members[target]);
        if (!ec && !ctx.stopped() && r.succ_member == target && r.succ == nullptr && !r.fresh) {
          r.succ = &ctx.add_peer(std::move(conn), role_successor);
          r.succ->peer = target;
          ctx.send_peer(*r.succ, chain_hello(ctx));
        } else if (!ec) {
          conn.close();
        }
        // A refused or failed attempt (e.g. the successor has not got its configuration
        // yet) is retried with backoff; a synced link resets it.
        backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
      } else if (r.succ != nullptr && r.succ->ready) {
        backoff = std::chrono::milliseconds(1);
        // Tells the successor this link is live (chain_options::link_silence).
        ctx.send_peer(*r.succ, chain_message(ctx, message_type::heartbeat, 0));
      }
      timer.expires_after(r.succ == nullptr ? backoff : options.heartbeat_interval);
      co_await timer.async_wait(detail::use_tuple);
    }
    r.succ_wake = detail::chain_waker{};
    r.succ_connecting = false;
  }

  // Drops everything this server did as a chain member: it rejoins from a state transfer.
  template <class Ctx>
  void leave_chain(Ctx ctx) {
    auto& r = rt_.value;
    ctx.close_if([](const detail::session_base& s) {
      return s.is_worker() ||
             (s.is_peer() && (s.role == role_predecessor || s.role == role_successor));
    });
    r.pred = r.succ = nullptr;
    r.head = false;
    r.fresh = true;
    r.sent.clear();
    r.pending_acks.clear();
    r.committed = 0;
    r.pred_member = r.succ_member = no_member;
  }

  template <class Ctx>
  void on_config(Ctx ctx, const protocol::chain_config& h) {
    auto& r = rt_.value;
    ++r.stats.configs;
    const auto pred = h.predecessor;
    const auto succ = h.successor;
    const auto known = [this](std::uint64_t m) { return m == no_member || m < members_; };
    if (!known(pred) || !known(succ)) {
      // The master's member ids and this server's set_chain list disagree: a configuration
      // error, reported instead of connecting to an endpoint this server does not know.
      ctx.log("chain master names member " + std::to_string(pred) + " / " + std::to_string(succ) +
              ", but set_chain lists " + std::to_string(members_) +
              " members; ignoring the configuration");
      return;
    }
    if (h.joining && r.first_config) {
      // Registered anew with a running chain: whatever this server holds may be stale.
      if (r.serving) ctx.log("rejoining the chain: dropping this server's state and connections");
      leave_chain(ctx);
    }
    r.first_config = false;
    r.serving = true;
    r.epoch = h.epoch;
    if (r.pred != nullptr && r.pred->peer != pred) {
      ctx.close(*r.pred);
      r.pred = nullptr;
    }
    r.pred_member = pred;
    const bool was_head = r.head;
    r.head = pred == no_member;
    if (r.head && r.fresh && !r.lost) {
      // Fresh (it registered with a running chain and has no state transfer yet) and head:
      // every server that held the shard's state failed. Its initial values are not the
      // shard's state, so it serves none: it stays fresh (it neither feeds a successor nor
      // takes entries) and refuses workers with shard_lost.
      r.lost = true;
      r.lost_epoch = h.epoch;
      ctx.log("shard " + std::to_string(ctx.options().shard) +
              " is lost: every server of its chain that held its state failed before this "
              "server got a state transfer (chain epoch " +
              std::to_string(h.epoch) +
              "). Refusing workers with shard_lost instead of serving its initial values");
    }
    if (was_head && !r.head)
      ctx.close_if([](const detail::session_base& s) { return s.is_worker(); });
    if (succ != r.succ_member) {
      if (r.succ != nullptr) {
        ctx.close(*r.succ);
        r.succ = nullptr;
      }
      r.succ_member = succ;
      r.succ_wake();
      if (succ == no_member) {
        if constexpr (strict) {
          r.sent.clear();
          if (!r.fresh) commit(ctx, r.log_index);  // the tail commits what it applies
        }
      } else if (!r.succ_connecting) {
        r.succ_connecting = true;
        ctx.spawn(successor_link(ctx));
      }
    }
    ctx.log("chain epoch " + std::to_string(r.epoch) + ": predecessor " + member_name(pred) +
            ", successor " + member_name(succ) + (r.head ? " (head)" : "") +
            (succ == no_member ? " (tail)" : "") +
            (r.lost    ? ", without the shard's state (lost)"
             : r.fresh ? ", waiting for a state transfer"
                       : ""));
  }

  template <class Ctx>
  std::error_code greet_predecessor(Ctx ctx, detail::session_base& s, const message& m,
                                    std::string& detail) {
    auto& r = rt_.value;
    protocol::chain_hello h;
    if (auto ec = protocol::decode(m, h, detail)) return ec;
    if (h.fingerprint != ctx.fingerprint()) {
      detail = std::string(" (chain peer; this server runs recovery '") +
               std::string(ctx.policy_name()) + "')";
      return errc::policy_mismatch;
    }
    if (h.member >= members_) {
      detail = " (chain_hello from server " + std::to_string(h.member) + " of shard " +
               std::to_string(h.shard) + "; member ids of this chain lie in [0, " +
               std::to_string(members_) + "), as set_chain lists them)";
      return errc::unexpected_message;
    }
    if (!r.serving || h.shard != ctx.options().shard || r.pred_member == no_member ||
        h.member != r.pred_member) {
      detail = " (chain_hello from server " + std::to_string(h.member) + " of shard " +
               std::to_string(h.shard) + "; this server's predecessor in epoch " +
               std::to_string(r.epoch) + " is " + member_name(r.pred_member) + ")";
      return errc::unexpected_message;
    }
    if (r.pred != nullptr && r.pred != &s && r.pred->open) {
      // A second claim of the live predecessor's id: the real predecessor reconnecting before
      // this server saw its old link end, or a peer with the secret posing as it. The live
      // link stays unless it has been silent for link_silence (its predecessor heartbeats).
      const auto silent =
          std::chrono::duration_cast<std::chrono::milliseconds>(ctx.silent_for(*r.pred));
      if (silent < options.link_silence) {
        detail = " (chain_hello from server " + std::to_string(h.member) + " of shard " +
                 std::to_string(h.shard) + ": the live link of predecessor " +
                 std::to_string(h.member) + " was heard from " + std::to_string(silent.count()) +
                 " ms ago; it is replaced once closed or silent for link_silence " +
                 std::to_string(options.link_silence.count()) + " ms)";
        ++r.stats.claims_refused;
        return errc::member_id_in_use;
      }
      ctx.log("chain predecessor " + std::to_string(h.member) + ": a new link replaces one " +
              "silent for " + std::to_string(silent.count()) + " ms");
    }
    if (r.pred != nullptr) ctx.close(*r.pred);
    r.pred = &s;
    ctx.claim(s, role_predecessor);
    s.peer = h.member;
    message a = chain_message(ctx, message_type::ack, r.log_index);
    if (r.fresh) a.header.flags = frame_flags::state;
    ctx.send_peer(s, std::move(a));
    return {};
  }

  // An entry (or a state transfer) from the predecessor.
  template <class Ctx>
  std::error_code apply_entry(Ctx ctx, detail::session_base& s, message& m, std::string& detail) {
    const auto& h = m.header;
    auto& r = rt_.value;
    if (h.type == message_type::state) return install_state(ctx, s, m, detail);
    if (r.fresh || !strict || (h.type != message_type::push && h.type != message_type::clock)) {
      detail = r.fresh ? " (an entry before the state transfer)" : " (not a chain entry)";
      return errc::unexpected_message;
    }
    if (h.sender >= ctx.options().num_workers) return errc::bad_sender;
    if (h.clock != ctx.worker_clock(h.sender)) {
      detail = " (chain entry for clock " + std::to_string(h.clock) + " of worker " +
               std::to_string(h.sender) + ", which is at " +
               std::to_string(ctx.worker_clock(h.sender)) + " here)";
      return errc::unexpected_message;
    }
    if (h.type == message_type::push) {
      if (auto ec = ctx.check_rows(m, detail)) return ec;
      if (h.has(frame_flags::state) || h.has(frame_flags::backlog) ||
          !ctx.all_finite(payload_floats(m)))
        return errc::non_finite_value;
      // The head applied it, so a backup in the same state accepts it too; a refusal here
      // means the chain's states diverged: refuse the link rather than skip the entry.
      if (auto ec = ctx.apply_push(m)) {
        detail = " (chain entry of worker " + std::to_string(h.sender) + ")";
        return ec;
      }
    }
    ctx.last_seq(h.sender) = std::max(ctx.last_seq(h.sender), h.seq);
    append_entry(ctx, m);
    if (h.type == message_type::clock || h.has(frame_flags::end_of_clock))
      ctx.advance(h.sender, h.clock + 1);
    return {};
  }

  template <class Ctx>
  std::error_code install_state(Ctx ctx, detail::session_base& s, message& m, std::string& detail) {
    auto& r = rt_.value;
    std::string why;
    if (auto ec = detail::decode_state(m.payload.bytes(), r.incoming, why)) {
      detail = why;
      return ec;
    }
    if (m.header.seq > protocol::max_seq) {
      detail = " (state transfer from the predecessor at log position " +
               std::to_string(m.header.seq) + "; positions lie in [0, " +
               std::to_string(protocol::max_seq) + "])";
      return errc::bad_position;
    }
    if (auto ec = ctx.restore_state(r.incoming)) {
      detail = " (state transfer from the predecessor)";
      return ec;
    }
    r.log_index = m.header.seq;
    r.fresh = false;
    r.lost = false;  // a member that held the state passed it on
    ++r.stats.states_installed;
    r.succ_wake();  // it may now feed a successor
    if (r.stats.states_installed == 1 || strict)
      ctx.log("installed a state transfer at log position " + std::to_string(r.log_index) +
              " (server clock " + std::to_string(ctx.clock()) + ")");
    if constexpr (strict) {
      r.sent.clear();
      r.committed = 0;
      if (r.succ_member == no_member) {
        commit(ctx, r.log_index);
      } else if (r.succ != nullptr && r.succ->ready) {
        send_state(ctx, *r.succ);
      }
    } else {
      // Relaxed: pass the same copy on (no re-encoding), acknowledge to the predecessor only.
      if (r.succ != nullptr && r.succ->ready) {
        message f;
        f.header = m.header;
        f.payload = m.payload.share();
        ctx.send_peer(*r.succ, std::move(f));
      }
      ctx.send_peer(s, chain_message(ctx, message_type::ack, r.log_index));
    }
    return {};
  }

  // The successor answered our chain_hello with its log position: bring it up to date.
  template <class Ctx>
  void successor_ready(Ctx ctx, detail::session_base& s, std::uint64_t their_index,
                       bool needs_state) {
    auto& r = rt_.value;
    s.ready = true;
    if constexpr (!strict) {
      send_state(ctx, s);
    } else {
      const bool gap =
          their_index < r.log_index && (r.sent.empty() || their_index + 1 < r.sent_first);
      if (needs_state || their_index > r.log_index || gap) {
        send_state(ctx, s);  // entries after it follow as they are applied
        return;
      }
      for (std::uint64_t i = their_index + 1; i <= r.log_index; ++i) {
        const message& e = r.sent[static_cast<std::size_t>(i - r.sent_first)];
        message f;
        f.header = e.header;
        f.payload = e.payload.share();
        ctx.send_peer(s, std::move(f));
        ++r.stats.resent;
      }
    }
  }

  template <class Ctx>
  void send_state(Ctx ctx, detail::session_base& s) {
    auto& r = rt_.value;
    ctx.save_state(r.outgoing);
    const std::size_t bytes = detail::encoded_state_size(r.outgoing);
    if (bytes > ctx.max_frame_bytes()) {
      // The successor would reject the frame (frame_too_large) and we would resend it forever.
      ctx.log("cannot transfer this shard's state (" + std::to_string(bytes) +
              " bytes) to its successor: above wire_limits::max_frame_bytes (" +
              std::to_string(ctx.max_frame_bytes()) + ")");
      ctx.close(s);
      return;
    }
    buffer b = ctx.allocate(bytes);
    detail::encode_state(r.outgoing, std::span<std::byte>(b.data(), b.size()));
    message m = chain_message(ctx, message_type::state, r.log_index);
    m.header.clock = ctx.clock();
    m.payload = std::move(b);
    ctx.send_peer(s, std::move(m));
    ++r.stats.states_sent;
    r.since_copy = 0;
  }

  // Strict: entry `m` was applied here; it takes the next log position and goes down.
  template <class Ctx>
  void append_entry(Ctx ctx, const message& m) {
    auto& r = rt_.value;
    ++r.log_index;
    ++r.stats.entries;
    if (r.succ_member == no_member) {  // the tail: committed once applied
      commit(ctx, r.log_index);
      return;
    }
    message f;
    f.header = m.header;
    f.payload = m.payload.share();
    if (r.succ != nullptr && r.succ->ready) {
      message g;
      g.header = f.header;
      g.payload = f.payload.share();
      ctx.send_peer(*r.succ, std::move(g));
    }
    if (r.sent.empty()) r.sent_first = r.log_index;
    r.sent.push_back(std::move(f));
  }

  // Log positions up to `index` are applied by the tail: forget them, tell the predecessor,
  // ack the workers whose pushes they were.
  template <class Ctx>
  void commit(Ctx ctx, std::uint64_t index) {
    auto& r = rt_.value;
    if (index <= r.committed) return;
    r.committed = index;
    while (!r.sent.empty() && r.sent_first <= index) {
      r.sent.pop_front();
      ++r.sent_first;
    }
    if (r.pred != nullptr) ctx.send_peer(*r.pred, chain_message(ctx, message_type::ack, index));
    release_acks(ctx);
  }

  template <class Ctx>
  void release_acks(Ctx ctx) {
    auto& r = rt_.value;
    while (!r.pending_acks.empty() && r.pending_acks.front().index <= r.committed) {
      const auto& p = r.pending_acks.front();
      ctx.ack_worker(p.worker, p.seq);
      r.pending_acks.pop_front();
    }
  }

  std::any endpoints_{};  // chain_endpoints<transport endpoint>
  std::uint32_t self_ = 0;
  std::size_t members_ = 0;
  detail::fresh_on_copy<detail::chain_runtime> rt_{};
};

}  // namespace asyncps::recovery
