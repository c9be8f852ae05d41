// asyncps — recovery::replica_log (SWIFT), worker part: logs its own pushes with the apply
// positions the server gives them, stores the state replicas it is sent, and replays its log
// to a restarted shard. See recovery/replica_log.hpp and docs/recovery/swift.md.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <system_error>
#include <vector>

#include "asyncps/detail/ring.hpp"
#include "asyncps/error.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery.hpp"
#include "asyncps/recovery/replica_log/messages.hpp"
#include "asyncps/recovery/replica_log/options.hpp"
#include "asyncps/recovery/worker_hooks.hpp"

namespace asyncps::recovery {

/// Counters of a `replica_log` worker part (`basic_worker::recovery().stats()`, read on the
/// worker's executor).
struct replica_log_worker_stats {
  std::uint64_t log_entries = 0;    ///< entries held now (all shards)
  std::uint64_t log_bytes = 0;      ///< payload bytes they hold now
  std::uint64_t max_log_bytes = 0;  ///< the most payload bytes held at once
  std::uint64_t replica_bytes = 0;  ///< bytes of the state replicas held now
  std::uint64_t max_replica_bytes = 0;
  std::uint64_t replicas_stored = 0;  ///< state replicas received
  std::uint64_t replayed = 0;         ///< entries resent to a rebuilding shard
  std::uint64_t orders = 0;           ///< positions received in orders

  /// Calls `f(name, value)` for every counter above, in declaration order; `name` is the
  /// member's name (a `const char*`), `value` a `std::uint64_t` (entries, bytes or messages,
  /// as documented on the member).
  template <class F>
  void for_each_counter(F&& f) const {
    f("log_entries", log_entries);
    f("log_bytes", log_bytes);
    f("max_log_bytes", max_log_bytes);
    f("replica_bytes", replica_bytes);
    f("max_replica_bytes", max_replica_bytes);
    f("replicas_stored", replicas_stored);
    f("replayed", replayed);
    f("orders", orders);
  }
  /// Combines another worker's counters into these (the totals of several workers): counts
  /// and the entries and bytes held now add up; `max_log_bytes` and `max_replica_bytes`
  /// become the larger of the two, so over several workers they are the most one worker
  /// held at once.
  replica_log_worker_stats& operator+=(const replica_log_worker_stats& o) noexcept {
    log_entries += o.log_entries;
    log_bytes += o.log_bytes;
    max_log_bytes = std::max(max_log_bytes, o.max_log_bytes);
    replica_bytes += o.replica_bytes;
    max_replica_bytes = std::max(max_replica_bytes, o.max_replica_bytes);
    replicas_stored += o.replicas_stored;
    replayed += o.replayed;
    orders += o.orders;
    return *this;
  }
};

/// recovery::replica_log, worker part (see recovery/replica_log.hpp). Thread safety: the
/// worker's executor.
struct replica_log_worker_part {
  replica_log_options options{};
  recovery_action on_server_lost(std::error_code) const noexcept {
    return recovery_action::reconnect;
  }
  std::chrono::milliseconds reconnect_timeout() const noexcept { return options.reconnect_timeout; }
  /// The counters.
  const replica_log_worker_stats& stats() const noexcept { return stats_; }

  // ---- hooks (recovery/worker_hooks.hpp) ----

  /// One log per shard.
  void on_start(const worker_setup& s) {
    shards_.resize(s.shards);
    max_unacked_ = std::max<std::uint32_t>(options.max_unacked, 1);
    ack_later_ = options.holds_acks() && !s.waits_for_acks;
  }
  /// A reconnect says that this worker holds a log for the shard (`protocol::holds_log_flag`).
  std::uint8_t hello_flags(std::uint32_t shard) const noexcept {
    return shards_[shard].met ? protocol::holds_log_flag : std::uint8_t{0};
  }
  /// The server holds everything before the oldest unapplied entry.
  clock_value hello_clock(std::uint32_t shard, clock_value clock) const {
    const auto& sh = shards_[shard];
    return sh.unapplied < sh.log.size() ? sh.log[sh.unapplied].header.clock : clock;
  }
  /// Whether the shard rebuilds (it asks for replicas); every entry is delivered by this part.
  welcome_action on_welcome(const welcome_part& w) {
    auto& sh = shards_[w.shard];
    sh.met = true;
    sh.rebuilding = w.welcome_policy_bit;  // protocol::rebuilding_flag
    return welcome_action::resend;
  }
  /// Every push and clock message is numbered and acknowledged; with `options.ack_delay`
  /// (apply-first, a worker that does not wait for its acks) it is flagged
  /// `protocol::ack_later_flag` while every shard has fewer than `max_unacked` / 2 entries
  /// unacknowledged, so the shard may acknowledge several clocks at once.
  std::uint8_t push_flags() const noexcept {
    if (!ack_later_) return frame_flags::want_ack;
    for (const auto& sh : shards_)
      if (sh.log.size() - sh.unapplied >= max_unacked_ / 2) return frame_flags::want_ack;
    return frame_flags::want_ack | protocol::ack_later_flag;
  }
  /// Logs `m` (its payload shared with the send, not copied), without a position yet.
  void on_push(std::uint32_t shard, const message& m) {
    shards_[shard].log.push_back(entry{m.header, m.payload.share(), 0});
    ++stats_.log_entries;
    stats_.log_bytes += m.payload.size();
    stats_.max_log_bytes = std::max(stats_.max_log_bytes, stats_.log_bytes);
  }
  /// Entries up to `seq` are applied; wakes the worker when flow control opens or nothing is
  /// left unapplied.
  bool on_ack(std::uint32_t shard, std::uint64_t seq) {
    auto& sh = shards_[shard];
    const bool full = sh.log.size() - sh.unapplied >= max_unacked_;
    while (sh.unapplied < sh.log.size() && sh.log[sh.unapplied].header.seq <= seq) ++sh.unapplied;
    truncate(sh);
    const std::size_t left = sh.log.size() - sh.unapplied;
    return left == 0 || (full && left < max_unacked_);
  }
  /// Waits before the next gradient while `max_unacked` entries are unapplied.
  bool flow_blocked(std::uint32_t shard) const noexcept {
    const auto& sh = shards_[shard];
    return sh.log.size() - sh.unapplied >= max_unacked_;
  }
  /// `order` (or an ack carrying one, `protocol::carries_order_flag`: apply-first; the shell
  /// then takes the ack itself): logs the positions and confirms them with one cumulative
  /// `commit` (none when the order says they are applied); a replica: stores it and
  /// confirms it (`commit` with `protocol::replica_stored_flag`). Errors:
  /// `errc::unexpected_message` (a malformed order, see `protocol::decode`).
  std::error_code on_server_message(std::uint32_t shard, message& m,
                                    std::vector<message>& replies) {
    auto& sh = shards_[shard];
    if (m.header.type == protocol::order_type || m.header.type == message_type::ack) {
      protocol::order o;
      std::string why;
      if (auto ec = protocol::decode(m, o, why)) return ec;
      stats_.orders += o.size();
      // Both the order's entries and the log are in seq order: one merge. An entry names a
      // message not yet applied (write-ahead) or applied but not yet acknowledged (apply-first:
      // the order comes before the ack), so the search starts at `unapplied`.
      std::uint64_t logged = 0;
      std::size_t i = sh.unapplied;
      for (std::size_t k = 0; k < o.size(); ++k) {
        const protocol::order_entry e = o.entry(k);
        while (i < sh.log.size() && sh.log[i].header.seq < e.seq) ++i;
        if (i == sh.log.size()) break;
        if (sh.log[i].header.seq != e.seq) continue;
        sh.log[i].position = e.position;
        logged = e.position;
      }
      if (logged != 0 && !o.applied)
        replies.push_back(header_message(protocol::commit_type, 0, logged));
      if (o.stable > sh.stable) {
        sh.stable = o.stable;
        drop_replicas_below(sh, sh.stable);
        truncate(sh);
      }
      return {};
    }
    if (m.header.type == protocol::replica_type) {
      const std::uint64_t p = m.header.seq;
      // Write-ahead: every position up to a replica's was logged before it was applied, so
      // the logs back the newest replica and the older ones are dropped. Apply-first: the
      // ones at or above the stable position this worker learned are kept.
      drop_replicas_below(sh,
                          options.ordering == replica_log_ordering::write_ahead ? p : sh.stable);
      if (sh.replicas.size() >= protocol::max_held_replicas)
        drop_replicas_below(sh, sh.replicas[1].header.seq);  // the oldest
      stats_.replica_bytes += m.payload.size();
      stats_.max_replica_bytes = std::max(stats_.max_replica_bytes, stats_.replica_bytes);
      sh.replicas.push_back(message{m.header, std::move(m.payload)});
      ++stats_.replicas_stored;
      replies.push_back(header_message(protocol::commit_type, protocol::replica_stored_flag, p));
      return {};
    }
    return errc::unexpected_message;
  }
  /// A rebuilding shard gets this worker's replica, its logged entries in position order
  /// (each announced by a `replay`), the end of its replay, then the entries the lost server
  /// never ordered (as new pushes). A shard that kept its state gets the confirmations it may
  /// have missed, the end of the rejoin, and the entries it never ordered.
  void on_rejoin(rejoin_context& r) {
    auto& sh = shards_[r.shard];
    if (sh.rebuilding) {
      for (const message& rep : sh.replicas) r.send(message{rep.header, rep.payload.share()});
      for (std::size_t i = 0; i < sh.log.size(); ++i) {
        const entry& e = sh.log[i];
        if (e.position == 0) continue;
        r.send(header_message(protocol::replay_type, 0, e.position));
        r.send(message{e.header, e.payload.share()});
        ++stats_.replayed;
      }
    } else {
      for (std::size_t i = sh.unapplied; i < sh.log.size(); ++i)
        if (sh.log[i].position != 0)
          r.send(header_message(protocol::commit_type, 0, sh.log[i].position));
    }
    // The end of the replay; its `clock`: how many entries follow without a position.
    message end = header_message(protocol::replay_type, protocol::replay_end_flag, sh.stable);
    for (std::size_t i = sh.unapplied; i < sh.log.size(); ++i)
      if (sh.log[i].position == 0) ++end.header.clock;
    r.send(std::move(end));
    for (std::size_t i = sh.unapplied; i < sh.log.size(); ++i) {
      const entry& e = sh.log[i];
      if (e.position == 0) r.send(message{e.header, e.payload.share()});
    }
  }
  /// Unapplied entries keep the worker running.
  bool has_pending(std::uint32_t shard, bool) const noexcept {
    const auto& sh = shards_[shard];
    return sh.unapplied < sh.log.size();
  }

 private:
  struct entry {
    frame_header header;
    buffer payload;
    std::uint64_t position = 0;  // 0: not ordered yet
  };
  struct shard_log {
    detail::ring<entry> log;    // oldest first, in seq order
    std::size_t unapplied = 0;  // entries before it are applied
    std::uint64_t stable = 0;   // positions up to it are in a stored replica
    // The state replicas it holds, oldest first. Write-ahead: the newest. Apply-first: every
    // one at or above `stable`, each kept until an order says a newer position is stable. A
    // rebuild starts from the newest stable position any worker learned, and its replica may
    // be one this worker was sent after it last learned one; the logs need not back a newer
    // replica (an update is applied before its worker logs its position).
    std::vector<message> replicas;
    bool met = false;         // welcomed by the shard at least once
    bool rebuilding = false;  // the last welcome asked for replicas
  };

  static message header_message(message_type t, std::uint8_t flags, std::uint64_t seq) {
    message m;
    m.header.type = t;
    m.header.flags = flags;
    m.header.seq = seq;
    return m;
  }
  // Drops applied entries a stored replica holds: an applied entry at or below the stable
  // position, and with it the applied entries before it that never got a position. Such an
  // entry is one whose order was lost with a connection under apply-first (the shard applied
  // it, then acknowledged its resend as a duplicate): it was applied before the shard gave a
  // later message of this worker its position, so a replica at or above that position holds
  // it too. Without that rule it would stay, and hold every entry after it, forever.
  void truncate(shard_log& sh) {
    for (;;) {
      std::size_t j = 0;
      while (j < sh.unapplied && sh.log[j].position == 0) ++j;
      if (j == sh.unapplied || sh.log[j].position > sh.stable) return;
      for (std::size_t k = 0; k <= j; ++k) {
        stats_.log_bytes -= sh.log.front().payload.size();
        --stats_.log_entries;
        sh.log.pop_front();
        --sh.unapplied;
      }
    }
  }
  // Drops the replicas of positions below `stable` (a newer one is stored).
  void drop_replicas_below(shard_log& sh, std::uint64_t stable) {
    std::erase_if(sh.replicas, [&](const message& rep) {
      if (rep.header.seq >= stable) return false;
      stats_.replica_bytes -= rep.payload.size();
      return true;
    });
  }

  std::vector<shard_log> shards_;
  std::uint32_t max_unacked_ = 64;
  bool ack_later_ = false;  // options.ack_delay applies (on_start)
  replica_log_worker_stats stats_{};
};

static_assert(check_worker_part<replica_log_worker_part>());

}  // namespace asyncps::recovery
