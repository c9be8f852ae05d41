// asyncps — recovery::none, worker part: a lost server ends the run (after an optional grace).
#pragma once

#include <chrono>
#include <system_error>

#include "asyncps/recovery.hpp"
#include "asyncps/recovery/worker_hooks.hpp"

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
  /// Hook: a server that answers without some of this worker's pushes (it restarted without
  /// state) ends the run; `none` never trains on from a server that lost its parameters.
  welcome_action on_welcome(const welcome_part& w) const noexcept {
    return w.applied < w.pushed ? welcome_action::give_up : welcome_action::count_lost;
  }
};

static_assert(check_worker_part<none_worker_part>());

}  // namespace asyncps::recovery
