// asyncps — TCP transport over Asio (TCP_NODELAY, scatter-gather sends, pooled receives), with
// optional mutual TLS (tls.hpp) and an optional shared-secret handshake on every connection
// (detail/auth.hpp, docs/security.md).
// The member functions are defined in transport/impl/tcp.ipp: included at the end of this header
// (header-only, the default), or compiled once by asyncps/src.hpp when
// ASYNCPS_SEPARATE_COMPILATION is defined (docs/build_time.md, "Separate compilation").
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/buffer.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/config.hpp"
#include "asyncps/error.hpp"
#include "asyncps/options.hpp"
#include "asyncps/peer_identity.hpp"
#include "asyncps/result.hpp"
#include "asyncps/secret.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/transport/tcp_options.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

namespace detail {
// A connection's TLS stream (an `asio::ssl::stream` over its socket) and a transport's TLS
// context (an `asio::ssl::context`), defined in transport/impl/tcp.ipp: a translation unit that
// only declares the transport (separate compilation) then parses neither Asio's SSL nor OpenSSL.
struct tcp_tls_stream;
struct tcp_tls_context;
struct tcp_tls_deleter {
  ASYNCPS_DECL void operator()(tcp_tls_stream* s) const noexcept;
  ASYNCPS_DECL void operator()(tcp_tls_context* c) const noexcept;
};
}  // namespace detail

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
/// once the listener has accepted this node's certificate (docs/wire-format.md). Both ends then
/// read the peer certificate's asyncps identity (`connection::identity()`); one that names a
/// malformed identity, or none under `tls_options::require_identity`, fails the handshake
/// (a listener sends a bare `refuse` in place of `tls_ready`). With TLS the
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
    asio::awaitable<std::error_code> async_send(message m);

    /// Receives the next message. Errors: `errc::connection_closed` at a frame boundary,
    /// `errc::truncated_frame` inside one, any `validate_header` error, `errc::bad_checksum`,
    /// or the socket's error. A socket error closes the connection; after a malformed frame
    /// the stream cannot be parsed any more, so later receives repeat that error, but sending
    /// still works (to tell the peer why) until the owner calls `close()`. On an accepted
    /// connection of a transport with a secret or TLS, the first receive runs the handshakes
    /// first: `errc::tls_handshake_failed` (no TLS, a certificate the CA did not sign, or one
    /// whose asyncps identity is malformed or missing under `require_identity`;
    /// `tls_failure()` says why), `errc::authentication_failed` (wrong or no secret; the peer
    /// got a refusal) or `errc::timeout` (no proof within `auth_timeout`) close the connection
    /// for good. `errc::authentication_required`: the peer requires a secret or TLS that this
    /// transport lacks. Under TLS, OpenSSL's errors (category "asio.ssl", e.g. a record that
    /// fails its integrity check) close the connection; they match
    /// `condition::protocol_violation`.
    asio::awaitable<std::tuple<std::error_code, message>> async_receive();

    /// Closes the socket; outstanding operations complete with `asio::error::operation_aborted`.
    /// Under TLS, no close_notify is sent (see the class comment).
    void close() noexcept;
    /// Whether the connection's socket (under TLS, the stream's lower layer) is open; false
    /// for a moved-from or default-constructed placeholder. Thread safety: the connection's
    /// executor.
    ASYNCPS_DECL bool is_open() const noexcept;
    /// Whether this connection runs over TLS.
    bool uses_tls() const noexcept { return tls_ != nullptr; }
    /// Why this connection's TLS handshake failed: OpenSSL's reason (e.g. "certificate verify
    /// failed", "wrong version number"), "the peer does not speak TLS" (a listener that got
    /// something else), or "" (no failure, or no reason known: the peer hung up). A string
    /// with static storage.
    std::string_view tls_failure() const noexcept { return tls_failure_; }
    /// The identity the peer's verified certificate names (URI SANs `asyncps://<role>/<id>`,
    /// read once after the TLS handshake; `peer_identity`, docs/security.md "Identities").
    /// Null: no TLS, `verify_peer` off, the handshake not done yet (an accepted connection
    /// before its first receive completed), or a certificate naming no asyncps identity (the
    /// peer may claim any id). Still valid after `close()`.
    const std::shared_ptr<const peer_identity>& identity() const noexcept { return identity_; }

    /// The peer's address when the connection was made (for logs; still valid after
    /// `close()`). Empty endpoint for a placeholder connection.
    endpoint_type remote_endpoint() const noexcept { return remote_; }
    /// The underlying socket (for options such as buffer sizes; under TLS, the socket below the
    /// TLS stream). Precondition: connected (not a default-constructed placeholder).
    asio::ip::tcp::socket& socket() noexcept { return lowest(); }

   private:
    friend class tcp_transport;
    enum class auth_state : std::uint8_t { done, listener_pending, failed };

    ASYNCPS_DECL asio::ip::tcp::socket& lowest() noexcept;

    // Reads all of `b` / writes all of `bs` over TLS (kept out of async_receive and async_send,
    // so that their coroutine frames stay as small as without TLS).
    asio::awaitable<std::tuple<std::error_code, std::size_t>> tls_read(asio::mutable_buffer b);
    asio::awaitable<std::error_code> tls_write(std::array<asio::const_buffer, 2> bs);

    // Runs `steps` with `auth_timeout` as its deadline; closes the connection on any failure.
    asio::awaitable<std::error_code> with_deadline(asio::awaitable<std::error_code> steps);

    // `op(stream)` on the TLS stream or the plain socket, whichever this connection uses
    // (`op` returns the same awaitable type for both).
    template <class Op>
    auto on_stream(Op op) {
      return tls_ ? op(*tls_) : op(*socket_);
    }
    // Reads all of `b` during the handshake (see below for a peer that hangs up).
    asio::awaitable<std::error_code> handshake_read(asio::mutable_buffer b);
    static bool hung_up(std::error_code ec) noexcept;
    // The first bytes of a TLS record (content type handshake or alert, version 3.x): what a TLS
    // peer sends where this transport without TLS expects a frame.
    static bool looks_like_tls(const std::byte* p, std::size_t n) noexcept;
    asio::awaitable<std::error_code> handshake_write(asio::const_buffer b);

    // The TLS handshake, then the listener's `tls_ready` (sent by a listener, awaited by a
    // connector). Any failure is `tls_handshake_failed`; OpenSSL's reason goes to tls_failure_.
    // A listener first peeks at the peer's first byte: a peer that does not start with a TLS
    // handshake record (OpenSSL would close without a word) is sent `tls_required` in the clear.
    asio::awaitable<std::error_code> tls_steps(bool listener);

    // The listener's side: TLS, then the secret's (detail/auth.hpp): challenge, check the
    // response, verdict.
    asio::awaitable<std::error_code> listener_steps();

    // The connector's side: TLS, then the secret's: answer the challenge, check the listener's
    // proof.
    asio::awaitable<std::error_code> connector_steps();

    asio::awaitable<std::error_code> listener_handshake();
    asio::awaitable<std::error_code> connector_handshake();

    // Reads all of `rest` (plain TCP) with SO_RCVLOWAT raised per
    // `tcp_options::receive_wakeup_bytes`, then set back to 1.
    asio::awaitable<std::tuple<std::error_code, std::size_t>>
    read_waking_less(asio::mutable_buffer rest);
    std::error_code on_error(std::error_code ec, bool inside_frame) noexcept;
    std::error_code on_header(std::error_code ec, std::size_t n, message& m);
    // The frame in `m` does not fit `max_receive_bytes` yet: polls (1 ms, doubling up to
    // 16 ms) until it does, or the connection is closed. Its own coroutine, so that
    // async_receive's frame stays small.
    asio::awaitable<std::error_code> wait_for_budget(message& m);
    // The checksum over the payload too, unless the header says it covers the header only
    // (then on_header checked it).
    std::error_code verify(const message& m) noexcept;
    std::error_code verify_header(const message& m) noexcept;
    connection(tcp_transport& t, asio::ip::tcp::socket s, bool accepted);
    // Keepalive probes (and TCP_USER_TIMEOUT) on `s`; best effort: an option the platform
    // lacks is left at its default.
    static void set_keepalive(asio::ip::tcp::socket& s, const tcp_keepalive& k) noexcept;
    bool needs_handshake() const noexcept { return tls_ || !transport_->options_.secret.empty(); }
    // Bytes read ahead and not parsed yet (none in a moved-from connection).
    std::size_t buffered() const noexcept { return rbuf_ ? rend_ - rpos_ : 0; }
    tcp_transport* transport_ = nullptr;
    // At most one of these two holds the socket; neither for a placeholder connection.
    std::optional<asio::ip::tcp::socket> socket_;  // without TLS
    // With TLS (the socket is its next layer).
    std::unique_ptr<detail::tcp_tls_stream, detail::tcp_tls_deleter> tls_;
    const char* tls_failure_ = "";
    std::shared_ptr<const peer_identity> identity_;  // see identity()
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
    asio::awaitable<std::tuple<std::error_code, connection>> async_accept();
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
  explicit tcp_transport(executor_type ex, tcp_options opts = {});
  tcp_transport(const tcp_transport&) = delete;
  tcp_transport& operator=(const tcp_transport&) = delete;

  executor_type get_executor() const noexcept { return executor_; }
  const wire_limits& limits() const noexcept { return options_.limits; }
  const tcp_options& options() const noexcept { return options_; }
  /// Whether connections use TLS (`tcp_options::tls` set and its files loaded).
  bool uses_tls() const noexcept { return tls_context_ != nullptr; }
  /// Why the TLS files could not be used: one line naming the file and the reason (see
  /// `make_tls_context`); empty when TLS is off or ready.
  const std::string& tls_setup_error() const noexcept { return tls_setup_error_; }

  /// Listens on `ep` (SO_REUSEADDR; `tcp_options::send_buffer_bytes` and
  /// `receive_buffer_bytes` when set, inherited by accepted connections). Errors: the socket's
  /// (e.g. address in use); `errc::invalid_argument` (a socket buffer size or
  /// `receive_wakeup_bytes` above `tcp_options::max_socket_buffer_bytes`);
  /// `errc::tls_setup_failed` (see `tls_setup_error()`); `errc::weak_secret` when the secret is
  /// shorter than `min_secret_bytes`; `errc::authentication_required` for a non-loopback `ep`
  /// (0.0.0.0 included) without a secret nor TLS that verifies peers, unless
  /// `tcp_options::allow_unauthenticated`.
  result<acceptor> listen(const endpoint_type& ep);

  /// Connects to `ep`; with TLS and/or a secret, also runs the handshakes and completes only
  /// once both ends proved themselves (TLS: the listener accepted this node's certificate and
  /// this node the listener's). The socket buffer sizes of `tcp_options` are set before the
  /// connection is made. Errors: the socket's (e.g. connection refused);
  /// `errc::invalid_argument` (a socket buffer size or `receive_wakeup_bytes` above
  /// `tcp_options::max_socket_buffer_bytes`); `errc::tls_setup_failed`; `errc::weak_secret`;
  /// `errc::tls_handshake_failed` (the listener does not speak TLS, or one side refused the other's
  /// certificate or its asyncps identity; the returned, closed connection's `tls_failure()` says
  /// why); `errc::authentication_failed` (the listener refused this node's proof, or its own proof
  /// is wrong: it does not hold the secret); `errc::authentication_required` (the listener answered
  /// with a frame, not a challenge, or it requires TLS); `errc::timeout` (no handshake within
  /// `auth_timeout`, e.g. a listener without a secret); `errc::connection_closed` (the listener
  /// hung up during the handshake without refusing: it may have died, a retry may succeed). Every
  /// error but the socket's, `connection_closed` and `timeout` is final: retrying the same endpoint
  /// with the same options fails the same way (`is_final_connect_error`). On failure the connection
  /// returned is closed.
  asio::awaitable<std::tuple<std::error_code, connection>> async_connect(endpoint_type ep);

  /// A pooled, 64-byte-aligned buffer of `bytes` bytes. Thread safety: any thread.
  buffer allocate(std::size_t bytes) { return pool_.allocate(bytes); }
  /// The buffer pool of `allocate` and of the frames received by connections this node made
  /// or small enough not to count (for statistics).
  const buffer_pool& pool() const noexcept { return pool_; }
  /// The buffer pool of the frames of more than `tcp_options::small_frame_bytes` received by
  /// accepted connections, bounded by `tcp_options::max_receive_bytes` (for statistics:
  /// `lent_bytes()`, `cached_bytes()`).
  const buffer_pool& receive_pool() const noexcept { return receive_pool_; }
  /// Gives back to the heap what both pools cached beyond the working set since the last call
  /// (`buffer_pool::trim`); `basic_server` calls it every `server_options::pool_trim_interval`.
  /// Returns the bytes given back. Thread safety: any thread.
  std::size_t trim_pools() noexcept { return pool_.trim() + receive_pool_.trim(); }
  /// How many times a received frame waited for `tcp_options::max_receive_bytes`. Thread
  /// safety: any thread.
  std::uint64_t receive_waits() const noexcept {
    return receive_waits_.load(std::memory_order_relaxed);
  }

 private:
  static std::uint64_t receive_budget(const tcp_options& o) noexcept;
  // `errc::invalid_argument` when a socket buffer size or `receive_wakeup_bytes` of `o` is above
  // `tcp_options::max_socket_buffer_bytes`.
  static std::error_code check_buffer_sizes(const tcp_options& o) noexcept;
  // SO_SNDBUF / SO_RCVBUF per `o` (a size of 0 is left to the kernel) on a socket or an
  // acceptor, which must be open; `check_buffer_sizes(o)` passed. Returns the first error.
  template <class Socket>
  static std::error_code set_buffer_sizes(Socket& s, const tcp_options& o) noexcept {
    std::error_code ec;
    if (o.send_buffer_bytes != 0)
      s.set_option(asio::socket_base::send_buffer_size(static_cast<int>(o.send_buffer_bytes)), ec);
    if (!ec && o.receive_buffer_bytes != 0)
      s.set_option(asio::socket_base::receive_buffer_size(static_cast<int>(o.receive_buffer_bytes)),
                   ec);
    return ec;
  }
  // A buffer for a received frame of `bytes` payload bytes; on an accepted connection, from
  // the bounded pool, or `data() == nullptr` when it does not fit yet.
  buffer receive_buffer(std::size_t bytes, bool accepted);

  executor_type executor_;
  tcp_options options_;
  buffer_pool pool_;
  std::uint64_t receive_budget_;
  buffer_pool receive_pool_;
  std::atomic<std::uint64_t> receive_waits_{0};
  // Set when TLS is on and its files loaded.
  std::unique_ptr<detail::tcp_tls_context, detail::tcp_tls_deleter> tls_context_;
  std::error_code tls_setup_ec_;
  std::string tls_setup_error_;
};

static_assert(transport<tcp_transport>);

}  // namespace asyncps

#if !defined(ASYNCPS_SEPARATE_COMPILATION)
#include "asyncps/transport/impl/tcp.ipp"
#endif
