// asyncps — the recovery policies' control messages on the wire: chain replication's
// chain_hello and chain_config, the replica log's order, and the prefix of a stateless
// backlog push. Typed messages converted to and from frames, as the messages of
// asyncps/protocol.hpp (whose comment on encoders and decoders applies here).
//
// Declared in namespace asyncps::protocol; include asyncps/protocol.hpp, which includes this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/codec/message_frame.hpp"
#include "asyncps/detail/endian.hpp"
#include "asyncps/error.hpp"
#include "asyncps/layout.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::protocol {

/// Chain member -> chain master (register) or -> its successor (link up). Payload: member
/// u32, fingerprint u32, epoch i64.
struct chain_hello {
  std::uint32_t shard = 0;   ///< header `sender`
  std::uint32_t member = 0;  ///< the sender's index in its shard's chain
  std::uint32_t fingerprint = 0;
  std::int64_t epoch = 0;  ///< the configuration the sender last had
};

/// chain master -> member: its place in the chain. Payload: member u32, predecessor u32,
/// successor u32 (`chain_config::none`: head / tail), 4 zero bytes, epoch i64.
struct chain_config {
  static constexpr std::uint32_t none = 0xffffffffu;
  std::uint32_t shard = 0;  ///< header `sender`
  std::uint32_t member = 0;
  std::uint32_t predecessor = none;
  std::uint32_t successor = none;
  std::int64_t epoch = 0;
  bool joining = false;  ///< flag `state`: joins a running chain, waits for a state transfer
};

inline constexpr std::uint64_t chain_hello_bytes = 16;
inline constexpr std::uint64_t chain_config_bytes = 24;

template <class Alloc>
message encode(const chain_hello& c, Alloc&& alloc) {
  using asyncps::detail::store_le;
  buffer b = alloc(chain_hello_bytes);
  store_le(b.data(), c.member);
  store_le(b.data() + 4, c.fingerprint);
  store_le(b.data() + 8, c.epoch);
  return detail_::frame(message_type::chain_hello, c.shard, 0, std::move(b));
}

inline std::error_code decode(const message& m, chain_hello& out, std::string& detail) {
  using asyncps::detail::load_le;
  const auto bytes = m.payload.bytes();
  if (m.header.type != message_type::chain_hello || bytes.size() != chain_hello_bytes)
    return detail_::bad(detail, "malformed chain_hello");
  out.shard = m.header.sender;
  out.member = load_le<std::uint32_t>(bytes.data());
  out.fingerprint = load_le<std::uint32_t>(bytes.data() + 4);
  out.epoch = load_le<std::int64_t>(bytes.data() + 8);
  return {};
}

template <class Alloc>
message encode(const chain_config& c, Alloc&& alloc) {
  using asyncps::detail::store_le;
  buffer b = alloc(chain_config_bytes);
  store_le(b.data(), c.member);
  store_le(b.data() + 4, c.predecessor);
  store_le(b.data() + 8, c.successor);
  store_le(b.data() + 12, std::uint32_t{0});
  store_le(b.data() + 16, c.epoch);
  message m = detail_::frame(message_type::chain_config, c.shard, 0, std::move(b));
  m.header.flags = c.joining ? frame_flags::state : std::uint8_t{0};
  return m;
}

inline std::error_code decode(const message& m, chain_config& out, std::string& detail) {
  using asyncps::detail::load_le;
  const auto bytes = m.payload.bytes();
  if (m.header.type != message_type::chain_config || bytes.size() != chain_config_bytes)
    return detail_::bad(detail, "malformed chain_config");
  out.shard = m.header.sender;
  out.member = load_le<std::uint32_t>(bytes.data());
  out.predecessor = load_le<std::uint32_t>(bytes.data() + 4);
  out.successor = load_le<std::uint32_t>(bytes.data() + 8);
  out.epoch = load_le<std::int64_t>(bytes.data() + 16);
  out.joining = m.header.has(frame_flags::state);
  return {};
}

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

}  // namespace asyncps::protocol
