// asyncps — run_polling: an io_context run loop that polls before it sleeps.
#pragma once

#include <chrono>
#include <cstddef>

#include <asio/io_context.hpp>

namespace asyncps {

/// Runs `ctx` like `asio::io_context::run()` (until it is stopped or out of work), except that
/// when no handler is ready it keeps polling (`poll()`, a non-blocking `epoll_wait`) for up to
/// `spin` before it blocks in the kernel. A thread that blocks must be woken by the kernel when
/// its socket becomes readable, and on virtual machines with idle-core halting that wake-up can
/// take tens of microseconds; a thread that is still polling sees the data at once. Returns the
/// number of handlers run. `spin` <= 0 is plain `run()`.
///
/// Use it only where every polling thread has a core of its own (a server shard and a worker
/// pinned to distinct cores, say): a polling thread burns its core for up to `spin` after each
/// burst of work, and on a shared core it delays the very thread whose message it waits for
/// (docs/performance.md, "Polling"). Thread safety: as `run()` (call it from the threads that
/// would call `run()`). Exceptions: those of the handlers, as `run()`.
inline std::size_t run_polling(asio::io_context& ctx, std::chrono::nanoseconds spin) {
  if (spin <= std::chrono::nanoseconds::zero()) return ctx.run();
  using clock = std::chrono::steady_clock;
  std::size_t handlers = 0;
  for (;;) {
    const auto until = clock::now() + spin;
    std::size_t ran = 0;
    while ((ran = ctx.poll()) == 0 && !ctx.stopped() && clock::now() < until) {}
    handlers += ran;
    if (ctx.stopped()) return handlers;
    if (ran == 0) {
      const std::size_t one = ctx.run_one();  // nothing ready within `spin`: sleep
      if (one == 0) return handlers;          // stopped, or out of work
      handlers += one;
    }
  }
}

}  // namespace asyncps
