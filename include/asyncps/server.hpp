// asyncps — basic_server: a parameter-server shard driven by coroutines.
//
// One `basic_server` owns shard `shard` of `num_shards` of every table (a contiguous key range
// per table, see table.hpp), keeps a vector clock over its workers (server clock = minimum),
// applies pushed gradients with its optimizer, answers pulls once its clock is fresh enough
// for the request, and — for eager policies (ESSP) — pushes every subscribed row when its
// clock advances (Bösen's SSPPushServerThread).
//
// Structure: the shard's state and rules (tables, optimizer apply, versions, subscriptions,
// waiting pulls, save/restore) are detail::shard_core (sans-io, detail/shard_core.hpp); the
// recovery policy's server part plugs into the hooks of detail/server_hooks.hpp; this file
// holds the sessions, the protocol checks and the coroutines.
//
// Concurrency: every coroutine of a server runs on the transport's executor; pass a strand
// (or a single-threaded io_context) so shard state is touched by one thread at a time and no
// locks are needed in the hot path.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <list>
#include <optional>
#include <ostream>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>

#include "asyncps/consistency.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/server_hooks.hpp"
#include "asyncps/detail/shard_core.hpp"
#include "asyncps/detail/text.hpp"
#include "asyncps/detail/transport_time.hpp"
#include "asyncps/detail/wait_group.hpp"
#include "asyncps/error.hpp"
#include "asyncps/log.hpp"
#include "asyncps/model.hpp"
#include "asyncps/optimizer.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery.hpp"
#include "asyncps/recovery/none.hpp"
#include "asyncps/shard_state.hpp"
#include "asyncps/table.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/transport/tcp.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

/// Configuration of one server shard.
struct server_options {
  std::uint32_t shard = 0;           ///< this shard's index, < num_shards
  std::uint32_t num_shards = 1;      ///< servers sharing the tables
  std::uint32_t num_workers = 1;     ///< workers in the vector clock (ids 0..num_workers-1)
  std::vector<table_spec> tables{};  ///< the model layout (every shard and worker has the same)
  std::uint64_t seed = 42;           ///< initial-value seed (see table_spec::init_scale)
  /// Pulls one connection may have waiting for the server clock; one more is a protocol
  /// violation (`errc::too_many_requests`) that closes that connection.
  std::uint32_t max_pending_pulls = 256;
  /// Messages queued to one connection that it has not read yet; beyond this the peer is too
  /// slow (or not reading) and its connection is closed, so it cannot grow server memory.
  std::uint32_t max_queued_messages = 4096;
  std::uint64_t max_queued_bytes = std::uint64_t{256} << 20;  ///< same, in payload bytes
  log_function log{};  ///< connection events and rejected frames
  /// Called on the server's executor each time the server clock advances, with the new
  /// clock (progress, evaluation, a group server's central link). May be empty.
  std::function<void(clock_value)> on_clock{};
  /// How often the server's watchdog reports what blocks progress (0: never): workers that
  /// have not connected yet ("waiting for workers 2, 3 to connect (2 of 4 connected)"), and,
  /// when a pull has waited this long for the server clock, the worker that holds the clock
  /// back (logged, and sent to every waiting worker as a heartbeat report, see
  /// `protocol::report`). One timer per server, none per pull; it stops ticking while nothing
  /// waits (so a simulation still becomes quiescent).
  std::chrono::milliseconds watchdog_interval{std::chrono::seconds(5)};
};

/// Counters of a server (read on its executor).
struct server_stats {
  std::uint64_t connections = 0;     ///< connections accepted
  std::uint64_t rejected = 0;        ///< connections closed for a protocol violation
  std::uint64_t pushes = 0;          ///< push messages applied
  std::uint64_t pulls = 0;           ///< pull requests answered
  std::uint64_t deferred_pulls = 0;  ///< pulls that had to wait for the clock
  std::uint64_t eager_messages = 0;  ///< rows messages pushed unrequested (ESSP)
  std::uint64_t bytes_in = 0;        ///< payload bytes received
  std::uint64_t bytes_out = 0;       ///< payload bytes sent
  std::uint64_t rejoins = 0;         ///< hellos from workers ahead of their clock here
  // The recovery policy's counters are in its server part: `basic_server::recovery().stats()`.
};

/// A parameter-server shard.
///
/// Template parameters: `Transport` (models `transport`), `Consistency` (models
/// `consistency_policy`; on the server only `Consistency::eager` and `is_value_bounded_v` matter),
/// `Recovery` (models `recovery_policy`, same type as the workers'), `Optimizer` (models
/// `optimizer_policy`).
///
/// Thread safety: construct anywhere; call every member on `transport.get_executor()`.
/// Object lifetime: the transport outlives the server; `async_serve` must have completed before
/// the server is destroyed.
template <transport Transport, consistency_policy Consistency,
          recovery_policy Recovery = recovery::none, optimizer_policy Optimizer = optimizer::sgd>
class basic_server {
 public:
  using transport_type = Transport;
  using consistency_type = Consistency;
  using recovery_type = Recovery;
  using optimizer_type = Optimizer;

  /// Throws `std::invalid_argument` naming the bad field when `opts` is inconsistent
  /// (shard >= num_shards, no workers, empty layout, a table with 0 rows or width, ids out of
  /// order).
  /// `recovery` is the server part of the recovery policy, configured by the caller (for
  /// example the checkpoint directory); it is default-constructed when omitted.
  basic_server(Transport& transport, server_options opts, Optimizer opt = {},
               typename Recovery::server_part recovery = {})
      : transport_(transport), opts_(std::move(opts)), recovery_(std::move(recovery)),
        core_(opts_.shard, opts_.num_shards, opts_.num_workers, opts_.tables, opts_.seed, opt),
        done_(transport.get_executor()), running_(transport.get_executor()),
        watchdog_(transport.get_executor()) {
    static_assert(detail::check_server_part<typename Recovery::server_part, context>());
    connected_once_.assign(opts_.num_workers, 0);
  }

  /// As above, with the layout taken from a model object (the same type the workers train):
  /// `opts.tables` must be empty (it is filled from `layout_source.tables()`) or equal to it.
  /// Throws `std::invalid_argument` naming each differing table (both sides' rows x width)
  /// or the table counts, and for the reasons above. `layout_source` is only read here; it
  /// need not outlive the server.
  template <model M>
  basic_server(Transport& transport, const M& layout_source, server_options opts,
               Optimizer opt = {}, typename Recovery::server_part recovery = {})
      : basic_server(transport, with_layout(layout_source.tables(), std::move(opts)), opt,
                     std::move(recovery)) {}

  basic_server(const basic_server&) = delete;
  basic_server& operator=(const basic_server&) = delete;

  /// Accepts connections on `acceptor` and serves them until `stop()` is called. Completes
  /// with success after a stop, or with the acceptor's error. Every connection's coroutines
  /// have finished when it completes. Precondition: runs on `transport.get_executor()`.
  asio::awaitable<std::error_code> async_serve(typename Transport::acceptor_type acceptor) {
    acceptor_ = &acceptor;
    std::error_code result;
    if constexpr (requires(part_type& p) { p.on_start(*this); }) {
      recovery_.on_start(*this);  // e.g. restore the newest valid checkpoint
    }
    if constexpr (detail::has_on_serve<part_type, context>) {
      if (auto ec = recovery_.on_serve(context{this})) {  // e.g. connect to the chain master
        acceptor_ = nullptr;
        co_return ec;
      }
    }
    if (opts_.watchdog_interval.count() > 0) spawn(watchdog());
    while (!stopped_) {
      auto [ec, conn] = co_await acceptor.async_accept();
      if (ec && !stopped_ && transient_accept_error(ec)) {
        // Out of descriptors or memory: keep serving the connected workers, retry later.
        log("accept failed (" + ec.message() + "); retrying in 100 ms");
        done_.expires_after(std::chrono::milliseconds(100));
        co_await done_.async_wait(detail::use_tuple);
        continue;
      }
      if (ec) {
        if (!stopped_) result = ec;
        break;
      }
      ++stats_.connections;
      add_session(std::move(conn));
    }
    acceptor_ = nullptr;
    stop();
    co_await running_.async_wait();  // every session and every spawned coroutine
    if constexpr (requires(part_type& p) { p.on_stop(); }) {
      recovery_.on_stop();  // e.g. finish a checkpoint being persisted
    }
    co_return result;
  }

  /// Stops accepting and closes every connection; `async_serve` then completes.
  void stop() {
    stopped_ = true;
    if (acceptor_ != nullptr) acceptor_->close();
    for (auto& s : sessions_) close_session(s);
    done_.cancel();
    watchdog_.cancel();
  }

  /// The server clock: the minimum clock over all `num_workers` workers.
  clock_value clock() const noexcept { return core_.clock(); }
  /// Clock of worker `w` as seen by this server. Precondition: `w < num_workers`.
  clock_value worker_clock(std::uint32_t w) const noexcept { return core_.worker_clock(w); }
  /// This shard's rows of table `t`.
  key_range range(table_id t) const noexcept { return core_.table(t).range; }
  /// This shard's values of table `t`: `range(t).size() x width` floats, row-major.
  std::span<const float> values(table_id t) const noexcept { return core_.table(t).values; }
  /// Replaces this shard's values of table `t` (`range(t).size() x width` floats, row-major),
  /// e.g. a group server adopting the central model. Optimizer state, clocks and counts are
  /// kept; readers get the new values with their next rows. Throws `std::invalid_argument`
  /// when the size differs or a value is not finite (nothing is changed then). On the
  /// server's executor.
  void set_values(table_id t, std::span<const float> v) {
    if (t >= core_.num_tables() || v.size() != core_.table(t).values.size())
      throw std::invalid_argument(
          "asyncps::basic_server::set_values: table " + std::to_string(t) + " needs " +
          std::to_string(t < core_.num_tables() ? core_.table(t).values.size() : 0) +
          " floats, got " + std::to_string(v.size()));
    if (!core_type::all_finite(v))
      throw std::invalid_argument("asyncps::basic_server::set_values: non-finite value");
    core_.set_values(t, v);
  }
  const server_options& options() const noexcept { return opts_; }
  const server_stats& stats() const noexcept { return stats_; }
  /// The transport it serves on.
  Transport& transport() const noexcept { return transport_; }
  /// Connected sessions.
  std::size_t connections() const noexcept { return sessions_.size(); }
  /// The server part of the recovery policy (its counters, for reports).
  const typename Recovery::server_part& recovery() const noexcept { return recovery_; }
  /// The server part of the recovery policy, to configure it before `async_serve` (e.g.
  /// `recovery().set_chain(...)` for chain replication). On the server's executor.
  typename Recovery::server_part& recovery() noexcept { return recovery_; }

  /// Copies the shard's whole state (parameters, optimizer state and steps, vector clock,
  /// pushes applied per worker) into `out`, reusing its vectors' capacity: after the first
  /// call with the same `out` it allocates nothing. Cost: one memcpy of parameters and
  /// optimizer state. Thread safety: on the server's executor.
  void save_state(shard_state& out) const { core_.save_state(out); }

  /// Installs `st` as this shard's state (a restored checkpoint or a transferred replica).
  /// Errors: `errc::layout_mismatch` when `st` was taken from a different shard, shard count,
  /// worker count, optimizer or table layout (the state is then left unchanged). Connected
  /// workers keep their connections; pulls waiting for a clock the restored state has passed
  /// are answered. Thread safety: on the server's executor.
  std::error_code restore_state(const shard_state& st) {
    if (auto ec = core_.restore_state(st)) return ec;
    answer_ready_pulls();
    return {};
  }

 private:
  // The transport's timer and clock (asio::steady_timer and std::chrono::steady_clock unless
  // it declares its own, e.g. a simulated transport's virtual time).
  using timer_type = detail::transport_timer_t<Transport>;
  using clock_type = detail::transport_clock_t<Transport>;

  // One connection: unknown before its first message, then a worker's or (claimed by the
  // recovery part) a peer's (see detail::session_base).
  struct session : detail::session_base {
    session(typename Transport::connection_type c, const typename Transport::executor_type& ex)
        : conn(std::move(c)), wake(ex, clock_type::time_point::max()) {}
    typename Transport::connection_type conn;
    timer_type wake;
    typename std::list<session>::iterator self;
    int running = 2;  // read_loop + write_loop
    std::vector<message> outbox;
    std::vector<message> sending;
    std::vector<detail::subscription> subs;
    std::uint32_t pending_pulls = 0;  // pulls of this session waiting in the core
    std::uint64_t queued_bytes = 0;   // payload bytes in outbox + sending
  };
  using core_type = detail::shard_core<Optimizer, session*, typename clock_type::time_point>;
  static constexpr std::uint32_t no_worker = detail::session_base::none;
  using part_type = typename Recovery::server_part;

 public:
  /// What the recovery part's hooks (detail/server_hooks.hpp) may do with this server: a
  /// copyable handle, valid while the server lives; every call on the server's executor.
  class context {
   public:
    using timer_type = detail::transport_timer_t<Transport>;  ///< the transport's timer
    using endpoint_type = typename Transport::endpoint_type;  ///< the transport's address
    using connection_type = typename Transport::connection_type;

    explicit context(basic_server* s) noexcept : s_(s) {}

    const server_options& options() const noexcept { return s_->opts_; }
    /// The policy fingerprint workers and peers must send (protocol.hpp).
    static constexpr std::uint32_t fingerprint() noexcept {
      return policy_fingerprint<Consistency, Recovery>();
    }
    static constexpr std::string_view policy_name() noexcept { return Recovery::name; }
    /// Logs one line as this server.
    void log(const std::string& line) const { s_->log(line); }
    typename Transport::executor_type executor() const { return s_->transport_.get_executor(); }
    /// Connects to `ep` through the server's transport.
    auto async_connect(endpoint_type ep) const { return s_->transport_.async_connect(ep); }
    /// Whether `stop()` was called (a spawned coroutine then ends).
    bool stopped() const noexcept { return s_->stopped_; }
    /// Runs `a` on the server's executor; `async_serve` completes after it has finished.
    void spawn(asio::awaitable<void> a) const { s_->spawn(std::move(a)); }
    /// Serves connection `c` (one the part opened) as a peer session with tag `role`.
    detail::session_base& add_peer(connection_type c, std::uint8_t role) const {
      auto& p = s_->add_session(std::move(c));
      claim(p, role);
      return p;
    }
    /// Makes `s` a peer session with tag `role`: its messages go to `on_peer_message`.
    static void claim(detail::session_base& s, std::uint8_t role) noexcept {
      s.kind = detail::session_base::kind_type::peer;
      s.role = role;
    }
    /// Queues `m` to peer `s` (not bounded by the per-worker queue limits).
    void send_peer(detail::session_base& s, message m) const {
      s_->enqueue(as_session(s), std::move(m), true);
    }
    /// Acknowledges push `seq` to worker session `s`, or to worker `w` when it is connected.
    void ack(detail::session_base& s, std::uint64_t seq) const {
      s_->send_worker_ack(as_session(s), seq);
    }
    void ack_worker(std::uint32_t w, std::uint64_t seq) const {
      if (session* ws = s_->worker_session(w)) s_->send_worker_ack(*ws, seq);
    }
    /// Closes `s` now / after its queued messages.
    void close(detail::session_base& s) const { s_->close_session(as_session(s)); }
    void close_after_flush(detail::session_base& s) const { s_->close_after_flush(as_session(s)); }
    /// Closes every session `pred(session)` selects, in the order they were opened.
    template <class Pred>
    void close_if(Pred pred) const {
      for (auto& s : s_->sessions_)
        if (pred(static_cast<const detail::session_base&>(s))) s_->close_session(s);
    }
    // The shard.
    std::size_t num_tables() const noexcept { return s_->core_.num_tables(); }
    key_range range(table_id t) const noexcept { return s_->core_.table(t).range; }
    clock_value clock() const noexcept { return s_->core_.clock(); }
    clock_value worker_clock(std::uint32_t w) const noexcept { return s_->core_.worker_clock(w); }
    /// Highest push (or clock) sequence number applied per worker.
    std::uint64_t& last_seq(std::uint32_t w) const noexcept { return s_->core_.last_seq(w); }
    /// Whether the shard holds trained state (a push applied or a state restored).
    bool has_state() const noexcept { return s_->core_.has_state(); }
    /// Validates table, width and rows of push/pull `m` against this shard.
    std::error_code check_rows(const message& m, std::string& detail) const {
      return s_->core_.check_rows(m, detail);
    }
    static bool all_finite(std::span<const float> g) noexcept { return core_type::all_finite(g); }
    /// Applies checked push `m` of worker `m.header.sender` and counts it like a worker's.
    void apply_push(const message& m) const {
      s_->apply(m);
      s_->core_.count_push(m.header.sender, m.header.table);
      ++s_->stats_.pushes;
    }
    /// Applies checked update `m` without counting it as a worker's push.
    void apply_update(const message& m) const { s_->apply(m); }
    /// Replaces table `t`'s values with `v` and clears its optimizer state.
    void install_replica(table_id t, std::span<const float> v) const {
      s_->core_.install_replica(t, v);
    }
    /// Moves worker `w`'s clock to `c` (answers pulls, pushes eager rows, ...).
    void advance(std::uint32_t w, clock_value c) const { s_->advance(w, c); }
    void save_state(shard_state& out) const { s_->save_state(out); }
    std::error_code restore_state(const shard_state& st) const { return s_->restore_state(st); }
    /// The largest frame the transport accepts, in bytes.
    std::size_t max_frame_bytes() const {
      return wire_limits(s_->transport_.limits()).max_frame_bytes;
    }
    buffer allocate(std::size_t n) const { return s_->transport_.allocate(n); }

   private:
    static session& as_session(detail::session_base& s) noexcept {
      return static_cast<session&>(s);
    }
    basic_server* s_;
  };

 private:
  static bool transient_accept_error(std::error_code ec) noexcept {
    const auto e = std::errc(ec.value());
    return ec.category() == std::system_category() &&
           (e == std::errc::too_many_files_open || e == std::errc::too_many_files_open_in_system ||
            e == std::errc::no_buffer_space || e == std::errc::not_enough_memory ||
            e == std::errc::connection_aborted);
  }

  void log(const std::string& line) const {
    std::string who = "asyncps server " + std::to_string(opts_.shard);
    if constexpr (detail::has_log_suffix<part_type>) who += recovery_.log_suffix();
    detail::emit(opts_.log, who + ": " + line);
  }

  std::string who(const session& s) const {
    if (s.is_worker()) return "worker " + std::to_string(s.worker);
    if constexpr (detail::has_peer_name<part_type>) {
      if (s.is_peer()) return recovery_.peer_name(s);
    }
    return s.is_peer() ? "peer" : "unidentified peer";
  }

  context ctx() noexcept { return context{this}; }

  // Runs `a` on the executor, counted in `running_` (async_serve waits for it).
  void spawn(asio::awaitable<void> a) {
    running_.add();
    asio::co_spawn(transport_.get_executor(), counted(std::move(a)), asio::detached);
  }
  asio::awaitable<void> counted(asio::awaitable<void> a) {
    co_await std::move(a);
    running_.done();
  }

  // `peer`: a chain link (bounded by the chain protocol itself, not by the worker limits).
  void enqueue(session& s, message m, bool peer = false) {
    if (!s.open) return;
    if (!peer && (s.outbox.size() + s.sending.size() >= opts_.max_queued_messages ||
                  s.queued_bytes + m.payload.size() > opts_.max_queued_bytes)) {
      log("closing connection of " + who(s) + ": it does not read its messages (" +
          std::to_string(s.outbox.size() + s.sending.size()) + " messages, " +
          std::to_string(s.queued_bytes) + " bytes queued)");
      close_session(s);
      return;
    }
    s.queued_bytes += m.payload.size();
    stats_.bytes_out += m.payload.size();
    s.outbox.push_back(std::move(m));
    s.wake.cancel();
  }

  // Closes the connection now (even if the session was already flushing its last messages),
  // so both of its coroutines finish.
  void close_session(session& s) {
    s.open = false;
    s.conn.close();
    s.wake.cancel();
  }

  void reject(session& s, std::error_code ec, const std::string& detail) {
    const std::string reason = ec.message() + detail;
    if (ec != errc::not_head) {  // a not-head refusal is routine: the worker tries the next
      ++stats_.rejected;
      log("closing connection of " + who(s) + ": " + reason);
    }
    enqueue(s, protocol::encode(
                   protocol::error{.sender = opts_.shard,
                                   .code = ec.category() == error_category()
                                               ? std::optional<errc>(static_cast<errc>(ec.value()))
                                               : std::nullopt,
                                   .reason = reason},
                   alloc()));
    s.open = false;  // the write loop flushes the error, then closes
    s.wake.cancel();
  }

  void finish(session& s) {
    if (--s.running > 0) return;
    if (s.is_worker() && worker_session(s.worker) == &s) {
      registered_[s.worker] = nullptr;
      // The last worker left: nothing can wait any more, so the watchdog stops ticking now
      // (a simulation becomes quiescent when its workers are done, not a tick later).
      if (!watchdog_idle_ && std::none_of(registered_.begin(), registered_.end(),
                                          [](const session* p) { return p != nullptr; }))
        watchdog_.cancel();
    }
    if constexpr (detail::has_on_session_closed<part_type, context>) {
      recovery_.on_session_closed(ctx(), s);
    }
    core_.drop(&s);
    sessions_.erase(s.self);
    running_.done();
  }

  session* worker_session(std::uint32_t w) const {
    return w < registered_.size() ? registered_[w] : nullptr;
  }

  asio::awaitable<void> write_loop(session& s) {
    for (;;) {
      if (s.outbox.empty()) {
        if (!s.open) break;
        // `wake` expires at time_point::max() (set once, in the session's constructor); enqueue
        // cancels the wait. Not re-arming it here saves a timerfd_settime call per wake-up.
        co_await s.wake.async_wait(detail::use_tuple);
        continue;
      }
      std::swap(s.outbox, s.sending);
      bool failed = false;
      for (auto& m : s.sending) {
        s.queued_bytes -= m.payload.size();
        if (!failed && (co_await s.conn.async_send(std::move(m)))) failed = true;
      }
      s.sending.clear();
      if (failed) {
        s.outbox.clear();
        s.open = false;
        break;
      }
    }
    s.conn.close();
    finish(s);
  }

  asio::awaitable<void> read_loop(session& s) {
    while (s.open) {
      auto [ec, m] = co_await s.conn.async_receive();
      if (ec) {
        if (ec == condition::protocol_violation) {
          reject(s, ec, "");
        } else if (s.open && ec != errc::connection_closed) {
          log("connection of " + who(s) + " lost: " + ec.message());
        }
        break;
      }
      stats_.bytes_in += m.payload.size();
      std::string detail;
      std::error_code err;
      if (s.is_worker()) {
        err = dispatch(s, m, detail);
      } else if (!s.is_peer()) {
        err = greet(s, m, detail);
      } else if constexpr (detail::has_on_peer_message<part_type, context>) {
        err = recovery_.on_peer_message(ctx(), s, m, detail);
      }
      if (err) {
        reject(s, err, detail);
        break;
      }
    }
    close_after_flush(s);
    finish(s);
  }

  void close_after_flush(session& s) {
    s.open = false;
    s.wake.cancel();
  }

  std::error_code greet(session& s, const message& m, std::string& detail) {
    const auto& h = m.header;
    if constexpr (detail::has_on_unknown_peer<part_type, context>) {
      if (h.type != message_type::hello) {
        if (auto r = recovery_.on_unknown_peer(ctx(), s, m, detail)) return *r;
      }
    }
    if (h.type != message_type::hello) {
      detail = " (expected hello first)";
      return errc::unexpected_message;
    }
    protocol::hello& hello = hello_;  // reused: a hello decodes into the same vector
    if (auto ec = protocol::decode(m, hello, detail)) return ec;
    if (hello.fingerprint != policy_fingerprint<Consistency, Recovery>()) {
      detail = std::string(" (this server runs ") + (Consistency::eager ? "eager" : "lazy") +
               " consistency and recovery '" + std::string(Recovery::name) + "')";
      return errc::policy_mismatch;
    }
    if (h.clock < 0) {
      detail = " (hello clock " + std::to_string(h.clock) + ")";
      return errc::unexpected_message;
    }
    if (h.sender >= opts_.num_workers) {
      detail = " (got " + std::to_string(h.sender) + ", num_workers " +
               std::to_string(opts_.num_workers) + ")";
      return errc::bad_sender;
    }
    if (!core_.layout_matches(hello.layout)) {
      detail = " (" + core_.layout_difference_from(hello.layout) + ")";
      return errc::layout_mismatch;
    }
    if constexpr (detail::has_on_hello<part_type, context>) {
      if (auto ec = recovery_.on_hello(ctx(), h, detail)) return ec;  // e.g. not the head
    }
    if (registered_.empty()) registered_.assign(opts_.num_workers, nullptr);
    if (registered_[h.sender] != nullptr) {
      detail = " (worker " + std::to_string(h.sender) + ")";
      return errc::duplicate_worker;
    }
    registered_[h.sender] = &s;
    connected_once_[h.sender] = 1;
    s.worker = h.sender;
    s.kind = detail::session_base::kind_type::worker;
    s.subs.assign(core_.num_tables(), detail::subscription{});
    std::uint8_t flags = 0;
    if constexpr (detail::has_welcome_flags<part_type, context>) {
      flags = recovery_.welcome_flags(ctx(), h);  // e.g. ask for replicas
    }
    protocol::welcome w{.shard = opts_.shard,
                        .num_shards = opts_.num_shards,
                        .server_clock = core_.clock(),
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
      if constexpr (detail::has_on_rejoin<part_type, context>) {
        recovery_.on_rejoin(ctx(), s.worker, core_.worker_clock(s.worker),
                            h.clock);  // e.g. log the jump
      }
      advance(s.worker, h.clock);
    }
    return {};
  }

  // Fills `o.tables` from a model's layout, or checks that it equals it.
  static server_options with_layout(std::span<const table_spec> layout, server_options o) {
    if (o.tables.empty()) {
      o.tables.assign(layout.begin(), layout.end());
      return o;
    }
    std::string diff = detail::layout_difference(o.tables, "server_options", layout, "model");
    if (diff.empty()) {
      for (std::size_t i = 0; i < layout.size(); ++i)
        if (!(o.tables[i] == layout[i]))
          diff += (diff.empty() ? "" : "; ") + std::string("table ") + std::to_string(i) +
                  ": id or init_scale differ";
    }
    if (!diff.empty())
      throw std::invalid_argument(
          "asyncps::basic_server: server_options::tables differs from the model's layout (" + diff +
          ")");
    return o;
  }

  std::error_code dispatch(session& s, message& m, std::string& detail) {
    const auto& h = m.header;
    switch (h.type) {
      case message_type::push: {
        if (h.sender != s.worker) {
          detail = " (got " + std::to_string(h.sender) + " on the connection of worker " +
                   std::to_string(s.worker) + ")";
          return errc::bad_sender;
        }
        if (auto ec = core_.check_rows(m, detail)) return ec;
        const auto grad = payload_floats(m);
        if (!core_type::all_finite(grad)) return errc::non_finite_value;
        if (h.has(frame_flags::state) || h.has(frame_flags::backlog)) {
          if constexpr (detail::has_on_recovery_push<part_type, context>) {
            return recovery_.on_recovery_push(ctx(), s, m, detail);
          } else {
            detail = std::string(" (replica or backlog push, but recovery policy '") +
                     std::string(Recovery::name) + "' does not take them)";
            return errc::unexpected_message;
          }
        }
        if constexpr (detail::has_on_push<part_type, context>) {
          if (recovery_.on_push(ctx(), s, h)) return {};  // e.g. a duplicate after a failover
        }
        if (h.clock != core_.worker_clock(s.worker)) {
          detail = " (push for clock " + std::to_string(h.clock) + ", worker is at clock " +
                   std::to_string(core_.worker_clock(s.worker)) + ")";
          return errc::unexpected_message;
        }
        apply(m);
        core_.count_push(s.worker, h.table);
        core_.last_seq(s.worker) = h.seq;
        ++stats_.pushes;
        bool part_acks = false;  // the recovery part acknowledges (e.g. once replicated)
        if constexpr (detail::has_on_applied<part_type, context>) {
          part_acks = recovery_.on_applied(ctx(), s, m);
        }
        // VAP: the writer's clock is acknowledged once its rows are on their way to every
        // reader (below), not when applied.
        const bool visibility_ack = is_value_bounded_v<Consistency> && !part_acks &&
                                    h.has(frame_flags::want_ack) &&
                                    h.has(frame_flags::end_of_clock);
        if (!part_acks && h.has(frame_flags::want_ack) && !visibility_ack)
          send_worker_ack(s, h.seq);
        if (h.has(frame_flags::end_of_clock)) {
          advance(s.worker, h.clock + 1);
          if constexpr (is_value_bounded_v<Consistency>) {
            push_subscribed();
            if (visibility_ack) send_worker_ack(s, h.seq);
          }
        }
        return {};
      }
      case message_type::clock:
        if (h.sender != s.worker) return errc::bad_sender;
        if constexpr (detail::has_on_push<part_type, context>) {
          if (recovery_.on_push(ctx(), s, h)) return {};  // e.g. a duplicate after a failover
        }
        if (h.clock != core_.worker_clock(s.worker)) {
          detail = " (clock " + std::to_string(h.clock) + ", worker is at clock " +
                   std::to_string(core_.worker_clock(s.worker)) + ")";
          return errc::unexpected_message;
        }
        if (h.seq != 0) core_.last_seq(s.worker) = h.seq;
        if constexpr (detail::has_on_applied<part_type, context>) {
          (void)recovery_.on_applied(ctx(), s, m);
        }
        advance(s.worker, h.clock + 1);
        return {};
      case message_type::pull: {
        if (h.sender != s.worker) return errc::bad_sender;
        if (h.clock >
            core_.worker_clock(s.worker)) {  // no reader needs rows fresher than its own clock
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
          core_.defer(&s, std::move(m), clock_type::now());
          if (watchdog_idle_) {  // the watchdog sleeps while nothing waits: wake it
            watchdog_idle_ = false;
            watchdog_.cancel();
          }
        }
        return {};
      }
      case message_type::heartbeat: return {};
      case message_type::bye: close_after_flush(s); return {};
      case message_type::error: {
        protocol::error e;
        if (auto ec = protocol::decode(m, e, detail)) return ec;
        log(who(s) + " reported an error: " + std::string(e.reason));
        close_after_flush(s);
        return {};
      }
      default:
        detail = " (type " + std::to_string(static_cast<int>(h.type)) + " from a worker)";
        return errc::unexpected_message;
    }
  }

  // Serves `conn`: its read and write loops run until it closes (counted in `running_`).
  session& add_session(typename Transport::connection_type conn) {
    auto& s = sessions_.emplace_back(std::move(conn), transport_.get_executor());
    s.self = std::prev(sessions_.end());
    running_.add();
    asio::co_spawn(transport_.get_executor(), read_loop(s), asio::detached);
    asio::co_spawn(transport_.get_executor(), write_loop(s), asio::detached);
    return s;
  }

  void send_worker_ack(session& s, std::uint64_t seq) {
    message a;
    a.header.type = message_type::ack;
    a.header.sender = opts_.shard;
    a.header.seq = seq;
    enqueue(s, std::move(a));
  }

  // Applies checked update `m` to the shard, then tells the recovery part (on_update).
  void apply(const message& m) {
    core_.apply(m);
    const auto& h = m.header;
    if constexpr (requires(part_type& p) {
                    p.on_update(h.table, h.first_row, h.row_count, payload_floats(m));
                  }) {
      recovery_.on_update(h.table, h.first_row, h.row_count, payload_floats(m));
    }
  }

  auto alloc() {
    return [this](std::size_t n) { return transport_.allocate(n); };
  }

  // Replies to a pull (or pushes eagerly) with the requested rows as of the server clock.
  void answer(session& s, const message& req, bool eager) {
    const auto& h = req.header;
    send_rows(s, h.table, h.has(frame_flags::range), h.first_row, h.row_count, eager,
              core_.rows_payload(h.table, h.has(frame_flags::range), h.first_row, h.row_count,
                                 payload_keys(req), alloc()));
    if (!eager) ++stats_.pulls;
    if constexpr (Consistency::eager || is_value_bounded_v<Consistency>) {
      if (!eager) core_.subscribe(s.subs[h.table], req);
    }
  }

  void send_rows(session& s, table_id tid, bool ranged, std::uint64_t first, std::uint32_t count,
                 bool eager, buffer payload) {
    message r;
    r.header.type = message_type::rows;
    r.header.flags = static_cast<std::uint8_t>((ranged ? frame_flags::range : 0) |
                                               (eager ? frame_flags::eager : 0));
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

  // Answers the pulls that the server clock now satisfies, in arrival order.
  void answer_ready_pulls() {
    core_.take_ready([](session* p) { return p->open; },
                     [this](session* p, const message& req) {
                       --p->pending_pulls;
                       answer(*p, req, false);
                     });
  }

  void advance(std::uint32_t worker, clock_value c) {
    if (!core_.advance(worker, c)) return;
    const clock_value m = core_.clock();
    if constexpr (requires(part_type& p) { p.on_clock(m, *this); }) {
      recovery_.on_clock(m, *this);  // e.g. snapshot at this clock boundary
    } else if constexpr (requires(part_type& p) { p.on_clock(m); }) {
      recovery_.on_clock(m);
    }
    answer_ready_pulls();
    if constexpr (Consistency::eager) push_subscribed();
    if (opts_.on_clock) opts_.on_clock(m);
  }

  // Brings every reader's subscribed rows up to date (ESSP: when the server clock advances;
  // VAP: after each writer clock): one eager rows message per reader and table, holding the
  // subscribed rows that changed since the last rows this session sent, possibly none; every
  // other subscribed row is unchanged as of the message's clock (the worker re-stamps them).
  // When every row of the shard changed and is subscribed (dense models), the whole shard is
  // sent as a range, snapshot once per table and the buffer shared.
  void push_subscribed() {
    for (table_id t = 0; t < core_.num_tables(); ++t) {
      buffer whole;  // the whole shard, when sent as a range: snapshot once, shared
      for (auto& s : sessions_) {
        if (!s.open || !s.is_worker()) continue;
        auto& sub = s.subs[t];
        if (!sub.ranged && sub.keys.empty()) continue;
        auto e = core_.eager_rows_for(t, sub, whole, alloc());
        send_rows(s, t, e.ranged, e.ranged ? e.range.begin : 0, e.count, true,
                  std::move(e.payload));
        ++stats_.eager_messages;
      }
    }
  }

  // The watchdog: one coroutine and one timer per server (none per pull). Every
  // `watchdog_interval` it logs workers that have not connected yet (until each has connected
  // once, at most 3 times) and, when a pull has waited that long for the server clock, the
  // worker holding the clock back; it then sends each waiting worker a heartbeat report. It
  // sleeps (no timer armed) while nothing waits; a deferred pull wakes it, and the last worker
  // session's end puts it to sleep.
  asio::awaitable<void> watchdog() {
    const auto every = opts_.watchdog_interval;
    std::uint32_t connect_reports = 0;
    std::uint64_t deferred_seen = stats_.deferred_pulls;
    while (!stopped_) {
      bool watch_connect =
          connect_reports < 3 &&
          std::any_of(
              connected_once_.begin(), connected_once_.end(), [](char c) { return c == 0; });
      if constexpr (detail::has_serves_workers<part_type>) {
        watch_connect = watch_connect && recovery_.serves_workers();  // e.g. a chain's head
      }
      const bool any_worker = std::any_of(registered_.begin(), registered_.end(),
                                          [](const session* p) { return p != nullptr; });
      const bool watch_pulls =
          !core_.pending().empty() || (any_worker && stats_.deferred_pulls != deferred_seen);
      deferred_seen = stats_.deferred_pulls;
      watchdog_idle_ = !(watch_connect || watch_pulls);
      if (watchdog_idle_) {
        watchdog_.expires_at(clock_type::time_point::max());
      } else {
        watchdog_.expires_after(every);
      }
      auto [ec] = co_await watchdog_.async_wait(detail::use_tuple);
      if (stopped_) break;
      if (ec) continue;  // woken from sleep by a deferred pull: arm the timer
      if (watch_connect && report_unconnected()) ++connect_reports;
      if (!core_.pending().empty()) report_blocked(every);
    }
    watchdog_idle_ = false;
  }

  // Logs the workers not connected now, while some worker has never connected. Returns
  // whether it logged.
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

  // When the oldest waiting pull has waited `every` or longer: logs the worker holding the
  // server clock back and sends every worker with a waiting pull a heartbeat report.
  void report_blocked(std::chrono::milliseconds every) {
    const typename core_type::pending_type* oldest = nullptr;
    for (const auto& p : core_.pending())
      if (p.reader->open) {
        oldest = &p;
        break;
      }
    if (oldest == nullptr) return;
    const auto waited = clock_type::now() - oldest->since;
    if (waited < every) return;
    const auto& clocks = core_.worker_clocks();
    const auto slowest =
        static_cast<std::uint32_t>(std::min_element(clocks.begin(), clocks.end()) - clocks.begin());
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

  Transport& transport_;
  server_options opts_;
  [[no_unique_address]] typename Recovery::server_part recovery_{};
  core_type core_;           // tables, clocks, subscriptions' versions, waiting pulls (sans-io)
  protocol::hello hello_{};  // the last hello decoded (reused)
  std::vector<session*> registered_;
  std::list<session> sessions_;
  timer_type done_;                         // the accept loop's retry pause
  detail::wait_group<timer_type> running_;  // sessions and spawned coroutines (async_serve)
  timer_type watchdog_;                     // the watchdog's timer (see `watchdog`)
  bool watchdog_idle_ = false;              // the watchdog sleeps until a pull is deferred
  std::vector<char> connected_once_;        // per worker: has connected at least once
  typename Transport::acceptor_type* acceptor_ = nullptr;
  bool stopped_ = false;
  server_stats stats_{};
};

/// The TCP parameter server most programs use: `basic_server` over `tcp_transport`, with no
/// recovery and plain SGD unless named. Example: `asyncps::server<consistency::ssp<3>>`.
template <consistency_policy Consistency, recovery_policy Recovery = recovery::none,
          optimizer_policy Optimizer = optimizer::sgd>
using server = basic_server<tcp_transport, Consistency, Recovery, Optimizer>;

}  // namespace asyncps
