// asyncps — the options of the TCP transport (`tcp_options`) and `parse_tcp_endpoint`, apart
// from transport/tcp.hpp so that a trainer's configuration code needs no socket headers.
#pragma once

#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include <asio/ip/tcp.hpp>

#include "asyncps/error.hpp"
#include "asyncps/options.hpp"
#include "asyncps/result.hpp"
#include "asyncps/secret.hpp"
#include "asyncps/tls_options.hpp"

namespace asyncps {

/// Dead-peer detection by the kernel on every connection (`tcp_options::keepalive`): TCP
/// keepalive probes on a connection idle for `idle`, every `interval`, and the connection fails
/// after `probes` unanswered ones; optionally TCP_USER_TIMEOUT. A peer whose host vanished
/// (power loss, cable out, a network partition) closes no connection, and without this an idle
/// connection to it stays open for hours (Linux's default keepalive starts after 2 h): a server
/// would keep a vanished worker as a member (elastic membership: it leaves `grace` after its
/// connection fails) and a worker would wait on a vanished server until its `silence_timeout`.
/// Probes are empty segments: the cost is one small packet per `interval` on idle connections.
struct tcp_keepalive {
  std::chrono::seconds idle{3};      ///< idle time before the first probe (TCP_KEEPIDLE), >= 1 s
  std::chrono::seconds interval{1};  ///< time between probes (TCP_KEEPINTVL), >= 1 s
  int probes = 3;                    ///< unanswered probes that fail the connection (TCP_KEEPCNT)
  /// TCP_USER_TIMEOUT: how long sent data may stay unacknowledged before the connection fails.
  /// Keepalive probes only idle connections, and a connection to a vanished peer is seldom
  /// idle: a server keeps sending heartbeat reports to a worker whose pull waits, and TCP
  /// retransmits them for about 15 minutes by default. On Linux it also replaces
  /// `interval * probes` as the keepalive deadline. A live peer acknowledges what its kernel
  /// receives whether or not the application reads, so only a dead or cut-off peer hits it.
  /// 0: the kernel's default.
  std::chrono::milliseconds user_timeout{10000};
};

/// Options of a `tcp_transport`.
struct tcp_options {
  wire_limits limits{};  ///< validation limits for received frames
  bool no_delay = true;  ///< set TCP_NODELAY on every connection
  /// Kernel keepalive on every connection (see `tcp_keepalive`): by default a vanished peer
  /// fails its connection within about 10 s (`user_timeout`), whether the connection was idle
  /// (3 s, then probes 1 s apart) or had data in flight. Unset: the kernel's defaults
  /// (keepalive off, retransmissions for about 15 minutes).
  std::optional<tcp_keepalive> keepalive = tcp_keepalive{};
  int listen_backlog = 128;                             ///< accept queue length
  std::size_t pool_cache_bytes = std::size_t{1} << 30;  ///< see `buffer_pool`
  /// The run's shared secret (`load_secret_file`). Non-empty: every connection, accepted or
  /// made, first runs the mutual HMAC handshake (detail/auth.hpp); a peer without the secret
  /// never gets a frame through. Empty: no authentication (see `allow_unauthenticated`).
  /// Every node of a run needs the same secret.
  shared_secret secret{};
  /// Without a secret or TLS with `verify_peer`, `listen` refuses every address but a loopback
  /// one (`errc::authentication_required`) unless this is set: set it only on a network where
  /// every host that can reach the port is trusted (docs/security.md).
  bool allow_unauthenticated = false;
  /// How long the handshakes (TLS, then the secret's) may take, for either side; a peer that
  /// has not authenticated by then is closed (`errc::timeout`). Unused without secret and TLS.
  std::chrono::milliseconds auth_timeout{5000};
  /// Mutual TLS (any file set): every connection, accepted or made, runs a TLS 1.3 handshake
  /// first, then the secret's handshake inside TLS when `secret` is set. Every node of a run
  /// needs TLS, with certificates signed by the same CA. The transport loads the files when it
  /// is constructed; a problem fails `listen` and `async_connect` with `errc::tls_setup_failed`.
  tls_options tls{};
  /// Payload bytes of received frames that the accepted connections may hold at once, in all:
  /// the frames being read and those the application still holds (pulls waiting for the
  /// server clock, pushes a chain head keeps until its tail acknowledges them). This bounds
  /// what many peers sending big frames together can make a server hold. Counted in pool
  /// blocks (powers of two: a 40 MiB frame counts 64 MiB), cached blocks included. A frame of
  /// more than `small_frame_bytes` that does not fit waits, unread (TCP then slows its
  /// sender), until held frames are freed; `receive_waits()` counts such waits. Frames of at
  /// most `small_frame_bytes` (acknowledgements, clocks, hellos, most pulls) neither wait nor
  /// count: per connection one is read at a time, and what the server keeps of them has its
  /// own bounds (`server_options::max_total_pending_pull_bytes`). Raised to fit one frame of
  /// `limits.max_frame_bytes`. 0: no bound. Connections this node made are not counted (a
  /// worker's pull replies are bounded by what it asked for).
  std::uint64_t max_receive_bytes = std::uint64_t{1} << 30;
  /// Whether frames carry a checksum (XXH3-64) of their payload as well as of their header.
  /// Off (the default): the header is still checksummed (checked before its payload is read)
  /// and the frame says so (`frame_flags::payload_unchecked`); the payload is left to TCP's
  /// checksum and the link's CRC, or to TLS's integrity. The recovery
  /// policy's bytes (`carries_policy_bytes`: state transfers, replicas, orders) are always
  /// checksummed whole, as are checkpoint files. A
  /// receiver accepts both kinds, whatever its own setting. The payload hash costs 14% of the
  /// CPU of a 4 MiB pull and 10-25% of its throughput on loopback (docs/performance.md,
  /// "Checksum"); turn it on where memory or NIC corruption must be caught end to end.
  bool checksum_payloads = false;
  /// SO_SNDBUF of every connection, in bytes: how much sent data the kernel may hold for a
  /// connection (unacknowledged, or not yet sent), so how far a large send gets before its
  /// writer waits for the peer. 0 (the default): the kernel's default, with its send-buffer
  /// autotuning up to `net.ipv4.tcp_wmem`'s maximum; a value turns autotuning off for the
  /// connection. Linux caps the value at `net.core.wmem_max` (no privilege is used to pass
  /// it) and doubles it for its bookkeeping. Set on the listening socket before `listen`
  /// (accepted connections inherit it, and set it again) and on a connecting socket before
  /// `connect`, as TCP needs for its window scale. The default stays 0 because no size
  /// measured better on loopback for 4 MiB frames (docs/performance.md, "Socket buffers"):
  /// set it for a path whose bandwidth-delay product exceeds what autotuning reaches.
  /// More than `max_socket_buffer_bytes`: `listen` and `async_connect` fail with
  /// `errc::invalid_argument`.
  std::size_t send_buffer_bytes = 0;
  /// SO_RCVBUF of every connection, in bytes: the most received data the kernel holds that
  /// the application has not read, which bounds the window TCP advertises. 0 (the default):
  /// the kernel's default, autotuned up to `net.ipv4.tcp_rmem`'s maximum; a value turns
  /// autotuning off for the connection. Capped at `net.core.rmem_max`, doubled, applied and
  /// bounded as `send_buffer_bytes` (same errors, same measurement behind the default).
  std::size_t receive_buffer_bytes = 0;
  /// While the rest of a received payload is larger than this (bytes), the connection sets
  /// SO_RCVLOWAT to this (or to the rest, when less) so that its reader is woken once per this
  /// many bytes arrived, not once per batch of segments (on loopback about 64 KiB: some 60
  /// wake-ups, reads and empty reads per 4 MiB frame); SO_RCVLOWAT goes back to 1 after the
  /// payload, so frames of up to this size and the headers are read as before. The kernel
  /// still wakes the reader early when its receive window runs out, and caps the value at
  /// half the receive buffer (Linux 4.18 and later also grow an autotuned buffer to fit it;
  /// use 0 on older kernels). 0 (the default): off, every arrival wakes the reader. Measured
  /// (docs/performance.md, "Socket buffers"): 1 MiB cuts the reads per 4 MiB frame from ~120
  /// to ~20; on the 2-core VM under load (4.7-8.7) it moved 4 MiB frames 1.07-1.44x faster
  /// through the protocol client and 1.18x (BSP clock) through `basic_worker`, but on the quiet
  /// VM (load 1.0-1.3, 12 rounds) the BSP clock ran at 0.90x of off and the other rows moved
  /// both ways within the noise, so it is not the default. Plain TCP only (not under TLS).
  /// More than `max_socket_buffer_bytes`: `listen` and `async_connect` fail with
  /// `errc::invalid_argument`.
  std::size_t receive_wakeup_bytes = 0;
  /// The largest `send_buffer_bytes`, `receive_buffer_bytes` and `receive_wakeup_bytes` accepted:
  /// 256 MiB, the bandwidth-delay product of 10 Gbit/s over a 200 ms round trip. More is taken for
  /// a mistake in units (a count of KiB or MiB given as bytes), not a wish.
  static constexpr std::size_t max_socket_buffer_bytes = std::size_t{256} << 20;
  /// Frames up to this many payload bytes are received without waiting for
  /// `max_receive_bytes` (see there).
  static constexpr std::size_t small_frame_bytes = std::size_t{64} << 10;
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

}  // namespace asyncps
