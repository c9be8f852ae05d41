// asyncps — recovery::stateless, server part: installs replicas and merges backlogs.
#pragma once

#include <cstdint>

#include "asyncps/recovery/stateless/options.hpp"
#include "asyncps/table.hpp"

namespace asyncps::recovery {

/// recovery::stateless, server part: the merge rule. Thread safety: on the server's executor.
struct stateless_server_part {
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

}  // namespace asyncps::recovery
