// asyncps — recovery::stateless, server part: installs replicas and merges backlogs.
//
// A server restarted without state meets a worker that has trained (its hello carries a clock
// > 0): the welcome asks the workers for their replicas (`protocol::wants_replicas_flag`); the
// first replica of each table rebuilds it, and every worker's backlog (the deltas it
// accumulated while the server was away, `protocol::backlog_push_flag`) is merged by the
// configured rule. See
// docs/recovery/stateless.md.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <Eigen/Core>

#include "asyncps/detail/server/hooks.hpp"
#include "asyncps/error.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery/stateless/messages.hpp"
#include "asyncps/recovery/stateless/options.hpp"
#include "asyncps/table.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::recovery {

/// Counters of a stateless server part (read on the server's executor).
struct stateless_stats {
  std::uint64_t replicas_installed = 0;  ///< tables rebuilt from a worker's replica
  std::uint64_t backlogs_merged = 0;     ///< backlog pushes merged
  std::uint64_t backlog_clocks = 0;      ///< clocks of worker updates those backlogs held

  /// Calls `f(name, value)` for every counter above, in declaration order; `name` is the
  /// member's name (a `const char*`), `value` a `std::uint64_t` count.
  template <class F>
  void for_each_counter(F&& f) const {
    f("replicas_installed", replicas_installed);
    f("backlogs_merged", backlogs_merged);
    f("backlog_clocks", backlog_clocks);
  }
  /// Adds `o`'s counters (the totals of several servers). Every counter is a count.
  stateless_stats& operator+=(const stateless_stats& o) noexcept {
    replicas_installed += o.replicas_installed;
    backlogs_merged += o.backlogs_merged;
    backlog_clocks += o.backlog_clocks;
    return *this;
  }
};

/// recovery::stateless, server part: the merge rule, which tables wait for a replica, and the
/// counters. Thread safety: on the server's executor.
struct stateless_server_part {
  stateless_options options{};

  /// The factor a backlog of `clocks` clocks, `staleness` clocks old, is scaled by.
  float backlog_scale(std::uint64_t clocks, clock_value staleness) const noexcept {
    switch (options.rule) {
      case merge_rule::sum: return 1.0f;
      case merge_rule::mean: return clocks > 0 ? 1.0f / static_cast<float>(clocks) : 1.0f;
      case merge_rule::lr_scaled:
        return clocks > options.large_backlog ? options.large_backlog_scale : 1.0f;
      case merge_rule::staleness_aware:
        return 1.0f / static_cast<float>(staleness > 1 ? staleness : 1);
    }
    return 1.0f;
  }

  /// The counters.
  const stateless_stats& stats() const noexcept { return stats_; }
  /// Whether the shard waits for a worker's replica of some table (restarted without state,
  /// it has asked the workers for theirs): readers are refused until every table is rebuilt.
  bool recovering() const noexcept {
    return std::any_of(needs_state_.begin(), needs_state_.end(), [](char c) { return c != 0; });
  }

  // ---- hooks (declared and checked in asyncps/recovery.hpp) ----

  /// A server that holds no trained state (nothing applied or restored) meets a worker that
  /// has trained: it was restarted without state, so the welcome asks for replicas.
  template <class Ctx>
  std::uint8_t welcome_flags(Ctx ctx, const frame_header& hello) {
    size_for(ctx);
    if (ctx.has_state() || hello.clock <= 0) return 0;
    std::fill(needs_state_.begin(), needs_state_.end(), true);
    return protocol::wants_replicas_flag;
  }

  /// A replica (`protocol::replica_push_flag`: the first one of a table rebuilds it, later ones
  /// are dropped) or a backlog (`protocol::backlog_push_flag`: scaled by `backlog_scale` and
  /// applied, unless it comes from the worker whose replica was installed, which already holds it).
  /// Either must cover the shard's whole range of its table.
  ///
  /// A replica is validated before it is installed, and one that fails is never installed
  /// (the table waits for the next worker's replica): its payload must hold exactly the
  /// shard's rows of the table (`range.size() x width` floats; the server has checked table
  /// and width, and that every float is finite), its clock must lie in [0,
  /// `protocol::max_clock`] and not above its sender's clock at this server (a worker sends
  /// its replica after the clock messages of its rejoin, at its current clock), and, when
  /// `stateless_options::max_replica_value` is set, no value may exceed it in magnitude. So
  /// the first replica is installed only when it is plausible; a finite, in-bound replica of
  /// the right clock from a peer with the secret still is (docs/security.md).
  ///
  /// Errors: `errc::unexpected_message` (flags or range), `errc::bad_state` (a replica that
  /// fails the checks above; logged naming what was wrong), `errc::bad_clock` (a backlog whose
  /// clock is outside [0, `protocol::max_clock`]).
  template <class Ctx>
  std::error_code on_recovery_push(Ctx ctx, detail::session_base& s, message& m,
                                   std::string& detail) {
    size_for(ctx);
    const auto& h = m.header;
    const key_range range = ctx.range(h.table);
    if (h.has(protocol::replica_push_flag) == h.has(protocol::backlog_push_flag) ||
        !h.has(frame_flags::range) || h.first_row != range.begin || h.row_count != range.size()) {
      detail = " (a replica or backlog push must cover the shard's whole range, one flag)";
      return errc::unexpected_message;
    }
    const auto vals = payload_floats(m);
    if (h.has(protocol::replica_push_flag)) {
      // The first replica of a table rebuilds it; later ones are dropped. Their senders'
      // backlogs are then merged, while the installed sender's own updates are already in it.
      if (needs_state_[h.table]) {
        if (auto ec = check_replica(ctx, s, m, vals, detail)) {
          ctx.log("refused the replica of table " + std::to_string(h.table) + " from worker " +
                  std::to_string(s.worker) + detail + "; the table waits for another replica");
          return ec;
        }
        ctx.install_replica(h.table, vals);
        needs_state_[h.table] = false;
        state_source_[h.table] = s.worker;
        ++stats_.replicas_installed;
        ctx.log("rebuilt table " + std::to_string(h.table) + " from the replica of worker " +
                std::to_string(s.worker) + " (clock " + std::to_string(h.clock) + ")");
      }
      return {};
    }
    if (state_source_[h.table] == s.worker) {
      state_source_[h.table] = detail::session_base::none;  // already in the installed replica
      return {};
    }
    // A backlog's clock lies in [0, max_clock] like any clock (so the staleness below cannot
    // overflow: a clock of INT64_MIN would wrap it and merge the backlog unscaled).
    if (h.clock < 0 || h.clock > protocol::max_clock) {
      detail = " (backlog at clock " + std::to_string(h.clock) + "; clocks lie in [0, " +
               std::to_string(protocol::max_clock) + "])";
      return errc::bad_clock;
    }
    const clock_value staleness = std::max<clock_value>(ctx.clock() - h.clock, 0);
    const std::uint64_t clocks = protocol::backlog_clocks(m);  // the backlog's prefix
    const float scale = backlog_scale(clocks, staleness);
    // The floats follow the prefix; the payload is this server's own receive buffer.
    Eigen::Map<Eigen::ArrayXf> g(const_cast<float*>(vals.data()),
                                 static_cast<Eigen::Index>(vals.size()));
    if (scale != 1.0f) g *= scale;
    if (auto ec = ctx.apply_update(m)) return ec;  // nothing applied
    ++stats_.backlogs_merged;
    stats_.backlog_clocks += clocks;
    return {};
  }

 private:
  // The checks a replica passes before it is installed (see on_recovery_push).
  template <class Ctx>
  std::error_code check_replica(Ctx ctx, const detail::session_base& s, const message& m,
                                std::span<const float> vals, std::string& detail) const {
    const auto& h = m.header;
    const std::size_t want = std::size_t{ctx.range(h.table).size()} * h.width;
    if (vals.size() != want) {
      detail = " (" + std::to_string(vals.size()) + " floats, the shard's rows of the table hold " +
               std::to_string(want) + ")";
      return errc::bad_state;
    }
    if (h.clock < 0 || h.clock > protocol::max_clock || h.clock > ctx.worker_clock(s.worker)) {
      detail = " (replica at clock " + std::to_string(h.clock) + "; worker " +
               std::to_string(s.worker) + " is at clock " +
               std::to_string(ctx.worker_clock(s.worker)) +
               " here, and a replica is sent at its sender's clock)";
      return errc::bad_state;
    }
    if (const float bound = options.max_replica_value; bound > 0.0f) {
      const auto big = std::find_if(vals.begin(), vals.end(),
                                    [bound](float v) { return !(std::abs(v) <= bound); });
      if (big != vals.end()) {
        detail = " (value " + std::to_string(*big) + " at index " +
                 std::to_string(big - vals.begin()) + " exceeds max_replica_value " +
                 std::to_string(bound) + ")";
        return errc::bad_state;
      }
    }
    return {};
  }

  template <class Ctx>
  void size_for(Ctx ctx) {
    if (needs_state_.size() == ctx.num_tables()) return;
    needs_state_.assign(ctx.num_tables(), 0);
    state_source_.assign(ctx.num_tables(), detail::session_base::none);
  }

  std::vector<char> needs_state_{};            // per table: waits for a replica
  std::vector<std::uint32_t> state_source_{};  // per table: whose replica was installed
  stateless_stats stats_{};
};

}  // namespace asyncps::recovery
