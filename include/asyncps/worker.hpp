// asyncps — basic_worker: the pull -> gradient -> push -> clock loop of one worker.
//
// A worker connects to every shard, keeps a local cache of all tables stamped with the server
// clock each part reflects (each row, for a model with sparse reads), and per clock: asks its
// consistency policy whether each cached part (or the rows the model will read) may be read
// (pulling or waiting when not), snapshots the cache, computes the gradient
// straight into a pooled buffer (on the compute executor, so I/O continues meanwhile), applies
// it to its own cache (read-my-writes), and pushes each shard's slice of that same buffer
// without copying it, the last push of a shard marking the end of the clock.
//
// This file is the documented front: `basic_worker` holds the coroutine shell
// (detail/worker/shell.hpp: connections, the wake timer, reconnects), with the model behind a
// type-erased reference (detail/worker/model_ref.hpp), so that the shell is generated once per
// kind of model and, under separate compilation, compiled once (asyncps/src.hpp). What to send
// and when is decided by the sans-io core (detail/worker/fsm.hpp, detail/worker/protocol.hpp,
// detail/worker/cache.hpp, detail/worker/push_builder.hpp); the recovery policy plugs in through
// the hooks of its worker part (recovery/worker_hooks.hpp). Its options and counters
// (`worker_options`, `worker_stats`, `clock_report`) are in asyncps/worker_options.hpp.
#pragma once

#include <cstdint>
#include <optional>
#include <system_error>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "asyncps/consistency.hpp"
#include "asyncps/detail/worker/model_ref.hpp"
#include "asyncps/detail/worker/shell.hpp"
#include "asyncps/model.hpp"
#include "asyncps/recovery.hpp"
#include "asyncps/recovery/none.hpp"  // the default template argument only
#include "asyncps/staleness.hpp"
#include "asyncps/table.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/transport/tcp.hpp"
#include "asyncps/worker_options.hpp"

namespace asyncps {

/// One worker.
///
/// Template parameters: `Model` (models `model`), `Transport` (models `transport`),
/// `Consistency` (models `consistency_policy`, same as the servers'), `Recovery` (models
/// `recovery_policy`, same as the servers'; its worker part's hooks are listed in
/// docs/concepts/recovery.md, "Worker hooks").
///
/// Thread safety: call every member on `transport.get_executor()` (a strand or a
/// single-threaded context). `compute_gradient` runs on `compute` when given (e.g. a
/// `asio::thread_pool`'s executor) so communication overlaps it; otherwise inline.
/// Object lifetime: transport and model outlive the worker; `async_run` must have completed
/// before the worker is destroyed.
template <checked_model Model, transport Transport, consistency_policy Consistency,
          recovery_policy Recovery = recovery::none>
class basic_worker {
  using shell_type =
      detail::worker_shell<detail::model_ref_for<Model>, Transport, Consistency, Recovery>;

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
      : shell_(transport, detail::model_ref_for<Model>(model), std::move(opts), std::move(compute),
               std::move(recovery)) {}

  basic_worker(const basic_worker&) = delete;
  basic_worker& operator=(const basic_worker&) = delete;

  /// Runs `clocks` iterations of pull -> gradient -> push -> clock (fewer when its clock
  /// reaches `worker_options::end_clock` first), then closes its connections. Completes with
  /// success, or: the code of a server's refusal (its error frame's `seq`, the reason logged
  /// escaped, at most 200 bytes): `errc::bad_sender` (id >= num_workers), `errc::duplicate_worker`,
  /// `errc::policy_mismatch`, `errc::layout_mismatch` (the log names each differing table, both
  /// sides' rows x width), `errc::non_finite_value` (a NaN or infinite push refused mid-run),
  /// `errc::non_finite_update` (a finite push that would have made a parameter non-finite, refused
  /// whole mid-run), ...; `errc::server_lost` (a connection failed and the recovery policy gave
  /// up), `errc::timeout` (no fresh rows, or no ack of pending pushes, within `wait_timeout`; the
  /// log names the clock waited for, the shard, its server clock and the slowest worker when the
  /// server reported it), `errc::bad_gradient`
  /// (`check_gradients`), `errc::unexpected_message` (a malformed handshake reply),
  /// a routine refusal's code (the recovery policy's `on_refused` answered `next_server`, e.g.
  /// `recovery::chain_errc::not_head`: no server of a shard accepted it within
  /// `connect_timeout`), `errc::worker_id_in_use` (a live connection held this worker's id
  /// for all of `connect_timeout`: retried meanwhile), a refusal the policy answers `lost` (e.g.
  /// `recovery::chain_errc::shard_lost`: every server holding a shard's state failed;
  /// `stats().lost_pushes` counts this worker's pushes lost with it), or a connect error (the log
  /// names the endpoint; one that `is_final_connect_error` says no retry can fix, such as a wrong
  /// secret or a refused certificate, ends the run at once instead of after `connect_timeout`),
  /// `errc::resource_exhausted` (an allocation failed, `std::bad_alloc` or `std::length_error`, in
  /// the worker's loops or its transport: logged once, counted in `stats().out_of_memory`; no
  /// exception leaves the run). Precondition: runs on `transport.get_executor()`.
  asio::awaitable<std::error_code> async_run(std::uint64_t clocks) {
    return shell_.async_run(clocks);  // the shell's coroutine itself: no frame of our own
  }

  /// The worker's current clock.
  clock_value clock() const noexcept { return shell_.core().clock(); }
  /// The consistency policy object, for policies configured at run time (e.g.
  /// `consistency::vap::magnitude`). Set it before `async_run`; on the worker's executor.
  Consistency& consistency() noexcept { return shell_.core().consistency(); }
  const Consistency& consistency() const noexcept { return shell_.core().consistency(); }
  /// Observed staleness of every read so far: one sample per row read per clock (`clock -` the
  /// row's server clock; see `staleness_histogram`).
  const staleness_histogram& staleness() const noexcept { return shell_.core().staleness(); }
  /// The worker's counters (`worker_stats`, worker_options.hpp). On the worker's executor.
  const worker_stats& stats() const noexcept { return shell_.core().stats(); }
  /// The recovery policy's worker part (its options; its counters, e.g. `recovery().stats()`
  /// for `recovery::stateless`). On the worker's executor.
  typename Recovery::worker_part& recovery() noexcept { return shell_.core().recovery(); }
  const typename Recovery::worker_part& recovery() const noexcept {
    return shell_.core().recovery();
  }
  /// The local cache of all tables (table-major, see parameter_view). With read-my-writes on
  /// (`worker_options::local_step`), it has this worker's own pushes as of the last read (the
  /// start of a clock's compute) and, after `async_run` returns, every push of the run; a push
  /// sent since the last read is applied at the next one. On the worker's executor.
  parameter_view cache() const noexcept {
    return {shell_.core().cache().tables(), shell_.core().cache().values().data()};
  }
  /// The options, as given to the constructor (`stop_at` may have lowered `end_clock`).
  const options_type& options() const noexcept { return shell_.options(); }

  /// Ends the run early: `async_run` starts no clock once the worker's clock has reached
  /// `clock` (clocks, as `worker_options::end_clock`; the earlier of the two wins), finishes
  /// the clock in progress, leaves the servers and completes with success. For a fixed amount
  /// of work split between workers at run time (elastic membership lets the others go on
  /// without it). Precondition: on `transport.get_executor()`, e.g. from `on_clock`.
  void stop_at(clock_value clock) noexcept { shell_.stop_at(clock); }

  /// Ends the run now, for an owner that gives up on it (another node failed, a signal):
  /// `async_run` starts no further clock, connection attempt or reconnect, lets the step in
  /// progress finish (a gradient being computed runs to its end; a connection still in its
  /// handshake is closed; a reconnect's backoff wait ends at once), says `bye` to the servers
  /// it is connected to and completes with `errc::stopped`. Idempotent. Precondition: on
  /// `transport.get_executor()` (post it there from another thread). `local_cluster` stops every
  /// worker this way when a node fails.
  void stop() noexcept { shell_.stop(); }

 private:
  shell_type shell_;
};

/// The TCP worker most programs use: `basic_worker` over `tcp_transport`, with no recovery
/// unless named. Example: `asyncps::worker<my_model, consistency::ssp<3>>`.
template <checked_model Model, consistency_policy Consistency,
          recovery_policy Recovery = recovery::none>
using worker = basic_worker<Model, tcp_transport, Consistency, Recovery>;

}  // namespace asyncps

#if defined(ASYNCPS_SEPARATE_COMPILATION)
#include "asyncps/consistency/policies.hpp"

namespace asyncps::detail {
// Separate compilation (docs/build_time.md): the shells of the two most common TCP workers,
// BSP and SSP with its bound set at run time (`ssp<>`), no recovery, for a model with dense
// reads and gradients and a plain `compute_gradient` (whatever its type: the model is behind
// a model_ref), are compiled once, in asyncps/src.hpp; a translation unit that uses them
// generates none of their coroutines. Other configurations are generated where they are used.
extern template class worker_shell<model_ref<false, false, false>, tcp_transport, consistency::bsp,
                                   recovery::none>;
extern template class worker_shell<model_ref<false, false, false>, tcp_transport,
                                   consistency::ssp<>, recovery::none>;
}  // namespace asyncps::detail
#endif
