// asyncps — TCP transport over Asio (TCP_NODELAY, scatter-gather sends, pooled receives), with
// optional mutual TLS (tls.hpp) and an optional shared-secret handshake on every connection
// (detail/auth.hpp, docs/security.md).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/buffer.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/ssl/context.hpp>
#include <asio/ssl/error.hpp>
#include <asio/ssl/stream.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <sys/socket.h>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/auth.hpp"
#include "asyncps/error.hpp"
#include "asyncps/options.hpp"
#include "asyncps/result.hpp"
#include "asyncps/secret.hpp"
#include "asyncps/tls.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/transport/tcp_options.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

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
///
/// TLS (`tcp_options::tls` set): each connection is an `asio::ssl::stream` over its socket. The
/// TLS handshake runs where the secret's handshake runs (inside `async_connect`; inside an
/// accepted connection's first `async_receive`, under the same `auth_timeout`) and before it;
/// then the listener sends an 8-byte `tls_ready` message, so that `async_connect` completes only
/// once the listener has accepted this node's certificate (docs/wire-format.md). With TLS the
/// executor must run one handler at a time (a strand, or an `io_context` run by one thread):
/// `asio::ssl::stream` allows one read and one write in flight, on one strand. `close()` does
/// not send TLS's close_notify (it cannot wait for the peer): the peer sees the TCP end, which
/// the transport reports as it does without TLS (`connection_closed` at a frame boundary,
/// `truncated_frame` inside one). Frames over TLS are copied into TLS records (16 KiB at most)
/// and may allocate per message; the plain path is unchanged.
class tcp_transport {
 public:
  using executor_type = asio::any_io_executor;
  using endpoint_type = asio::ip::tcp::endpoint;
  /// A connection's stream when TLS is on.
  using tls_stream = asio::ssl::stream<asio::ip::tcp::socket>;

  /// A framed TCP connection. Models `asyncps::connection`.
  class connection {
   public:
    /// Plain TCP reads ahead up to this many bytes per read (one buffer per connection, made
    /// at its first receive), so a burst of small frames costs one system call, not two per
    /// frame; of a larger payload at most this much is copied, the rest read in place.
    static constexpr std::size_t read_ahead_bytes = std::size_t{16} << 10;

    connection() = default;
    connection(connection&&) noexcept = default;
    connection& operator=(connection&&) noexcept = default;

    /// Sends `m` (header + payload) with one gathered write. Computes `payload_bytes` and the
    /// checksum. Completes with the socket's error, or success.
    asio::awaitable<std::error_code> async_send(message m) {
      if (!socket_ && !tls_) co_return make_error_code(errc::connection_closed);
      if (auth_ != auth_state::done) co_return make_error_code(errc::authentication_failed);
      m.header.payload_bytes = m.payload.size();
      // State transfers are always checked whole: they replace a shard's parameters.
      const bool whole =
          transport_->options_.checksum_payloads || m.header.type == message_type::state;
      m.header.flags =
          static_cast<std::uint8_t>(whole ? m.header.flags & ~frame_flags::payload_unchecked
                                          : m.header.flags | frame_flags::payload_unchecked);
      encode_header(m.header, std::span<std::byte, header_size>(send_header_),
                    whole ? m.payload.bytes() : std::span<const std::byte>{}, true);
      const std::array<asio::const_buffer, 2> bufs{
          asio::buffer(send_header_.data(), header_size),
          asio::buffer(m.payload.data(), m.payload.size())};
      std::error_code ec;
      if (tls_) {
        ec = co_await tls_write(bufs);
      } else {
        auto [wec, n] = co_await asio::async_write(*socket_, bufs, detail::use_tuple);
        (void)n;
        ec = wec;
      }
      if (ec) close();
      co_return ec;
    }

    /// Receives the next message. Errors: `errc::connection_closed` at a frame boundary,
    /// `errc::truncated_frame` inside one, any `validate_header` error, `errc::bad_checksum`,
    /// or the socket's error. A socket error closes the connection; after a malformed frame
    /// the stream cannot be parsed any more, so later receives repeat that error, but sending
    /// still works (to tell the peer why) until the owner calls `close()`. On an accepted
    /// connection of a transport with a secret or TLS, the first receive runs the handshakes
    /// first: `errc::tls_handshake_failed` (no TLS, or a certificate the CA did not sign;
    /// `tls_failure()` says why), `errc::authentication_failed` (wrong or no secret; the peer
    /// got a refusal) or `errc::timeout` (no proof within `auth_timeout`) close the connection
    /// for good. `errc::authentication_required`: the peer requires a secret or TLS that this
    /// transport lacks. Under TLS, OpenSSL's errors (category "asio.ssl", e.g. a record that
    /// fails its integrity check) close the connection; they match
    /// `condition::protocol_violation`.
    asio::awaitable<std::tuple<std::error_code, message>> async_receive() {
      // One result object and no per-branch temporaries: keeps the coroutine frame small
      // enough for Asio's per-thread frame recycling (no heap allocation per message).
      std::tuple<std::error_code, message> out;
      if (auth_ == auth_state::listener_pending) std::get<0>(out) = co_await listener_handshake();
      if (std::get<0>(out)) {
        // the handshake failed: the connection is closed
      } else if (!socket_ && !tls_) {
        std::get<0>(out) = make_error_code(errc::connection_closed);
      } else if (!poisoned_) {
        std::error_code ec;
        std::size_t n = 0;
        if (tls_) {
          std::tie(ec, n) = co_await tls_read(asio::buffer(recv_header_.data(), header_size));
        } else {
          // Plain TCP reads ahead: one read takes whatever has arrived, up to
          // `read_ahead_bytes`, and the frames already buffered cost no system call.
          if (buffered() < header_size) {
            if (!rbuf_) {
              rbuf_ = std::make_unique<std::byte[]>(read_ahead_bytes);
              rpos_ = rend_ = 0;
            }
            std::memmove(rbuf_.get(), rbuf_.get() + rpos_, buffered());
            rend_ -= rpos_;
            rpos_ = 0;
            while (!ec && rend_ < header_size) {
              std::tie(ec, n) = co_await socket_->async_read_some(
                  asio::buffer(rbuf_.get() + rend_, read_ahead_bytes - rend_), detail::use_tuple);
              rend_ += n;
            }
          }
          n = std::min(buffered(), header_size);
          if (n > 0) std::memcpy(recv_header_.data(), rbuf_.get() + rpos_, n);
          if (n == header_size) {
            ec = {};  // a whole header arrived before the error: the error comes next time
            rpos_ += header_size;
          }
        }
        std::get<0>(out) = on_header(ec, n, std::get<1>(out));
        if (!std::get<0>(out) && std::get<1>(out).payload.data() == nullptr)
          std::get<0>(out) = co_await wait_for_budget(std::get<1>(out));
      } else {
        std::get<0>(out) = poisoned_;
      }
      if (!std::get<0>(out) && !std::get<1>(out).payload.empty()) {
        auto& p = std::get<1>(out).payload;
        std::error_code ec;
        std::size_t n = 0;
        if (tls_) {
          std::tie(ec, n) = co_await tls_read(asio::buffer(p.data(), p.size()));
        } else {
          // What was read ahead is copied (at most `read_ahead_bytes`); the rest of a large
          // payload is read straight into its buffer.
          n = std::min(buffered(), p.size());
          if (n > 0) std::memcpy(p.data(), rbuf_.get() + rpos_, n);
          rpos_ += n;
          if (n < p.size())
            std::tie(ec, n) = co_await asio::async_read(
                *socket_, asio::buffer(p.data() + n, p.size() - n), detail::use_tuple);
        }
        if (ec) std::get<0>(out) = on_error(ec, true);
      }
      if (!std::get<0>(out)) std::get<0>(out) = verify(std::get<1>(out));
      if (std::get<0>(out)) std::get<1>(out) = message{};
      co_return out;
    }

    /// Closes the socket; outstanding operations complete with `asio::error::operation_aborted`.
    /// Under TLS, no close_notify is sent (see the class comment).
    void close() noexcept {
      rpos_ = rend_ = 0;  // frames read ahead are never delivered after a close
      if (!socket_ && !tls_) return;
      std::error_code ignored;
      lowest().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
      lowest().close(ignored);
    }
    bool is_open() const noexcept {
      return (socket_ && socket_->is_open()) || (tls_ && tls_->next_layer().is_open());
    }
    /// Whether this connection runs over TLS.
    bool uses_tls() const noexcept { return tls_ != nullptr; }
    /// Why this connection's TLS handshake failed: OpenSSL's reason (e.g. "certificate verify
    /// failed", "wrong version number"), "the peer does not speak TLS" (a listener that got
    /// something else), or "" (no failure, or no reason known: the peer hung up). A string
    /// with static storage.
    std::string_view tls_failure() const noexcept { return tls_failure_; }

    /// The peer's address when the connection was made (for logs; still valid after
    /// `close()`). Empty endpoint for a placeholder connection.
    endpoint_type remote_endpoint() const noexcept { return remote_; }
    /// The underlying socket (for options such as buffer sizes; under TLS, the socket below the
    /// TLS stream). Precondition: connected (not a default-constructed placeholder).
    asio::ip::tcp::socket& socket() noexcept { return lowest(); }

   private:
    friend class tcp_transport;
    enum class auth_state : std::uint8_t { done, listener_pending, failed };

    asio::ip::tcp::socket& lowest() noexcept { return tls_ ? tls_->next_layer() : *socket_; }
    const asio::ip::tcp::socket& lowest() const noexcept {
      return tls_ ? tls_->next_layer() : *socket_;
    }

    // Reads all of `b` / writes all of `bs` over TLS (kept out of async_receive and async_send,
    // so that their coroutine frames stay as small as without TLS).
    asio::awaitable<std::tuple<std::error_code, std::size_t>> tls_read(asio::mutable_buffer b) {
      co_return co_await asio::async_read(*tls_, b, detail::use_tuple);
    }
    asio::awaitable<std::error_code> tls_write(std::array<asio::const_buffer, 2> bs) {
      auto [ec, n] = co_await asio::async_write(*tls_, bs, detail::use_tuple);
      (void)n;
      co_return ec;
    }

    // Runs `steps` with `auth_timeout` as its deadline; closes the connection on any failure.
    asio::awaitable<std::error_code> with_deadline(asio::awaitable<std::error_code> steps) {
      using namespace asio::experimental::awaitable_operators;
      asio::steady_timer timer(lowest().get_executor(), transport_->options_.auth_timeout);
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
        tls_.reset();     // no operation is in flight: both branches above have completed
      } else {
        auth_ = auth_state::done;
      }
      co_return ec;
    }

    // `op(stream)` on the TLS stream or the plain socket, whichever this connection uses
    // (`op` returns the same awaitable type for both).
    template <class Op>
    auto on_stream(Op op) {
      return tls_ ? op(*tls_) : op(*socket_);
    }
    // Reads all of `b` during the handshake (see below for a peer that hangs up).
    asio::awaitable<std::error_code> handshake_read(asio::mutable_buffer b) {
      auto [ec, n] = co_await on_stream(
          [b](auto& stream) { return asio::async_read(stream, b, detail::use_tuple); });
      (void)n;
      // A connecting peer that hangs up has failed to authenticate. A listener that hangs up
      // may have died (a server killed mid-handshake): the connector may retry.
      if (hung_up(ec))
        ec = make_error_code(accepted_ ? errc::authentication_failed : errc::connection_closed);
      co_return ec;
    }
    static bool hung_up(std::error_code ec) noexcept {
      return ec == asio::error::eof || ec == asio::ssl::error::stream_truncated ||
             ec == asio::error::connection_reset;
    }
    // The first bytes of a TLS record (content type handshake or alert, version 3.x): what a TLS
    // peer sends where this transport without TLS expects a frame.
    static bool looks_like_tls(const std::byte* p, std::size_t n) noexcept {
      return n >= 2 && (p[0] == std::byte{0x15} || p[0] == std::byte{0x16}) &&
             p[1] == std::byte{0x03};
    }
    asio::awaitable<std::error_code> handshake_write(asio::const_buffer b) {
      auto [ec, n] = co_await on_stream(
          [b](auto& stream) { return asio::async_write(stream, b, detail::use_tuple); });
      (void)n;
      co_return ec;
    }

    // The TLS handshake, then the listener's `tls_ready` (sent by a listener, awaited by a
    // connector). Any failure is `tls_handshake_failed`; OpenSSL's reason goes to tls_failure_.
    // A listener first peeks at the peer's first byte: a peer that does not start with a TLS
    // handshake record (OpenSSL would close without a word) is sent `tls_required` in the clear.
    asio::awaitable<std::error_code> tls_steps(bool listener) {
      if (listener) {
        std::array<std::byte, 1> first{};
        auto [pec, pn] = co_await tls_->next_layer().async_receive(
            asio::buffer(first), asio::socket_base::message_peek, detail::use_tuple);
        if (!pec && pn == 1 && first[0] != std::byte{0x16}) {
          tls_failure_ = "the peer does not speak TLS";
          const auto required = detail::auth::encode_bare(detail::auth::kind::tls_required);
          (void)co_await asio::async_write(tls_->next_layer(), asio::buffer(required),
                                           detail::use_tuple);
          co_return make_error_code(errc::tls_handshake_failed);
        }
      }
      auto [ec] = co_await tls_->async_handshake(listener ? asio::ssl::stream_base::server
                                                          : asio::ssl::stream_base::client,
                                                 detail::use_tuple);
      if (!ec && listener) {
        const auto ready = detail::auth::encode_bare(detail::auth::kind::tls_ready);
        auto [wec, wn] = co_await asio::async_write(*tls_, asio::buffer(ready), detail::use_tuple);
        (void)wn;
        ec = wec;
      } else if (!ec) {
        detail::auth::prefix_msg ready{};
        auto [rec, rn] = co_await asio::async_read(*tls_, asio::buffer(ready), detail::use_tuple);
        (void)rn;
        ec = rec;
        if (!ec && detail::auth::check_prefix(ready, detail::auth::kind::tls_ready))
          ec = make_error_code(errc::tls_handshake_failed);
      }
      if (!ec) co_return ec;
      // The listener hung up without a TLS alert (it may have died): retrying may succeed.
      if (!listener && hung_up(ec)) co_return make_error_code(errc::connection_closed);
      if (ec.category() == asio::error::get_ssl_category()) {
        const char* reason = ERR_reason_error_string(
            static_cast<unsigned long>(static_cast<unsigned int>(ec.value())));
        tls_failure_ = reason != nullptr ? reason : "";
      }
      co_return make_error_code(errc::tls_handshake_failed);
    }

    // The listener's side: TLS, then the secret's (detail/auth.hpp): challenge, check the
    // response, verdict.
    asio::awaitable<std::error_code> listener_steps() {
      if (tls_) {
        if (auto ec = co_await tls_steps(true)) co_return ec;
      }
      const shared_secret& key = transport_->options_.secret;
      if (key.empty()) co_return std::error_code{};
      detail::auth::nonce ns{}, nc{};
      if (!detail::auth::make_nonce(ns)) co_return make_error_code(errc::authentication_failed);
      const auto challenge = detail::auth::encode_challenge(ns);
      if (auto wec = co_await handshake_write(asio::buffer(challenge))) co_return wec;
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
      const auto vec = co_await handshake_write(asio::buffer(answer));
      co_return verdict ? verdict : vec;
    }

    // The connector's side: TLS, then the secret's: answer the challenge, check the listener's
    // proof.
    asio::awaitable<std::error_code> connector_steps() {
      if (tls_) {
        if (auto ec = co_await tls_steps(false)) co_return ec;
      }
      const shared_secret& key = transport_->options_.secret;
      if (key.empty()) co_return std::error_code{};
      detail::auth::challenge_msg challenge{};
      if (auto ec = co_await handshake_read(asio::buffer(challenge))) co_return ec;
      detail::auth::nonce ns{}, nc{};
      if (auto ec = detail::auth::parse_challenge(challenge, ns)) co_return ec;
      if (!detail::auth::make_nonce(nc)) co_return make_error_code(errc::authentication_failed);
      const auto response = detail::auth::encode_response(key, ns, nc);
      if (auto wec = co_await handshake_write(asio::buffer(response))) co_return wec;
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
      // Without close_notify (see close()), a TLS peer's end reads as a truncated stream.
      if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated)
        return inside_frame ? make_error_code(errc::truncated_frame)
                            : make_error_code(errc::connection_closed);
      return ec;
    }
    std::error_code on_header(std::error_code ec, std::size_t n, message& m) {
      // A handshake prefix and the end where a frame was expected: a TLS listener's
      // `tls_required` (or a challenge cut short). The peer requires what this node lacks.
      if (ec && !tls_ && n >= 4 &&
          detail::load_le<std::uint32_t>(recv_header_.data()) == detail::auth::magic) {
        close();
        return make_error_code(errc::authentication_required);
      }
      if (ec) return on_error(ec, n != 0);
      m.header = decode_header(std::span<const std::byte, header_size>(recv_header_));
      if (auto v = validate_header(m.header, transport_->options_.limits)) {
        // A listener's handshake challenge where a frame was expected: it requires a secret;
        // a TLS record: the peer speaks TLS, which this transport lacks.
        if (v == errc::bad_magic && (m.header.magic == detail::auth::magic ||
                                     (!tls_ && looks_like_tls(recv_header_.data(), n))))
          v = make_error_code(errc::authentication_required);
        return poisoned_ = v;
      }
      // A header-only checksum is checked before anything is allocated for the payload.
      if (m.header.has(frame_flags::payload_unchecked)) {
        if (auto ec = verify_header(m)) return ec;
      }
      m.payload =
          transport_->receive_buffer(static_cast<std::size_t>(m.header.payload_bytes), accepted_);
      return {};
    }
    // The frame in `m` does not fit `max_receive_bytes` yet: polls (1 ms, doubling up to
    // 16 ms) until it does, or the connection is closed. Its own coroutine, so that
    // async_receive's frame stays small.
    asio::awaitable<std::error_code> wait_for_budget(message& m) {
      transport_->receive_waits_.fetch_add(1, std::memory_order_relaxed);
      asio::steady_timer timer(lowest().get_executor());
      auto delay = std::chrono::milliseconds(1);
      for (;;) {
        timer.expires_after(delay);
        auto [ec] = co_await timer.async_wait(detail::use_tuple);
        if (ec || !is_open()) co_return on_error(asio::error::operation_aborted, true);
        m.payload =
            transport_->receive_buffer(static_cast<std::size_t>(m.header.payload_bytes), true);
        if (m.payload.data() != nullptr) co_return std::error_code{};
        delay = std::min(delay * 2, std::chrono::milliseconds(16));
      }
    }
    // The checksum over the payload too, unless the header says it covers the header only
    // (then on_header checked it).
    std::error_code verify(const message& m) noexcept {
      if (m.header.has(frame_flags::payload_unchecked)) return {};
      if (frame_checksum(std::span<const std::byte, header_size>(recv_header_),
                         m.payload.bytes()) != m.header.checksum)
        return poisoned_ = make_error_code(errc::bad_checksum);
      return {};
    }
    std::error_code verify_header(const message& m) noexcept {
      if (frame_checksum(std::span<const std::byte, header_size>(recv_header_), {}) !=
          m.header.checksum)
        return poisoned_ = make_error_code(errc::bad_checksum);
      return {};
    }
    connection(tcp_transport& t, asio::ip::tcp::socket s, bool accepted) : transport_(&t) {
      std::error_code ignored;
      if (t.options_.no_delay) s.set_option(asio::ip::tcp::no_delay(true), ignored);
      if (t.options_.keepalive) set_keepalive(s, *t.options_.keepalive);
      remote_ = s.remote_endpoint(ignored);
      if (t.tls_context_) {
        tls_ = std::make_unique<tls_stream>(std::move(s), *t.tls_context_);
      } else {
        socket_.emplace(std::move(s));
      }
      if (accepted && (!t.options_.secret.empty() || tls_)) auth_ = auth_state::listener_pending;
      accepted_ = accepted;
    }
    // Keepalive probes (and TCP_USER_TIMEOUT) on `s`; best effort: an option the platform
    // lacks is left at its default.
    static void set_keepalive(asio::ip::tcp::socket& s, const tcp_keepalive& k) noexcept {
      std::error_code ignored;
      s.set_option(asio::socket_base::keep_alive(true), ignored);
#if defined(TCP_KEEPIDLE) && defined(TCP_KEEPINTVL) && defined(TCP_KEEPCNT)
      const int fd = s.native_handle();
      const int idle = static_cast<int>(std::max<std::int64_t>(1, k.idle.count()));
      const int interval = static_cast<int>(std::max<std::int64_t>(1, k.interval.count()));
      const int probes = std::max(1, k.probes);
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
      ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
#if defined(TCP_USER_TIMEOUT)
      if (k.user_timeout.count() > 0) {
        const unsigned ms = static_cast<unsigned>(k.user_timeout.count());
        ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
      }
#endif
#else
      (void)k;
#endif
    }
    bool needs_handshake() const noexcept { return tls_ || !transport_->options_.secret.empty(); }
    // Bytes read ahead and not parsed yet (none in a moved-from connection).
    std::size_t buffered() const noexcept { return rbuf_ ? rend_ - rpos_ : 0; }
    tcp_transport* transport_ = nullptr;
    // At most one of these two holds the socket; neither for a placeholder connection.
    std::optional<asio::ip::tcp::socket> socket_;  // without TLS
    std::unique_ptr<tls_stream> tls_;              // with TLS (the socket is its next layer)
    const char* tls_failure_ = "";
    endpoint_type remote_{};
    auth_state auth_ = auth_state::done;
    bool accepted_ = false;  // made by an acceptor (the listener's side of the handshake)
    std::error_code poisoned_;
    alignas(64) std::array<std::byte, header_size> send_header_{};
    alignas(64) std::array<std::byte, header_size> recv_header_{};
    // Plain TCP's read-ahead: bytes [rpos_, rend_) of rbuf_ (`read_ahead_bytes`, allocated at
    // the first receive) arrived and are not parsed yet. Handshakes read exactly what they
    // need, so nothing of a frame is ever read before the handshake is over.
    std::unique_ptr<std::byte[]> rbuf_;
    std::size_t rpos_ = 0;
    std::size_t rend_ = 0;
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
  /// With `opts.tls` set, loads the TLS files (`make_tls_context`: blocking file I/O); a problem
  /// is reported by `listen` and `async_connect` (`errc::tls_setup_failed`) and by
  /// `tls_setup_error()`. Exceptions: `std::bad_alloc` only.
  explicit tcp_transport(executor_type ex, tcp_options opts = {})
      : executor_(std::move(ex)), options_(std::move(opts)), pool_(options_.pool_cache_bytes),
        receive_budget_(receive_budget(options_)),
        receive_pool_(std::min<std::uint64_t>(options_.pool_cache_bytes, receive_budget_)) {
    if (!options_.tls.enabled()) return;
    auto ctx = make_tls_context(options_.tls, tls_setup_error_);
    if (ctx) {
      tls_context_.emplace(ctx.value().release());
    } else {
      tls_setup_ec_ = ctx.error();
    }
  }
  tcp_transport(const tcp_transport&) = delete;
  tcp_transport& operator=(const tcp_transport&) = delete;

  executor_type get_executor() const noexcept { return executor_; }
  const wire_limits& limits() const noexcept { return options_.limits; }
  const tcp_options& options() const noexcept { return options_; }
  /// Whether connections use TLS (`tcp_options::tls` set and its files loaded).
  bool uses_tls() const noexcept { return tls_context_.has_value(); }
  /// Why the TLS files could not be used: one line naming the file and the reason (see
  /// `make_tls_context`); empty when TLS is off or ready.
  const std::string& tls_setup_error() const noexcept { return tls_setup_error_; }

  /// Listens on `ep` (SO_REUSEADDR). Errors: the socket's (e.g. address in use);
  /// `errc::tls_setup_failed` (see `tls_setup_error()`); `errc::weak_secret` when the secret is
  /// shorter than `min_secret_bytes`; `errc::authentication_required` for a non-loopback `ep`
  /// (0.0.0.0 included) without a secret nor TLS that verifies peers, unless
  /// `tcp_options::allow_unauthenticated`.
  result<acceptor> listen(const endpoint_type& ep) {
    if (tls_setup_ec_) return tls_setup_ec_;
    if (!options_.secret.empty() && !options_.secret.valid())
      return make_error_code(errc::weak_secret);
    const bool tls_authenticates = uses_tls() && options_.tls.verify_peer;
    if (options_.secret.empty() && !tls_authenticates && !options_.allow_unauthenticated &&
        !ep.address().is_loopback())
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

  /// Connects to `ep`; with TLS and/or a secret, also runs the handshakes and completes only
  /// once both ends proved themselves (TLS: the listener accepted this node's certificate and
  /// this node the listener's). Errors: the socket's (e.g. connection refused);
  /// `errc::tls_setup_failed`; `errc::weak_secret`; `errc::tls_handshake_failed` (the
  /// listener does not speak TLS, or one side refused the other's certificate; the returned,
  /// closed connection's `tls_failure()` says why); `errc::authentication_failed` (the
  /// listener refused this node's proof, or its own proof is wrong: it does not hold the
  /// secret); `errc::authentication_required` (the listener answered with a frame, not a
  /// challenge, or it requires TLS); `errc::timeout` (no handshake within `auth_timeout`, e.g.
  /// a listener without a secret); `errc::connection_closed` (the listener hung up during
  /// the handshake without refusing: it may have died, a retry may succeed). Every error
  /// but the socket's, `connection_closed` and `timeout` is final: retrying the same
  /// endpoint with the same options fails the same way (`is_final_connect_error`). On
  /// failure the connection returned is closed.
  asio::awaitable<std::tuple<std::error_code, connection>> async_connect(endpoint_type ep) {
    if (tls_setup_ec_) co_return std::tuple{tls_setup_ec_, connection{}};
    if (!options_.secret.empty() && !options_.secret.valid())
      co_return std::tuple{make_error_code(errc::weak_secret), connection{}};
    asio::ip::tcp::socket s(executor_);
    auto [ec] = co_await s.async_connect(ep, detail::use_tuple);
    if (ec) co_return std::tuple{ec, connection{}};
    connection c{*this, std::move(s), false};
    if (c.needs_handshake()) {
      if (auto hec = co_await c.connector_handshake()) co_return std::tuple{hec, std::move(c)};
    }
    co_return std::tuple{std::error_code{}, std::move(c)};
  }

  /// A pooled, 64-byte-aligned buffer of `bytes` bytes. Thread safety: any thread.
  buffer allocate(std::size_t bytes) { return pool_.allocate(bytes); }
  /// The buffer pool of `allocate` and of the frames received by connections this node made
  /// or small enough not to count (for statistics).
  const buffer_pool& pool() const noexcept { return pool_; }
  /// The buffer pool of the frames of more than `tcp_options::small_frame_bytes` received by
  /// accepted connections, bounded by `tcp_options::max_receive_bytes` (for statistics:
  /// `lent_bytes()`, `cached_bytes()`).
  const buffer_pool& receive_pool() const noexcept { return receive_pool_; }
  /// How many times a received frame waited for `tcp_options::max_receive_bytes`. Thread
  /// safety: any thread.
  std::uint64_t receive_waits() const noexcept {
    return receive_waits_.load(std::memory_order_relaxed);
  }

 private:
  static std::uint64_t receive_budget(const tcp_options& o) noexcept {
    if (o.max_receive_bytes == 0) return ~std::uint64_t{0};
    const std::uint64_t frame = o.limits.max_frame_bytes < (std::uint64_t{1} << 62)
                                    ? std::bit_ceil(std::max<std::uint64_t>(
                                          o.limits.max_frame_bytes, tcp_options::small_frame_bytes))
                                    : ~std::uint64_t{0};
    return std::max(o.max_receive_bytes, frame);
  }
  // A buffer for a received frame of `bytes` payload bytes; on an accepted connection, from
  // the bounded pool, or `data() == nullptr` when it does not fit yet.
  buffer receive_buffer(std::size_t bytes, bool accepted) {
    if (!accepted || bytes <= tcp_options::small_frame_bytes) return pool_.allocate(bytes);
    return receive_pool_.try_allocate(
        bytes, static_cast<std::size_t>(std::min<std::uint64_t>(receive_budget_, SIZE_MAX)));
  }

  executor_type executor_;
  tcp_options options_;
  buffer_pool pool_;
  std::uint64_t receive_budget_;
  buffer_pool receive_pool_;
  std::atomic<std::uint64_t> receive_waits_{0};
  std::optional<asio::ssl::context> tls_context_;  // set when TLS is on and its files loaded
  std::error_code tls_setup_ec_;
  std::string tls_setup_error_;
};

static_assert(transport<tcp_transport>);

}  // namespace asyncps
