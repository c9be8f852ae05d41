// asyncps — recovery::stateless, worker part: trains on through an outage and buffers deltas.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <system_error>
#include <vector>

#include <Eigen/Core>

#include "asyncps/recovery.hpp"
#include "asyncps/recovery/stateless/messages.hpp"
#include "asyncps/recovery/stateless/options.hpp"
#include "asyncps/recovery/worker_hooks.hpp"

namespace asyncps::recovery {

/// Counters of a `stateless` worker part (`basic_worker::recovery().stats()`).
struct stateless_worker_stats {
  std::uint64_t local_clocks = 0;   ///< (shard, clock) pairs computed with a shard unreachable
  std::uint64_t backlogs_sent = 0;  ///< backlog pushes sent after reconnecting
  std::uint64_t replicas_sent = 0;  ///< replica pushes sent to a server that lost its state

  /// Calls `f(name, value)` for every counter above, in declaration order; `name` is the
  /// member's name (a `const char*`), `value` a `std::uint64_t` count.
  template <class F>
  void for_each_counter(F&& f) const {
    f("local_clocks", local_clocks);
    f("backlogs_sent", backlogs_sent);
    f("replicas_sent", replicas_sent);
  }
  /// Adds `o`'s counters (the totals of several workers). Every counter is a count.
  stateless_worker_stats& operator+=(const stateless_worker_stats& o) noexcept {
    local_clocks += o.local_clocks;
    backlogs_sent += o.backlogs_sent;
    replicas_sent += o.replicas_sent;
    return *this;
  }
};

/// recovery::stateless, worker part: keeps training while a shard is down, sums each clock's
/// gradient for it into one backlog buffer per part (memory stays bounded however long the
/// outage), and on reconnect sends the clocks it trained locally, its replica (when the
/// server lost its state) and the backlogs. Thread safety: the worker's executor.
struct stateless_worker_part {
  stateless_options options{};

  recovery_action on_server_lost(std::error_code) const noexcept {
    return recovery_action::continue_local;
  }
  std::chrono::milliseconds reconnect_timeout() const noexcept { return options.reconnect_timeout; }
  /// The counters.
  const stateless_worker_stats& stats() const noexcept { return stats_; }

  /// Hook: one backlog per (shard, table).
  void on_start(const worker_setup& s) {
    backlogs_.assign(s.shards, std::vector<backlog>(s.tables));
  }
  /// Hook: a server that kept its state but not the pushes in flight when the link dropped
  /// gets their gradients (kept for read-my-writes) in the backlog, so they are applied once.
  /// (A server without state is rebuilt from replicas instead.) Nothing is counted as lost.
  welcome_action on_welcome(const welcome_part& w) {
    if (w.applied < w.pushed && !w.welcome_policy_bit)  // protocol::wants_replicas_flag
      for (const auto& u : w.unapplied)
        if (u.index > w.applied) add(backlogs_[w.shard][w.table], u.grad.floats(), w.rows_clock);
    return welcome_action::recovered;
  }
  /// Hook: a clock trained while `shard` is down joins its backlogs.
  void while_away(std::uint32_t shard, std::span<const away_slice> slices) {
    for (const away_slice& s : slices) add(backlogs_[shard][s.table], s.grad, s.rows_clock);
    ++stats_.local_clocks;
  }
  /// Hook: `clock` messages for the clocks trained locally since the hello, then per table the
  /// replica (when the server asks for state) and the backlog.
  void on_rejoin(rejoin_context& r) {
    for (clock_value k = r.hello_clock; k < r.clock; ++k) r.send_clock(k);
    for (table_id t = 0; t < r.parts.size(); ++t) {
      const rejoin_part& p = r.parts[t];
      if (p.range.empty()) continue;
      if (r.welcome_policy_bit && p.have)
        r.send_rows(t, protocol::replica_push_flag, p.rows, r.clock);
      const backlog& b = backlogs_[r.shard][t];
      if (b.clocks > 0)
        r.send_rows(t, protocol::backlog_push_flag, b.sum.data(), b.since,
                    protocol::backlog_prefix(b.clocks));  // recovery/stateless/messages.hpp
    }
  }
  /// Hook: counts what went out; a delivered backlog starts over.
  void on_rejoin_sent(std::uint32_t shard, const frame_header& h) {
    if (h.has(protocol::replica_push_flag)) ++stats_.replicas_sent;
    if (h.has(protocol::backlog_push_flag)) {
      ++stats_.backlogs_sent;
      backlogs_[shard][h.table].clocks = 0;
    }
  }
  /// Hook: a shard that is down and holds an undelivered backlog keeps the worker running.
  bool has_pending(std::uint32_t shard, bool up) const {
    if (up) return false;
    for (const backlog& b : backlogs_[shard])
      if (b.clocks > 0) return true;
    return false;
  }

 private:
  // Gradients summed over the clocks a shard was unreachable, how many, and the server clock
  // of the rows the first of them was computed on.
  struct backlog {
    std::vector<float> sum;
    std::uint64_t clocks = 0;
    clock_value since = 0;
  };
  static void add(backlog& b, std::span<const float> g, clock_value rows_clock) {
    const auto n = static_cast<Eigen::Index>(g.size());
    const Eigen::Map<const Eigen::ArrayXf> gm(g.data(), n);
    if (b.clocks == 0) {
      b.sum.resize(g.size());
      Eigen::Map<Eigen::ArrayXf>(b.sum.data(), n) = gm;
      b.since = rows_clock;
    } else {
      Eigen::Map<Eigen::ArrayXf>(b.sum.data(), n) += gm;
    }
    ++b.clocks;
  }

  std::vector<std::vector<backlog>> backlogs_;  // [shard][table]
  stateless_worker_stats stats_{};
};

static_assert(check_worker_part<stateless_worker_part>());

}  // namespace asyncps::recovery
