// asyncps — recovery::chain_replication: every shard is served by a chain of servers
// head -> ... -> tail; a backup takes over when a server fails.
//
// Strict mode follows van Renesse & Schneider (OSDI'04): the head applies a worker's push,
// forwards it down the chain, and the worker's push is acknowledged once the tail applied it;
// each server keeps what it forwarded until its successor acknowledges it and resends it when
// its successor changes. Relaxed mode follows paper A (Cao et al.): the head sends its whole
// shard to its successor every N pushes, and a server acknowledges only to its predecessor.
//
// Membership is decided by a chain master (`basic_chain_master`, chain_master.hpp) as in van
// Renesse: every server registers with it and sends heartbeats; on a failure it tells the
// neighbours their new predecessor/successor, and a restarted server joins as the new tail
// after a state transfer from the old tail. See docs/recovery/chain_replication.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>
#include <system_error>
#include <vector>

#include "asyncps/recovery.hpp"

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
  /// Relaxed mode: pushes the head applies between two state copies to its successor.
  std::uint64_t replicate_every = 200;
  /// How long a worker keeps trying the shard's servers before failing with
  /// `errc::server_lost`.
  std::chrono::milliseconds reconnect_timeout{std::chrono::seconds(30)};
};

/// The endpoints one chain server needs: the chain master's, and every member of its shard's
/// chain (index = member id; `self` is this server's). Passed to `basic_server::set_chain`.
template <class Endpoint>
struct chain_endpoints {
  Endpoint master{};
  std::vector<Endpoint> members{};
  std::uint32_t self = 0;
};

/// Chain replication of every server shard (`Mode` = strict or relaxed).
///
/// Deployment: per shard, `members` servers (one `basic_server` each, `set_chain` called
/// before `async_serve`), one `basic_chain_master` for all shards, and workers whose
/// `worker_options::replicas[s]` list shard s's other members (they try them in turn when the
/// head is lost; a server that is not the head refuses them with `errc::not_head`).
///
/// Promises. Strict: an acknowledged push is applied by every server of the chain, so it
/// survives any failure that leaves one server of the chain alive; a worker resends its
/// unacknowledged pushes to the new head, which drops those it already has (by the worker's
/// push sequence number): none is lost and none is applied twice. Relaxed: a failover loses
/// the pushes the head applied since its last copy (at most `replicate_every`; workers count
/// them in `worker_stats::lost_pushes`).
/// Costs. Strict: every push crosses every link of the chain once, plus one ack per push per
/// link; the head keeps unacknowledged pushes (shared payload buffers, no copy) and workers
/// keep theirs until acked. Relaxed: one copy of the shard per `replicate_every` pushes per
/// link. Both: (members - 1) extra servers per shard; workers are idle during a failover
/// (failure detection plus reconnect, about one heartbeat interval plus the master's timeout).
/// Reads are served by the head (they may reflect pushes not yet at the tail).
template <chain_mode Mode = chain_mode::strict>
struct chain_replication {
  static constexpr std::string_view name =
      Mode == chain_mode::strict ? "chain-replication" : "chain-replication-relaxed";
  static constexpr chain_mode mode = Mode;

  /// Server part: options and counters. Thread safety: on the server's executor.
  struct server_part {
    chain_options options{};
  };

  /// Worker part: reconnect, trying the shard's other servers. Thread safety: worker's
  /// executor.
  struct worker_part {
    chain_options options{};
    /// Strict mode: pushes ask for an ack and are kept until acked, then resent on failover.
    static constexpr bool acknowledged_pushes = Mode == chain_mode::strict;
    recovery_action on_server_lost(std::error_code) const noexcept {
      return recovery_action::reconnect;
    }
    std::chrono::milliseconds reconnect_timeout() const noexcept {
      return options.reconnect_timeout;
    }
  };
};

/// Whether `R` is a `chain_replication` policy (the server and worker loops then run the
/// chain protocol).
template <class R>
inline constexpr bool is_chain_replication_v = false;
template <chain_mode M>
inline constexpr bool is_chain_replication_v<chain_replication<M>> = true;

static_assert(recovery_policy<chain_replication<chain_mode::strict>>);
static_assert(recovery_policy<chain_replication<chain_mode::relaxed>>);

}  // namespace asyncps::recovery
