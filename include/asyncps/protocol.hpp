// asyncps — the protocol vocabulary above the frame format (wire.hpp): typed control messages
// converted to and from frames, and the policy fingerprint both ends must agree on.
//
// Every header field has one meaning (docs/wire-format.md): `sender` the sending node, `table`
// a table id, `clock` a clock, `seq` a position in a sequence (a message's sequence number, or
// the position acknowledged), `row_count`/`width`/`first_row` the rows of a frame. What a
// control message says beyond that travels in its payload, encoded and decoded in namespace
// `asyncps::protocol` only: here, the messages between workers and servers (hello, welcome,
// error, report); in detail/codec/rendezvous_messages.hpp, the rendezvous's (announce, assigned,
// lookup, directory); each recovery policy's own in its folder, under its own message types
// (wire.hpp, `policy_message`) and its meaning of flag `policy` (recovery/chain/messages.hpp,
// recovery/replica_log/messages.hpp, recovery/stateless/messages.hpp), which the policy's parts
// include; this header includes neither the rendezvous's nor any policy's. Push, pull, rows,
// clock, ack, heartbeat and bye are header-only or carry rows (wire.hpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "asyncps/buffer.hpp"
#include "asyncps/consistency.hpp"
#include "asyncps/detail/codec/message_frame.hpp"
#include "asyncps/detail/endian.hpp"
#include "asyncps/error.hpp"
#include "asyncps/layout.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

namespace detail {
/// FNV-1a (32 bit) of `s`, continuing from `h`.
constexpr std::uint32_t fnv1a(std::string_view s, std::uint32_t h = 2166136261u) noexcept {
  for (char c : s) h = (h ^ static_cast<std::uint8_t>(c)) * 16777619u;
  return h;
}
}  // namespace detail

/// The policy fingerprint a worker sends in its hello and a server checks: FNV-1a of
/// "<eager|lazy|vap>/<recovery name>". It covers what both sides must agree on: whether the
/// server pushes rows eagerly (an ESSP worker waits for those pushes; a lazy server never
/// sends them), whether it acknowledges visibility (VAP), and the recovery protocol. The
/// staleness bound is not part of it: it travels in every pull. A mismatch is refused with
/// `errc::policy_mismatch` instead of a silent disagreement about what the messages mean.
/// `Recovery` needs only a `name` (a `std::string_view` constant).
template <class Consistency, class Recovery>
constexpr std::uint32_t policy_fingerprint() noexcept {
  return detail::fnv1a(Recovery::name, detail::fnv1a(is_value_bounded_v<Consistency> ? "vap/"
                                                     : Consistency::eager            ? "eager/"
                                                                                     : "lazy/"));
}

namespace protocol {

/// One table of a layout as the handshake carries it (rows x width floats).
struct layout_entry {
  std::uint32_t rows = 0;
  std::uint32_t width = 0;
  friend bool operator==(const layout_entry&, const layout_entry&) = default;
};

/// The highest clock a peer may name in a `hello` (2^32 - 1: over 136 years at one clock per
/// second). A server refuses a hello with a larger or negative clock (`errc::bad_clock`),
/// and a worker's push or clock message at this clock (its clock cannot move on), so
/// `clock + 1` and `clock + staleness` never overflow. docs/wire-format.md, "Clocks in hello".
inline constexpr clock_value max_clock = (clock_value{1} << 32) - 1;

/// The highest sequence number, optimizer step or replica-log apply position a shard state or
/// a peer's frame may carry (2^62): a worker numbers one message per push or clock, a server
/// one position per update and one step per push, so a real run stays far below it (2^62
/// messages at 10^9 per second take 146 years), and counters that start from a value at or
/// below it never wrap. A restored state above it is refused (`errc::bad_state`), a replay,
/// commit or replica position above it too (`errc::bad_position`).
inline constexpr std::uint64_t max_seq = std::uint64_t{1} << 62;

/// How far a hello's clock may lead the connected workers beyond the staleness bound
/// (clocks): a worker rejoins at the clock of its oldest unacknowledged push (strict chain
/// replication), so a connected worker's clock at the server may lag its true clock by as
/// many clocks as it has unacknowledged pushes. See `max_clock`.
inline constexpr clock_value rejoin_slack = 1024;

/// worker -> server, the first message of a connection. Payload: fingerprint u32, table
/// count u32, incarnation u64, then (rows u32, width u32) per table.
struct hello {
  std::uint32_t worker = 0;       ///< the worker's id (header `sender`)
  clock_value clock = 0;          ///< 0 at first start; a rejoining worker's clock
  std::uint32_t fingerprint = 0;  ///< `policy_fingerprint<Consistency, Recovery>()`
  /// Names this worker process (one random value per worker object,
  /// `worker_options::incarnation`): a server that sees the worker's id with another
  /// incarnation knows the worker restarted.
  std::uint64_t incarnation = 0;
  std::vector<layout_entry> layout{};
};

/// One table of a welcome: its shape and how many of the receiving worker's pushes to this
/// shard's part of it the server has applied.
struct welcome_table {
  std::uint32_t rows = 0;
  std::uint32_t width = 0;
  std::uint64_t applied = 0;
};

/// server -> worker, the reply to an accepted hello. Payload: num_shards u32, table count
/// u32, the worker's clock at the server i64, per table (rows u32, width u32, applied u64),
/// then the server optimizer's `local_step()` f32 and 4 zero bytes.
struct welcome {
  std::uint32_t shard = 0;       ///< header `sender`
  std::uint32_t num_shards = 0;  ///< shards sharing the tables
  clock_value server_clock = 0;  ///< header `clock`
  /// Header `seq`: the highest sequence number of the worker's messages this shard applied
  /// (0: none). A worker numbers its next messages to this shard above it, so a restarted
  /// worker's messages never look like the ones its earlier incarnation sent.
  std::uint64_t last_seq = 0;
  clock_value worker_clock = 0;  ///< the worker's clock as this server records it
  bool policy_bit = false;       ///< flag `policy`: the recovery policy's (its messages.hpp)
  std::vector<welcome_table> tables{};
  float local_step = 0;  ///< the worker's read-my-writes step (0: off)
};

/// Either way: the sender closes the connection because of `reason`. Payload: code u32 (an
/// `asyncps::errc` value; `policy_error_base` + c for the recovery policy's own code c; 0 when
/// there is none), then the UTF-8 reason.
struct error {
  std::uint32_t sender = 0;
  std::optional<errc> code{};  ///< decode: unset for 0, a policy code or a value no errc has
  /// The recovery policy's own code (1 to `max_policy_error`; 0: none), which only the policy
  /// can name (`recovery_policy`, `R::error_enum`). Encode: takes precedence over `code`.
  std::uint32_t policy_code = 0;
  std::string_view reason{};  ///< a view of the message's payload (decode) or the caller's text
};

/// server -> worker with a waiting pull: what holds the server clock back. Payload: slowest
/// worker u32, connected u32 (0/1), the slowest worker's clock i64.
struct report {
  std::uint32_t shard = 0;       ///< header `sender`
  clock_value server_clock = 0;  ///< header `clock`
  std::uint32_t slowest = 0;     ///< the worker with the smallest clock
  clock_value slowest_clock = 0;
  bool slowest_connected = false;
};

/// Payload bytes of a hello / welcome for `tables` tables.
constexpr std::uint64_t hello_bytes(std::uint64_t tables) noexcept { return 16 + tables * 8; }
constexpr std::uint64_t welcome_bytes(std::uint64_t tables) noexcept {
  return 16 + tables * 16 + 8;
}
inline constexpr std::uint64_t report_bytes = 16;

/// Encoders: `alloc(bytes)` returns a pooled `buffer` of that size (e.g. a transport's
/// `allocate`). Decoders: fill `out` from `m` (whose header `validate_header` accepted) or
/// return `errc::unexpected_message` with `detail` naming what is wrong; `out` is then
/// unspecified. Thread safety: pure.
template <class Alloc>
message encode(const hello& h, Alloc&& alloc) {
  buffer b = alloc(hello_bytes(h.layout.size()));
  std::byte* p = b.data();
  asyncps::detail::store_le(p, h.fingerprint);
  asyncps::detail::store_le(p + 4, static_cast<std::uint32_t>(h.layout.size()));
  asyncps::detail::store_le(p + 8, h.incarnation);
  p += 8;
  for (const auto& e : h.layout) {
    p += 8;
    asyncps::detail::store_le(p, e.rows);
    asyncps::detail::store_le(p + 4, e.width);
  }
  return detail_::frame(message_type::hello, h.worker, h.clock, std::move(b));
}

inline std::error_code decode(const message& m, hello& out, std::string& detail) {
  using asyncps::detail::load_le;
  const auto bytes = m.payload.bytes();
  if (m.header.type != message_type::hello) return detail_::bad(detail, "expected a hello");
  if (bytes.size() < 16) return detail_::bad(detail, "hello payload shorter than 16 bytes");
  const auto n = load_le<std::uint32_t>(bytes.data() + 4);
  if (bytes.size() != hello_bytes(n))
    return detail_::bad(detail, "hello of " + std::to_string(n) + " tables has " +
                                    std::to_string(bytes.size()) + " payload bytes");
  out.worker = m.header.sender;
  out.clock = m.header.clock;
  out.fingerprint = load_le<std::uint32_t>(bytes.data());
  out.incarnation = load_le<std::uint64_t>(bytes.data() + 8);
  out.layout.resize(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    out.layout[i].rows = load_le<std::uint32_t>(bytes.data() + 16 + i * 8);
    out.layout[i].width = load_le<std::uint32_t>(bytes.data() + 20 + i * 8);
  }
  return {};
}

template <class Alloc>
message encode(const welcome& w, Alloc&& alloc) {
  using asyncps::detail::store_le;
  buffer b = alloc(welcome_bytes(w.tables.size()));
  std::byte* p = b.data();
  store_le(p, w.num_shards);
  store_le(p + 4, static_cast<std::uint32_t>(w.tables.size()));
  store_le(p + 8, static_cast<std::int64_t>(w.worker_clock));
  p += 16;
  for (const auto& t : w.tables) {
    store_le(p, t.rows);
    store_le(p + 4, t.width);
    store_le(p + 8, t.applied);
    p += 16;
  }
  std::memcpy(p, &w.local_step, sizeof(float));  // little-endian IEEE-754 (wire.hpp)
  std::memset(p + 4, 0, 4);
  message m = detail_::frame(message_type::welcome, w.shard, w.server_clock, std::move(b));
  m.header.flags = w.policy_bit ? frame_flags::policy : std::uint8_t{0};
  m.header.seq = w.last_seq;
  return m;
}

inline std::error_code decode(const message& m, welcome& out, std::string& detail) {
  using asyncps::detail::load_le;
  const auto bytes = m.payload.bytes();
  if (m.header.type != message_type::welcome) return detail_::bad(detail, "expected a welcome");
  if (bytes.size() < 16) return detail_::bad(detail, "welcome payload shorter than 16 bytes");
  const auto n = load_le<std::uint32_t>(bytes.data() + 4);
  if (bytes.size() != welcome_bytes(n))
    return detail_::bad(detail, "welcome of " + std::to_string(n) + " tables has " +
                                    std::to_string(bytes.size()) + " payload bytes");
  out.shard = m.header.sender;
  out.server_clock = m.header.clock;
  out.last_seq = m.header.seq;
  out.policy_bit = m.header.has(frame_flags::policy);
  out.num_shards = load_le<std::uint32_t>(bytes.data());
  out.worker_clock = load_le<std::int64_t>(bytes.data() + 8);
  out.tables.resize(n);
  const std::byte* p = bytes.data() + 16;
  for (auto& t : out.tables) {
    t.rows = load_le<std::uint32_t>(p);
    t.width = load_le<std::uint32_t>(p + 4);
    t.applied = load_le<std::uint64_t>(p + 8);
    p += 16;
  }
  std::memcpy(&out.local_step, p, sizeof(float));
  return {};
}

template <class Alloc>
message encode(const error& e, Alloc&& alloc) {
  buffer b = alloc(4 + e.reason.size());
  const std::uint32_t code = e.policy_code != 0 ? policy_error_base + e.policy_code
                             : e.code           ? static_cast<std::uint32_t>(*e.code)
                                                : 0u;
  asyncps::detail::store_le(b.data(), code);
  if (!e.reason.empty()) std::memcpy(b.data() + 4, e.reason.data(), e.reason.size());
  return detail_::frame(message_type::error, e.sender, 0, std::move(b));
}

/// `out.reason` views `m`'s payload: valid while `m` is.
inline std::error_code decode(const message& m, error& out, std::string& detail) {
  const auto bytes = m.payload.bytes();
  if (m.header.type != message_type::error) return detail_::bad(detail, "expected an error");
  if (bytes.size() < 4) return detail_::bad(detail, "error payload shorter than 4 bytes");
  out.sender = m.header.sender;
  const auto code = asyncps::detail::load_le<std::uint32_t>(bytes.data());
  const bool policy = code > policy_error_base && code - policy_error_base <= max_policy_error;
  out.policy_code = policy ? code - policy_error_base : 0;
  out.code = policy ? std::nullopt : errc_from_wire(code);
  out.reason = std::string_view(reinterpret_cast<const char*>(bytes.data() + 4), bytes.size() - 4);
  return {};
}

template <class Alloc>
message encode(const report& r, Alloc&& alloc) {
  using asyncps::detail::store_le;
  buffer b = alloc(report_bytes);
  store_le(b.data(), r.slowest);
  store_le(b.data() + 4, std::uint32_t{r.slowest_connected ? 1u : 0u});
  store_le(b.data() + 8, static_cast<std::int64_t>(r.slowest_clock));
  return detail_::frame(message_type::report, r.shard, r.server_clock, std::move(b));
}

inline std::error_code decode(const message& m, report& out, std::string& detail) {
  using asyncps::detail::load_le;
  const auto bytes = m.payload.bytes();
  if (m.header.type != message_type::report || bytes.size() != report_bytes)
    return detail_::bad(detail, "malformed report");
  const auto connected = load_le<std::uint32_t>(bytes.data() + 4);
  out.shard = m.header.sender;
  out.server_clock = m.header.clock;
  out.slowest = load_le<std::uint32_t>(bytes.data());
  out.slowest_clock = load_le<std::int64_t>(bytes.data() + 8);
  out.slowest_connected = connected == 1;
  if (connected > 1 || out.server_clock < 0 || out.slowest_clock < 0)
    return detail_::bad(detail, "report with connected " + std::to_string(connected) +
                                    ", server clock " + std::to_string(out.server_clock) +
                                    ", slowest clock " + std::to_string(out.slowest_clock));
  return {};
}

// --- readers (asyncps/reader.hpp) ----------------------------------------------------------

/// Header `sender` (and `hello::worker`) of a *reader*'s hello: a read-only session that
/// takes no part in the clocks (an evaluator or a monitor reading the servers' model). Its
/// hello carries the layout (checked) and any fingerprint (not checked); it may then only pull
/// (answered at once with the rows as of the server clock, never deferred), send heartbeats,
/// bye or error. A push or clock message from it is refused with `errc::unexpected_message`.
inline constexpr std::uint32_t reader_id = 0xfffffffdu;

}  // namespace protocol
}  // namespace asyncps
