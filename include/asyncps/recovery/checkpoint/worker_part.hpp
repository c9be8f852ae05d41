// asyncps — recovery::checkpoint, worker part: reconnect to a lost (restarting) server.
#pragma once

#include <chrono>
#include <system_error>

#include "asyncps/recovery.hpp"
#include "asyncps/recovery/checkpoint/options.hpp"

namespace asyncps::recovery {

/// recovery::checkpoint, worker part: a lost server is reconnected to (the restarted server
/// restores its newest checkpoint; its welcome tells the worker its clock and pushes as
/// restored, so the worker learns how many of its pushes were lost). Thread safety: the
/// worker's executor.
class checkpoint_worker_part {
 public:
  /// Reconnect timeout 30 s.
  checkpoint_worker_part() = default;
  /// Reconnect timeout `o.reconnect_timeout`.
  explicit checkpoint_worker_part(const checkpoint_options& o) noexcept
      : timeout_(o.reconnect_timeout) {}
  /// Reconnect timeout `timeout`.
  explicit checkpoint_worker_part(std::chrono::milliseconds timeout) noexcept : timeout_(timeout) {}

  /// Always `recovery_action::reconnect`: any loss (transient or not) may be a server that
  /// is restarting; `reconnect_timeout()` bounds the attempt.
  recovery_action on_server_lost(std::error_code) const noexcept {
    return recovery_action::reconnect;
  }
  /// How long the worker may try to reconnect before ending with `errc::server_lost`.
  std::chrono::milliseconds reconnect_timeout() const noexcept { return timeout_; }

 private:
  std::chrono::milliseconds timeout_{30000};
};

}  // namespace asyncps::recovery
