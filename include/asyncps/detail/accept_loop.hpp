// asyncps — detail::serve_sessions: the accept loop of the small services that serve one
// session per connection (the chain master, the rendezvous).
#pragma once

#include <chrono>
#include <iterator>
#include <new>
#include <stdexcept>
#include <system_error>
#include <utility>

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include "asyncps/detail/accept_retry.hpp"
#include "asyncps/detail/asio_compat.hpp"

namespace asyncps::detail {

/// Serves one session per connection on `acceptor` (a transport's `acceptor_type`) until
/// `stopped` is true or an accept fails with an error that is not transient, then calls
/// `stop()` (which closes every session) and waits until `running` (a `wait_group` counting
/// every session and any helper coroutine of the owner) is empty. A transient accept error
/// (`accept_backoff::transient`: out of descriptors, ...) is passed to `failed(ec, pause)`
/// (the owner logs it, rate-limited: `log_accept_failure`), then the loop waits `pause` on
/// `pause_timer` (1 ms doubling to 1 s; reset by an accept that succeeds) and accepts again;
/// the owner's stop must set `stopped` and cancel `pause_timer`. An allocation failure
/// (`std::bad_alloc`, `std::length_error`) in the accept or in making its session is such a
/// transient error too, `accept_no_memory_error()` (the connection, if one was accepted, is
/// closed); one in `failed` loses that line only. While it accepts, `current` points to
/// `acceptor` (so that the owner's stop can close it), and nullptr after. Each connection
/// becomes a session at the end of `sessions` (a `std::list<Session>`; `Session` is
/// constructible from (connection, `ex`) and has a `self` iterator member, set here), counted
/// in `running` until it calls `done()`, and is handed to `start(Session&)`, which starts its
/// coroutines. `start` must not throw: one that cannot start a session's coroutines (no
/// memory) closes and finishes the session itself. Completes with the accept's error, or with
/// success when `stopped` was set (closing the acceptor ends the wait). Every argument but
/// `ex`, `start`, `stop` and `failed` must outlive the coroutine. Thread safety: on `ex`, the
/// owner's executor.
template <class Acceptor, class Timer, class Sessions, class Running, class Executor, class Start,
          class Stop, class Failed>
asio::awaitable<std::error_code> serve_sessions(Acceptor& acceptor, Acceptor*& current,
                                                Timer& pause_timer, const bool& stopped,
                                                Sessions& sessions, Running& running, Executor ex,
                                                Start start, Stop stop, Failed failed) {
  current = &acceptor;
  std::error_code result;
  accept_backoff backoff;
  while (!stopped) {
    std::error_code ec;
    typename Sessions::value_type* s = nullptr;
    // The transport allocates while it accepts (its coroutine frame, the connection's state,
    // a TLS session), and so does the session: under memory exhaustion that throws. It ends
    // no service: the loop pauses and accepts again, as after running out of descriptors.
    try {
      auto [aec, conn] = co_await acceptor.async_accept();
      ec = aec;
      if (!ec) s = &sessions.emplace_back(std::move(conn), ex);
    } catch (const std::bad_alloc&) {
      ec = accept_no_memory_error();
    } catch (const std::length_error&) {
      ec = accept_no_memory_error();
    }
    if (s != nullptr) {
      backoff.succeeded();
      s->self = std::prev(sessions.end());
      running.add();
      start(*s);
      continue;
    }
    if (!stopped && accept_backoff::transient(ec)) {
      const auto pause = backoff.failed();
      despite_no_memory([&] { failed(ec, pause); });
      pause_timer.expires_after(pause);
      try {
        co_await pause_timer.async_wait(use_tuple);
      } catch (const std::bad_alloc&) {  // no memory for the wait: accept again at once
      } catch (const std::length_error&) {}
      continue;
    }
    if (!stopped) result = ec;
    break;
  }
  current = nullptr;
  stop();
  co_await running.async_wait();
  co_return result;
}

/// Spawns a new session's two coroutines on `ex`, detached: `make_read()` and then
/// `make_write()`, each returning the `asio::awaitable<void>` of one loop (called inside, so
/// that allocating its coroutine frame is covered). Returns how many were spawned: 2, or fewer
/// when an allocation failed (`std::bad_alloc`, `std::length_error`: no memory for a frame).
/// The caller then closes the session and finishes it once for each loop not spawned. Other
/// exceptions pass. Used by every service's session start (shard server, chain master,
/// rendezvous). Thread safety: on `ex`.
template <class Executor, class MakeRead, class MakeWrite>
int spawn_session_loops(const Executor& ex, MakeRead&& make_read, MakeWrite&& make_write) {
  int spawned = 0;
  try {
    asio::co_spawn(ex, make_read(), asio::detached);
    ++spawned;
    asio::co_spawn(ex, make_write(), asio::detached);
    ++spawned;
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {}
  return spawned;
}

}  // namespace asyncps::detail
