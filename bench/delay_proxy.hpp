// asyncps bench — a user-space TCP delay proxy: the one-way delay this kernel's missing netem
// would add (docs/multi-host.md). It listens, connects upstream for each accepted connection,
// and forwards both directions; each chunk it reads is written on no earlier than `delay`
// after it was read. Standalone Asio, one thread; of asyncps only the accept retry and the
// log limiter (header-only, detail/).
//
// Granularity: a chunk is what one read returned (at most `chunk_bytes`), so the delay applies
// per chunk, not per packet; timers fire late by the scheduler's wake-up latency (the proxy
// sets its timer slack to 1 ns, Linux), never early. Buffering is bounded: a direction holds
// at most `max_buffered` bytes in flight and stops reading until its writer drains (TCP's own
// flow control then slows the sender), so its throughput is at most max_buffered / delay.
//
// Its accept loop survives a descriptor flood as the library's do (detail/accept_retry.hpp):
// a transient accept failure (out of descriptors or memory, a connection that died in the
// backlog) pauses it, 1 ms doubling to 1 s, is logged rate-limited, and the loop accepts
// again; only closing the acceptor or another error ends it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include "asyncps/detail/accept_retry.hpp"
#include "asyncps/detail/log_limiter.hpp"

namespace asyncps::bench {

/// Settings of `delay_proxy`.
struct delay_proxy_options {
  /// The one-way delay added to every chunk, each direction (>= 0).
  std::chrono::microseconds delay{0};
  /// The most bytes one read takes (one chunk), > 0.
  std::size_t chunk_bytes = 64 * 1024;
  /// The most bytes one direction of one connection holds (read, not yet written), >=
  /// chunk_bytes. Bounds the proxy's memory at 2 x max_buffered per connection.
  std::size_t max_buffered = 8 * 1024 * 1024;
  /// Where failed accepts are reported (rate-limited: a few lines every 10 s, then a count);
  /// empty: stderr.
  std::function<void(const std::string&)> log{};
};

/// Counters of one `delay_proxy` (read on its thread, or after it stopped).
struct delay_proxy_stats {
  std::uint64_t connections = 0;      ///< connections accepted
  std::uint64_t upstream_failed = 0;  ///< accepted, but the upstream connect failed
  std::uint64_t failed_accepts = 0;   ///< transient accept failures, each retried
  std::uint64_t bytes = 0;            ///< bytes forwarded, both directions
  std::uint64_t chunks = 0;           ///< chunks forwarded
  std::uint64_t full_waits = 0;       ///< times a reader stopped: max_buffered reached
  std::size_t peak_buffered = 0;      ///< the most bytes one direction held at once
};

/// The proxy: `run(acceptor)` accepts connections on `acceptor` until it is closed and connects
/// each to `upstream`. Thread safety: one thread (the executor's); not thread-safe.
/// Object lifetime: must outlive the io_context's run.
class delay_proxy {
 public:
  using tcp = asio::ip::tcp;
  using clock = std::chrono::steady_clock;

  delay_proxy(tcp::endpoint upstream, delay_proxy_options o) : upstream_(upstream), opts_(o) {
    if (opts_.chunk_bytes == 0) opts_.chunk_bytes = 64 * 1024;
    if (opts_.max_buffered < opts_.chunk_bytes) opts_.max_buffered = opts_.chunk_bytes;
  }

  const delay_proxy_stats& stats() const { return stats_; }

  /// Accepts until `acceptor` is closed or fails with an error that is not transient; each
  /// connection runs detached. A transient failure (`detail::accept_backoff::transient`: out
  /// of descriptors, ...) is counted in `stats().failed_accepts`, logged rate-limited, and
  /// retried after a pause (1 ms doubling to 1 s; reset by an accept that succeeds).
  asio::awaitable<void> run(tcp::acceptor& acceptor) {
    asyncps::detail::accept_backoff backoff;
    asyncps::detail::log_limiter<clock::time_point> limiter;
    asio::steady_timer pause(acceptor.get_executor());
    const auto log = [this](const std::string& line) {
      if (opts_.log) {
        opts_.log("delay proxy: " + line);
      } else {
        std::fprintf(stderr, "delay proxy: %s\n", line.c_str());
      }
    };
    for (;;) {
      auto [ec, sock] =
          co_await acceptor.async_accept(asio::experimental::as_tuple(asio::use_awaitable));
      if (ec) {
        if (!acceptor.is_open() || !asyncps::detail::accept_backoff::transient(ec)) {
          limiter.flush_all(clock::now(), log);
          co_return;
        }
        ++stats_.failed_accepts;
        const auto wait_for = backoff.failed();
        asyncps::detail::log_accept_failure(limiter, clock::now(), ec, wait_for, log);
        pause.expires_after(wait_for);
        co_await pause.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        continue;
      }
      backoff.succeeded();
      limiter.flush(clock::now(), log);
      ++stats_.connections;
      asio::co_spawn(acceptor.get_executor(), serve(std::move(sock)), asio::detached);
    }
  }

 private:
  // One direction: chunks read, each with the time it may be written.
  struct chunk {
    clock::time_point due;
    std::vector<char> bytes;
  };
  struct pipe {
    explicit pipe(const asio::any_io_executor& ex) : wake_writer(ex), wake_reader(ex) {}
    std::deque<chunk> queue;
    std::vector<std::vector<char>> spare;  // chunks' storage, reused
    std::size_t buffered = 0;
    bool eof = false;
    asio::steady_timer wake_writer;  // cancelled when a chunk arrives or the reader ends
    asio::steady_timer wake_reader;  // cancelled when the writer frees room
  };
  struct link {
    link(tcp::socket a, const asio::any_io_executor& ex)
        : down(std::move(a)), up(ex), to_up(ex), to_down(ex) {}
    tcp::socket down;  // the accepted client
    tcp::socket up;    // the upstream server
    pipe to_up;
    pipe to_down;
    int running = 0;
    void close() {
      std::error_code ignored;
      down.close(ignored);
      up.close(ignored);
      to_up.wake_writer.cancel();
      to_up.wake_reader.cancel();
      to_down.wake_writer.cancel();
      to_down.wake_reader.cancel();
    }
  };

  asio::awaitable<void> serve(tcp::socket sock) {
    auto ex = sock.get_executor();
    auto l = std::make_shared<link>(std::move(sock), ex);  // shared by its four coroutines
    auto [ec] =
        co_await l->up.async_connect(upstream_, asio::experimental::as_tuple(asio::use_awaitable));
    if (ec) {
      ++stats_.upstream_failed;
      l->close();
      co_return;
    }
    std::error_code ignored;
    l->down.set_option(tcp::no_delay(true), ignored);
    l->up.set_option(tcp::no_delay(true), ignored);
    l->running = 4;
    asio::co_spawn(ex, reader(l, l->down, l->to_up), asio::detached);
    asio::co_spawn(ex, writer(l, l->to_up, l->up), asio::detached);
    asio::co_spawn(ex, reader(l, l->up, l->to_down), asio::detached);
    asio::co_spawn(ex, writer(l, l->to_down, l->down), asio::detached);
  }

  static asio::awaitable<void> wait(asio::steady_timer& t, clock::time_point until) {
    t.expires_at(until);
    co_await t.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  }

  asio::awaitable<void> reader(std::shared_ptr<link> l, tcp::socket& from, pipe& p) {
    for (;;) {
      while (p.buffered + opts_.chunk_bytes > opts_.max_buffered && from.is_open()) {
        ++stats_.full_waits;
        co_await wait(p.wake_reader, clock::time_point::max());
      }
      if (!from.is_open()) break;
      std::vector<char> buf;
      if (!p.spare.empty()) {
        buf = std::move(p.spare.back());
        p.spare.pop_back();
      }
      buf.resize(opts_.chunk_bytes);
      auto [ec, n] = co_await from.async_read_some(
          asio::buffer(buf), asio::experimental::as_tuple(asio::use_awaitable));
      if (ec || n == 0) break;
      buf.resize(n);
      p.buffered += n;
      stats_.peak_buffered = std::max(stats_.peak_buffered, p.buffered);
      p.queue.push_back({clock::now() + opts_.delay, std::move(buf)});
      p.wake_writer.cancel();
    }
    p.eof = true;
    p.wake_writer.cancel();
    if (--l->running == 0) l->close();
  }

  asio::awaitable<void> writer(std::shared_ptr<link> l, pipe& p, tcp::socket& to) {
    for (;;) {
      if (p.queue.empty()) {
        if (p.eof || !to.is_open()) break;
        co_await wait(p.wake_writer, clock::time_point::max());
        continue;
      }
      const auto due = p.queue.front().due;
      if (clock::now() < due) {
        co_await wait(p.wake_writer, due);
        continue;
      }
      chunk c = std::move(p.queue.front());
      p.queue.pop_front();
      auto [ec, n] = co_await asio::async_write(to, asio::buffer(c.bytes),
                                                asio::experimental::as_tuple(asio::use_awaitable));
      p.buffered -= c.bytes.size();
      p.spare.push_back(std::move(c.bytes));
      p.wake_reader.cancel();
      if (ec) {
        l->close();
        break;
      }
      stats_.bytes += n;
      ++stats_.chunks;
    }
    // The other side's reads end: pass the half-close on.
    std::error_code ignored;
    if (to.is_open()) to.shutdown(tcp::socket::shutdown_send, ignored);
    if (--l->running == 0) l->close();
  }

  tcp::endpoint upstream_;
  delay_proxy_options opts_;
  delay_proxy_stats stats_;
};

}  // namespace asyncps::bench
