// asyncps — recovery::chain_replication, worker part: failover to the shard's next server;
// strict mode keeps every push until the tail acknowledges it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <system_error>
#include <vector>

#include "asyncps/detail/ring.hpp"
#include "asyncps/error.hpp"
#include "asyncps/recovery.hpp"
#include "asyncps/recovery/chain/errors.hpp"
#include "asyncps/recovery/chain/options.hpp"
#include "asyncps/recovery/worker_hooks.hpp"

namespace asyncps::recovery {

/// recovery::chain_replication, worker part: reconnect, trying the shard's other servers
/// (`worker_options::replicas`; a member that is not the head refuses with `chain_errc::not_head`,
/// and the worker tries the next). Strict mode: every push and clock message asks for an ack and
/// is kept (its payload shared, not copied) until acknowledged; after a failover the hello
/// carries the clock of the oldest unacknowledged push and they are resent in order (the new
/// head drops those it has), so none is counted as lost; the worker waits before its next
/// gradient while a shard has `chain_options::max_unacked` of them, and before finishing
/// until all are acknowledged. Relaxed mode declares no hook: pushes a restored server lacks
/// count in `worker_stats::lost_pushes`. Thread safety: the worker's executor.
template <chain_mode Mode>
struct chain_worker_part {
  static constexpr bool strict = Mode == chain_mode::strict;
  chain_options options{};

  recovery_action on_server_lost(std::error_code) const noexcept {
    return recovery_action::reconnect;
  }
  std::chrono::milliseconds reconnect_timeout() const noexcept { return options.reconnect_timeout; }

  /// Hook: a member that is not the head refuses workers with `chain_errc::not_head`, routine
  /// during a failover: try the shard's next server. `chain_errc::shard_lost`: every member
  /// holding the shard's state failed, so every push to it is lost; the link gives up.
  refusal_action on_refused(std::uint32_t, std::error_code code) const noexcept {
    if (code == chain_errc::not_head) return refusal_action::next_server;
    if (code == chain_errc::shard_lost) return refusal_action::lost;
    return refusal_action::fail;
  }

  /// Hook (strict): one list of unacknowledged messages per shard.
  void on_start(const worker_setup& s)
    requires strict
  {
    unacked_.resize(s.shards);
    max_unacked_ = std::max<std::uint32_t>(options.max_unacked, 1);
  }
  /// Hook (strict): the server has every push before the oldest unacknowledged one, so the
  /// worker rejoins at that push's clock.
  clock_value hello_clock(std::uint32_t shard, clock_value clock) const
    requires strict
  {
    const auto& u = unacked_[shard];
    return u.empty() ? clock : u.front().header.clock;
  }
  /// Hook (strict): the unacknowledged pushes are resent; nothing is lost or recounted.
  welcome_action on_welcome(const welcome_part&) const noexcept
    requires strict
  {
    return welcome_action::resend;
  }
  /// Hook (strict): every push and clock message asks for an ack.
  std::uint8_t push_flags() const noexcept
    requires strict
  {
    return frame_flags::want_ack;
  }
  /// Hook (strict): keeps `m` (payload shared) until acknowledged.
  void on_push(std::uint32_t shard, const message& m)
    requires strict
  {
    unacked_[shard].push_back(message{m.header, m.payload.share()});
  }
  /// Hook (strict): drops what `seq` acknowledges; wakes the worker when nothing is left or the
  /// list fell below `max_unacked`.
  bool on_ack(std::uint32_t shard, std::uint64_t seq)
    requires strict
  {
    auto& u = unacked_[shard];
    const bool full = u.size() >= max_unacked_;
    while (!u.empty() && u.front().header.seq <= seq) u.pop_front();
    return u.empty() || (full && u.size() < max_unacked_);
  }
  /// Hook (strict): flow control.
  bool flow_blocked(std::uint32_t shard) const noexcept
    requires strict
  {
    return unacked_[shard].size() >= max_unacked_;
  }
  /// Hook (strict): resends what the lost server never acknowledged, in order.
  void on_rejoin(rejoin_context& r)
    requires strict
  {
    const auto& u = unacked_[r.shard];
    for (std::size_t i = 0; i < u.size(); ++i) r.send(message{u[i].header, u[i].payload.share()});
  }
  /// Hook (strict): the pushes (not clock messages) to `shard` not acknowledged yet.
  std::uint64_t unacknowledged(std::uint32_t shard) const noexcept
    requires strict
  {
    const auto& u = unacked_[shard];
    std::uint64_t n = 0;
    for (std::size_t i = 0; i < u.size(); ++i) n += u[i].header.type == message_type::push;
    return n;
  }
  /// Hook (strict): unacknowledged pushes keep the worker running.
  bool has_pending(std::uint32_t shard, bool) const noexcept
    requires strict
  {
    return !unacked_[shard].empty();
  }

 private:
  std::vector<detail::ring<message>> unacked_;  // per shard, oldest first
  std::uint32_t max_unacked_ = 64;
};

static_assert(check_worker_part<chain_worker_part<chain_mode::strict>>());
static_assert(check_worker_part<chain_worker_part<chain_mode::relaxed>>());

}  // namespace asyncps::recovery
