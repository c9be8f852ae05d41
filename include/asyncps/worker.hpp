// asyncps — basic_worker: the pull -> gradient -> push -> clock loop of one worker.
//
// A worker connects to every shard, keeps a local cache of all tables stamped with the server
// clock each part reflects (each row, for a model with sparse reads), and per clock: asks its
// consistency policy whether each cached part (or the rows the model will read) may be read
// (pulling or waiting when not), snapshots the cache, computes the gradient
// straight into a pooled buffer (on the compute executor, so I/O continues meanwhile), applies
// it to its own cache (read-my-writes), and pushes each shard's slice of that same buffer
// without copying it, the last push of a shard marking the end of the clock.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <asio/any_io_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/use_awaitable.hpp>

#include "asyncps/consistency.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/ring.hpp"
#include "asyncps/detail/text.hpp"
#include "asyncps/detail/transport_time.hpp"
#include "asyncps/error.hpp"
#include "asyncps/log.hpp"
#include "asyncps/model.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery.hpp"
#include "asyncps/recovery/none.hpp"
#include "asyncps/server.hpp"
#include "asyncps/staleness.hpp"
#include "asyncps/table.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/transport/tcp.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

/// What a worker reports after each clock (see `worker_options::on_clock`).
struct clock_report {
  std::uint32_t worker = 0;  ///< worker id
  clock_value clock = 0;     ///< the clock just completed
  float loss = 0;            ///< the minibatch loss `compute_gradient` returned
  parameter_view params;     ///< the snapshot the gradient was computed on (valid during the call)
};

/// Whether `worker_options::check_gradients` is on by default: in builds without `NDEBUG`.
#ifdef NDEBUG
inline constexpr bool default_check_gradients = false;
#else
inline constexpr bool default_check_gradients = true;
#endif

/// The bit pattern `worker_options::check_gradients` fills gradient buffers with: a quiet NaN
/// with a payload a computation does not produce (arithmetic on NaN yields 0x7fc00000).
inline constexpr std::uint32_t unwritten_gradient_bits = 0x7fc5a5a5u;

/// Configuration of one worker.
template <class Endpoint>
struct worker_options {
  std::uint32_t id = 0;             ///< worker id, < the servers' num_workers
  std::vector<Endpoint> servers{};  ///< shard s listens at servers[s]
  /// Chain replication: replicas[s] are shard s's other servers (empty or absent: none).
  /// When servers[s] refuses this worker (`errc::not_head`) or is lost, the worker tries
  /// them in turn, then servers[s] again, until one accepts it.
  std::vector<std::vector<Endpoint>> replicas{};
  /// Learning rate used to apply the worker's own gradient to its cache (read-my-writes,
  /// as Bösen's oplog does). Unset (the default): each server's welcome sends its optimizer's
  /// `local_step()` and the worker uses that (exact for SGD; 0, i.e. off, for AdaGrad/Adam).
  /// A value overrides it; <= 0 disables it (own writes then become visible only through the
  /// server). Also the `lr` of VAP's update magnitude (1 when disabled).
  std::optional<float> local_step{};
  /// Debug aid: before each `compute_gradient` fill the gradient buffer with a NaN bit
  /// pattern, and after it fail the run with `errc::bad_gradient` if a value is still that
  /// pattern (left unwritten) or is NaN/infinity (computed), logging its table, row and
  /// column. Every value must be written, also by sparse models (the worker reads the whole
  /// buffer: dense pushes, read-my-writes, backlogs). Costs two passes over the buffer per
  /// clock. Default: on without `NDEBUG`, off with it.
  bool check_gradients = default_check_gradients;
  /// Longest wait for rows (or for a connection at start) before failing with `errc::timeout`.
  std::chrono::milliseconds wait_timeout{std::chrono::seconds(60)};
  /// How long to keep retrying the first connection to a server (servers may start later).
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(10)};
  /// Acknowledged pushes (chain replication, strict): unacknowledged pushes per server
  /// beyond which the worker waits for acks before its next clock (flow control: bounds its
  /// memory and how far the head runs ahead of the tail).
  std::uint32_t max_unacked = 64;
  /// Called on the worker's executor after each clock (evaluation, progress). May be empty.
  std::function<void(const clock_report&)> on_clock{};
  log_function log{};  ///< connection events; empty: stderr
};

/// Counters of a worker (read on its executor).
struct worker_stats {
  std::uint64_t clocks = 0;          ///< clocks completed
  std::uint64_t pushes = 0;          ///< push messages sent
  std::uint64_t pulls = 0;           ///< pull requests sent
  std::uint64_t sparse_pulls = 0;    ///< of which keyed (single rows, `sparse_read_source`)
  std::uint64_t rows_messages = 0;   ///< rows messages received (replies and eager pushes)
  std::uint64_t eager_messages = 0;  ///< of which pushed by the server unrequested
  std::uint64_t bytes_out = 0;       ///< payload bytes sent
  std::uint64_t bytes_in = 0;        ///< payload bytes received
  double wait_seconds = 0;           ///< time blocked waiting for fresh rows (or a server)
  double compute_seconds = 0;        ///< time in `compute_gradient`
  std::uint64_t reconnects = 0;      ///< connections re-established after a server was lost
  /// Pushes a server no longer had when this worker reconnected (lost by a restore).
  std::uint64_t lost_pushes = 0;
  std::uint64_t local_clocks = 0;   ///< (shard, clock) pairs computed with a shard unreachable
  std::uint64_t backlogs_sent = 0;  ///< backlog pushes sent after reconnecting
  std::uint64_t replicas_sent = 0;  ///< replica pushes sent to a server that lost its state
  /// VAP: clocks whose push waited for earlier updates to become visible, and how long.
  std::uint64_t value_waits = 0;
  double value_wait_seconds = 0;  ///< included in `wait_seconds`
};

/// One worker.
///
/// Template parameters: `Model` (models `model`), `Transport` (models `transport`),
/// `Consistency` (models `consistency_policy`, same as the servers'), `Recovery` (models
/// `recovery_policy`, same as the servers').
///
/// Thread safety: call every member on `transport.get_executor()` (a strand or a
/// single-threaded context). `compute_gradient` runs on `compute` when given (e.g. a
/// `asio::thread_pool`'s executor) so communication overlaps it; otherwise inline.
/// Object lifetime: transport and model outlive the worker; `async_run` must have completed
/// before the worker is destroyed.
template <checked_model Model, transport Transport, consistency_policy Consistency,
          recovery_policy Recovery = recovery::none>
class basic_worker {
 public:
  using model_type = Model;
  using transport_type = Transport;
  using consistency_type = Consistency;
  using recovery_type = Recovery;
  using options_type = worker_options<typename Transport::endpoint_type>;

  /// Throws `std::invalid_argument` when `opts.servers` is empty. `recovery` is the worker
  /// part of the recovery policy (default-constructed when omitted).
  basic_worker(Transport& transport, Model& model, options_type opts,
               std::optional<asio::any_io_executor> compute = std::nullopt,
               typename Recovery::worker_part recovery = {})
      : transport_(transport), model_(model), opts_(std::move(opts)), compute_(std::move(compute)),
        wake_(transport.get_executor()), recovery_(std::move(recovery)) {
    if (opts_.servers.empty())
      throw std::invalid_argument("asyncps::worker_options: servers must not be empty");
    const std::span<const table_spec> layout = model_.tables();
    tables_.assign(layout.begin(), layout.end());
    const std::size_t n = layout_size(tables_);
    cache_.assign(n, 0.0f);
    snapshot_.assign(n, 0.0f);
    std::size_t off = 0;
    for (const auto& t : tables_) {
      offsets_.push_back(off);
      off += t.size();
    }
    const auto shards = static_cast<std::uint32_t>(opts_.servers.size());
    links_.reserve(shards);
    for (std::uint32_t s = 0; s < shards; ++s) {
      link& l = links_.emplace_back();
      l.shard = s;
      for (const auto& t : tables_) {
        part p;
        p.range = shard_range(t.rows, s, shards);
        if constexpr (sparse_reads) p.row_clock.assign(p.range.size(), no_clock);
        l.parts.push_back(std::move(p));
      }
    }
  }

  basic_worker(const basic_worker&) = delete;
  basic_worker& operator=(const basic_worker&) = delete;

  /// Runs `clocks` iterations of pull -> gradient -> push -> clock, then closes its
  /// connections. Completes with success, or: the code of a server's refusal (its error
  /// frame's `seq`, the reason logged verbatim): `errc::bad_sender` (id >= num_workers),
  /// `errc::duplicate_worker`, `errc::policy_mismatch`, `errc::layout_mismatch` (the log
  /// names each differing table, both sides' rows x width), `errc::non_finite_value` (a NaN
  /// or infinite push refused mid-run), ...; `errc::server_lost` (a connection failed and the
  /// recovery policy gave up), `errc::timeout` (no fresh rows, or no ack of pending pushes,
  /// within `wait_timeout`; the log names the clock waited for, the shard, its server clock
  /// and the slowest worker when the server reported it), `errc::bad_gradient`
  /// (`check_gradients`), `errc::unexpected_message` (a malformed handshake reply),
  /// `errc::not_head` (chain replication: no server of a shard accepted it within
  /// `connect_timeout`), or a connect error (the log names the endpoint). Precondition: runs
  /// on `transport.get_executor()`.
  asio::awaitable<std::error_code> async_run(std::uint64_t clocks) {
    std::error_code ec = co_await connect_all();
    // The whole clock loop lives in this one coroutine frame: calling a coroutine per clock
    // would allocate a frame per clock (too large for Asio's frame recycling).
    for (std::uint64_t k = 0; !ec && k < clocks; ++k) {
      const clock_value c = clock_;
      const clock_value need = policy_.min_server_clock(c);
      // 1. Consistency: decide per cached part (per row the model will read, for sparse
      //    reads); pull where needed.
      co_await join_links();
      if constexpr (sparse_reads) select_rows();
      for (auto& l : links_) {
        for (table_id t = 0; t < l.parts.size() && l.up; ++t) {
          if (auto m = decide_read(l, t, c, need)) {
            if (auto sec = co_await l.conn.async_send(std::move(*m))) fail(l, sec, "");
          }
        }
      }
      // 2. Wait until every part is fresh enough (parts of a shard that is down are read from
      //    the cache when the recovery policy continues locally).
      const auto wait_start = clock_type::now();
      auto timeout_start = wait_start;
      while (!(ec = check_links()) && (!ready(need) || unacked_full())) {
        // While a server is being reconnected its own timeout applies, not wait_timeout.
        if (!all_up()) timeout_start = clock_type::now();
        if (clock_type::now() - timeout_start > opts_.wait_timeout) {
          log("no fresh rows for clock " + std::to_string(c) + " within the wait timeout (" +
              std::to_string(opts_.wait_timeout.count()) + " ms): " + blocked_by(need));
          ec = errc::timeout;
          break;
        }
        wake_.expires_after(all_up() ? opts_.wait_timeout : std::chrono::milliseconds(100));
        co_await wake_.async_wait(detail::use_tuple);
        // A link that came back while waiting (or lost its outstanding pull) needs a pull.
        co_await join_links();
        for (auto& l : links_) {
          for (table_id t = 0; t < l.parts.size() && l.up; ++t) {
            if (auto m = decide_read(l, t, c, need, true)) {
              if (auto sec = co_await l.conn.async_send(std::move(*m))) fail(l, sec, "");
            }
          }
        }
      }
      if (ec) break;
      const auto computed = clock_type::now();
      stats_.wait_seconds += std::chrono::duration<double>(computed - wait_start).count();
      record_staleness(c);
      // 3. Snapshot and compute the gradient straight into a pooled buffer.
      std::memcpy(snapshot_.data(), cache_.data(), cache_.size() * sizeof(float));
      buffer grad = transport_.allocate(cache_.size() * sizeof(float));
      const parameter_view params(tables_, snapshot_.data());
      gradient_view gview(tables_, reinterpret_cast<float*>(grad.data()));
      if (opts_.check_gradients) fill_unwritten(grad);
      float loss = 0;
      if constexpr (async_gradient_source<Model>) {
        loss = co_await model_.async_compute_gradient(params, gview);
      } else {
        if (compute_) {
          loss = co_await asio::co_spawn(
              *compute_,
              [&]() -> asio::awaitable<float> { co_return model_.compute_gradient(params, gview); },
              asio::use_awaitable);
        } else {
          loss = model_.compute_gradient(params, gview);
        }
      }
      stats_.compute_seconds += std::chrono::duration<double>(clock_type::now() - computed).count();
      if (opts_.check_gradients && (ec = check_gradient(grad))) break;
      // 4. VAP: wait until this update fits under the bound on in-transit magnitude.
      //    (Inline, not a coroutine call: that would allocate a frame per clock.)
      if constexpr (value_bounded) {
        const float added = set_magnitudes(grad);
        const float bound = policy_.threshold(c);
        const auto vstart = clock_type::now();
        bool waited = false;
        while (!(ec = check_links()) && in_transit_magnitude() > 0 &&
               in_transit_magnitude() + added > bound) {
          if (clock_type::now() - vstart > opts_.wait_timeout) {
            log("updates before clock " + std::to_string(c) +
                " not visible within the wait timeout");
            ec = errc::timeout;
            break;
          }
          waited = true;
          wake_.expires_after(all_up() ? opts_.wait_timeout : std::chrono::milliseconds(100));
          co_await wake_.async_wait(detail::use_tuple);
        }
        if (ec) break;
        if (waited) {
          const double secs = std::chrono::duration<double>(clock_type::now() - vstart).count();
          ++stats_.value_waits;
          stats_.value_wait_seconds += secs;
          stats_.wait_seconds += secs;
        }
      }
      // 5. Push each shard's slice of the buffer (no copy); the last push ends the clock.
      //    A shard that is down gets the slice added to its backlog instead (stateless).
      //    A link that failed during the computation gets its recovery action first.
      if ((ec = check_links())) break;
      for (auto& l : links_) {
        if (!l.up) {
          if (l.action == recovery_action::continue_local) keep_local(l, grad);
          continue;
        }
        for (table_id t = 0; t <= l.parts.size() && l.up; ++t) {
          if (auto m = make_push(l, t, c, grad)) {
            if (auto sec = co_await l.conn.async_send(std::move(*m))) fail(l, sec, "");
          }
        }
      }
      ++clock_;
      ++stats_.clocks;
      if (opts_.on_clock) opts_.on_clock(clock_report{opts_.id, c, loss, params});
    }
    // Before leaving, deliver what was trained while a shard was down (stateless), and wait
    // for the acks of acknowledged pushes (resending them after a failover), within the
    // policy's reconnect timeout.
    // While every link is up, waiting for acks is bounded by wait_timeout.
    auto ack_wait_start = clock_type::now();
    while (!ec && (has_backlog() || has_unacked())) {
      if ((ec = check_links())) break;
      co_await join_links();
      if (!has_backlog() && !has_unacked()) break;
      if (!all_up()) ack_wait_start = clock_type::now();
      if (clock_type::now() - ack_wait_start > opts_.wait_timeout) {
        log("pushes still unacknowledged after the wait timeout");
        ec = errc::timeout;
        break;
      }
      wake_.expires_after(std::chrono::milliseconds(50));
      co_await wake_.async_wait(detail::use_tuple);
    }
    co_await shutdown();
    co_return ec;
  }

  /// The worker's current clock.
  clock_value clock() const noexcept { return clock_; }
  /// The consistency policy object, for policies configured at run time (e.g.
  /// `consistency::vap::magnitude`). Set it before `async_run`; on the worker's executor.
  Consistency& consistency() noexcept { return policy_; }
  const Consistency& consistency() const noexcept { return policy_; }
  /// Observed staleness of every read so far (one sample per cached part per clock).
  const staleness_histogram& staleness() const noexcept { return staleness_; }
  const worker_stats& stats() const noexcept { return stats_; }
  /// The local cache of all tables (table-major, see parameter_view).
  parameter_view cache() const noexcept { return {tables_, cache_.data()}; }
  const options_type& options() const noexcept { return opts_; }

 private:
  // The transport's timer and clock (asio::steady_timer and std::chrono::steady_clock unless
  // it declares its own, e.g. a simulated transport's virtual time).
  using timer_type = detail::transport_timer_t<Transport>;
  using clock_type = detail::transport_clock_t<Transport>;

  struct unapplied {
    std::uint64_t index;  // per-part push index (1-based)
    buffer grad;          // this part's slice of the gradient
  };
  struct in_transit_update {
    std::uint64_t seq = 0;
    float magnitude = 0;
  };
  struct part {
    key_range range;
    bool have = false;             // every row of the part is cached
    clock_value clock = no_clock;  // server clock of the cached rows (sparse reads: of the
                                   // rows read at the last clock)
    bool pulling = false;          // a pull is outstanding
    std::uint64_t pushed = 0;      // pushes of this part the server counts (its applied + sent)
    std::vector<unapplied> local;  // own pushes not yet reflected in `have` rows
    // Stateless recovery: gradients summed over the clocks the shard was unreachable (one
    // buffer, so memory stays bounded however long the outage), how many, and the server
    // clock of the rows the first of them was computed on.
    std::vector<float> backlog;
    std::uint64_t backlog_clocks = 0;
    clock_value backlog_since = 0;
    // Sparse reads: the server clock of each cached row (no_clock: not cached), how many rows
    // are cached, and the rows of this part the model reads at this clock (a subrange of the
    // model's `rows_to_read`, valid until its next compute_gradient).
    std::vector<clock_value> row_clock;
    std::uint32_t rows_cached = 0;
    std::span<const row_id> want;
  };
  struct link {
    std::uint32_t shard = 0;
    std::uint32_t endpoint = 0;  // 0: servers[shard]; i > 0: replicas[shard][i - 1]
    // Pushes (and clocks) sent but not acknowledged yet, oldest first; resent after a
    // failover (recovery policies with acknowledged pushes). Payloads are shared, not copied.
    detail::ring<message> unacked;
    typename Transport::connection_type conn;
    bool up = false;
    bool reading = false;
    bool reconnecting = false;
    bool joining = false;  // reconnected and greeted; the clock loop finishes the rejoin
    clock_value hello_clock = 0;
    bool gave_up = false;
    bool state_wanted = false;  // the server's welcome asked for replicas
    recovery_action action = recovery_action::fail;
    std::error_code failure;
    std::string reason;
    std::uint64_t seq = 0;
    std::vector<part> parts;
    // VAP: this worker's clocks the server has not acknowledged as visible yet (seq of the
    // clock's last push, magnitude of its update to this shard), and the magnitude of the
    // clock being pushed now.
    detail::ring<in_transit_update> in_transit;
    float magnitude = 0;
    // Read-my-writes step in use for this shard (worker_options::local_step, else the one
    // its welcome sent); 0: off.
    float step = 0;
    bool refused = false;  // `failure` is the code of the server's refusal (reported as is)
    // The server's last heartbeat report (see heartbeat_report): its clock, and the slowest
    // worker's id, clock and whether it is connected.
    bool reported = false;
    clock_value report_clock = 0;
    std::uint32_t slowest = 0;
    clock_value slowest_clock = 0;
    bool slowest_connected = false;
  };

  void log(const std::string& line) const {
    detail::emit(opts_.log, "asyncps worker " + std::to_string(opts_.id) + ": " + line);
  }

  // Whether pushes ask for an ack and are kept until acked (chain replication, strict).
  static constexpr bool acknowledged = [] {
    if constexpr (requires { Recovery::worker_part::acknowledged_pushes; })
      return Recovery::worker_part::acknowledged_pushes;
    return false;
  }();
  static constexpr bool value_bounded = is_value_bounded_v<Consistency>;
  static constexpr bool sparse_reads = sparse_read_source<Model>;

  const typename Transport::endpoint_type& endpoint_of(const link& l) const {
    return l.endpoint == 0 ? opts_.servers[l.shard] : opts_.replicas[l.shard][l.endpoint - 1];
  }
  // Moves `l` on to the shard's next server (chain replication failover).
  void next_endpoint(link& l) const {
    const std::size_t n = l.shard < opts_.replicas.size() ? opts_.replicas[l.shard].size() : 0;
    l.endpoint = n == 0 ? 0 : static_cast<std::uint32_t>((l.endpoint + 1) % (n + 1));
  }

  asio::awaitable<std::error_code> connect_all() {
    for (auto& l : links_) {
      const auto deadline = clock_type::now() + opts_.connect_timeout;
      std::chrono::milliseconds backoff{20};
      bool logged = false;
      for (;;) {
        auto [ec, conn] = co_await transport_.async_connect(endpoint_of(l));
        if (!ec) {
          l.conn = std::move(conn);
          ec = co_await handshake(l);
          if (!ec) break;
          if (ec != errc::not_head) co_return ec;
        }
        const auto now = clock_type::now();
        if (now >= deadline) {
          log("cannot connect to " + server_name(l) + ": " + ec.message());
          co_return ec;
        }
        if (!logged && ec != errc::not_head) {  // say so now, not after connect_timeout
          logged = true;
          log("cannot connect to " + server_name(l) + " (" + ec.message() + "); retrying for " +
              duration_string(opts_.connect_timeout));
        }
        next_endpoint(l);
        if (l.endpoint != 0) continue;  // try the shard's other servers before backing off
        // The last wait is cut to the deadline, so the worker tries until the timeout ends.
        wake_.expires_after(std::min<typename clock_type::duration>(backoff, deadline - now));
        co_await wake_.async_wait(detail::use_tuple);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
      }
      l.up = true;
    }
    for (auto& l : links_) {
      l.reading = true;
      asio::co_spawn(transport_.get_executor(), read_loop(l), asio::detached);
    }
    co_return std::error_code{};
  }

  asio::awaitable<std::error_code> handshake(link& l) {
    protocol::hello hello{.worker = opts_.id,
                          .clock = 0,
                          .fingerprint = policy_fingerprint<Consistency, Recovery>(),
                          .layout = {}};
    // Acknowledged pushes: the server has every push before the oldest unacked one, so the
    // worker rejoins at that push's clock and resends from there.
    const clock_value hello_clock =
        acknowledged && !l.unacked.empty() ? l.unacked.front().header.clock : clock_;
    hello.clock = hello_clock;
    hello.layout.reserve(tables_.size());
    for (const auto& t : tables_) hello.layout.push_back({t.rows, t.width});
    const auto alloc = [this](std::size_t n) { return transport_.allocate(n); };
    if (auto ec = co_await l.conn.async_send(protocol::encode(hello, alloc))) co_return ec;
    auto [ec, m] = co_await l.conn.async_receive();
    if (ec) co_return ec;
    std::string why;
    if (m.header.type == message_type::error) {
      protocol::error e;
      const bool decoded = !protocol::decode(m, e, why);
      l.conn.close();
      if (decoded && e.code == errc::not_head) co_return errc::not_head;  // chain: try the next
      log(server_name(l) + " refused the connection: " +
          (decoded ? std::string(e.reason) : "(malformed error" + why + ")"));
      co_return decoded&& e.code ? make_error_code(*e.code)
                                 : make_error_code(errc::unexpected_message);
    }
    protocol::welcome welcome;
    if (protocol::decode(m, welcome, why) || welcome.shard != l.shard ||
        welcome.num_shards != links_.size() || welcome.tables.size() != tables_.size() ||
        welcome.worker_clock < 0) {
      log(server_name(l) + " sent an unexpected handshake reply" + why);
      l.conn.close();
      co_return errc::unexpected_message;
    }
    const float server_step = welcome.local_step;
    if (!std::isfinite(server_step)) {
      log(server_name(l) + " sent a non-finite local step in its welcome");
      l.conn.close();
      co_return errc::unexpected_message;
    }
    l.step = opts_.local_step.value_or(server_step);
    if (!(l.step > 0)) l.step = 0;
    clock_ = std::max(clock_, welcome.worker_clock);
    // Realign the push counts with what the server has applied: pushes it does not have
    // (sent to a server that was then restored from an older state) are lost.
    for (table_id t = 0; t < tables_.size(); ++t) {
      auto& p = l.parts[t];
      const auto applied = welcome.tables[t].applied;
      // (Under continue_local the server is rebuilt from replicas and backlogs instead.)
      // With acknowledged pushes the unacked ones are resent (join_links) and the server drops
      // those it has, so it ends up with all `pushed` of them: nothing is lost or recounted.
      if constexpr (acknowledged) {
        (void)applied;
      } else {
        if constexpr (std::is_same_v<Recovery, recovery::none>) {
          if (applied < p.pushed) {  // the server came back without this worker's pushes
            log("server " + std::to_string(l.shard) + " came back without " +
                std::to_string(p.pushed - applied) +
                " of this worker's pushes; recovery policy 'none' gives up");
            l.conn.close();
            co_return errc::server_lost;
          }
        }
        if (applied < p.pushed && l.action != recovery_action::continue_local)
          stats_.lost_pushes += p.pushed - applied;
        if (applied < p.pushed && l.action == recovery_action::continue_local &&
            !welcome.wants_state) {
          // The server kept its state but not these pushes (they were in flight when the
          // link dropped): their gradients (kept for read-my-writes) join the backlog, so
          // they are applied once. (A server without state is rebuilt from replicas instead.)
          for (const auto& u : p.local)
            if (u.index > applied) add_to_backlog(p, u.grad.floats());
        }
        p.pushed = applied;
      }
      p.local.clear();
      p.pulling = false;
    }
    l.state_wanted = welcome.wants_state;
    l.hello_clock = hello_clock;
    co_return std::error_code{};
  }

  asio::awaitable<void> read_loop(link& l) {
    while (l.up) {
      auto [ec, m] = co_await l.conn.async_receive();
      if (ec) {
        fail(l, ec, "");
        break;
      }
      stats_.bytes_in += m.payload.size();
      if (auto err = on_message(l, m)) {
        fail(l, err, "");
        break;
      }
    }
    l.reading = false;
    wake_.cancel();
  }

  void fail(link& l, std::error_code ec, std::string reason) {
    if (!l.up) return;
    l.up = false;
    l.failure = ec;
    l.reason = std::move(reason);
    l.conn.close();
    // VAP: what the lost server had not acknowledged is lost with it or travels through the
    // recovery policy; it no longer counts as in transit.
    while (!l.in_transit.empty()) l.in_transit.pop_front();
    wake_.cancel();
  }

  std::error_code on_message(link& l, message& m) {
    const auto& h = m.header;
    switch (h.type) {
      case message_type::rows: {
        if (h.table >= tables_.size()) return errc::bad_table;
        auto& p = l.parts[h.table];
        const auto& t = tables_[h.table];
        if (h.width != t.width) return errc::bad_width;
        ++stats_.rows_messages;
        if (h.has(frame_flags::eager)) ++stats_.eager_messages;
        float* base = cache_.data() + offsets_[h.table];
        const auto vals = payload_floats(m);
        const bool ranged = h.has(frame_flags::range);
        const auto keys = payload_keys(m);
        if (ranged) {
          if (h.first_row < p.range.begin || h.first_row > p.range.end ||
              h.row_count > p.range.end - h.first_row)
            return errc::bad_row_range;
          std::memcpy(base + h.first_row * t.width, vals.data(), vals.size_bytes());
        } else {
          for (std::uint32_t i = 0; i < h.row_count; ++i) {
            if (!p.range.contains(keys[i])) return errc::bad_row_range;
            std::memcpy(base + std::size_t{keys[i]} * t.width,
                        vals.data() + std::size_t{i} * t.width, t.width * sizeof(float));
          }
        }
        // Own pushes the server had not applied when it sent these rows: re-apply them to the
        // rows just overwritten (every other cached row still has them).
        std::erase_if(p.local, [&](const unapplied& u) { return u.index <= h.seq; });
        if (l.step > 0) {
          for (const auto& u : p.local) {
            const auto g = u.grad.floats();
            if (ranged) {
              const auto first = static_cast<row_id>(h.first_row);
              local_apply(l.step, h.table, key_range{first, first + h.row_count},
                          g.subspan(std::size_t{first - p.range.begin} * t.width,
                                    std::size_t{h.row_count} * t.width));
            } else {
              for (const row_id k : keys)
                local_apply(l.step, h.table, key_range{k, k + 1},
                            g.subspan(std::size_t{k - p.range.begin} * t.width, t.width));
            }
          }
        }
        // Eager rows carry only the subscribed rows that changed: every other row this worker
        // caches (all of them subscribed, under the policies that push rows) is unchanged as
        // of h.clock, so the whole part is re-stamped.
        const bool eager = h.has(frame_flags::eager);
        if constexpr (sparse_reads) {
          if (ranged) {
            for (std::uint32_t i = 0; i < h.row_count; ++i)
              note_row(p, static_cast<row_id>(h.first_row) + i, h.clock);
          } else {
            for (const row_id k : keys) note_row(p, k, h.clock);
          }
          if (eager)
            for (clock_value& rc : p.row_clock)
              if (rc != no_clock) rc = std::max(rc, h.clock);
        } else if ((ranged && h.first_row == p.range.begin && h.row_count == p.range.size()) ||
                   (eager && p.have)) {
          p.have = true;
          p.clock = std::max(p.clock, h.clock);
        }
        if (!h.has(frame_flags::eager)) p.pulling = false;
        wake_.cancel();
        return {};
      }
      case message_type::ack: {
        const bool full = l.unacked.size() >= opts_.max_unacked;
        while (!l.unacked.empty() && l.unacked.front().header.seq <= h.seq) l.unacked.pop_front();
        if constexpr (value_bounded) {
          while (!l.in_transit.empty() && l.in_transit.front().seq <= h.seq)
            l.in_transit.pop_front();
          wake_.cancel();
        }
        if (l.unacked.empty() || (full && l.unacked.size() < opts_.max_unacked)) wake_.cancel();
        return {};
      }
      case message_type::heartbeat: return {};
      case message_type::report: {
        protocol::report r;
        std::string why;
        if (auto ec = protocol::decode(m, r, why)) return ec;
        l.reported = true;
        l.report_clock = r.server_clock;
        l.slowest = r.slowest;
        l.slowest_clock = r.slowest_clock;
        l.slowest_connected = r.slowest_connected;
        return {};
      }
      case message_type::error: {
        protocol::error e;
        std::string why;
        if (auto ec = protocol::decode(m, e, why)) return ec;
        const std::string reason(e.reason);
        log(server_name(l) + " closed the connection: " + reason);
        const std::optional<errc> code = e.code;
        // A refusal of what this worker sent (a NaN push, a bad header...): the link fails
        // with its code, and when the recovery policy gives up the run ends with that code
        // (not server_lost). not_head, or no valid code: a plain failure of the link.
        const bool refusal = code && *code != errc::not_head;
        fail(l, refusal ? make_error_code(*code) : make_error_code(errc::unexpected_message),
             reason);
        l.refused = refusal;
        return {};
      }
      case message_type::bye: fail(l, errc::connection_closed, ""); return {};
      default: return errc::unexpected_message;
    }
  }

  // Read-my-writes: applies this worker's gradient `g` (rows `r` of table `t`) to its cache
  // with learning rate `step`.
  void local_apply(float step, table_id t, key_range r, std::span<const float> g) {
    const std::uint32_t w = tables_[t].width;
    Eigen::Map<Eigen::ArrayXf> c(cache_.data() + offsets_[t] + std::size_t{r.begin} * w,
                                 static_cast<Eigen::Index>(std::size_t{r.size()} * w));
    c -= step * Eigen::Map<const Eigen::ArrayXf>(g.data(), static_cast<Eigen::Index>(g.size()));
  }

  // "server 0 at 127.0.0.1:7000" (the endpoint this link uses now).
  std::string server_name(const link& l) const {
    return "server " + std::to_string(l.shard) + " at " + detail::endpoint_string(endpoint_of(l));
  }

  template <class Duration>
  static std::string duration_string(Duration d) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
    if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
    return std::to_string(ms) + " ms";
  }

  // What the wait for rows of server clock `need` waits on: per shard whose rows are not
  // fresh enough, its server clock (as last reported, or of the rows it sent) and the slowest
  // worker as the server last reported it.
  std::string blocked_by(clock_value need) const {
    std::string out = "waits for server clock >= " + std::to_string(need);
    for (const auto& l : links_) {
      bool stale = !l.up;
      for (const auto& p : l.parts) {
        if (p.range.empty()) continue;
        if constexpr (sparse_reads) {
          if (p.want.empty()) continue;
        }
        const auto [have, cached] = read_state(p);
        stale = stale || !have || cached < need;
      }
      if (!stale) continue;
      out += "; " + server_name(l);
      if (!l.up) out += " (not connected)";
      if (l.reported) {
        out += " is at server clock " + std::to_string(l.report_clock) + ", slowest worker " +
               std::to_string(l.slowest) + " at clock " + std::to_string(l.slowest_clock) +
               (l.slowest_connected ? " (connected)" : " (not connected)");
      } else {
        out += " has not reported its clock (no heartbeat report yet)";
      }
    }
    return out;
  }

  // check_gradients: fills `grad` with the unwritten-value pattern.
  static void fill_unwritten(buffer& grad) noexcept {
    const auto n = grad.size() / sizeof(std::uint32_t);
    auto* p = reinterpret_cast<std::uint32_t*>(grad.data());
    std::fill(p, p + n, unwritten_gradient_bits);
  }

  // check_gradients: errc::bad_gradient (logged with table, row and column) when a value of
  // `grad` is still the fill pattern or is NaN/infinity.
  std::error_code check_gradient(const buffer& grad) const {
    const auto* bits = reinterpret_cast<const std::uint32_t*>(grad.data());
    const float* vals = grad.floats().data();
    for (table_id t = 0; t < tables_.size(); ++t) {
      const std::size_t n = tables_[t].size();
      const std::size_t off = offsets_[t];
      for (std::size_t i = 0; i < n; ++i) {
        const bool unwritten = bits[off + i] == unwritten_gradient_bits;
        if (!unwritten && std::isfinite(vals[off + i])) continue;
        const std::uint32_t w = tables_[t].width;
        const std::string where = "table " + std::to_string(t) + " row " + std::to_string(i / w) +
                                  " column " + std::to_string(i % w);
        log("compute_gradient at clock " + std::to_string(clock_) + ": the gradient of " + where +
            (unwritten
                 ? " was not written (every value must be written; check_gradients)"
                 : (std::isnan(vals[off + i]) ? " is NaN (computed)" : " is infinite (computed)")));
        return errc::bad_gradient;
      }
    }
    return {};
  }

  // Returns the failure to report if some link is down and the recovery policy gives up;
  // otherwise starts reconnecting every link that is down.
  std::error_code check_links() {
    for (auto& l : links_) {
      if (l.up || l.reconnecting || l.joining) continue;
      if (l.gave_up) return l.refused ? l.failure : make_error_code(errc::server_lost);
      l.action = recovery_.on_server_lost(l.failure);
      if (l.action == recovery_action::fail) {
        log("lost server " + std::to_string(l.shard) + " (" + l.failure.message() +
            "); recovery policy '" + std::string(Recovery::name) + "' gives up");
        return l.refused ? l.failure : make_error_code(errc::server_lost);
      }
      log("lost server " + std::to_string(l.shard) + " (" + l.failure.message() + "); " +
          (l.action == recovery_action::continue_local ? "training on locally, " : "") +
          "reconnecting");
      l.reconnecting = true;
      asio::co_spawn(transport_.get_executor(), reconnect(l), asio::detached);
    }
    return {};
  }

  // Whether some shard that is down holds a backlog not yet delivered.
  bool has_backlog() const noexcept {
    for (const auto& l : links_)
      if (!l.up)
        for (const auto& p : l.parts)
          if (p.backlog_clocks > 0) return true;
    return false;
  }

  bool unacked_full() const noexcept {
    if constexpr (!acknowledged) return false;
    return std::any_of(links_.begin(), links_.end(), [&](const link& l) {
      return l.up && l.unacked.size() >= opts_.max_unacked;
    });
  }

  bool has_unacked() const noexcept {
    return std::any_of(links_.begin(), links_.end(),
                       [](const link& l) { return !l.unacked.empty(); });
  }

  bool all_up() const noexcept {
    return std::all_of(links_.begin(), links_.end(), [](const link& l) { return l.up; });
  }

  // Reconnects `l` with exponential backoff until it is connected and greeted (then the
  // clock loop finishes the rejoin, see `join`), the worker stops, or the policy's
  // reconnect_timeout passes (then the run ends with errc::server_lost).
  asio::awaitable<void> reconnect(link& l) {
    timer_type timer(transport_.get_executor());
    const auto deadline =
        clock_type::now() + std::chrono::milliseconds(recovery_.reconnect_timeout());
    std::chrono::milliseconds backoff{20};
    while (!stopping_) {
      if (!l.reading) {  // the old read loop is done with the old connection
        auto [ec, conn] = co_await transport_.async_connect(endpoint_of(l));
        if (!ec && !stopping_) {
          l.conn = std::move(conn);
          ec = co_await handshake(l);
          if (!ec && !stopping_) {
            l.joining = true;
            break;
          }
          l.conn.close();
          if (ec == errc::layout_mismatch || ec == errc::server_lost ||
              ec == condition::protocol_violation) {
            l.gave_up = true;  // a different server answers there: retrying will not help
            l.refused = ec != errc::server_lost;
            l.failure = ec;
            break;
          }
        }
        next_endpoint(l);               // chain replication: the next server may be the new head
        if (l.endpoint != 0) continue;  // back off only after trying every server once
      }
      const auto now = clock_type::now();
      if (now >= deadline) {
        log("server " + std::to_string(l.shard) + " still unreachable after " +
            std::to_string(recovery_.reconnect_timeout().count()) + " ms; giving up");
        l.gave_up = true;
        l.refused = false;  // lost, whatever refusal started the outage
        break;
      }
      // The last wait is cut to the deadline, so the worker tries until the timeout ends.
      timer.expires_after(std::min<typename clock_type::duration>(backoff, deadline - now));
      co_await timer.async_wait(detail::use_tuple);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
    }
    l.reconnecting = false;
    wake_.cancel();
  }

  // Finishes the rejoin of every reconnected link, at a clock boundary of the clock loop (so
  // nothing else sends on it meanwhile): `clock` messages for the clocks this worker finished
  // since its hello (trained locally), then replica and backlog, then the link is up.
  asio::awaitable<void> join_links() {
    for (auto& l : links_) {
      if (!l.joining) continue;
      l.joining = false;
      std::error_code ec;
      // Clocks trained locally while the shard was down (continue_local only: otherwise the
      // worker was idle, or its unacked pushes below carry those clocks).
      for (clock_value k = l.hello_clock;
           !ec && l.action == recovery_action::continue_local && k < clock_; ++k) {
        message m;
        m.header.type = message_type::clock;
        m.header.sender = opts_.id;
        m.header.clock = k;
        ec = co_await l.conn.async_send(std::move(m));
      }
      if (!ec) ec = co_await send_recovery(l);
      // Acknowledged pushes: resend what the lost server never acknowledged, in order; the
      // new head drops those it already has.
      for (std::size_t i = 0; !ec && i < l.unacked.size(); ++i) {
        const message& u = l.unacked[i];
        message r;
        r.header = u.header;
        r.payload = u.payload.share();
        ec = co_await l.conn.async_send(std::move(r));
      }
      if (ec) {
        l.failure = ec;
        l.conn.close();
        continue;  // still down: check_links starts over
      }
      // Cached rows are from before the outage: fetch (and, for ESSP, resubscribe).
      for (auto& p : l.parts) {
        p.have = false;
        if constexpr (sparse_reads) {
          std::fill(p.row_clock.begin(), p.row_clock.end(), no_clock);
          p.rows_cached = 0;
        }
      }
      ++stats_.reconnects;
      l.up = true;
      l.refused = false;
      l.reading = true;
      asio::co_spawn(transport_.get_executor(), read_loop(l), asio::detached);
      log("rejoined server " + std::to_string(l.shard) + " at clock " + std::to_string(clock_));
    }
  }

  // After a reconnect under continue_local: the replica (when the server asks for state),
  // then each part's backlog. Sent before the link is marked up, so the clock loop's sends
  // never overlap them.
  asio::awaitable<std::error_code> send_recovery(link& l) {
    if (l.action != recovery_action::continue_local) co_return std::error_code{};
    for (table_id t = 0; t < l.parts.size(); ++t) {
      auto& p = l.parts[t];
      if (p.range.empty()) continue;
      const std::uint32_t w = tables_[t].width;
      const std::size_t n = std::size_t{p.range.size()} * w;
      const float* rows = cache_.data() + offsets_[t] + std::size_t{p.range.begin} * w;
      if (l.state_wanted && p.have) {
        if (auto ec = co_await send_rows_as(l, t, frame_flags::state, rows, n, 0, clock_))
          co_return ec;
        ++stats_.replicas_sent;
      }
      if (p.backlog_clocks > 0) {
        if (auto ec = co_await send_rows_as(l, t, frame_flags::backlog, p.backlog.data(), n,
                                            p.backlog_clocks, p.backlog_since))
          co_return ec;
        ++stats_.backlogs_sent;
        p.backlog_clocks = 0;
      }
    }
    co_return std::error_code{};
  }

  asio::awaitable<std::error_code> send_rows_as(link& l, table_id t, std::uint8_t flag,
                                                const float* values, std::size_t n,
                                                std::uint64_t count, clock_value since) {
    const auto& p = l.parts[t];
    message m;
    m.header.type = message_type::push;
    m.header.flags = static_cast<std::uint8_t>(frame_flags::range | flag);
    m.header.sender = opts_.id;
    m.header.table = t;
    m.header.clock = since;
    m.header.first_row = p.range.begin;
    m.header.row_count = p.range.size();
    m.header.width = tables_[t].width;
    // A backlog's payload starts with the number of clocks it sums (protocol.hpp).
    const std::size_t prefix = flag == frame_flags::backlog ? backlog_prefix_bytes : 0;
    m.payload = transport_.allocate(prefix + n * sizeof(float));
    if (prefix != 0) protocol::set_backlog_clocks(m.payload, count);
    std::memcpy(m.payload.data() + prefix, values, n * sizeof(float));
    stats_.bytes_out += prefix + n * sizeof(float);
    co_return co_await l.conn.async_send(std::move(m));
  }

  // Adds gradient slice `g` (one part's rows) to the part's backlog.
  static void add_to_backlog(part& p, std::span<const float> g) {
    const auto n = static_cast<Eigen::Index>(g.size());
    const Eigen::Map<const Eigen::ArrayXf> gm(g.data(), n);
    if (p.backlog_clocks == 0) {
      p.backlog.resize(g.size());
      Eigen::Map<Eigen::ArrayXf>(p.backlog.data(), n) = gm;
      p.backlog_since = p.clock;
    } else {
      Eigen::Map<Eigen::ArrayXf>(p.backlog.data(), n) += gm;
    }
    ++p.backlog_clocks;
  }

  // continue_local: a shard is unreachable, so this clock's slice of the gradient is applied
  // to the local cache (read-my-writes) and added to the part's backlog.
  void keep_local(link& l, const buffer& grad) {
    for (table_id t = 0; t < l.parts.size(); ++t) {
      auto& p = l.parts[t];
      if (p.range.empty()) continue;
      const std::uint32_t w = tables_[t].width;
      const std::size_t off = offsets_[t] + std::size_t{p.range.begin} * w;
      const auto n = static_cast<Eigen::Index>(std::size_t{p.range.size()} * w);
      const auto slice = grad.floats().subspan(off, static_cast<std::size_t>(n));
      add_to_backlog(p, slice);
      if (l.step > 0) local_apply(l.step, t, p.range, slice);
    }
    ++stats_.local_clocks;
  }

  // The pull a part needs before reading at clock `c`, if any.
  // With `fetch_only`, only a pull the read cannot go on without.
  std::optional<message> decide_read(link& l, table_id t, clock_value c, clock_value need,
                                     bool fetch_only = false) {
    auto& p = l.parts[t];
    if (p.range.empty() || p.pulling) return std::nullopt;
    if constexpr (sparse_reads) {
      if (p.want.empty()) return std::nullopt;  // the model reads none of these rows
    }
    const auto [have, cached] = read_state(p);
    const auto action = policy_.on_read(c, cached, have);
    if (action != read_action::fetch && (fetch_only || action != read_action::read_and_refresh))
      return std::nullopt;
    const clock_value want_clock = action == read_action::fetch ? need : no_clock;
    if constexpr (sparse_reads) {
      if (auto m = sparse_pull(l, t, want_clock)) return m;
    }
    message m = new_pull(l, t, want_clock);
    m.header.flags = frame_flags::range;
    m.header.first_row = p.range.begin;
    m.header.row_count = p.range.size();
    return m;
  }

  // A pull of part `t` of link `l` for rows of server clock >= `need` (rows not set yet);
  // marks the part as pulling.
  message new_pull(link& l, table_id t, clock_value need) {
    message m;
    m.header.type = message_type::pull;
    m.header.sender = opts_.id;
    m.header.table = t;
    m.header.clock = need;
    m.header.seq = ++l.seq;
    m.header.width = tables_[t].width;
    l.parts[t].pulling = true;
    ++stats_.pulls;
    return m;
  }

  bool ready(clock_value need) const noexcept {
    for (const auto& l : links_) {
      for (const auto& p : l.parts) {
        if (p.range.empty()) continue;
        if constexpr (sparse_reads) {
          if (p.want.empty()) continue;
        }
        const auto [have, cached] = read_state(p);
        if (!l.up && l.action == recovery_action::continue_local) {
          if (!have) return false;  // nothing cached to train on yet
          continue;
        }
        if (!(l.up && have && cached >= need)) return false;
      }
    }
    return true;
  }

  // Whether the rows a read of part `p` needs are cached, and the oldest server clock among
  // them: the whole part, or (sparse reads) the rows the model reads at this clock.
  std::pair<bool, clock_value> read_state(const part& p) const noexcept {
    if constexpr (sparse_reads) {
      clock_value oldest = std::numeric_limits<clock_value>::max();
      for (const row_id k : p.want) {
        const clock_value rc = p.row_clock[k - p.range.begin];
        if (rc == no_clock) return {false, no_clock};
        oldest = std::min(oldest, rc);
      }
      return {true, oldest};
    } else {
      return {p.have, p.clock};
    }
  }

  void record_staleness(clock_value c) noexcept {
    for (auto& l : links_) {
      for (auto& p : l.parts) {
        if (p.range.empty() || !l.up) continue;
        if constexpr (sparse_reads) {
          if (p.want.empty()) continue;
          p.clock = read_state(p).second;  // the clock this read's gradient is computed on
        }
        staleness_.record(c - p.clock);
      }
    }
  }

  // Sparse reads: asks the model which rows its next gradient reads and narrows them to each
  // part (no copy: a subrange of the model's span).
  void select_rows() {
    if constexpr (sparse_reads) {
      for (table_id t = 0; t < tables_.size(); ++t) {
        const std::span<const row_id> rows = model_.rows_to_read(t);
        for (auto& l : links_) {
          auto& p = l.parts[t];
          const auto lo = std::lower_bound(rows.begin(), rows.end(), p.range.begin);
          const auto hi = std::lower_bound(lo, rows.end(), p.range.end);
          p.want = rows.subspan(static_cast<std::size_t>(lo - rows.begin()),
                                static_cast<std::size_t>(hi - lo));
        }
      }
    }
  }

  // Sparse reads: a row of part `p` arrived with server clock `c`.
  static void note_row(part& p, row_id k, clock_value c) noexcept {
    clock_value& rc = p.row_clock[k - p.range.begin];
    if (rc == no_clock && ++p.rows_cached == p.range.size()) p.have = true;
    rc = std::max(rc, c);
  }

  // Sparse reads: a keyed pull of the rows of part `t` the model reads at this clock that are
  // older than `need` (or not cached), or of all of them when `need` is no_clock and they are
  // all cached (a refresh). Empty when pulling the whole part is smaller on the wire.
  std::optional<message> sparse_pull(link& l, table_id t, clock_value need) {
    auto& p = l.parts[t];
    const auto stale = [&](row_id k) {
      const clock_value rc = p.row_clock[k - p.range.begin];
      return rc == no_clock || rc < need;
    };
    auto n = static_cast<std::uint32_t>(std::count_if(p.want.begin(), p.want.end(), stale));
    const bool refresh = n == 0;  // read_and_refresh: every row is cached; refresh them all
    if (refresh) n = static_cast<std::uint32_t>(p.want.size());
    const std::uint32_t w = tables_[t].width;
    if (key_bytes(n) + std::uint64_t{n} * w * 4 >= std::uint64_t{p.range.size()} * w * 4)
      return std::nullopt;
    message m = new_pull(l, t, need);
    m.header.row_count = n;
    m.payload = transport_.allocate(key_bytes(n));
    std::memset(m.payload.data(), 0, m.payload.size());
    auto* out = reinterpret_cast<row_id*>(m.payload.data());
    for (const row_id k : p.want)
      if (refresh || stale(k)) *out++ = k;
    ++stats_.sparse_pulls;
    stats_.bytes_out += m.payload.size();
    return m;
  }

  // VAP: sets each link's magnitude of `grad` (lr * L2 norm of its slices); returns their sum.
  float set_magnitudes(const buffer& grad) {
    float added = 0;
    for (auto& l : links_) {
      const float lr = l.step > 0 ? l.step : 1.0f;
      double sq = 0;
      for (table_id t = 0; t < l.parts.size(); ++t) {
        const auto& p = l.parts[t];
        if (p.range.empty()) continue;
        const std::uint32_t w = tables_[t].width;
        const std::size_t off = offsets_[t] + std::size_t{p.range.begin} * w;
        const Eigen::Map<const Eigen::VectorXf> g(
            grad.floats().data() + off, static_cast<Eigen::Index>(std::size_t{p.range.size()} * w));
        sq += static_cast<double>(g.squaredNorm());
      }
      l.magnitude = lr * static_cast<float>(std::sqrt(sq));
      added += l.magnitude;
    }
    return added;
  }

  // VAP: magnitude of this worker's updates not yet acknowledged as visible (live links).
  float in_transit_magnitude() const noexcept {
    float sum = 0;
    for (const auto& l : links_)
      if (l.up)
        for (std::size_t i = 0; i < l.in_transit.size(); ++i) sum += l.in_transit[i].magnitude;
    return sum;
  }

  // Message `t` of the pushes to link `l` at clock `c`: the push of table t's slice of `grad`
  // (t < tables), or for t == tables a bare clock message when the shard owns no rows at all.
  // The last push to a shard carries end_of_clock.
  std::optional<message> make_push(link& l, table_id t, clock_value c, const buffer& grad) {
    table_id last = 0;
    bool any = false;
    for (table_id i = 0; i < l.parts.size(); ++i)
      if (!l.parts[i].range.empty()) {
        last = i;
        any = true;
      }
    message m;
    m.header.sender = opts_.id;
    m.header.clock = c;
    if (t == l.parts.size()) {
      if (any) return std::nullopt;
      m.header.type = message_type::clock;
      if constexpr (acknowledged) {
        m.header.flags = frame_flags::want_ack;
        m.header.seq = ++l.seq;
        l.unacked.push_back(message{m.header, buffer{}});
      }
      return m;
    }
    auto& p = l.parts[t];
    if (p.range.empty()) return std::nullopt;
    const std::uint32_t w = tables_[t].width;
    const std::size_t off = (offsets_[t] + std::size_t{p.range.begin} * w) * sizeof(float);
    const std::size_t bytes = std::size_t{p.range.size()} * w * sizeof(float);
    m.header.type = message_type::push;
    m.header.flags =
        static_cast<std::uint8_t>(frame_flags::range | (t == last ? frame_flags::end_of_clock : 0));
    m.header.table = t;
    m.header.seq = ++l.seq;
    m.header.first_row = p.range.begin;
    m.header.row_count = p.range.size();
    m.header.width = w;
    m.payload = grad.share(off, bytes);
    sparsify(m, p, t, grad);  // sparse models only (a no-op otherwise)
    if constexpr (acknowledged) {
      m.header.flags |= frame_flags::want_ack;
      l.unacked.push_back(message{m.header, m.payload.share()});
    }
    if constexpr (value_bounded) {
      if (t == last) {
        m.header.flags |= frame_flags::want_ack;
        l.in_transit.push_back(in_transit_update{m.header.seq, l.magnitude});
      }
    }
    ++p.pushed;
    if (l.step > 0) {
      buffer slice = grad.share(off, bytes);  // dense, whatever went on the wire
      local_apply(l.step, t, p.range, slice.floats());
      p.local.push_back(unapplied{p.pushed, std::move(slice)});
    }
    ++stats_.pushes;
    stats_.bytes_out += m.payload.size();
    return m;
  }

  // Sparse models: turns push `m` (part `p` of table `t`, a slice of `grad`) into a keyed push
  // of only the rows the model touched in that part, when that is smaller. The rows are copied
  // into one pooled buffer (keys, padded to 16 bytes, then the rows).
  void sparsify(message& m, const part& p, table_id t, const buffer& grad) {
    if constexpr (sparse_gradient_source<Model>) {
      const std::span<const row_id> touched = model_.touched_rows(t);
      const auto lo = std::lower_bound(touched.begin(), touched.end(), p.range.begin);
      const auto hi = std::lower_bound(lo, touched.end(), p.range.end);
      const auto n = static_cast<std::uint32_t>(hi - lo);
      const std::uint32_t w = tables_[t].width;
      const std::size_t keys = key_bytes(n);
      const std::size_t bytes = keys + std::size_t{n} * w * sizeof(float);
      if (bytes >= m.payload.size()) return;
      buffer b = transport_.allocate(bytes);
      std::memset(b.data(), 0, keys);
      if (n > 0) std::memcpy(b.data(), std::to_address(lo), std::size_t{n} * sizeof(row_id));
      float* rows = reinterpret_cast<float*>(b.data() + keys);
      const float* src = grad.floats().data() + offsets_[t];
      for (std::uint32_t i = 0; i < n; ++i)
        std::memcpy(rows + std::size_t{i} * w, src + std::size_t{lo[i]} * w, w * sizeof(float));
      m.header.flags = static_cast<std::uint8_t>(m.header.flags & ~frame_flags::range);
      m.header.first_row = 0;
      m.header.row_count = n;
      m.payload = std::move(b);
    }
  }

  asio::awaitable<void> shutdown() {
    stopping_ = true;
    for (auto& l : links_) {
      if (l.up) {
        message bye;
        bye.header.type = message_type::bye;
        bye.header.sender = opts_.id;
        (void)co_await l.conn.async_send(std::move(bye));
      }
    }
    // Graceful close: a server answers `bye` by closing once it has sent what it queued.
    // Closing first could reset a TCP connection that still has rows arriving (ESSP, VAP), and
    // a reset may drop this worker's last pushes before the server has read them.
    const auto deadline = clock_type::now() + std::chrono::seconds(2);
    while (clock_type::now() < deadline &&
           std::any_of(links_.begin(), links_.end(),
                       [](const link& l) { return l.up && l.reading; })) {
      wake_.expires_after(std::chrono::milliseconds(10));
      co_await wake_.async_wait(detail::use_tuple);
    }
    for (auto& l : links_) {
      l.up = false;
      l.conn.close();
    }
    for (;;) {
      bool busy = false;
      for (auto& l : links_) busy = busy || l.reading || l.reconnecting;
      if (!busy) break;
      wake_.expires_after(std::chrono::milliseconds(100));
      co_await wake_.async_wait(detail::use_tuple);
    }
    for (auto& l : links_)
      for (auto& p : l.parts) p.local.clear();
  }

  Transport& transport_;
  Model& model_;
  options_type opts_;
  std::optional<asio::any_io_executor> compute_;
  timer_type wake_;
  [[no_unique_address]] Consistency policy_{};
  [[no_unique_address]] typename Recovery::worker_part recovery_{};
  std::vector<table_spec> tables_;
  std::vector<std::size_t> offsets_;
  std::vector<float> cache_;
  std::vector<float> snapshot_;
  std::vector<link> links_;
  clock_value clock_ = 0;
  bool stopping_ = false;
  staleness_histogram staleness_{};
  worker_stats stats_{};
};

/// The TCP worker most programs use: `basic_worker` over `tcp_transport`, with no recovery
/// unless named. Example: `asyncps::worker<my_model, consistency::ssp<3>>`.
template <checked_model Model, consistency_policy Consistency,
          recovery_policy Recovery = recovery::none>
using worker = basic_worker<Model, tcp_transport, Consistency, Recovery>;

}  // namespace asyncps
