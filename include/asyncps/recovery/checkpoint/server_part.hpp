// asyncps — recovery::checkpoint, server part: restores at start, snapshots at clock
// boundaries when the schedule says so, and hands the snapshot to the persist thread.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "asyncps/layout.hpp"
#include "asyncps/recovery/checkpoint/options.hpp"
#include "asyncps/recovery/checkpoint/persister.hpp"
#include "asyncps/recovery/checkpoint/schedule.hpp"
#include "asyncps/recovery/checkpoint/store.hpp"
#include "asyncps/shard_state.hpp"

namespace asyncps::recovery {

/// recovery::checkpoint, server part: per-server state and hooks (see `recovery::checkpoint`).
///
/// Composes a `checkpoint_schedule` (when a checkpoint falls due: fixed or CheckFreq's adaptive
/// interval), a `checkpoint_store` (the files: names, pruning, the restore scan) and a
/// `checkpoint_persister` (the background thread). Time comes from `checkpoint_options::clock`.
///
/// Thread safety: the hooks (`on_start`, `on_clock`, `on_stop`) run on the server's
/// executor, one at a time. `stats()` and `wait_persisted()` may be called from any thread.
/// One background thread (started at the first checkpoint, joined by `on_stop` and the
/// destructor) persists snapshots; it shares only the snapshot buffer (handed over under a
/// mutex: the executor never touches it while a persist is in flight) and the counters.
/// `options().log` is called only on the executor; `options().writer` only on the thread.
///
/// Memory: one snapshot buffer (`shard_state::data_bytes()` plus the clocks), allocated by the
/// first snapshot or restore and reused afterwards: steady-state snapshots do not allocate.
class checkpoint_server_part {
 public:
  /// Disabled: restores nothing and writes nothing.
  checkpoint_server_part() = default;

  /// Configured by `opts`. Throws `std::invalid_argument` naming the field when a trigger
  /// is set without a directory, or an interval or bound is negative or not finite.
  explicit checkpoint_server_part(checkpoint_options opts) {
    const bool triggers =
        opts.every_clocks > 0 || opts.every_seconds != 0 || opts.max_overhead != 0;
    if (!(opts.every_seconds >= 0) || !std::isfinite(opts.every_seconds))
      throw std::invalid_argument("asyncps::checkpoint_options: every_seconds must be >= 0");
    if (!(opts.max_overhead >= 0) || !std::isfinite(opts.max_overhead))
      throw std::invalid_argument("asyncps::checkpoint_options: max_overhead must be >= 0");
    if (triggers && opts.directory.empty())
      throw std::invalid_argument(
          "asyncps::checkpoint_options: directory must be set when a checkpoint trigger is");
    if (opts.directory.empty()) return;
    rt_ = std::make_unique<runtime>(std::move(opts));
    const auto& o = rt_->opts;
    schedule_ = checkpoint_schedule(o.every_clocks, o.every_seconds, o.max_overhead, now());
    rt_->persister.update_stats(
        [&](checkpoint_stats& s) { s.interval_clocks = schedule_.interval_clocks(); });
  }

  /// Movable (basic_server takes its part by value). Moving a part whose persist thread runs
  /// is safe: the thread only refers to heap state that moves with the part.
  checkpoint_server_part(checkpoint_server_part&&) noexcept = default;
  checkpoint_server_part& operator=(checkpoint_server_part&&) noexcept = default;
  checkpoint_server_part(const checkpoint_server_part&) = delete;
  checkpoint_server_part& operator=(const checkpoint_server_part&) = delete;
  /// Waits for the persist in flight, if any, and joins the thread.
  ~checkpoint_server_part() = default;

  /// True when a directory is configured.
  bool enabled() const noexcept { return rt_ != nullptr; }

  /// The options (default-constructed ones when disabled).
  const checkpoint_options& options() const noexcept {
    static const checkpoint_options disabled{};
    return rt_ ? rt_->opts : disabled;
  }

  /// A copy of the counters. Thread safety: any thread.
  checkpoint_stats stats() const { return rt_ ? rt_->persister.stats() : checkpoint_stats{}; }

  /// Blocks until no persist is in flight. On the server's executor this stalls the server
  /// until the write ends: meant for tests and shutdown. Thread safety: any thread but the
  /// persist thread (i.e. not from `options().writer`).
  void wait_persisted() const {
    if (rt_) rt_->persister.wait_idle();
  }

  /// Hook, called by `basic_server::async_serve` before it accepts connections, on the
  /// server's executor. Creates the directory, removes unfinished `.tmp` files of this shard
  /// (a crash during a persist), then restores the newest checkpoint of shard
  /// `s.options().shard` that reads back valid (`detail::read_checkpoint`) and fits the
  /// server (`s.restore_state`); every rejected file is logged with its reason and the next
  /// older one is tried (`checkpoint_store::restore`). Sets `stats().restored_clock` (-1 when
  /// none was restored). `Ctx` (the server context, or any type) provides `options().shard` and
  /// `std::error_code
  /// restore_state(const shard_state&)`.
  template <class Ctx>
  void on_start(Ctx& s) noexcept {
    if (!rt_) return;
    shard_ = s.options().shard;
    rt_->store.set_shard(shard_);
    try {
      wait_persisted();
      checkpoint_outcome failure;
      const auto restored = rt_->store.restore(
          rt_->persister.buffer(), [&s](const shard_state& st) { return s.restore_state(st); },
          [this](std::string_view line) { log(line); }, failure);
      if (restored) {
        schedule_.count_from(std::max<clock_value>(*restored, 0));
        rt_->persister.update_stats([&](checkpoint_stats& st) { st.restored_clock = *restored; });
      } else {
        note_error(failure.error, failure.why);
      }
    } catch (const std::exception& e) {
      note_error(std::make_error_code(std::errc::not_enough_memory),
                 std::string("restore failed: ") + e.what());
    }
    schedule_.start(now());
  }

  /// Hook, called by `basic_server` when its clock advances to `c`, on the server's executor
  /// (before pulls waiting for `c` are answered). When a checkpoint is due and no persist is
  /// in flight, snapshots the shard with `s.save_state` into the reused buffer (cost: one
  /// memcpy of `shard_state::data_bytes()` bytes) and hands it to the persist thread; when
  /// one is in flight the checkpoint is skipped (`stats().skipped`). Also logs persists that
  /// failed since the last call. `Ctx` (the server context, or any type) provides
  /// `void save_state(shard_state&) const`.
  template <class Ctx>
  void on_clock(clock_value c, const Ctx& s) noexcept {
    if (!rt_ || !schedule_.active()) return;
    const auto t = now();
    const bool in_flight = rt_->persister.poll(finished_);
    if (finished_.ready && (finished_.seconds > 0 || !finished_.error))
      schedule_.persist_finished(finished_.seconds);
    publish();  // as of the previous clock
    if (finished_.ready && finished_.error) log(finished_.why);
    switch (schedule_.at_clock(c, t, in_flight)) {
      case checkpoint_decision::not_due: break;
      case checkpoint_decision::skip:
        rt_->persister.update_stats([&](checkpoint_stats& st) {
          ++st.skipped;
          publish_into(st);
        });
        break;
      case checkpoint_decision::snapshot: {
        const bool started = snapshot(c, s, t);
        publish();
        schedule_.clock_done(now(), started);
        return;
      }
    }
    schedule_.clock_done(now(), in_flight);
  }

  /// Hook, called by `basic_server::async_serve` after its last connection closed, on the
  /// server's executor: waits for the persist in flight (so the newest snapshot is on disk),
  /// joins the persist thread and logs a failure it reported. A later `on_clock` starts a
  /// new thread.
  void on_stop() noexcept {
    if (!rt_) return;
    rt_->persister.stop_and_join();
    rt_->persister.poll(finished_);
    if (finished_.ready && (finished_.seconds > 0 || !finished_.error))
      schedule_.persist_finished(finished_.seconds);
    if (finished_.ready && finished_.error) log(finished_.why);
  }

 private:
  // Heap state: the persist thread refers to it, so it must not move with the part.
  struct runtime {
    explicit runtime(checkpoint_options o)
        : opts(std::move(o)), store(opts.directory, 0, opts.keep, opts.writer),
          persister(store, opts.clock) {}
    const checkpoint_options opts;
    checkpoint_store store;
    checkpoint_persister persister;  // last: joined before the store goes
  };

  std::chrono::steady_clock::time_point now() const { return checkpoint_now(rt_->opts.clock); }

  // Snapshots into the buffer and hands it to the thread. True when a persist started.
  template <class Ctx>
  bool snapshot(clock_value c, const Ctx& s, checkpoint_schedule::time_point t) noexcept {
    auto& p = rt_->persister;
    try {
      p.ensure_running();
      s.save_state(p.buffer());  // the thread is idle: !in_flight
    } catch (const std::exception& e) {
      note_error(std::make_error_code(std::errc::not_enough_memory),
                 std::string("checkpoint snapshot at clock ") + std::to_string(c) +
                     " failed: " + e.what());
      p.update_stats([](checkpoint_stats& st) { ++st.failed; });
      return false;
    }
    const double snap = checkpoint_schedule::seconds(now() - t);
    schedule_.snapshot_taken(snap, t);
    p.submit(c, [&](checkpoint_stats& st) {
      st.snapshot_seconds_total += snap;
      st.last_snapshot_seconds = snap;
      st.last_bytes = p.buffer().data_bytes();
    });
    return true;
  }

  void publish_into(checkpoint_stats& st) const noexcept {
    st.interval_clocks = schedule_.interval_clocks();
    st.clock_seconds = schedule_.clock_seconds();
    st.observed_overhead = schedule_.observed_overhead();
  }

  void publish() {
    rt_->persister.update_stats([this](checkpoint_stats& st) { publish_into(st); });
  }

  void note_error(std::error_code ec, const std::string& why) noexcept {
    try {
      rt_->persister.update_stats([&](checkpoint_stats& st) {
        st.last_error = ec;
        st.last_error_message = why;
      });
      log(why);
    } catch (...) {}
  }

  void log(std::string_view line) const noexcept {
    try {
      const std::string full =
          "asyncps checkpoint (shard " + std::to_string(shard_) + "): " + std::string(line);
      if (rt_ && rt_->opts.log) {
        rt_->opts.log(full);
      } else {
        std::fprintf(stderr, "%s\n", full.c_str());
      }
    } catch (...) {}
  }

  std::unique_ptr<runtime> rt_;
  // Executor-only state.
  checkpoint_schedule schedule_{};
  std::uint32_t shard_ = 0;
  checkpoint_persister::finished finished_{};  // the last poll's report (its `why` is reused)
};

}  // namespace asyncps::recovery
