// asyncps — basic_server: a parameter-server shard driven by coroutines.
//
// One `basic_server` owns shard `shard` of `num_shards` of every table (a contiguous key range
// per table, see table.hpp), keeps a vector clock over its workers (server clock = minimum),
// applies pushed gradients with its optimizer, answers pulls once its clock is fresh enough
// for the request, and — for eager policies (ESSP) — pushes every subscribed row when its
// clock advances (Bösen's SSPPushServerThread).
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
#include "asyncps/detail/ring.hpp"
#include "asyncps/detail/shard_state_codec.hpp"
#include "asyncps/detail/text.hpp"
#include "asyncps/detail/transport_time.hpp"
#include "asyncps/error.hpp"
#include "asyncps/log.hpp"
#include "asyncps/model.hpp"
#include "asyncps/optimizer.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery.hpp"
#include "asyncps/recovery/chain_replication.hpp"
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
  /// `heartbeat_report`). One timer per server, none per pull; it stops ticking while nothing
  /// waits (so a simulation still becomes quiescent).
  std::chrono::milliseconds watchdog_interval{std::chrono::seconds(5)};
};

/// Counters of a server (read on its executor).
struct server_stats {
  std::uint64_t connections = 0;         ///< connections accepted
  std::uint64_t rejected = 0;            ///< connections closed for a protocol violation
  std::uint64_t pushes = 0;              ///< push messages applied
  std::uint64_t pulls = 0;               ///< pull requests answered
  std::uint64_t deferred_pulls = 0;      ///< pulls that had to wait for the clock
  std::uint64_t eager_messages = 0;      ///< rows messages pushed unrequested (ESSP)
  std::uint64_t bytes_in = 0;            ///< payload bytes received
  std::uint64_t bytes_out = 0;           ///< payload bytes sent
  std::uint64_t rejoins = 0;             ///< hellos from workers ahead of their clock here
  std::uint64_t replicas_installed = 0;  ///< tables rebuilt from a worker's replica
  std::uint64_t backlogs_merged = 0;     ///< backlog pushes merged (stateless recovery)
  std::uint64_t backlog_clocks = 0;      ///< clocks of worker updates those backlogs held
  // Chain replication (recovery::chain_replication):
  std::uint64_t chain_entries = 0;     ///< pushes and clocks appended to this server's log
  std::uint64_t chain_duplicates = 0;  ///< resent pushes dropped because already applied
  std::uint64_t chain_resent = 0;      ///< entries resent to a new successor
  std::uint64_t states_sent = 0;       ///< state transfers sent to a successor
  std::uint64_t states_installed = 0;  ///< state transfers installed from a predecessor
  std::uint64_t chain_configs = 0;     ///< configurations received from the chain master
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
      : transport_(transport), opts_(std::move(opts)), optimizer_(opt),
        recovery_(std::move(recovery)), clocks_(opts_.num_workers, 0), applied_(opts_.num_workers),
        done_(transport.get_executor()), watchdog_(transport.get_executor()) {
    if (opts_.num_shards == 0 || opts_.shard >= opts_.num_shards)
      throw std::invalid_argument("asyncps::server_options: shard must be < num_shards");
    if (opts_.num_workers == 0)
      throw std::invalid_argument("asyncps::server_options: num_workers must be > 0");
    if (opts_.tables.empty())
      throw std::invalid_argument("asyncps::server_options: tables must not be empty");
    tables_.reserve(opts_.tables.size());
    for (std::size_t i = 0; i < opts_.tables.size(); ++i) {
      const auto& spec = opts_.tables[i];
      if (spec.id != i || spec.rows == 0 || spec.width == 0)
        throw std::invalid_argument("asyncps::server_options: tables[" + std::to_string(i) +
                                    "] needs id == index, rows > 0 and width > 0");
      table_state t;
      t.spec = spec;
      t.range = shard_range(spec.rows, opts_.shard, opts_.num_shards);
      t.values.resize(std::size_t{t.range.size()} * spec.width);
      t.state.resize(t.values.size() * Optimizer::state_per_param, 0.0f);
      t.row_version.assign(t.range.size(), 0);
      init_table(t);
      tables_.push_back(std::move(t));
    }
    for (auto& a : applied_) a.assign(tables_.size(), 0);
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
    if constexpr (requires(typename Recovery::server_part& p) { p.on_start(*this); }) {
      recovery_.on_start(*this);  // e.g. restore the newest valid checkpoint
    }
    if constexpr (is_chain) {
      if (chain_.members.empty() || chain_.self >= chain_.members.size()) {
        log("chain replication needs set_chain(...) with this server among the members");
        acceptor_ = nullptr;
        co_return errc::invalid_argument;
      }
      ++connectors_;
      asio::co_spawn(transport_.get_executor(), master_link(), asio::detached);
    }
    if (opts_.watchdog_interval.count() > 0) {
      ++connectors_;
      asio::co_spawn(transport_.get_executor(), watchdog(), asio::detached);
    }
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
      add_session(std::move(conn), session_kind::unknown);
    }
    acceptor_ = nullptr;
    stop();
    while (!sessions_.empty() || connectors_ > 0) {
      done_.expires_after(std::chrono::milliseconds(100));
      co_await done_.async_wait(detail::use_tuple);
    }
    if constexpr (requires(typename Recovery::server_part& p) { p.on_stop(); }) {
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

  /// Chain replication only: this server's place in its shard's chain (the master's and
  /// every member's endpoint). Call before `async_serve`, which otherwise fails with
  /// `errc::invalid_argument`. Thread safety: on the server's executor.
  void set_chain(recovery::chain_endpoints<typename Transport::endpoint_type> c)
    requires recovery::is_chain_replication_v<Recovery>
  {
    chain_ = std::move(c);
  }
  /// Chain replication: whether the master made this server its chain's head (it then
  /// serves workers; other members refuse them with `errc::not_head`).
  bool is_head() const noexcept { return head_; }
  /// Chain replication: pushes and clocks applied by this server (its log position).
  std::uint64_t log_position() const noexcept { return log_index_; }
  /// Chain replication: log position the tail has acknowledged (what workers were acked).
  std::uint64_t committed() const noexcept { return committed_; }

  /// The server clock: the minimum clock over all `num_workers` workers.
  clock_value clock() const noexcept { return server_clock_; }
  /// Clock of worker `w` as seen by this server. Precondition: `w < num_workers`.
  clock_value worker_clock(std::uint32_t w) const noexcept { return clocks_[w]; }
  /// This shard's rows of table `t`.
  key_range range(table_id t) const noexcept { return tables_[t].range; }
  /// This shard's values of table `t`: `range(t).size() x width` floats, row-major.
  std::span<const float> values(table_id t) const noexcept { return tables_[t].values; }
  /// Replaces this shard's values of table `t` (`range(t).size() x width` floats, row-major),
  /// e.g. a group server adopting the central model. Optimizer state, clocks and counts are
  /// kept; readers get the new values with their next rows. Throws `std::invalid_argument`
  /// when the size differs or a value is not finite (nothing is changed then). On the
  /// server's executor.
  void set_values(table_id t, std::span<const float> v) {
    if (t >= tables_.size() || v.size() != tables_[t].values.size())
      throw std::invalid_argument(
          "asyncps::basic_server::set_values: table " + std::to_string(t) + " needs " +
          std::to_string(t < tables_.size() ? tables_[t].values.size() : 0) + " floats, got " +
          std::to_string(v.size()));
    if (!all_finite(v))
      throw std::invalid_argument("asyncps::basic_server::set_values: non-finite value");
    std::copy(v.begin(), v.end(), tables_[t].values.begin());
    changed(tables_[t], tables_[t].range);
    has_state_ = true;
  }
  const server_options& options() const noexcept { return opts_; }
  const server_stats& stats() const noexcept { return stats_; }
  /// The transport it serves on.
  Transport& transport() const noexcept { return transport_; }
  /// Connected sessions.
  std::size_t connections() const noexcept { return sessions_.size(); }
  /// The server part of the recovery policy (its counters, for reports).
  const typename Recovery::server_part& recovery() const noexcept { return recovery_; }

  /// Copies the shard's whole state (parameters, optimizer state and steps, vector clock,
  /// pushes applied per worker) into `out`, reusing its vectors' capacity: after the first
  /// call with the same `out` it allocates nothing. Cost: one memcpy of parameters and
  /// optimizer state. Thread safety: on the server's executor.
  void save_state(shard_state& out) const {
    out.shard = opts_.shard;
    out.num_shards = opts_.num_shards;
    out.num_workers = opts_.num_workers;
    out.state_per_param = Optimizer::state_per_param;
    out.server_clock = server_clock_;
    out.worker_clocks.assign(clocks_.begin(), clocks_.end());
    out.last_seq.assign(last_seq_.begin(), last_seq_.end());
    out.applied.resize(std::size_t{opts_.num_workers} * tables_.size());
    for (std::uint32_t w = 0; w < opts_.num_workers; ++w)
      std::copy(applied_[w].begin(), applied_[w].end(), out.applied.begin() + w * tables_.size());
    out.tables.resize(tables_.size());
    for (std::size_t i = 0; i < tables_.size(); ++i) {
      auto& o = out.tables[i];
      o.spec = tables_[i].spec;
      o.range = tables_[i].range;
      o.step = tables_[i].step;
      o.values.assign(tables_[i].values.begin(), tables_[i].values.end());
      o.optimizer_state.assign(tables_[i].state.begin(), tables_[i].state.end());
    }
  }

  /// Installs `st` as this shard's state (a restored checkpoint or a transferred replica).
  /// Errors: `errc::layout_mismatch` when `st` was taken from a different shard, shard count,
  /// worker count, optimizer or table layout (the state is then left unchanged). Connected
  /// workers keep their connections; pulls waiting for a clock the restored state has passed
  /// are answered. Thread safety: on the server's executor.
  std::error_code restore_state(const shard_state& st) {
    if (st.shard != opts_.shard || st.num_shards != opts_.num_shards ||
        st.num_workers != opts_.num_workers || st.state_per_param != Optimizer::state_per_param ||
        st.tables.size() != tables_.size() || st.worker_clocks.size() != clocks_.size() ||
        st.applied.size() != std::size_t{opts_.num_workers} * tables_.size())
      return errc::layout_mismatch;
    for (std::size_t i = 0; i < tables_.size(); ++i) {
      const auto& t = st.tables[i];
      if (!(t.spec == tables_[i].spec) || !(t.range == tables_[i].range) ||
          t.values.size() != tables_[i].values.size() ||
          t.optimizer_state.size() != tables_[i].state.size())
        return errc::layout_mismatch;
    }
    for (std::size_t i = 0; i < tables_.size(); ++i) {
      tables_[i].step = st.tables[i].step;
      std::copy(st.tables[i].values.begin(), st.tables[i].values.end(), tables_[i].values.begin());
      std::copy(st.tables[i].optimizer_state.begin(), st.tables[i].optimizer_state.end(),
                tables_[i].state.begin());
      changed(tables_[i], tables_[i].range);
    }
    for (std::uint32_t w = 0; w < opts_.num_workers; ++w) {
      clocks_[w] = st.worker_clocks[w];
      std::copy_n(st.applied.begin() + w * tables_.size(), tables_.size(), applied_[w].begin());
    }
    if (st.last_seq.size() == last_seq_.size())
      std::copy(st.last_seq.begin(), st.last_seq.end(), last_seq_.begin());
    server_clock_ = *std::min_element(clocks_.begin(), clocks_.end());
    has_state_ = true;
    answer_ready_pulls();
    return {};
  }

 private:
  // The transport's timer and clock (asio::steady_timer and std::chrono::steady_clock unless
  // it declares its own, e.g. a simulated transport's virtual time).
  using timer_type = detail::transport_timer_t<Transport>;
  using clock_type = detail::transport_clock_t<Transport>;

  struct table_state {
    table_spec spec;
    key_range range;
    std::vector<float> values;
    std::vector<float> state;  // Optimizer::state_per_param planes of values.size()
    std::uint64_t step = 0;
    // Change tracking for eager rows (only changed rows are pushed): `version` counts changes
    // of the table, `row_version[r]` is the version of row r's last change, `all_changed` the
    // last version that changed every row at once (dense pushes, restores).
    std::uint64_t version = 0;
    std::vector<std::uint64_t> row_version;
    std::uint64_t all_changed = 0;
  };
  // The rows a reader subscribed to (by pulling them) in one table: a range (dense reads)
  // and/or single rows outside it (sparse reads), in order of their first pull.
  struct subscription {
    bool ranged = false;
    key_range range{};
    std::vector<row_id> keys;
    std::vector<bool> keyed;  // per row of the shard: in `keys` (sized on the first keyed pull)
    // The table version the reader's subscribed rows are current at (as of the last rows
    // this session sent it): eager rows carry only rows changed since.
    std::uint64_t synced = 0;
  };
  // What the peer of a session is: not yet known (before its hello), a worker, or (chain
  // replication) this server's predecessor, successor or the chain master.
  enum class session_kind : std::uint8_t { unknown, worker, predecessor, successor, master };
  struct session {
    session(typename Transport::connection_type c, const typename Transport::executor_type& ex)
        : conn(std::move(c)), wake(ex, clock_type::time_point::max()) {}
    typename Transport::connection_type conn;
    timer_type wake;
    typename std::list<session>::iterator self;
    session_kind kind = session_kind::unknown;
    bool synced = false;  // successor: its first ack (log position) arrived
    std::uint32_t worker = no_worker;
    bool open = true;
    int running = 2;  // read_loop + write_loop
    std::vector<message> outbox;
    std::vector<message> sending;
    std::vector<subscription> subs;
    std::uint32_t pending_pulls = 0;  // entries of pending_ for this session
    std::uint64_t queued_bytes = 0;   // payload bytes in outbox + sending
  };
  struct pending_pull {
    session* s;
    message request;
    typename clock_type::time_point since{};  // when it was deferred (watchdog reports)
  };
  struct pending_ack {
    std::uint64_t index;  // log position that must be committed first
    std::uint32_t worker;
    std::uint64_t seq;
  };
  static constexpr std::uint32_t no_worker = 0xffffffffu;

  void init_table(table_state& t) {
    if (t.spec.init_scale == 0.0f) {
      std::fill(t.values.begin(), t.values.end(), 0.0f);
      return;
    }
    for (row_id r = t.range.begin; r < t.range.end; ++r) {
      std::seed_seq seq{static_cast<std::uint32_t>(opts_.seed),
                        static_cast<std::uint32_t>(opts_.seed >> 32), t.spec.id, r};
      std::mt19937 gen(seq);
      std::uniform_real_distribution<float> dist(-t.spec.init_scale, t.spec.init_scale);
      float* row = t.values.data() + std::size_t{r - t.range.begin} * t.spec.width;
      for (std::uint32_t j = 0; j < t.spec.width; ++j) row[j] = dist(gen);
    }
  }

  static bool transient_accept_error(std::error_code ec) noexcept {
    const auto e = std::errc(ec.value());
    return ec.category() == std::system_category() &&
           (e == std::errc::too_many_files_open || e == std::errc::too_many_files_open_in_system ||
            e == std::errc::no_buffer_space || e == std::errc::not_enough_memory ||
            e == std::errc::connection_aborted);
  }

  void log(const std::string& line) const {
    std::string who = "asyncps server " + std::to_string(opts_.shard);
    if constexpr (is_chain) who += "." + std::to_string(chain_.self);  // shard.member
    detail::emit(opts_.log, who + ": " + line);
  }

  std::string who(const session& s) const {
    switch (s.kind) {
      case session_kind::worker: return "worker " + std::to_string(s.worker);
      case session_kind::predecessor: return "chain predecessor " + std::to_string(s.worker);
      case session_kind::successor: return "chain successor " + std::to_string(s.worker);
      case session_kind::master: return "chain master";
      default: return "unidentified peer";
    }
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
    if (s.worker != no_worker && worker_session(s.worker) == &s) {
      registered_[s.worker] = nullptr;
      // The last worker left: nothing can wait any more, so the watchdog stops ticking now
      // (a simulation becomes quiescent when its workers are done, not a tick later).
      if (!watchdog_idle_ && std::none_of(registered_.begin(), registered_.end(),
                                          [](const session* p) { return p != nullptr; }))
        watchdog_.cancel();
    }
    if (pred_ == &s) pred_ = nullptr;
    if (succ_ == &s) {
      succ_ = nullptr;
      if (succ_wake_ != nullptr) succ_wake_->cancel();
    }
    if (master_ == &s) master_ = nullptr;
    std::erase_if(pending_, [&](const pending_pull& p) { return p.s == &s; });
    sessions_.erase(s.self);
    if (sessions_.empty()) done_.cancel();
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
      switch (s.kind) {
        case session_kind::unknown: err = greet(s, m, detail); break;
        case session_kind::worker: err = dispatch(s, m, detail); break;
        default:
          if constexpr (is_chain) err = chain_dispatch(s, m, detail);
          break;
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
    if constexpr (is_chain) {
      if (h.type == message_type::chain_hello) return greet_predecessor(s, m, detail);
    }
    if (h.type != message_type::hello) {
      detail = " (expected hello first)";
      return errc::unexpected_message;
    }
    protocol::hello hello;
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
    if (!layout_matches(hello)) {
      detail = " (" + layout_difference_from(hello) + ")";
      return errc::layout_mismatch;
    }
    if constexpr (is_chain) {
      if (!head_) {
        detail = " (server " + std::to_string(chain_.self) + " of shard " +
                 std::to_string(opts_.shard) + ")";
        return errc::not_head;
      }
    }
    if (registered_.empty()) registered_.assign(opts_.num_workers, nullptr);
    if (registered_[h.sender] != nullptr) {
      detail = " (worker " + std::to_string(h.sender) + ")";
      return errc::duplicate_worker;
    }
    registered_[h.sender] = &s;
    connected_once_[h.sender] = 1;
    s.worker = h.sender;
    s.kind = session_kind::worker;
    s.subs.assign(tables_.size(), subscription{});
    bool ask_state = false;
    if constexpr (accepts_replicas) {
      // A server that has applied nothing meets a worker that has trained: this server was
      // restarted without state, so it asks the workers for their replicas.
      if (!has_state_ && h.clock > 0) {
        ask_state = true;
        std::fill(needs_state_.begin(), needs_state_.end(), true);
      }
    }
    protocol::welcome w{.shard = opts_.shard,
                        .num_shards = opts_.num_shards,
                        .server_clock = server_clock_,
                        .worker_clock = std::max(clocks_[s.worker], h.clock),
                        .wants_state = ask_state,
                        .tables = {},
                        .local_step = static_cast<float>(optimizer_.local_step())};
    w.tables.reserve(tables_.size());
    for (std::size_t i = 0; i < tables_.size(); ++i)
      w.tables.push_back({tables_[i].spec.rows, tables_[i].spec.width, applied_[s.worker][i]});
    enqueue(s, protocol::encode(w, alloc()));
    if (h.clock > clocks_[s.worker]) {
      // The worker kept training while this shard was away (a restart from a checkpoint, or
      // without state): its updates of the clocks in between are lost here, so its clock at
      // this shard moves up to its own.
      log("worker " + std::to_string(s.worker) + " rejoins at clock " + std::to_string(h.clock) +
          " (this shard had it at " + std::to_string(clocks_[s.worker]) + ")");
      ++stats_.rejoins;
      if constexpr (is_strict_chain) {
        // Replicate the jump like any other clock (the log must hold every state change).
        for (clock_value k = clocks_[s.worker]; k < h.clock; ++k) {
          message c;
          c.header.type = message_type::clock;
          c.header.sender = s.worker;
          c.header.clock = k;
          c.header.seq = last_seq_[s.worker];
          append_entry(c);
        }
      }
      advance(s.worker, h.clock);
    }
    return {};
  }

  // The transport's buffer allocator, for the protocol encoders.
  auto alloc() {
    return [this](std::size_t n) { return transport_.allocate(n); };
  }

  // The layout in hello `m` compared with this server's: each differing table with both
  // sides' rows x width, and the table counts when they differ.
  std::string layout_difference_from(const protocol::hello& h) const {
    std::vector<table_spec> theirs(h.layout.size());
    for (std::size_t i = 0; i < h.layout.size(); ++i) {
      theirs[i].id = static_cast<table_id>(i);
      theirs[i].rows = h.layout[i].rows;
      theirs[i].width = h.layout[i].width;
    }
    std::vector<table_spec> ours;
    ours.reserve(tables_.size());
    for (const auto& t : tables_) ours.push_back(t.spec);
    return detail::layout_difference(theirs, "worker", ours, "server");
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

  bool layout_matches(const protocol::hello& h) const {
    if (h.layout.size() != tables_.size()) return false;
    for (std::size_t i = 0; i < tables_.size(); ++i)
      if (h.layout[i].rows != tables_[i].spec.rows || h.layout[i].width != tables_[i].spec.width)
        return false;
    return true;
  }

  // Validates table, width and rows of a push/pull against this shard.
  std::error_code check_rows(const message& m, std::string& detail) const {
    const auto& h = m.header;
    if (h.table >= tables_.size()) {
      detail = " (got " + std::to_string(h.table) + ")";
      return errc::bad_table;
    }
    const auto& t = tables_[h.table];
    if (h.type != message_type::pull && h.width != t.spec.width) {
      detail = " (got " + std::to_string(h.width) + ", table " + std::to_string(h.table) + " has " +
               std::to_string(t.spec.width) + ")";
      return errc::bad_width;
    }
    if (h.has(frame_flags::range)) {
      if (h.first_row < t.range.begin || h.first_row > t.range.end ||
          h.row_count > t.range.end - h.first_row) {
        detail = " (rows [" + std::to_string(h.first_row) + ", " +
                 std::to_string(h.first_row + h.row_count) + ") vs shard rows [" +
                 std::to_string(t.range.begin) + ", " + std::to_string(t.range.end) + "))";
        return errc::bad_row_range;
      }
    } else {
      for (row_id k : payload_keys(m)) {
        if (!t.range.contains(k)) {
          detail = " (row " + std::to_string(k) + " vs shard rows [" +
                   std::to_string(t.range.begin) + ", " + std::to_string(t.range.end) + "))";
          return errc::bad_row_range;
        }
      }
    }
    return {};
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
        if (auto ec = check_rows(m, detail)) return ec;
        const auto grad = payload_floats(m);
        if (!all_finite(grad)) return errc::non_finite_value;
        if (h.has(frame_flags::state) || h.has(frame_flags::backlog))
          return recover_push(s, m, detail);
        if constexpr (is_chain) {
          if (h.seq <= last_seq_[s.worker]) return duplicate(s, h);
        }
        if (h.clock != clocks_[s.worker]) {
          detail = " (push for clock " + std::to_string(h.clock) + ", worker is at clock " +
                   std::to_string(clocks_[s.worker]) + ")";
          return errc::unexpected_message;
        }
        apply(m);
        has_state_ = true;
        ++applied_[s.worker][h.table];
        last_seq_[s.worker] = h.seq;
        ++stats_.pushes;
        // VAP: the writer's clock is acknowledged once its rows are on their way to every
        // reader (below), not when applied.
        const bool visibility_ack = is_value_bounded_v<Consistency> && !is_chain &&
                                    h.has(frame_flags::want_ack) &&
                                    h.has(frame_flags::end_of_clock);
        if constexpr (is_chain) {
          log_worker_entry(s, m);
        } else if (h.has(frame_flags::want_ack) && !visibility_ack) {
          send_worker_ack(s, h.seq);
        }
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
        if constexpr (is_chain) {
          if (h.seq != 0 && h.seq <= last_seq_[s.worker]) return duplicate(s, h);
        }
        if (h.clock != clocks_[s.worker]) {
          detail = " (clock " + std::to_string(h.clock) + ", worker is at clock " +
                   std::to_string(clocks_[s.worker]) + ")";
          return errc::unexpected_message;
        }
        if (h.seq != 0) last_seq_[s.worker] = h.seq;
        if constexpr (is_chain) log_worker_entry(s, m);
        advance(s.worker, h.clock + 1);
        return {};
      case message_type::pull: {
        if (h.sender != s.worker) return errc::bad_sender;
        if (h.clock > clocks_[s.worker]) {  // no reader needs rows fresher than its own clock
          detail = " (pull wants server clock " + std::to_string(h.clock) + ", worker is at " +
                   std::to_string(clocks_[s.worker]) + ")";
          return errc::unexpected_message;
        }
        if (auto ec = check_rows(m, detail)) return ec;
        if (server_clock_ >= h.clock) {
          answer(s, m, false);
        } else {
          ++stats_.deferred_pulls;
          if (++s.pending_pulls > opts_.max_pending_pulls) {
            detail = " (more than " + std::to_string(opts_.max_pending_pulls) + " pulls waiting)";
            return errc::too_many_requests;
          }
          pending_.push_back(pending_pull{&s, std::move(m), clock_type::now()});
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

  // -------------------------------------------------------------------------------------
  // Chain replication (recovery::chain_replication). The chain master decides every
  // server's predecessor and successor (`chain_config`). Strict: entries (worker pushes and
  // clocks, in the order the head applied them) flow down the chain and acks (log
  // positions) flow back up; a worker's push is acked once the tail has it. Relaxed: the
  // head copies its whole state down the chain every `replicate_every` pushes.
  // -------------------------------------------------------------------------------------

  session& add_session(typename Transport::connection_type conn, session_kind kind) {
    auto& s = sessions_.emplace_back(std::move(conn), transport_.get_executor());
    s.self = std::prev(sessions_.end());
    s.kind = kind;
    asio::co_spawn(transport_.get_executor(), read_loop(s), asio::detached);
    asio::co_spawn(transport_.get_executor(), write_loop(s), asio::detached);
    return s;
  }

  recovery::chain_options chain_options() const {
    if constexpr (is_chain) {
      return recovery_.options;
    } else {
      return {};
    }
  }

  message chain_message(message_type type, std::uint64_t seq) const {
    message m;
    m.header.type = type;
    m.header.sender = opts_.shard;
    m.header.seq = seq;
    return m;
  }

  message chain_hello() {
    return protocol::encode(
        protocol::chain_hello{.shard = opts_.shard,
                              .member = chain_.self,
                              .fingerprint = policy_fingerprint<Consistency, Recovery>(),
                              .epoch = epoch_},
        alloc());
  }

  static std::string member_name(std::uint32_t m) {
    return m == no_member ? std::string("none") : std::to_string(m);
  }

  // Registers with the chain master, sends it heartbeats, and registers again when the link
  // drops (the master then treats this server as a new member: it rejoins as the tail).
  asio::awaitable<void> master_link() {
    timer_type timer(transport_.get_executor());
    std::chrono::milliseconds backoff{10};
    while (!stopped_) {
      if (master_ == nullptr) {
        auto [ec, conn] = co_await transport_.async_connect(chain_.master);
        if (!ec && !stopped_) {
          master_ = &add_session(std::move(conn), session_kind::master);
          first_config_ = true;
          enqueue(*master_, chain_hello(), true);
          backoff = std::chrono::milliseconds(10);
        } else {
          if (!ec) conn.close();
          backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
        }
      } else {
        enqueue(*master_, chain_message(message_type::heartbeat, 0), true);
      }
      timer.expires_after(master_ == nullptr ? backoff : chain_options().heartbeat_interval);
      co_await timer.async_wait(detail::use_tuple);
    }
    --connectors_;
    done_.cancel();
  }

  // Keeps a connection to the configured successor (reconnecting while it stays configured).
  asio::awaitable<void> successor_link() {
    timer_type timer(transport_.get_executor());
    succ_wake_ = &timer;  // cancelled when the successor session ends or changes
    std::chrono::milliseconds backoff{1};
    while (!stopped_ && succ_member_ != no_member) {
      if (succ_ == nullptr && !fresh_) {
        const std::uint32_t target = succ_member_;
        auto [ec, conn] = co_await transport_.async_connect(chain_.members[target]);
        if (!ec && !stopped_ && succ_member_ == target && succ_ == nullptr && !fresh_) {
          succ_ = &add_session(std::move(conn), session_kind::successor);
          succ_->worker = target;
          enqueue(*succ_, chain_hello(), true);
        } else if (!ec) {
          conn.close();
        }
        // A refused or failed attempt (e.g. the successor has not got its configuration
        // yet) is retried with backoff; a synced link resets it.
        backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
      } else if (succ_ != nullptr && succ_->synced) {
        backoff = std::chrono::milliseconds(1);
      }
      timer.expires_after(succ_ == nullptr ? backoff : std::chrono::seconds(1));
      co_await timer.async_wait(detail::use_tuple);
    }
    succ_wake_ = nullptr;
    succ_connecting_ = false;
    --connectors_;
    done_.cancel();
  }

  // Drops everything this server did as a chain member: it rejoins from a state transfer.
  void leave_chain() {
    for (auto& s : sessions_)
      if (s.kind == session_kind::worker || s.kind == session_kind::predecessor ||
          s.kind == session_kind::successor)
        close_session(s);
    pred_ = succ_ = nullptr;
    head_ = false;
    fresh_ = true;
    sent_.clear();
    pending_acks_.clear();
    committed_ = 0;
    pred_member_ = succ_member_ = no_member;
  }

  void on_config(const protocol::chain_config& h) {
    ++stats_.chain_configs;
    const auto pred = h.predecessor;
    const auto succ = h.successor;
    const auto known = [this](std::uint64_t m) {
      return m == no_member || m < chain_.members.size();
    };
    if (!known(pred) || !known(succ)) {
      // The master's member ids and this server's set_chain list disagree: a configuration
      // error, reported instead of connecting to an endpoint this server does not know.
      log("chain master names member " + std::to_string(pred) + " / " + std::to_string(succ) +
          ", but set_chain lists " + std::to_string(chain_.members.size()) +
          " members; ignoring the configuration");
      return;
    }
    if (h.joining && first_config_) {
      // Registered anew with a running chain: whatever this server holds may be stale.
      if (serving_) log("rejoining the chain: dropping this server's state and connections");
      leave_chain();
    }
    first_config_ = false;
    serving_ = true;
    epoch_ = h.epoch;
    if (pred_ != nullptr && pred_->worker != pred) {
      close_session(*pred_);
      pred_ = nullptr;
    }
    pred_member_ = pred;
    const bool was_head = head_;
    head_ = pred == no_member;
    if (head_ && fresh_) {
      fresh_ = false;
      log("no other server of the chain is alive: serving from this server's own state");
    }
    if (was_head && !head_)
      for (auto& s : sessions_)
        if (s.kind == session_kind::worker) close_session(s);
    if (succ != succ_member_) {
      if (succ_ != nullptr) {
        close_session(*succ_);
        succ_ = nullptr;
      }
      succ_member_ = succ;
      if (succ_wake_ != nullptr) succ_wake_->cancel();
      if (succ == no_member) {
        if constexpr (is_strict_chain) {
          sent_.clear();
          if (!fresh_) commit(log_index_);  // the tail commits what it applies
        }
      } else if (!succ_connecting_) {
        succ_connecting_ = true;
        ++connectors_;
        asio::co_spawn(transport_.get_executor(), successor_link(), asio::detached);
      }
    }
    log("chain epoch " + std::to_string(epoch_) + ": predecessor " + member_name(pred) +
        ", successor " + member_name(succ) + (head_ ? " (head)" : "") +
        (succ == no_member ? " (tail)" : "") + (fresh_ ? ", waiting for a state transfer" : ""));
  }

  std::error_code greet_predecessor(session& s, const message& m, std::string& detail) {
    protocol::chain_hello h;
    if (auto ec = protocol::decode(m, h, detail)) return ec;
    if (h.fingerprint != policy_fingerprint<Consistency, Recovery>()) {
      detail = std::string(" (chain peer; this server runs recovery '") +
               std::string(Recovery::name) + "')";
      return errc::policy_mismatch;
    }
    if (!serving_ || h.shard != opts_.shard || pred_member_ == no_member ||
        h.member != pred_member_) {
      detail = " (chain_hello from server " + std::to_string(h.member) + " of shard " +
               std::to_string(h.shard) + "; this server's predecessor in epoch " +
               std::to_string(epoch_) + " is " + member_name(pred_member_) + ")";
      return errc::unexpected_message;
    }
    if (pred_ != nullptr) close_session(*pred_);
    pred_ = &s;
    s.kind = session_kind::predecessor;
    s.worker = h.member;
    message a = chain_message(message_type::ack, log_index_);
    if (fresh_) a.header.flags = frame_flags::state;
    enqueue(s, std::move(a), true);
    return {};
  }

  std::error_code chain_dispatch(session& s, message& m, std::string& detail) {
    const auto& h = m.header;
    if (h.type == message_type::heartbeat) return {};
    if (h.type == message_type::error || h.type == message_type::bye) {
      protocol::error e;
      if (h.type == message_type::error && !protocol::decode(m, e, detail))
        log(std::string(s.kind == session_kind::master ? "chain master" : "chain peer") +
            " closed the connection: " + std::string(e.reason));
      close_after_flush(s);
      return {};
    }
    switch (s.kind) {
      case session_kind::master:
        if (h.type == message_type::chain_config) {
          protocol::chain_config c;
          if (auto ec = protocol::decode(m, c, detail)) return ec;
          if (c.shard != opts_.shard || c.member != chain_.self) break;
          on_config(c);
          return {};
        }
        break;
      case session_kind::successor:
        if (h.type != message_type::ack) break;
        if (!s.synced) {
          successor_ready(s, h.seq, h.has(frame_flags::state));
        } else if constexpr (is_strict_chain) {
          if (h.seq > log_index_) {
            detail = " (successor acknowledges log position " + std::to_string(h.seq) +
                     ", this server is at " + std::to_string(log_index_) + ")";
            return errc::unexpected_message;
          }
          commit(h.seq);
        }
        return {};
      case session_kind::predecessor: return apply_entry(s, m, detail);
      default: break;
    }
    detail = " (type " + std::to_string(static_cast<int>(h.type)) + " on a chain link)";
    return errc::unexpected_message;
  }

  // An entry (or a state transfer) from the predecessor.
  std::error_code apply_entry(session& s, message& m, std::string& detail) {
    const auto& h = m.header;
    if (h.type == message_type::state) return install_state(s, m, detail);
    if (fresh_ || !is_strict_chain ||
        (h.type != message_type::push && h.type != message_type::clock)) {
      detail = fresh_ ? " (an entry before the state transfer)" : " (not a chain entry)";
      return errc::unexpected_message;
    }
    if (h.sender >= opts_.num_workers) return errc::bad_sender;
    if (h.clock != clocks_[h.sender]) {
      detail = " (chain entry for clock " + std::to_string(h.clock) + " of worker " +
               std::to_string(h.sender) + ", which is at " + std::to_string(clocks_[h.sender]) +
               " here)";
      return errc::unexpected_message;
    }
    if (h.type == message_type::push) {
      if (auto ec = check_rows(m, detail)) return ec;
      if (h.has(frame_flags::state) || h.has(frame_flags::backlog) ||
          !all_finite(payload_floats(m)))
        return errc::non_finite_value;
      apply(m);
      has_state_ = true;
      ++applied_[h.sender][h.table];
      ++stats_.pushes;
    }
    last_seq_[h.sender] = std::max(last_seq_[h.sender], h.seq);
    append_entry(m);
    if (h.type == message_type::clock || h.has(frame_flags::end_of_clock))
      advance(h.sender, h.clock + 1);
    return {};
  }

  std::error_code install_state(session& s, message& m, std::string& detail) {
    std::string why;
    if (auto ec = detail::decode_state(m.payload.bytes(), incoming_, why)) {
      detail = why;
      return ec;
    }
    if (auto ec = restore_state(incoming_)) {
      detail = " (state transfer from the predecessor)";
      return ec;
    }
    log_index_ = m.header.seq;
    fresh_ = false;
    ++stats_.states_installed;
    if (succ_wake_ != nullptr) succ_wake_->cancel();  // it may now feed a successor
    if (stats_.states_installed == 1 || is_strict_chain)
      log("installed a state transfer at log position " + std::to_string(log_index_) +
          " (server clock " + std::to_string(server_clock_) + ")");
    if constexpr (is_strict_chain) {
      sent_.clear();
      committed_ = 0;
      if (succ_member_ == no_member) {
        commit(log_index_);
      } else if (succ_ != nullptr && succ_->synced) {
        send_state(*succ_);
      }
    } else {
      // Relaxed: pass the same copy on (no re-encoding), acknowledge to the predecessor only.
      if (succ_ != nullptr && succ_->synced) {
        message f;
        f.header = m.header;
        f.payload = m.payload.share();
        enqueue(*succ_, std::move(f), true);
      }
      enqueue(s, chain_message(message_type::ack, log_index_), true);
    }
    return {};
  }

  // The successor answered our chain_hello with its log position: bring it up to date.
  void successor_ready(session& s, std::uint64_t their_index, bool needs_state) {
    s.synced = true;
    if constexpr (!is_strict_chain) {
      send_state(s);
    } else {
      const bool gap = their_index < log_index_ && (sent_.empty() || their_index + 1 < sent_first_);
      if (needs_state || their_index > log_index_ || gap) {
        send_state(s);  // entries after it follow as they are applied
        return;
      }
      for (std::uint64_t i = their_index + 1; i <= log_index_; ++i) {
        const message& e = sent_[static_cast<std::size_t>(i - sent_first_)];
        message f;
        f.header = e.header;
        f.payload = e.payload.share();
        enqueue(s, std::move(f), true);
        ++stats_.chain_resent;
      }
    }
  }

  void send_state(session& s) {
    save_state(outgoing_);
    const std::size_t bytes = detail::encoded_state_size(outgoing_);
    if (bytes > wire_limits(transport_.limits()).max_frame_bytes) {
      // The successor would reject the frame (frame_too_large) and we would resend it forever.
      log("cannot transfer this shard's state (" + std::to_string(bytes) +
          " bytes) to its successor: above wire_limits::max_frame_bytes (" +
          std::to_string(wire_limits(transport_.limits()).max_frame_bytes) + ")");
      close_session(s);
      return;
    }
    buffer b = transport_.allocate(bytes);
    detail::encode_state(outgoing_, std::span<std::byte>(b.data(), b.size()));
    message m = chain_message(message_type::state, log_index_);
    m.header.clock = server_clock_;
    m.payload = std::move(b);
    enqueue(s, std::move(m), true);
    ++stats_.states_sent;
    since_copy_ = 0;
  }

  // A worker's push or clock the head just applied: strict, log it and ack it once the
  // tail has it; relaxed, count it toward the next state copy.
  void log_worker_entry(session& s, const message& m) {
    if constexpr (is_strict_chain) {
      append_entry(m);
      if (m.header.has(frame_flags::want_ack))
        pending_acks_.push_back(pending_ack{log_index_, s.worker, m.header.seq});
      release_acks();
    } else {
      ++log_index_;
      ++stats_.chain_entries;
      if (m.header.has(frame_flags::want_ack)) send_worker_ack(s, m.header.seq);
      if (++since_copy_ >= chain_options().replicate_every && succ_ != nullptr && succ_->synced)
        send_state(*succ_);
    }
  }

  // A push or clock resent after a failover that this server already applied.
  std::error_code duplicate(session& s, const frame_header& h) {
    ++stats_.chain_duplicates;
    if (h.has(frame_flags::want_ack)) {
      pending_acks_.push_back(pending_ack{log_index_, s.worker, h.seq});
      release_acks();
    }
    return {};
  }

  // Strict: entry `m` was applied here; it takes the next log position and goes down.
  void append_entry(const message& m) {
    ++log_index_;
    ++stats_.chain_entries;
    if (succ_member_ == no_member) {  // the tail: committed once applied
      commit(log_index_);
      return;
    }
    message f;
    f.header = m.header;
    f.payload = m.payload.share();
    if (succ_ != nullptr && succ_->synced) {
      message g;
      g.header = f.header;
      g.payload = f.payload.share();
      enqueue(*succ_, std::move(g), true);
    }
    if (sent_.empty()) sent_first_ = log_index_;
    sent_.push_back(std::move(f));
  }

  // Log positions up to `index` are applied by the tail: forget them, tell the predecessor,
  // ack the workers whose pushes they were.
  void commit(std::uint64_t index) {
    if (index <= committed_) return;
    committed_ = index;
    while (!sent_.empty() && sent_first_ <= index) {
      sent_.pop_front();
      ++sent_first_;
    }
    if (pred_ != nullptr) enqueue(*pred_, chain_message(message_type::ack, index), true);
    release_acks();
  }

  void release_acks() {
    while (!pending_acks_.empty() && pending_acks_.front().index <= committed_) {
      const auto& p = pending_acks_.front();
      if (session* ws = worker_session(p.worker)) send_worker_ack(*ws, p.seq);
      pending_acks_.pop_front();
    }
  }

  void send_worker_ack(session& s, std::uint64_t seq) {
    message a;
    a.header.type = message_type::ack;
    a.header.sender = opts_.shard;
    a.header.seq = seq;
    enqueue(s, std::move(a));
  }

  // A push that is part of stateless recovery (flags `state` or `backlog`).
  std::error_code recover_push(session& s, message& m, std::string& detail) {
    const auto& h = m.header;
    if constexpr (!accepts_replicas) {
      detail = std::string(" (replica or backlog push, but recovery policy '") +
               std::string(Recovery::name) + "' does not take them)";
      return errc::unexpected_message;
    } else {
      auto& t = tables_[h.table];
      if (h.has(frame_flags::state) == h.has(frame_flags::backlog) || !h.has(frame_flags::range) ||
          h.first_row != t.range.begin || h.row_count != t.range.size()) {
        detail = " (a replica or backlog push must cover the shard's whole range, one flag)";
        return errc::unexpected_message;
      }
      const auto vals = payload_floats(m);
      if (h.has(frame_flags::state)) {
        // The first replica of a table rebuilds it; later ones are dropped. Their senders'
        // backlogs are then merged, while the installed sender's own updates are already in it.
        if (needs_state_[h.table]) {
          std::copy(vals.begin(), vals.end(), t.values.begin());
          std::fill(t.state.begin(), t.state.end(), 0.0f);
          changed(t, t.range);
          needs_state_[h.table] = false;
          state_source_[h.table] = s.worker;
          has_state_ = true;
          ++stats_.replicas_installed;
          log("rebuilt table " + std::to_string(h.table) + " from the replica of worker " +
              std::to_string(s.worker) + " (clock " + std::to_string(h.clock) + ")");
        }
        return {};
      }
      if (state_source_[h.table] == s.worker) {
        state_source_[h.table] = no_worker;  // already part of the installed replica
        return {};
      }
      const clock_value staleness = std::max<clock_value>(server_clock_ - h.clock, 0);
      const std::uint64_t clocks = protocol::backlog_clocks(m);
      const float scale = recovery_.backlog_scale(clocks, staleness);
      // The floats follow the backlog prefix; the payload is this server's own buffer.
      Eigen::Map<Eigen::ArrayXf> g(const_cast<float*>(vals.data()),
                                   static_cast<Eigen::Index>(vals.size()));
      if (scale != 1.0f) g *= scale;
      apply(m);
      has_state_ = true;
      ++stats_.backlogs_merged;
      stats_.backlog_clocks += clocks;
      return {};
    }
  }

  // Vectorised (Eigen 3.4's allFinite is a scalar loop): g - g is 0 for finite values and
  // NaN for NaN or infinity, and NaN survives the sum.
  static bool all_finite(std::span<const float> g) noexcept {
    const Eigen::Map<const Eigen::ArrayXf> a(g.data(), static_cast<Eigen::Index>(g.size()));
    return std::isfinite((a - a).sum());
  }

  void apply(const message& m) {
    const auto& h = m.header;
    auto& t = tables_[h.table];
    const auto grad = payload_floats(m);
    const std::uint32_t w = t.spec.width;
    ++t.step;
    if (h.has(frame_flags::range)) {
      const auto first = static_cast<row_id>(h.first_row);
      apply_rows(t, std::size_t{first - t.range.begin} * w, std::size_t{h.row_count} * w,
                 grad.data());
      changed(t, key_range{first, first + h.row_count});
    } else {
      const auto keys = payload_keys(m);
      ++t.version;
      for (std::uint32_t i = 0; i < h.row_count; ++i) {
        apply_rows(t, std::size_t{keys[i] - t.range.begin} * w, w,
                   grad.data() + std::size_t{i} * w);
        t.row_version[keys[i] - t.range.begin] = t.version;
      }
    }
    if constexpr (requires(typename Recovery::server_part& p) {
                    p.on_update(h.table, h.first_row, h.row_count, grad);
                  }) {
      recovery_.on_update(h.table, h.first_row, h.row_count, grad);
    }
  }

  // Rows `r` of table `t` changed (for eager rows: see push_subscribed).
  static void changed(table_state& t, key_range r) noexcept {
    ++t.version;
    if (r == t.range) {
      t.all_changed = t.version;  // no need to stamp each row: see push_subscribed
    } else {
      std::fill_n(t.row_version.begin() + (r.begin - t.range.begin), r.size(), t.version);
    }
  }

  void apply_rows(table_state& t, std::size_t off, std::size_t n, const float* g) {
    optimizer_state<Optimizer::state_per_param> st{};
    for (std::size_t k = 0; k < Optimizer::state_per_param; ++k)
      st[k] = std::span<float>(t.state.data() + k * t.values.size() + off, n);
    optimizer_.apply(std::span<float>(t.values.data() + off, n), std::span<const float>(g, n), st,
                     t.step);
  }

  // Replies to a pull (or pushes eagerly) with the requested rows as of the server clock.
  void answer(session& s, const message& req, bool eager) {
    const auto& h = req.header;
    send_rows(s, h.table, h.has(frame_flags::range), h.first_row, h.row_count, eager,
              rows_payload(h.table, h.has(frame_flags::range), h.first_row, h.row_count,
                           payload_keys(req)));
    if (!eager) ++stats_.pulls;
    if constexpr (Consistency::eager || is_value_bounded_v<Consistency>) {
      if (!eager) subscribe(s, req);
    }
  }

  // A snapshot of rows of table `tid` (keys first when sparse), in a pooled buffer.
  buffer rows_payload(table_id tid, bool ranged, std::uint64_t first, std::uint32_t count,
                      std::span<const row_id> keys) {
    const auto& t = tables_[tid];
    const std::uint32_t w = t.spec.width;
    const std::size_t kb = ranged ? 0 : key_bytes(count);
    buffer b = transport_.allocate(kb + std::size_t{count} * w * sizeof(float));
    auto* out = reinterpret_cast<float*>(b.data() + kb);
    if (ranged) {
      std::memcpy(out,
                  t.values.data() + std::size_t{static_cast<row_id>(first) - t.range.begin} * w,
                  std::size_t{count} * w * sizeof(float));
    } else {
      if (kb != 0) {
        std::memset(b.data(), 0, kb);
        std::memcpy(b.data(), keys.data(), keys.size() * sizeof(row_id));
      }
      for (std::uint32_t i = 0; i < count; ++i)
        std::memcpy(out + std::size_t{i} * w,
                    t.values.data() + std::size_t{keys[i] - t.range.begin} * w, w * sizeof(float));
    }
    return b;
  }

  void send_rows(session& s, table_id tid, bool ranged, std::uint64_t first, std::uint32_t count,
                 bool eager, buffer payload) {
    message r;
    r.header.type = message_type::rows;
    r.header.flags = static_cast<std::uint8_t>((ranged ? frame_flags::range : 0) |
                                               (eager ? frame_flags::eager : 0));
    r.header.sender = opts_.shard;
    r.header.table = tid;
    r.header.clock = server_clock_;
    r.header.seq = s.worker == no_worker ? 0 : applied_[s.worker][tid];
    r.header.row_count = count;
    r.header.width = tables_[tid].spec.width;
    r.header.first_row = ranged ? first : 0;
    r.payload = std::move(payload);
    enqueue(s, std::move(r));
  }

  // Adds the rows of pull `req` to the reader's subscription (each row once; amortized O(1)
  // per row). Keyed rows that come to cover the whole shard become a range subscription.
  void subscribe(session& s, const message& req) {
    auto& sub = s.subs[req.header.table];
    const key_range all = tables_[req.header.table].range;
    // The reply just sent has these rows as of now; rows subscribed earlier are current as of
    // `synced` (older), so a first subscription starts at the table's current version.
    if (!sub.ranged && sub.keys.empty()) sub.synced = tables_[req.header.table].version;
    if (req.header.has(frame_flags::range)) {
      const key_range r{static_cast<row_id>(req.header.first_row),
                        static_cast<row_id>(req.header.first_row + req.header.row_count)};
      sub.range =
          sub.ranged ? key_range{std::min(sub.range.begin, r.begin), std::max(sub.range.end, r.end)}
                     : r;
      sub.ranged = true;
      std::erase_if(sub.keys, [&](row_id k) {
        if (!sub.range.contains(k)) return false;
        sub.keyed[k - all.begin] = false;
        return true;
      });
    } else {
      if (sub.keyed.empty()) sub.keyed.assign(all.size(), false);
      for (const row_id k : payload_keys(req)) {
        if ((sub.ranged && sub.range.contains(k)) || sub.keyed[k - all.begin]) continue;
        sub.keyed[k - all.begin] = true;
        sub.keys.push_back(k);
      }
      if (sub.keys.size() + (sub.ranged ? sub.range.size() : 0) == all.size()) {
        sub.ranged = true;
        sub.range = all;
        sub.keys.clear();
        std::fill(sub.keyed.begin(), sub.keyed.end(), false);
      }
    }
  }

  // Answers the pulls that the server clock now satisfies, in arrival order.
  void answer_ready_pulls() {
    std::size_t keep = 0;
    for (std::size_t i = 0; i < pending_.size(); ++i) {
      auto& p = pending_[i];
      if (server_clock_ >= p.request.header.clock && p.s->open) {
        --p.s->pending_pulls;
        answer(*p.s, p.request, false);
      } else if (p.s->open) {
        if (keep != i) pending_[keep] = std::move(p);
        ++keep;
      }
    }
    pending_.resize(keep);
  }

  void advance(std::uint32_t worker, clock_value c) {
    clocks_[worker] = c;
    const clock_value m = *std::min_element(clocks_.begin(), clocks_.end());
    if (m <= server_clock_) return;
    server_clock_ = m;
    if constexpr (requires(typename Recovery::server_part& p) { p.on_clock(m, *this); }) {
      recovery_.on_clock(m, *this);  // e.g. snapshot at this clock boundary
    } else if constexpr (requires(typename Recovery::server_part& p) { p.on_clock(m); }) {
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
    for (table_id t = 0; t < tables_.size(); ++t) {
      auto& ts = tables_[t];
      buffer whole;
      const key_range all = ts.range;
      const std::uint32_t w = ts.spec.width;
      for (auto& s : sessions_) {
        if (!s.open || s.worker == no_worker) continue;
        auto& sub = s.subs[t];
        if (!sub.ranged && sub.keys.empty()) continue;
        // Every row changed since `synced` (dense models: always) needs no scan.
        const bool all_fresh = ts.all_changed > sub.synced;
        const auto fresh = [&](row_id r) {
          return all_fresh || ts.row_version[r - all.begin] > sub.synced;
        };
        auto n = static_cast<std::uint32_t>(sub.keys.size() + (sub.ranged ? sub.range.size() : 0));
        if (!all_fresh) {
          n = 0;
          if (sub.ranged)
            for (row_id r = sub.range.begin; r < sub.range.end; ++r) n += fresh(r) ? 1 : 0;
          for (const row_id k : sub.keys) n += fresh(k) ? 1 : 0;
        }
        if (sub.ranged && sub.range == all && n == all.size()) {
          if (whole.empty()) whole = rows_payload(t, true, all.begin, all.size(), {});
          send_rows(s, t, true, all.begin, all.size(), true, whole.share());
        } else {
          const std::size_t kb = key_bytes(n);
          buffer b = transport_.allocate(kb + std::size_t{n} * w * sizeof(float));
          std::memset(b.data(), 0, kb);
          auto* keys = reinterpret_cast<row_id*>(b.data());
          auto* rows = reinterpret_cast<float*>(b.data() + kb);
          const auto add = [&](row_id r) {
            if (!fresh(r)) return;
            *keys++ = r;
            std::memcpy(rows, ts.values.data() + std::size_t{r - all.begin} * w, w * sizeof(float));
            rows += w;
          };
          if (sub.ranged)
            for (row_id r = sub.range.begin; r < sub.range.end; ++r) add(r);
          for (const row_id k : sub.keys) add(k);
          send_rows(s, t, false, 0, n, true, std::move(b));
        }
        sub.synced = ts.version;
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
      if constexpr (is_chain) watch_connect = watch_connect && head_;
      const bool any_worker = std::any_of(registered_.begin(), registered_.end(),
                                          [](const session* p) { return p != nullptr; });
      const bool watch_pulls =
          !pending_.empty() || (any_worker && stats_.deferred_pulls != deferred_seen);
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
      if (!pending_.empty()) report_blocked(every);
    }
    watchdog_idle_ = false;
    --connectors_;
    done_.cancel();
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
    const pending_pull* oldest = nullptr;
    for (const auto& p : pending_)
      if (p.s->open) {
        oldest = &p;
        break;
      }
    if (oldest == nullptr) return;
    const auto waited = clock_type::now() - oldest->since;
    if (waited < every) return;
    const auto slowest = static_cast<std::uint32_t>(
        std::min_element(clocks_.begin(), clocks_.end()) - clocks_.begin());
    const bool connected = worker_session(slowest) != nullptr;
    log("a pull of " + who(*oldest->s) + " has waited " +
        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()) +
        " ms for server clock " + std::to_string(oldest->request.header.clock) + " (server clock " +
        std::to_string(server_clock_) + "): worker " + std::to_string(slowest) +
        " holds it back at clock " + std::to_string(clocks_[slowest]) +
        (connected ? " (connected)" : " (not connected)"));
    for (auto& s : sessions_) {
      if (!s.open || s.kind != session_kind::worker || s.pending_pulls == 0) continue;
      enqueue(s, protocol::encode(protocol::report{.shard = opts_.shard,
                                                   .server_clock = server_clock_,
                                                   .slowest = slowest,
                                                   .slowest_clock = clocks_[slowest],
                                                   .slowest_connected = connected},
                                  alloc()));
    }
  }

  Transport& transport_;
  server_options opts_;
  [[no_unique_address]] Optimizer optimizer_;
  [[no_unique_address]] typename Recovery::server_part recovery_{};
  std::vector<table_state> tables_;
  std::vector<clock_value> clocks_;
  std::vector<std::vector<std::uint64_t>> applied_;  // [worker][table] pushes applied
  std::vector<session*> registered_;
  clock_value server_clock_ = 0;
  std::list<session> sessions_;
  std::vector<pending_pull> pending_;
  timer_type done_;
  timer_type watchdog_;               // the watchdog's timer (see `watchdog`)
  bool watchdog_idle_ = false;        // the watchdog sleeps until a pull is deferred
  std::vector<char> connected_once_;  // per worker: has connected at least once
  typename Transport::acceptor_type* acceptor_ = nullptr;
  bool stopped_ = false;
  server_stats stats_{};
  // Stateless recovery: whether the policy takes replicas and backlogs, whether this server
  // holds trained state (a push applied or a state restored), and per table whether it waits
  // for a replica and which worker's replica was installed.
  static constexpr bool accepts_replicas = requires(typename Recovery::server_part& p) {
    p.backlog_scale(std::uint64_t{}, clock_value{});
  };
  bool has_state_ = false;
  std::vector<char> needs_state_ = std::vector<char>(opts_.tables.size(), 0);
  std::vector<std::uint32_t> state_source_ =
      std::vector<std::uint32_t>(opts_.tables.size(), no_worker);
  // Highest push (or clock) sequence number applied per worker: chain replication drops a
  // resent push at or below it.
  std::vector<std::uint64_t> last_seq_ = std::vector<std::uint64_t>(opts_.num_workers, 0);
  // Chain replication (see the section above). Member ids index chain_.members.
  static constexpr bool is_chain = recovery::is_chain_replication_v<Recovery>;
  static constexpr bool is_strict_chain = [] {
    if constexpr (is_chain) return Recovery::mode == recovery::chain_mode::strict;
    return false;
  }();
  static constexpr std::uint32_t no_member = 0xffffffffu;
  recovery::chain_endpoints<typename Transport::endpoint_type> chain_{};
  session* master_ = nullptr;        // link to the chain master
  session* pred_ = nullptr;          // incoming link from the predecessor
  session* succ_ = nullptr;          // outgoing link to the successor
  timer_type* succ_wake_ = nullptr;  // successor_link's timer
  std::uint32_t pred_member_ = no_member;
  std::uint32_t succ_member_ = no_member;
  std::int64_t epoch_ = 0;
  bool head_ = false;         // serves workers
  bool serving_ = false;      // got a configuration since registering
  bool first_config_ = true;  // the next configuration is the first of a registration
  bool fresh_ = false;        // joined a running chain: waits for a state transfer
  bool succ_connecting_ = false;
  int connectors_ = 0;                      // master_link / successor_link coroutines running
  std::uint64_t log_index_ = 0;             // entries applied (strict) or pushes applied (relaxed)
  std::uint64_t committed_ = 0;             // entries the tail has (strict)
  std::uint64_t since_copy_ = 0;            // relaxed: pushes since the last state copy
  detail::ring<message> sent_;              // strict: entries forwarded, not yet acked by the tail
  std::uint64_t sent_first_ = 0;            // log position of sent_.front()
  detail::ring<pending_ack> pending_acks_;  // head: worker acks waiting for the tail
  shard_state incoming_{};                  // state transfer buffers (reused)
  shard_state outgoing_{};
};

/// The TCP parameter server most programs use: `basic_server` over `tcp_transport`, with no
/// recovery and plain SGD unless named. Example: `asyncps::server<consistency::ssp<3>>`.
template <consistency_policy Consistency, recovery_policy Recovery = recovery::none,
          optimizer_policy Optimizer = optimizer::sgd>
using server = basic_server<tcp_transport, Consistency, Recovery, Optimizer>;

}  // namespace asyncps
