// asyncps — recovery::stateless: workers train through a server outage (paper A).
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>
#include <system_error>

#include "asyncps/recovery.hpp"
#include "asyncps/table.hpp"

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
  /// How long a worker keeps reconnecting (while training on) before failing with
  /// `errc::server_lost`.
  std::chrono::milliseconds reconnect_timeout{std::chrono::minutes(10)};
};

/// The *stateless parameter server* of Cao et al., "Training Through Failure" (paper A):
/// the server's state can always be rebuilt from the workers.
///
/// * While a shard is unreachable a worker keeps computing on its cached rows, applies its
///   own updates to them (`worker_options::local_step`), and adds each clock's gradient to
///   one backlog buffer per row range (memory stays bounded however long the outage). It is
///   never idle: the other shards keep being pushed and pulled as usual.
/// * It reconnects with backoff. A server that comes back *without state* (a fresh process:
///   it has applied nothing but meets a worker whose clock is > 0) asks for replicas in its
///   welcome; the first worker's cached rows rebuild each table, and that worker's backlog is
///   already part of them. A server that comes back *with state* (restored by the user, e.g.
///   from its own checkpoint via `basic_server::restore_state`) rebuilds nothing.
/// * Every other backlog is merged once, with `stateless_options::rule`.
/// * A server that kept its state but misses pushes that were on the wire when the link
///   dropped (its welcome's applied counts say so) gets their gradients in the backlog.
///
/// Promise: every delta a worker computes while a shard is down is applied exactly once (a
/// worker finishing its run during an outage waits, within `reconnect_timeout`, to deliver
/// it). A server rebuilt *without state* lacks the pushes the dead server applied after the
/// installed replica's last read of them: at most s+1 clocks per other worker under SSP(s)
/// (tests/unit/recovery_test.cpp measures this). Cost: one float per parameter of backlog
/// memory per worker during an outage, one replica message per table on restart.
/// Optimizer state (momentum, Adam moments) is not replicated and restarts at zero.
struct stateless {
  static constexpr std::string_view name = "stateless";

  /// Server part: the merge rule. Thread safety: on the server's executor.
  struct server_part {
    stateless_options options{};

    /// The factor a backlog of `clocks` clocks, `staleness` clocks old, is scaled by.
    float backlog_scale(std::uint64_t clocks, clock_value staleness) const noexcept {
      switch (options.rule) {
        case merge_rule::sum: return 1.0f;
        case merge_rule::mean: return clocks > 0 ? 1.0f / static_cast<float>(clocks) : 1.0f;
        case merge_rule::lr_scaled:
          return clocks > options.large_backlog ? options.large_backlog_scale : 1.0f;
        case merge_rule::staleness_aware:
          return 1.0f / static_cast<float>(staleness > 1 ? staleness : 1);
      }
      return 1.0f;
    }
  };

  /// Worker part: keep training locally and reconnect. Thread safety: worker's executor.
  struct worker_part {
    stateless_options options{};
    recovery_action on_server_lost(std::error_code) const noexcept {
      return recovery_action::continue_local;
    }
    std::chrono::milliseconds reconnect_timeout() const noexcept {
      return options.reconnect_timeout;
    }
  };
};

static_assert(recovery_policy<stateless>);

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
