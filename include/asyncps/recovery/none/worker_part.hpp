// asyncps — recovery::none, worker part: a lost server ends the run (after an optional grace).
#pragma once

#include <chrono>
#include <system_error>

#include "asyncps/recovery.hpp"

namespace asyncps::recovery {

/// recovery::none, worker part. Thread safety: the worker's executor.
struct none_worker_part {
  /// How long to try reconnecting to a lost server before `errc::server_lost`; 0 (the
  /// default): fail at once.
  std::chrono::milliseconds grace{0};
  recovery_action on_server_lost(std::error_code) const noexcept {
    return grace.count() > 0 ? recovery_action::reconnect : recovery_action::fail;
  }
  std::chrono::milliseconds reconnect_timeout() const noexcept { return grace; }
};

}  // namespace asyncps::recovery
