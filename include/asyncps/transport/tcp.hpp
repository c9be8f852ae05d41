// asyncps — TCP transport over Asio (TCP_NODELAY, scatter-gather sends, pooled receives).
#pragma once

#include <array>
#include <charconv>
#include <cstddef>
#include <optional>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/buffer.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/error.hpp"
#include "asyncps/options.hpp"
#include "asyncps/result.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

/// Options of a `tcp_transport`.
struct tcp_options {
  wire_limits limits{};                                 ///< validation limits for received frames
  bool no_delay = true;                                 ///< set TCP_NODELAY on every connection
  int listen_backlog = 128;                             ///< accept queue length
  std::size_t pool_cache_bytes = std::size_t{1} << 30;  ///< see `buffer_pool`
};

/// Parses "host:port" (IPv4 or IPv6 literal, or "localhost") into a TCP endpoint.
/// Errors: `errc::invalid_argument` when the text is not of that form. Thread safety: pure.
inline result<asio::ip::tcp::endpoint> parse_tcp_endpoint(std::string_view text) {
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon + 1 >= text.size())
    return make_error_code(errc::invalid_argument);
  std::string_view host = text.substr(0, colon);
  const std::string_view port_text = text.substr(colon + 1);
  unsigned port = 0;
  const auto [end, perr] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (perr != std::errc{} || end != port_text.data() + port_text.size() || port > 65535)
    return make_error_code(errc::invalid_argument);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host == "localhost") host = "127.0.0.1";
  std::error_code ec;
  const auto addr = asio::ip::make_address(std::string(host), ec);
  if (ec) return make_error_code(errc::invalid_argument);
  return asio::ip::tcp::endpoint{addr, static_cast<unsigned short>(port)};
}

/// TCP transport: models `asyncps::transport`.
///
/// One object per node (server or worker); it must outlive its connections and acceptors and
/// every buffer it allocated. All connections use `get_executor()` (pass a strand to serialise
/// a node's coroutines). Object lifetimes: sockets belong to the `io_context` of
/// `get_executor()`, so that context must outlive every connection and acceptor made from this
/// transport (the peer's end is a separate socket: it sees `connection_closed` when this end
/// goes away); see docs/concepts/transport.md, "Object lifetimes". Sends are scatter-gather
/// (64-byte header + payload, no copy); receives read the header, validate it against `limits()`,
/// then read the payload straight into a pooled buffer and verify the checksum.
class tcp_transport {
 public:
  using executor_type = asio::any_io_executor;
  using endpoint_type = asio::ip::tcp::endpoint;

  /// A framed TCP connection. Models `asyncps::connection`.
  class connection {
   public:
    connection() = default;
    connection(connection&&) noexcept = default;
    connection& operator=(connection&&) noexcept = default;

    /// Sends `m` (header + payload) with one gathered write. Computes `payload_bytes` and the
    /// checksum. Completes with the socket's error, or success.
    asio::awaitable<std::error_code> async_send(message m) {
      if (!socket_) co_return make_error_code(errc::connection_closed);
      m.header.payload_bytes = m.payload.size();
      encode_header(m.header, std::span<std::byte, header_size>(send_header_), m.payload.bytes(),
                    true);
      const std::array<asio::const_buffer, 2> bufs{
          asio::buffer(send_header_.data(), header_size),
          asio::buffer(m.payload.data(), m.payload.size())};
      auto [ec, n] = co_await asio::async_write(*socket_, bufs, detail::use_tuple);
      (void)n;
      if (ec) close();
      co_return ec;
    }

    /// Receives the next message. Errors: `errc::connection_closed` at a frame boundary,
    /// `errc::truncated_frame` inside one, any `validate_header` error, `errc::bad_checksum`,
    /// or the socket's error. A socket error closes the connection; after a malformed frame
    /// the stream cannot be parsed any more, so later receives repeat that error, but sending
    /// still works (to tell the peer why) until the owner calls `close()`.
    asio::awaitable<std::tuple<std::error_code, message>> async_receive() {
      // One result object and no per-branch temporaries: keeps the coroutine frame small
      // enough for Asio's per-thread frame recycling (no heap allocation per message).
      std::tuple<std::error_code, message> out;
      if (!socket_) {
        std::get<0>(out) = make_error_code(errc::connection_closed);
      } else if (!poisoned_) {
        auto [ec, n] = co_await asio::async_read(
            *socket_, asio::buffer(recv_header_.data(), header_size), detail::use_tuple);
        std::get<0>(out) = on_header(ec, n, std::get<1>(out));
      } else {
        std::get<0>(out) = poisoned_;
      }
      if (!std::get<0>(out) && !std::get<1>(out).payload.empty()) {
        auto& p = std::get<1>(out).payload;
        auto [ec, n] = co_await asio::async_read(*socket_, asio::buffer(p.data(), p.size()),
                                                 detail::use_tuple);
        (void)n;
        if (ec) std::get<0>(out) = on_error(ec, true);
      }
      if (!std::get<0>(out)) std::get<0>(out) = verify(std::get<1>(out));
      if (std::get<0>(out)) std::get<1>(out) = message{};
      co_return out;
    }

    /// Closes the socket; outstanding operations complete with `asio::error::operation_aborted`.
    void close() noexcept {
      if (!socket_) return;
      std::error_code ignored;
      socket_->shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
      socket_->close(ignored);
    }
    bool is_open() const noexcept { return socket_ && socket_->is_open(); }

    /// The peer's address (for logs). Empty endpoint when closed.
    endpoint_type remote_endpoint() const noexcept {
      std::error_code ec;
      return socket_ ? socket_->remote_endpoint(ec) : endpoint_type{};
    }
    /// The underlying socket (for options such as buffer sizes). Precondition: connected
    /// (not a default-constructed placeholder).
    asio::ip::tcp::socket& socket() noexcept { return *socket_; }

   private:
    friend class tcp_transport;
    std::error_code on_error(std::error_code ec, bool inside_frame) noexcept {
      close();
      if (ec == asio::error::eof)
        return inside_frame ? make_error_code(errc::truncated_frame)
                            : make_error_code(errc::connection_closed);
      return ec;
    }
    std::error_code on_header(std::error_code ec, std::size_t n, message& m) {
      if (ec) return on_error(ec, n != 0);
      m.header = decode_header(std::span<const std::byte, header_size>(recv_header_));
      if (auto v = validate_header(m.header, transport_->options_.limits)) return poisoned_ = v;
      m.payload = transport_->allocate(static_cast<std::size_t>(m.header.payload_bytes));
      return {};
    }
    std::error_code verify(const message& m) noexcept {
      if (frame_checksum(std::span<const std::byte, header_size>(recv_header_),
                         m.payload.bytes()) != m.header.checksum)
        return poisoned_ = make_error_code(errc::bad_checksum);
      return {};
    }
    connection(tcp_transport& t, asio::ip::tcp::socket s) : transport_(&t), socket_(std::move(s)) {
      if (t.options_.no_delay) {
        std::error_code ignored;
        socket_->set_option(asio::ip::tcp::no_delay(true), ignored);
      }
    }
    tcp_transport* transport_ = nullptr;
    std::optional<asio::ip::tcp::socket> socket_;  // empty for a placeholder connection
    std::error_code poisoned_;
    alignas(64) std::array<std::byte, header_size> send_header_{};
    alignas(64) std::array<std::byte, header_size> recv_header_{};
  };

  /// Listening socket. Models `asyncps::acceptor<connection>`.
  class acceptor {
   public:
    acceptor(acceptor&&) noexcept = default;
    acceptor& operator=(acceptor&&) noexcept = default;

    /// The next connection (TCP_NODELAY set per the transport's options).
    asio::awaitable<std::tuple<std::error_code, connection>> async_accept() {
      auto [ec, sock] = co_await acceptor_.async_accept(detail::use_tuple);
      if (ec) co_return std::tuple{ec, connection{}};
      co_return std::tuple{std::error_code{}, connection{*transport_, std::move(sock)}};
    }
    void close() noexcept {
      std::error_code ignored;
      acceptor_.close(ignored);
    }
    /// The bound address (useful after listening on port 0).
    endpoint_type local_endpoint() const {
      std::error_code ec;
      return acceptor_.local_endpoint(ec);
    }

   private:
    friend class tcp_transport;
    acceptor(tcp_transport& t, asio::ip::tcp::acceptor a)
        : transport_(&t), acceptor_(std::move(a)) {}
    tcp_transport* transport_;
    asio::ip::tcp::acceptor acceptor_;
  };

  using connection_type = connection;
  using acceptor_type = acceptor;

  /// `ex`: where every connection of this node runs (a strand serialises the node).
  explicit tcp_transport(executor_type ex, tcp_options opts = {})
      : executor_(std::move(ex)), options_(opts), pool_(opts.pool_cache_bytes) {}
  tcp_transport(const tcp_transport&) = delete;
  tcp_transport& operator=(const tcp_transport&) = delete;

  executor_type get_executor() const noexcept { return executor_; }
  const wire_limits& limits() const noexcept { return options_.limits; }
  const tcp_options& options() const noexcept { return options_; }

  /// Listens on `ep` (SO_REUSEADDR). Errors: the socket's (e.g. address in use).
  result<acceptor> listen(const endpoint_type& ep) {
    asio::ip::tcp::acceptor a(executor_);
    std::error_code ec;
    a.open(ep.protocol(), ec);
    if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) a.bind(ep, ec);
    if (!ec) a.listen(options_.listen_backlog, ec);
    if (ec) return ec;
    return acceptor{*this, std::move(a)};
  }

  /// Connects to `ep`. Completes with the socket's error (e.g. connection refused).
  asio::awaitable<std::tuple<std::error_code, connection>> async_connect(endpoint_type ep) {
    asio::ip::tcp::socket s(executor_);
    auto [ec] = co_await s.async_connect(ep, detail::use_tuple);
    if (ec) co_return std::tuple{ec, connection{}};
    co_return std::tuple{std::error_code{}, connection{*this, std::move(s)}};
  }

  /// A pooled, 64-byte-aligned buffer of `bytes` bytes. Thread safety: any thread.
  buffer allocate(std::size_t bytes) { return pool_.allocate(bytes); }
  /// The buffer pool (for statistics).
  const buffer_pool& pool() const noexcept { return pool_; }

 private:
  executor_type executor_;
  tcp_options options_;
  buffer_pool pool_;
};

static_assert(transport<tcp_transport>);

}  // namespace asyncps
