// asyncps — recovery::checkpoint: periodic two-phase checkpoints of every server shard, restored
// when a server starts; workers reconnect to a restarted server.
//
// Follows CheckFreq (Mohan et al., FAST'21): a checkpoint is a cheap in-memory *snapshot* taken
// on the server's executor at a clock boundary (`basic_server::save_state`, one memcpy of
// parameters and optimizer state), then a *persist* on one background thread
// (`detail::write_checkpoint`: write, fsync, atomic rename). At most one persist is in flight;
// a checkpoint that falls due while one is still running is skipped. The interval is fixed
// (every N clocks and/or every T seconds) or adaptive: profiled from the measured snapshot,
// persist and clock times, and grown while the observed overhead exceeds a bound.
//
// A restarted server loses at most the updates since its newest valid checkpoint (one
// interval, plus the one being persisted when it died). See docs/recovery/checkpoint.md.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>

#include "asyncps/detail/checkpoint_file.hpp"
#include "asyncps/error.hpp"
#include "asyncps/recovery.hpp"
#include "asyncps/result.hpp"
#include "asyncps/shard_state.hpp"
#include "asyncps/table.hpp"

namespace asyncps::recovery {

/// How the checkpoint policy persists one snapshot: write `state` to `file` (atomically: a
/// reader must never see a partial file under that name). Called on the persist thread, one
/// call at a time. The default is `detail::write_checkpoint`. Replace it to inject delays or
/// failures in tests, or to copy the file elsewhere after writing it.
using checkpoint_writer =
    std::function<result<void>(const std::filesystem::path& file, const shard_state& state)>;

/// Configuration of `checkpoint::server_part` (and of `checkpoint::worker_part`'s timeout).
///
/// Triggers: with `max_overhead == 0` a checkpoint is due when `every_clocks > 0` and that many
/// server clocks have passed since the last one, or when `every_seconds > 0` and that much time
/// has passed (whichever comes first). With `max_overhead > 0` the interval is adaptive (see
/// `checkpoint::server_part`); `every_clocks` is then only the first interval and
/// `every_seconds` is ignored. Triggers are evaluated when the server clock advances (an idle
/// server takes no checkpoints). With all three zero nothing is written: the policy only
/// restores.
struct checkpoint_options {
  /// Where the checkpoint files live (`shard-<s>-clock-<c>.ckpt`); several shards may share
  /// it. Created when missing. Empty: the policy is disabled (no restore, no checkpoints).
  std::filesystem::path directory{};
  std::uint64_t every_clocks = 0;  ///< fixed interval in server clocks; 0: no clock trigger
  double every_seconds = 0;        ///< fixed interval in seconds (steady clock); 0: none
  /// Adaptive interval when > 0: the largest fraction of the server's time that checkpointing
  /// may cost (snapshot time plus the slowdown while persisting), e.g. 0.05 = 5%.
  double max_overhead = 0;
  /// Checkpoint files of this shard kept after each successful persist (newest first);
  /// 0 keeps all.
  std::uint32_t keep = 2;
  /// Log sink for restores, rejected files and failed persists: one line, no trailing
  /// newline. Called only on the server's executor. Empty: stderr.
  std::function<void(std::string_view)> log{};
  /// How long a worker may try to reconnect to a lost server (`worker_part`).
  std::chrono::milliseconds reconnect_timeout{30000};
  /// How a snapshot is written; empty: `detail::write_checkpoint`. Called on the persist
  /// thread.
  checkpoint_writer writer{};
};

/// Counters of a `checkpoint::server_part`. A copy, taken under the part's lock.
struct checkpoint_stats {
  std::uint64_t checkpoints_persisted = 0;  ///< snapshots written successfully
  /// Checkpoints that fell due while the previous persist was still running (not taken).
  std::uint64_t skipped = 0;
  std::uint64_t failed = 0;               ///< snapshots or persists that failed (see `last_error`)
  clock_value last_persisted_clock = -1;  ///< server clock of the newest persisted file; -1: none
  clock_value restored_clock = -1;        ///< server clock restored at start; -1: started fresh
  double snapshot_seconds_total = 0;      ///< seconds spent snapshotting on the server's executor
  double persist_seconds_total = 0;       ///< seconds spent persisting on the background thread
  double last_snapshot_seconds = 0;       ///< seconds of the newest snapshot
  double last_persist_seconds = 0;        ///< seconds of the newest successful persist
  std::uint64_t last_bytes = 0;           ///< parameter + optimizer bytes of the newest snapshot
  /// The current interval k in server clocks: `every_clocks` in fixed mode, the adaptive k
  /// otherwise; 0 when no clock trigger is set.
  std::uint64_t interval_clocks = 0;
  double clock_seconds = 0;  ///< measured seconds between server clocks (moving average)
  /// Adaptive mode: the overhead measured over the last completed interval (fraction of time).
  double observed_overhead = 0;
  std::error_code last_error{};    ///< the newest failure; empty if none
  std::string last_error_message;  ///< a line naming the file and the reason
};

/// The checkpoint recovery policy. Follows CheckFreq (Mohan et al., FAST'21).
///
/// Server part: restores the newest valid checkpoint of its shard when `async_serve` starts and
/// checkpoints at server clock boundaries. Worker part: on a lost server connection, reconnect
/// (within `reconnect_timeout`) and resume from the restored state.
struct checkpoint {
  static constexpr std::string_view name = "checkpoint";

  /// Per-server state and hooks (see the class comment of `checkpoint`).
  ///
  /// Adaptive interval (`max_overhead > 0`), following CheckFreq: with t_snap the last snapshot
  /// time, t_persist the last persist time and t_clock the moving average of the time between
  /// server clocks (measured while no persist runs),
  ///   k = max(ceil(t_persist / t_clock), ceil(t_snap / (max_overhead * t_clock)), k_min, 1)
  /// — CheckFreq's `max(ceil((t_full - t_snap) / t_clock), 1)` with t_full = t_snap + t_persist,
  /// so the next checkpoint falls due when the previous persist has finished, plus the
  /// predicted-overhead bound. At each checkpoint that falls due after a window of at least
  /// 10 clocks, the observed overhead over the window (snapshot time plus the extra clock time
  /// while persisting, over the window's wall time) is compared with `max_overhead`; when it
  /// is above, k_min = k + 2 (CheckFreq's step) and a new window starts. A skipped checkpoint
  /// also sets k_min = k + 2. k never shrinks below k_min. The first checkpoint (which
  /// profiles snapshot and persist) falls due after max(every_clocks, 1) clocks.
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
  class server_part {
   public:
    /// Disabled: restores nothing and writes nothing.
    server_part() = default;

    /// Configured by `opts`. Throws `std::invalid_argument` naming the field when a trigger
    /// is set without a directory, or an interval or bound is negative or not finite.
    explicit server_part(checkpoint_options opts) {
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
      adaptive_ = opts.max_overhead > 0;
      active_ = triggers;
      k_ = std::max<std::uint64_t>(opts.every_clocks, 1);
      rt_ = std::make_unique<runtime>(std::move(opts));
      rt_->stats.interval_clocks = adaptive_ ? k_ : rt_->opts.every_clocks;
      last_time_ = steady::now();
    }

    /// Movable (basic_server takes its part by value). Moving a part whose persist thread runs
    /// is safe: the thread only refers to heap state that moves with the part.
    server_part(server_part&&) noexcept = default;
    server_part& operator=(server_part&&) noexcept = default;
    server_part(const server_part&) = delete;
    server_part& operator=(const server_part&) = delete;
    /// Waits for the persist in flight, if any, and joins the thread.
    ~server_part() = default;

    /// True when a directory is configured.
    bool enabled() const noexcept { return rt_ != nullptr; }

    /// The options (default-constructed ones when disabled).
    const checkpoint_options& options() const noexcept {
      static const checkpoint_options disabled{};
      return rt_ ? rt_->opts : disabled;
    }

    /// A copy of the counters. Thread safety: any thread.
    checkpoint_stats stats() const {
      if (!rt_) return {};
      std::lock_guard lock(rt_->m);
      return rt_->stats;
    }

    /// Blocks until no persist is in flight. On the server's executor this stalls the server
    /// until the write ends: meant for tests and shutdown. Thread safety: any thread but the
    /// persist thread (i.e. not from `options().writer`).
    void wait_persisted() const {
      if (!rt_) return;
      std::unique_lock lock(rt_->m);
      rt_->cv.wait(lock, [&] { return !rt_->in_flight; });
    }

    /// Hook, called by `basic_server::async_serve` before it accepts connections, on the
    /// server's executor. Creates the directory, removes unfinished `.tmp` files of this shard
    /// (a crash during a persist), then restores the newest checkpoint of shard
    /// `s.options().shard` that reads back valid (`detail::read_checkpoint`) and fits the
    /// server (`s.restore_state`); every rejected file is logged with its reason and the next
    /// older one is tried. Sets `stats().restored_clock` (-1 when none was restored).
    /// `Server` provides `options().shard` and `std::error_code restore_state(const
    /// shard_state&)`.
    template <class Server>
    void on_start(Server& s) noexcept {
      if (!rt_) return;
      shard_ = s.options().shard;
      try {
        wait_persisted();
        restore(s);
      } catch (const std::exception& e) {
        note_error(std::make_error_code(std::errc::not_enough_memory),
                   std::string("restore failed: ") + e.what());
      }
      have_prev_ = false;
      last_time_ = steady::now();
    }

    /// Hook, called by `basic_server` when its clock advances to `c`, on the server's executor
    /// (before pulls waiting for `c` are answered). When a checkpoint is due and no persist is
    /// in flight, snapshots the shard with `s.save_state` into the reused buffer (cost: one
    /// memcpy of `shard_state::data_bytes()` bytes) and hands it to the persist thread; when
    /// one is in flight the checkpoint is skipped (`stats().skipped`). Also logs persists that
    /// failed since the last call. `Server` provides `void save_state(shard_state&) const`.
    template <class Server>
    void on_clock(clock_value c, const Server& s) noexcept {
      if (!rt_ || !active_) return;
      const auto now = steady::now();
      bool in_flight = false;
      {
        std::lock_guard lock(rt_->m);
        in_flight = rt_->in_flight;
        collect_locked();
        publish_locked();  // as of the previous clock
      }
      report_collected();
      measure(now, in_flight);
      update_k();
      if (!due(c, now)) {
        finish_clock(in_flight);
        return;
      }
      if (adaptive_ && have_window_ && win_clocks_ >= min_window_clocks) {
        const double interval = seconds(now - win_start_);
        observed_ = interval > 0 ? std::max(0.0, extra_s_) / interval : 0;
        if (observed_ > rt_->opts.max_overhead) k_min_ = k_ + 2;
        extra_s_ = 0;
        win_start_ = now;
        win_clocks_ = 0;
      }
      last_clock_ = c;
      last_time_ = now;
      if (in_flight) {
        if (adaptive_) k_min_ = std::max(k_min_, k_ + 2);
        update_k();
        std::lock_guard lock(rt_->m);
        ++rt_->stats.skipped;
        publish_locked();
        finish_clock(true);
        return;
      }
      const bool started = snapshot(c, s, now);
      update_k();
      {
        std::lock_guard lock(rt_->m);
        publish_locked();
      }
      finish_clock(started || in_flight);
    }

    /// Hook, called by `basic_server::async_serve` after its last connection closed, on the
    /// server's executor: waits for the persist in flight (so the newest snapshot is on disk),
    /// joins the persist thread and logs a failure it reported. A later `on_clock` starts a
    /// new thread.
    void on_stop() noexcept {
      if (!rt_) return;
      rt_->stop_and_join();
      {
        std::lock_guard lock(rt_->m);
        collect_locked();
      }
      report_collected();
    }

   private:
    using steady = std::chrono::steady_clock;

    static double seconds(steady::duration d) noexcept {
      return std::chrono::duration<double>(d).count();
    }

    // State shared with the persist thread; heap-allocated so the part stays movable.
    struct runtime {
      explicit runtime(checkpoint_options o) : opts(std::move(o)) {}
      runtime(const runtime&) = delete;
      runtime& operator=(const runtime&) = delete;
      ~runtime() { stop_and_join(); }

      const checkpoint_options opts;
      std::mutex m;
      std::condition_variable cv;
      std::thread thread;  // started and joined by the owner only (executor, destructor)

      // Guarded by m.
      bool pending = false;    // a snapshot waits for the thread
      bool in_flight = false;  // pending or being written: the executor must not touch buffer
      bool stop = false;
      clock_value job_clock = 0;
      checkpoint_stats stats{};
      bool result_ready = false;  // a persist finished since the executor last looked
      double result_seconds = 0;
      std::error_code result_error{};
      std::string result_why;

      // Owned by the executor while !in_flight, by the thread while in_flight.
      shard_state buffer{};

      void stop_and_join() noexcept {
        if (!thread.joinable()) return;
        {
          std::lock_guard lock(m);
          stop = true;
        }
        cv.notify_all();
        try {
          thread.join();
        } catch (const std::system_error&) {
          thread.detach();  // cannot happen for a joinable thread of another id
        }
        std::lock_guard lock(m);
        stop = false;
      }

      void run() noexcept {
        std::unique_lock lock(m);
        for (;;) {
          cv.wait(lock, [&] { return pending || stop; });
          if (!pending) return;  // stop with nothing left to persist
          pending = false;
          const clock_value c = job_clock;
          lock.unlock();
          const auto t0 = steady::now();
          std::error_code ec;
          std::string why;
          bool written = false;
          try {
            written = persist(c, ec, why);
          } catch (const std::bad_alloc&) {
            ec = std::make_error_code(std::errc::not_enough_memory);
            why = "checkpoint persist: out of memory";
          } catch (const std::exception& e) {
            ec = std::make_error_code(std::errc::io_error);
            why = std::string("checkpoint persist: ") + e.what();
          }
          const double secs = seconds(steady::now() - t0);
          lock.lock();
          if (written) {
            ++stats.checkpoints_persisted;
            stats.last_persisted_clock = c;
            stats.persist_seconds_total += secs;
            stats.last_persist_seconds = secs;
          } else {
            ++stats.failed;
          }
          if (ec) {
            stats.last_error = ec;
            stats.last_error_message = why;
          }
          result_ready = true;
          result_seconds = written ? secs : 0;
          result_error = ec;
          result_why = std::move(why);
          in_flight = false;
          cv.notify_all();
        }
      }

      // Writes `buffer` as the checkpoint at clock c, then prunes. True when the file was
      // written (a pruning error is reported in ec/why but the checkpoint counts).
      bool persist(clock_value c, std::error_code& ec, std::string& why) {
        const std::filesystem::path file =
            opts.directory / detail::checkpoint_file_name(buffer.shard, c);
        result<void> r =
            opts.writer ? opts.writer(file, buffer) : detail::write_checkpoint(file, buffer, &why);
        if (r.has_error()) {
          ec = r.error();
          if (why.empty()) why = "checkpoint " + file.string() + ": " + ec.message();
          return false;
        }
        auto pruned = detail::prune_checkpoints(opts.directory, buffer.shard, opts.keep);
        if (pruned.has_error()) {
          ec = pruned.error();
          why = "checkpoint " + file.string() + " written, but pruning old checkpoints in " +
                opts.directory.string() + " failed: " + ec.message();
        }
        return true;
      }
    };

    template <class Server>
    void restore(Server& s) {
      const auto& dir = rt_->opts.directory;
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec) {
        note_error(ec, "cannot create checkpoint directory " + dir.string() + ": " + ec.message());
        return;
      }
      if (auto tmps = detail::list_stale_checkpoint_tmps(dir, shard_); tmps.has_value()) {
        for (const auto& t : tmps.value()) {
          std::filesystem::remove(t, ec);
          log("removed unfinished checkpoint " + t.string() + " (a persist was interrupted)" +
              (ec ? " failed: " + ec.message() : std::string()));
        }
      }
      auto files = detail::list_checkpoints(dir, shard_);
      if (files.has_error()) {
        note_error(files.error(), "cannot list checkpoint directory " + dir.string() + ": " +
                                      files.error().message());
        return;
      }
      clock_value restored = -1;
      for (const auto& f : files.value()) {
        std::string why;
        auto r = detail::read_checkpoint(f.path, rt_->buffer, &why);
        if (r.has_error()) {
          log("rejected " + why + "; trying an older checkpoint");
          continue;
        }
        if (auto rec = s.restore_state(rt_->buffer)) {
          log("rejected checkpoint " + f.path.string() + ": it does not fit this server (" +
              rec.message() + "); trying an older checkpoint");
          continue;
        }
        restored = rt_->buffer.server_clock;
        log("restored from " + f.path.string() + " (server clock " + std::to_string(restored) +
            ")");
        break;
      }
      if (restored < 0)
        log(files.value().empty()
                ? "no checkpoint of this shard in " + dir.string() + "; starting fresh"
                : "no valid checkpoint of this shard in " + dir.string() + "; starting fresh");
      last_clock_ = std::max<clock_value>(restored, 0);
      std::lock_guard lock(rt_->m);
      rt_->stats.restored_clock = restored;
    }

    // Clock timing: the time between the end of one on_clock and the start of the next (so
    // snapshot time is not counted twice). Intervals touched by a persist add their excess
    // over the baseline to the overhead; the others feed the baseline (and, so it cannot go
    // stale when persists overlap most clocks, every 16th touched one does too).
    void measure(steady::time_point now, bool in_flight) noexcept {
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

    void finish_clock(bool in_flight) noexcept {
      prev_time_ = steady::now();
      prev_in_flight_ = in_flight;
      have_prev_ = true;
    }

    bool due(clock_value c, steady::time_point now) const noexcept {
      const std::uint64_t since = c > last_clock_ ? static_cast<std::uint64_t>(c - last_clock_) : 0;
      if (adaptive_) return since >= k_;
      const auto& o = rt_->opts;
      return (o.every_clocks > 0 && since >= o.every_clocks) ||
             (o.every_seconds > 0 && seconds(now - last_time_) >= o.every_seconds);
    }

    void update_k() noexcept {
      if (!adaptive_) return;
      std::uint64_t k = std::max<std::uint64_t>(k_min_, 1);
      if (t_clock_ > 0 && have_snapshot_) {
        constexpr double cap = 1e12;
        const double kp = have_persist_ ? std::ceil(persist_s_ / t_clock_) : 1.0;
        const double ko = std::ceil(snapshot_s_ / (rt_->opts.max_overhead * t_clock_));
        const double best = std::min(cap, std::max({1.0, kp, ko}));
        k = std::max(k, static_cast<std::uint64_t>(best));
      } else {
        k = std::max(k, k_);
      }
      k_ = k;
    }

    // Snapshots into the buffer and hands it to the thread. True when a persist started.
    template <class Server>
    bool snapshot(clock_value c, const Server& s, steady::time_point now) noexcept {
      try {
        if (!rt_->thread.joinable()) {
          runtime* r = rt_.get();
          rt_->thread = std::thread([r] { r->run(); });
        }
        s.save_state(rt_->buffer);  // the thread is idle: !in_flight
      } catch (const std::exception& e) {
        note_error(std::make_error_code(std::errc::not_enough_memory),
                   std::string("checkpoint snapshot at clock ") + std::to_string(c) +
                       " failed: " + e.what());
        std::lock_guard lock(rt_->m);
        ++rt_->stats.failed;
        return false;
      }
      const double snap = seconds(steady::now() - now);
      snapshot_s_ = snap;
      have_snapshot_ = true;
      if (!have_window_) {
        have_window_ = true;
        win_start_ = now;
        win_clocks_ = 0;
        extra_s_ = 0;
      }
      extra_s_ += snap;
      {
        std::lock_guard lock(rt_->m);
        rt_->job_clock = c;
        rt_->pending = true;
        rt_->in_flight = true;
        rt_->stats.snapshot_seconds_total += snap;
        rt_->stats.last_snapshot_seconds = snap;
        rt_->stats.last_bytes = rt_->buffer.data_bytes();
      }
      rt_->cv.notify_all();
      return true;
    }

    // Takes a finished persist's result (under the lock) for report_collected.
    void collect_locked() {
      if (!rt_->result_ready) return;
      rt_->result_ready = false;
      if (rt_->result_seconds > 0 || !rt_->result_error) {
        persist_s_ = rt_->result_seconds;
        have_persist_ = true;
      }
      if (rt_->result_error) {
        collected_error_ = true;
        std::swap(collected_why_, rt_->result_why);
      }
    }

    void report_collected() noexcept {
      if (!collected_error_) return;
      collected_error_ = false;
      log(collected_why_);
    }

    void publish_locked() noexcept {
      rt_->stats.interval_clocks = adaptive_ ? k_ : rt_->opts.every_clocks;
      rt_->stats.clock_seconds = t_clock_;
      rt_->stats.observed_overhead = observed_;
    }

    void note_error(std::error_code ec, const std::string& why) noexcept {
      try {
        {
          std::lock_guard lock(rt_->m);
          rt_->stats.last_error = ec;
          rt_->stats.last_error_message = why;
        }
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
    bool active_ = false;    // some trigger is set
    bool adaptive_ = false;  // max_overhead > 0
    std::uint32_t shard_ = 0;
    clock_value last_clock_ = 0;      // clock of the last checkpoint taken or skipped (or restored)
    steady::time_point last_time_{};  // when it was
    bool have_prev_ = false;
    bool prev_in_flight_ = false;
    steady::time_point prev_time_{};  // end of the previous on_clock
    double t_clock_ = 0;              // moving average of seconds per clock
    double snapshot_s_ = 0;
    double persist_s_ = 0;
    bool have_snapshot_ = false;
    bool have_persist_ = false;
    // Overhead observation window (adaptive mode), from the first snapshot on.
    static constexpr std::uint64_t min_window_clocks = 10;
    bool have_window_ = false;
    steady::time_point win_start_{};
    std::uint64_t win_clocks_ = 0;
    double extra_s_ = 0;  // overhead seconds in the window: snapshots + excess clock time
    std::uint64_t stale_clocks_ = 0;  // persist-touched clocks since the baseline was updated
    double observed_ = 0;
    std::uint64_t k_ = 1;
    std::uint64_t k_min_ = 1;
    bool collected_error_ = false;
    std::string collected_why_;
  };

  /// Per-worker part: a lost server is reconnected to (the restarted server restores its
  /// newest checkpoint; its welcome tells the worker its clock and pushes as restored, so
  /// the worker learns how many of its pushes were lost). Thread safety: the worker's
  /// executor.
  class worker_part {
   public:
    /// Reconnect timeout 30 s.
    worker_part() = default;
    /// Reconnect timeout `o.reconnect_timeout`.
    explicit worker_part(const checkpoint_options& o) noexcept : timeout_(o.reconnect_timeout) {}
    /// Reconnect timeout `timeout`.
    explicit worker_part(std::chrono::milliseconds timeout) noexcept : timeout_(timeout) {}

    /// Always `recovery_action::reconnect`: any loss (transient or not) may be a server that
    /// is restarting; `reconnect_timeout()` bounds the attempt.
    recovery_action on_server_lost(std::error_code) const noexcept {
      return recovery_action::reconnect;
    }
    /// How long the worker may try to reconnect before ending with `errc::server_lost`.
    std::chrono::milliseconds reconnect_timeout() const noexcept { return timeout_; }

   private:
    std::chrono::milliseconds timeout_{30000};
  };
};

static_assert(recovery_policy<checkpoint>);
static_assert(std::is_nothrow_move_constructible_v<checkpoint::server_part>);

}  // namespace asyncps::recovery
