// asyncps — TCP transport over Asio (TCP_NODELAY, scatter-gather sends, pooled receives), with
// an optional shared-secret handshake on every connection (detail/auth.hpp, docs/security.md).
#pragma once

#include <array>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/buffer.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/auth.hpp"
#include "asyncps/error.hpp"
#include "asyncps/options.hpp"
#include "asyncps/result.hpp"
#include "asyncps/secret.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

/// Options of a `tcp_transport`.
struct tcp_options {
  wire_limits limits{};                                 ///< validation limits for received frames
  bool no_delay = true;                                 ///< set TCP_NODELAY on every connection
  int listen_backlog = 128;                             ///< accept queue length
  std::size_t pool_cache_bytes = std::size_t{1} << 30;  ///< see `buffer_pool`
  /// The run's shared secret (`load_secret_file`). Non-empty: every connection, accepted or
  /// made, first runs the mutual HMAC handshake (detail/auth.hpp); a peer without the secret
  /// never gets a frame through. Empty: no authentication (see `allow_unauthenticated`).
  /// Every node of a run needs the same secret.
  shared_secret secret{};
  /// Without a secret, `listen` refuses every address but a loopback one
  /// (`errc::authentication_required`) unless this is set: set it only on a network where
  /// every host that can reach the port is trusted (docs/security.md).
  bool allow_unauthenticated = false;
  /// How long the handshake may take, for either side; a peer that has not authenticated by
  /// then is closed (`errc::timeout`). Unused without a secret.
  std::chrono::milliseconds auth_timeout{5000};
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
///
/// Authentication (`tcp_options::secret` set): `async_connect` completes only after the
/// handshake proved that both ends hold the secret; an accepted connection runs the listener's
/// side lazily, inside its first `async_receive` (so a slow peer never stalls the accept loop),
/// reading fixed-size handshake messages only (72 bytes at most) and allocating nothing from the
/// pool before the peer has proved itself. Until that receive has completed, the accepted
/// connection sends nothing (`async_send` fails with `errc::authentication_failed`).
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
      if (auth_ != auth_state::done) co_return make_error_code(errc::authentication_failed);
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
    /// still works (to tell the peer why) until the owner calls `close()`. On an accepted
    /// connection of a transport with a secret, the first receive runs the handshake first:
    /// `errc::authentication_failed` (wrong or no secret; the peer got a refusal) or
    /// `errc::timeout` (no proof within `auth_timeout`) close the connection for good.
    /// `errc::authentication_required`: the peer requires a secret this transport lacks.
    asio::awaitable<std::tuple<std::error_code, message>> async_receive() {
      // One result object and no per-branch temporaries: keeps the coroutine frame small
      // enough for Asio's per-thread frame recycling (no heap allocation per message).
      std::tuple<std::error_code, message> out;
      if (auth_ == auth_state::listener_pending) std::get<0>(out) = co_await listener_handshake();
      if (std::get<0>(out)) {
        // the handshake failed: the connection is closed
      } else if (!socket_) {
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

    /// The peer's address when the connection was made (for logs; still valid after
    /// `close()`). Empty endpoint for a placeholder connection.
    endpoint_type remote_endpoint() const noexcept { return remote_; }
    /// The underlying socket (for options such as buffer sizes). Precondition: connected
    /// (not a default-constructed placeholder).
    asio::ip::tcp::socket& socket() noexcept { return *socket_; }

   private:
    friend class tcp_transport;
    enum class auth_state : std::uint8_t { done, listener_pending, failed };

    // Runs `steps` with `auth_timeout` as its deadline; closes the connection on any failure.
    asio::awaitable<std::error_code> with_deadline(asio::awaitable<std::error_code> steps) {
      using namespace asio::experimental::awaitable_operators;
      asio::steady_timer timer(socket_->get_executor(), transport_->options_.auth_timeout);
      auto deadline = [](asio::steady_timer& t) -> asio::awaitable<std::error_code> {
        auto [ec] = co_await t.async_wait(detail::use_tuple);
        co_return ec ? ec : make_error_code(errc::timeout);
      };
      auto r = co_await (std::move(steps) || deadline(timer));
      std::error_code ec = r.index() == 0 ? std::get<0>(r) : std::get<1>(r);
      if (ec) {
        auth_ = auth_state::failed;
        close();
        socket_.reset();  // later receives and sends see connection_closed
      } else {
        auth_ = auth_state::done;
      }
      co_return ec;
    }

    // Reads all of `b` during the handshake; a peer that hangs up has failed to authenticate.
    asio::awaitable<std::error_code> handshake_read(asio::mutable_buffer b) {
      auto [ec, n] = co_await asio::async_read(*socket_, b, detail::use_tuple);
      (void)n;
      co_return ec == asio::error::eof ? make_error_code(errc::authentication_failed) : ec;
    }

    // The listener's side (detail/auth.hpp): challenge, check the response, verdict.
    asio::awaitable<std::error_code> listener_steps() {
      const shared_secret& key = transport_->options_.secret;
      detail::auth::nonce ns{}, nc{};
      if (!detail::auth::make_nonce(ns)) co_return make_error_code(errc::authentication_failed);
      const auto challenge = detail::auth::encode_challenge(ns);
      auto [wec, wn] =
          co_await asio::async_write(*socket_, asio::buffer(challenge), detail::use_tuple);
      (void)wn;
      if (wec) co_return wec;
      detail::auth::response_msg response{};
      // The prefix first: a peer that sends a frame (no secret) is refused at once.
      if (auto ec =
              co_await handshake_read(asio::buffer(response.data(), detail::auth::prefix_bytes)))
        co_return ec;
      std::error_code verdict =
          detail::auth::check_prefix(std::span<const std::byte, detail::auth::prefix_bytes>(
                                         response.data(), detail::auth::prefix_bytes),
                                     detail::auth::kind::response);
      if (!verdict) {
        if (auto ec = co_await handshake_read(
                asio::buffer(response.data() + detail::auth::prefix_bytes,
                             detail::auth::response_bytes - detail::auth::prefix_bytes)))
          co_return ec;
        verdict = detail::auth::check_response(key, ns, response, nc);
      }
      if (verdict) verdict = make_error_code(errc::authentication_failed);
      const auto answer = detail::auth::encode_verdict(key, ns, nc, !verdict);
      auto [vec, vn] =
          co_await asio::async_write(*socket_, asio::buffer(answer), detail::use_tuple);
      (void)vn;
      co_return verdict ? verdict : vec;
    }

    // The connector's side: answer the challenge, check the listener's proof.
    asio::awaitable<std::error_code> connector_steps() {
      const shared_secret& key = transport_->options_.secret;
      detail::auth::challenge_msg challenge{};
      if (auto ec = co_await handshake_read(asio::buffer(challenge))) co_return ec;
      detail::auth::nonce ns{}, nc{};
      if (auto ec = detail::auth::parse_challenge(challenge, ns)) co_return ec;
      if (!detail::auth::make_nonce(nc)) co_return make_error_code(errc::authentication_failed);
      const auto response = detail::auth::encode_response(key, ns, nc);
      auto [wec, wn] =
          co_await asio::async_write(*socket_, asio::buffer(response), detail::use_tuple);
      (void)wn;
      if (wec) co_return wec;
      detail::auth::verdict_msg verdict{};
      if (auto ec = co_await handshake_read(asio::buffer(verdict))) co_return ec;
      co_return detail::auth::check_verdict(key, ns, nc, verdict);
    }

    asio::awaitable<std::error_code> listener_handshake() {
      return with_deadline(listener_steps());
    }
    asio::awaitable<std::error_code> connector_handshake() {
      return with_deadline(connector_steps());
    }

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
      if (auto v = validate_header(m.header, transport_->options_.limits)) {
        // A listener's handshake challenge where a frame was expected: it requires a secret.
        if (v == errc::bad_magic && m.header.magic == detail::auth::magic)
          v = make_error_code(errc::authentication_required);
        return poisoned_ = v;
      }
      m.payload = transport_->allocate(static_cast<std::size_t>(m.header.payload_bytes));
      return {};
    }
    std::error_code verify(const message& m) noexcept {
      if (frame_checksum(std::span<const std::byte, header_size>(recv_header_),
                         m.payload.bytes()) != m.header.checksum)
        return poisoned_ = make_error_code(errc::bad_checksum);
      return {};
    }
    connection(tcp_transport& t, asio::ip::tcp::socket s, bool accepted)
        : transport_(&t), socket_(std::move(s)) {
      std::error_code ignored;
      if (t.options_.no_delay) socket_->set_option(asio::ip::tcp::no_delay(true), ignored);
      remote_ = socket_->remote_endpoint(ignored);
      if (accepted && !t.options_.secret.empty()) auth_ = auth_state::listener_pending;
    }
    tcp_transport* transport_ = nullptr;
    std::optional<asio::ip::tcp::socket> socket_;  // empty for a placeholder connection
    endpoint_type remote_{};
    auth_state auth_ = auth_state::done;
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
      co_return std::tuple{std::error_code{}, connection{*transport_, std::move(sock), true}};
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
      : executor_(std::move(ex)), options_(std::move(opts)), pool_(options_.pool_cache_bytes) {}
  tcp_transport(const tcp_transport&) = delete;
  tcp_transport& operator=(const tcp_transport&) = delete;

  executor_type get_executor() const noexcept { return executor_; }
  const wire_limits& limits() const noexcept { return options_.limits; }
  const tcp_options& options() const noexcept { return options_; }

  /// Listens on `ep` (SO_REUSEADDR). Errors: the socket's (e.g. address in use);
  /// `errc::weak_secret` when the secret is shorter than `min_secret_bytes`;
  /// `errc::authentication_required` for a non-loopback `ep` (0.0.0.0 included) without a
  /// secret, unless `tcp_options::allow_unauthenticated`.
  result<acceptor> listen(const endpoint_type& ep) {
    if (!options_.secret.empty() && !options_.secret.valid())
      return make_error_code(errc::weak_secret);
    if (options_.secret.empty() && !options_.allow_unauthenticated && !ep.address().is_loopback())
      return make_error_code(errc::authentication_required);
    asio::ip::tcp::acceptor a(executor_);
    std::error_code ec;
    a.open(ep.protocol(), ec);
    if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) a.bind(ep, ec);
    if (!ec) a.listen(options_.listen_backlog, ec);
    if (ec) return ec;
    return acceptor{*this, std::move(a)};
  }

  /// Connects to `ep`; with a secret, also runs the handshake and completes only once both
  /// ends proved they hold it. Errors: the socket's (e.g. connection refused);
  /// `errc::weak_secret`; `errc::authentication_failed` (the listener refused this node's
  /// proof, or its own proof is wrong: it does not hold the secret);
  /// `errc::authentication_required` (the listener answered with a frame, not a challenge);
  /// `errc::timeout` (no handshake within `auth_timeout`, e.g. a listener without a secret).
  asio::awaitable<std::tuple<std::error_code, connection>> async_connect(endpoint_type ep) {
    if (!options_.secret.empty() && !options_.secret.valid())
      co_return std::tuple{make_error_code(errc::weak_secret), connection{}};
    asio::ip::tcp::socket s(executor_);
    auto [ec] = co_await s.async_connect(ep, detail::use_tuple);
    if (ec) co_return std::tuple{ec, connection{}};
    connection c{*this, std::move(s), false};
    if (!options_.secret.empty()) {
      if (auto hec = co_await c.connector_handshake()) co_return std::tuple{hec, connection{}};
    }
    co_return std::tuple{std::error_code{}, std::move(c)};
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
