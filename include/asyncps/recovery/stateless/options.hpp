// asyncps — recovery::stateless: the merge rules and options (see recovery/stateless.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

namespace asyncps::recovery {

/// How a server merges the updates a worker accumulated while the server was unreachable.
enum class merge_rule {
  sum,   ///< apply the summed gradient as is (what the worker applied to its own copy)
  mean,  ///< divide by the number of clocks it holds
  /// Cao et al. (paper A): scale by `stateless_options::large_backlog_scale` (0.1, i.e. the
  /// learning rate / 10) when the backlog holds more than `large_backlog` clocks, else sum.
  lr_scaled,
  /// Zhang et al. (IJCAI'16): divide by the staleness tau = server clock at the merge minus
  /// the server clock of the rows the first buffered gradient was computed on (tau >= 1).
  staleness_aware,
};

/// Configuration of `recovery::stateless` (server part: the merge; worker part: the timeout).
struct stateless_options {
  merge_rule rule = merge_rule::lr_scaled;
  std::uint64_t large_backlog = 50;  ///< clocks; beyond this `lr_scaled` scales the backlog
  float large_backlog_scale = 0.1f;  ///< the scale `lr_scaled` applies to a large backlog
  /// A bound on the magnitude of every value of a replica a restarted server installs (0: no
  /// bound). A replica with a value above it is implausible: it is refused with
  /// `errc::bad_state` (its sender's connection is closed) and the table waits for another
  /// worker's replica. Set it above any value the model's parameters can reach: a real
  /// worker's replica refused so is sent again on every reconnect and refused again.
  float max_replica_value = 0.0f;
  /// How long a worker keeps reconnecting (while training on) before failing with
  /// `errc::server_lost`.
  std::chrono::milliseconds reconnect_timeout{std::chrono::minutes(10)};
};

/// The name of a merge rule, as the trainer's `--merge` flag spells it.
constexpr std::string_view to_string(merge_rule r) noexcept {
  switch (r) {
    case merge_rule::sum: return "sum";
    case merge_rule::mean: return "mean";
    case merge_rule::lr_scaled: return "lr-scaled";
    case merge_rule::staleness_aware: return "staleness-aware";
  }
  return "?";
}

}  // namespace asyncps::recovery
