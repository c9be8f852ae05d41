// asyncps — the configuration and the counters of one worker (`basic_worker`, worker.hpp):
// `worker_options`, `worker_stats`, and `clock_report`, what a worker reports after each clock.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "asyncps/layout.hpp"
#include "asyncps/log.hpp"
#include "asyncps/table.hpp"

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

/// `worker_options::push_window` when unset, at clocks where the consistency policy sets no
/// bound on reads (ASP): 2 clocks per server, so that a clock's gradient is computed while the
/// previous clock's pushes travel.
inline constexpr std::uint32_t default_push_window = 2;

/// Configuration of one worker.
template <class Endpoint>
struct worker_options {
  std::uint32_t id = 0;             ///< worker id, < the servers' num_workers
  std::vector<Endpoint> servers{};  ///< shard s listens at servers[s]
  /// replicas[s] are shard s's other servers (empty or absent: none), e.g. the other members
  /// of a replication chain. When the worker cannot connect to the one it uses, loses it, or is
  /// refused with a code its recovery policy calls routine (`on_refused` answers
  /// `refusal_action::next_server`, as chain replication does for
  /// `recovery::chain_errc::not_head`), it tries them in turn, then servers[s] again, until one
  /// accepts it.
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
  /// How long a server this worker waits for (a pull of it pending) may stay silent, sending
  /// nothing at all (rows, acks, heartbeat reports), before the worker takes it for lost:
  /// closes the connection and lets the recovery policy act as on a failed connection
  /// (reconnect, fail over to a chain's next server, train on locally). A host that
  /// disappears (link down, power loss) closes no connection, and TCP can take many minutes to
  /// notice. A server sends a heartbeat report to every worker whose pull has waited
  /// `server_options::watchdog_interval` (default 5 s), so keep this above twice that. 0:
  /// never (only `wait_timeout` ends a wait).
  std::chrono::milliseconds silence_timeout{std::chrono::seconds(15)};
  /// How long to keep retrying the first connection to a server (servers may start later).
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(10)};
  /// Clocks of pushes this worker may have in flight per server: sent, and not yet
  /// acknowledged as applied. Before it computes a clock, the worker waits until fewer than
  /// this many of its clocks are unacknowledged on every server that is up; the last push of a
  /// clock then asks for an ack (`frame_flags::want_ack`, one header-only reply per clock and
  /// server). A pull request travels on the same connection behind the pushes sent before it,
  /// so the window also bounds how long a pull waits behind this worker's own pushes, i.e. how
  /// stale its reads get when its link is slower than its compute (ASP with many workers).
  /// Unset (the default): `default_push_window` at clocks where the consistency policy sets no
  /// bound on reads (`min_server_clock(c) == no_clock`: ASP), and no window where it does
  /// (BSP and SSP already bound a worker's unapplied clocks) or for value-bounded policies (VAP
  /// bounds its in-transit updates itself). 0: no window. Counted in
  /// `worker_stats::window_waits`. Follows the bounded delay of a worker's outstanding
  /// requests in Li et al., "Scaling Distributed Machine Learning with the Parameter Server"
  /// (OSDI 2014).
  std::optional<std::uint32_t> push_window{};
  /// Names this worker process in its hellos (`protocol::hello::incarnation`). Unset (the
  /// default) or 0: a random 64-bit value drawn from `std::random_device` once per worker
  /// object. A server that sees the worker's id on a new connection lets it take the id over
  /// (closing the old connection) and tells it the highest sequence number it applied from
  /// the id, so a restarted worker's pushes are never taken for its old ones. Give a value
  /// only to keep the same incarnation across worker objects of one process.
  std::optional<std::uint64_t> incarnation{};
  /// The clock at which the run ends even when fewer than `async_run`'s `clocks` have run:
  /// the worker stops once its clock reaches this value. For a job with an end clock that
  /// workers may join late (elastic membership: a joiner starts at the server clock, and a
  /// restarted worker where its shard's clock stands), so that every member stops at the same
  /// clock. Unset (the default): only `clocks` counts.
  std::optional<clock_value> end_clock{};
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
  /// Pushes a server no longer had when this worker reconnected (lost by a restore), when
  /// the recovery policy counts them as lost (see `welcome_action`). The policy's own
  /// counters are in its part: `recovery().stats()`.
  std::uint64_t lost_pushes = 0;
  /// Of `lost_pushes`, those the server had acknowledged (strict chain replication: the tail
  /// had applied them) and yet were lost: with a whole shard
  /// (`recovery::chain_errc::shard_lost`).
  std::uint64_t lost_acknowledged = 0;
  /// Shards whose whole state this worker learned is gone for good: a server refused it with
  /// a code its recovery policy answered `refusal_action::lost` (chain replication:
  /// `recovery::chain_errc::shard_lost`, every server of the chain failed). Each is logged
  /// with the pushes lost with it, counted in `lost_pushes`.
  std::uint64_t shards_lost = 0;
  /// Clocks whose gradient was dropped, not pushed: while it was computed a shard this worker
  /// had left welcomed it back at a later clock (elastic membership; pushed under the old
  /// clock the server refuses it, under the new one it would break the consistency bound).
  std::uint64_t dropped_clocks = 0;
  /// VAP: clocks whose push waited for earlier updates to become visible, and how long.
  std::uint64_t value_waits = 0;
  double value_wait_seconds = 0;  ///< included in `wait_seconds`
  /// Clocks that waited, before computing, for acks of this worker's earlier clocks (the push
  /// window, `worker_options::push_window`); the time is in `wait_seconds`.
  std::uint64_t window_waits = 0;
  /// Allocation failures (`std::bad_alloc`, `std::length_error`) caught in the worker's
  /// loops; the first ended the run with `errc::resource_exhausted`.
  std::uint64_t out_of_memory = 0;
};

}  // namespace asyncps
