// asyncps — basic_server's coroutines: work spawned on the executor and counted for
// `async_serve`, each session's write loop (the send deadline around each write) and read loop
// (receive failures, refusals, handing each message to the protocol), the watchdog and the
// sweeper.
//
// Out-of-line definitions of members declared in asyncps/server.hpp (the shell; what it does with
// each message is detail::server_protocol). Not a header to include on its own: server.hpp
// includes it at its end, after the class it defines members of (so this file does not include
// server.hpp back).
#pragma once

#include <chrono>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include "asyncps/consistency.hpp"
#include "asyncps/detail/accept_loop.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/log_limiter.hpp"
#include "asyncps/detail/peer_address.hpp"
#include "asyncps/error.hpp"
#include "asyncps/optimizer.hpp"
#include "asyncps/peer_identity.hpp"
#include "asyncps/recovery.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

// Runs `a` on the executor, counted in `running_` (async_serve waits for it).
template <transport Transport, consistency_policy Consistency, recovery_policy Recovery,
          optimizer_policy Optimizer>
void basic_server<Transport, Consistency, Recovery, Optimizer>::spawn(asio::awaitable<void> a) {
  running_.add();
  asio::co_spawn(transport_.get_executor(), counted(std::move(a)), asio::detached);
}

template <transport Transport, consistency_policy Consistency, recovery_policy Recovery,
          optimizer_policy Optimizer>
asio::awaitable<void>
basic_server<Transport, Consistency, Recovery, Optimizer>::counted(asio::awaitable<void> a) {
  co_await std::move(a);
  running_.done();
}

// Serves `conn`: its read and write loops run until it closes (counted in `running_`).
template <transport Transport, consistency_policy Consistency, recovery_policy Recovery,
          optimizer_policy Optimizer>
auto basic_server<Transport, Consistency, Recovery, Optimizer>::add_session(
    typename Transport::connection_type conn) -> session& {
  auto& s =
      proto_.add_session(std::move(conn), transport_.get_executor(), clock_type::time_point::max());
  running_.add();
  // A loop that cannot be spawned (no memory for its coroutine frame) is finished here in its
  // place, after the session is closed (so a loop that did start ends too): no session is
  // left that nothing will finish, and async_serve still completes.
  const int started = detail::spawn_session_loops(
      transport_.get_executor(), [&] { return read_loop(s); }, [&] { return write_loop(s); });
  if (started < 2) {
    detail::despite_no_memory([&] { proto_.close(s); });
    for (int i = started; i < 2; ++i) finish(s);
  }
  return s;
}

// Both loops of `s` call this when they end; the second forgets the session.
template <transport Transport, consistency_policy Consistency, recovery_policy Recovery,
          optimizer_policy Optimizer>
void basic_server<Transport, Consistency, Recovery, Optimizer>::finish(session& s) {
  if (--s.running > 0) return;
  proto_.session_finished(s);
  running_.done();
}

template <transport Transport, consistency_policy Consistency, recovery_policy Recovery,
          optimizer_policy Optimizer>
asio::awaitable<void>
basic_server<Transport, Consistency, Recovery, Optimizer>::write_loop(session& s) {
  for (;;) {
    if (s.outbox.empty()) {
      if (!s.open) break;
      // `wake` expires at time_point::max() (set once, in the session's constructor); enqueue
      // cancels the wait. Not re-arming it here saves a timerfd_settime call per wake-up.
      co_await s.wake.async_wait(detail::use_tuple);
      continue;
    }
    std::swap(s.outbox, s.sending);
    bool failed = false;
    for (auto& m : s.sending) {
      const std::size_t n = m.payload.size();
      if (!failed) {
        // The send deadline (server_options::send_timeout), unless the transport's sends
        // never wait for the peer (the simulated transport: no wake-up per write).
        if constexpr (!sends_complete_at_once) proto_.send_started(s);
        if (co_await s.conn.async_send(std::move(m))) failed = true;
      }
      proto_.sent(s, n);  // written (or dropped after a failure): no longer queued
    }
    s.sending.clear();
    if (failed) {
      s.outbox.clear();
      s.open = false;
      break;
    }
  }
  s.conn.close();
  finish(s);
}

template <transport Transport, consistency_policy Consistency, recovery_policy Recovery,
          optimizer_policy Optimizer>
asio::awaitable<void>
basic_server<Transport, Consistency, Recovery, Optimizer>::read_loop(session& s) {
  while (s.open) {
    std::error_code ec;
    message m;
    bool no_memory = false;
    // The transport allocates each frame's buffer as it receives it: an allocation failure
    // there (e.g. many large frames under an address-space limit) closes this session only,
    // logged; it must not end the coroutine without finish() (the server would never stop).
    try {
      auto r = co_await s.conn.async_receive();
      ec = std::get<0>(r);
      m = std::move(std::get<1>(r));
    } catch (const std::bad_alloc&) {
      no_memory = true;
    } catch (const std::length_error&) {
      no_memory = true;
    }
    if (no_memory) {
      ++proto_.stats().rejected;
      if (proto_.log_allowed(detail::log_kind::refused_connection, s.address))
        proto_.log("closing connection of " + proto_.who(s) + detail::peer_address(s.conn) + ": " +
                   make_error_code(errc::resource_exhausted).message() +
                   " (no memory for a received frame)");
      proto_.close(s);
      break;
    }
    if (ec) {
      if (!s.open) {
        // The server closed it meanwhile (a deadline, the queue budget, a takeover, stop),
        // which was logged and counted there; the receive failed because of that.
      } else if (ec == errc::authentication_failed || ec == errc::tls_handshake_failed ||
                 (ec == errc::timeout && s.is_unknown())) {
        // Refused by the transport's handshake (it told the peer); nothing to send.
        ++proto_.stats().rejected;
        if (proto_.log_allowed(detail::log_kind::refused_connection, s.address))
          proto_.log("refused an unauthenticated connection" + detail::peer_address(s.conn) + ": " +
                     ec.message() + detail::tls_failure_note(s.conn));
      } else if (ec == condition::protocol_violation) {
        proto_.reject(s, ec, "");
      } else if (ec != errc::connection_closed) {
        proto_.log("connection of " + proto_.who(s) + detail::peer_address(s.conn) +
                   " lost: " + ec.message());
      }
      break;
    }
    // The certificate's identity, for the hello or chain_hello that makes this session a
    // worker or a peer (read once the transport's handshake is over: the first receive).
    if (s.is_unknown() && !s.identity) s.identity = detail::identity_of(s.conn);
    if (!proto_.receive(s, m)) break;
  }
  proto_.close_after_flush(s);
  finish(s);
}

// The watchdog: one coroutine and one timer per server (none per pull). Every
// `watchdog_interval` it logs workers that have not connected yet (until each has connected
// once, at most 3 times) and, when a pull has waited that long for the server clock, the
// worker holding the clock back; it then sends each waiting worker a heartbeat report. It
// sleeps (no timer armed) while nothing waits; a deferred pull wakes it, and the last worker
// session's end puts it to sleep.
template <transport Transport, consistency_policy Consistency, recovery_policy Recovery,
          optimizer_policy Optimizer>
asio::awaitable<void> basic_server<Transport, Consistency, Recovery, Optimizer>::watchdog() {
  const auto every = options().watchdog_interval;
  std::uint32_t connect_reports = 0;
  std::uint64_t deferred_seen = stats().deferred_pulls;
  while (!stopped_) {
    bool watch_connect = connect_reports < 3 && proto_.some_never_connected();
    if (proto_.watchdog_has_work(watch_connect, deferred_seen)) {
      watchdog_.expires_after(every);
    } else {
      watchdog_.expires_at(clock_type::time_point::max());
    }
    auto [ec] = co_await watchdog_.async_wait(detail::use_tuple);
    if (stopped_) break;
    if (ec) continue;  // woken from sleep by a deferred pull: arm the timer
    if (watch_connect && proto_.report_unconnected()) ++connect_reports;
    if (!core().pending().empty()) proto_.report_blocked(every);
  }
  proto_.watchdog_idle = false;
}

// The sweeper: one coroutine and one timer per server (none per connection). It closes the
// connections past their hello or send deadline (server_protocol::sweep: logged, counted in
// `rejected`) and sleeps until the next deadline. While no connection awaits its first
// message and no write is in progress its timer is not armed (a simulation stays
// quiescent); the protocol wakes it when a deadline earlier than its timer appears.
template <transport Transport, consistency_policy Consistency, recovery_policy Recovery,
          optimizer_policy Optimizer>
asio::awaitable<void> basic_server<Transport, Consistency, Recovery, Optimizer>::sweeper() {
  while (!stopped_) {
    if (auto next = proto_.sweep()) {
      sweeper_.expires_at(*next);
    } else {
      sweeper_.expires_at(clock_type::time_point::max());
    }
    co_await sweeper_.async_wait(detail::use_tuple);
  }
}

// A connect the recovery part asked for (`context::connect`): the new connection becomes a peer
// session tagged `role`, then the part hears of it; or the part hears of the failure.
template <transport Transport, consistency_policy Consistency, recovery_policy Recovery,
          optimizer_policy Optimizer>
asio::awaitable<void> basic_server<Transport, Consistency, Recovery, Optimizer>::connect_peer(
    std::uint8_t role, typename Transport::endpoint_type ep) {
  auto [ec, conn] = co_await transport_.async_connect(ep);
  if (stopped_) {
    if (!ec) conn.close();
    co_return;
  }
  if (ec) {
    proto_.part_connect_failed(role, ec);
    co_return;
  }
  auto& s = add_session(std::move(conn));
  detail::part_context<protocol_type>::claim(s, role);
  proto_.part_connected(s);
}

// The pool trimmer: one coroutine and one timer per server, for transports that pool buffers
// per node (tcp_transport::trim_pools). Ends with the server.
template <transport Transport, consistency_policy Consistency, recovery_policy Recovery,
          optimizer_policy Optimizer>
asio::awaitable<void> basic_server<Transport, Consistency, Recovery, Optimizer>::trimmer() {
  while (!stopped_) {
    trimmer_.expires_after(options().pool_trim_interval);
    auto [ec] = co_await trimmer_.async_wait(detail::use_tuple);
    if (stopped_) break;
    if (!ec) {
      if constexpr (requires { transport_.trim_pools(); }) (void)transport_.trim_pools();
    }
  }
}

}  // namespace asyncps
