// asyncps — the definitions of tcp_transport's member functions (transport/tcp.hpp).
//
// Not a header to include on its own: transport/tcp.hpp includes it (header-only, the
// default), or asyncps/src.hpp compiles it once (ASYNCPS_SEPARATE_COMPILATION defined;
// docs/build_time.md, "Separate compilation"). It does not include that header back (no include
// cycle): whoever includes this file has included the header first.
#pragma once

#include <bit>
#include <cstring>

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/read.hpp>
#include <asio/ssl/context.hpp>
#include <asio/ssl/error.hpp>
#include <asio/ssl/stream.hpp>
#include <asio/write.hpp>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <sys/socket.h>

#include "asyncps/detail/auth.hpp"
#include "asyncps/detail/config.hpp"
#include "asyncps/tls.hpp"

// Compiled once (separate compilation), these coroutines are not inline; g++ 12 then reports
// their frames' fields of lambda type (with_deadline's `deadline`, the operations that
// handshake_read and handshake_write pass to on_stream) as types without linkage inside a type
// with linkage (-Wsubobject-linkage). The frames exist in this translation unit only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsubobject-linkage"
#endif

namespace asyncps {

namespace detail {
struct tcp_tls_stream : asio::ssl::stream<asio::ip::tcp::socket> {
  using asio::ssl::stream<asio::ip::tcp::socket>::stream;
};
struct tcp_tls_context : asio::ssl::context {
  using asio::ssl::context::context;
};
ASYNCPS_DECL void tcp_tls_deleter::operator()(tcp_tls_stream* s) const noexcept { delete s; }
ASYNCPS_DECL void tcp_tls_deleter::operator()(tcp_tls_context* c) const noexcept { delete c; }
}  // namespace detail

ASYNCPS_DECL bool tcp_transport::connection::is_open() const noexcept {
  return (socket_ && socket_->is_open()) || (tls_ && tls_->next_layer().is_open());
}

ASYNCPS_DECL asio::ip::tcp::socket& tcp_transport::connection::lowest() noexcept {
  return tls_ ? tls_->next_layer() : *socket_;
}

ASYNCPS_DECL asio::awaitable<std::error_code> tcp_transport::connection::async_send(message m) {
  if (!socket_ && !tls_) co_return make_error_code(errc::connection_closed);
  if (auth_ != auth_state::done) co_return make_error_code(errc::authentication_failed);
  m.header.payload_bytes = m.payload.size();
  // The policy's bytes (state transfers, replicas, orders) are always checked whole.
  const bool whole = transport_->options_.checksum_payloads || carries_policy_bytes(m.header);
  m.header.flags =
      static_cast<std::uint8_t>(whole ? m.header.flags & ~frame_flags::payload_unchecked
                                      : m.header.flags | frame_flags::payload_unchecked);
  encode_header(m.header, std::span<std::byte, header_size>(send_header_),
                whole ? m.payload.bytes() : std::span<const std::byte>{}, true);
  const std::array<asio::const_buffer, 2> bufs{asio::buffer(send_header_.data(), header_size),
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

ASYNCPS_DECL asio::awaitable<std::tuple<std::error_code, message>>
tcp_transport::connection::async_receive() {
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
      if (n < p.size()) {
        const auto rest = asio::buffer(p.data() + n, p.size() - n);
        if (rest.size() > transport_->options_.receive_wakeup_bytes &&
            transport_->options_.receive_wakeup_bytes != 0) {
          std::tie(ec, n) = co_await read_waking_less(rest);
        } else {
          std::tie(ec, n) = co_await asio::async_read(*socket_, rest, detail::use_tuple);
        }
      }
    }
    if (ec) std::get<0>(out) = on_error(ec, true);
  }
  if (!std::get<0>(out)) std::get<0>(out) = verify(std::get<1>(out));
  if (std::get<0>(out)) std::get<1>(out) = message{};
  co_return out;
}

ASYNCPS_DECL asio::awaitable<std::tuple<std::error_code, std::size_t>>
tcp_transport::connection::read_waking_less(asio::mutable_buffer rest) {
  const std::size_t step = transport_->options_.receive_wakeup_bytes;
  std::size_t done = 0;
  std::size_t set = 1;
  std::error_code ec;
  while (!ec && done < rest.size()) {
    // Never more than what is still to come: the reader would wait for bytes the peer does not
    // send until it has a reply.
    const std::size_t want = std::min(rest.size() - done, step);
    if (want != set) {
      std::error_code ignored;  // best effort: without it, reads wake as they would anyway
      socket_->set_option(asio::socket_base::receive_low_watermark(static_cast<int>(want)),
                          ignored);
      set = want;
    }
    auto [rec, k] = co_await socket_->async_read_some(asio::buffer(rest + done), detail::use_tuple);
    ec = rec;
    done += k;
  }
  if (set != 1 && socket_->is_open()) {
    std::error_code ignored;
    socket_->set_option(asio::socket_base::receive_low_watermark(1), ignored);
  }
  co_return std::tuple{ec, done};
}

ASYNCPS_DECL void tcp_transport::connection::close() noexcept {
  rpos_ = rend_ = 0;  // frames read ahead are never delivered after a close
  if (!socket_ && !tls_) return;
  std::error_code ignored;
  lowest().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  lowest().close(ignored);
}

ASYNCPS_DECL asio::awaitable<std::tuple<std::error_code, std::size_t>>
tcp_transport::connection::tls_read(asio::mutable_buffer b) {
  co_return co_await asio::async_read(*tls_, b, detail::use_tuple);
}

ASYNCPS_DECL asio::awaitable<std::error_code>
tcp_transport::connection::tls_write(std::array<asio::const_buffer, 2> bs) {
  auto [ec, n] = co_await asio::async_write(*tls_, bs, detail::use_tuple);
  (void)n;
  co_return ec;
}

ASYNCPS_DECL asio::awaitable<std::error_code>
tcp_transport::connection::with_deadline(asio::awaitable<std::error_code> steps) {
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

ASYNCPS_DECL asio::awaitable<std::error_code>
tcp_transport::connection::handshake_read(asio::mutable_buffer b) {
  auto [ec, n] = co_await on_stream(
      [b](auto& stream) { return asio::async_read(stream, b, detail::use_tuple); });
  (void)n;
  // A connecting peer that hangs up has failed to authenticate. A listener that hangs up
  // may have died (a server killed mid-handshake): the connector may retry.
  if (hung_up(ec))
    ec = make_error_code(accepted_ ? errc::authentication_failed : errc::connection_closed);
  co_return ec;
}

ASYNCPS_DECL bool tcp_transport::connection::hung_up(std::error_code ec) noexcept {
  return ec == asio::error::eof || ec == asio::ssl::error::stream_truncated ||
         ec == asio::error::connection_reset;
}

ASYNCPS_DECL bool tcp_transport::connection::looks_like_tls(const std::byte* p,
                                                            std::size_t n) noexcept {
  return n >= 2 && (p[0] == std::byte{0x15} || p[0] == std::byte{0x16}) && p[1] == std::byte{0x03};
}

ASYNCPS_DECL asio::awaitable<std::error_code>
tcp_transport::connection::handshake_write(asio::const_buffer b) {
  auto [ec, n] = co_await on_stream(
      [b](auto& stream) { return asio::async_write(stream, b, detail::use_tuple); });
  (void)n;
  co_return ec;
}

ASYNCPS_DECL asio::awaitable<std::error_code> tcp_transport::connection::tls_steps(bool listener) {
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
  // The peer's identity (its certificate verified: the handshake succeeded). A refusal here
  // is this end's: the listener tells the connector with a bare `refuse` in place of
  // `tls_ready`, so that the connector fails for good instead of retrying a hang-up.
  const char* refusal = nullptr;
  if (!ec && transport_->options_.tls.verify_peer)
    refusal = detail::read_peer_identity(tls_->native_handle(),
                                         transport_->options_.tls.require_identity, identity_);
  if (!ec && listener) {
    const auto ready = detail::auth::encode_bare(
        refusal != nullptr ? detail::auth::kind::refuse : detail::auth::kind::tls_ready);
    auto [wec, wn] = co_await asio::async_write(*tls_, asio::buffer(ready), detail::use_tuple);
    (void)wn;
    ec = wec;
  } else if (!ec) {
    detail::auth::prefix_msg ready{};
    auto [rec, rn] = co_await asio::async_read(*tls_, asio::buffer(ready), detail::use_tuple);
    (void)rn;
    ec = rec;
    if (!ec && !detail::auth::check_prefix(ready, detail::auth::kind::refuse)) {
      tls_failure_ = "the listener refused this node's certificate identity (malformed, or none "
                     "under its require_identity)";
      identity_.reset();
      co_return make_error_code(errc::tls_handshake_failed);
    }
    if (!ec && detail::auth::check_prefix(ready, detail::auth::kind::tls_ready))
      ec = make_error_code(errc::tls_handshake_failed);
  }
  if (!ec && refusal != nullptr) {
    tls_failure_ = refusal;
    identity_.reset();
    co_return make_error_code(errc::tls_handshake_failed);
  }
  if (!ec) co_return ec;
  // The listener hung up without a TLS alert (it may have died): retrying may succeed.
  if (!listener && hung_up(ec)) co_return make_error_code(errc::connection_closed);
  if (ec.category() == asio::error::get_ssl_category()) {
    const char* reason =
        ERR_reason_error_string(static_cast<unsigned long>(static_cast<unsigned int>(ec.value())));
    tls_failure_ = reason != nullptr ? reason : "";
  }
  co_return make_error_code(errc::tls_handshake_failed);
}

ASYNCPS_DECL asio::awaitable<std::error_code> tcp_transport::connection::listener_steps() {
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
  if (auto ec = co_await handshake_read(asio::buffer(response.data(), detail::auth::prefix_bytes)))
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

ASYNCPS_DECL asio::awaitable<std::error_code> tcp_transport::connection::connector_steps() {
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

ASYNCPS_DECL asio::awaitable<std::error_code> tcp_transport::connection::listener_handshake() {
  return with_deadline(listener_steps());
}

ASYNCPS_DECL asio::awaitable<std::error_code> tcp_transport::connection::connector_handshake() {
  return with_deadline(connector_steps());
}

ASYNCPS_DECL std::error_code tcp_transport::connection::on_error(std::error_code ec,
                                                                 bool inside_frame) noexcept {
  close();
  // Without close_notify (see close()), a TLS peer's end reads as a truncated stream.
  if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated)
    return inside_frame ? make_error_code(errc::truncated_frame)
                        : make_error_code(errc::connection_closed);
  return ec;
}

ASYNCPS_DECL std::error_code tcp_transport::connection::on_header(std::error_code ec, std::size_t n,
                                                                  message& m) {
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

ASYNCPS_DECL asio::awaitable<std::error_code>
tcp_transport::connection::wait_for_budget(message& m) {
  transport_->receive_waits_.fetch_add(1, std::memory_order_relaxed);
  asio::steady_timer timer(lowest().get_executor());
  auto delay = std::chrono::milliseconds(1);
  for (;;) {
    timer.expires_after(delay);
    auto [ec] = co_await timer.async_wait(detail::use_tuple);
    if (ec || !is_open()) co_return on_error(asio::error::operation_aborted, true);
    m.payload = transport_->receive_buffer(static_cast<std::size_t>(m.header.payload_bytes), true);
    if (m.payload.data() != nullptr) co_return std::error_code{};
    delay = std::min(delay * 2, std::chrono::milliseconds(16));
  }
}

ASYNCPS_DECL std::error_code tcp_transport::connection::verify(const message& m) noexcept {
  if (m.header.has(frame_flags::payload_unchecked)) return {};
  if (frame_checksum(std::span<const std::byte, header_size>(recv_header_), m.payload.bytes()) !=
      m.header.checksum)
    return poisoned_ = make_error_code(errc::bad_checksum);
  return {};
}

ASYNCPS_DECL std::error_code tcp_transport::connection::verify_header(const message& m) noexcept {
  if (frame_checksum(std::span<const std::byte, header_size>(recv_header_), {}) !=
      m.header.checksum)
    return poisoned_ = make_error_code(errc::bad_checksum);
  return {};
}

ASYNCPS_DECL tcp_transport::connection::connection(tcp_transport& t, asio::ip::tcp::socket s,
                                                   bool accepted)
    : transport_(&t) {
  std::error_code ignored;
  if (t.options_.no_delay) s.set_option(asio::ip::tcp::no_delay(true), ignored);
  if (t.options_.keepalive) set_keepalive(s, *t.options_.keepalive);
  // An accepted socket inherits the listener's sizes on Linux; set them again where it may not
  // (a connecting socket got them before `connect`: setting them again costs two calls).
  if (accepted) (void)set_buffer_sizes(s, t.options_);
  remote_ = s.remote_endpoint(ignored);
  if (t.tls_context_) {
    tls_.reset(new detail::tcp_tls_stream(std::move(s), *t.tls_context_));
  } else {
    socket_.emplace(std::move(s));
  }
  if (accepted && (!t.options_.secret.empty() || tls_)) auth_ = auth_state::listener_pending;
  accepted_ = accepted;
}

ASYNCPS_DECL void tcp_transport::connection::set_keepalive(asio::ip::tcp::socket& s,
                                                           const tcp_keepalive& k) noexcept {
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

ASYNCPS_DECL asio::awaitable<std::tuple<std::error_code, tcp_transport::connection>>
tcp_transport::acceptor::async_accept() {
  auto [ec, sock] = co_await acceptor_.async_accept(detail::use_tuple);
  if (ec) co_return std::tuple{ec, connection{}};
  co_return std::tuple{std::error_code{}, connection{*transport_, std::move(sock), true}};
}

ASYNCPS_DECL tcp_transport::tcp_transport(executor_type ex, tcp_options opts)
    : executor_(std::move(ex)), options_(std::move(opts)), pool_(options_.pool_cache_bytes),
      receive_budget_(receive_budget(options_)),
      receive_pool_(std::min<std::uint64_t>(options_.pool_cache_bytes, receive_budget_)) {
  if (!options_.tls.enabled()) return;
  auto ctx = make_tls_context(options_.tls, tls_setup_error_);
  if (ctx) {
    tls_context_.reset(new detail::tcp_tls_context(ctx.value().release()));
  } else {
    tls_setup_ec_ = ctx.error();
  }
}

ASYNCPS_DECL result<tcp_transport::acceptor> tcp_transport::listen(const endpoint_type& ep) {
  if (tls_setup_ec_) return tls_setup_ec_;
  if (!options_.secret.empty() && !options_.secret.valid())
    return make_error_code(errc::weak_secret);
  const bool tls_authenticates = uses_tls() && options_.tls.verify_peer;
  if (options_.secret.empty() && !tls_authenticates && !options_.allow_unauthenticated &&
      !ep.address().is_loopback())
    return make_error_code(errc::authentication_required);
  if (auto bec = check_buffer_sizes(options_)) return bec;
  asio::ip::tcp::acceptor a(executor_);
  std::error_code ec;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  // Before `listen`: the window scale of an accepted connection is chosen from its receive
  // buffer when the SYN arrives.
  if (!ec) ec = set_buffer_sizes(a, options_);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(options_.listen_backlog, ec);
  if (ec) return ec;
  return acceptor{*this, std::move(a)};
}

ASYNCPS_DECL asio::awaitable<std::tuple<std::error_code, tcp_transport::connection>>
tcp_transport::async_connect(endpoint_type ep) {
  if (tls_setup_ec_) co_return std::tuple{tls_setup_ec_, connection{}};
  if (!options_.secret.empty() && !options_.secret.valid())
    co_return std::tuple{make_error_code(errc::weak_secret), connection{}};
  if (auto bec = check_buffer_sizes(options_)) co_return std::tuple{bec, connection{}};
  asio::ip::tcp::socket s(executor_);
  if (options_.send_buffer_bytes != 0 || options_.receive_buffer_bytes != 0) {
    // Before `connect` (the window scale is chosen from the receive buffer in the SYN).
    std::error_code oec;
    s.open(ep.protocol(), oec);
    if (!oec) oec = set_buffer_sizes(s, options_);
    if (oec) co_return std::tuple{oec, connection{}};
  }
  auto [ec] = co_await s.async_connect(ep, detail::use_tuple);
  if (ec) co_return std::tuple{ec, connection{}};
  connection c{*this, std::move(s), false};
  if (c.needs_handshake()) {
    if (auto hec = co_await c.connector_handshake()) co_return std::tuple{hec, std::move(c)};
  }
  co_return std::tuple{std::error_code{}, std::move(c)};
}

ASYNCPS_DECL std::uint64_t tcp_transport::receive_budget(const tcp_options& o) noexcept {
  if (o.max_receive_bytes == 0) return ~std::uint64_t{0};
  const std::uint64_t frame = o.limits.max_frame_bytes < (std::uint64_t{1} << 62)
                                  ? std::bit_ceil(std::max<std::uint64_t>(
                                        o.limits.max_frame_bytes, tcp_options::small_frame_bytes))
                                  : ~std::uint64_t{0};
  return std::max(o.max_receive_bytes, frame);
}

ASYNCPS_DECL std::error_code tcp_transport::check_buffer_sizes(const tcp_options& o) noexcept {
  if (o.send_buffer_bytes > tcp_options::max_socket_buffer_bytes ||
      o.receive_buffer_bytes > tcp_options::max_socket_buffer_bytes ||
      o.receive_wakeup_bytes > tcp_options::max_socket_buffer_bytes)
    return make_error_code(errc::invalid_argument);
  return {};
}

ASYNCPS_DECL buffer tcp_transport::receive_buffer(std::size_t bytes, bool accepted) {
  if (!accepted || bytes <= tcp_options::small_frame_bytes) return pool_.allocate(bytes);
  return receive_pool_.try_allocate(
      bytes, static_cast<std::size_t>(std::min<std::uint64_t>(receive_budget_, SIZE_MAX)));
}

}  // namespace asyncps

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
