// asyncps — recovery::replica_log: SWIFT-style recovery of a lost shard from the workers'
// replicas and logs, bit-exact (paper B: Zhong et al., "SWIFT: Expedited Failure Recovery for
// Large-scale DNN Training").
#pragma once

#include <string_view>

#include "asyncps/recovery.hpp"
#include "asyncps/recovery/replica_log/options.hpp"
#include "asyncps/recovery/replica_log/server_part.hpp"
#include "asyncps/recovery/replica_log/worker_part.hpp"

namespace asyncps::recovery {

/// Rebuild a restarted shard from a state replica the workers hold, then replay the updates
/// the replica lacks from the workers' logs in the order the dead server applied them.
///
/// * Ordering. The shard gives every push and clock message an apply position (1, 2, ...)
///   and tells its worker, one `order` per worker clock; the worker logs the positions with
///   its pushes (payload shared, not copied) and confirms them with one cumulative `commit`;
///   the shard applies updates strictly in
///   position order, each only once confirmed (a write-ahead rule with the log on the
///   workers). Whatever a worker sends after a push waits behind it (a pull is answered after
///   the worker's earlier pushes are applied), so every consistency policy keeps its meaning.
/// * Replicas (selective logging). Every `replica_interval` server clocks the shard sends its
///   whole state (parameters, optimizer state, clocks, counts) to one worker, in turn; once
///   stored, its position is *stable* and every worker drops its entries up to it. The log
///   therefore holds about `replica_interval` clocks of a worker's own pushes;
///   `replica_log_options::log_budget` (off by default) also sends the next replica once a
///   worker's pushes since the stable position exceed that many encoded shard states, which
///   bounds the log by bytes (issue 34).
/// * Rebuild. A restarted shard meets a worker that holds a log (its hello says so): it
///   holds every message, asks every worker for its replica and log, and when all have sent
///   them (or after `recovery_timeout`) installs the newest replica (or the seeded initial
///   state), applies the logged entries after it in position order, and serves. Workers are
///   idle meanwhile (they reconnect with backoff); the replay is spread over the workers,
///   each resending only its own entries.
///
/// Promise: when the workers that pushed since the stable position are alive and reach the
/// restarted shard, the rebuilt parameters and optimizer state are bit-identical to the dead
/// server's at its death (with any updates it had ordered and its workers had logged but it
/// had not applied yet, applied after them in their order), under every consistency policy and
/// optimizer, also when the shard dies again during the rebuild; nothing acknowledged or
/// logged is lost or applied twice. Worse failures end in a counted, logged outcome, never a
/// silent one: a worker that dies with entries the rebuild needs, or the loss of the newest
/// replica, leaves positions missing (`replica_log_stats::missing_positions`,
/// `incomplete_recoveries`) and the rebuild goes on without them.
/// Costs: one order and one commit message per worker clock and shard (and an extra round trip
/// before the clock's updates are applied; `replica_log_ordering::apply_first`: the order
/// alone, no round trip), the log (`replica_log_worker_stats::log_bytes`), one shard state per
/// `replica_interval` clocks on the wire and one stored copy on one worker. See
/// docs/recovery/swift.md.
struct replica_log {
  static constexpr std::string_view name = "replica-log";

  using server_part = replica_log_server_part;
  using worker_part = replica_log_worker_part;
};

static_assert(recovery_policy<replica_log>);

}  // namespace asyncps::recovery
