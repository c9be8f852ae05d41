// asyncps — recovery::stateless, worker part: trains on through an outage and buffers deltas.
#pragma once

#include <chrono>
#include <system_error>

#include "asyncps/recovery.hpp"
#include "asyncps/recovery/stateless/options.hpp"

namespace asyncps::recovery {

/// recovery::stateless, worker part: keep training locally and reconnect. Thread safety: worker's
/// executor.
struct stateless_worker_part {
  stateless_options options{};
  recovery_action on_server_lost(std::error_code) const noexcept {
    return recovery_action::continue_local;
  }
  std::chrono::milliseconds reconnect_timeout() const noexcept { return options.reconnect_timeout; }
};

}  // namespace asyncps::recovery
