// asyncps — recovery::stateless's own bytes on the wire: the prefix of a backlog push (flag
// `backlog`), the number of clocks the backlog sums. The frame layer knows only the prefix's size
// (`backlog_prefix_bytes`, wire.hpp); what it holds is this policy's. Declared in namespace
// asyncps::protocol, next to the other codecs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/endian.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::protocol {

/// The number of clocks a backlog push (flag `backlog`) sums: its payload prefix.
/// Precondition: `m` is a push with flag `backlog` that `validate_header` accepted.
inline std::uint64_t backlog_clocks(const message& m) noexcept {
  return asyncps::detail::load_le<std::uint64_t>(m.payload.data());
}

/// Writes the prefix of a backlog push summing `clocks` clocks into `payload` (at least
/// `backlog_prefix_bytes` long); the floats follow it.
inline void set_backlog_clocks(buffer& payload, std::uint64_t clocks) noexcept {
  asyncps::detail::store_le(payload.data(), clocks);
  asyncps::detail::store_le(payload.data() + 8, std::uint64_t{0});
}

/// The prefix of a backlog push summing `clocks` clocks, as bytes (what `set_backlog_clocks`
/// writes; for `rejoin_context::send_rows`).
inline std::array<std::byte, backlog_prefix_bytes> backlog_prefix(std::uint64_t clocks) noexcept {
  std::array<std::byte, backlog_prefix_bytes> p{};
  asyncps::detail::store_le(p.data(), clocks);
  return p;
}

}  // namespace asyncps::protocol
