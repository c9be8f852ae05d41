// asyncps — detail::wait_group: wait until a set of coroutines has finished.
//
// Replaces "poll until done" loops: each coroutine a component starts is counted (`add`) and
// reports its end (`done`); `async_wait` completes when the count is zero, without a timer
// tick per poll. The timer type is the transport's (a steady_timer, or a simulated transport's
// virtual-time timer), so a simulation stays quiescent while it waits.
#pragma once

#include <cstddef>

#include <asio/awaitable.hpp>

#include "asyncps/detail/asio_compat.hpp"

namespace asyncps::detail {

/// A counter of running coroutines with an awaitable "all done".
///
/// `Timer` is an Asio-style waitable timer: constructible from (executor, `time_point`), with
/// `async_wait(detail::use_tuple)` and `cancel()` (a transport's `timer_type` qualifies). Any
/// number of coroutines may wait at once. Thread safety: every member on the owner's executor
/// (one thread at a time).
template <class Timer>
class wait_group {
 public:
  /// No coroutine counted. `ex`: the executor its waits run on (the owner's).
  template <class Executor>
  explicit wait_group(const Executor& ex) : timer_(ex, Timer::time_point::max()) {}

  /// Counts `n` more running coroutines.
  void add(std::size_t n = 1) noexcept { count_ += n; }
  /// One counted coroutine finished; wakes every waiter when it was the last.
  void done() noexcept {
    if (count_ > 0 && --count_ == 0) timer_.cancel();
  }
  /// Coroutines counted and not finished.
  std::size_t count() const noexcept { return count_; }

  /// Completes once `count() == 0` (at once when it already is).
  asio::awaitable<void> async_wait() {
    // The timer never expires: only `done()`'s cancel ends a wait, and it ends every wait
    // (re-arming it here would cancel the other waiters' waits, and theirs this one's).
    while (count_ > 0) co_await timer_.async_wait(use_tuple);
  }

 private:
  Timer timer_;
  std::size_t count_ = 0;
};

}  // namespace asyncps::detail
