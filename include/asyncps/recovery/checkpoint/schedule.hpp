// asyncps — recovery::checkpoint: the CheckFreq schedule, i.e. when a checkpoint falls due.
//
// Pure: it reads no clock, owns no thread and touches no file. The server part passes it the
// time points it read from its injected clock, and unit tests drive it with made-up times.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>

#include "asyncps/layout.hpp"

namespace asyncps::recovery {

/// What `checkpoint_schedule::at_clock` decides at a server clock boundary.
enum class checkpoint_decision {
  not_due,   ///< no checkpoint now
  skip,      ///< one is due, but the previous persist is still in flight: count a skip
  snapshot,  ///< one is due: snapshot now and hand it to the persist thread
};

/// The interval math of `recovery::checkpoint`: fixed (every N clocks and/or every T seconds)
/// or adaptive, following CheckFreq (Mohan et al., FAST'21).
///
/// Adaptive interval (`max_overhead > 0`): with t_snap the last snapshot time, t_persist the
/// last persist time and t_clock the moving average of the time between server clocks
/// (measured while no persist runs),
///   k = max(ceil(t_persist / t_clock), ceil(t_snap / (max_overhead * t_clock)), k_min, 1)
/// — CheckFreq's `max(ceil((t_full - t_snap) / t_clock), 1)` with t_full = t_snap + t_persist,
/// so the next checkpoint falls due when the previous persist has finished, plus the
/// predicted-overhead bound. At each checkpoint that falls due after a window of at least
/// `min_window_clocks` clocks, the observed overhead over the window (snapshot time plus the
/// extra clock time while persisting, over the window's wall time) is compared with
/// `max_overhead`; when it is above, k_min = k + 2 (CheckFreq's step) and a new window starts.
/// A skipped checkpoint also sets k_min = k + 2. k never shrinks below k_min. The first
/// checkpoint (which profiles snapshot and persist) falls due after max(every_clocks, 1)
/// clocks.
///
/// Clock timing: the time between the end of one clock boundary (`clock_done`) and the start
/// of the next (`at_clock`), so snapshot time is not counted twice. Intervals touched by a
/// persist add their excess over the baseline to the overhead; the others feed the baseline
/// (and, so it cannot go stale when persists overlap most clocks, every 16th touched one does
/// too).
///
/// Per boundary the owner calls, in order: `persist_finished` for a persist that ended since
/// the last boundary, `at_clock`, `snapshot_taken` when it snapshotted, then `clock_done`.
/// Not thread-safe: one owner (the server's executor). Allocates nothing.
class checkpoint_schedule {
 public:
  /// The time points it is given (those of `checkpoint_clock`).
  using time_point = std::chrono::steady_clock::time_point;
  /// Clocks an overhead observation window lasts at least.
  static constexpr std::uint64_t min_window_clocks = 10;

  /// Never due.
  checkpoint_schedule() = default;

  /// Fixed when `max_overhead == 0` (due after `every_clocks` clocks, if > 0, or
  /// `every_seconds` seconds, if > 0), adaptive otherwise. `now`: the time the first
  /// `every_seconds` interval counts from. Preconditions: `every_seconds` and `max_overhead`
  /// are finite and >= 0 (the server part's constructor checks them).
  checkpoint_schedule(std::uint64_t every_clocks, double every_seconds, double max_overhead,
                      time_point now) noexcept
      : every_clocks_(every_clocks), every_seconds_(every_seconds), max_overhead_(max_overhead),
        active_(every_clocks > 0 || every_seconds != 0 || max_overhead != 0),
        adaptive_(max_overhead > 0), last_time_(now), k_(std::max<std::uint64_t>(every_clocks, 1)) {
  }

  /// True when some trigger is set (otherwise `at_clock` is never called).
  bool active() const noexcept { return active_; }

  /// The next interval counts from server clock `c` (a restored checkpoint's, or 0).
  void count_from(clock_value c) noexcept { last_clock_ = c; }

  /// The server (re)starts at `now`: the time trigger counts from it and the clock timing
  /// starts over.
  void start(time_point now) noexcept {
    have_prev_ = false;
    last_time_ = now;
  }

  /// A persist finished; it took `seconds` (0 when it failed without timing).
  void persist_finished(double seconds) noexcept {
    persist_s_ = seconds;
    have_persist_ = true;
  }

  /// The server clock advanced to `c` at `now`; `in_flight`: a persist is still running.
  /// Updates the clock timing, the adaptive k and the overhead window, and decides.
  checkpoint_decision at_clock(clock_value c, time_point now, bool in_flight) noexcept {
    measure(now, in_flight);
    update_k();
    if (!due(c, now)) return checkpoint_decision::not_due;
    if (adaptive_ && have_window_ && win_clocks_ >= min_window_clocks) {
      const double interval = seconds(now - win_start_);
      observed_ = interval > 0 ? std::max(0.0, extra_s_) / interval : 0;
      if (observed_ > max_overhead_) k_min_ = k_ + 2;
      extra_s_ = 0;
      win_start_ = now;
      win_clocks_ = 0;
    }
    last_clock_ = c;
    last_time_ = now;
    if (!in_flight) {
      update_k();  // the window may have raised k_min
      return checkpoint_decision::snapshot;
    }
    if (adaptive_) k_min_ = std::max(k_min_, k_ + 2);
    update_k();
    return checkpoint_decision::skip;
  }

  /// The snapshot decided at `started` (the `now` of `at_clock`) took `seconds`.
  void snapshot_taken(double seconds, time_point started) noexcept {
    snapshot_s_ = seconds;
    have_snapshot_ = true;
    if (!have_window_) {
      have_window_ = true;
      win_start_ = started;
      win_clocks_ = 0;
      extra_s_ = 0;
    }
    extra_s_ += seconds;
    update_k();
  }

  /// The clock boundary ended at `now`; `in_flight`: a persist runs (or was just started).
  void clock_done(time_point now, bool in_flight) noexcept {
    prev_time_ = now;
    prev_in_flight_ = in_flight;
    have_prev_ = true;
  }

  /// The current interval k in clocks: `every_clocks` in fixed mode, the adaptive k otherwise.
  std::uint64_t interval_clocks() const noexcept { return adaptive_ ? k_ : every_clocks_; }
  /// The moving average of seconds between server clocks (0 before two clocks were seen).
  double clock_seconds() const noexcept { return t_clock_; }
  /// Adaptive mode: the overhead observed over the last completed window (fraction of time).
  double observed_overhead() const noexcept { return observed_; }

  /// `d` in seconds.
  static double seconds(std::chrono::steady_clock::duration d) noexcept {
    return std::chrono::duration<double>(d).count();
  }

 private:
  void measure(time_point now, bool in_flight) noexcept {
    if (!have_prev_) return;
    const double dt = seconds(now - prev_time_);
    ++win_clocks_;
    if (t_clock_ <= 0) {
      t_clock_ = dt;
      return;
    }
    if (prev_in_flight_ || in_flight) {
      extra_s_ += dt - t_clock_;  // signed: noise cancels over the window
      if (++stale_clocks_ < 16) return;
    }
    stale_clocks_ = 0;
    t_clock_ = 0.8 * t_clock_ + 0.2 * dt;
  }

  bool due(clock_value c, time_point now) const noexcept {
    const std::uint64_t since = c > last_clock_ ? static_cast<std::uint64_t>(c - last_clock_) : 0;
    if (adaptive_) return since >= k_;
    return (every_clocks_ > 0 && since >= every_clocks_) ||
           (every_seconds_ > 0 && seconds(now - last_time_) >= every_seconds_);
  }

  void update_k() noexcept {
    if (!adaptive_) return;
    std::uint64_t k = std::max<std::uint64_t>(k_min_, 1);
    if (t_clock_ > 0 && have_snapshot_) {
      constexpr double cap = 1e12;
      const double kp = have_persist_ ? std::ceil(persist_s_ / t_clock_) : 1.0;
      const double ko = std::ceil(snapshot_s_ / (max_overhead_ * t_clock_));
      const double best = std::min(cap, std::max({1.0, kp, ko}));
      k = std::max(k, static_cast<std::uint64_t>(best));
    } else {
      k = std::max(k, k_);
    }
    k_ = k;
  }

  std::uint64_t every_clocks_ = 0;
  double every_seconds_ = 0;
  double max_overhead_ = 0;
  bool active_ = false;
  bool adaptive_ = false;
  clock_value last_clock_ = 0;  // clock of the last checkpoint taken or skipped (or restored)
  time_point last_time_{};      // when it was
  bool have_prev_ = false;
  bool prev_in_flight_ = false;
  time_point prev_time_{};  // end of the previous clock boundary
  double t_clock_ = 0;      // moving average of seconds per clock
  double snapshot_s_ = 0;
  double persist_s_ = 0;
  bool have_snapshot_ = false;
  bool have_persist_ = false;
  // Overhead observation window (adaptive mode), from the first snapshot on.
  bool have_window_ = false;
  time_point win_start_{};
  std::uint64_t win_clocks_ = 0;
  double extra_s_ = 0;              // overhead seconds in the window: snapshots + excess time
  std::uint64_t stale_clocks_ = 0;  // persist-touched clocks since the baseline was updated
  double observed_ = 0;
  std::uint64_t k_ = 1;
  std::uint64_t k_min_ = 1;
};

}  // namespace asyncps::recovery
