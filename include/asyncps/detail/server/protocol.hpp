// asyncps — detail::server_protocol: what a server does with each message, sans-io.
//
// It owns the shard core (detail/server/shard_core.hpp), the recovery policy's server part, the
// sessions (their sans-io state: outbox, subscriptions, waiting pulls), the worker registry
// and the counters. A message in (`receive`) greets a hello, validates and dispatches a
// worker's push, clock, pull, bye or error, or hands a peer's message to the recovery part;
// its effects are recorded as data (messages queued in a session's outbox, sessions marked
// closing) plus a few calls on the shell `Io`, which owns every socket, timer and executor.
// It also keeps the server's resource bounds: the per-connection queue limits, the server-wide
// queue budget (`enqueue`), and the hello and send deadlines (`sweep`, run by one timer of the
// shell: the sweeper), deciding them with detail::server_bounds (detail/server/bounds.hpp).
//
//   io.ctx()             the recovery hooks' context (basic_server::context)
//   io.wake(s)           session `s` has a message to send or is closing: wake its write loop
//   io.close(s)          close `s`'s connection now (its loops then finish)
//   io.allocate(n)       a payload buffer of n bytes
//   io.now()             the transport clock's time
//   io.wake_watchdog()   a pull now waits, or nothing can wait any more: re-arm the watchdog
//   io.wake_sweeper()    a deadline earlier than the sweeper's timer appeared (a session's,
//                        or a recovery part's timer armed with `ctx.arm_timer`), or nothing is
//                        watched any more: the sweeper calls `sweep` and re-arms its timer
//
// `basic_server` (server.hpp) is the shell; tests/unit/server_core_test.cpp steps it with a
// shell that records. Thread safety: one thread at a time (the server's executor).
//
// The class is declared here; its member functions are defined by idea in detail/server/,
// included at the end of this file: front_door.ipp (a session's first message: hellos,
// their checks, the welcome, taking a worker id over), dispatch.ipp (messages in: routing by
// session kind, the reader's and worker's messages, error frames, refusals), push_pull.ipp
// (push, clock and pull messages, rows, eager rows, VAP acknowledgements), clock.ipp (the
// server clock's advance, elastic membership, installing a state), session_bounds.ipp
// (sessions opened and finished, queue limits and budget, the sweeper's deadlines),
// watchdog.ipp (the watchdog's reports) and log.ipp (log lines).
#pragma once

#include <algorithm>
#include <array>
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
#include "asyncps/detail/server/bounds.hpp"
#include "asyncps/detail/server/hooks.hpp"
#include "asyncps/detail/server/membership.hpp"
#include "asyncps/detail/server/session.hpp"
#include "asyncps/detail/server/shard_core.hpp"
#include "asyncps/detail/server/vap_visibility.hpp"
#include "asyncps/detail/text.hpp"
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
  using session_type = Session;
  using time_point = TimePoint;
  using consistency_type = Consistency;
  using recovery_type = Recovery;
  static constexpr std::uint32_t no_worker = session_base::none;

  /// Builds the shard of `opts` (throws `std::invalid_argument` naming a bad field).
  server_protocol(Io& io, server_options opts, Optimizer opt, part_type part)
      : io_(&io), opts_(std::move(opts)), part_(std::move(part)),
        core_(opts_.shard, opts_.num_shards, opts_.num_workers, opts_.tables, opts_.seed, opt,
              [&io](std::size_t n) { return io.allocate(n); }),
        connected_once_(opts_.num_workers, 0), trained_once_(opts_.num_workers, 0), bounds_(opts_),
        membership_(opts_.elastic, opts_.num_workers) {
    if (opts_.elastic) {
      if (!allows_elastic_membership_v<Recovery>)
        throw std::invalid_argument(
            "asyncps::server_options: elastic membership needs a recovery policy that allows "
            "it (`elastic_membership`, e.g. 'none'); this server runs '" +
            std::string(Recovery::name) + "'");
      core_.set_elastic(opts_.elastic->start_members);
    }
  }

  const server_options& options() const noexcept { return opts_; }
  /// The shell's time now (`io.now()`).
  TimePoint now() const { return io_->now(); }
  /// A buffer of `n` bytes from the shell (`io.allocate`). Exceptions: `std::bad_alloc`.
  buffer allocate(std::size_t n) { return io_->allocate(n); }
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
  Session& add_session(Args&&... args);
  /// Both loops of `s` finished: forgets it (worker registry, waiting pulls, recovery part).
  void session_finished(Session& s);
  /// Queues `m` to `s` (nothing when `s` is closing). A worker session over the queue limits
  /// is closed instead (logged); `peer`: a recovery link, bounded by its own protocol. When
  /// `m` would take the server's queued bytes past `max_total_queued_bytes`, the sessions
  /// with the largest queues are closed until it fits (see `make_room`); `s` among them, then
  /// `m` is not queued.
  void enqueue(Session& s, message m, bool peer = false);
  /// Closes `s` now (even while it flushes its last messages). Its queued messages no longer
  /// count toward the server's budget (the write loop frees them as its write is aborted).
  void close(Session& s);

  // ---- the write loop's accounting and the deadlines ----

  /// The shell's write loop starts writing one message of `s` (its send deadline starts).
  void send_started(Session& s);
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
  std::optional<TimePoint> sweep();
  // The sessions' deadlines (see `sweep`).
  std::optional<TimePoint> sweep_sessions();

  // ---- the recovery part's timers (a sans-io action: the sweeper fires them) ----

  /// How many timers a recovery part may arm (ids 0 .. part_timer_count - 1).
  static constexpr std::uint32_t part_timer_count = 4;
  /// Arms the part's timer `id` to fire `after` from `io.now()` (replacing its earlier
  /// deadline): `sweep` then calls the part's `on_timer(ctx, id)` once (recovery.hpp). Wakes
  /// the sweeper. Exceptions: `std::out_of_range`, naming the id, when `id >=
  /// part_timer_count` (a policy's bug; nothing is armed).
  void arm_part_timer(std::uint32_t id, std::chrono::milliseconds after);
  /// Disarms the part's timer `id` (nothing happens when it was not armed, or for an id
  /// outside [0, part_timer_count), which is never armed).
  void cancel_part_timer(std::uint32_t id) noexcept {
    if (id < part_timer_count) part_timers_[id].reset();
  }
  /// A connect the part asked for (`ctx.connect`) made peer session `s` (claimed with its
  /// role): the part's `on_connected(ctx, s)`.
  void part_connected(Session& s);
  /// A connect the part asked for with tag `role` failed with `ec`: the part's
  /// `on_connect_failed(ctx, role, ec)`.
  void part_connect_failed(std::uint8_t role, std::error_code ec);
  /// Whether the part's timer `id` is armed (false for an id outside [0, part_timer_count)).
  bool part_timer_armed(std::uint32_t id) const noexcept {
    return id < part_timer_count && part_timers_[id].has_value();
  }
  /// Closes `s` once its queued messages are sent.
  void close_after_flush(Session& s);
  /// Refuses `s`: queues an error{code, reason} and closes after flushing it (logged and
  /// counted in `stats().rejected`, except a refusal the part's `routine_refusal` calls routine).
  void reject(Session& s, std::error_code ec, const std::string& detail);

  // ---- messages in ----

  /// Message `m` arrived on `s`: greets, dispatches, or hands it to the recovery part.
  /// Returns false when `s` was refused (an error is queued; read no more from it).
  /// Allocation failure while handling `m` (`std::bad_alloc`, `std::length_error`) refuses
  /// `s` with `errc::resource_exhausted` (logged; the worker id is free again once `s`
  /// finishes); when not even the error frame can be allocated, `s` is closed without it.
  bool receive(Session& s, message& m);

 private:
  std::error_code handle(Session& s, message& m, std::string& detail);

 public:
  /// The first message of an unknown session: a worker's hello (or, through
  /// `on_unknown_peer`, a recovery peer's). Registers the worker and queues its welcome.
  std::error_code greet(Session& s, const message& m, std::string& detail);

  /// A reader's hello (`protocol::reader_id`): no fingerprint, membership or recovery hook;
  /// the layout must match. Its welcome gives the server clock as the reader's clock.
  std::error_code greet_reader(Session& s, const protocol::hello& hello, std::string& detail);

  /// A message of reader session `s`: a pull, answered at once with the rows as of the server
  /// clock (whatever clock it names), heartbeat, bye or error; anything else is refused. A
  /// pull to a shard whose recovery part is rebuilding its state is refused with
  /// `errc::recovering` (its rows are not the model yet).
  std::error_code on_reader_message(Session& s, message& m, std::string& detail);

  /// An `error` frame from a worker or reader session `s`: logged with its reason, then `s`
  /// is closed once its queue is sent. A malformed one is refused (`unexpected_message`).
  std::error_code on_error_frame(Session& s, const message& m, std::string& detail);

  /// A message of registered worker session `s`: push, clock, pull, heartbeat, bye, error.
  std::error_code dispatch(Session& s, message& m, std::string& detail);

  /// Dispatches `m`, a message of worker `w` that the recovery part held (`on_worker_message`)
  /// and now releases: on `s`, the worker's session, like any message of it; when `s` is null
  /// (the worker's connection has closed), a push or clock message is applied without a
  /// session (nothing is acknowledged) and any other message is dropped. `m` was checked
  /// when it arrived (sender, rows, finite values).
  std::error_code dispatch_held(std::uint32_t w, Session* s, message& m, std::string& detail);

  // ---- effects on the shard ----

  /// Acknowledges push `seq` to `s`.
  void send_ack(Session& s, std::uint64_t seq);
  /// The L2 norm of push `m`'s floats (keys excluded), summed in double precision.
  static double payload_norm(const message& m) noexcept;
  /// `v` as text with 3 significant digits (e.g. "2.89e+38").
  static std::string number_text(double v);
  /// Applies checked update `m` to the shard, clips its rows' values to
  /// `server_options::max_parameter_value` (> 0), then tells the recovery part (on_update).
  /// Errors (nothing is applied then): `errc::update_too_large` when the L2 norm of its floats
  /// exceeds `server_options::max_update_norm` (> 0); `errc::non_finite_update` when the
  /// update would make a value or the optimizer's state non-finite (see
  /// `shard_core::check_update`); `detail` says where.
  std::error_code apply(const message& m, std::string& detail);
  /// Moves worker `worker`'s clock to `c`; when the server clock advances: the recovery
  /// part's on_clock, ready pulls answered, eager rows pushed, `options().on_clock`.
  void advance(std::uint32_t worker, clock_value c);
  /// The server clock advanced: the recovery part's on_clock, ready pulls answered, eager
  /// rows pushed, `options().on_clock`.
  void clock_advanced();
  /// Answers the pulls that the server clock now satisfies, in arrival order.
  void answer_ready_pulls();
  /// Elastic: worker `w` said hello. It becomes a member if it was not (at the server clock,
  /// never behind it) and has no departure pending any more.
  void join(std::uint32_t w);
  /// Elastic: member `w` leaves (`why` says why, for the log); the server clock may advance.
  void leave(std::uint32_t w, const std::string& why);
  /// Elastic: a worker's message at clock `c` ahead of its clock here (it joined at a later
  /// server clock on another shard and took that one): its clock here moves up to it.
  void catch_up(std::uint32_t w, clock_value c);

  /// Copies the shard's whole state into `out` (see `shard_core::save_state`).
  void save_state(shard_state& out) const { core_.save_state(out); }
  /// Installs `st` and answers the pulls it satisfies. Errors (nothing installed; logged with
  /// the field and value at fault): `errc::layout_mismatch` when foreign, `errc::bad_state`
  /// when no run can reach it (see `shard_core::restore_state`).
  std::error_code restore_state(const shard_state& st);

  // ---- the watchdog's reports ----

  /// Whether the watchdog has something to watch: workers never connected (`watch_connect`)
  /// or pulls waiting / deferred since `deferred_seen` (updated). Sets `watchdog_idle`.
  bool watchdog_has_work(bool& watch_connect, std::uint64_t& deferred_seen);
  /// Worker sessions registered now (hello accepted, session not finished).
  std::uint32_t workers_connected() const noexcept;
  /// Distinct worker ids whose hello was accepted at least once.
  std::uint32_t workers_seen() const noexcept;
  /// Distinct worker ids that have trained here at least once: a push or clock message of the
  /// id taken on its own connection (a hello alone, or a hello and a bye, is not training).
  std::uint32_t workers_trained() const noexcept;
  /// Whether some worker has never connected.
  bool some_never_connected() const;
  /// Logs the workers not connected now. Returns whether it logged (someone is missing).
  bool report_unconnected();
  /// When the oldest waiting pull has waited `every` or longer: logs the worker holding the
  /// server clock back and queues a heartbeat report to every worker with a waiting pull.
  void report_blocked(std::chrono::milliseconds every);

  /// Logs one line as this server ("asyncps server <shard><part's suffix>: line").
  void log(const std::string& line) const;
  /// Whether one more line of `kind` (a `log_kind` constant) about the peer at `address`
  /// ("host:port", as `Session::address`; "" for none) may be logged now: a few per host and
  /// kind every 10 s (detail::log_limiter). A summary of lines held back is logged first when
  /// one is due. Refusals of strangers go through this, so that a flood cannot fill the log.
  bool log_allowed(std::string_view kind, std::string_view address);
  /// Logs the accept loop's transient failure `ec` (it pauses `pause`), rate-limited
  /// (detail::log_accept_failure).
  void log_accept_failure(std::error_code ec, std::chrono::milliseconds pause);
  /// Names `s` in log lines, with its remote address when its connection has one
  /// (`s.address`), e.g. "unidentified peer 127.0.0.1:51234".
  std::string who(const Session& s) const;

 private:
  // Makes room for `bytes` more queued bytes for session `s` under max_total_queued_bytes:
  // closes the sessions with the largest queues (`server_bounds::over_budget`) until they
  // fit, each logged with its address and the figures. Returns false when `s` itself was
  // closed (then nothing is queued to it).
  bool make_room(Session& s, std::size_t bytes);
  // A session's deadline ended: the sweeper disarms its timer when nothing is watched.
  void settle();

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
  std::error_code check_hello_clock(std::uint32_t w, clock_value c, std::string& detail) const;

  // A push or clock message at clock `c` moves its worker to c + 1: refused at max_clock.
  static std::error_code check_clock_room(clock_value c, std::string& detail);

  // Whether a hello of incarnation `incarnation` may take `old`'s worker id over (see
  // `server_options::takeover_silence`): `old` is closing, is the same worker process (its
  // connection is stale), or has sent nothing for takeover_silence. Otherwise
  // `errc::worker_id_in_use` (transient: the worker retries), `detail` saying for how long
  // the holder has been heard from.
  std::error_code may_take_over(const Session& old, std::uint64_t incarnation,
                                std::string& detail) const;
  // `s`, a worker session ending or taken over, moved its worker's clock up with its hello and
  // never trained: the clock goes back to what it was, unless the server clock has passed
  // that (then it stays: the server clock never goes back).
  void undo_untrained_raise(Session& s);

  // `next` said hello with the id of `old`'s worker, and may take it over (may_take_over).
  // Either the worker restarted (another incarnation, and the old connection has been silent
  // for takeover_silence: it belongs to a dead process) or it reconnected before this server
  // saw its old connection die (the same incarnation: a half-open connection). `old` gets
  // an error (`duplicate_worker`), is closed once it is sent, and nothing more it sends is
  // read (`receive`); its waiting pulls are dropped.
  void take_over(Session& old, Session& next, std::uint64_t incarnation);

  // The peer address of `s` for log lines, when the shell knows it (`io.address(s)`).
  std::optional<std::string> address(const Session& s) const;

  std::error_code on_push(Session& s, message& m, std::string& detail);

  // A checked clock message of worker `w` (on session `s`, or null: see dispatch_held).
  std::error_code clock_of(Session* s, std::uint32_t w, message& m, std::string& detail);

  // A checked push of worker `w` (on session `s`, or null: see dispatch_held): applied,
  // counted, acknowledged, and the worker's clock advanced at the end of its clock.
  std::error_code push_of(Session* s, std::uint32_t w, message& m, std::string& detail);

  // VAP: reader session `s` acknowledges the eager rows messages that asked for it, up to
  // its `seq`-th (vap_visibility::on_ack). Errors: `errc::bad_sender`;
  // `errc::unexpected_message` for a count that goes back or past the messages sent to it.
  std::error_code on_visibility_ack(Session& s, const message& m, std::string& detail);
  // VAP: sends a writer the acknowledgement of its push `seq` once its clock is visible.
  auto acker() {
    return [this](Session& writer, std::uint64_t seq) { send_ack(writer, seq); };
  }

  std::error_code on_pull(Session& s, message& m, std::string& detail);

  // Replies to a pull (or pushes eagerly) with the requested rows as of the server clock.
  void answer(Session& s, const message& req, bool eager);

  // Sends `s` the rows pull `req` names (range or keys), as of the server clock.
  void send_requested_rows(Session& s, const message& req, bool eager);

  void send_rows(Session& s, table_id tid, bool ranged, std::uint64_t first, std::uint32_t count,
                 bool eager, buffer payload, bool want_ack = false);

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
  void push_subscribed(Session* writer = nullptr, std::uint64_t seq = 0);

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
  std::array<std::optional<TimePoint>, part_timer_count> part_timers_{};  // deadlines
};

}  // namespace asyncps::detail

#include "asyncps/detail/server/clock.ipp"
#include "asyncps/detail/server/dispatch.ipp"
#include "asyncps/detail/server/front_door.ipp"
#include "asyncps/detail/server/log.ipp"
#include "asyncps/detail/server/push_pull.ipp"
#include "asyncps/detail/server/session_bounds.ipp"
#include "asyncps/detail/server/watchdog.ipp"
