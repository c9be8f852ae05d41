// asyncps — recovery::replica_log's own messages on the wire: `order` (the apply position a
// server gives a worker's push or clock message), `commit`, `replay` and the state replica, four
// policy message types (wire.hpp, `policy_message`), and what the policy's bit
// (`frame_flags::policy`) means on them and on a hello and a welcome. Typed messages converted to
// and from frames, as the messages of asyncps/protocol.hpp (whose comment on encoders and decoders
// applies here); declared in namespace asyncps::protocol, next to them, so that `encode` and
// `decode` are one overload set.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>
#include <utility>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/codec/message_frame.hpp"
#include "asyncps/detail/endian.hpp"
#include "asyncps/error.hpp"
#include "asyncps/layout.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::protocol {

/// Server -> worker: `protocol::order` (below).
inline constexpr message_type order_type = policy_message(0);
/// Worker -> server, header only: position header `seq` is logged (flag `replica_stored_flag`:
/// the state replica of position `seq` is stored).
inline constexpr message_type commit_type = policy_message(1);
/// Worker -> server, header only: the next message is its logged entry of position `seq` (flag
/// `replay_end_flag`: no entry follows, its replay is complete; `seq` = the newest stable
/// position it knows, `clock` = how many entries it resends next without one).
inline constexpr message_type replay_type = policy_message(2);
/// Server -> worker (a replica to store), and back to a rebuilding server: the whole shard state
/// (detail/codec/shard_state.hpp) as of apply position header `seq`; `clock` = the server clock.
inline constexpr message_type replica_type = policy_message(3);

/// The policy's bit on a hello: the worker holds a replica log for the shard.
inline constexpr std::uint8_t holds_log_flag = frame_flags::policy;
/// The policy's bit on a welcome: the shard restarted without state and rebuilds it from the
/// workers' replicas and logs.
inline constexpr std::uint8_t rebuilding_flag = frame_flags::policy;
/// The policy's bit on a `commit`: of a state replica, not of a log entry.
inline constexpr std::uint8_t replica_stored_flag = frame_flags::policy;
/// The policy's bit on a `replay`: the worker's replay (or rejoin) is complete.
inline constexpr std::uint8_t replay_end_flag = frame_flags::policy;

/// recovery::replica_log: the apply position the server gave a worker's push or clock message
/// (header `seq` = that message's seq, `sender` = the shard), and the newest stable position
/// (every position up to it is in a state replica some worker stores; logs may drop them).
struct order {
  std::uint32_t shard = 0;
  std::uint64_t seq = 0;       ///< the worker's message this orders
  std::uint64_t position = 0;  ///< its apply position (1-based, per shard)
  std::uint64_t stable = 0;    ///< newest stable position
};
inline constexpr std::size_t order_bytes = 16;

template <class Alloc>
message encode(const order& o, Alloc&& alloc) {
  using asyncps::detail::store_le;
  buffer b = alloc(order_bytes);
  store_le(b.data(), o.position);
  store_le(b.data() + 8, o.stable);
  message m = detail_::frame(order_type, o.shard, 0, std::move(b));
  m.header.seq = o.seq;
  return m;
}

/// Errors: `errc::unexpected_message` (wrong type or size, position 0, or a stable position
/// past the position).
inline std::error_code decode(const message& m, order& out, std::string& detail) {
  using asyncps::detail::load_le;
  const auto bytes = m.payload.bytes();
  if (m.header.type != order_type || bytes.size() != order_bytes)
    return detail_::bad(detail, "malformed order");
  out.shard = m.header.sender;
  out.seq = m.header.seq;
  out.position = load_le<std::uint64_t>(bytes.data());
  out.stable = load_le<std::uint64_t>(bytes.data() + 8);
  if (out.position == 0 || out.stable >= out.position)
    return detail_::bad(detail, "order with position " + std::to_string(out.position) +
                                    ", stable position " + std::to_string(out.stable));
  return {};
}

}  // namespace asyncps::protocol
