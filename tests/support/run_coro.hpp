// Test helper: run a coroutine to completion on an io_context, with a hang guard.
#pragma once

#include <chrono>
#include <exception>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <doctest/doctest.h>

namespace asyncps::test {

/// Runs `body` (a callable returning `asio::awaitable<void>`) as a coroutine on `io` and fails
/// the test if it has not finished within `limit` (a hang guard, not a timing assertion). An
/// exception from the coroutine is rethrown here. May be called again on the same `io` (it
/// restarts a context that ran out of work). Thread safety: `io` is run on the calling thread.
template <class F>
void run_coro(asio::io_context& io, F body, std::chrono::seconds limit = std::chrono::seconds(30)) {
  io.restart();
  bool finished = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        co_await body();
        finished = true;
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  io.run_for(limit);
  REQUIRE_MESSAGE(finished, "test coroutine did not finish in time");
}

}  // namespace asyncps::test
