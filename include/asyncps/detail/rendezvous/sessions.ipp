// asyncps — basic_rendezvous's sessions: refusing a request with an error frame, closing a
// connection after an allocation failure, each connection's read and write loops, and the
// watchdog that closes idle connections.
//
// Out-of-line definitions of members declared in asyncps/rendezvous.hpp. Not a header to
// include on its own: rendezvous.hpp includes it at its end, after the class it defines members
// of (so this file does not include rendezvous.hpp back).
#pragma once

#include <algorithm>
#include <chrono>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <asio/awaitable.hpp>

#include "asyncps/detail/accept_retry.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/log_limiter.hpp"
#include "asyncps/detail/peer_address.hpp"
#include "asyncps/error.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

// Refuses `s`'s request: an error frame naming `reason`, then the connection is closed.
template <transport Transport>
void basic_rendezvous<Transport>::refuse(session& s, std::error_code code,
                                         const std::string& reason) {
  ++stats_.refused;
  if (may_log(detail::log_kind::refused_request, s))
    log("refusing a request" + detail::peer_address(s.conn) + ": " + reason);
  std::optional<errc> wire_code;
  if (code.category() == error_category()) wire_code = static_cast<errc>(code.value());
  unwait(s);
  s.closing = true;
  reply(s, encode(protocol::error{.sender = 0, .code = wire_code, .reason = reason}));
}

// Closes `s` after an allocation failure while serving it (`what`: where): no error frame
// (no memory for one), counted in `out_of_memory`, logged rate-limited when a line can be
// allocated.
template <transport Transport>
void basic_rendezvous<Transport>::out_of_memory(session& s, const char* what) {
  ++stats_.out_of_memory;
  detail::despite_no_memory([&] {
    if (may_log(detail::log_kind::refused_connection, s))
      log("closing the connection" + detail::peer_address(s.conn) + ": " +
          make_error_code(errc::resource_exhausted).message() + " (" + what + ")");
  });
  close(s);
}

template <transport Transport>
asio::awaitable<void> basic_rendezvous<Transport>::write_loop(session& s) {
  std::vector<message> sending;
  bool no_memory = false;
  try {
    for (;;) {
      if (!s.open) break;
      if (s.outbox.empty()) {
        if (s.closing) break;
        co_await s.wake.async_wait(detail::use_tuple);
        continue;
      }
      std::swap(s.outbox, sending);
      bool failed = false;
      for (auto& m : sending)
        if (!failed && co_await s.conn.async_send(std::move(m))) failed = true;
      sending.clear();
      if (failed) break;
      s.last_seen = clock_type::now();  // register_timeout counts from the last reply
    }
  } catch (const std::bad_alloc&) {
    no_memory = true;
  } catch (const std::length_error&) {
    no_memory = true;
  }
  if (no_memory && s.open) out_of_memory(s, "no memory to send its replies");
  close(s);
  finish(s);
}

// Reads `s`'s requests until it closes or is refused. An allocation failure while a frame is
// received (the transport allocates its buffer) or a request handled closes `s` only
// (out_of_memory): it must not end the coroutine without finish() (the session would stay,
// and async_serve would never complete).
template <transport Transport>
asio::awaitable<void> basic_rendezvous<Transport>::read_loop(session& s) {
  while (s.open && !s.closing) {
    const char* what = "no memory for a received frame";
    bool go_on = false;
    bool no_memory = false;
    try {
      auto [ec, m] = co_await s.conn.async_receive();
      what = "no memory to handle its request";
      go_on = receive(s, ec, m);
    } catch (const std::bad_alloc&) {
      no_memory = true;
    } catch (const std::length_error&) {
      no_memory = true;
    }
    if (no_memory && s.open) out_of_memory(s, what);
    if (!go_on) break;
  }
  if (s.closing) {
    s.wake.cancel();  // the write loop sends the error frame, then closes
  } else {
    close(s);
  }
  finish(s);
}

// Handles what `s`'s receive completed with (`ec`, `m`): a request, or a failure or refusal
// (logged). Returns whether to read on.
template <transport Transport>
bool basic_rendezvous<Transport>::receive(session& s, std::error_code ec, const message& m) {
  if (ec) {
    if (!s.open || s.closing) return false;
    if (ec == errc::authentication_failed || ec == errc::tls_handshake_failed ||
        (ec == errc::timeout && s.requests == 0)) {
      ++stats_.refused;
      if (may_log(detail::log_kind::refused_connection, s))
        log("refused an unauthenticated connection" + detail::peer_address(s.conn) + ": " +
            ec.message() + detail::tls_failure_note(s.conn));
    } else if (ec != errc::connection_closed && ec == condition::protocol_violation) {
      // A frame the transport refused (its header names the field): say so, then close.
      refuse(s, ec, "malformed frame: " + ec.message());
    }
    return false;
  }
  s.last_seen = clock_type::now();
  handle(s, m);
  return true;
}

template <transport Transport>
void basic_rendezvous<Transport>::finish(session& s) {
  if (--s.running > 0) return;
  sessions_.erase(s.self);
  running_.done();
}

// Every register_timeout / 4: closes connections idle for register_timeout (no request yet,
// or none since the last reply) unless their lookup waits. No memory for a log line loses the
// line, never a close, nor the watchdog itself.
template <transport Transport>
asio::awaitable<void> basic_rendezvous<Transport>::watchdog() {
  const auto limit = opts_.register_timeout;
  while (!stopped_) {
    watchdog_timer_.expires_after(std::max(limit / 4, std::chrono::milliseconds(1)));
    try {
      co_await watchdog_timer_.async_wait(detail::use_tuple);
    } catch (const std::bad_alloc&) {  // no memory for the wait: check now
    } catch (const std::length_error&) {}
    if (stopped_) break;
    const auto now = clock_type::now();
    detail::despite_no_memory(
        [&] { limiter_.flush(now, sink()); });  // the counts of a flood that has stopped
    for (auto& s : sessions_) {
      if (!s.open || s.waiting || now - s.last_seen <= limit) continue;
      if (s.requests == 0 && !s.closing) {
        ++stats_.refused;
        detail::despite_no_memory([&] {
          if (may_log(detail::log_kind::refused_connection, s))
            log("closing the connection" + detail::peer_address(s.conn) + ": no request within " +
                std::to_string(limit.count()) + " ms (register_timeout)");
        });
      }
      close(s);
    }
  }
  running_.done();
}

}  // namespace asyncps
