// asyncps — recovery::chain_replication's own messages on the wire: `chain_hello` (a member to
// the chain master, or to its successor), `chain_config` (the master to a member: its place in
// the chain) and the state transfer (a member to its successor), three policy message types
// (wire.hpp, `policy_message`), and what the policy's bit (`frame_flags::policy`) means on them
// and on a successor's ack. Typed messages converted to and from frames, as the messages of
// asyncps/protocol.hpp (whose comment on encoders and decoders applies here); declared in
// namespace asyncps::protocol, next to them, so that `encode` and `decode` are one overload set.
#pragma once

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

/// The chain's message types (wire.hpp, `policy_message`).
inline constexpr message_type chain_hello_type = policy_message(0);
inline constexpr message_type chain_config_type = policy_message(1);
/// Member -> successor: the whole shard state (detail/codec/shard_state.hpp) as of log position
/// header `seq`; header `clock` = the server clock.
inline constexpr message_type chain_state_type = policy_message(2);

/// The policy's bit on a `chain_config`: the member joins a running chain and waits for a state
/// transfer (`chain_config::joining`).
inline constexpr std::uint8_t chain_joining_flag = frame_flags::policy;
/// The policy's bit on the `ack` a successor answers a `chain_hello` with: it needs a state
/// transfer (its header `seq` is its log position).
inline constexpr std::uint8_t chain_needs_state_flag = frame_flags::policy;

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
  /// `chain_joining_flag`: joins a running chain, waits for a state transfer.
  bool joining = false;
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
  return detail_::frame(chain_hello_type, c.shard, 0, std::move(b));
}

inline std::error_code decode(const message& m, chain_hello& out, std::string& detail) {
  using asyncps::detail::load_le;
  const auto bytes = m.payload.bytes();
  if (m.header.type != chain_hello_type || bytes.size() != chain_hello_bytes)
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
  message m = detail_::frame(chain_config_type, c.shard, 0, std::move(b));
  m.header.flags = c.joining ? chain_joining_flag : std::uint8_t{0};
  return m;
}

inline std::error_code decode(const message& m, chain_config& out, std::string& detail) {
  using asyncps::detail::load_le;
  const auto bytes = m.payload.bytes();
  if (m.header.type != chain_config_type || bytes.size() != chain_config_bytes)
    return detail_::bad(detail, "malformed chain_config");
  out.shard = m.header.sender;
  out.member = load_le<std::uint32_t>(bytes.data());
  out.predecessor = load_le<std::uint32_t>(bytes.data() + 4);
  out.successor = load_le<std::uint32_t>(bytes.data() + 8);
  out.epoch = load_le<std::int64_t>(bytes.data() + 16);
  out.joining = m.header.has(chain_joining_flag);
  return {};
}

}  // namespace asyncps::protocol
