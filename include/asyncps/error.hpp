// asyncps — error codes and conditions.
//
// Every failure the library reports is an `asyncps::errc` wrapped in a `std::error_code`
// (category name "asyncps"). Callers that only care about *what to do* compare against an
// `asyncps::condition` instead of listing codes:
//
//   if (ec == asyncps::condition::transient) reconnect();
//
// Design follows Boost.Beast's error / condition split.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "asyncps/detail/config.hpp"

namespace asyncps {

/// Error codes produced by asyncps. Values are stable (they may appear in logs); a value that
/// left this list is never reused (26, 35 and 45 were chain replication's, which now has its
/// own codes: `recovery::chain_errc`). A recovery policy's own codes are in its folder
/// (`recovery/<p>/errors.hpp`) and travel in error frames as `policy_error_base` + code.
enum class errc {
  // --- wire format (remote input); each names the header field that was wrong ---
  bad_magic = 1,          ///< header `magic` is not "APS1"
  unsupported_version,    ///< header `version` differs from `wire_version`
  bad_message_type,       ///< header `type` is not a known message type
  bad_flags,              ///< header `flags` has unknown bits set
  frame_too_large,        ///< header `payload_bytes` exceeds `wire_limits::max_frame_bytes`
  too_many_rows,          ///< header `row_count` exceeds `wire_limits::max_rows`
  bad_checksum,           ///< header `checksum` does not match header + payload
  truncated_frame,        ///< the stream ended inside a frame
  payload_size_mismatch,  ///< `payload_bytes` disagrees with `row_count` x `width`
  bad_table,              ///< header `table` names no table of this shard
  bad_row_range,          ///< rows outside the shard's key range (or outside the table)
  bad_width,              ///< header `width` differs from the table's row width
  bad_sender,             ///< header `sender` is not a valid worker id
  unexpected_message,     ///< a message type that is not valid in this protocol state
  duplicate_worker,       ///< a second connection claimed a worker id that is connected
  layout_mismatch,        ///< worker and server disagree on the table layout
  non_finite_value,       ///< a pushed gradient holds NaN or infinity
  too_many_requests,      ///< a peer exceeded a limit on waiting pulls (its own or the server's)
  // --- local / operational ---
  connection_closed,  ///< the peer closed the connection
  server_lost,        ///< a server stayed unreachable past the recovery policy's timeout
  timeout,            ///< an operation did not complete in time
  stopped,            ///< the object was stopped by its owner
  invalid_argument,   ///< a precondition on a local argument was violated
  bad_file,           ///< a data or checkpoint file is missing, truncated or corrupt
  /// (remote input) a worker's hello names a different consistency or recovery policy than
  /// the server's: servers and workers must be instantiated with the same policy types
  policy_mismatch = 25,
  // 26: retired (chain replication's `not_head`, now `recovery::chain_errc::not_head`)
  /// (local, fatal) `compute_gradient` left a gradient value unwritten or computed NaN or
  /// infinity (found by `worker_options::check_gradients`; the log names table, row, column)
  bad_gradient = 27,
  /// (remote input) a push whose gradient is finite would make a parameter or the optimizer's
  /// state NaN or infinity: the push is refused whole (nothing applied) and the connection
  /// closed; retrying the same push will not help (condition `fatal` as well)
  non_finite_update,
  /// (remote input) the keys of a sparse push or pull are not strictly increasing (a repeated
  /// or out-of-order row): a reply could otherwise be larger than its request
  bad_key_order,
  /// (remote input) handling a peer's message needed more memory than the server could
  /// allocate (`std::bad_alloc` or `std::length_error`): that connection is closed. Also a
  /// worker's run when an allocation fails in its own loops (logged once, counted in
  /// `worker_stats::out_of_memory`)
  resource_exhausted,
  /// (remote input) a peer failed the shared-secret handshake: wrong secret, no secret, or
  /// bytes that are not a handshake (transport/tcp.hpp, docs/security.md)
  authentication_failed,
  /// (local, fatal) authentication is required but missing: a listen on a non-loopback
  /// address without `tcp_options::secret` (nor `allow_unauthenticated`), or a peer that
  /// requires a shared secret this node does not have
  authentication_required,
  /// (local, fatal) a shared secret is shorter than `min_secret_bytes` (16)
  weak_secret,
  /// (local, fatal) a secret file may be read by its group or others (chmod 600 it)
  insecure_secret_file = 34,
  // 35: retired (chain replication's `shard_lost`, now `recovery::chain_errc::shard_lost`)
  /// (remote input) a hello's clock is negative, above `protocol::max_clock`, or leads the
  /// connected workers by more than the staleness bound allows; or a worker's clock would
  /// move past `protocol::max_clock` (docs/wire-format.md, "Clocks in hello")
  bad_clock = 36,
  /// (local, fatal) `tcp_options::tls` cannot be used: a certificate, private key or CA file
  /// is missing, unreadable or not valid PEM, or the key does not match the certificate
  /// (`tcp_transport::tls_setup_error()` names the file and OpenSSL's reason)
  tls_setup_failed,
  /// (remote input) the TLS handshake with a peer failed: the peer does not speak TLS, its
  /// certificate is missing or not signed by `tls_options::ca_file`, or it refused this node's
  /// certificate (`tcp_transport::connection::tls_failure()` gives OpenSSL's reason)
  tls_handshake_failed,
  /// (fatal) the rendezvous refused a request that is valid on the wire but not for this job:
  /// a shard index >= its `num_servers`, a worker id >= its `num_workers`, no free shard or
  /// worker id left, or an announce without a host over a transport that knows no peer
  /// addresses (the `error` frame's reason names the values; asyncps/rendezvous.hpp)
  rendezvous_refused,
  /// (transient) a reader's pull reached a shard that is rebuilding its state after a restart
  /// (recovery::stateless waiting for a worker's replica, recovery::replica_log replaying):
  /// what it holds is not the model yet; `async_read_model` asks again until its deadline
  recovering,
  /// (remote input) a shard state to be installed (a checkpoint, a chain state transfer, a
  /// replica-log replica) fits the shard's layout but is not a state a run can reach: a
  /// non-finite value or optimizer state, a worker clock outside [0, `protocol::max_clock`],
  /// or an optimizer step, applied count or sequence number above `protocol::max_seq`; the
  /// detail names the field (`shard_core::restore_state`). Nothing is installed
  bad_state,
  /// (remote input) a log position from a peer (replica log: a `replay` announcement or end, a
  /// `commit`, a state replica's position; chain replication: a state transfer's position)
  /// above `protocol::max_seq`, which no server can have issued: the connection is refused,
  /// nothing of it is used
  bad_position,
  /// (transient) a hello named a worker id that a live connection holds: one that has sent a
  /// message within `server_options::takeover_silence` and is not an earlier connection of
  /// the same worker process (same incarnation). The newcomer is refused, the live worker
  /// keeps its id; a worker retries its hello (a restarted process gets in once its old
  /// connection is closed or silent past that bound)
  worker_id_in_use,
  /// (remote input) a push's L2 norm exceeds `server_options::max_update_norm`: it is refused
  /// whole (nothing applied) and the connection closed; retrying the same push will not help
  /// (condition `fatal`, as `non_finite_update`)
  update_too_large = 44,
  // 45: retired (chain replication's `member_id_in_use`, now
  // `recovery::chain_errc::member_id_in_use`)
  /// (remote input) a server refused the request with a code of its recovery policy
  /// (`recovery/<p>/errors.hpp`) that the receiver does not know, e.g. a reader, which runs no
  /// policy, refused by a chain member that is not the head: the error's reason (the
  /// server's text) names it
  policy_refusal = 46,
};

/// The highest `errc` value: a peer's error frame naming a code outside
/// [`errc::bad_magic`, `last_errc`] (or a retired value) carries no valid code.
inline constexpr errc last_errc = errc::policy_refusal;

/// The `errc` a peer's error frame names in its payload's code, or `std::nullopt` when `v` is
/// no `errc` value (0, a retired value, or one above `last_errc`; a peer is untrusted input).
/// Complexity: O(1). Thread safety: pure.
constexpr std::optional<errc> errc_from_wire(std::uint64_t v) noexcept {
  if (v < static_cast<std::uint64_t>(errc::bad_magic) || v > static_cast<std::uint64_t>(last_errc))
    return std::nullopt;
  if (v == 26 || v == 35 || v == 45) return std::nullopt;  // retired (see `errc`)
  return static_cast<errc>(v);
}

/// An error frame's code carries a recovery policy's own code `c` (1 to `max_policy_error`) as
/// `policy_error_base + c`; codes below the base are `errc` values (docs/wire-format.md,
/// "error"). Which policy's code it is follows from the hello: both ends run one policy.
inline constexpr std::uint32_t policy_error_base = 256;
inline constexpr std::uint32_t max_policy_error = 255;

/// Categories of errors that callers (and recovery policies) act on.
enum class condition {
  protocol_violation = 1,  ///< the peer sent bytes that break the wire protocol (fatal for
                           ///< that connection only)
  transient,               ///< the link dropped or timed out; retrying may succeed
  fatal,                   ///< retrying will not help (bad config, bad file, server lost)
};

namespace detail {

/// The POSIX error number `code` carries, when its category carries them: std::system_category,
/// std::generic_category, or Asio's "asio.system" — what a real Asio socket operation reports
/// on POSIX. Asio's category does not map its codes to the generic category, so
/// `code == std::errc::too_many_files_open` is false for Asio's EMFILE: compare this instead.
/// `std::nullopt` for any other category. Complexity: O(1). Thread safety: pure.
inline std::optional<std::errc> posix_errc(const std::error_code& code) noexcept {
  const auto& c = code.category();
  if (c == std::system_category() || c == std::generic_category() ||
      std::string_view(c.name()) == "asio.system")
    return static_cast<std::errc>(code.value());
  return std::nullopt;
}

class error_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "asyncps"; }

  std::string message(int ev) const override;
};

class condition_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "asyncps.condition"; }
  std::string message(int ev) const override;
  bool equivalent(const std::error_code& code, int cond) const noexcept override;
};

}  // namespace detail

/// The category of `asyncps::errc`. Thread safety: safe from any thread.
inline const std::error_category& error_category() noexcept {
  static const detail::error_category_impl instance;
  return instance;
}

/// The category of `asyncps::condition`. Thread safety: safe from any thread.
inline const std::error_category& condition_category() noexcept {
  static const detail::condition_category_impl instance;
  return instance;
}

/// Makes a `std::error_code` from an `asyncps::errc` (found by ADL).
inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

/// Makes a `std::error_condition` from an `asyncps::condition` (found by ADL).
inline std::error_condition make_error_condition(condition c) noexcept {
  return {static_cast<int>(c), condition_category()};
}

/// True when `e` is one of the codes a peer's malformed input produces.
constexpr bool is_protocol_violation(errc e) noexcept {
  return (static_cast<int>(e) >= static_cast<int>(errc::bad_magic) &&
          static_cast<int>(e) <= static_cast<int>(errc::too_many_requests)) ||
         e == errc::policy_mismatch || e == errc::bad_key_order ||
         e == errc::authentication_failed || e == errc::bad_clock ||
         e == errc::tls_handshake_failed || e == errc::bad_state || e == errc::bad_position;
}

}  // namespace asyncps

template <>
struct std::is_error_code_enum<asyncps::errc> : std::true_type {};
template <>
struct std::is_error_condition_enum<asyncps::condition> : std::true_type {};

namespace asyncps {

/// True when a failed connect (`tcp_transport::async_connect` or any transport's) will fail
/// the same way on every retry with the same options: the peer refused this node's proof of
/// the shared secret or its certificate, requires a secret or TLS this node lacks, or this
/// node's own secret or TLS files are unusable. A worker gives up at once on these instead of
/// retrying for `connect_timeout`. A hang-up during the handshake (`connection_closed`) and a
/// handshake `timeout` are not final: the listener may have died or been slow.
inline bool is_final_connect_error(const std::error_code& ec) noexcept {
  return ec == errc::authentication_failed || ec == errc::authentication_required ||
         ec == errc::weak_secret || ec == errc::insecure_secret_file ||
         ec == errc::tls_setup_failed || ec == errc::tls_handshake_failed;
}

}  // namespace asyncps

#if !defined(ASYNCPS_SEPARATE_COMPILATION)
#include "asyncps/impl/error.ipp"
#endif
