// asyncps — recovery::none: a lost server ends the run with a clear error.
#pragma once

#include <string_view>

#include "asyncps/recovery.hpp"
#include "asyncps/recovery/none/server_part.hpp"
#include "asyncps/recovery/none/worker_part.hpp"

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
  /// Servers may run with elastic membership (`server_options::elastic`): there is no
  /// per-worker recovery state to keep across members joining and leaving.
  static constexpr bool elastic_membership = true;
  using server_part = none_server_part;
  using worker_part = none_worker_part;
};

static_assert(recovery_policy<none>);
static_assert(allows_elastic_membership_v<none>);

}  // namespace asyncps::recovery
