// asyncps — recovery::replica_log (SWIFT): its options (see recovery/replica_log.hpp).
#pragma once

#include <chrono>
#include <cstdint>

#include "asyncps/layout.hpp"

namespace asyncps::recovery {

/// When a shard applies a worker's push or clock message relative to the worker logging the
/// position the shard gave it (`replica_log_options::ordering`).
enum class replica_log_ordering : std::uint8_t {
  /// The write-ahead rule (the default): the shard sends the positions of a worker's clock
  /// (one `order` when the clock's last message arrives) and applies the clock's updates only
  /// once the worker has logged them (one cumulative `commit`). A rebuild with every worker's
  /// log is bit-exact. Cost: one network round trip between the arrival of a clock's last
  /// message and the apply of its updates, during which the worker's later messages wait.
  write_ahead,
  /// Apply on arrival, the positions follow: the shard applies each update at once and sends
  /// the clock's `order` after its last update, before the clock's ack (flag
  /// `protocol::applied_flag`: the worker logs the positions and answers no `commit`). No round
  /// trip before an apply. A rebuild is still exactly-once (every update
  /// applied once: the replica's per-worker sequence numbers drop a resent update it holds),
  /// but an update whose order was lost with the connection is resent and applied after the
  /// replayed ones, so the rebuilt state may differ in the order of those updates: such a
  /// rebuild is counted in `replica_log_stats::reordered_recoveries`, and reported as
  /// "exactly once, not bit-exact". Without lost orders the rebuild is bit-exact.
  apply_first,
};

/// Configuration of `recovery::replica_log`. The server part reads `replica_interval`,
/// `recovery_timeout`, `void_timeout`, `commit_timeout`, `ordering`, `log_budget` and
/// `ack_delay`; the worker part reads `reconnect_timeout`, `max_unacked`, `ordering` and
/// `ack_delay`. Both parts of a job must be given the same `ordering` and `ack_delay`.
struct replica_log_options {
  /// Server clocks between two state replicas (the logging interval of SWIFT's selective
  /// logging): every this many clocks the shard sends its whole state (parameters and
  /// optimizer state) to one worker, and once it is stored the workers drop their log
  /// entries it contains. A longer interval holds more log (bytes of pushes per worker) and
  /// replays more after a failure; a shorter one sends the shard more often. >= 1.
  clock_value replica_interval = 10;
  /// How long a restarted shard waits for every worker's replica and log before it rebuilds
  /// from what it has (counting the positions it cannot replay).
  std::chrono::milliseconds recovery_timeout{std::chrono::seconds(30)};
  /// How long a shard keeps a disconnected worker's pushes that it ordered but the worker has
  /// not confirmed (later pushes wait behind them) before it drops them (counted in
  /// `replica_log_stats::voided`).
  std::chrono::milliseconds void_timeout{std::chrono::seconds(30)};
  /// Write-ahead only: how long an ordered update its worker has not confirmed may keep the
  /// shard's later updates (every other worker's too) waiting before the shard acts on it.
  /// If the update's order has not gone out yet (its worker's clock has not ended), the order
  /// is sent at once and the wait starts again. If it went out, the worker's connection is
  /// closed, logged and counted (`replica_log_stats::commit_timeouts`): an honest worker
  /// reconnects and confirms what it logged, and the rest is voided at its rejoin's end, or
  /// after `void_timeout` if it stays away. If the worker has reconnected without confirming
  /// its closed connection's orders within this time, they are voided at once (counted in
  /// `voided` and `commit_timeouts`). So a worker that never confirms stalls the shard for at
  /// most about 2 x `commit_timeout` per connection it opens (the early order, then the
  /// close), plus `void_timeout` if it stays away; never for good. Checked every 50 ms; 0 is
  /// off (the behaviour before: an unconfirmed order of a connected worker waits forever).
  std::chrono::milliseconds commit_timeout{std::chrono::seconds(10)};
  /// How long a worker keeps reconnecting to a lost shard before failing with
  /// `errc::server_lost`.
  std::chrono::milliseconds reconnect_timeout{std::chrono::minutes(10)};
  /// Write-ahead (bit-exact rebuilds, one round trip per update) or apply-first (no round
  /// trip, exactly-once rebuilds); see `replica_log_ordering`. Read by both parts (a worker
  /// part under apply-first keeps every state replica above the stable position it learned,
  /// at most `protocol::max_held_replicas` per shard; under write-ahead only the newest).
  replica_log_ordering ordering = replica_log_ordering::write_ahead;
  /// A bound on each worker's log, as a multiple of one encoded shard state (the bytes of a
  /// state replica: parameters, optimizer state, clocks, counts). 0, the default: off, state
  /// replicas follow `replica_interval` alone (the behaviour before issue 34). Above 0: the
  /// shard also sends the next state replica (to the next worker, in turn) as soon as some
  /// worker's pushes ordered since the stable position hold more than `log_budget` times that
  /// many payload bytes; once it is stored every worker drops the entries it holds (the same
  /// truncation as before, triggered by bytes instead of clocks). A worker's log then holds at
  /// most about `log_budget` shards plus what it pushes during one replica's round trip (sent,
  /// stored, the new stable position carried to it by its next `order`). The cost: more
  /// replicas on the wire when workers push much per clock. Rebuilds are unchanged (bit-exact
  /// under write-ahead, exactly-once under apply-first). Counted by each server from its start
  /// (a rebuilt one counts the entries it replayed, which their workers hold until the next
  /// stored replica). Read by the server part only; must be finite and >= 0 (a negative or NaN
  /// value is off).
  double log_budget = 0;
  /// Apply-first only: how long a shard may hold back the ack of a worker's clock (with the
  /// clock's positions), so that one ack carries several clocks' positions instead of one ack
  /// per clock and shard. 0, the default: every clock is acknowledged at once (the behaviour
  /// before). Above 0: a worker that does not wait for its acks (not under VAP, without a push
  /// window) flags its pushes `protocol::ack_later_flag` while fewer than `max_unacked` / 2 of
  /// its entries per shard are unacknowledged, and the shard acknowledges them, cumulatively,
  /// when the worker next sends a push without the flag, when that many of its positions are
  /// waiting, or `ack_delay` after the first one waits, whichever comes first. The cost: a
  /// worker learns its positions later, so after a kill more of its applied pushes lack one;
  /// they are resent and applied after the replayed ones (exactly once, reported reordered:
  /// `replica_log_stats::reordered_recoveries`). Read by both parts.
  std::chrono::milliseconds ack_delay{0};
  /// Whether acks may be held back: `ordering` is apply-first and `ack_delay` is above 0 (the
  /// one condition both parts test; under write-ahead `ack_delay` is ignored).
  constexpr bool holds_acks() const noexcept {
    return ordering == replica_log_ordering::apply_first && ack_delay.count() > 0;
  }
  /// Worker part: log entries per shard not yet known applied beyond which the worker waits
  /// before its next clock (flow control; bounds the part of its log the shard has not
  /// confirmed). 0 counts as 1.
  std::uint32_t max_unacked = 64;
};

}  // namespace asyncps::recovery
