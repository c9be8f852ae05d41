// asyncps — recovery::chain_replication, worker part: failover to the shard's next server.
#pragma once

#include <chrono>
#include <system_error>

#include "asyncps/recovery.hpp"
#include "asyncps/recovery/chain/options.hpp"

namespace asyncps::recovery {

/// recovery::chain_replication, worker part: reconnect, trying the shard's other servers. Thread
/// safety: worker's executor.
template <chain_mode Mode>
struct chain_worker_part {
  chain_options options{};
  /// Strict mode: pushes ask for an ack and are kept until acked, then resent on failover.
  static constexpr bool acknowledged_pushes = Mode == chain_mode::strict;
  recovery_action on_server_lost(std::error_code) const noexcept {
    return recovery_action::reconnect;
  }
  std::chrono::milliseconds reconnect_timeout() const noexcept { return options.reconnect_timeout; }
};

}  // namespace asyncps::recovery
