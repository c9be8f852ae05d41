// asyncps — recovery::replica_log (SWIFT), server part: rebuilding a restarted shard. Starting
// a rebuild, collecting the workers' replays, choosing the replica the logs back, installing it
// and replaying every logged entry after it in position order, then serving what was held; and
// the watch (the part's timer, hook `on_timer`) that finishes a rebuild at recovery_timeout,
// voids orphaned orders at void_timeout and acts on an order left unconfirmed for
// commit_timeout.
//
// Out-of-line definitions of members of replica_log_server_part, declared in
// asyncps/recovery/replica_log/server_part.hpp. Not a header to include on its own: server_part.hpp
// includes it at its end, after the class it defines members of (so this file does not include
// server_part.hpp back).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "asyncps/detail/codec/shard_state.hpp"
#include "asyncps/detail/ring.hpp"
#include "asyncps/detail/server/hooks.hpp"
#include "asyncps/error.hpp"
#include "asyncps/recovery/replica_log/options.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::recovery {

template <class Ctx>
void replica_log_server_part::start_recovery(Ctx ctx) {
  rt_.value.mode_ = mode::recovering;
  rt_.value.unordered_ = 0;
  ++rt_.value.stats_.recoveries;
  ctx.save_state(rt_.value.initial_);  // position 0: the seeded initial state
  ctx.log("rebuilding from the workers' replicas and logs (replica-log)");
  rt_.value.recovery_started_ = std::chrono::steady_clock::now();
  rt_.value.recovering_for_ = std::chrono::milliseconds{0};  // the watch may run already
  watch(ctx);
}

template <class Ctx>
std::optional<std::error_code> replica_log_server_part::on_replay(Ctx ctx, std::uint32_t w,
                                                                  const frame_header& h) {
  if (!h.has(protocol::replay_end_flag)) {
    if (h.seq == 0) return make_error_code(errc::unexpected_message);  // 0: no position
    rt_.value.expect_[w] = h.seq;  // the next push or clock message is the entry of position seq
    return std::error_code{};
  }
  rt_.value.done_[w] = 1;
  rt_.value.newest_stable_ = std::max(rt_.value.newest_stable_, h.seq);
  // Its `clock`: how many entries it resends without a position (a negative count is taken
  // as "some": it only makes an apply-first rebuild report itself reordered). Saturating, so
  // that no sum of claims wraps to 0.
  const std::uint64_t n = h.clock >= 0 ? static_cast<std::uint64_t>(h.clock) : 1;
  rt_.value.unordered_ = std::min(protocol::max_seq,  // both terms <= 2^62: no wrap
                                  rt_.value.unordered_ + std::min(n, protocol::max_seq));
  if (std::all_of(rt_.value.done_.begin(), rt_.value.done_.end(), [](char c) { return c != 0; }))
    finish_recovery(ctx, false);
  return std::error_code{};
}

inline bool replica_log_server_part::logs_cover(std::uint64_t lo, std::uint64_t hi) const noexcept {
  if (hi <= lo) return true;
  std::uint64_t next = lo + 1;  // the next position to find
  for (const auto& e : rt_.value.entries_) {
    if (e.position < next) continue;
    if (e.position != next) return false;
    if (next == hi) return true;
    ++next;
  }
  return false;
}

inline std::vector<std::uint32_t> replica_log_server_part::choose_replica() const {
  const std::uint64_t stable = rt_.value.newest_stable_;
  std::vector<std::uint32_t> backed, older;
  const auto& reps = rt_.value.replicas_;
  for (std::uint32_t i = 0; i < reps.size(); ++i) {
    const std::uint64_t p = reps[i].m.header.seq;
    if (p >= stable && logs_cover(stable, p))
      backed.push_back(i);
    else if (p <= stable)
      older.push_back(i);
  }
  const auto newest_first = [&reps](std::uint32_t a, std::uint32_t b) {
    return reps[a].m.header.seq > reps[b].m.header.seq;
  };
  std::stable_sort(backed.begin(), backed.end(), newest_first);
  std::stable_sort(older.begin(), older.end(), newest_first);
  backed.insert(backed.end(), older.begin(), older.end());
  return backed;
}

template <class Ctx>
void replica_log_server_part::finish_recovery(Ctx ctx, bool timed_out) {
  std::uint64_t base = 0;
  std::string why;
  bool installed = false;
  std::sort(rt_.value.entries_.begin(), rt_.value.entries_.end(),
            [](const entry& a, const entry& b) { return a.position < b.position; });
  const std::vector<std::uint32_t> candidates = choose_replica();
  // Replicas never tried: above the newest stable position, not backed by the logs.
  const std::size_t skipped = rt_.value.replicas_.size() - candidates.size();
  for (const std::uint32_t i : candidates) {
    const message& r = rt_.value.replicas_[i].m;
    const std::uint32_t w = rt_.value.replicas_[i].worker;
    why.clear();
    if (auto ec = detail::decode_state(r.payload.bytes(), rt_.value.scratch_, why)) {
      ctx.log("the state replica of position " + std::to_string(r.header.seq) + " from worker " +
              std::to_string(w) + " is invalid" + why);
    } else if (auto ec2 = ctx.restore_state(rt_.value.scratch_)) {
      ctx.log("the state replica of position " + std::to_string(r.header.seq) + " from worker " +
              std::to_string(w) + " cannot be installed (" + ec2.message() + ")");
    } else {
      base = r.header.seq;
      installed = true;
      break;
    }
  }
  if (skipped != 0)
    ctx.log(std::to_string(skipped) + " state replica(s) above the newest stable position " +
            std::to_string(rt_.value.newest_stable_) +
            " claim positions no worker logged: not installed");
  if (!installed) (void)ctx.restore_state(rt_.value.initial_);
  if (on_replayed) on_replayed(base);
  // Every position is at most protocol::max_seq = 2^62 (checked as it arrived), so neither
  // `expected` nor `missing` (at most the highest position) can wrap.
  std::uint64_t expected = base + 1;
  std::uint64_t missing = 0;
  for (auto& e : rt_.value.entries_) {
    if (e.position < expected) continue;  // in the replica, or a duplicate
    missing += e.position - expected;
    catch_up(ctx, e.worker, e.m);
    if (auto ec = ctx.dispatch_of(e.worker, e.m))
      count_drop(ctx, "replayed", e.worker, e.position, e.m, ec);
    ++rt_.value.stats_.replayed;
    if (options.log_budget > 0 && e.worker < rt_.value.logged_bytes_.size()) {
      // Its worker holds it until the next stored replica: it counts against the budget.
      rt_.value.logged_.push_back({e.position, e.worker, e.m.payload.size()});
      rt_.value.logged_bytes_[e.worker] += e.m.payload.size();
    }
    expected = e.position + 1;
    rt_.value.position_ = e.position;
    if (on_replayed) on_replayed(e.position);
  }
  rt_.value.position_ = std::max(rt_.value.position_, base);
  const std::uint64_t gaps = missing;  // positions between replayed entries without one
  if (rt_.value.newest_stable_ > base)
    missing += rt_.value.newest_stable_ - base;  // truncated from the logs
  rt_.value.stats_.missing_positions += missing;
  // Every worker's log arrived and the newest stable replica was installed: every position
  // the dead server applied was committed, hence logged, hence replayed. A position without
  // an entry then had its order lost on the way (the server could apply nothing after it):
  // not applied, and its push is resent. A replica above the newest stable position is
  // installed only when the logs hold every position up to it (choose_replica): exactness
  // is never taken on a replica's word.
  const bool exact = !timed_out && rt_.value.newest_stable_ <= base &&
                     (!installed || logs_cover(rt_.value.newest_stable_, base));
  if (!exact) ++rt_.value.stats_.incomplete_recoveries;
  // Apply-first: the dead server may have applied an update whose order its worker never got
  // (a gap, or an entry the worker resends without a position) before later replayed ones.
  // Each is applied once (after the replay, or dropped as held by the replica), but maybe in
  // another order than the dead server's.
  const bool reordered = exact && options.ordering == replica_log_ordering::apply_first &&
                         (gaps != 0 || rt_.value.unordered_ != 0);
  if (reordered) ++rt_.value.stats_.reordered_recoveries;
  rt_.value.stable_ = base;
  rt_.value.stats_.stable = rt_.value.stable_;
  rt_.value.stats_.position = rt_.value.position_;
  // New positions start above every replica a worker sent too: one not installed (above the
  // stable position, not backed) still sits in its holder's store, and must never look like
  // a replica of this server's positions to a later rebuild.
  std::uint64_t newest_replica = 0;
  for (const auto& r : rt_.value.replicas_)
    newest_replica = std::max(newest_replica, r.m.header.seq);  // <= max_seq (checked)
  rt_.value.next_ = std::max(
      {rt_.value.next_, rt_.value.position_ + 1, rt_.value.newest_stable_ + 1, newest_replica + 1});
  rt_.value.stats_.last_recovery_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - rt_.value.recovery_started_)
          .count();
  std::string missing_workers;
  for (std::uint32_t w = 0; w < rt_.value.done_.size(); ++w)
    if (!rt_.value.done_[w])
      missing_workers += (missing_workers.empty() ? "" : ", ") + std::to_string(w);
  ctx.log("rebuilt from " +
          (installed ? "the replica of position " + std::to_string(base)
                     : std::string("the initial state")) +
          " and " + std::to_string(rt_.value.stats_.replayed) + " logged entries to position " +
          std::to_string(rt_.value.position_) +
          (reordered ? " (exactly once, not bit-exact: " + std::to_string(rt_.value.unordered_) +
                           " entries resent without their position and " + std::to_string(gaps) +
                           " positions without an entry, applied after the replay)"
           : exact
               ? " (exact" + (missing == 0 ? std::string(")")
                                           : "; " + std::to_string(missing) +
                                                 " positions whose orders were lost: not applied, "
                                                 "resent)")
               : " (NOT exact: " + std::to_string(missing) + " positions missing" +
                     (missing_workers.empty() ? std::string()
                                              : ", no log from worker(s) " + missing_workers) +
                     ")"));
  rt_.value.entries_.clear();
  rt_.value.replicas_.clear();
  rt_.value.mode_ = mode::serving;
  if (on_rebuilt) on_rebuilt();
  rt_.value.replica_clock_ = ctx.clock();
  // What the workers sent meanwhile arrives now, in its order: pushes get positions.
  detail::ring<held> waiting = std::move(rt_.value.held_);
  rt_.value.held_ = detail::ring<held>{};
  while (!waiting.empty()) {
    held it = std::move(waiting.front());
    waiting.pop_front();
    const auto t = it.m.header.type;
    if ((t == message_type::push || t == message_type::clock) &&
        it.m.header.seq > ctx.last_seq(it.worker))
      hold(ctx, it.session, it.worker, std::move(it.m), true);
    else if (t != message_type::push && t != message_type::clock)
      rt_.value.held_.push_back(std::move(it));
    else if (it.session != nullptr && it.session->open && it.m.header.has(frame_flags::want_ack))
      ctx.ack(*it.session, ctx.last_seq(it.worker));  // held by the replica: acknowledged
  }
  release(ctx);
  for (std::uint32_t w = 0; w < rt_.value.pending_.size(); ++w) flush_orders(ctx, w);
}

template <class Ctx>
void replica_log_server_part::watch(Ctx ctx) {
  auto& r = rt_.value;
  if (r.watching_) return;
  r.watching_ = true;
  r.recovering_for_ = r.orphaned_for_ = std::chrono::milliseconds{0};
  ctx.arm_timer(watch_timer, watch_tick);
}

template <class Ctx>
void replica_log_server_part::on_timer(Ctx ctx, std::uint32_t timer) {
  auto& r = rt_.value;
  if (timer == ack_timer) {
    send_owed_acks(ctx);
    return;
  }
  if (timer != watch_timer || !r.watching_) return;
  if (r.mode_ == mode::recovering) {
    r.recovering_for_ += watch_tick;
    if (r.recovering_for_ >= options.recovery_timeout) finish_recovery(ctx, true);
  }
  if (has_orphans()) {
    r.orphaned_for_ += watch_tick;
    if (r.orphaned_for_ >= options.void_timeout) {
      for (std::uint32_t w = 0; w < r.met_.size(); ++w)
        if (!ctx.worker_connected(w)) void_unconfirmed(ctx, w);
      ctx.log("dropped the unconfirmed updates of disconnected workers after " +
              std::to_string(options.void_timeout.count()) + " ms");
      release(ctx);
      r.orphaned_for_ = std::chrono::milliseconds{0};
    }
  } else {
    r.orphaned_for_ = std::chrono::milliseconds{0};
  }
  // commit_timeout: the same unconfirmed order at the front, tick after tick.
  const held* b = options.commit_timeout.count() > 0 ? blocking() : nullptr;
  if (b == nullptr) {
    r.blocked_position_ = 0;
    r.blocked_for_ = std::chrono::milliseconds{0};
  } else if (b->position != r.blocked_position_) {
    r.blocked_position_ = b->position;
    r.blocked_for_ = watch_tick;
  } else {
    r.blocked_for_ += watch_tick;
    if (r.blocked_for_ >= options.commit_timeout) {
      r.blocked_for_ = std::chrono::milliseconds{0};
      commit_timed_out(ctx);
    }
  }
  const bool blocked = options.commit_timeout.count() > 0 && blocking() != nullptr;
  if (r.mode_ == mode::recovering || has_orphans() || blocked) {
    ctx.arm_timer(watch_timer, watch_tick);
  } else {
    r.watching_ = false;
  }
}

inline bool replica_log_server_part::has_orphans() const noexcept {
  for (std::size_t i = 0; i < rt_.value.held_.size(); ++i)
    if (rt_.value.held_[i].position != 0 && !rt_.value.held_[i].confirmed &&
        rt_.value.held_[i].session == nullptr)
      return true;
  return false;
}

}  // namespace asyncps::recovery
