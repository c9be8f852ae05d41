// asyncps — the rendezvous clients' one request: connect, send, receive one reply, retried
// with backoff until a deadline; and the reply's decoding (an `error` frame's code, or the
// expected message).
//
// Used by `async_announce_server` and `async_lookup_servers` (asyncps/rendezvous.hpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <variant>

#include <asio/awaitable.hpp>
#include <asio/experimental/awaitable_operators.hpp>

#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/codec/rendezvous_messages.hpp"
#include "asyncps/detail/text.hpp"
#include "asyncps/detail/transport_time.hpp"
#include "asyncps/error.hpp"
#include "asyncps/log.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::detail {

// One connection: connect, send `request`, receive one reply. `connected` says whether the
// connect succeeded (the reply is then awaited).
template <class Transport>
asio::awaitable<std::tuple<std::error_code, message>>
rendezvous_attempt(Transport& t, typename Transport::endpoint_type root, message request,
                   typename Transport::connection_type& conn, bool& connected) {
  auto [cec, c] = co_await t.async_connect(root);
  if (cec) co_return std::tuple{cec, message{}};
  conn = std::move(c);
  connected = true;
  if (auto sec = co_await conn.async_send(std::move(request))) co_return std::tuple{sec, message{}};
  co_return co_await conn.async_receive();
}

// Sends `make()` to the rendezvous at `root` and returns its reply, retrying until `timeout`
// while the rendezvous cannot be reached or drops the connection (condition `transient`).
template <class Transport, class MakeRequest>
asio::awaitable<std::tuple<std::error_code, message>>
rendezvous_request(Transport& t, typename Transport::endpoint_type root, MakeRequest make,
                   std::chrono::milliseconds timeout, const log_function& log,
                   std::string_view what) {
  using namespace asio::experimental::awaitable_operators;
  using clock_type = transport_clock_t<Transport>;
  const std::string where = "the rendezvous at " + endpoint_string(root);
  const std::string limit = std::to_string(timeout.count()) + " ms";
  const auto deadline = clock_type::now() + timeout;
  transport_timer_t<Transport> timer(t.get_executor());
  std::chrono::milliseconds backoff{20};
  std::error_code last;  // the last connect or connection error
  bool logged = false;
  for (;;) {
    typename Transport::connection_type conn;
    bool connected = false;
    timer.expires_at(deadline);
    auto r = co_await (rendezvous_attempt(t, root, make(), conn, connected) ||
                       close_at_deadline(timer, conn));
    conn.close();
    if (r.index() == 1) {  // the deadline
      if (connected) {
        emit(log, "asyncps: no reply to the " + std::string(what) + " from " + where + " within " +
                      limit +
                      (what == "lookup" ? " (it answers once every shard has announced)" : ""));
        co_return std::tuple{make_error_code(errc::timeout), message{}};
      }
      emit(log, "asyncps: cannot reach " + where + " within " + limit +
                    (last ? ": " + last.message() : std::string{}));
      co_return std::tuple{last ? last : make_error_code(errc::timeout), message{}};
    }
    auto& [ec, reply] = std::get<0>(r);
    if (!ec) co_return std::tuple{std::error_code{}, std::move(reply)};
    if (is_final_connect_error(ec) || (connected && ec != condition::transient)) {
      emit(log, "asyncps: the " + std::string(what) + " to " + where + " failed: " + ec.message());
      co_return std::tuple{ec, message{}};
    }
    last = ec;
    const auto now = clock_type::now();
    if (now >= deadline) {
      emit(log, "asyncps: cannot reach " + where + " within " + limit + ": " + ec.message());
      co_return std::tuple{ec, message{}};
    }
    if (!logged) {  // say so now, not only at the deadline
      logged = true;
      emit(log,
           "asyncps: cannot reach " + where + " (" + ec.message() + "); retrying for " + limit);
    }
    timer.expires_after(std::min<typename clock_type::duration>(backoff, deadline - now));
    co_await timer.async_wait(use_tuple);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

// Decodes the rendezvous's reply `m` into `out` (of type `type`), or the code of its `error`
// frame (`unexpected_message` when the frame names none), logging the reason.
template <class T>
std::error_code rendezvous_reply(const message& m, T& out, message_type type,
                                 const log_function& log, std::string_view what) {
  std::string why;
  if (m.header.type == message_type::error) {
    protocol::error e;
    if (protocol::decode(m, e, why)) {
      emit(log, "asyncps: the rendezvous sent a malformed error" + why);
      return errc::unexpected_message;
    }
    emit(log,
         "asyncps: the rendezvous refused the " + std::string(what) + ": " + peer_text(e.reason));
    return e.code ? make_error_code(*e.code) : make_error_code(errc::unexpected_message);
  }
  if (m.header.type != type) {
    emit(log, "asyncps: the rendezvous answered the " + std::string(what) + " with message type " +
                  std::to_string(static_cast<int>(m.header.type)));
    return errc::unexpected_message;
  }
  if (protocol::decode(m, out, why)) {
    emit(log, "asyncps: the rendezvous sent a malformed reply to the " + std::string(what) + why);
    return errc::unexpected_message;
  }
  return {};
}

}  // namespace asyncps::detail
