// asyncps fuzzing — what the libFuzzer targets in tests/fuzz/ share: a buffer pool, a check
// that aborts (so libFuzzer records the input as a crash), and the cutting of an input into
// wire frames the way a receiving transport does.
//
// The frame stream format (targets `frame` and `sparse_keys`, and the corpus generator):
// each frame is its 64 encoded header bytes followed by `payload_bytes` payload bytes, as on a
// TCP connection. A header whose `checksum` field is 0 is taken unchecked (as the in-process
// and simulated transports take frames: they carry no checksum); any other value must be the
// frame's XXH3 checksum, as `tcp_transport` checks it. Seeds use 0 so that mutations of a
// payload are not all stopped by the checksum.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <system_error>

#include "asyncps/buffer.hpp"
#include "asyncps/options.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::fuzz {

/// The pool every target allocates payloads from (lives for the whole process).
inline buffer_pool& pool() {
  static buffer_pool p;
  return p;
}

/// A payload buffer of `n` bytes from `pool()`.
inline buffer allocate(std::size_t n) { return pool().allocate(n); }

/// An invariant of the target: prints `what` with its location and aborts when `ok` is false
/// (libFuzzer then saves the input as a crash).
/// (`std::source_location` needs clang 15 with libstdc++; the builtins work in clang 14.)
inline void require(bool ok, const char* what, const char* file = __builtin_FILE(),
                    int line = __builtin_LINE()) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant violated at %s:%d: %s\n", file, line, what);
  std::abort();
}

/// Reads the bytes of a fuzz input front to back.
class byte_reader {
 public:
  explicit byte_reader(std::span<const std::byte> in) noexcept : in_(in) {}
  /// Bytes not read yet.
  std::size_t left() const noexcept { return in_.size(); }
  /// The next byte, or 0 when none is left.
  std::uint8_t u8() noexcept {
    if (in_.empty()) return 0;
    const auto v = static_cast<std::uint8_t>(in_[0]);
    in_ = in_.subspan(1);
    return v;
  }
  /// The next `n` bytes (fewer when fewer are left).
  std::span<const std::byte> take(std::size_t n) noexcept {
    n = std::min(n, in_.size());
    auto out = in_.first(n);
    in_ = in_.subspan(n);
    return out;
  }

 private:
  std::span<const std::byte> in_;
};

/// The outcome of reading one frame from a stream.
struct frame_read {
  std::error_code ec;      ///< a `validate_header` error or `errc::bad_checksum`: the connection
                           ///< is poisoned, as a transport reports it
  bool truncated = false;  ///< the input ended inside the frame (a connection lost mid-frame)
};

/// Reads the next frame of `in` into `m` as a transport does: decode and validate the header
/// against `lim`, read `payload_bytes` into a fresh pooled buffer, verify the checksum (of the
/// header only with `frame_flags::payload_unchecked`) unless the header's checksum is 0 (see
/// the file comment).
inline frame_read read_frame(byte_reader& in, const wire_limits& lim, message& m) {
  const auto head = in.take(header_size);
  if (head.size() != header_size) return {{}, true};
  const std::span<const std::byte, header_size> encoded(head.data(), header_size);
  m.header = decode_header(encoded);
  if (auto ec = validate_header(m.header, lim)) return {ec, false};
  const auto body = in.take(static_cast<std::size_t>(m.header.payload_bytes));
  if (body.size() != m.header.payload_bytes) return {{}, true};
  m.payload = allocate(body.size());
  if (!body.empty()) std::memcpy(m.payload.data(), body.data(), body.size());
  const bool header_only = m.header.has(frame_flags::payload_unchecked);
  if (m.header.checksum != 0 &&
      frame_checksum(encoded, header_only ? std::span<const std::byte>{} : m.payload.bytes()) !=
          m.header.checksum)
    return {make_error_code(errc::bad_checksum), false};
  return {};
}

/// Encodes `m` (header and payload, checksum 0 unless `with_checksum`) at the end of `out`:
/// what `read_frame` reads back. Used by the corpus generator and round-trip checks.
template <class ByteVector>
void append_frame(ByteVector& out, message& m, bool with_checksum = false) {
  m.header.payload_bytes = m.payload.size();
  std::array<std::byte, header_size> head{};
  if (!with_checksum) m.header.checksum = 0;
  encode_header(m.header, head, m.payload.bytes(), with_checksum);
  out.insert(out.end(), head.begin(), head.end());
  out.insert(out.end(), m.payload.bytes().begin(), m.payload.bytes().end());
}

}  // namespace asyncps::fuzz
