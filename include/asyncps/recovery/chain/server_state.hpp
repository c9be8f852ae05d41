// asyncps — recovery::chain_replication, server part: the run-time state of one chain member
// (links, log, acks waiting for the tail). Used by chain_server_part only.
#pragma once

#include <chrono>
#include <cstdint>

#include "asyncps/detail/ring.hpp"
#include "asyncps/detail/server/hooks.hpp"
#include "asyncps/recovery/chain/server_stats.hpp"
#include "asyncps/shard_state.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::detail {

/// A member id that names no member (no predecessor: the head; no successor: the tail).
inline constexpr std::uint32_t chain_no_member = 0xffffffffu;

struct chain_pending_ack {
  std::uint64_t index;  // log position that must be committed first
  std::uint32_t worker;
  std::uint64_t seq;
};
// Run-time state: one registration with the master and the links of this member.
struct chain_runtime {
  session_base* master = nullptr;  // link to the chain master
  session_base* pred = nullptr;    // incoming link from the predecessor
  session_base* succ = nullptr;    // outgoing link to the successor
  std::uint32_t pred_member = chain_no_member;
  std::uint32_t succ_member = chain_no_member;
  std::int64_t epoch = 0;
  bool head = false;         // serves workers
  bool serving = false;      // got a configuration since registering
  bool first_config = true;  // the next configuration is the first of a registration
  bool fresh = false;        // joined a running chain: waits for a state transfer
  // Made head while fresh: every member that held the shard's state failed. Refuses workers
  // with chain_errc::shard_lost (never serves its initial values); `lost_epoch` is when.
  bool lost = false;
  std::int64_t lost_epoch = 0;
  // The links' schedules (the part's timers and connects; see server_part_links.ipp).
  bool master_connecting = false;                // a connect to the master is in flight
  bool succ_linking = false;                     // a successor is configured: its link is kept
  bool succ_connecting = false;                  // a connect to the successor is in flight
  std::uint32_t succ_target = chain_no_member;   // the member that connect is to
  std::chrono::milliseconds master_backoff{10};  // pause before the next master connect
  std::chrono::milliseconds succ_backoff{1};     // pause before the next successor connect
  std::uint64_t log_index = 0;                   // entries applied (strict) or pushes (relaxed)
  std::uint64_t committed = 0;                   // entries the tail has (strict)
  std::uint64_t since_copy = 0;                  // relaxed: pushes since the last state copy
  ring<message> sent;                            // strict: entries forwarded, not acked by the tail
  std::uint64_t sent_first = 0;                  // log position of sent.front()
  ring<chain_pending_ack> pending_acks;          // head: worker acks waiting for the tail
  shard_state incoming{};                        // state transfer buffers (reused)
  shard_state outgoing{};
  recovery::chain_stats stats{};
};

}  // namespace asyncps::detail
