// asyncps — recovery::replica_log's own message on the wire: `order`, the apply position a
// server gives a worker's push or clock message. Typed messages converted to and from frames, as
// the messages of asyncps/protocol.hpp (whose comment on encoders and decoders applies here);
// declared in namespace asyncps::protocol, next to them, so that `encode` and `decode` are one
// overload set.
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
  message m = detail_::frame(message_type::order, o.shard, 0, std::move(b));
  m.header.seq = o.seq;
  return m;
}

/// Errors: `errc::unexpected_message` (wrong type or size, position 0, or a stable position
/// past the position).
inline std::error_code decode(const message& m, order& out, std::string& detail) {
  using asyncps::detail::load_le;
  const auto bytes = m.payload.bytes();
  if (m.header.type != message_type::order || bytes.size() != order_bytes)
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
