// asyncps — recovery::none: a lost server ends the run with a clear error.
#pragma once

#include <chrono>
#include <string_view>
#include <system_error>

#include "asyncps/recovery.hpp"

namespace asyncps::recovery {

/// No recovery: when a worker loses a server it ends its run with `errc::server_lost`
/// (never a hang: waits for rows are bounded by `worker_options::wait_timeout`).
struct none {
  static constexpr std::string_view name = "none";
  struct server_part {};
  struct worker_part {
    recovery_action on_server_lost(std::error_code) const noexcept { return recovery_action::fail; }
    std::chrono::milliseconds reconnect_timeout() const noexcept { return {}; }
  };
};

static_assert(recovery_policy<none>);

}  // namespace asyncps::recovery
