// asyncps — basic_server: a parameter-server shard driven by coroutines.
//
// One `basic_server` owns shard `shard` of `num_shards` of every table (a contiguous key range
// per table, see table.hpp), keeps a vector clock over its workers (server clock = minimum),
// applies pushed gradients with its optimizer, answers pulls once its clock is fresh enough
// for the request, and — for eager policies (ESSP) — pushes every subscribed row when its
// clock advances (Bösen's SSPPushServerThread).
//
// Structure: this file is a thin coroutine shell. What the server does with each message is
// detail::server_protocol (sans-io, detail/server/protocol.hpp) over the shard's state and
// rules, detail::shard_core (detail/server/shard_core.hpp); the recovery policy's server part plugs
// into the server hooks (declared, detected and checked in recovery.hpp); a connection is a
// detail::server_session (detail/server/session.hpp). The shell accepts connections, runs each
// session's read and write loops, the watchdog and the sweeper (hello and send deadlines), and
// executes what the protocol asks (wake a write loop, close a connection); those coroutines are
// defined in detail/server/shell.ipp, included at the end of this file.
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
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>

#include "asyncps/consistency.hpp"
#include "asyncps/detail/accept_retry.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/log_limiter.hpp"
#include "asyncps/detail/peer_address.hpp"
#include "asyncps/detail/server/hooks.hpp"
#include "asyncps/detail/server/part_context.hpp"
#include "asyncps/detail/server/protocol.hpp"
#include "asyncps/detail/server/session.hpp"
#include "asyncps/detail/server/shard_core.hpp"
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
#include "asyncps/server_options.hpp"
#include "asyncps/shard_state.hpp"
#include "asyncps/table.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/transport/tcp.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

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
  // The transport's timer and clock (asio::steady_timer and std::chrono::steady_clock unless
  // it declares its own, e.g. a simulated transport's virtual time).
  using timer_type = detail::transport_timer_t<Transport>;
  using clock_type = detail::transport_clock_t<Transport>;
  using session = detail::server_session<typename Transport::connection_type, timer_type,
                                         typename clock_type::time_point>;
  using protocol_type = detail::server_protocol<Consistency, Recovery, Optimizer, session,
                                                typename clock_type::time_point, basic_server>;
  using core_type = typename protocol_type::core_type;
  using part_type = typename Recovery::server_part;
  friend protocol_type;  // asks for its effects: ctx, wake, close, allocate, now, server, ...

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
      : transport_(transport), proto_(*this, std::move(opts), opt, std::move(recovery)),
        done_(transport.get_executor()), running_(transport.get_executor()),
        watchdog_(transport.get_executor()), sweeper_(transport.get_executor()),
        trimmer_(transport.get_executor()) {
    static_assert(check_server_part<part_type, context>());  // recovery.hpp
  }

  /// As above, with the layout taken from a model object (the same type the workers train):
  /// `opts.tables` must be empty (it is filled from `layout_source.tables()`) or equal to it.
  /// Throws `std::invalid_argument` naming each differing table (both sides' rows x width)
  /// or the table counts, and for the reasons above. `layout_source` is only read here; it
  /// need not outlive the server.
  template <model M>
  basic_server(Transport& transport, const M& layout_source, server_options opts,
               Optimizer opt = {}, typename Recovery::server_part recovery = {})
      : basic_server(transport, detail::with_layout(layout_source.tables(), std::move(opts)), opt,
                     std::move(recovery)) {}

  basic_server(const basic_server&) = delete;
  basic_server& operator=(const basic_server&) = delete;

  /// Accepts connections on `acceptor` and serves them until `stop()` is called. Completes
  /// with success after a stop, or with the acceptor's error; a transient one (out of
  /// descriptors, ...) is logged rate-limited and retried after a pause instead
  /// (detail/accept_retry.hpp), and so is an allocation failure (`std::bad_alloc`,
  /// `std::length_error`) while accepting or making the session (its connection is closed). Every
  /// connection's coroutines have finished when it completes. Precondition: runs on
  /// `transport.get_executor()`.
  asio::awaitable<std::error_code> async_serve(typename Transport::acceptor_type acceptor) {
    acceptor_ = &acceptor;
    std::error_code result;
    if constexpr (detail::has_on_start<part_type, context>) {
      context c{this};
      recovery().on_start(c);  // e.g. restore the newest valid checkpoint
    }
    if constexpr (detail::has_on_serve<part_type, context>) {
      if (auto ec = recovery().on_serve(context{this})) {  // e.g. connect to the chain master
        acceptor_ = nullptr;
        co_return ec;
      }
    }
    if (options().watchdog_interval.count() > 0) spawn(watchdog());
    if (options().hello_timeout.count() > 0 || options().send_timeout.count() > 0) spawn(sweeper());
    // A plain `if`: trimmer() is instantiated for every transport (an explicitly
    // instantiated server would otherwise define it unused), spawned only for pooling ones.
    constexpr bool pools = requires { transport_.trim_pools(); };
    if (pools && options().pool_trim_interval.count() > 0) spawn(trimmer());
    detail::accept_backoff backoff;  // shared with the other accept loops (accept_retry.hpp)
    while (!stopped_) {
      std::error_code ec;
      bool added = false;
      // The transport allocates while it accepts (its coroutine frame, the connection, a TLS
      // session) and so does the new session: under memory exhaustion that throws, which
      // ends no server: it is one more transient accept failure (detail::serve_sessions too).
      try {
        auto [aec, conn] = co_await acceptor.async_accept();
        ec = aec;
        if (!ec) {
          add_session(std::move(conn));
          added = true;
        }
      } catch (const std::bad_alloc&) {
        ec = detail::accept_no_memory_error();
      } catch (const std::length_error&) {
        ec = detail::accept_no_memory_error();
      }
      if (added) {
        backoff.succeeded();
        ++proto_.stats().connections;
        continue;
      }
      if (!stopped_ && detail::accept_backoff::transient(ec)) {
        // Out of descriptors or memory: keep serving the connected workers, retry later.
        const auto pause = backoff.failed();
        detail::despite_no_memory([&] { proto_.log_accept_failure(ec, pause); });  // rate-limited
        done_.expires_after(pause);
        co_await done_.async_wait(detail::use_tuple);
        continue;
      }
      if (!stopped_) result = ec;
      break;
    }
    acceptor_ = nullptr;
    stop();
    co_await running_.async_wait();  // every session and every spawned coroutine
    if constexpr (detail::has_on_stop<part_type>) {
      recovery().on_stop();  // e.g. finish a checkpoint being persisted
    }
    co_return result;
  }

  /// Stops accepting and closes every connection; `async_serve` then completes.
  void stop() {
    stopped_ = true;
    if (acceptor_ != nullptr) acceptor_->close();
    for (auto& s : proto_.sessions()) proto_.close(s);
    done_.cancel();
    watchdog_.cancel();
    sweeper_.cancel();
    trimmer_.cancel();
  }

  /// The server clock: the minimum clock over all `num_workers` workers.
  clock_value clock() const noexcept { return core().clock(); }
  /// Clock of worker `w` as seen by this server. Precondition: `w < num_workers`.
  clock_value worker_clock(std::uint32_t w) const noexcept { return core().worker_clock(w); }
  /// This shard's rows of table `t`.
  key_range range(table_id t) const noexcept { return core().table(t).range; }
  /// This shard's values of table `t`: `range(t).size() x width` floats, row-major.
  std::span<const float> values(table_id t) const noexcept { return core().table(t).values; }
  /// Copies this shard's rows of every table into `model`: the whole model, its tables one
  /// after the other in table order, each `rows x width` floats row-major
  /// (`layout_size(options().tables)` floats). The other shards' rows are left as they are, so
  /// calling it on every shard assembles the model. Throws `std::invalid_argument` when
  /// `model` has another size (nothing is copied then). On the server's executor.
  void copy_values_into(std::span<float> model) const {
    const auto& core = this->core();
    const std::size_t total = layout_size(options().tables);
    if (model.size() != total)
      throw std::invalid_argument("asyncps::basic_server::copy_values_into: the model has " +
                                  std::to_string(total) + " floats, got " +
                                  std::to_string(model.size()));
    std::size_t off = 0;
    for (table_id t = 0; t < core.num_tables(); ++t) {
      const auto& table = core.table(t);
      std::copy(table.values.begin(), table.values.end(),
                model.begin() + static_cast<std::ptrdiff_t>(off + std::size_t{table.range.begin} *
                                                                      table.spec.width));
      off += table.spec.size();
    }
  }
  /// Replaces this shard's values of table `t` (`range(t).size() x width` floats, row-major),
  /// e.g. a group server adopting the central model. Optimizer state, clocks and counts are
  /// kept; readers get the new values with their next rows. Throws `std::invalid_argument`
  /// when the size differs or a value is not finite (nothing is changed then). On the
  /// server's executor.
  void set_values(table_id t, std::span<const float> v) {
    auto& core = proto_.core();
    if (t >= core.num_tables() || v.size() != core.table(t).values.size())
      throw std::invalid_argument(
          "asyncps::basic_server::set_values: table " + std::to_string(t) + " needs " +
          std::to_string(t < core.num_tables() ? core.table(t).values.size() : 0) +
          " floats, got " + std::to_string(v.size()));
    if (!core_type::all_finite(v))
      throw std::invalid_argument("asyncps::basic_server::set_values: non-finite value");
    core.set_values(t, v);
  }
  const server_options& options() const noexcept { return proto_.options(); }
  const server_stats& stats() const noexcept { return proto_.stats(); }
  /// The transport it serves on.
  Transport& transport() const noexcept { return transport_; }
  /// Connected sessions.
  std::size_t connections() const noexcept { return proto_.sessions().size(); }
  /// Worker sessions now: connections whose hello was accepted and that have not ended (a bare
  /// connection, e.g. a port scan, is never one).
  std::uint32_t workers_connected() const noexcept { return proto_.workers_connected(); }
  /// Distinct worker ids whose hello this server has accepted at least once (of
  /// `options().num_workers`).
  std::uint32_t workers_seen() const noexcept { return proto_.workers_seen(); }
  /// Distinct worker ids that have trained here at least once (a push or clock message of the
  /// id taken; of `options().num_workers`). A hello, or a hello and a bye, is not training: an
  /// end condition on it cannot be met by ids that came and went without training.
  std::uint32_t workers_trained() const noexcept { return proto_.workers_trained(); }
  /// The server part of the recovery policy (its counters, for reports).
  const typename Recovery::server_part& recovery() const noexcept { return proto_.part(); }
  /// The server part of the recovery policy, to configure it before `async_serve` (e.g.
  /// `recovery().set_chain(...)` for chain replication). On the server's executor.
  typename Recovery::server_part& recovery() noexcept { return proto_.part(); }

  /// Copies the shard's whole state (parameters, optimizer state and steps, vector clock,
  /// pushes applied per worker) into `out`, reusing its vectors' capacity: after the first
  /// call with the same `out` it allocates nothing. Cost: one memcpy of parameters and
  /// optimizer state. Thread safety: on the server's executor.
  void save_state(shard_state& out) const { proto_.save_state(out); }

  /// Installs `st` as this shard's state (a restored checkpoint or a transferred replica).
  /// Errors: `errc::layout_mismatch` when `st` was taken from a different shard, shard count,
  /// worker count, optimizer or table layout; `errc::bad_state` when it fits but no run can
  /// reach it: a non-finite value or optimizer state, a worker clock outside [0,
  /// `protocol::max_clock`], a step, applied count or `last_seq` above `protocol::max_seq`
  /// (logged naming the field; the state is then left unchanged either way). Connected
  /// workers keep their connections; pulls waiting for a clock the restored state has passed
  /// are answered. Thread safety: on the server's executor.
  std::error_code restore_state(const shard_state& st) { return proto_.restore_state(st); }

  /// What the recovery part's hooks (recovery.hpp, server hooks) may do with this server: a
  /// copyable handle, valid while the server lives; every call on the server's executor. The
  /// shard, the sessions and the part's timers through `detail::part_context` (sans-io: a
  /// test steps a part with that alone, tests/unit/policy_steps_test.cpp); here the one I/O
  /// action that needs the transport's address type (`connect`) and the transport's limits.
  /// A part has no coroutine, timer or socket of its own.
  class context : public detail::part_context<protocol_type> {
   public:
    using endpoint_type = typename Transport::endpoint_type;  ///< the transport's address

    explicit context(basic_server* s) noexcept
        : detail::part_context<protocol_type>(s->proto_), s_(s) {}

    /// Connects to `ep` through the server's transport, in the background. On success the
    /// connection is served as a peer session tagged `role` (its messages go to
    /// `on_peer_message`) and the part's `on_connected(ctx, session)` is called; on failure
    /// `on_connect_failed(ctx, role, ec)` with the transport's error. Exactly one of them,
    /// unless the server stops first (then neither; a connection made is closed).
    void connect(std::uint8_t role, endpoint_type ep) const {
      s_->spawn(s_->connect_peer(role, std::move(ep)));
    }
    /// The largest frame the transport accepts, in bytes.
    std::size_t max_frame_bytes() const {
      return wire_limits(s_->transport_.limits()).max_frame_bytes;
    }

   private:
    basic_server* s_;
  };

 private:
  const core_type& core() const noexcept { return proto_.core(); }
  // Whether the transport's connections declare `sends_complete_at_once = true`.
  static constexpr bool sends_complete_at_once = [] {
    if constexpr (requires { Transport::connection_type::sends_complete_at_once; }) {
      return bool{Transport::connection_type::sends_complete_at_once};
    } else {
      return false;
    }
  }();

  // ---- the effects server_protocol asks for (see detail/server/protocol.hpp) ----
  context ctx() noexcept { return context{this}; }
  static void wake(session& s) { s.wake.cancel(); }
  static void close(session& s) {
    s.conn.close();
    s.wake.cancel();
  }
  buffer allocate(std::size_t n) { return transport_.allocate(n); }
  // The peer's address for log lines, when the connection knows it (TCP), else none.
  static std::optional<std::string> address(const session& s) {
    if constexpr (requires { s.conn.remote_endpoint(); }) {
      return detail::endpoint_string(s.conn.remote_endpoint());
    } else {
      return std::nullopt;
    }
  }
  static typename clock_type::time_point now() { return clock_type::now(); }
  void wake_watchdog() { watchdog_.cancel(); }
  void wake_sweeper() { sweeper_.cancel(); }

  // The coroutines (detail/server/shell.ipp): spawned work counted for `async_serve`, each
  // session's read and write loops, the watchdog and the sweeper.
  void spawn(asio::awaitable<void> a);
  asio::awaitable<void> counted(asio::awaitable<void> a);
  session& add_session(typename Transport::connection_type conn);
  void finish(session& s);
  asio::awaitable<void> write_loop(session& s);
  asio::awaitable<void> read_loop(session& s);
  asio::awaitable<void> watchdog();
  asio::awaitable<void> sweeper();
  // The part's `ctx.connect(role, ep)`: connects, then on_connected / on_connect_failed.
  asio::awaitable<void> connect_peer(std::uint8_t role, typename Transport::endpoint_type ep);
  // Every `pool_trim_interval`: the transport's pools give back what they cached beyond the
  // interval's working set (only for transports with `trim_pools()`).
  asio::awaitable<void> trimmer();

  Transport& transport_;
  protocol_type proto_;  // options, counters, recovery part, shard core, sessions (sans-io)
  timer_type done_;      // the accept loop's retry pause
  detail::wait_group<timer_type> running_;  // sessions and spawned coroutines (async_serve)
  timer_type watchdog_;                     // the watchdog's timer (see `watchdog`)
  timer_type sweeper_;                      // the sweeper's timer (see `sweeper`)
  timer_type trimmer_;                      // the pool trimmer's timer (see `trimmer`)
  typename Transport::acceptor_type* acceptor_ = nullptr;
  bool stopped_ = false;
};

/// The TCP parameter server most programs use: `basic_server` over `tcp_transport`, with no
/// recovery and plain SGD unless named. Example: `asyncps::server<consistency::ssp<3>>`.
template <consistency_policy Consistency, recovery_policy Recovery = recovery::none,
          optimizer_policy Optimizer = optimizer::sgd>
using server = basic_server<tcp_transport, Consistency, Recovery, Optimizer>;

}  // namespace asyncps

#include "asyncps/detail/server/shell.ipp"

#if defined(ASYNCPS_SEPARATE_COMPILATION)
#include "asyncps/consistency/policies.hpp"

namespace asyncps {
// Separate compilation (docs/build_time.md): the two most common TCP servers, BSP and SSP with
// its bound set at run time (`ssp<>`), no recovery, plain SGD, are compiled once, in
// asyncps/src.hpp; a translation unit that uses them generates none of their out-of-line
// members (their coroutines above all). Other configurations are generated where they are used.
extern template class basic_server<tcp_transport, consistency::bsp>;
extern template class basic_server<tcp_transport, consistency::ssp<>>;
}  // namespace asyncps
#endif
