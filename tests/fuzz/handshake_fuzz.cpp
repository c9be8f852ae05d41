// libFuzzer target `handshake`: the typed control messages of protocol.hpp and the replica
// log's worker part. Input: frames as fuzz_support.hpp reads them; each frame that a transport
// would accept is given to every decoder (hello, welcome, error, report, chain_hello,
// chain_config, order, and the rendezvous's announce, assigned, lookup, directory), then to one
// `recovery::replica_log_worker_part` (2 shards, `max_unacked` 4, apply-first; shard = header
// `sender` mod 2) as the event its type names: push and clock are the worker's own messages
// (`on_push`, when their seq exceeds the shard's last), ack `on_ack`, welcome `on_welcome`
// (flag `policy`: the shard rebuilds), hello asks `hello_flags`/`hello_clock`, replay runs
// `on_rejoin`, and every other type (order, state, commit, ...) is a server message
// (`on_server_message`). Each frame also reaches a chain master's membership protocol
// (`detail::chain_master_core`, 2 shards of 2 members) from one of 4 connections (header
// `first_row` mod 4; header `clock` mod 2048 ms of time pass first; `bye`, a refusal or a frame to
// a connection the core closed ends it), and its watchdog ticks.
//
// Invariants (abort on violation): a decoder accepts only its own message type; what it
// accepts re-encodes to the same payload bytes and the same header fields (type, sender where
// the message carries one, clock where it carries one, flags); decoded values respect the
// documented ranges (an order: 1 to max_order_entries entries, as many as header seq says,
// seqs and positions increasing, positions above the stable one unless the order is applied);
// refusals say what is wrong.
// The replica-log worker part agrees with a model of its documented behaviour: it takes
// exactly the orders `decode` accepts (each entry's position goes to the logged, unapplied push
// or clock message of that seq, if any; an order that logged a position is confirmed by one
// cumulative commit naming the last position logged, unless it has `applied_flag`, then by
// none) and every state replica (committing it with flag `policy`), refuses other server
// messages as unexpected, frees entries only when applied and covered by a stable position,
// keeps every state replica at or above its stable position (at most max_held_replicas),
// replays a rebuilding shard's replicas and ordered entries, and its counters (entries, bytes,
// replicas, order entries, replayed) and flow control match the model after every event. The chain
// master's chains list distinct member ids in range, each held by one open registered connection
// whose last configuration names the chain's neighbours at the current epoch, and every
// configuration it counts is queued to a connection.
//
// Not here: commit and replay carry no payload (header `seq` only); the server part's range
// check of their positions needs a server context (tests/unit/insider_test.cpp).
#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "asyncps/detail/codec/rendezvous_messages.hpp"
#include "asyncps/detail/worker/hooks.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery/chain/master_core.hpp"
#include "asyncps/recovery/chain/messages.hpp"
#include "asyncps/recovery/replica_log/worker_part.hpp"
#include "asyncps/wire.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace asyncps;
using fuzz::require;

bool same_payload(const message& a, const message& b) {
  return a.payload.size() == b.payload.size() &&
         (a.payload.empty() ||
          std::memcmp(a.payload.data(), b.payload.data(), a.payload.size()) == 0);
}

// Decodes `m` as a `T`; when that succeeds, re-encodes it and compares.
template <class T>
void round_trip(const message& m, message_type type, bool carries_clock, bool carries_state,
                bool carries_sender = true) {
  T out{};
  std::string detail;
  if (protocol::decode(m, out, detail)) {
    require(!detail.empty(), "a refusal names what is wrong");
    return;
  }
  require(m.header.type == type, "a decoder accepts only its own message type");
  // A decoded order holds its entries as the received bytes (`raw`); encode reads `entries`.
  std::vector<protocol::order_entry> order_entries;
  if constexpr (std::is_same_v<T, protocol::order>) {
    require(out.entries.empty(), "a decoded order leaves `entries` empty");
    for (std::size_t i = 0; i < out.size(); ++i) order_entries.push_back(out.entry(i));
    out.entries = order_entries;
  }
  message back = protocol::encode(out, fuzz::allocate);
  require(back.header.type == type, "the encoder writes the type");
  if (carries_sender) require(back.header.sender == m.header.sender, "sender round-trips");
  if (carries_clock) require(back.header.clock == m.header.clock, "clock round-trips");
  if (carries_state)
    require(back.header.has(frame_flags::policy) == m.header.has(frame_flags::policy),
            "flag policy round-trips");
  if constexpr (std::is_same_v<T, protocol::order>) {
    require(back.header.seq == m.header.seq, "an order's entry count round-trips");
    require(out.size() >= 1 && out.size() <= protocol::max_order_entries &&
                out.size() == m.header.seq,
            "an order holds 1 to max_order_entries entries, as many as header seq says");
    require(m.payload.size() ==
                protocol::order_fixed_bytes + out.size() * protocol::order_entry_bytes,
            "an order's payload is the stable position and its entries");
    require(out.shard == m.header.sender, "an order's shard is its sender");
    require(out.applied == m.header.has(protocol::applied_flag), "an order's applied flag");
    for (std::size_t i = 0; i < out.size(); ++i) {
      const protocol::order_entry e = out.entry(i);
      require(e.position != 0 && (out.applied || out.stable < e.position),
              "order positions are non-zero, and above stable unless applied");
      if (i > 0)
        require(out.entry(i - 1).position < e.position && out.entry(i - 1).seq < e.seq,
                "order entries increase in seq and position");
    }
  }
  if constexpr (std::is_same_v<T, protocol::report>) {
    require(out.server_clock >= 0 && out.slowest_clock >= 0, "report clocks are not negative");
  }
  if constexpr (std::is_same_v<T, protocol::announce>) {
    require(out.port != 0 && out.host.size() <= max_host_bytes, "announce port and host bounds");
    require(out.host.empty() || protocol::valid_host(out.host), "an announced host is valid");
  }
  if constexpr (std::is_same_v<T, protocol::assigned>) {
    require(out.shard < out.num_servers, "an assigned shard is one of the shards");
  }
  if constexpr (std::is_same_v<T, protocol::directory>) {
    require(!out.servers.empty() && out.servers.size() <= max_directory_servers,
            "a directory lists 1 to max_directory_servers shards");
    for (const auto& s : out.servers)
      require(s.port != 0 && protocol::valid_host(s.host), "directory entries are addresses");
  }
  if constexpr (std::is_same_v<T, protocol::hello>) {
    require(out.layout.size() <= m.payload.size() / 8, "a hello's layout fits its payload");
  }
  if constexpr (std::is_same_v<T, protocol::error>) {
    // An unknown code decodes as none and re-encodes as 0: compare the rest. A policy's
    // code (policy_error_base + 1 to 255) decodes as that code, never as an errc.
    const auto code = asyncps::detail::load_le<std::uint32_t>(m.payload.data());
    const bool policy = code > policy_error_base && code - policy_error_base <= max_policy_error;
    require(out.code.has_value() == (!policy && errc_from_wire(code).has_value()),
            "error code mapping");
    require(out.policy_code == (policy ? code - policy_error_base : 0u), "policy code mapping");
    require(!(out.code && out.policy_code != 0), "an error names an errc or a policy code");
    require(back.payload.size() == m.payload.size(), "error payload size round-trips");
    require(std::memcmp(back.payload.data() + 4, m.payload.data() + 4, m.payload.size() - 4) == 0,
            "error reason round-trips");
    if (out.code || out.policy_code != 0)
      require(same_payload(back, m), "error payload round-trips");
    return;
  }
  if constexpr (std::is_same_v<T, protocol::chain_config>) {
    // The 4 padding bytes are written as zeros, whatever they were.
    require(back.payload.size() == m.payload.size(), "chain_config payload size round-trips");
    require(std::memcmp(back.payload.data(), m.payload.data(), 12) == 0 &&
                std::memcmp(back.payload.data() + 16, m.payload.data() + 16, 8) == 0,
            "chain_config payload round-trips");
    return;
  }
  if constexpr (std::is_same_v<T, protocol::welcome>) {
    // The 4 bytes after local_step are written as zeros, whatever they were.
    require(back.payload.size() == m.payload.size(), "welcome payload size round-trips");
    require(std::memcmp(back.payload.data(), m.payload.data(), m.payload.size() - 4) == 0,
            "welcome payload round-trips");
    return;
  }
  require(same_payload(back, m), "the payload round-trips");
}

// ---- the replica log's worker part against a model ----

constexpr std::uint32_t log_shards = 2;
constexpr std::uint32_t log_max_unacked = 4;

struct model_entry {
  frame_header header;
  std::size_t bytes = 0;
  std::uint64_t position = 0;  // 0: not ordered
};

struct model_shard {
  std::vector<model_entry> log;  // oldest first
  std::size_t unapplied = 0;
  std::uint64_t stable = 0;
  struct held {
    frame_header header;
    std::size_t bytes = 0;
  };
  std::vector<held> replicas;  // oldest first: those at or above `stable`, at most 8
  bool met = false;
  bool rebuilding = false;
  std::uint64_t last_seq = 0;  // of the worker's own pushes and clock messages
};

struct log_model {
  recovery::replica_log_worker_part part;
  model_shard shards[log_shards];
  recovery::replica_log_worker_stats stats{};

  log_model() {
    part.options.max_unacked = log_max_unacked;
    part.options.ordering = recovery::replica_log_ordering::apply_first;  // replicas kept
    part.on_start(worker_setup{.shards = log_shards, .tables = 1});
  }

  // Frees applied entries from the front: the first applied one with a position, when it is
  // at or below the stable position, together with the applied entries before it that have
  // none (applied before it was ordered, so the stable replica holds them); again and again.
  void truncate(model_shard& sh) {
    for (;;) {
      auto first =
          std::find_if(sh.log.begin(), sh.log.begin() + static_cast<std::ptrdiff_t>(sh.unapplied),
                       [](const auto& e) { return e.position != 0; });
      if (first == sh.log.begin() + static_cast<std::ptrdiff_t>(sh.unapplied) ||
          first->position > sh.stable)
        return;
      for (auto i = sh.log.begin(); i <= first; ++i) {
        stats.log_bytes -= i->bytes;
        --stats.log_entries;
      }
      sh.unapplied -= static_cast<std::size_t>(first - sh.log.begin()) + 1;
      sh.log.erase(sh.log.begin(), first + 1);
    }
  }

  // Drops the replicas of positions below `stable`.
  void drop_replicas_below(model_shard& sh, std::uint64_t stable) {
    std::erase_if(sh.replicas, [&](const model_shard::held& r) {
      if (r.header.seq >= stable) return false;
      stats.replica_bytes -= r.bytes;
      return true;
    });
  }

  void check(std::uint32_t s) const {
    const auto& got = part.stats();
    require(got.log_entries == stats.log_entries, "replica log: log_entries");
    require(got.log_bytes == stats.log_bytes, "replica log: log_bytes");
    require(got.max_log_bytes == stats.max_log_bytes, "replica log: max_log_bytes");
    require(got.replica_bytes == stats.replica_bytes, "replica log: replica_bytes");
    require(got.max_replica_bytes == stats.max_replica_bytes, "replica log: max_replica_bytes");
    require(got.replicas_stored == stats.replicas_stored, "replica log: replicas_stored");
    require(got.replayed == stats.replayed, "replica log: replayed");
    require(got.orders == stats.orders, "replica log: orders");
    const auto& sh = shards[s];
    const std::size_t left = sh.log.size() - sh.unapplied;
    require(part.flow_blocked(s) == (left >= log_max_unacked), "replica log: flow control");
    require(part.has_pending(s, false) == (left != 0), "replica log: pending entries");
  }

  void on_frame(message& m) {
    const std::uint32_t s = m.header.sender % log_shards;
    auto& sh = shards[s];
    switch (m.header.type) {
      case message_type::push:
      case message_type::clock:
        if (m.header.seq <= sh.last_seq) break;  // a worker numbers its messages upwards
        sh.last_seq = m.header.seq;
        part.on_push(s, m);
        sh.log.push_back(model_entry{m.header, m.payload.size(), 0});
        ++stats.log_entries;
        stats.log_bytes += m.payload.size();
        stats.max_log_bytes = std::max(stats.max_log_bytes, stats.log_bytes);
        break;
      case message_type::ack: {
        const bool full = sh.log.size() - sh.unapplied >= log_max_unacked;
        while (sh.unapplied < sh.log.size() && sh.log[sh.unapplied].header.seq <= m.header.seq)
          ++sh.unapplied;
        truncate(sh);
        const std::size_t left = sh.log.size() - sh.unapplied;
        require(part.on_ack(s, m.header.seq) == (left == 0 || (full && left < log_max_unacked)),
                "replica log: on_ack wakes the worker when flow control opens or all is applied");
        break;
      }
      case message_type::welcome: {
        const bool lost = m.header.has(frame_flags::policy);
        // The other fields keep their defaults (g++ -Wextra warns on a designated initializer
        // that leaves fields out).
        welcome_part welcome;
        welcome.shard = s;
        welcome.welcome_policy_bit = lost;
        require(part.on_welcome(welcome) == welcome_action::resend,
                "replica log: a welcome resends");
        sh.met = true;
        sh.rebuilding = lost;
        break;
      }
      case message_type::hello: {
        require(part.hello_flags(s) == (sh.met ? frame_flags::policy : std::uint8_t{0}),
                "replica log: a hello says whether the worker holds a log");
        const clock_value now = 1000;
        const clock_value want =
            sh.unapplied < sh.log.size() ? sh.log[sh.unapplied].header.clock : now;
        require(part.hello_clock(s, now) == want, "replica log: hello clock");
        break;
      }
      default:
        if (m.header.type == protocol::replay_type)  // a policy type: no `case` of the enum
          rejoin(s);
        else
          server_message(s, m);
    }
    check(s);
  }

  void server_message(std::uint32_t s, message& m) {
    auto& sh = shards[s];
    std::vector<message> replies;
    const frame_header h = m.header;
    const std::size_t bytes = m.payload.size();
    std::optional<protocol::order> o;
    if (h.type == protocol::order_type) {
      protocol::order d;
      std::string why;
      if (!protocol::decode(m, d, why)) o = d;
    }
    const std::error_code ec = part.on_server_message(s, m, replies);
    if (h.type == protocol::order_type) {
      require(!ec == o.has_value(), "replica log: an order is taken exactly when it decodes");
      if (ec) {
        require(replies.empty(), "replica log: a refused order commits nothing");
        return;
      }
      stats.orders += o->size();
      // Each entry names an unapplied logged message of its seq (the log's seqs increase, so
      // at most one), or none (applied, or never logged): the former gets the position.
      std::uint64_t last = 0;  // the position of the last entry found in the log
      for (std::size_t k = 0; k < o->size(); ++k) {
        const protocol::order_entry e = o->entry(k);
        for (std::size_t i = sh.unapplied; i < sh.log.size(); ++i)
          if (sh.log[i].header.seq == e.seq) {
            sh.log[i].position = e.position;
            last = e.position;
          }
      }
      // One cumulative commit per order that logged something, naming the last logged
      // position; none when the order says its messages are applied already.
      const bool commits = last != 0 && !o->applied;
      require(replies.size() == (commits ? 1u : 0u),
              "replica log: one commit per order that logs a position, none when applied");
      if (commits)
        require(replies[0].header.type == protocol::commit_type && replies[0].header.flags == 0 &&
                    replies[0].header.seq == last && replies[0].payload.empty(),
                "replica log: the commit names the order's last logged position");
      if (o->stable > sh.stable) {
        sh.stable = o->stable;
        drop_replicas_below(sh, sh.stable);
        truncate(sh);
      }
      return;
    }
    if (h.type == protocol::replica_type) {
      require(!ec, "replica log: a state replica is stored");
      require(replies.size() == 1 && replies[0].header.type == protocol::commit_type &&
                  replies[0].header.flags == frame_flags::policy && replies[0].header.seq == h.seq,
              "replica log: a stored replica is committed with flag policy");
      // Kept beside the older ones at or above the stable position; the oldest goes past 8.
      drop_replicas_below(sh, sh.stable);
      if (sh.replicas.size() == protocol::max_held_replicas) {
        stats.replica_bytes -= sh.replicas.front().bytes;
        sh.replicas.erase(sh.replicas.begin());
      }
      sh.replicas.push_back({h, bytes});
      stats.replica_bytes += bytes;
      stats.max_replica_bytes = std::max(stats.max_replica_bytes, stats.replica_bytes);
      ++stats.replicas_stored;
      return;
    }
    require(ec == errc::unexpected_message && replies.empty(),
            "replica log: other server messages are unexpected");
  }

  void rejoin(std::uint32_t s) {
    auto& sh = shards[s];
    std::vector<rejoin_message> out;
    rejoin_context r(
        s, 0, 0, 0, sh.rebuilding, {}, [](void*, std::size_t n) { return fuzz::allocate(n); },
        nullptr, out);
    part.on_rejoin(r);
    std::size_t k = 0;
    auto next = [&]() -> const message& {
      require(k < out.size(), "replica log: a rejoin sends every expected message");
      return out[k++].msg;
    };
    auto is_entry = [](const message& m, const model_entry& e) {
      return m.header.type == e.header.type && m.header.seq == e.header.seq &&
             m.header.clock == e.header.clock && m.payload.size() == e.bytes;
    };
    if (sh.rebuilding) {
      for (const auto& rep : sh.replicas) {
        const message& m = next();
        require(m.header.type == protocol::replica_type && m.header.seq == rep.header.seq &&
                    m.payload.size() == rep.bytes,
                "replica log: a rebuilding shard gets the replicas first, oldest first");
      }
      for (const auto& e : sh.log) {
        if (e.position == 0) continue;
        const message& a = next();
        require(a.header.type == protocol::replay_type && a.header.flags == 0 &&
                    a.header.seq == e.position,
                "replica log: each ordered entry is announced by a replay of its position");
        require(is_entry(next(), e), "replica log: the announced entry follows");
        ++stats.replayed;
      }
    } else {
      for (std::size_t i = sh.unapplied; i < sh.log.size(); ++i) {
        if (sh.log[i].position == 0) continue;
        const message& c = next();
        require(c.header.type == protocol::commit_type && c.header.flags == 0 &&
                    c.header.seq == sh.log[i].position,
                "replica log: a rejoin repeats the commits of unapplied ordered entries");
      }
    }
    const message& end = next();
    require(end.header.type == protocol::replay_type && end.header.flags == frame_flags::policy &&
                end.header.seq == sh.stable,
            "replica log: the replay ends with the stable position");
    for (std::size_t i = sh.unapplied; i < sh.log.size(); ++i)
      if (sh.log[i].position == 0)
        require(is_entry(next(), sh.log[i]), "replica log: unordered entries are resent");
    require(k == out.size(), "replica log: a rejoin sends nothing else");
  }
};

}  // namespace

// ---- the chain master's membership (detail::chain_master_core) against its invariants ----

using master_time = std::chrono::steady_clock::time_point;
constexpr std::uint32_t master_shards = 2, master_members = 2, master_slots = 4;

struct master_session : asyncps::detail::chain_master_session<master_time> {};

struct master_io {
  master_time now() const { return time; }
  buffer allocate(std::size_t n) const { return fuzz::allocate(n); }
  void wake(master_session&) const {}
  void close(master_session&) const {}
  std::string address(const master_session&) const { return {}; }
  std::string host(const master_session&) const { return {}; }
  std::shared_ptr<const peer_identity> identity(const master_session&) const { return nullptr; }
  std::string tls_note(const master_session&) const { return {}; }
  master_time time{};
};

// Up to 4 connections to a master of 2 shards x 2 members; a frame goes to connection
// `first_row` mod 4 (opened on its first frame), after `clock` mod 2048 ms pass; a `bye`
// closes it, as does a frame the core refuses or one to a connection the core closed (its
// loops then end); the watchdog ticks after every frame.
struct master_model {
  master_io io;
  asyncps::detail::chain_master_core<master_session, master_time, master_io> core{
      {.num_shards = master_shards,
       .members = master_members,
       .heartbeat_timeout = std::chrono::milliseconds(1000),
       .register_timeout = std::chrono::milliseconds(3000),
       .log = [](std::string_view) {}},
      io};
  std::array<std::unique_ptr<master_session>, master_slots> slots{};
  std::uint64_t configs_gone = 0;  // configurations queued to connections that ended

  void end(std::size_t k) {
    master_session& s = *slots[k];
    s.open = false;
    core.on_closed(s);
    configs_gone += s.outbox.size();
    slots[k].reset();
  }

  void on_frame(const message& m) {
    io.time += std::chrono::milliseconds(static_cast<std::uint64_t>(m.header.clock) % 2048);
    const std::size_t k = m.header.first_row % master_slots;
    if (!slots[k]) {
      slots[k] = std::make_unique<master_session>();
      core.on_open(*slots[k]);
    }
    master_session& s = *slots[k];
    if (!s.open || m.header.type == message_type::bye || !core.on_receive(s, {}, m)) end(k);
    core.on_tick();
    check();
  }

  // Every chain lists distinct member ids of its shard, each held by exactly one open,
  // registered connection, whose last configuration places it between the chain's
  // neighbours at the current epoch; no configuration was sent that is not queued.
  void check() const {
    std::uint64_t queued = configs_gone;
    for (const auto& sp : slots)
      if (sp) queued += sp->outbox.size();
    require(queued == core.stats().configs_sent, "master: every configuration is queued");
    for (std::uint32_t shard = 0; shard < master_shards; ++shard) {
      const auto chain = core.chain(shard);
      require(chain.size() <= master_members, "master: a chain holds at most the members");
      for (std::size_t i = 0; i < chain.size(); ++i) {
        require(chain[i] < master_members, "master: chain member ids lie in [0, members)");
        require(std::count(chain.begin(), chain.end(), chain[i]) == 1,
                "master: a member is in its chain once");
        const master_session* holder = nullptr;
        for (const auto& sp : slots)
          if (sp && sp->registered && sp->shard == shard && sp->member == chain[i]) {
            require(holder == nullptr, "master: one registration per member");
            holder = sp.get();
          }
        require(holder != nullptr && holder->open, "master: a chain member is a live connection");
        require(!holder->outbox.empty(), "master: a chain member was configured");
        protocol::chain_config c;
        std::string why;
        require(!protocol::decode(holder->outbox.back(), c, why), "master: configs decode");
        constexpr auto none = protocol::chain_config::none;
        require(c.shard == shard && c.member == chain[i], "master: a config names its member");
        require(c.predecessor == (i == 0 ? none : chain[i - 1]) &&
                    c.successor == (i + 1 == chain.size() ? none : chain[i + 1]),
                "master: a config names the chain's neighbours");
        require(c.epoch == core.epoch(shard), "master: a member has the current epoch");
      }
    }
  }
};

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::byte_reader in(std::as_bytes(std::span(data, size)));
  const wire_limits limits{};
  log_model replica_log;
  master_model master;
  while (in.left() != 0) {
    message m;
    const auto r = fuzz::read_frame(in, limits, m);
    if (r.truncated) break;
    if (r.ec) continue;  // the transport refuses it; no decoder sees it
    round_trip<protocol::hello>(m, message_type::hello, true, false);
    round_trip<protocol::welcome>(m, message_type::welcome, true, true);
    round_trip<protocol::error>(m, message_type::error, false, false);
    round_trip<protocol::report>(m, message_type::report, true, false);
    round_trip<protocol::chain_hello>(m, protocol::chain_hello_type, false, false);
    round_trip<protocol::chain_config>(m, protocol::chain_config_type, false, true);
    round_trip<protocol::order>(m, protocol::order_type, false, true);
    round_trip<protocol::announce>(m, message_type::announce, false, false);
    round_trip<protocol::assigned>(m, message_type::assigned, false, false, false);
    round_trip<protocol::lookup>(m, message_type::lookup, false, false);
    round_trip<protocol::directory>(m, message_type::directory, false, false, false);
    replica_log.on_frame(m);
    master.on_frame(m);
  }
  return 0;
}
