// asyncps — recovery::none: a lost server ends the run with a clear error.
#pragma once

#include <chrono>
#include <string_view>
#include <system_error>

#include "asyncps/recovery.hpp"

namespace asyncps::recovery {

/// No recovery: when a worker loses a server it ends its run with `errc::server_lost`
/// (never a hang: waits for rows are bounded by `worker_options::wait_timeout`).
///
/// With a `grace` period the worker first tries to reconnect for that long, which rides out a
/// dropped connection to a server that is still alive. A server that answers but no longer
/// has this worker's pushes (it restarted without state) ends the run too: `none` never
/// trains on from a server that lost its parameters.
struct none {
  static constexpr std::string_view name = "none";
  struct server_part {};
  struct worker_part {
    /// How long to try reconnecting to a lost server before `errc::server_lost`; 0 (the
    /// default): fail at once.
    std::chrono::milliseconds grace{0};
    recovery_action on_server_lost(std::error_code) const noexcept {
      return grace.count() > 0 ? recovery_action::reconnect : recovery_action::fail;
    }
    std::chrono::milliseconds reconnect_timeout() const noexcept { return grace; }
  };
};

static_assert(recovery_policy<none>);

}  // namespace asyncps::recovery
