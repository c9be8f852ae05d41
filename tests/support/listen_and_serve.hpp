// Test helper: listen on an endpoint, retrying until the name is free, then serve on it. A
// server restarted under its old name may find that name still held while the killed server's
// acceptor closes; tests spawn this instead of failing on the first `listen`.
#pragma once

#include <chrono>
#include <utility>

#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>

#include "asyncps/detail/asio_compat.hpp"

namespace asyncps::test {

/// Calls `t.listen(name)` every `retry_every` until it succeeds, then `co_await`s
/// `server.async_serve(acceptor)` and ends when that completes (its error code is dropped: the
/// tests check the server's stats instead). Never gives up: a name that never frees hangs the
/// test until ctest's TIMEOUT.
/// `Server` is anything with `async_serve(typename Transport::acceptor_type)` returning an
/// awaitable (`basic_server`, `basic_chain_master`).
/// Object lifetimes: `t` and `server` outlive the coroutine; `name` is copied into it.
/// Thread safety: run on `t`'s executor (the transport is not thread-safe).
template <class Transport, class Server>
asio::awaitable<void>
listen_and_serve(Transport& t, typename Transport::endpoint_type name, Server& server,
                 std::chrono::milliseconds retry_every = std::chrono::milliseconds(1)) {
  asio::steady_timer timer(t.get_executor());
  for (;;) {
    auto acceptor = t.listen(name);
    if (acceptor.has_value()) {
      (void)co_await server.async_serve(std::move(acceptor).value());
      co_return;
    }
    timer.expires_after(retry_every);
    co_await timer.async_wait(detail::use_tuple);
  }
}

}  // namespace asyncps::test
