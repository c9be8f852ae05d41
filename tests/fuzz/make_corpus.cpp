// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) with the
// library's own encoders: small valid inputs that reach deep into each decoder.
//
//   make_corpus <dir>     writes <dir>/{frame,handshake,sparse_keys,state,checkpoint}/*
//
// The committed corpus is this program's output; run it again after a wire or file format
// change (docs/testing.md).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/detail/codec/rendezvous_messages.hpp"
#include "asyncps/detail/codec/shard_state.hpp"
#include "asyncps/detail/server/shard_core.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery/chain/messages.hpp"
#include "asyncps/recovery/checkpoint/file.hpp"
#include "asyncps/recovery/none.hpp"
#include "asyncps/recovery/replica_log/messages.hpp"
#include "asyncps/recovery/stateless.hpp"
#include "asyncps/shard_state.hpp"
#include "asyncps/wire.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace asyncps;
namespace fs = std::filesystem;
using bytes = std::vector<std::byte>;

fs::path root;

void write(const std::string& target, const std::string& name, const bytes& b) {
  const fs::path dir = root / target;
  fs::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!f) {
    std::fprintf(stderr, "make_corpus: cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}

void add(bytes& out, message m, bool checksum = false) { fuzz::append_frame(out, m, checksum); }

message hello(std::uint32_t w, std::uint32_t fingerprint, clock_value c = 0) {
  // The layout of the `frame` target's server (frame_fuzz.cpp: options()).
  return protocol::encode(
      protocol::hello{
          .worker = w, .clock = c, .fingerprint = fingerprint, .layout = {{8, 2}, {16, 1}}},
      fuzz::allocate);
}

message push(std::uint32_t w, table_id t, clock_value c, std::uint32_t width,
             std::vector<row_id> keys, std::uint8_t flags = 0) {
  message m;
  m.header.type = message_type::push;
  m.header.flags = flags;
  m.header.sender = w;
  m.header.table = t;
  m.header.clock = c;
  m.header.row_count = static_cast<std::uint32_t>(keys.size());
  m.header.width = width;
  const std::size_t kb = key_bytes(m.header.row_count);
  m.payload = fuzz::allocate(kb + keys.size() * width * sizeof(float));
  std::memset(m.payload.data(), 0, m.payload.size());
  if (!keys.empty()) std::memcpy(m.payload.data(), keys.data(), keys.size() * 4);
  auto* f = reinterpret_cast<float*>(m.payload.data() + kb);
  for (std::size_t i = 0; i < keys.size() * width; ++i) f[i] = 0.25f * static_cast<float>(i + 1);
  return m;
}

message range_push(std::uint32_t w, table_id t, clock_value c, std::uint32_t width, row_id first,
                   std::uint32_t rows, std::uint8_t flags = 0) {
  message m;
  m.header.type = message_type::push;
  m.header.flags = static_cast<std::uint8_t>(flags | frame_flags::range);
  m.header.sender = w;
  m.header.table = t;
  m.header.clock = c;
  m.header.first_row = first;
  m.header.row_count = rows;
  m.header.width = width;
  m.payload = fuzz::allocate(std::size_t{rows} * width * sizeof(float));
  auto* f = reinterpret_cast<float*>(m.payload.data());
  for (std::size_t i = 0; i < std::size_t{rows} * width; ++i) f[i] = -0.5f;
  return m;
}

// A backlog push (flag `prefixed`) of the rows [first, first + rows) summing `clocks` clocks:
// the prefix, then the floats.
message backlog_push(std::uint32_t w, table_id t, clock_value c, std::uint32_t width, row_id first,
                     std::uint32_t rows, std::uint64_t clocks) {
  message m = range_push(w, t, c, width, first, rows, frame_flags::prefixed);
  buffer b = fuzz::allocate(push_prefix_bytes + m.payload.size());
  protocol::set_backlog_clocks(b, clocks);
  std::memcpy(b.data() + push_prefix_bytes, m.payload.data(), m.payload.size());
  m.payload = std::move(b);
  return m;
}

message pull(std::uint32_t w, table_id t, clock_value c, std::vector<row_id> keys) {
  message m;
  m.header.type = message_type::pull;
  m.header.sender = w;
  m.header.table = t;
  m.header.clock = c;
  m.header.row_count = static_cast<std::uint32_t>(keys.size());
  m.payload = fuzz::allocate(key_bytes(m.header.row_count));
  std::memset(m.payload.data(), 0, m.payload.size());
  if (!keys.empty()) std::memcpy(m.payload.data(), keys.data(), keys.size() * 4);
  return m;
}

message range_pull(std::uint32_t w, table_id t, clock_value c, row_id first, std::uint32_t n) {
  message m;
  m.header.type = message_type::pull;
  m.header.flags = frame_flags::range;
  m.header.sender = w;
  m.header.table = t;
  m.header.clock = c;
  m.header.first_row = first;
  m.header.row_count = n;
  return m;
}

message bare(message_type type, std::uint32_t sender, clock_value c = 0, std::uint64_t seq = 0) {
  message m;
  m.header.type = type;
  m.header.sender = sender;
  m.header.clock = c;
  m.header.seq = seq;
  return m;
}

// `frame`: policy byte, then (op, frame) pairs; shard 1 of 2 owns rows [4, 8) of table 0
// (width 2) and [8, 16) of table 1 (width 1); 3 workers.
template <class Consistency>
void frame_seeds(std::uint8_t policy, const std::string& name) {
  const auto fp = policy_fingerprint<Consistency, recovery::none>();
  auto op = [](bytes& b, int slot) { b.push_back(static_cast<std::byte>(slot)); };
  {  // a clock of two workers: dense and sparse pushes, pulls answered and deferred
    bytes b{static_cast<std::byte>(policy)};
    op(b, 0), add(b, hello(0, fp));
    op(b, 1), add(b, hello(1, fp));
    op(b, 2), add(b, hello(2, fp));
    op(b, 0), add(b, range_pull(0, 0, 0, 4, 4));
    op(b, 1), add(b, pull(1, 1, 0, {9, 12, 15}));
    op(b, 0), add(b, range_push(0, 0, 0, 2, 4, 4, frame_flags::want_ack));
    op(b, 1), add(b, push(1, 1, 0, 1, {8, 9, 15}, frame_flags::want_ack));
    op(b, 0), add(b, push(0, 1, 0, 1, {10}, frame_flags::end_of_clock));
    op(b, 0), add(b, pull(0, 1, 1, {10, 11}));  // waits for server clock 1
    op(b, 1), add(b, bare(message_type::clock, 1, 0, 3));
    op(b, 2), add(b, range_push(2, 0, 0, 2, 6, 2, frame_flags::end_of_clock));
    b.push_back(std::byte{0xc0});  // time passes: the watchdog reports
    op(b, 2), add(b, bare(message_type::heartbeat, 2));
    op(b, 1), add(b, bare(message_type::bye, 1));
    b.push_back(std::byte{0x80});  // connection 0 ends
    write("frame", name + "_clock", b);
  }
  {  // checksummed frames (as over TCP), a rejoin, an error message
    bytes b{static_cast<std::byte>(policy)};
    op(b, 0), add(b, hello(0, fp, 0), true);
    op(b, 1), add(b, hello(1, fp, 3), true);  // rejoins at clock 3
    op(b, 0), add(b, range_push(0, 0, 0, 2, 4, 4, frame_flags::end_of_clock), true);
    op(b, 0), add(b, range_pull(0, 1, 1, 8, 8), true);
    op(b, 1),
        add(b,
            protocol::encode(
                protocol::error{.sender = 1, .code = errc::bad_width, .reason = "worker gives up"},
                fuzz::allocate),
            true);
    write("frame", name + "_tcp", b);
  }
}

// recovery::stateless (policy byte 3 + merge rule; frame_fuzz.cpp): workers rejoin a shard
// without state, which asks for replicas; an implausible replica (from the future, then above
// max_replica_value) is refused, a plausible one per table installed, a later one dropped;
// backlogs are merged by the rule (the installed replica's sender's own skipped).
void stateless_seeds(std::uint8_t policy, const std::string& name) {
  const auto fp = policy_fingerprint<consistency::ssp<1>, recovery::stateless>();
  auto op = [](bytes& b, int slot) { b.push_back(static_cast<std::byte>(slot)); };
  bytes b{static_cast<std::byte>(policy)};
  op(b, 0), add(b, hello(0, fp, 3));
  op(b, 1), add(b, hello(1, fp, 2));
  op(b, 2), add(b, hello(2, fp, 2));
  op(b, 2), add(b, range_push(2, 0, 5, 2, 4, 4, frame_flags::policy));  // from the future
  op(b, 3), add(b, hello(2, fp, 2));
  {
    message big = range_push(2, 0, 2, 2, 4, 4, frame_flags::policy);
    reinterpret_cast<float*>(big.payload.data())[3] = 1000.0f;  // above max_replica_value 100
    op(b, 3), add(b, std::move(big));
  }
  op(b, 0), add(b, range_push(0, 0, 3, 2, 4, 4, frame_flags::policy));  // installed
  op(b, 1), add(b, range_push(1, 0, 2, 2, 4, 4, frame_flags::policy));  // dropped: a later one
  op(b, 1), add(b, range_push(1, 1, 2, 1, 8, 8, frame_flags::policy));  // installs table 1
  op(b, 0), add(b, backlog_push(0, 0, 1, 2, 4, 4, 2));                  // its own: skipped
  op(b, 1), add(b, backlog_push(1, 0, 1, 2, 4, 4, 12));
  op(b, 0), add(b, backlog_push(0, 1, 0, 1, 8, 8, 3));
  op(b, 0), add(b, range_pull(0, 0, 3, 4, 4));
  write("frame", name, b);
}

void frame_corpus() {
  stateless_seeds(3, "stateless_sum");
  stateless_seeds(6, "stateless_staleness");
  frame_seeds<consistency::ssp<1>>(0, "ssp");
  frame_seeds<consistency::essp<1>>(1, "essp");
  frame_seeds<consistency::vap>(2, "vap");
  {  // refusals: a wrong layout, then a push before any hello
    bytes b{std::byte{0}};
    b.push_back(std::byte{0});
    add(b, protocol::encode(
               protocol::hello{.worker = 0,
                               .clock = 0,
                               .fingerprint =
                                   policy_fingerprint<consistency::ssp<1>, recovery::none>(),
                               .layout = {{8, 3}}},
               fuzz::allocate));
    b.push_back(std::byte{1});
    add(b, range_push(0, 0, 0, 2, 4, 1));
    write("frame", "refusals", b);
  }
  {  // a reader (protocol::reader_id) beside a worker: its pulls answered at once (one at a
     // clock far ahead, one keyed), then its push refused
    const auto fp = policy_fingerprint<consistency::ssp<1>, recovery::none>();
    bytes b{std::byte{0}};
    b.push_back(std::byte{0});
    add(b, hello(protocol::reader_id, 0));
    b.push_back(std::byte{1});
    add(b, hello(0, fp));
    b.push_back(std::byte{1});
    add(b, range_push(0, 0, 0, 2, 4, 4, frame_flags::want_ack));
    b.push_back(std::byte{0});
    add(b, range_pull(protocol::reader_id, 0, 1000, 4, 4));
    b.push_back(std::byte{0});
    add(b, pull(protocol::reader_id, 1, 0, {8, 9, 15}));
    b.push_back(std::byte{0});
    add(b, range_push(protocol::reader_id, 0, 0, 2, 4, 4));
    write("frame", "reader", b);
  }
  {  // regression: a rejoin at the largest clock, then its clock message (signed overflow of
     // `clock + 1` in the server before the fix; tests/unit/server_core_test.cpp)
    const auto fp = policy_fingerprint<consistency::ssp<1>, recovery::none>();
    constexpr clock_value top = std::numeric_limits<clock_value>::max();
    bytes b{std::byte{0}, std::byte{0}};
    add(b, hello(0, fp, top));
    b.push_back(std::byte{0});
    add(b, bare(message_type::clock, 0, top));
    b.push_back(std::byte{0});
    add(b, range_push(0, 0, top, 2, 4, 1, frame_flags::end_of_clock));
    write("frame", "regression_clock_overflow", b);
  }
}

void handshake_corpus() {
  const auto fp = policy_fingerprint<consistency::ssp<1>, recovery::none>();
  auto one = [](const std::string& name, message m) {
    bytes b;
    add(b, std::move(m));
    write("handshake", name, b);
  };
  one("hello", protocol::encode(
                   protocol::hello{
                       .worker = 2, .clock = 5, .fingerprint = fp, .layout = {{8, 2}, {100, 16}}},
                   fuzz::allocate));
  one("welcome", protocol::encode(protocol::welcome{.shard = 1,
                                                    .num_shards = 2,
                                                    .server_clock = 4,
                                                    .worker_clock = 5,
                                                    .policy_bit = true,
                                                    .tables = {{8, 2, 3}, {100, 16, 0}},
                                                    .local_step = 0.125f},
                                  fuzz::allocate));
  one("error", protocol::encode(protocol::error{.sender = 0,
                                                .code = errc::layout_mismatch,
                                                .reason = "table 0: 8 x 3 vs 8 x 2"},
                                fuzz::allocate));
  one("error_policy_code",  // a recovery policy's own code (chain_errc::not_head)
      protocol::encode(protocol::error{.sender = 0, .policy_code = 1, .reason = "not the head"},
                       fuzz::allocate));
  one("report", protocol::encode(protocol::report{.shard = 0,
                                                  .server_clock = 7,
                                                  .slowest = 2,
                                                  .slowest_clock = 7,
                                                  .slowest_connected = true},
                                 fuzz::allocate));
  one("chain_hello",
      protocol::encode(
          protocol::chain_hello{.shard = 1, .member = 2, .fingerprint = fp, .epoch = 3},
          fuzz::allocate));
  one("chain_config",
      protocol::encode(protocol::chain_config{.shard = 1,
                                              .member = 1,
                                              .predecessor = 0,
                                              .successor = protocol::chain_config::none,
                                              .epoch = 4,
                                              .joining = true},
                       fuzz::allocate));
  {  // orders are batches: one entry, several, and several already applied (apply-first)
    const std::vector<protocol::order_entry> one_entry{{9, 12}};
    const std::vector<protocol::order_entry> three{{9, 12}, {11, 13}, {14, 20}};
    one("order", protocol::encode(protocol::order{.shard = 0, .stable = 10, .entries = one_entry},
                                  fuzz::allocate));
    one("order_batch", protocol::encode(protocol::order{.shard = 1, .stable = 10, .entries = three},
                                        fuzz::allocate));
    one("order_applied",
        protocol::encode(
            protocol::order{.shard = 0, .stable = 11, .applied = true, .entries = three},
            fuzz::allocate));
  }
  one("announce", protocol::encode(protocol::announce{.shard = 1, .port = 7001, .host = "10.0.0.7"},
                                   fuzz::allocate));
  one("announce_any", protocol::encode(protocol::announce{.port = 7000}, fuzz::allocate));
  one("assigned",
      protocol::encode(protocol::assigned{.shard = 1, .num_servers = 2, .num_workers = 4},
                       fuzz::allocate));
  one("lookup", protocol::encode(protocol::lookup{.worker = protocol::any_id}, fuzz::allocate));
  one("directory",
      protocol::encode(protocol::directory{.worker = 2,
                                           .num_workers = 4,
                                           .servers = {{"10.0.0.7", 7000}, {"fe80::1%eth0", 7001}}},
                       fuzz::allocate));

  // The replica log's worker part (handshake_fuzz.cpp): the worker's pushes and clock
  // message on shard 0 (sender 0), their orders (batches), a state replica, acks, then a
  // rejoin: to a rebuilding shard (welcome flag policy) and to one that kept its state; and
  // the same with orders of applied messages (apply-first: no commit) and an order naming a
  // message the worker never logged; and an order that comes after its messages' ack.
  auto welcome = [](bool rebuilding) {
    return protocol::encode(protocol::welcome{.shard = 0,
                                              .num_shards = 2,
                                              .server_clock = 1,
                                              .worker_clock = 1,
                                              .policy_bit = rebuilding,
                                              .tables = {{8, 2, 3}}},
                            fuzz::allocate);
  };
  auto seq = [](message m, std::uint64_t s) {
    m.header.seq = s;
    m.header.flags |= frame_flags::want_ack;
    return m;
  };
  auto order = [](std::vector<protocol::order_entry> entries, std::uint64_t stable,
                  bool applied = false) {
    return protocol::encode(
        protocol::order{.shard = 0, .stable = stable, .applied = applied, .entries = entries},
        fuzz::allocate);
  };
  auto replica = [](std::uint64_t position) {
    message m = range_push(0, 0, 1, 2, 0, 4);  // a few bytes standing for the state
    m.header.type = protocol::replica_type;
    m.header.flags = 0;
    m.header.seq = position;
    return m;
  };
  // A welcome, then the worker's first clock on shard 0: two pushes and a clock message.
  auto first_clock = [&](bytes& b) {
    add(b, welcome(false));
    add(b, seq(push(0, 0, 0, 2, {1, 3}), 1));
    add(b, seq(push(0, 0, 0, 2, {2}), 2));
    add(b, seq(bare(message_type::clock, 0, 0), 3));
  };
  for (const bool rebuilding : {true, false}) {
    bytes b;
    first_clock(b);
    add(b, order({{1, 1}, {2, 2}}, 0));
    add(b, replica(2));
    add(b, bare(message_type::ack, 0, 0, 1));
    add(b, order({{3, 3}}, 2));
    add(b, seq(push(0, 0, 1, 2, {5}), 4));
    add(b, bare(message_type::hello, 0));
    add(b, welcome(rebuilding));
    add(b, bare(protocol::replay_type, 0));
    write("handshake", rebuilding ? "replica_log_rebuild" : "replica_log_rejoin", b);
  }
  for (const bool rebuilding : {true, false}) {
    bytes b;
    first_clock(b);
    add(b, order({{1, 1}, {2, 2}}, 0, true));  // applied: logged, no commit
    add(b, bare(message_type::ack, 0, 0, 2));
    add(b, replica(2));
    add(b, order({{3, 3}}, 2, true));
    add(b, seq(push(0, 0, 1, 2, {5}), 4));
    add(b, order({{4, 4}, {6, 5}}, 2));  // seq 6 was never logged: the commit names 4
    add(b, bare(message_type::hello, 0));
    add(b, welcome(rebuilding));
    add(b, bare(protocol::replay_type, 0));
    write("handshake", rebuilding ? "replica_log_applied_rebuild" : "replica_log_applied_rejoin",
          b);
  }
  {  // a late order: it names messages acknowledged already, which keep no position (never
     // freed by a stable position), and one unapplied, which gets its position and the commit
    bytes b;
    first_clock(b);
    add(b, bare(message_type::ack, 0, 0, 2));
    add(b, order({{1, 1}, {2, 2}, {3, 3}}, 0));
    add(b, seq(push(0, 0, 1, 2, {5}), 4));
    add(b, order({{4, 4}}, 2));
    add(b, bare(message_type::hello, 0));
    add(b, welcome(true));
    add(b, bare(protocol::replay_type, 0));
    write("handshake", "replica_log_late_order", b);
  }
  {  // the chain master (handshake_fuzz.cpp): connection = header first_row mod 4, time passes
     // by header clock (ms). Shard 0's members register on connections 0 and 1 (the chain
     // starts), heartbeats, member 0 falls silent (removed at the watchdog), connection 2
     // registers as member 0 again and joins as the tail; a bye ends connection 1.
    const auto on = [](message m, std::uint64_t connection, clock_value ms) {
      m.header.first_row = connection;
      m.header.clock = ms;
      return m;
    };
    const auto chain_hello = [](std::uint32_t shard, std::uint32_t member) {
      return protocol::encode(protocol::chain_hello{.shard = shard, .member = member},
                              fuzz::allocate);
    };
    bytes b;
    add(b, on(chain_hello(0, 0), 0, 0));
    add(b, on(chain_hello(0, 1), 1, 0));
    add(b, on(bare(message_type::heartbeat, 0), 0, 300));
    for (int i = 0; i < 5; ++i) add(b, on(bare(message_type::heartbeat, 0), 1, 300));
    add(b, on(chain_hello(0, 0), 2, 10));
    add(b, on(chain_hello(1, 1), 3, 10));
    add(b, on(bare(message_type::bye, 0), 1, 0));
    write("handshake", "chain_master", b);
  }
}

// `sparse_keys`: shard 1 of 3 owns rows [3, 6) of table 0 (width 3) and [33, 66) of table 1.
void sparse_keys_corpus() {
  {
    bytes b;
    add(b, pull(0, 1, 0, {33, 40, 65}));
    add(b, push(0, 1, 0, 1, {40, 50}));
    add(b, pull(1, 1, 0, {34, 50}));
    add(b, push(1, 0, 0, 3, {3, 5}));
    add(b, pull(0, 0, 0, {3, 4}));
    add(b, pull(0, 0, 0, {5}));  // keyed rows now cover the shard: a range subscription
    add(b, push(0, 0, 0, 3, {4}));
    write("sparse_keys", "keys", b);
  }
  {
    bytes b;
    add(b, range_pull(0, 1, 0, 40, 10));
    add(b, pull(0, 1, 0, {35, 45, 60}));
    add(b, range_push(0, 1, 0, 1, 33, 33));
    add(b, push(1, 1, 0, 1, {60}));
    write("sparse_keys", "range_and_keys", b);
  }
}

// `state` and `checkpoint`: states of the `state` target's shard (shard 0 of 2, 2 workers,
// momentum: table 0 rows [0, 3) x 2, table 1 rows [0, 4) x 1) and a larger one.
shard_state small_state(bool with_last_seq) {
  using core_t = detail::shard_core<optimizer::momentum, int, int>;
  const std::vector<table_spec> layout{table_spec{0, 6, 2, 0.5f}, table_spec{1, 8, 1, 0.0f}};
  core_t core(0, 2, 2, layout, 3, optimizer::momentum{});
  core.apply(range_push(0, 0, 0, 2, 0, 3));
  core.count_push(0, 0);
  core.advance(0, 2);
  core.advance(1, 1);
  core.last_seq(0) = 4;
  shard_state st;
  core.save_state(st);
  if (!with_last_seq) st.last_seq.clear();
  return st;
}

shard_state large_state() {  // > 4096 bytes: the file reader refills its buffer
  shard_state st;
  st.shard = 1;
  st.num_shards = 3;
  st.num_workers = 3;
  st.state_per_param = 1;
  st.server_clock = 2;
  st.worker_clocks = {2, 3, 4};
  st.applied = {1, 2, 3};
  st.last_seq = {5, 6, 7};
  table_state_copy t;
  t.spec = table_spec{0, 90, 24, 0.1f};
  t.range = shard_range(90, 1, 3);
  t.step = 6;
  t.values.resize(std::size_t{t.range.size()} * 24);
  for (std::size_t i = 0; i < t.values.size(); ++i) t.values[i] = static_cast<float>(i) / 64;
  t.optimizer_state.assign(t.values.size(), 0.5f);
  st.tables.push_back(std::move(t));
  return st;
}

bytes encoded(const shard_state& st) {
  bytes b(detail::encoded_state_size(st));
  detail::encode_state(st, std::span<std::byte>(b));
  return b;
}

void state_corpus() {
  write("state", "small", encoded(small_state(true)));
  write("state", "small_no_last_seq", encoded(small_state(false)));
  write("state", "large", encoded(large_state()));
  // regression: has_last_seq must be 0 or 1 (any non-zero value was read as 1 before the fix;
  // tests/unit/wire_test.cpp)
  bytes b = encoded(small_state(true));
  detail::store_le(b.data() + 20, std::uint32_t{0xbf000000});
  write("state", "regression_has_last_seq", b);
}

void checkpoint_corpus(const fs::path& tmp) {
  auto one = [&](const std::string& name, const shard_state& st, std::uint8_t mode) {
    const fs::path file = tmp / (name + ".ckpt");
    std::string why;
    if (!detail::write_checkpoint(file, st, &why)) {
      std::fprintf(stderr, "make_corpus: %s\n", why.c_str());
      std::exit(1);
    }
    std::ifstream f(file, std::ios::binary);
    const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    bytes b{static_cast<std::byte>(mode)};
    for (char c : s) b.push_back(static_cast<std::byte>(c));
    write("checkpoint", name, b);
    fs::remove(file);
  };
  one("small", small_state(false), 1);  // mode 1: the target fixes size and checksum
  one("small_raw", small_state(true), 0);
  one("large", large_state(), 1);
  {  // regression: has_last_seq must be 0 or 1 (mode 1: the target fixes the checksum)
    bytes b(1 + 8);
    b[0] = std::byte{1};
    std::memcpy(b.data() + 1, detail::checkpoint_magic.data(), 8);
    bytes record = encoded(small_state(true));
    detail::store_le(record.data() + 20, std::uint32_t{2});
    bytes head(16);
    detail::store_le(head.data(), detail::checkpoint_format_version);
    detail::store_le(head.data() + 4, static_cast<std::uint32_t>(detail::checkpoint_header_bytes));
    detail::store_le(head.data() + 8, std::uint64_t{0});  // file_bytes: fixed by the target
    b.insert(b.end(), head.begin(), head.end());
    b.insert(b.end(), record.begin(), record.end());
    b.resize(b.size() + 8);  // checksum: fixed by the target
    write("checkpoint", "regression_has_last_seq", b);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus <dir>\n");
    return 2;
  }
  root = argv[1];
  frame_corpus();
  handshake_corpus();
  sparse_keys_corpus();
  state_corpus();
  const fs::path tmp = fs::temp_directory_path() / "asyncps-make-corpus";
  fs::create_directories(tmp);
  checkpoint_corpus(tmp);
  fs::remove_all(tmp);
  return 0;
}
