// asyncps — the `transport` concept: how servers and workers exchange framed messages.
//
// A transport object is one node's network endpoint: an executor, a buffer pool and the wire
// limits. It listens (yielding an acceptor) and connects (yielding a connection). A connection
// sends and receives whole `message`s as awaitables. Implement this concept to run the
// unchanged server and worker templates over your own network
// (examples/tutorial/4_custom_transport.cpp). Requirements table: docs/concepts/transport.md.
#pragma once

#include <concepts>
#include <cstddef>
#include <system_error>
#include <tuple>

#include <asio/awaitable.hpp>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/options.hpp"
#include "asyncps/result.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

/// A bidirectional, ordered, reliable message connection.
///
/// | expression            | type                                              | semantics |
/// |-----------------------|---------------------------------------------------|-----------|
/// | `c.async_send(m)`     | `asio::awaitable<std::error_code>`                | sends `m` (moved in; header fields type..first_row set by the caller, `payload_bytes` = `m.payload.size()` set by the transport); at most one send outstanding |
/// | `c.async_receive()`   | `asio::awaitable<std::tuple<std::error_code, message>>` | the next whole, validated message; at most one receive outstanding |
/// | `C{}`                 | `C`                                               | a closed connection (placeholder before connecting) |
/// | `c.close()`           | `void`, noexcept                                  | closes; outstanding operations complete with an error |
/// | `c.is_open()`         | `bool`                                            | false after `close()` or a failure |
///
/// Send and receive may be outstanding at the same time. A receive that sees a malformed
/// frame completes with the `errc` naming the bad field; the stream cannot be parsed after
/// that (later receives repeat the error) but sends still work until the owner closes it.
template <class C>
concept connection =
    std::movable<C> && std::default_initializable<C> && requires(C& c, message&& m) {
      { c.async_send(std::move(m)) } -> std::same_as<asio::awaitable<std::error_code>>;
      { c.async_receive() } -> std::same_as<asio::awaitable<std::tuple<std::error_code, message>>>;
      { c.close() } noexcept;
      { c.is_open() } -> std::convertible_to<bool>;
    };

/// Accepts incoming connections of type `C`.
///
/// | expression          | type                                          | semantics |
/// |---------------------|-----------------------------------------------|-----------|
/// | `a.async_accept()`  | `asio::awaitable<std::tuple<std::error_code, C>>` | the next connection |
/// | `a.close()`         | `void`, noexcept                              | stops accepting; an outstanding accept completes with an error |
template <class A, class C>
concept acceptor = std::movable<A> && requires(A& a) {
  { a.async_accept() } -> std::same_as<asio::awaitable<std::tuple<std::error_code, C>>>;
  { a.close() } noexcept;
};

/// A node's network endpoint.
///
/// | expression              | type                                   | semantics |
/// |-------------------------|----------------------------------------|-----------|
/// | `T::executor_type`      | an Asio executor                       | where this node's coroutines run |
/// | `T::endpoint_type`      | copyable                               | an address to listen on / connect to |
/// | `T::connection_type`    | models `connection`                    | |
/// | `T::acceptor_type`      | models `acceptor<T::connection_type>`  | |
/// | `t.get_executor()`      | `T::executor_type`                     | |
/// | `t.listen(ep)`          | `result<T::acceptor_type>`             | starts listening on `ep` |
/// | `t.async_connect(ep)`   | `asio::awaitable<std::tuple<std::error_code, T::connection_type>>` | connects to `ep` |
/// | `t.allocate(n)`         | `buffer`                               | an `n`-byte buffer to send (pooled) |
/// | `t.limits()`            | convertible to `wire_limits`           | validation limits for received frames |
///
/// Optional (not checked here): `T::timer_type` and `T::clock_type`, the timer and clock the
/// server, worker and chain master loops use (default `asio::steady_timer` and
/// `std::chrono::steady_clock`); see asyncps/detail/transport_time.hpp and
/// transport/simulated.hpp (virtual time). On a connection, `c.identity()` returning
/// `std::shared_ptr<const peer_identity>`: the ids its verified peer may claim
/// (asyncps/peer_identity.hpp; the TCP transport under TLS); without it, none (any id).
template <class T>
concept transport =
    requires(T& t, const typename T::endpoint_type& ep, std::size_t n) {
      typename T::executor_type;
      typename T::endpoint_type;
      typename T::connection_type;
      typename T::acceptor_type;
      { t.get_executor() } -> std::convertible_to<typename T::executor_type>;
      { t.listen(ep) } -> std::same_as<result<typename T::acceptor_type>>;
      {
        t.async_connect(ep)
      } -> std::same_as<asio::awaitable<std::tuple<std::error_code, typename T::connection_type>>>;
      { t.allocate(n) } -> std::same_as<buffer>;
      { t.limits() } -> std::convertible_to<wire_limits>;
    } && connection<typename T::connection_type> &&
    acceptor<typename T::acceptor_type, typename T::connection_type>;

}  // namespace asyncps
