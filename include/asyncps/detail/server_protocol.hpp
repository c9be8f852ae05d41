// asyncps — detail::server_protocol: what a server does with each message, sans-io.
//
// It owns the shard core (detail/shard_core.hpp), the recovery policy's server part, the
// sessions (their sans-io state: outbox, subscriptions, waiting pulls), the worker registry
// and the counters. A message in (`receive`) greets a hello, validates and dispatches a
// worker's push, clock, pull, bye or error, or hands a peer's message to the recovery part;
// its effects are recorded as data (messages queued in a session's outbox, sessions marked
// closing) plus a few calls on the shell `Io`, which owns every socket, timer and executor.
// It also keeps the server's resource bounds: the per-connection queue limits, the server-wide
// queue budget (`enqueue`), and the hello and send deadlines (`sweep`, run by one timer of the
// shell: the sweeper), deciding them with detail::server_bounds (detail/server_bounds.hpp).
//
//   io.ctx()             the recovery hooks' context (basic_server::context)
//   io.wake(s)           session `s` has a message to send or is closing: wake its write loop
//   io.close(s)          close `s`'s connection now (its loops then finish)
//   io.allocate(n)       a payload buffer of n bytes
//   io.now()             the transport clock's time
//   io.wake_watchdog()   a pull now waits, or nothing can wait any more: re-arm the watchdog
//   io.wake_sweeper()    a deadline earlier than the sweeper's timer appeared, or nothing is
//                        watched any more: the sweeper calls `sweep` and re-arms its timer
//   io.server()          what the recovery part's `on_clock(clock, server)` receives
//
// `basic_server` (server.hpp) is the shell; tests/unit/server_core_test.cpp steps it with a
// shell that records. Thread safety: one thread at a time (the server's executor).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <list>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "asyncps/consistency.hpp"
#include "asyncps/detail/accept_retry.hpp"
#include "asyncps/detail/log_limiter.hpp"
#include "asyncps/detail/membership.hpp"
#include "asyncps/detail/server_bounds.hpp"
#include "asyncps/detail/server_hooks.hpp"
#include "asyncps/detail/server_session.hpp"
#include "asyncps/detail/shard_core.hpp"
#include "asyncps/detail/text.hpp"
#include "asyncps/detail/vap_visibility.hpp"
#include "asyncps/error.hpp"
#include "asyncps/log.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/server_options.hpp"
#include "asyncps/shard_state.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::detail {

/// The protocol of one server shard (see the file comment). `Session` derives from
/// `server_session_state<TimePoint>` and has `typename std::list<Session>::iterator self`;
/// `TimePoint` is the transport clock's time; `Io` is the shell (pointer kept; it outlives
/// this object).
template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
class server_protocol {
 public:
  using core_type = shard_core<Optimizer, Session*, TimePoint>;
  using part_type = typename Recovery::server_part;
  static constexpr std::uint32_t no_worker = session_base::none;

  /// Builds the shard of `opts` (throws `std::invalid_argument` naming a bad field).
  server_protocol(Io& io, server_options opts, Optimizer opt, part_type part)
      : io_(&io), opts_(std::move(opts)), part_(std::move(part)),
        core_(opts_.shard, opts_.num_shards, opts_.num_workers, opts_.tables, opts_.seed, opt),
        connected_once_(opts_.num_workers, 0), trained_once_(opts_.num_workers, 0), bounds_(opts_),
        membership_(opts_.elastic, opts_.num_workers) {
    if (opts_.elastic) {
      if (Recovery::name != std::string_view("none"))
        throw std::invalid_argument(
            "asyncps::server_options: elastic membership needs recovery policy 'none' (this "
            "server runs '" +
            std::string(Recovery::name) + "')");
      core_.set_elastic(opts_.elastic->start_members);
    }
  }

  const server_options& options() const noexcept { return opts_; }
  server_stats& stats() noexcept { return stats_; }
  const server_stats& stats() const noexcept { return stats_; }
  part_type& part() noexcept { return part_; }
  const part_type& part() const noexcept { return part_; }
  core_type& core() noexcept { return core_; }
  const core_type& core() const noexcept { return core_; }
  std::list<Session>& sessions() noexcept { return sessions_; }
  const std::list<Session>& sessions() const noexcept { return sessions_; }
  /// The session of worker `w`, or null when it is not connected.
  Session* worker_session(std::uint32_t w) const {
    return w < registered_.size() ? registered_[w] : nullptr;
  }
  /// Whether the watchdog sleeps until a pull is deferred (read and set by the shell).
  bool watchdog_idle = false;
  /// Payload bytes queued now over all sessions not closed at once (see
  /// `server_options::max_total_queued_bytes`).
  std::uint64_t total_queued_bytes() const noexcept { return bounds_.queued_bytes(); }

  // ---- sessions ----

  /// A new connection: a session built from `args` (unknown until its first message).
  template <class... Args>
  Session& add_session(Args&&... args) {
    auto& s = sessions_.emplace_back(std::forward<Args>(args)...);
    s.self = std::prev(sessions_.end());
    if constexpr (requires { s.conn.remote_endpoint(); }) {
      // Taken now: once the peer has gone, a socket no longer knows it.
      s.address = endpoint_string(s.conn.remote_endpoint());
    }
    if (bounds_.on_opened(s, io_->now())) io_->wake_sweeper();
    return s;
  }
  /// Both loops of `s` finished: forgets it (worker registry, waiting pulls, recovery part).
  void session_finished(Session& s) {
    if (s.is_worker() && worker_session(s.worker) == &s) {
      undo_untrained_raise(s);
      registered_[s.worker] = nullptr;
      // Elastic: a member whose connection ended without bye leaves after the grace period,
      // unless it says hello again first.
      if (membership_.elastic() && core_.is_member(s.worker)) {
        membership_.absent(s.worker, io_->now());
        io_->wake_sweeper();
      }
      // The last worker left: nothing can wait any more, so the watchdog stops ticking now
      // (a simulation becomes quiescent when its workers are done, not a tick later).
      if (!watchdog_idle && std::none_of(registered_.begin(), registered_.end(),
                                         [](const Session* p) { return p != nullptr; }))
        io_->wake_watchdog();
    }
    if constexpr (has_on_session_closed<part_type, ctx_t<Io>>) {
      part_.on_session_closed(io_->ctx(), s);
    }
    core_.drop(&s);
    if constexpr (is_value_bounded_v<Consistency>) visibility_.forget(s, acker());
    bounds_.on_finished(s);
    sessions_.erase(s.self);
    settle();  // e.g. the last connection ended: the sweeper's timer is disarmed
  }
  /// Queues `m` to `s` (nothing when `s` is closing). A worker session over the queue limits
  /// is closed instead (logged); `peer`: a recovery link, bounded by its own protocol. When
  /// `m` would take the server's queued bytes past `max_total_queued_bytes`, the sessions
  /// with the largest queues are closed until it fits (see `make_room`); `s` among them, then
  /// `m` is not queued.
  void enqueue(Session& s, message m, bool peer = false) {
    if (!s.open) return;
    if (!peer &&
        s.over(queue_limits{opts_.max_queued_messages, opts_.max_queued_bytes}, m.payload.size())) {
      log("closing connection of " + who(s) + ": it does not read its messages (" +
          std::to_string(s.queued()) + " messages, " + std::to_string(s.queued_bytes) +
          " bytes queued)");
      close(s);
      return;
    }
    if (!peer && !make_room(s, m.payload.size())) return;
    stats_.bytes_out += m.payload.size();
    bounds_.on_queued(m.payload.size());
    s.queue(std::move(m));
    io_->wake(s);
  }
  /// Closes `s` now (even while it flushes its last messages). Its queued messages no longer
  /// count toward the server's budget (the write loop frees them as its write is aborted).
  void close(Session& s) {
    s.open = false;
    bounds_.on_cut(s);
    io_->close(s);
  }

  // ---- the write loop's accounting and the deadlines ----

  /// The shell's write loop starts writing one message of `s` (its send deadline starts).
  void send_started(Session& s) {
    if (bounds_.on_send_started(s, io_->now())) io_->wake_sweeper();
  }
  /// The write of a message of `payload_bytes` to `s` has completed (or was dropped): it no
  /// longer counts as queued.
  void sent(Session& s, std::size_t payload_bytes) noexcept { bounds_.on_sent(s, payload_bytes); }
  /// Closes every session past a deadline as of `io.now()`: no valid first message within
  /// `hello_timeout` of its start (refused with `errc::timeout`), or a write in progress for
  /// `send_timeout` (closed at once). Both are logged with the address and counted in
  /// `stats().rejected`. Returns when to call it next (see `server_bounds::sweep`); none when
  /// nothing is watched: the shell's timer then sleeps until `io.wake_sweeper()`. Also logs
  /// the counts of rate-limited log lines whose window has ended. Cost: one pass over the
  /// sessions.
  std::optional<TimePoint> sweep() {
    if (membership_.elastic()) {
      membership_.due(io_->now(), [this](std::uint32_t w) {
        if (worker_session(w) == nullptr && core_.is_member(w))
          leave(w, "its connection has been gone for " +
                       std::to_string(membership_.grace().count()) + " ms");
      });
    }
    limiter_.flush(io_->now(), [this](const std::string& line) { log(line); });
    auto next = sweep_sessions();
    if (const auto d = membership_.next()) next = next ? std::min(*next, *d) : *d;
    return next;
  }
  // The sessions' deadlines (see `sweep`).
  std::optional<TimePoint> sweep_sessions() {
    return bounds_.sweep(
        sessions_, io_->now(),
        [this](Session& s) {
          ++stats_.rejected;
          log("closing connection of " + who(s) + ": a write has not completed for " +
              std::to_string(opts_.send_timeout.count()) + " ms (send_timeout; " +
              std::to_string(s.queued()) + " messages, " + std::to_string(s.queued_bytes) +
              " bytes queued): the peer does not read");
          close(s);
        },
        [this](Session& s) {
          reject(s, errc::timeout,
                 " (no hello or other valid first message within " +
                     std::to_string(opts_.hello_timeout.count()) + " ms of the connection)");
        });
  }
  /// Closes `s` once its queued messages are sent.
  void close_after_flush(Session& s) {
    s.open = false;
    io_->wake(s);
  }
  /// Refuses `s`: queues an error{code, reason} and closes after flushing it (logged and
  /// counted in `stats().rejected`, except the routine `errc::not_head`).
  void reject(Session& s, std::error_code ec, const std::string& detail) {
    const std::string reason = ec.message() + detail;
    if (ec != errc::not_head) {  // a not-head refusal is routine: the worker tries the next
      ++stats_.rejected;
      if (log_allowed(log_kind::refused_request, s.address))
        log("closing connection of " + who(s) + ": " + reason);
    }
    enqueue(s, protocol::encode(
                   protocol::error{.sender = opts_.shard,
                                   .code = ec.category() == error_category()
                                               ? std::optional<errc>(static_cast<errc>(ec.value()))
                                               : std::nullopt,
                                   .reason = reason},
                   alloc()));
    close_after_flush(s);  // the write loop flushes the error, then closes
  }

  // ---- messages in ----

  /// Message `m` arrived on `s`: greets, dispatches, or hands it to the recovery part.
  /// Returns false when `s` was refused (an error is queued; read no more from it).
  /// Allocation failure while handling `m` (`std::bad_alloc`, `std::length_error`) refuses
  /// `s` with `errc::resource_exhausted` (logged; the worker id is free again once `s`
  /// finishes); when not even the error frame can be allocated, `s` is closed without it.
  bool receive(Session& s, message& m) {
    stats_.bytes_in += m.payload.size();
    s.heard = io_->now();
    std::string detail;
    std::error_code err;
    if (s.is_worker() && worker_session(s.worker) != &s) return false;  // taken over: ignored
    const bool first = bounds_.awaits_hello(s);
    try {
      err = handle(s, m, detail);
    } catch (const std::bad_alloc&) {
      err = errc::resource_exhausted;
      detail = " (type " + std::to_string(static_cast<int>(m.header.type)) + ", " +
               std::to_string(m.payload.size()) + " payload bytes)";
    } catch (const std::length_error&) {
      err = errc::resource_exhausted;
      detail = " (type " + std::to_string(static_cast<int>(m.header.type)) + ", " +
               std::to_string(m.payload.size()) + " payload bytes)";
    }
    if (err) {
      try {
        reject(s, err, detail);
      } catch (const std::exception&) {  // no memory for the error frame either: just close
        close(s);
      }
    }
    if (first) settle();  // greeted, claimed or refused: its hello deadline is over
    return !err;
  }

 private:
  std::error_code handle(Session& s, message& m, std::string& detail) {
    std::error_code err;
    if (s.is_reader()) {
      err = on_reader_message(s, m, detail);
    } else if (s.is_worker()) {
      if constexpr (has_on_worker_message<part_type, ctx_t<Io>>) {
        // e.g. held until the message's apply position is logged (recovery::replica_log)
        if (auto r = part_.on_worker_message(io_->ctx(), s, m, detail))
          err = *r;
        else
          err = dispatch(s, m, detail);
      } else {
        err = dispatch(s, m, detail);
      }
    } else if (!s.is_peer()) {
      err = greet(s, m, detail);
    } else if constexpr (has_on_peer_message<part_type, ctx_t<Io>>) {
      err = part_.on_peer_message(io_->ctx(), s, m, detail);
    }
    // A push or clock message taken (applied, or held by the recovery part): the next
    // incarnation of the worker numbers its messages above it (see greet's welcome).
    if (!err && s.is_worker() && numbered_type(m.header.type) && m.header.sender == s.worker) {
      seen_seq_[s.worker] = std::max(seen_seq_[s.worker], m.header.seq);
      s.trained = true;
      trained_once_[s.worker] = 1;
    }
    return err;
  }

 public:
  /// The first message of an unknown session: a worker's hello (or, through
  /// `on_unknown_peer`, a recovery peer's). Registers the worker and queues its welcome.
  std::error_code greet(Session& s, const message& m, std::string& detail) {
    const auto& h = m.header;
    if constexpr (has_on_unknown_peer<part_type, ctx_t<Io>>) {
      if (h.type != message_type::hello) {
        if (auto r = part_.on_unknown_peer(io_->ctx(), s, m, detail)) return *r;
      }
    }
    if (h.type != message_type::hello) {
      detail = " (expected hello first)";
      return errc::unexpected_message;
    }
    protocol::hello& hello = hello_;  // reused: a hello decodes into the same vector
    if (auto ec = protocol::decode(m, hello, detail)) return ec;
    if (h.sender == protocol::reader_id) return greet_reader(s, hello, detail);
    if (hello.fingerprint != policy_fingerprint<Consistency, Recovery>()) {
      detail = std::string(" (this server runs ") + (Consistency::eager ? "eager" : "lazy") +
               " consistency and recovery '" + std::string(Recovery::name) + "')";
      return errc::policy_mismatch;
    }
    if (h.sender >= opts_.num_workers) {
      detail = " (got " + std::to_string(h.sender) + ", num_workers " +
               std::to_string(opts_.num_workers) + ")";
      return errc::bad_sender;
    }
    if (auto ec = check_hello_clock(h.sender, h.clock, detail)) return ec;
    if (!core_.layout_matches(hello.layout)) {
      detail = " (" + core_.layout_difference_from(hello.layout) + ")";
      return errc::layout_mismatch;
    }
    if constexpr (has_on_hello<part_type, ctx_t<Io>>) {
      if (auto ec = part_.on_hello(io_->ctx(), h, detail)) return ec;  // e.g. not the head
    }
    if (registered_.empty()) {
      registered_.assign(opts_.num_workers, nullptr);
      incarnation_.assign(opts_.num_workers, 0);
      seen_seq_.assign(opts_.num_workers, 0);
    }
    if (Session* old = registered_[h.sender]; old != nullptr && old != &s) {
      if (auto ec = may_take_over(*old, hello.incarnation, detail)) return ec;
      take_over(*old, s, hello.incarnation);
    }
    incarnation_[h.sender] = hello.incarnation;
    registered_[h.sender] = &s;
    connected_once_[h.sender] = 1;
    s.worker = h.sender;
    s.kind = session_base::kind_type::worker;
    s.subs.assign(core_.num_tables(), subscription{});
    if (membership_.elastic()) join(s.worker);
    std::uint8_t flags = 0;
    if constexpr (has_welcome_flags<part_type, ctx_t<Io>>) {
      flags = part_.welcome_flags(io_->ctx(), h);  // e.g. ask for replicas
    }
    protocol::welcome w{.shard = opts_.shard,
                        .num_shards = opts_.num_shards,
                        .server_clock = core_.clock(),
                        .last_seq = std::max(core_.last_seq(s.worker), seen_seq_[s.worker]),
                        .worker_clock = std::max(core_.worker_clock(s.worker), h.clock),
                        .wants_state = (flags & frame_flags::state) != 0,
                        .tables = {},
                        .local_step = 0};
    core_.welcome_tables(s.worker, w);
    enqueue(s, protocol::encode(w, alloc()));
    if (h.clock > core_.worker_clock(s.worker)) {
      // The worker kept training while this shard was away (a restart from a checkpoint, or
      // without state): its updates of the clocks in between are lost here, so its clock at
      // this shard moves up to its own.
      log("worker " + std::to_string(s.worker) + " rejoins at clock " + std::to_string(h.clock) +
          " (this shard had it at " + std::to_string(core_.worker_clock(s.worker)) + ")");
      ++stats_.rejoins;
      if constexpr (has_on_rejoin<part_type, ctx_t<Io>>) {
        part_.on_rejoin(io_->ctx(), s.worker, core_.worker_clock(s.worker),
                        h.clock);  // e.g. log the jump
      }
      s.raised_from = core_.worker_clock(s.worker);
      advance(s.worker, h.clock);
    }
    return {};
  }

  /// A reader's hello (`protocol::reader_id`): no fingerprint, membership or recovery hook;
  /// the layout must match. Its welcome gives the server clock as the reader's clock.
  std::error_code greet_reader(Session& s, const protocol::hello& hello, std::string& detail) {
    if (!core_.layout_matches(hello.layout)) {
      detail = " (" + core_.layout_difference_from(hello.layout) + ")";
      return errc::layout_mismatch;
    }
    s.kind = session_base::kind_type::reader;
    ++stats_.readers;
    protocol::welcome w{.shard = opts_.shard,
                        .num_shards = opts_.num_shards,
                        .server_clock = core_.clock(),
                        .last_seq = 0,
                        .worker_clock = core_.clock(),
                        .wants_state = false,
                        .tables = {},
                        .local_step = 0};
    core_.welcome_tables(no_worker, w);
    enqueue(s, protocol::encode(w, alloc()));
    return {};
  }

  /// A message of reader session `s`: a pull, answered at once with the rows as of the server
  /// clock (whatever clock it names), heartbeat, bye or error; anything else is refused. A
  /// pull to a shard whose recovery part is rebuilding its state is refused with
  /// `errc::recovering` (its rows are not the model yet).
  std::error_code on_reader_message(Session& s, message& m, std::string& detail) {
    const auto& h = m.header;
    switch (h.type) {
      case message_type::pull:
        if (h.sender != protocol::reader_id) return errc::bad_sender;
        if (auto ec = core_.check_rows(m, detail)) return ec;
        if constexpr (has_recovering<part_type>) {
          if (part_.recovering()) {
            detail = " (a reader's pull while the shard rebuilds its state after a restart)";
            return errc::recovering;
          }
        }
        send_requested_rows(s, m, false);
        ++stats_.reader_pulls;
        return {};
      case message_type::heartbeat: return {};
      case message_type::bye: close_after_flush(s); return {};
      case message_type::error: return on_error_frame(s, m, detail);
      default:
        detail = " (type " + std::to_string(static_cast<int>(h.type)) +
                 " from a reader, which may only pull)";
        return errc::unexpected_message;
    }
  }

  /// An `error` frame from a worker or reader session `s`: logged with its reason, then `s`
  /// is closed once its queue is sent. A malformed one is refused (`unexpected_message`).
  std::error_code on_error_frame(Session& s, const message& m, std::string& detail) {
    protocol::error e;
    if (auto ec = protocol::decode(m, e, detail)) return ec;
    log(who(s) + " reported an error: " + peer_text(e.reason));
    close_after_flush(s);
    return {};
  }

  /// A message of registered worker session `s`: push, clock, pull, heartbeat, bye, error.
  std::error_code dispatch(Session& s, message& m, std::string& detail) {
    const auto& h = m.header;
    switch (h.type) {
      case message_type::push: return on_push(s, m, detail);
      case message_type::clock:
        if (h.sender != s.worker) return errc::bad_sender;
        if constexpr (has_on_push<part_type, ctx_t<Io>>) {
          if (part_.on_push(io_->ctx(), s, h)) return {};  // e.g. a duplicate after a failover
        }
        return clock_of(&s, s.worker, m, detail);
      case message_type::pull: return on_pull(s, m, detail);
      case message_type::heartbeat: return {};
      case message_type::bye:
        if (membership_.elastic() && core_.is_member(s.worker)) leave(s.worker, "it said bye");
        close_after_flush(s);
        return {};
      case message_type::error: return on_error_frame(s, m, detail);
      case message_type::ack:  // VAP: the reader has the eager rows up to `seq`
        if constexpr (is_value_bounded_v<Consistency>) return on_visibility_ack(s, m, detail);
        detail = " (ack from a worker; only a VAP server asks readers for them)";
        return errc::unexpected_message;
      default:
        detail = " (type " + std::to_string(static_cast<int>(h.type)) + " from a worker)";
        return errc::unexpected_message;
    }
  }

  /// Dispatches `m`, a message of worker `w` that the recovery part held (`on_worker_message`)
  /// and now releases: on `s`, the worker's session, like any message of it; when `s` is null
  /// (the worker's connection has closed), a push or clock message is applied without a
  /// session (nothing is acknowledged) and any other message is dropped. `m` was checked
  /// when it arrived (sender, rows, finite values).
  std::error_code dispatch_held(std::uint32_t w, Session* s, message& m, std::string& detail) {
    if (s != nullptr) return dispatch(*s, m, detail);
    if (m.header.type == message_type::push) return push_of(nullptr, w, m, detail);
    if (m.header.type == message_type::clock) return clock_of(nullptr, w, m, detail);
    return {};
  }

  // ---- effects on the shard ----

  /// Acknowledges push `seq` to `s`.
  void send_ack(Session& s, std::uint64_t seq) {
    message a;
    a.header.type = message_type::ack;
    a.header.sender = opts_.shard;
    a.header.seq = seq;
    enqueue(s, std::move(a));
  }
  /// The L2 norm of push `m`'s floats (keys excluded), summed in double precision.
  static double payload_norm(const message& m) noexcept {
    const auto g = payload_floats(m);
    const Eigen::Map<const Eigen::ArrayXf> a(g.data(), static_cast<Eigen::Index>(g.size()));
    return std::sqrt(a.template cast<double>().square().sum());
  }
  /// `v` as text with 3 significant digits (e.g. "2.89e+38").
  static std::string number_text(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", v);
    return buf;
  }
  /// Applies checked update `m` to the shard, then tells the recovery part (on_update).
  /// Errors (nothing is applied then): `errc::update_too_large` when the L2 norm of its floats
  /// exceeds `server_options::max_update_norm` (> 0); `errc::non_finite_update` when the
  /// update would make a value or the optimizer's state non-finite (see
  /// `shard_core::check_update`); `detail` says where.
  std::error_code apply(const message& m, std::string& detail) {
    if (opts_.max_update_norm > 0) {
      const double norm = payload_norm(m);
      if (!(norm <= opts_.max_update_norm)) {
        detail = " (table " + std::to_string(m.header.table) + ": L2 norm " + number_text(norm) +
                 " of the push from worker " + std::to_string(m.header.sender) +
                 ", max_update_norm " + number_text(opts_.max_update_norm) + ")";
        return errc::update_too_large;
      }
    }
    if (auto ec = core_.check_update(m, detail)) return ec;
    core_.apply(m);
    const auto& h = m.header;
    if constexpr (requires(part_type& p) {
                    p.on_update(h.table, h.first_row, h.row_count, payload_floats(m));
                  }) {
      part_.on_update(h.table, h.first_row, h.row_count, payload_floats(m));
    }
    return {};
  }
  /// Moves worker `worker`'s clock to `c`; when the server clock advances: the recovery
  /// part's on_clock, ready pulls answered, eager rows pushed, `options().on_clock`.
  void advance(std::uint32_t worker, clock_value c) {
    if (core_.advance(worker, c)) clock_advanced();
  }
  /// The server clock advanced: the recovery part's on_clock, ready pulls answered, eager
  /// rows pushed, `options().on_clock`.
  void clock_advanced() {
    const clock_value m = core_.clock();
    if constexpr (requires(part_type& p) { p.on_clock(m, io_->server()); }) {
      part_.on_clock(m, io_->server());  // e.g. snapshot at this clock boundary
    } else if constexpr (requires(part_type& p) { p.on_clock(m); }) {
      part_.on_clock(m);
    }
    answer_ready_pulls();
    if constexpr (Consistency::eager) push_subscribed();
    if (opts_.on_clock) opts_.on_clock(m);
  }
  /// Answers the pulls that the server clock now satisfies, in arrival order.
  void answer_ready_pulls() {
    core_.take_ready([](Session* p) { return p->open; },
                     [this](Session* p, const message& req) {
                       --p->pending_pulls;
                       answer(*p, req, false);
                     });
  }
  /// Elastic: worker `w` said hello. It becomes a member if it was not (at the server clock,
  /// never behind it) and has no departure pending any more.
  void join(std::uint32_t w) {
    membership_.present(w);
    if (core_.is_member(w)) return;
    const bool advanced = core_.join(w);
    ++stats_.joins;
    log("worker " + std::to_string(w) + " joins at clock " + std::to_string(core_.worker_clock(w)) +
        " (" + std::to_string(core_.members()) + " members, server clock " +
        std::to_string(core_.clock()) + ")");
    if (advanced) clock_advanced();
  }
  /// Elastic: member `w` leaves (`why` says why, for the log); the server clock may advance.
  void leave(std::uint32_t w, const std::string& why) {
    membership_.present(w);
    const bool advanced = core_.leave(w);
    ++stats_.departures;
    log("worker " + std::to_string(w) + " leaves at clock " +
        std::to_string(core_.worker_clock(w)) + ": " + why + " (" +
        std::to_string(core_.members()) + " members left, server clock " +
        std::to_string(core_.clock()) + ")");
    if (advanced) clock_advanced();
  }
  /// Elastic: a worker's message at clock `c` ahead of its clock here (it joined at a later
  /// server clock on another shard and took that one): its clock here moves up to it.
  void catch_up(std::uint32_t w, clock_value c) {
    if (membership_.elastic() && c > core_.worker_clock(w) && core_.is_member(w)) advance(w, c);
  }

  /// Copies the shard's whole state into `out` (see `shard_core::save_state`).
  void save_state(shard_state& out) const { core_.save_state(out); }
  /// Installs `st` and answers the pulls it satisfies. Errors (nothing installed; logged with
  /// the field and value at fault): `errc::layout_mismatch` when foreign, `errc::bad_state`
  /// when no run can reach it (see `shard_core::restore_state`).
  std::error_code restore_state(const shard_state& st) {
    std::string detail;
    if (auto ec = core_.restore_state(st, detail)) {
      log("refused to install a shard state: " + ec.message() + detail);
      return ec;
    }
    answer_ready_pulls();
    return {};
  }

  // ---- the watchdog's reports ----

  /// Whether the watchdog has something to watch: workers never connected (`watch_connect`)
  /// or pulls waiting / deferred since `deferred_seen` (updated). Sets `watchdog_idle`.
  bool watchdog_has_work(bool& watch_connect, std::uint64_t& deferred_seen) {
    if constexpr (has_serves_workers<part_type>) {
      watch_connect = watch_connect && part_.serves_workers();  // e.g. a chain's head
    }
    const bool any_worker = std::any_of(registered_.begin(), registered_.end(),
                                        [](const Session* p) { return p != nullptr; });
    const bool watch_pulls =
        !core_.pending().empty() || (any_worker && stats_.deferred_pulls != deferred_seen);
    deferred_seen = stats_.deferred_pulls;
    watchdog_idle = !(watch_connect || watch_pulls);
    return !watchdog_idle;
  }
  /// Worker sessions registered now (hello accepted, session not finished).
  std::uint32_t workers_connected() const noexcept {
    return static_cast<std::uint32_t>(std::count_if(registered_.begin(), registered_.end(),
                                                    [](const Session* p) { return p != nullptr; }));
  }
  /// Distinct worker ids whose hello was accepted at least once.
  std::uint32_t workers_seen() const noexcept {
    return static_cast<std::uint32_t>(
        std::count(connected_once_.begin(), connected_once_.end(), char{1}));
  }
  /// Distinct worker ids that have trained here at least once: a push or clock message of the
  /// id taken on its own connection (a hello alone, or a hello and a bye, is not training).
  std::uint32_t workers_trained() const noexcept {
    return static_cast<std::uint32_t>(
        std::count(trained_once_.begin(), trained_once_.end(), char{1}));
  }
  /// Whether some worker has never connected.
  bool some_never_connected() const {
    if (membership_.elastic()) return false;  // ids are a capacity: absent ones are normal
    return std::any_of(connected_once_.begin(), connected_once_.end(),
                       [](char c) { return c == 0; });
  }
  /// Logs the workers not connected now. Returns whether it logged (someone is missing).
  bool report_unconnected() {
    std::string missing;
    std::uint32_t connected = 0;
    for (std::uint32_t w = 0; w < opts_.num_workers; ++w) {
      if (worker_session(w) != nullptr) {
        ++connected;
      } else {
        missing += (missing.empty() ? "" : ", ") + std::to_string(w);
      }
    }
    if (missing.empty()) return false;
    log("waiting for worker" + std::string(opts_.num_workers - connected > 1 ? "s " : " ") +
        missing + " to connect (" + std::to_string(connected) + " of " +
        std::to_string(opts_.num_workers) + " connected)");
    return true;
  }
  /// When the oldest waiting pull has waited `every` or longer: logs the worker holding the
  /// server clock back and queues a heartbeat report to every worker with a waiting pull.
  void report_blocked(std::chrono::milliseconds every) {
    const typename core_type::pending_type* oldest = nullptr;
    for (const auto& p : core_.pending())
      if (p.reader->open) {
        oldest = &p;
        break;
      }
    if (oldest == nullptr) return;
    const auto waited = io_->now() - oldest->since;
    if (waited < every) return;
    const auto& clocks = core_.worker_clocks();
    const std::uint32_t slowest = core_.slowest_member();
    if (slowest >= clocks.size()) return;  // elastic, no member: nothing holds the clock
    const bool connected = worker_session(slowest) != nullptr;
    log("a pull of " + who(*oldest->reader) + " has waited " +
        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()) +
        " ms for server clock " + std::to_string(oldest->request.header.clock) + " (server clock " +
        std::to_string(core_.clock()) + "): worker " + std::to_string(slowest) +
        " holds it back at clock " + std::to_string(clocks[slowest]) +
        (connected ? " (connected)" : " (not connected)"));
    for (auto& s : sessions_) {
      if (!s.open || !s.is_worker() || s.pending_pulls == 0) continue;
      enqueue(s, protocol::encode(protocol::report{.shard = opts_.shard,
                                                   .server_clock = core_.clock(),
                                                   .slowest = slowest,
                                                   .slowest_clock = clocks[slowest],
                                                   .slowest_connected = connected},
                                  alloc()));
    }
  }

  /// Logs one line as this server ("asyncps server <shard><part's suffix>: line").
  void log(const std::string& line) const {
    std::string who = "asyncps server " + std::to_string(opts_.shard);
    if constexpr (has_log_suffix<part_type>) who += part_.log_suffix();
    emit(opts_.log, who + ": " + line);
  }
  /// Whether one more line of `kind` (a `log_kind` constant) about the peer at `address`
  /// ("host:port", as `Session::address`; "" for none) may be logged now: a few per host and
  /// kind every 10 s (detail::log_limiter). A summary of lines held back is logged first when
  /// one is due. Refusals of strangers go through this, so that a flood cannot fill the log.
  bool log_allowed(std::string_view kind, std::string_view address) {
    return limiter_.admit(kind, host_of(address), io_->now(),
                          [this](const std::string& line) { log(line); });
  }
  /// Logs the accept loop's transient failure `ec` (it pauses `pause`), rate-limited
  /// (detail::log_accept_failure).
  void log_accept_failure(std::error_code ec, std::chrono::milliseconds pause) {
    detail::log_accept_failure(limiter_, io_->now(), ec, pause,
                               [this](const std::string& line) { log(line); });
  }
  /// Names `s` in log lines, with its remote address when its connection has one
  /// (`s.address`), e.g. "unidentified peer 127.0.0.1:51234".
  std::string who(const Session& s) const {
    std::string name;
    if (s.is_worker()) {
      name = "worker " + std::to_string(s.worker);
    } else if (s.is_reader()) {
      name = "reader";
    } else if (s.is_peer()) {
      name = "peer";
      if constexpr (has_peer_name<part_type>) name = part_.peer_name(s);
    } else {
      name = "unidentified peer";
    }
    if (!s.address.empty()) name += " " + s.address;
    return name;
  }

 private:
  // Makes room for `bytes` more queued bytes for session `s` under max_total_queued_bytes:
  // closes the sessions with the largest queues (`server_bounds::over_budget`) until they
  // fit, each logged with its address and the figures. Returns false when `s` itself was
  // closed (then nothing is queued to it).
  bool make_room(Session& s, std::size_t bytes) {
    while (Session* victim = bounds_.over_budget(sessions_, s, bytes)) {
      ++stats_.over_budget_closes;
      log("closing connection of " + who(*victim) +
          ": the server's queued bytes would exceed max_total_queued_bytes " +
          std::to_string(opts_.max_total_queued_bytes) + " (all connections hold " +
          std::to_string(bounds_.queued_bytes()) + " bytes; this one holds " +
          std::to_string(victim->queued_bytes) + " bytes in " + std::to_string(victim->queued()) +
          " messages" + (victim == &s ? "" : ", the largest queue") + "; " + std::to_string(bytes) +
          " more bytes were to be queued to " + (victim == &s ? "it" : who(s)) + ")");
      close(*victim);
      if (victim == &s) return false;
    }
    return true;
  }
  // A session's deadline ended: the sweeper disarms its timer when nothing is watched.
  void settle() {
    if (bounds_.settle(sessions_)) io_->wake_sweeper();
  }

  static constexpr bool numbered_type(message_type t) noexcept {
    return t == message_type::push || t == message_type::clock;
  }
  template <class I>
  using ctx_t = decltype(std::declval<I&>().ctx());

  auto alloc() {
    return [this](std::size_t n) { return io_->allocate(n); };
  }

  // The staleness bound when the consistency policy fixes it at compile time (bsp, ssp<s>,
  // essp<s>); none for asp, vap and run-time bounds (ssp<>, essp<>).
  static constexpr std::optional<clock_value> static_staleness() {
    // A static member's address is a plain pointer (ssp<> and essp<> hold a data member).
    if constexpr (requires {
                    requires std::is_same_v<decltype(&Consistency::staleness), const clock_value*>;
                  }) {
      if (Consistency::staleness >= 0) return Consistency::staleness;
    }
    return std::nullopt;
  }

  // A hello's clock (docs/wire-format.md, "Clocks in hello"): in [0, protocol::max_clock],
  // and, when the staleness bound s is known and another connected worker has trained here
  // since its hello (a push or clock message taken: a connection that only said hello, at
  // whatever clock, vetoes no rejoin), at most the highest clock of such a worker here + s +
  // 1 + protocol::rejoin_slack. A shard that knows no such worker's clock (it restarted:
  // checkpoint, stateless) takes the worker's clock as it comes.
  std::error_code check_hello_clock(std::uint32_t w, clock_value c, std::string& detail) const {
    if (c < 0 || c > protocol::max_clock) {
      detail = " (worker " + std::to_string(w) + " says hello at clock " + std::to_string(c) +
               "; clocks lie in [0, " + std::to_string(protocol::max_clock) + "])";
      return errc::bad_clock;
    }
    constexpr auto s = static_staleness();
    if constexpr (s.has_value()) {
      if (*s > protocol::max_clock) return {};
      std::optional<clock_value> lead;  // the highest clock of another connected worker
      for (std::uint32_t v = 0; v < registered_.size(); ++v)
        if (v != w && registered_[v] != nullptr && registered_[v]->open && registered_[v]->trained)
          lead = std::max(lead.value_or(0), core_.worker_clock(v));
      // lead <= max_clock + 1 and s <= max_clock: no overflow.
      if (lead && c > *lead + *s + 1 + protocol::rejoin_slack) {
        detail = " (worker " + std::to_string(w) + " says hello at clock " + std::to_string(c) +
                 "; the connected workers are at clock " + std::to_string(*lead) +
                 " or below, and staleness " + std::to_string(*s) + " lets a worker lead by " +
                 std::to_string(*s + 1) + " clocks, plus " +
                 std::to_string(protocol::rejoin_slack) + " for a rejoin)";
        return errc::bad_clock;
      }
    }
    return {};
  }

  // A push or clock message at clock `c` moves its worker to c + 1: refused at max_clock.
  static std::error_code check_clock_room(clock_value c, std::string& detail) {
    if (c < protocol::max_clock) return {};
    detail = " (clock " + std::to_string(c) + " reaches the maximum clock " +
             std::to_string(protocol::max_clock) + ")";
    return errc::bad_clock;
  }

  // Whether a hello of incarnation `incarnation` may take `old`'s worker id over (see
  // `server_options::takeover_silence`): `old` is closing, is the same worker process (its
  // connection is stale), or has sent nothing for takeover_silence. Otherwise
  // `errc::worker_id_in_use` (transient: the worker retries), `detail` saying for how long
  // the holder has been heard from.
  std::error_code may_take_over(const Session& old, std::uint64_t incarnation,
                                std::string& detail) const {
    const auto silent = io_->now() - old.heard;
    if (!old.open || incarnation == incarnation_[old.worker] || silent >= opts_.takeover_silence)
      return {};
    detail = " (worker " + std::to_string(old.worker) + " is held by a connection" +
             (old.address.empty() ? std::string() : " at " + old.address) + " heard from " +
             std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(silent).count()) +
             " ms ago, another incarnation; the id is taken over once it is closed or silent "
             "for takeover_silence " +
             std::to_string(opts_.takeover_silence.count()) + " ms)";
    return errc::worker_id_in_use;
  }
  // `s`, a worker session ending or taken over, moved its worker's clock up with its hello and
  // never trained: the clock goes back to what it was, unless the server clock has passed
  // that (then it stays: the server clock never goes back).
  void undo_untrained_raise(Session& s) {
    if (s.raised_from < 0 || s.trained || core_.clock() > s.raised_from) return;
    log("worker " + std::to_string(s.worker) + "'s clock goes back from " +
        std::to_string(core_.worker_clock(s.worker)) + " to " + std::to_string(s.raised_from) +
        ": the connection whose hello moved it up never trained");
    core_.set_worker_clock(s.worker, s.raised_from);
    s.raised_from = -1;
  }

  // `next` said hello with the id of `old`'s worker, and may take it over (may_take_over).
  // Either the worker restarted (another incarnation, and the old connection has been silent
  // for takeover_silence: it belongs to a dead process) or it reconnected before this server
  // saw its old connection die (the same incarnation: a half-open connection). `old` gets
  // an error (`duplicate_worker`), is closed once it is sent, and nothing more it sends is
  // read (`receive`); its waiting pulls are dropped.
  void take_over(Session& old, Session& next, std::uint64_t incarnation) {
    const std::uint32_t w = old.worker;
    const bool restarted = incarnation != incarnation_[w];
    ++stats_.takeovers;
    const auto from = address(next);
    const auto was = address(old);
    log("worker " + std::to_string(w) + (from ? " at " + *from : " on a new connection") +
        " takes over its id from " + (was ? "the connection at " + *was : "its old connection") +
        (restarted ? " (a new incarnation: the worker restarted)"
                   : " (the same incarnation: its old connection is stale)") +
        "; closing the old connection");
    const std::string reason = make_error_code(errc::duplicate_worker).message() + " (worker " +
                               std::to_string(w) + (from ? ", now at " + *from : "") + ")";
    enqueue(old, protocol::encode(protocol::error{.sender = opts_.shard,
                                                  .code = errc::duplicate_worker,
                                                  .reason = reason},
                                  alloc()));
    close_after_flush(old);
    core_.drop(&old);
    old.pending_pulls = 0;
    undo_untrained_raise(old);
  }

  // The peer address of `s` for log lines, when the shell knows it (`io.address(s)`).
  std::optional<std::string> address(const Session& s) const {
    if constexpr (requires { io_->address(s); }) {
      return io_->address(s);
    } else {
      return std::nullopt;
    }
  }

  std::error_code on_push(Session& s, message& m, std::string& detail) {
    const auto& h = m.header;
    if (h.sender != s.worker) {
      detail = " (got " + std::to_string(h.sender) + " on the connection of worker " +
               std::to_string(s.worker) + ")";
      return errc::bad_sender;
    }
    if (auto ec = core_.check_rows(m, detail)) return ec;
    // A plain push's values are checked finite by `apply` (`shard_core::check_update`), chunk
    // by chunk with the update they make: one pass over the push instead of two. A replica or
    // backlog push goes to the recovery part, which may keep it unapplied: checked here.
    if (h.has(frame_flags::state) || h.has(frame_flags::backlog)) {
      if (!core_type::all_finite(payload_floats(m))) return errc::non_finite_value;
      if constexpr (has_on_recovery_push<part_type, ctx_t<Io>>) {
        return part_.on_recovery_push(io_->ctx(), s, m, detail);
      } else {
        detail = std::string(" (replica or backlog push, but recovery policy '") +
                 std::string(Recovery::name) + "' does not take them)";
        return errc::unexpected_message;
      }
    }
    if constexpr (has_on_push<part_type, ctx_t<Io>>) {
      if (part_.on_push(io_->ctx(), s, h)) return {};  // e.g. a duplicate after a failover
    }
    return push_of(&s, s.worker, m, detail);
  }

  // A checked clock message of worker `w` (on session `s`, or null: see dispatch_held).
  std::error_code clock_of(Session* s, std::uint32_t w, message& m, std::string& detail) {
    const auto& h = m.header;
    if (auto ec = check_clock_room(h.clock, detail)) return ec;
    catch_up(w, h.clock);
    if (h.clock != core_.worker_clock(w)) {
      detail = " (clock " + std::to_string(h.clock) + ", worker is at clock " +
               std::to_string(core_.worker_clock(w)) + ")";
      return errc::unexpected_message;
    }
    if (h.clock == std::numeric_limits<clock_value>::max()) {  // clock + 1 would overflow
      detail = " (clock " + std::to_string(h.clock) + ")";
      return errc::unexpected_message;
    }
    if (h.seq != 0) core_.last_seq(w) = h.seq;
    if constexpr (has_on_applied<part_type, ctx_t<Io>>) {
      if (s != nullptr) (void)part_.on_applied(io_->ctx(), *s, m);
    }
    advance(w, h.clock + 1);
    return {};
  }

  // A checked push of worker `w` (on session `s`, or null: see dispatch_held): applied,
  // counted, acknowledged, and the worker's clock advanced at the end of its clock.
  std::error_code push_of(Session* s, std::uint32_t w, message& m, std::string& detail) {
    const auto& h = m.header;
    if (auto ec = check_clock_room(h.clock, detail)) return ec;
    catch_up(w, h.clock);
    if (h.clock != core_.worker_clock(w)) {
      detail = " (push for clock " + std::to_string(h.clock) + ", worker is at clock " +
               std::to_string(core_.worker_clock(w)) + ")";
      return errc::unexpected_message;
    }
    if (h.has(frame_flags::end_of_clock) && h.clock == std::numeric_limits<clock_value>::max()) {
      detail = " (push for clock " + std::to_string(h.clock) + ": clock + 1 would overflow)";
      return errc::unexpected_message;
    }
    if (auto ec = apply(m, detail)) return ec;
    core_.count_push(w, h.table);
    core_.last_seq(w) = h.seq;
    ++stats_.pushes;
    bool part_acks = s == nullptr;  // the recovery part acknowledges (e.g. once replicated)
    if constexpr (has_on_applied<part_type, ctx_t<Io>>) {
      if (s != nullptr) part_acks = part_.on_applied(io_->ctx(), *s, m);
    }
    // VAP: the writer's clock is acknowledged once it is visible, i.e. once every reader that
    // the rows below were sent to has acknowledged them (on_visibility_ack), not when applied.
    const bool visibility_ack = is_value_bounded_v<Consistency> && !part_acks &&
                                h.has(frame_flags::want_ack) && h.has(frame_flags::end_of_clock);
    if (!part_acks && h.has(frame_flags::want_ack) && !visibility_ack) send_ack(*s, h.seq);
    if (h.has(frame_flags::end_of_clock)) {
      advance(w, h.clock + 1);
      if constexpr (is_value_bounded_v<Consistency>)
        push_subscribed(visibility_ack ? s : nullptr, h.seq);
    }
    return {};
  }

  // VAP: reader session `s` acknowledges the eager rows messages that asked for it, up to
  // its `seq`-th (vap_visibility::on_ack). Errors: `errc::bad_sender`;
  // `errc::unexpected_message` for a count that goes back or past the messages sent to it.
  std::error_code on_visibility_ack(Session& s, const message& m, std::string& detail) {
    if (m.header.sender != s.worker) return errc::bad_sender;
    return visibility_.on_ack(s, m.header.seq, detail, acker());
  }
  // VAP: sends a writer the acknowledgement of its push `seq` once its clock is visible.
  auto acker() {
    return [this](Session& writer, std::uint64_t seq) { send_ack(writer, seq); };
  }

  std::error_code on_pull(Session& s, message& m, std::string& detail) {
    const auto& h = m.header;
    if (h.sender != s.worker) return errc::bad_sender;
    if (h.clock <= protocol::max_clock) catch_up(s.worker, h.clock);
    if (h.clock > core_.worker_clock(s.worker)) {  // no reader needs rows fresher than its own
      detail = " (pull wants server clock " + std::to_string(h.clock) + ", worker is at " +
               std::to_string(core_.worker_clock(s.worker)) + ")";
      return errc::unexpected_message;
    }
    if (auto ec = core_.check_rows(m, detail)) return ec;
    if (core_.clock() >= h.clock) {
      answer(s, m, false);
    } else {
      ++stats_.deferred_pulls;
      if (++s.pending_pulls > opts_.max_pending_pulls) {
        detail = " (more than " + std::to_string(opts_.max_pending_pulls) + " pulls waiting)";
        return errc::too_many_requests;
      }
      if (core_.pending_bytes() + m.payload.size() > opts_.max_total_pending_pull_bytes) {
        --s.pending_pulls;
        detail = " (its " + std::to_string(m.payload.size()) +
                 " bytes of keys would take the pulls waiting here past "
                 "max_total_pending_pull_bytes " +
                 std::to_string(opts_.max_total_pending_pull_bytes) + "; they hold " +
                 std::to_string(core_.pending_bytes()) + ")";
        return errc::too_many_requests;
      }
      core_.defer(&s, std::move(m), io_->now());
      if (watchdog_idle) {  // the watchdog sleeps while nothing waits: wake it
        watchdog_idle = false;
        io_->wake_watchdog();
      }
    }
    return {};
  }

  // Replies to a pull (or pushes eagerly) with the requested rows as of the server clock.
  void answer(Session& s, const message& req, bool eager) {
    const auto& h = req.header;
    send_requested_rows(s, req, eager);
    if (!eager) ++stats_.pulls;
    if constexpr (Consistency::eager || is_value_bounded_v<Consistency>) {
      if (!eager) core_.subscribe(s.subs[h.table], req);
    }
  }

  // Sends `s` the rows pull `req` names (range or keys), as of the server clock.
  void send_requested_rows(Session& s, const message& req, bool eager) {
    const auto& h = req.header;
    send_rows(s, h.table, h.has(frame_flags::range), h.first_row, h.row_count, eager,
              core_.rows_payload(h.table, h.has(frame_flags::range), h.first_row, h.row_count,
                                 payload_keys(req), alloc()));
  }

  void send_rows(Session& s, table_id tid, bool ranged, std::uint64_t first, std::uint32_t count,
                 bool eager, buffer payload, bool want_ack = false) {
    message r;
    r.header.type = message_type::rows;
    r.header.flags = static_cast<std::uint8_t>((ranged ? frame_flags::range : 0) |
                                               (eager ? frame_flags::eager : 0) |
                                               (want_ack ? frame_flags::want_ack : 0));
    r.header.sender = opts_.shard;
    r.header.table = tid;
    r.header.clock = core_.clock();
    r.header.seq = s.worker == no_worker ? 0 : core_.applied(s.worker, tid);
    r.header.row_count = count;
    r.header.width = core_.table(tid).spec.width;
    r.header.first_row = ranged ? first : 0;
    r.payload = std::move(payload);
    enqueue(s, std::move(r));
  }

  // Brings every reader's subscribed rows up to date (ESSP: when the server clock advances;
  // VAP: after each writer clock): one eager rows message per reader and table, holding the
  // subscribed rows that changed since the last rows this session sent, possibly none; every
  // other subscribed row is unchanged as of the message's clock (the worker re-stamps them).
  // When every row of the shard changed and is subscribed (dense models), the whole shard is
  // sent as a range, snapshot once per table and the buffer shared.
  // VAP, after writer session `writer`'s clock whose push had sequence number `seq` (null: no
  // writer waits): every message that holds rows, to a reader other than the writer, asks for
  // the reader's acknowledgement, and the writer's clock is acknowledged once all of them are
  // (at once when there are none: no other reader reads what changed).
  void push_subscribed(Session* writer = nullptr, std::uint64_t seq = 0) {
    const std::uint64_t id = visibility_.next_id();  // this writer clock's
    std::uint32_t readers = 0;
    for (table_id t = 0; t < core_.num_tables(); ++t) {
      buffer whole;  // the whole shard, when sent as a range: snapshot once, shared
      for (auto& s : sessions_) {
        if (!s.open || !s.is_worker()) continue;
        auto& sub = s.subs[t];
        if (!sub.ranged && sub.keys.empty()) continue;
        auto e = core_.eager_rows_for(t, sub, whole, alloc());
        const bool want_ack =
            is_value_bounded_v<Consistency> && writer != nullptr && &s != writer && e.count > 0;
        send_rows(s, t, e.ranged, e.ranged ? e.range.begin : 0, e.count, true, std::move(e.payload),
                  want_ack);
        ++stats_.eager_messages;
        // (enqueue closes a session over its queue limits: then it is no reader)
        if (want_ack && s.open && visibility_.sent(s, id)) ++readers;
      }
    }
    if constexpr (is_value_bounded_v<Consistency>) {
      if (writer != nullptr) visibility_.add(*writer, seq, readers, acker());
    }
  }

  Io* io_;
  server_options opts_;
  server_stats stats_{};
  [[no_unique_address]] part_type part_{};
  core_type core_;           // tables, clocks, subscriptions' versions, waiting pulls
  protocol::hello hello_{};  // the last hello decoded (reused)
  std::vector<Session*> registered_;
  std::vector<std::uint64_t> incarnation_;  // per worker: its last accepted hello's
  std::vector<std::uint64_t> seen_seq_;     // per worker: highest seq received (any connection)
  std::vector<char> connected_once_;        // per worker: has connected at least once
  std::vector<char> trained_once_;          // per worker: a push or clock of it taken
  std::list<Session> sessions_;
  server_bounds<Session, TimePoint> bounds_;  // queue budget, hello and send deadlines
  membership<TimePoint> membership_;          // elastic: when absent members leave
  vap_visibility<Session> visibility_;        // VAP: writer clocks waiting for their readers
  log_limiter<TimePoint> limiter_;            // refusals and failed accepts, per peer host
};

}  // namespace asyncps::detail
