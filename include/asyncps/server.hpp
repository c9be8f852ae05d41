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
#include <random>
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
#include <asio/steady_timer.hpp>

#include "asyncps/consistency.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/error.hpp"
#include "asyncps/optimizer.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/recovery.hpp"
#include "asyncps/recovery/none.hpp"
#include "asyncps/shard_state.hpp"
#include "asyncps/table.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

/// A log sink: receives one complete line (no trailing newline). Empty: write to stderr.
using log_function = std::function<void(std::string_view)>;

namespace detail {
inline void emit(const log_function& f, const std::string& line) {
  if (f) {
    f(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}
}  // namespace detail

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
};

/// A parameter-server shard.
///
/// Template parameters: `Transport` (models `transport`), `Consistency` (models
/// `consistency_policy`; only `Consistency::eager` matters on the server), `Recovery` (models
/// `recovery_policy`, same type as the workers'), `Optimizer` (models `optimizer_policy`).
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
        done_(transport.get_executor()) {
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
      init_table(t);
      tables_.push_back(std::move(t));
    }
    for (auto& a : applied_) a.assign(tables_.size(), 0);
  }

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
      auto& s = sessions_.emplace_back(std::move(conn), transport_.get_executor());
      s.self = std::prev(sessions_.end());
      asio::co_spawn(transport_.get_executor(), read_loop(s), asio::detached);
      asio::co_spawn(transport_.get_executor(), write_loop(s), asio::detached);
    }
    acceptor_ = nullptr;
    stop();
    while (!sessions_.empty()) {
      done_.expires_after(std::chrono::seconds(1));
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
  }

  /// The server clock: the minimum clock over all `num_workers` workers.
  clock_value clock() const noexcept { return server_clock_; }
  /// Clock of worker `w` as seen by this server. Precondition: `w < num_workers`.
  clock_value worker_clock(std::uint32_t w) const noexcept { return clocks_[w]; }
  /// This shard's rows of table `t`.
  key_range range(table_id t) const noexcept { return tables_[t].range; }
  /// This shard's values of table `t`: `range(t).size() x width` floats, row-major.
  std::span<const float> values(table_id t) const noexcept { return tables_[t].values; }
  const server_options& options() const noexcept { return opts_; }
  const server_stats& stats() const noexcept { return stats_; }
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
    }
    for (std::uint32_t w = 0; w < opts_.num_workers; ++w) {
      clocks_[w] = st.worker_clocks[w];
      std::copy_n(st.applied.begin() + w * tables_.size(), tables_.size(), applied_[w].begin());
    }
    server_clock_ = *std::min_element(clocks_.begin(), clocks_.end());
    has_state_ = true;
    answer_ready_pulls();
    return {};
  }

 private:
  struct table_state {
    table_spec spec;
    key_range range;
    std::vector<float> values;
    std::vector<float> state;  // Optimizer::state_per_param planes of values.size()
    std::uint64_t step = 0;
  };
  struct subscription {
    bool ranged = false;
    key_range range{};
    std::vector<row_id> keys;
  };
  struct session {
    session(typename Transport::connection_type c, const typename Transport::executor_type& ex)
        : conn(std::move(c)), wake(ex, asio::steady_timer::time_point::max()) {}
    typename Transport::connection_type conn;
    asio::steady_timer wake;
    typename std::list<session>::iterator self;
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
    detail::emit(opts_.log, "asyncps server " + std::to_string(opts_.shard) + ": " + line);
  }

  std::string who(const session& s) const {
    return s.worker == no_worker ? std::string("unidentified peer")
                                 : "worker " + std::to_string(s.worker);
  }

  void enqueue(session& s, message m) {
    if (!s.open) return;
    if (s.outbox.size() + s.sending.size() >= opts_.max_queued_messages ||
        s.queued_bytes + m.payload.size() > opts_.max_queued_bytes) {
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
    ++stats_.rejected;
    const std::string reason = ec.message() + detail;
    log("closing connection of " + who(s) + ": " + reason);
    message m;
    m.header.type = message_type::error;
    m.header.sender = opts_.shard;
    m.payload = transport_.allocate(reason.size());
    std::memcpy(m.payload.data(), reason.data(), reason.size());
    enqueue(s, std::move(m));
    s.open = false;  // the write loop flushes the error, then closes
    s.wake.cancel();
  }

  void finish(session& s) {
    if (--s.running > 0) return;
    if (s.worker != no_worker && worker_session(s.worker) == &s) registered_[s.worker] = nullptr;
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
    bool greeted = false;
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
      std::error_code err = greeted ? dispatch(s, m, detail) : greet(s, m, detail);
      if (err) {
        reject(s, err, detail);
        break;
      }
      greeted = true;
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
    if (h.type != message_type::hello) {
      detail = " (expected hello first)";
      return errc::unexpected_message;
    }
    if (h.table != policy_fingerprint<Consistency, Recovery>()) {
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
    if (!layout_matches(m)) return errc::layout_mismatch;
    if (registered_.empty()) registered_.assign(opts_.num_workers, nullptr);
    if (registered_[h.sender] != nullptr) {
      detail = " (worker " + std::to_string(h.sender) + ")";
      return errc::duplicate_worker;
    }
    registered_[h.sender] = &s;
    s.worker = h.sender;
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
    message w;
    w.header.type = message_type::welcome;
    w.header.flags = ask_state ? frame_flags::state : std::uint8_t{0};
    w.header.sender = opts_.shard;
    w.header.table = opts_.num_shards;
    w.header.clock = server_clock_;
    w.header.first_row = static_cast<std::uint64_t>(std::max(clocks_[s.worker], h.clock));
    w.header.row_count = static_cast<std::uint32_t>(tables_.size());
    w.payload = encode_welcome(s.worker);
    enqueue(s, std::move(w));
    if (h.clock > clocks_[s.worker]) {
      // The worker kept training while this shard was away (a restart from a checkpoint, or
      // without state): its updates of the clocks in between are lost here, so its clock at
      // this shard moves up to its own.
      log("worker " + std::to_string(s.worker) + " rejoins at clock " + std::to_string(h.clock) +
          " (this shard had it at " + std::to_string(clocks_[s.worker]) + ")");
      ++stats_.rejoins;
      advance(s.worker, h.clock);
    }
    return {};
  }

  // Welcome payload: per table (rows u32, width u32, pushes of `worker` applied u64).
  buffer encode_welcome(std::uint32_t worker) {
    buffer b = transport_.allocate(tables_.size() * 16);
    std::byte* p = b.data();
    for (std::size_t i = 0; i < tables_.size(); ++i) {
      detail::store_le(p, tables_[i].spec.rows);
      detail::store_le(p + 4, tables_[i].spec.width);
      detail::store_le(p + 8, applied_[worker][i]);
      p += 16;
    }
    return b;
  }

  bool layout_matches(const message& m) const {
    if (m.header.row_count != tables_.size()) return false;
    const auto* p = reinterpret_cast<const std::uint32_t*>(m.payload.data());
    for (const auto& t : tables_) {
      if (p[0] != t.spec.rows || p[1] != t.spec.width) return false;
      p += 2;
    }
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
        if (h.clock != clocks_[s.worker]) {
          detail = " (push for clock " + std::to_string(h.clock) + ", worker is at clock " +
                   std::to_string(clocks_[s.worker]) + ")";
          return errc::unexpected_message;
        }
        apply(m);
        has_state_ = true;
        ++applied_[s.worker][h.table];
        ++stats_.pushes;
        if (h.has(frame_flags::want_ack)) {
          message a;
          a.header.type = message_type::ack;
          a.header.sender = opts_.shard;
          a.header.table = h.table;
          a.header.seq = h.seq;
          enqueue(s, std::move(a));
        }
        if (h.has(frame_flags::end_of_clock)) advance(s.worker, h.clock + 1);
        return {};
      }
      case message_type::clock:
        if (h.sender != s.worker) return errc::bad_sender;
        if (h.clock != clocks_[s.worker]) {
          detail = " (clock " + std::to_string(h.clock) + ", worker is at clock " +
                   std::to_string(clocks_[s.worker]) + ")";
          return errc::unexpected_message;
        }
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
          pending_.push_back(pending_pull{&s, std::move(m)});
        }
        return {};
      }
      case message_type::heartbeat: return {};
      case message_type::bye: close_after_flush(s); return {};
      case message_type::error: {
        const std::string_view reason(reinterpret_cast<const char*>(m.payload.data()),
                                      m.payload.size());
        log(who(s) + " reported an error: " + std::string(reason));
        close_after_flush(s);
        return {};
      }
      default:
        detail = " (type " + std::to_string(static_cast<int>(h.type)) + " from a worker)";
        return errc::unexpected_message;
    }
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
      const float scale = recovery_.backlog_scale(h.seq, staleness);
      Eigen::Map<Eigen::ArrayXf> g(reinterpret_cast<float*>(m.payload.data()),
                                   static_cast<Eigen::Index>(vals.size()));
      if (scale != 1.0f) g *= scale;
      apply(m);
      has_state_ = true;
      ++stats_.backlogs_merged;
      stats_.backlog_clocks += h.seq;
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
      const std::size_t off = std::size_t{static_cast<row_id>(h.first_row) - t.range.begin} * w;
      apply_rows(t, off, std::size_t{h.row_count} * w, grad.data());
    } else {
      const auto keys = payload_keys(m);
      for (std::uint32_t i = 0; i < h.row_count; ++i)
        apply_rows(t, std::size_t{keys[i] - t.range.begin} * w, w,
                   grad.data() + std::size_t{i} * w);
    }
    if constexpr (requires(typename Recovery::server_part& p) {
                    p.on_update(h.table, h.first_row, h.row_count, grad);
                  }) {
      recovery_.on_update(h.table, h.first_row, h.row_count, grad);
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
    if constexpr (Consistency::eager) {
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

  void subscribe(session& s, const message& req) {
    auto& sub = s.subs[req.header.table];
    if (req.header.has(frame_flags::range)) {
      const key_range r{static_cast<row_id>(req.header.first_row),
                        static_cast<row_id>(req.header.first_row + req.header.row_count)};
      sub.range =
          sub.ranged ? key_range{std::min(sub.range.begin, r.begin), std::max(sub.range.end, r.end)}
                     : r;
      sub.ranged = true;
    } else {
      const auto keys = payload_keys(req);
      sub.keys.insert(sub.keys.end(), keys.begin(), keys.end());
      std::sort(sub.keys.begin(), sub.keys.end());
      sub.keys.erase(std::unique(sub.keys.begin(), sub.keys.end()), sub.keys.end());
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
    if constexpr (Consistency::eager) {
      // Workers of a dense model all subscribe to the whole shard of a table: snapshot it
      // once per table and share that buffer between their messages.
      for (table_id t = 0; t < tables_.size(); ++t) {
        buffer whole;
        const key_range all = tables_[t].range;
        for (auto& s : sessions_) {
          if (!s.open || s.worker == no_worker) continue;
          const auto& sub = s.subs[t];
          if (sub.ranged) {
            buffer payload;
            if (sub.range == all) {
              if (whole.empty()) whole = rows_payload(t, true, all.begin, all.size(), {});
              payload = whole.share();
            } else {
              payload = rows_payload(t, true, sub.range.begin, sub.range.size(), {});
            }
            send_rows(s, t, true, sub.range.begin, sub.range.size(), true, std::move(payload));
            ++stats_.eager_messages;
          }
          if (!sub.keys.empty()) {
            const auto n = static_cast<std::uint32_t>(sub.keys.size());
            send_rows(s, t, false, 0, n, true, rows_payload(t, false, 0, n, sub.keys));
            ++stats_.eager_messages;
          }
        }
      }
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
  asio::steady_timer done_;
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
};

}  // namespace asyncps
