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
#include <span>
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

/// Server -> worker: `protocol::order` (below): the apply positions of a batch of the worker's
/// push and clock messages.
inline constexpr message_type order_type = policy_message(0);
/// Worker -> server, header only: every position up to header `seq` that an `order` gave this
/// worker is logged (cumulative; flag `replica_stored_flag`: the state replica of position `seq`
/// is stored).
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

/// The policy's bit on an `order`: its messages are applied already (`replica_log_ordering::
/// apply_first`), so the worker logs the positions and sends no `commit`.
inline constexpr std::uint8_t applied_flag = frame_flags::policy;
/// The policy's bit on an ack (wire version 7): the ack carries an applied `order` (apply-first:
/// the positions of the clock it acknowledges ride on its ack, one message instead of two).
/// Header `seq` is the acknowledged seq as on any ack; the payload is an order's (stable
/// position, then the entries), their number given by its size.
inline constexpr std::uint8_t carries_order_flag = frame_flags::policy;
/// The policy's bit on a push or clock message (apply-first with `replica_log_options::
/// ack_delay`): the worker does not wait for this clock's ack, so the shard may hold it back
/// (up to `ack_delay`, or until the worker asks for one without this bit) and send the
/// positions of several clocks on one ack.
inline constexpr std::uint8_t ack_later_flag = frame_flags::policy;

/// One entry of an `order`: the apply position (1-based, per shard) the server gave the worker's
/// push or clock message numbered `seq` (header `seq` of that message).
struct order_entry {
  std::uint64_t seq = 0;
  std::uint64_t position = 0;
};
/// Bytes of one `order_entry` on the wire (seq and position, u64 each).
inline constexpr std::size_t order_entry_bytes = 16;
inline constexpr std::size_t order_fixed_bytes = 8;  ///< the stable position before the entries

/// recovery::replica_log: the apply positions the server gave some of one worker's push and
/// clock messages, oldest first (seqs and positions both increasing), batched: one `order` per
/// worker clock (or per `max_order_entries` messages), not one per message. Also the newest
/// stable position (every position up to it is in a state replica some worker stores; logs may
/// drop them). Flag `applied_flag`: the messages are applied (apply-first; no commit wanted).
/// Payload: `stable` (8 bytes) then, per entry, `seq` and `position` (8 bytes each), little-
/// endian; header `sender` = the shard, header `seq` = the number of entries.
struct order {
  std::uint32_t shard = 0;
  std::uint64_t stable = 0;  ///< newest stable position
  bool applied = false;      ///< `applied_flag`
  /// Encode: the entries to send. Decode: empty; read them with `size()` and `entry(i)`.
  std::span<const order_entry> entries{};
  /// Decode: the entries' bytes in the received payload (valid while the message is).
  std::span<const std::byte> raw{};

  /// Decoded entries.
  std::size_t size() const noexcept { return raw.size() / order_entry_bytes; }
  /// Decoded entry `i` (< size()).
  order_entry entry(std::size_t i) const noexcept {
    using asyncps::detail::load_le;
    const std::byte* p = raw.data() + i * order_entry_bytes;
    return {load_le<std::uint64_t>(p), load_le<std::uint64_t>(p + 8)};
  }
};
/// The most state replicas of one shard a worker holds, and sends a rebuild. Apply-first: those
/// of the positions at or above the stable position it last learned (usually one or two; more
/// while its orders are held back, `replica_log_options::ack_delay`); write-ahead: the newest.
/// A worker that is sent more drops the oldest; a rebuild refuses more from one worker.
inline constexpr std::size_t max_held_replicas = 8;
/// The most entries one `order` carries (4 KiB of them); a server sends more as several.
inline constexpr std::size_t max_order_entries = 256;

/// Encodes order `o` as an `order_type` message (`carries_order_flag`'s form:
/// `encode_on_ack`).
template <class Alloc>
message encode(const order& o, Alloc&& alloc) {
  using asyncps::detail::store_le;
  buffer b = alloc(order_fixed_bytes + o.entries.size() * order_entry_bytes);
  store_le(b.data(), o.stable);
  std::byte* p = b.data() + order_fixed_bytes;
  for (const order_entry& e : o.entries) {
    store_le(p, e.seq);
    store_le(p + 8, e.position);
    p += order_entry_bytes;
  }
  message m = detail_::frame(order_type, o.shard, 0, std::move(b));
  m.header.seq = o.entries.size();
  if (o.applied) m.header.flags |= applied_flag;
  return m;
}

/// Encodes applied order `o` (`o.applied` must be true) as the ack of seq `ack_seq`, flag
/// `carries_order_flag`: apply-first's one message per worker clock and shard.
template <class Alloc>
message encode_on_ack(const order& o, std::uint64_t ack_seq, Alloc&& alloc) {
  message m = encode(o, alloc);
  m.header.type = message_type::ack;
  m.header.seq = ack_seq;
  m.header.flags = carries_order_flag;
  return m;
}

/// Decodes an `order_type` message, or an ack with `carries_order_flag` (then `applied` is
/// true). Errors: `errc::unexpected_message` (another type, or an ack without the flag; a
/// size that is not 8 + 16 n bytes with 1 <= n <= `max_order_entries`, or, on an
/// `order_type`, a header `seq` other than n; a position 0 or not above the entry's before
/// it; a seq not above the one before it; on an unapplied order, a position at or below the
/// stable position). An applied order's positions may lie at or below its stable position:
/// updates applied before a replica that is stored by the time the order is sent.
inline std::error_code decode(const message& m, order& out, std::string& detail) {
  using asyncps::detail::load_le;
  const auto bytes = m.payload.bytes();
  const bool on_ack = m.header.type == message_type::ack && m.header.has(carries_order_flag);
  const std::size_t n = bytes.size() >= order_fixed_bytes
                            ? (bytes.size() - order_fixed_bytes) / order_entry_bytes
                            : 0;
  if ((m.header.type != order_type && !on_ack) ||
      bytes.size() < order_fixed_bytes + order_entry_bytes ||
      (bytes.size() - order_fixed_bytes) % order_entry_bytes != 0 || n > max_order_entries ||
      (!on_ack && m.header.seq != n)) {
    std::string why = on_ack ? "malformed order on an ack" : "malformed order";
    why += " (" + std::to_string(bytes.size()) + " payload bytes";
    if (!on_ack) why += ", " + std::to_string(m.header.seq) + " entries announced";
    return detail_::bad(detail, why + ")");
  }
  out.shard = m.header.sender;
  out.stable = load_le<std::uint64_t>(bytes.data());
  out.applied = on_ack || m.header.has(applied_flag);
  out.entries = {};
  out.raw = bytes.subspan(order_fixed_bytes);
  order_entry prev{};
  for (std::size_t i = 0; i < out.size(); ++i) {
    const order_entry e = out.entry(i);
    if (e.position == 0 || (!out.applied && e.position <= out.stable) ||
        e.position <= prev.position || (i > 0 && e.seq <= prev.seq))
      return detail_::bad(detail, "order entry " + std::to_string(i) + " with seq " +
                                      std::to_string(e.seq) + ", position " +
                                      std::to_string(e.position) + " (stable position " +
                                      std::to_string(out.stable) + ", previous entry's seq " +
                                      std::to_string(prev.seq) + ", position " +
                                      std::to_string(prev.position) + ")");
    prev = e;
  }
  return {};
}

}  // namespace asyncps::protocol
