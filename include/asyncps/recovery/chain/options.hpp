// asyncps — recovery::chain_replication: modes, options and endpoints (see
// recovery/chain_replication.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

namespace asyncps::recovery {

/// How a chain replicates (see `chain_replication`).
enum class chain_mode {
  strict,   ///< every push through the whole chain; acknowledged by the tail; none lost
  relaxed,  ///< the head's state copied down the chain every N pushes; next-hop acks only
};

/// Configuration of `chain_replication` (server part: heartbeats and the relaxed interval;
/// worker part: the reconnect timeout).
struct chain_options {
  /// How often a server sends a heartbeat to the chain master.
  std::chrono::milliseconds heartbeat_interval{100};
  /// How long a chain link (predecessor to successor) may carry nothing before a new
  /// `chain_hello` claiming the predecessor's member id may replace it. A predecessor sends its
  /// successor a heartbeat every `heartbeat_interval` besides its entries and states, so a link
  /// silent this long belongs to a process or host that is gone. Until then a second claim of
  /// the live predecessor's id is refused with the transient `chain_errc::member_id_in_use` and the
  /// live link stays (a real predecessor retries; it gets in once its old link is closed or
  /// silent this long). Keep it several times `heartbeat_interval`. 0: any claim replaces it.
  std::chrono::milliseconds link_silence{1000};
  /// Relaxed mode: pushes the head applies between two state copies to its successor.
  std::uint64_t replicate_every = 200;
  /// How long a worker keeps trying the shard's servers before failing with
  /// `errc::server_lost`.
  std::chrono::milliseconds reconnect_timeout{std::chrono::seconds(30)};
  /// Strict mode, worker part: unacknowledged pushes per shard beyond which the worker waits
  /// for acks before its next clock. Bounds the worker's memory (each kept push holds its
  /// clock's gradient buffer) and how far the head runs ahead of the tail. 0 counts as 1.
  std::uint32_t max_unacked = 64;
};

/// The endpoints one chain server needs: the chain master's, and every member of its shard's
/// chain (index = member id; `self` is this server's). Passed to `basic_server::set_chain`.
template <class Endpoint>
struct chain_endpoints {
  Endpoint master{};
  std::vector<Endpoint> members{};
  std::uint32_t self = 0;
};

}  // namespace asyncps::recovery
