// fashion_mnist: serve_until_done, the end of a `--role server` process (no recovery peers):
// it serves until every expected worker has trained and left again. Its own header so that
// tests/unit/transport_test.cpp can run it against bare connections (a port scan).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/transport/tcp.hpp"

namespace fashion {

// Serves until each of the `workers` worker ids has trained here (a push or clock message of it
// taken: `workers_trained`) and every worker session has ended again, and then `linger`
// longer. A bare connection (a port scan) counts as no worker, and neither does a hello, nor a
// hello and a bye: a peer that says hello and bye as every id before training cannot end it
// (issue 32). While it lingers it still answers readers (asyncps::async_read_model: the final
// model). `tick`, if set, is called on the server's executor every 50 ms while workers train (with
// false), and once when the last one has left, or the server stopped before that (true).
template <class Server>
asio::awaitable<void>
serve_until_done(Server& s, asyncps::tcp_transport::acceptor acceptor, std::uint32_t workers,
                 std::function<void(bool ended)> tick = {}, std::chrono::milliseconds linger = {}) {
  auto ex = co_await asio::this_coro::executor;
  asio::steady_timer poll(ex);
  bool ended = false;
  asio::co_spawn(
      ex,
      [&]() -> asio::awaitable<void> {
        for (;;) {
          poll.expires_after(std::chrono::milliseconds(50));
          if (auto [ec] = co_await poll.async_wait(asyncps::detail::use_tuple); ec) co_return;
          if (tick) tick(false);
          if (s.workers_trained() >= workers && s.workers_connected() == 0) break;
        }
        ended = true;
        if (tick) tick(true);
        std::cerr << "server " << s.options().shard << ": all " << workers
                  << " workers have trained and left; stopping in " << linger.count() / 1000.0
                  << " s\n";
        poll.expires_after(linger);  // 0: at once
        if (auto [ec] = co_await poll.async_wait(asyncps::detail::use_tuple); ec) co_return;
        s.stop();
      },
      asio::detached);
  if (auto ec = co_await s.async_serve(std::move(acceptor)))
    std::cerr << "server " << s.options().shard << ": " << ec.message() << '\n';
  poll.cancel();
  if (tick && !ended) tick(true);
}

}  // namespace fashion
