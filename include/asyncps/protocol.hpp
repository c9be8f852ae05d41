// asyncps — the protocol vocabulary above the frame format (wire.hpp): typed control messages
// converted to and from frames, and the policy fingerprint both ends must agree on.
//
// Every header field has one meaning (docs/wire-format.md): `sender` the sending node, `table`
// a table id, `clock` a clock, `seq` a position in a sequence (a message's sequence number, or
// the position acknowledged), `row_count`/`width`/`first_row` the rows of a frame. What a
// control message says beyond that travels in its payload, encoded and decoded here only:
// hello, welcome, error, report, chain_hello, chain_config, order, and the rendezvous messages
// announce, assigned, lookup, directory. Push, pull, rows, clock, ack, heartbeat, bye, commit,
// replay and state are header-only or carry rows/state (wire.hpp, shard_state codec).
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
  bool wants_state = false;      ///< flag `state`: a server without state asks for replicas
  std::vector<welcome_table> tables{};
  float local_step = 0;  ///< the worker's read-my-writes step (0: off)
};

/// Either way: the sender closes the connection because of `reason`. Payload: code u32 (an
/// `asyncps::errc` value, 0 when the reason is none), then the UTF-8 reason.
struct error {
  std::uint32_t sender = 0;
  std::optional<errc> code{};
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

/// Payload bytes of a hello / welcome for `tables` tables.
constexpr std::uint64_t hello_bytes(std::uint64_t tables) noexcept { return 16 + tables * 8; }
constexpr std::uint64_t welcome_bytes(std::uint64_t tables) noexcept {
  return 16 + tables * 16 + 8;
}
inline constexpr std::uint64_t report_bytes = 16;
inline constexpr std::uint64_t chain_hello_bytes = 16;
inline constexpr std::uint64_t chain_config_bytes = 24;

namespace detail_ {
inline message frame(message_type t, std::uint32_t sender, clock_value clock, buffer payload) {
  message m;
  m.header.type = t;
  m.header.sender = sender;
  m.header.clock = clock;
  m.payload = std::move(payload);
  return m;
}
inline std::error_code bad(std::string& detail, std::string what) {
  detail = " (" + std::move(what) + ")";
  return errc::unexpected_message;
}
}  // namespace detail_

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
  m.header.flags = w.wants_state ? frame_flags::state : std::uint8_t{0};
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
  out.wants_state = m.header.has(frame_flags::state);
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
  asyncps::detail::store_le(b.data(), e.code ? static_cast<std::uint32_t>(*e.code) : 0u);
  if (!e.reason.empty()) std::memcpy(b.data() + 4, e.reason.data(), e.reason.size());
  return detail_::frame(message_type::error, e.sender, 0, std::move(b));
}

/// `out.reason` views `m`'s payload: valid while `m` is.
inline std::error_code decode(const message& m, error& out, std::string& detail) {
  const auto bytes = m.payload.bytes();
  if (m.header.type != message_type::error) return detail_::bad(detail, "expected an error");
  if (bytes.size() < 4) return detail_::bad(detail, "error payload shorter than 4 bytes");
  out.sender = m.header.sender;
  out.code = errc_from_wire(asyncps::detail::load_le<std::uint32_t>(bytes.data()));
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

// --- rendezvous (asyncps/rendezvous.hpp) ---------------------------------------------------

/// Header `sender` of an `announce` (a `lookup`): the rendezvous assigns the shard (the worker
/// id).
inline constexpr std::uint32_t any_id = 0xffffffffu;
/// Header `sender` of a `lookup`, and `directory::worker`: the client takes no worker id (a
/// server or a tool that only wants the addresses).
inline constexpr std::uint32_t no_worker_id = 0xfffffffeu;

// --- readers (asyncps/reader.hpp) ----------------------------------------------------------

/// Header `sender` (and `hello::worker`) of a *reader*'s hello: a read-only session that
/// takes no part in the clocks (an evaluator or a monitor reading the servers' model). Its
/// hello carries the layout (checked) and any fingerprint (not checked); it may then only pull
/// (answered at once with the rows as of the server clock, never deferred), send heartbeats,
/// bye or error. A push or clock message from it is refused with `errc::unexpected_message`.
inline constexpr std::uint32_t reader_id = 0xfffffffdu;

/// Whether `host` may be announced and listed: 1 to `max_host_bytes` bytes, each a letter, a
/// digit or one of `-._:%` (host names, IPv4 and IPv6 literals, an IPv6 zone after `%`; no
/// brackets, no spaces, nothing a log line or a resolver could misread). Thread safety: pure.
constexpr bool valid_host(std::string_view host) noexcept {
  if (host.empty() || host.size() > max_host_bytes) return false;
  for (char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '.' || c == '_' || c == ':' || c == '%';
    if (!ok) return false;
  }
  return true;
}

/// server -> rendezvous: "I serve shard `shard`, listening on `port` of `host`". Payload: port
/// u16, host length u16 (0: no host), host bytes. Decoding refuses port 0 and a host that is
/// not `valid_host`. Precondition of `encode`: `host` is empty or `valid_host`.
struct announce {
  std::uint32_t shard = any_id;  ///< header `sender`; `any_id`: the lowest free shard
  std::uint16_t port = 0;        ///< the port the server listens on (its real one, not 0)
  /// Where others reach it; empty: the address the rendezvous sees the connection come from.
  std::string host{};
};

/// rendezvous -> server, the reply to an announce. Payload: shard u32, num_servers u32,
/// num_workers u32 (0: unknown). Decoding refuses num_servers 0 or shard >= num_servers.
struct assigned {
  std::uint32_t shard = 0;        ///< the shard the server serves
  std::uint32_t num_servers = 0;  ///< shards of the job
  std::uint32_t num_workers = 0;  ///< workers of the job (0: the rendezvous was not told)
};

/// client -> rendezvous: send the directory once every shard is announced. No payload.
struct lookup {
  /// Header `sender`: the worker id the client claims, `any_id` (assign the lowest free one,
  /// in arrival order) or `no_worker_id` (take none).
  std::uint32_t worker = any_id;
};

/// One shard's address in a `directory`.
struct server_address {
  std::string host{};  ///< `valid_host`; an IPv6 literal without brackets
  std::uint16_t port = 0;
  friend bool operator==(const server_address&, const server_address&) = default;
};

/// rendezvous -> client, the reply to a lookup. Payload: worker u32, num_workers u32, shard
/// count N u32, then N entries in shard order: port u16, host length u8, host bytes (no
/// padding). Decoding checks N against `max_directory_servers` and every length against the
/// bytes left before it allocates, refuses N 0, port 0, a host that is not `valid_host`, a
/// worker id >= a known num_workers, and trailing bytes. Precondition of `encode`: at most
/// `max_directory_servers` entries, each host `valid_host`.
struct directory {
  std::uint32_t worker = no_worker_id;  ///< the id the client was given (or `no_worker_id`)
  std::uint32_t num_workers = 0;        ///< 0: unknown
  std::vector<server_address> servers{};
};

template <class Alloc>
message encode(const announce& a, Alloc&& alloc) {
  using asyncps::detail::store_le;
  buffer b = alloc(announce_min_bytes + a.host.size());
  store_le(b.data(), a.port);
  store_le(b.data() + 2, static_cast<std::uint16_t>(a.host.size()));
  if (!a.host.empty()) std::memcpy(b.data() + 4, a.host.data(), a.host.size());
  return detail_::frame(message_type::announce, a.shard, 0, std::move(b));
}

inline std::error_code decode(const message& m, announce& out, std::string& detail) {
  using asyncps::detail::load_le;
  const auto bytes = m.payload.bytes();
  if (m.header.type != message_type::announce) return detail_::bad(detail, "expected an announce");
  if (bytes.size() < announce_min_bytes)
    return detail_::bad(detail, "announce payload shorter than 4 bytes");
  const auto port = load_le<std::uint16_t>(bytes.data());
  const auto n = load_le<std::uint16_t>(bytes.data() + 2);
  if (n > max_host_bytes || bytes.size() != announce_min_bytes + n)
    return detail_::bad(detail, "announce of a " + std::to_string(n) + "-byte host has " +
                                    std::to_string(bytes.size()) + " payload bytes (hosts are " +
                                    "at most " + std::to_string(max_host_bytes) + " bytes)");
  if (port == 0) return detail_::bad(detail, "announce of port 0");
  const std::string_view host(reinterpret_cast<const char*>(bytes.data() + 4), n);
  if (n != 0 && !valid_host(host))
    return detail_::bad(detail, "announced host is not a host name or address");
  out.shard = m.header.sender;
  out.port = port;
  out.host.assign(host);
  return {};
}

template <class Alloc>
message encode(const assigned& a, Alloc&& alloc) {
  using asyncps::detail::store_le;
  buffer b = alloc(assigned_bytes);
  store_le(b.data(), a.shard);
  store_le(b.data() + 4, a.num_servers);
  store_le(b.data() + 8, a.num_workers);
  return detail_::frame(message_type::assigned, 0, 0, std::move(b));
}

inline std::error_code decode(const message& m, assigned& out, std::string& detail) {
  using asyncps::detail::load_le;
  const auto bytes = m.payload.bytes();
  if (m.header.type != message_type::assigned || bytes.size() != assigned_bytes)
    return detail_::bad(detail, "malformed assigned");
  out.shard = load_le<std::uint32_t>(bytes.data());
  out.num_servers = load_le<std::uint32_t>(bytes.data() + 4);
  out.num_workers = load_le<std::uint32_t>(bytes.data() + 8);
  if (out.num_servers == 0 || out.shard >= out.num_servers)
    return detail_::bad(detail, "assigned shard " + std::to_string(out.shard) + " of " +
                                    std::to_string(out.num_servers) + " shards");
  return {};
}

template <class Alloc>
message encode(const lookup& l, Alloc&& /*alloc: no payload*/) {
  return detail_::frame(message_type::lookup, l.worker, 0, buffer{});
}

inline std::error_code decode(const message& m, lookup& out, std::string& detail) {
  if (m.header.type != message_type::lookup || m.payload.size() != 0)
    return detail_::bad(detail, "malformed lookup");
  out.worker = m.header.sender;
  return {};
}

template <class Alloc>
message encode(const directory& d, Alloc&& alloc) {
  using asyncps::detail::store_le;
  std::size_t n = directory_min_bytes;
  for (const auto& s : d.servers) n += 3 + s.host.size();
  buffer b = alloc(n);
  std::byte* p = b.data();
  store_le(p, d.worker);
  store_le(p + 4, d.num_workers);
  store_le(p + 8, static_cast<std::uint32_t>(d.servers.size()));
  p += directory_min_bytes;
  for (const auto& s : d.servers) {
    store_le(p, s.port);
    store_le(p + 2, static_cast<std::uint8_t>(s.host.size()));
    std::memcpy(p + 3, s.host.data(), s.host.size());
    p += 3 + s.host.size();
  }
  return detail_::frame(message_type::directory, 0, 0, std::move(b));
}

inline std::error_code decode(const message& m, directory& out, std::string& detail) {
  using asyncps::detail::load_le;
  const auto bytes = m.payload.bytes();
  if (m.header.type != message_type::directory) return detail_::bad(detail, "expected a directory");
  if (bytes.size() < directory_min_bytes)
    return detail_::bad(detail, "directory payload shorter than 12 bytes");
  out.worker = load_le<std::uint32_t>(bytes.data());
  out.num_workers = load_le<std::uint32_t>(bytes.data() + 4);
  const auto n = load_le<std::uint32_t>(bytes.data() + 8);
  if (n == 0 || n > max_directory_servers)
    return detail_::bad(detail, "directory of " + std::to_string(n) + " shards (1 to " +
                                    std::to_string(max_directory_servers) + ")");
  // Every entry takes at least 4 bytes (a host has at least one): check before reserving.
  std::size_t at = directory_min_bytes;
  if ((bytes.size() - at) / 4 < n)
    return detail_::bad(detail, "directory of " + std::to_string(n) + " shards has " +
                                    std::to_string(bytes.size()) + " payload bytes");
  if (out.worker != no_worker_id && out.num_workers != 0 && out.worker >= out.num_workers)
    return detail_::bad(detail, "directory gives worker id " + std::to_string(out.worker) + " of " +
                                    std::to_string(out.num_workers) + " workers");
  out.servers.clear();
  out.servers.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    if (bytes.size() - at < 3)
      return detail_::bad(detail, "directory entry " + std::to_string(i) + " is cut short");
    const auto port = load_le<std::uint16_t>(bytes.data() + at);
    const auto len = load_le<std::uint8_t>(bytes.data() + at + 2);
    at += 3;
    if (bytes.size() - at < len)
      return detail_::bad(detail, "directory entry " + std::to_string(i) + " host of " +
                                      std::to_string(len) + " bytes exceeds the bytes left");
    const std::string_view host(reinterpret_cast<const char*>(bytes.data() + at), len);
    at += len;
    if (port == 0 || !valid_host(host))
      return detail_::bad(detail, "directory entry " + std::to_string(i) +
                                      " is not a host name or address with a port");
    out.servers.push_back(server_address{std::string(host), port});
  }
  if (at != bytes.size())
    return detail_::bad(detail,
                        "directory has " + std::to_string(bytes.size() - at) + " trailing bytes");
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

}  // namespace protocol
}  // namespace asyncps
