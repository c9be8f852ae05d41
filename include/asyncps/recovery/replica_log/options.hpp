// asyncps — recovery::replica_log (SWIFT): its options (see recovery/replica_log.hpp).
#pragma once

#include <chrono>
#include <cstdint>

#include "asyncps/layout.hpp"

namespace asyncps::recovery {

/// Configuration of `recovery::replica_log`. The server part reads `replica_interval`,
/// `recovery_timeout` and `void_timeout`; the worker part reads `reconnect_timeout`.
struct replica_log_options {
  /// Server clocks between two state replicas (the logging interval of SWIFT's selective
  /// logging): every this many clocks the shard sends its whole state (parameters and
  /// optimizer state) to one worker, and once it is stored the workers drop their log
  /// entries it contains. A longer interval holds more log (bytes of pushes per worker) and
  /// replays more after a failure; a shorter one sends the shard more often. >= 1.
  clock_value replica_interval = 10;
  /// How long a restarted shard waits for every worker's replica and log before it rebuilds
  /// from what it has (counting the positions it cannot replay).
  std::chrono::milliseconds recovery_timeout{std::chrono::seconds(30)};
  /// How long a shard keeps a disconnected worker's pushes that it ordered but the worker has
  /// not confirmed (later pushes wait behind them) before it drops them (counted in
  /// `replica_log_stats::voided`).
  std::chrono::milliseconds void_timeout{std::chrono::seconds(30)};
  /// How long a worker keeps reconnecting to a lost shard before failing with
  /// `errc::server_lost`.
  std::chrono::milliseconds reconnect_timeout{std::chrono::minutes(10)};
};

}  // namespace asyncps::recovery
