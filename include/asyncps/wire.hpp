// asyncps — the wire format: a fixed 64-byte little-endian header followed by a payload that,
// for push and rows messages, is the float32 array itself.
//
//   offset size field          meaning (one per field; docs/wire-format.md has every message)
//   0      4    magic          "APS1" (0x31535041)
//   4      2    version        wire_version
//   6      1    type           message_type
//   7      1    flags          frame_flags bits
//   8      4    sender         the sending node: worker id, or shard id (servers)
//   12     4    table          table id (push, pull, rows; 0 otherwise)
//   16     8    clock          a clock: the sender's (hello, push, clock), the minimum server
//                               clock wanted (pull), the server clock (welcome, rows, report),
//                               the clock a policy's push's rows date from
//   24     8    seq            a position in a sequence: a message's sequence number (push,
//                               clock, pull), or the position acknowledged (ack: a push's seq
//                               or a policy's log position; rows: the receiver's pushes to
//                               this table applied)
//   32     4    row_count      rows in this frame
//   36     4    width          floats per row
//   40     8    first_row      first row when flags has `range` (else 0)
//   48     8    payload_bytes  bytes that follow the header
//   56     8    checksum       XXH3-64 of header bytes [0,56) (seeding) and the payload (the
//                               header only when flags has `payload_unchecked`)
//
// Payloads: push/rows = [keys: row_count x u32, padded to 16 bytes, only without `range`]
// followed by row_count x width float32 (little-endian IEEE-754); a prefixed push has 16 bytes of
// the recovery policy's before the floats; pull = keys (sparse) or nothing (range); hello,
// welcome, error, report, announce, assigned, directory = the typed messages of protocol.hpp and
// detail/codec/rendezvous_messages.hpp; clock, heartbeat, bye, lookup = nothing; ack = nothing,
// or with flag `policy` the recovery policy's bytes (since version 7: recovery::replica_log's
// apply-first order). Types 128-255 are the recovery policy's own messages (`policy_message`),
// encoded by its folder.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <system_error>

// xxHash is used header-only. With g++ 12 at -Og, xxHash 0.8.1 stops with "inlining failed in
// call to 'always_inline'": compile with -DXXH_NO_INLINE_HINTS=1 there (docs/build_time.md).
#define XXH_INLINE_ALL
#include <xxhash.h>
#undef XXH_INLINE_ALL

#include "asyncps/buffer.hpp"
#include "asyncps/detail/endian.hpp"
#include "asyncps/error.hpp"
#include "asyncps/options.hpp"

namespace asyncps {

static_assert(std::endian::native == std::endian::little,
              "asyncps: the wire format and float payloads are little-endian; big-endian hosts "
              "are not supported");

inline constexpr std::uint32_t wire_magic = 0x31535041;  // bytes 'A' 'P' 'S' '1'
inline constexpr std::uint16_t wire_version = 8;
inline constexpr std::size_t header_size = 64;

/// Message types (header field `type`). The payloads of hello, welcome, error and report are
/// encoded by protocol.hpp. Types from `policy_message_base` on are the recovery policy's.
enum class message_type : std::uint8_t {
  hello = 1,  ///< worker -> server: handshake (`protocol::hello`)
  welcome,    ///< server -> worker: handshake reply (`protocol::welcome`)
  push,       ///< worker -> server: gradient rows of clock `clock`
  pull,       ///< worker -> server: request rows; first_row/keys say which; clock = min
              ///< server clock the rows must reflect
  rows,       ///< server -> worker: row values as of server clock `clock`
  clock,      ///< worker -> server: sender finished clock `clock` (now at `clock + 1`)
  ack,        ///< server -> worker (or server -> server, for a policy): positions up to `seq`
              ///< are applied
  heartbeat,  ///< either way: liveness
  bye,        ///< either way: orderly close
  error,      ///< either way: the peer is closing, and why (`protocol::error`)
  report,     ///< server -> worker with a pull waiting for the server clock: what holds it back
              ///< (`protocol::report`)
  // --- rendezvous (asyncps/rendezvous.hpp): only a rendezvous and its clients send these ---
  announce,   ///< server -> rendezvous: the shard it serves (header `sender`,
              ///< `protocol::any_id`: assign one) and where it listens (`protocol::announce`)
  assigned,   ///< rendezvous -> server: the reply to an announce (`protocol::assigned`)
  lookup,     ///< client -> rendezvous: asks for the directory; header `sender` = the worker id
              ///< it wants (`protocol::any_id`: assign one; `protocol::no_worker_id`: none)
  directory,  ///< rendezvous -> client: every shard's address, in shard order
              ///< (`protocol::directory`)
};
inline constexpr std::uint8_t max_message_type = static_cast<std::uint8_t>(message_type::directory);

/// The first of the message types that belong to the recovery policy (128-255). A policy numbers
/// its own messages from here (`policy_message`) in its folder (recovery/<policy>/messages.hpp);
/// the frame layer bounds them like any frame (`wire_limits::max_frame_bytes`), always checksums
/// their payload, and leaves their shape to the policy's decoder. Both ends run the same policy
/// (the hello's fingerprint), so two policies may use the same numbers.
inline constexpr std::uint8_t policy_message_base = 128;

/// The message type of a recovery policy's message `kind` (0-127): `policy_message_base + kind`.
/// Evaluated at compile time; a `kind` above 127 does not compile (no type of its own is left).
consteval message_type policy_message(unsigned kind) {
  if (kind > 127) throw "asyncps: policy_message(kind): a recovery policy's kinds lie in [0, 127]";
  return static_cast<message_type>(policy_message_base + kind);
}

/// Whether `t` is a recovery policy's own message type (`policy_message`).
constexpr bool is_policy_message(message_type t) noexcept {
  return static_cast<std::uint8_t>(t) >= policy_message_base;
}

/// Rendezvous limits (docs/wire-format.md, "Rendezvous"): an announced host is at most 255
/// bytes, and a directory lists at most 4096 shards.
inline constexpr std::size_t max_host_bytes = 255;
inline constexpr std::uint32_t max_directory_servers = 4096;
/// Payload bytes of an `announce` with no host and of a `directory` with no shards; of an
/// `assigned`; and the most a `directory` may have (each entry: port u16, host length u8,
/// host).
inline constexpr std::uint64_t announce_min_bytes = 4;
inline constexpr std::uint64_t assigned_bytes = 12;
inline constexpr std::uint64_t directory_min_bytes = 12;
inline constexpr std::uint64_t directory_max_bytes =
    directory_min_bytes + std::uint64_t{max_directory_servers} * (3 + max_host_bytes);

/// Bytes before the floats of a prefixed push (flag `prefixed`), 16 so the floats stay 16-byte
/// aligned. What they hold is the recovery policy's (recovery/stateless/messages.hpp: a backlog
/// push's number of clocks, u64, then 8 zero bytes).
inline constexpr std::uint64_t push_prefix_bytes = 16;

/// Bits of header field `flags`.
struct frame_flags {
  static constexpr std::uint8_t range = 1;         ///< rows are [first_row, first_row + row_count)
  static constexpr std::uint8_t end_of_clock = 2;  ///< push: the sender's last push of its clock
  static constexpr std::uint8_t want_ack = 4;      ///< push: reply with an ack
  /// rows: pushed by the server unrequested (ESSP, VAP): the reader's subscribed rows that
  /// changed since the rows last sent to it in this table (any number, even none); every other
  /// subscribed row is unchanged as of the message's `clock`.
  static constexpr std::uint8_t eager = 8;
  /// The recovery policy's bit: what it means on a hello, welcome, push or ack is the policy's
  /// (recovery/<policy>/messages.hpp names it, e.g. recovery::stateless's replica push). A
  /// push with it (or with `prefixed`) is the policy's: the server gives it to the policy's
  /// part, and refuses it under a policy that takes none.
  static constexpr std::uint8_t policy = 16;
  /// push: the payload has `push_prefix_bytes` bytes of the recovery policy's before the floats
  /// (after the keys); a policy's push, as with `policy`.
  static constexpr std::uint8_t prefixed = 32;
  /// any type: `checksum` covers the header only, not the payload (the sender's transport
  /// leaves payloads to TCP's and the link's own checks, or to TLS's integrity:
  /// `tcp_options::checksum_payloads` false). Set and read by the TCP transport.
  static constexpr std::uint8_t payload_unchecked = 64;
  static constexpr std::uint8_t all = 127;
};

/// A decoded frame header (host representation).
struct frame_header {
  message_type type = message_type::heartbeat;
  std::uint8_t flags = 0;
  std::uint32_t sender = 0;
  std::uint32_t table = 0;
  std::int64_t clock = 0;
  std::uint64_t seq = 0;
  std::uint32_t row_count = 0;
  std::uint32_t width = 0;
  std::uint64_t first_row = 0;
  std::uint64_t payload_bytes = 0;
  std::uint64_t checksum = 0;
  std::uint16_t version = wire_version;
  std::uint32_t magic = wire_magic;

  constexpr bool has(std::uint8_t f) const noexcept { return (flags & f) != 0; }
  /// True when this message ends its sender's clock `clock`: a `clock` message, or a push
  /// flagged `end_of_clock` (the worker folds its clock into its last push).
  constexpr bool ends_clock() const noexcept {
    return type == message_type::clock || has(frame_flags::end_of_clock);
  }
};

/// One framed message: header + payload (a pooled buffer; zero-copy).
struct message {
  frame_header header;
  buffer payload;
};

/// Bytes taken by `row_count` u32 keys, padded to 16 bytes (0 for range frames).
constexpr std::uint64_t key_bytes(std::uint32_t row_count) noexcept {
  return (std::uint64_t{row_count} * 4 + 15) / 16 * 16;
}

/// The payload size a header implies for fixed-shape messages, or -1 when it is variable
/// (hello/welcome/error/announce/directory and the policy's messages, bounded by
/// `validate_header`; a policy message's decoder checks its exact shape). Used to reject
/// `payload_bytes` that disagree with the shape.
constexpr std::int64_t expected_payload_bytes(const frame_header& h) noexcept {
  const std::uint64_t keys = h.has(frame_flags::range) ? 0 : key_bytes(h.row_count);
  const std::uint64_t floats = std::uint64_t{h.row_count} * h.width * 4;
  switch (h.type) {
    case message_type::push:
      return static_cast<std::int64_t>(keys + floats +
                                       (h.has(frame_flags::prefixed) ? push_prefix_bytes : 0));
    case message_type::rows: return static_cast<std::int64_t>(keys + floats);
    case message_type::pull: return static_cast<std::int64_t>(keys);
    case message_type::report: return 16;
    case message_type::assigned: return static_cast<std::int64_t>(assigned_bytes);
    case message_type::announce:
    case message_type::directory:
    case message_type::hello:
    case message_type::welcome:
    case message_type::error: return -1;
    // An ack is header-only, unless flagged `policy`: the recovery policy's bytes (version 7).
    case message_type::ack: return h.has(frame_flags::policy) ? -1 : 0;
    default: return is_policy_message(h.type) ? -1 : 0;
  }
}

/// Checksum of a header's first 56 encoded bytes and a payload (XXH3-64).
inline std::uint64_t frame_checksum(std::span<const std::byte, header_size> encoded,
                                    std::span<const std::byte> payload) noexcept {
  const XXH64_hash_t seed = XXH3_64bits(encoded.data(), 56);
  return XXH3_64bits_withSeed(payload.data(), payload.size(), seed);
}

/// Encodes `h` into `out`. When `payload` is given the checksum is computed over it and
/// written into both `out` and `h.checksum`; otherwise `h.checksum` is written as is.
inline void encode_header(frame_header& h, std::span<std::byte, header_size> out,
                          std::span<const std::byte> payload, bool compute_checksum) noexcept {
  using detail::store_le;
  std::byte* p = out.data();
  store_le(p + 0, h.magic);
  store_le(p + 4, h.version);
  store_le(p + 6, static_cast<std::uint8_t>(h.type));
  store_le(p + 7, h.flags);
  store_le(p + 8, h.sender);
  store_le(p + 12, h.table);
  store_le(p + 16, h.clock);
  store_le(p + 24, h.seq);
  store_le(p + 32, h.row_count);
  store_le(p + 36, h.width);
  store_le(p + 40, h.first_row);
  store_le(p + 48, h.payload_bytes);
  if (compute_checksum) h.checksum = frame_checksum(out, payload);
  store_le(p + 56, h.checksum);
}

/// Decodes the 64 header bytes without validating them (see `validate_header`).
inline frame_header decode_header(std::span<const std::byte, header_size> in) noexcept {
  using detail::load_le;
  const std::byte* p = in.data();
  frame_header h;
  h.magic = load_le<std::uint32_t>(p + 0);
  h.version = load_le<std::uint16_t>(p + 4);
  h.type = static_cast<message_type>(load_le<std::uint8_t>(p + 6));
  h.flags = load_le<std::uint8_t>(p + 7);
  h.sender = load_le<std::uint32_t>(p + 8);
  h.table = load_le<std::uint32_t>(p + 12);
  h.clock = load_le<std::int64_t>(p + 16);
  h.seq = load_le<std::uint64_t>(p + 24);
  h.row_count = load_le<std::uint32_t>(p + 32);
  h.width = load_le<std::uint32_t>(p + 36);
  h.first_row = load_le<std::uint64_t>(p + 40);
  h.payload_bytes = load_le<std::uint64_t>(p + 48);
  h.checksum = load_le<std::uint64_t>(p + 56);
  return h;
}

/// Whether frame `h` carries the recovery policy's bytes, which are always checksummed whole
/// (never `payload_unchecked`: they may replace a shard's parameters or order its updates): a
/// policy's message (`is_policy_message`), or an ack flagged `policy` (version 7).
constexpr bool carries_policy_bytes(const frame_header& h) noexcept {
  return is_policy_message(h.type) ||
         (h.type == message_type::ack && (h.flags & frame_flags::policy) != 0);
}

/// Validates every header field that can be checked without knowing the receiver's tables:
/// magic, version, type (a generic type or a policy's, `policy_message`), flags
/// (`payload_unchecked` never on a policy's message or an ack flagged `policy`), limits, and that
/// `payload_bytes` matches the shape. An `announce` or `directory` larger than its bound
/// (`max_host_bytes`, `max_directory_servers`) is `frame_too_large`, so a receiver reads at most
/// that much of it.
/// Errors: `errc::bad_magic`, `unsupported_version`, `bad_message_type`, `bad_flags`,
/// `frame_too_large`, `too_many_rows`, `bad_width`, `payload_size_mismatch`.
/// Complexity: O(1). Thread safety: pure.
inline std::error_code validate_header(const frame_header& h, const wire_limits& lim) noexcept {
  if (h.magic != wire_magic) return errc::bad_magic;
  if (h.version != wire_version) return errc::unsupported_version;
  const auto t = static_cast<std::uint8_t>(h.type);
  if (t == 0 || (t > max_message_type && t < policy_message_base)) return errc::bad_message_type;
  if ((h.flags & ~frame_flags::all) != 0) return errc::bad_flags;
  // A policy's message may replace a shard's parameters (a state transfer): its payload is
  // always checksummed.
  if (carries_policy_bytes(h) && h.has(frame_flags::payload_unchecked)) return errc::bad_flags;
  if (h.payload_bytes > lim.max_frame_bytes) return errc::frame_too_large;
  if (h.row_count > lim.max_rows) return errc::too_many_rows;
  // A handshake's layout: at most max_tables tables (8 bytes each in a hello, 16 in a welcome).
  if ((h.type == message_type::hello && h.payload_bytes > 16 + std::uint64_t{lim.max_tables} * 8) ||
      (h.type == message_type::welcome &&
       h.payload_bytes > 24 + std::uint64_t{lim.max_tables} * 16))
    return errc::too_many_rows;
  // A rendezvous message's layout: an announce's host is at most max_host_bytes, a directory
  // lists at most max_directory_servers shards.
  if ((h.type == message_type::announce && h.payload_bytes > announce_min_bytes + max_host_bytes) ||
      (h.type == message_type::directory && h.payload_bytes > directory_max_bytes))
    return errc::frame_too_large;
  if ((h.type == message_type::announce && h.payload_bytes < announce_min_bytes) ||
      (h.type == message_type::directory && h.payload_bytes < directory_min_bytes))
    return errc::payload_size_mismatch;
  if (h.width > lim.max_width) return errc::bad_width;
  const std::int64_t expected = expected_payload_bytes(h);
  if (expected >= 0 && static_cast<std::uint64_t>(expected) != h.payload_bytes)
    return errc::payload_size_mismatch;
  return {};
}

/// The float rows of a push/rows message's payload (after the keys, if any).
/// (Prefixed pushes: after their prefix.)
inline std::span<const float> payload_floats(const message& m) noexcept {
  const std::uint64_t off =
      (m.header.has(frame_flags::range) ? 0 : key_bytes(m.header.row_count)) +
      (m.header.type == message_type::push && m.header.has(frame_flags::prefixed)
           ? push_prefix_bytes
           : 0);
  const auto bytes = m.payload.bytes().subspan(off);
  return {reinterpret_cast<const float*>(bytes.data()), bytes.size() / sizeof(float)};
}

/// The u32 row keys of a sparse push/rows/pull payload (empty for range frames).
inline std::span<const std::uint32_t> payload_keys(const message& m) noexcept {
  if (m.header.has(frame_flags::range)) return {};
  return {reinterpret_cast<const std::uint32_t*>(m.payload.data()), m.header.row_count};
}

}  // namespace asyncps
