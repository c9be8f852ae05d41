// asyncps — recovery::stateless's own bits and bytes on the wire: its two pushes, the replica
// (flag `policy`) and the backlog (flag `prefixed`), the welcome that asks for replicas (flag
// `policy`), and the prefix of a backlog push, the number of clocks the backlog sums. The frame
// layer knows only the flags' bits and the prefix's size (`push_prefix_bytes`, wire.hpp); what
// they mean is this policy's. Declared in namespace asyncps::protocol, next to the other codecs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/endian.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::protocol {

/// A replica push: the payload is a worker's cached row *values* of the shard's whole range of a
/// table, to be installed by a server that restarted without state.
inline constexpr std::uint8_t replica_push_flag = frame_flags::policy;
/// A backlog push: deltas a worker accumulated while the server was unreachable, starting from
/// rows of server clock header `clock`; the prefix holds the number of clocks it sums.
inline constexpr std::uint8_t backlog_push_flag = frame_flags::prefixed;
/// The policy's bit on a welcome: this server has no state and asks for replicas.
inline constexpr std::uint8_t wants_replicas_flag = frame_flags::policy;

/// The number of clocks a backlog push (`backlog_push_flag`) sums: its payload prefix.
/// Precondition: `m` is a push with `backlog_push_flag` that `validate_header` accepted.
inline std::uint64_t backlog_clocks(const message& m) noexcept {
  return asyncps::detail::load_le<std::uint64_t>(m.payload.data());
}

/// Writes the prefix of a backlog push summing `clocks` clocks into `payload` (at least
/// `push_prefix_bytes` long); the floats follow it.
inline void set_backlog_clocks(buffer& payload, std::uint64_t clocks) noexcept {
  asyncps::detail::store_le(payload.data(), clocks);
  asyncps::detail::store_le(payload.data() + 8, std::uint64_t{0});
}

/// The prefix of a backlog push summing `clocks` clocks, as bytes (what `set_backlog_clocks`
/// writes; for `rejoin_context::send_rows`).
inline std::array<std::byte, push_prefix_bytes> backlog_prefix(std::uint64_t clocks) noexcept {
  std::array<std::byte, push_prefix_bytes> p{};
  asyncps::detail::store_le(p.data(), clocks);
  return p;
}

}  // namespace asyncps::protocol
