// asyncps — recovery::chain_replication: every shard is served by a chain of servers
// head -> ... -> tail; a backup takes over when a server fails.
//
// Strict mode follows van Renesse & Schneider (OSDI'04): the head applies a worker's push,
// forwards it down the chain, and the worker's push is acknowledged once the tail applied it;
// each server keeps what it forwarded until its successor acknowledges it and resends it when
// its successor changes. Relaxed mode follows paper A (Cao et al.): the head sends its whole
// shard to its successor every N pushes, and a server acknowledges only to its predecessor.
//
// Membership is decided by a chain master (`basic_chain_master`, chain/master.hpp) as in van
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
#include "asyncps/recovery/chain/errors.hpp"
#include "asyncps/recovery/chain/options.hpp"
#include "asyncps/recovery/chain/server_part.hpp"
#include "asyncps/recovery/chain/worker_part.hpp"

namespace asyncps::recovery {

/// Chain replication of every server shard (`Mode` = strict or relaxed).
///
/// Deployment: per shard, `members` servers (one `basic_server` each, `set_chain` called
/// before `async_serve`), one `basic_chain_master` for all shards, and workers whose
/// `worker_options::replicas[s]` list shard s's other members (they try them in turn when the
/// head is lost; a server that is not the head refuses them with `chain_errc::not_head`).
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

  using server_part = chain_server_part<Mode>;
  using worker_part = chain_worker_part<Mode>;
  /// The policy's own error codes (recovery/chain/errors.hpp), carried in error frames.
  using error_enum = chain_errc;
  static constexpr chain_errc last_error = chain_errc::member_id_in_use;
};

static_assert(recovery_policy<chain_replication<chain_mode::strict>>);
static_assert(recovery_policy<chain_replication<chain_mode::relaxed>>);
static_assert(detail::has_policy_errors<chain_replication<chain_mode::strict>>);

}  // namespace asyncps::recovery
