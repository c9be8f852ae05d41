// asyncps — recovery::checkpoint: the background persist thread and the snapshot buffer it
// shares with the server's executor.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "asyncps/layout.hpp"
#include "asyncps/recovery/checkpoint/options.hpp"
#include "asyncps/recovery/checkpoint/store.hpp"
#include "asyncps/shard_state.hpp"

namespace asyncps::recovery {

/// The current time of `clock`, or of `std::chrono::steady_clock` when it is empty.
inline std::chrono::steady_clock::time_point checkpoint_now(const checkpoint_clock& clock) {
  return clock ? clock() : std::chrono::steady_clock::now();
}

/// One background thread that persists the snapshot buffer through a `checkpoint_store`, one
/// snapshot at a time, and the counters it shares with the server part.
///
/// The buffer belongs to the executor while `in_flight()` is false and to the thread while it
/// is true: the executor fills it (`buffer()`) and hands it over (`submit`); the thread writes
/// it and hands it back. The counters (`checkpoint_stats`) are guarded by the same mutex.
/// Not movable (the thread refers to it): the server part holds it on the heap.
///
/// Thread safety: `buffer`, `ensure_running`, `submit`, `poll` and `stop_and_join` on the
/// owner's thread (the server's executor, or the destructor); `stats`, `update_stats`,
/// `in_flight` and `wait_idle` on any thread but the persist thread.
class checkpoint_persister {
 public:
  /// What a persist that finished reports to the executor (`poll`).
  struct finished {
    bool ready = false;     ///< a persist finished since the last `poll`
    double seconds = 0;     ///< its duration when it was written, else 0
    std::error_code error;  ///< its failure (of the write, or of the pruning after it)
    std::string why;        ///< a line naming the file and the reason, when `error`
  };

  /// Persists through `store`, timing with `clock` (empty: steady_clock); both must outlive
  /// the persister. Starts no thread yet.
  checkpoint_persister(const checkpoint_store& store, const checkpoint_clock& clock) noexcept
      : store_(store), clock_(clock) {}
  checkpoint_persister(const checkpoint_persister&) = delete;
  checkpoint_persister& operator=(const checkpoint_persister&) = delete;
  /// Waits for the persist in flight, if any, and joins the thread.
  ~checkpoint_persister() { stop_and_join(); }

  /// The snapshot buffer. Precondition: `!in_flight()` (the executor owns it).
  shard_state& buffer() noexcept { return buffer_; }

  /// True while a snapshot waits for the thread or is being written.
  bool in_flight() const {
    std::lock_guard lock(m_);
    return in_flight_;
  }

  /// Blocks until no persist is in flight.
  void wait_idle() const {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return !in_flight_; });
  }

  /// A copy of the counters, taken under the lock.
  checkpoint_stats stats() const {
    std::lock_guard lock(m_);
    return stats_;
  }

  /// Calls `f(checkpoint_stats&)` under the lock.
  template <class F>
  void update_stats(F&& f) {
    std::lock_guard lock(m_);
    f(stats_);
  }

  /// Starts the thread unless it runs. Throws `std::system_error` when it cannot be started.
  void ensure_running() {
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }

  /// Hands the buffer (the snapshot at server clock `c`) to the thread, calling
  /// `f(checkpoint_stats&)` under the same lock. Preconditions: `ensure_running()` succeeded
  /// and `!in_flight()`.
  template <class F>
  void submit(clock_value c, F&& f) {
    {
      std::lock_guard lock(m_);
      job_clock_ = c;
      pending_ = true;
      in_flight_ = true;
      f(stats_);
    }
    cv_.notify_all();
  }

  /// Moves a finished persist's report into `out` (`out.ready` says whether there was one;
  /// `out.why` keeps its capacity otherwise) and returns whether a persist is in flight.
  bool poll(finished& out) {
    std::lock_guard lock(m_);
    out.ready = std::exchange(result_.ready, false);
    if (out.ready) {
      out.seconds = result_.seconds;
      out.error = result_.error;
      std::swap(out.why, result_.why);
    }
    return in_flight_;
  }

  /// Waits for the persist in flight, if any, and joins the thread (a later `ensure_running`
  /// starts a new one).
  void stop_and_join() noexcept {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    try {
      thread_.join();
    } catch (const std::system_error&) {
      thread_.detach();  // cannot happen for a joinable thread of another id
    }
    std::lock_guard lock(m_);
    stop_ = false;
  }

 private:
  void run() noexcept {
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return pending_ || stop_; });
      if (!pending_) return;  // stop with nothing left to persist
      pending_ = false;
      const clock_value c = job_clock_;
      lock.unlock();
      checkpoint_outcome outcome;
      bool written = false;
      double secs = 0;
      try {
        const auto t0 = checkpoint_now(clock_);
        try {
          written = store_.persist(c, buffer_, outcome);
        } catch (const std::bad_alloc&) {
          outcome = {std::make_error_code(std::errc::not_enough_memory),
                     "checkpoint persist: out of memory"};
        } catch (const std::exception& e) {
          outcome = {std::make_error_code(std::errc::io_error),
                     std::string("checkpoint persist: ") + e.what()};
        }
        secs = std::chrono::duration<double>(checkpoint_now(clock_) - t0).count();
      } catch (...) {  // the injected clock threw: count the persist as failed
        if (!outcome.error) {
          outcome.error = std::make_error_code(std::errc::io_error);
          outcome.why = "checkpoint persist at clock " + std::to_string(c) +
                        ": checkpoint_options::clock threw";
        }
        written = false;
      }
      lock.lock();
      if (written) {
        ++stats_.checkpoints_persisted;
        stats_.last_persisted_clock = c;
        stats_.persist_seconds_total += secs;
        stats_.last_persist_seconds = secs;
      } else {
        ++stats_.failed;
      }
      if (outcome.error) {
        stats_.last_error = outcome.error;
        stats_.last_error_message = outcome.why;
      }
      result_.ready = true;
      result_.seconds = written ? secs : 0;
      result_.error = outcome.error;
      result_.why = std::move(outcome.why);
      in_flight_ = false;
      cv_.notify_all();
    }
  }

  const checkpoint_store& store_;
  const checkpoint_clock& clock_;
  mutable std::mutex m_;
  mutable std::condition_variable cv_;
  std::thread thread_;  // started and joined by the owner only

  // Guarded by m_.
  bool pending_ = false;    // a snapshot waits for the thread
  bool in_flight_ = false;  // pending or being written: the executor must not touch buffer_
  bool stop_ = false;
  clock_value job_clock_ = 0;
  checkpoint_stats stats_{};
  finished result_{};

  // Owned by the executor while !in_flight_, by the thread while in_flight_.
  shard_state buffer_{};
};

}  // namespace asyncps::recovery
