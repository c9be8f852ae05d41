// Tests of detail::shard_core, the sans-io state of one server shard, and of
// detail::server_protocol, what the server does with each message, stepped message by
// message: no transport, no executor, no timer.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <list>
#include <new>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "asyncps/buffer.hpp"
#include "asyncps/consistency/policies.hpp"
#include "asyncps/detail/server/protocol.hpp"
#include "asyncps/detail/server/session.hpp"
#include "asyncps/detail/server/shard_core.hpp"
#include "asyncps/detail/text.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery/none.hpp"
#include "asyncps/server_options.hpp"
#include "asyncps/update_rule.hpp"
#include "asyncps/wire.hpp"

namespace {

using namespace asyncps;
using core_t = detail::shard_core<optimizer::sgd, int, int>;  // readers and times are ints

buffer_pool pool;
const auto alloc = [](std::size_t n) { return pool.allocate(n); };

// One table of 8 rows x 2, shard 0 of 2 (rows [0, 4)), 2 workers, all values 0.
core_t make_core() {
  const std::vector<table_spec> layout{table_spec{0, 8, 2, 0.0f}};
  return core_t(0, 2, 2, layout, 42, optimizer::sgd{1.0f});
}

// A range push of `rows` rows from `first` by worker `w` at clock `c`, every value `g`.
message range_push(std::uint32_t w, clock_value c, row_id first, std::uint32_t rows, float g) {
  message m;
  m.header.type = message_type::push;
  m.header.flags = frame_flags::range;
  m.header.sender = w;
  m.header.table = 0;
  m.header.clock = c;
  m.header.first_row = first;
  m.header.row_count = rows;
  m.header.width = 2;
  m.payload = pool.allocate(std::size_t{rows} * 2 * sizeof(float));
  auto* f = reinterpret_cast<float*>(m.payload.data());
  for (std::size_t i = 0; i < std::size_t{rows} * 2; ++i) f[i] = g;
  return m;
}

// A pull of rows `keys` (sparse) or of [first, first + rows) wanting server clock `c`.
message pull(std::uint32_t w, clock_value c, row_id first, std::uint32_t rows) {
  message m;
  m.header.type = message_type::pull;
  m.header.flags = frame_flags::range;
  m.header.sender = w;
  m.header.clock = c;
  m.header.first_row = first;
  m.header.row_count = rows;
  return m;
}
message keyed_pull(std::uint32_t w, clock_value c, std::vector<row_id> keys) {
  message m;
  m.header.type = message_type::pull;
  m.header.sender = w;
  m.header.clock = c;
  m.header.row_count = static_cast<std::uint32_t>(keys.size());
  m.payload = pool.allocate(key_bytes(m.header.row_count));
  std::memset(m.payload.data(), 0, m.payload.size());
  std::memcpy(m.payload.data(), keys.data(), keys.size() * sizeof(row_id));
  return m;
}

// The floats of `b`.
std::vector<float> floats_of(const buffer& b) {
  const auto f = b.floats();
  return {f.begin(), f.end()};
}

}  // namespace

TEST_CASE("shard_core: a push is validated, applied through the optimizer and counted") {
  auto core = make_core();
  CHECK(core.table(0).range == key_range{0, 4});
  std::string detail;
  auto bad = range_push(0, 0, 3, 2, 1.0f);  // rows [3, 5): past this shard's rows
  CHECK(core.check_rows(bad, detail) == errc::bad_row_range);
  CHECK(detail.find("shard rows [0, 4)") != std::string::npos);
  auto m = range_push(0, 0, 1, 2, 0.5f);
  REQUIRE(!core.check_rows(m, detail));
  CHECK(core_t::all_finite(payload_floats(m)));
  CHECK(!core.has_state());
  core.apply(m);
  core.count_push(0, 0);
  CHECK(core.has_state());
  CHECK(core.applied(0, 0) == 1);
  const auto& v = core.table(0).values;
  CHECK(v[0] == 0.0f);
  CHECK(v[2] == -0.5f);  // sgd with rate 1: value -= gradient
  CHECK(v[5] == -0.5f);
  CHECK(v[6] == 0.0f);
  CHECK(core.table(0).step == 1);
}

TEST_CASE("shard_core: a pull waits for the server clock and is answered in arrival order") {
  auto core = make_core();
  core.defer(7, pull(0, 1, 0, 4), 100);
  core.defer(8, pull(1, 2, 0, 4), 101);
  std::vector<int> answered;
  const auto alive = [](int) { return true; };
  const auto answer = [&](int r, const message&) { answered.push_back(r); };
  CHECK(!core.advance(0, 1));  // worker 1 still at clock 0
  core.take_ready(alive, answer);
  CHECK(answered.empty());
  CHECK(core.advance(1, 1));  // server clock 1
  CHECK(core.clock() == 1);
  core.take_ready(alive, answer);
  CHECK(answered == std::vector<int>{7});
  REQUIRE(core.pending().size() == 1);
  CHECK(core.pending()[0].since == 101);
  core.drop(8);  // its connection closed
  CHECK(core.pending().empty());
}

TEST_CASE("shard_core: rows payloads and eager rows carry only changed subscribed rows") {
  auto core = make_core();
  detail::subscription sub;
  core.subscribe(sub, keyed_pull(0, 0, {1, 3}));
  CHECK(!sub.ranged);
  CHECK(sub.keys == std::vector<row_id>{1, 3});
  const std::vector<row_id> keys{1, 3};
  auto rows = core.rows_payload(0, false, 0, 2, keys, alloc);
  CHECK(rows.size() == key_bytes(2) + 4 * sizeof(float));
  // Row 3 changes: the next eager message holds row 3 only.
  core.apply(range_push(1, 0, 3, 1, 2.0f));
  buffer whole;
  auto e = core.eager_rows_for(0, sub, whole, alloc);
  CHECK(!e.ranged);
  REQUIRE(e.count == 1);
  row_id k = 0;
  std::memcpy(&k, e.payload.data(), sizeof k);
  CHECK(k == 3);
  float f = 0;
  std::memcpy(&f, e.payload.data() + key_bytes(1), sizeof f);
  CHECK(f == -2.0f);
  // Nothing changed since: an empty eager message.
  CHECK(core.eager_rows_for(0, sub, whole, alloc).count == 0);
  // Keyed rows covering the whole shard become a range; a dense change sends it whole.
  core.subscribe(sub, keyed_pull(0, 0, {0, 2}));
  CHECK(sub.ranged);
  CHECK(sub.range == key_range{0, 4});
  core.apply(range_push(0, 0, 0, 4, 1.0f));
  e = core.eager_rows_for(0, sub, whole, alloc);
  CHECK(e.ranged);
  CHECK(e.count == 4);
  CHECK(!whole.empty());  // snapshot once, shared with the next reader of this round
}

TEST_CASE("shard_core: a range reply shares the table's bytes; a write while it is held copies "
          "them first, so the reply keeps one version of every row") {
  auto core = make_core();  // rows [0, 4) x 2, all 0
  std::string detail;
  // No reply outstanding: a push writes in place, nothing is copied.
  core.apply(range_push(0, 0, 0, 4, 1.0f));  // every value -1
  CHECK(core.cow_copies() == 0);
  const float* storage = std::as_const(core).table(0).values.data();
  // A pull of the whole shard: the reply is the table's own bytes.
  auto reply = core.reply_payload(pull(0, 0, 0, 4), alloc);
  CHECK(reinterpret_cast<const float*>(reply.data()) == storage);
  CHECK(reply.size() == 8 * sizeof(float));
  // A push to rows 1-2 while the reply is held: the table moves to a fresh block first.
  auto m = range_push(1, 0, 1, 2, 0.5f);
  REQUIRE(!core.check_and_apply(m, detail));
  CHECK(core.cow_copies() == 1);
  CHECK(std::as_const(core).table(0).values.data() != storage);
  // The reply: every row as it was when the pull was answered; the table: the new rows.
  CHECK(floats_of(reply) == std::vector<float>(8, -1.0f));
  const auto& v = core.table(0).values;
  CHECK(std::vector<float>(v.begin(), v.end()) ==
        std::vector<float>{-1.0f, -1.0f, -1.5f, -1.5f, -1.5f, -1.5f, -1.0f, -1.0f});
  // More writes while the reply is still held: the table owns its new block, no more copies.
  core.apply(range_push(0, 0, 0, 4, 1.0f));
  CHECK(core.cow_copies() == 1);
  CHECK(floats_of(reply) == std::vector<float>(8, -1.0f));
  // The reply gone (sent): writes are in place again.
  reply.reset();
  const float* now = std::as_const(core).table(0).values.data();
  core.apply(range_push(0, 0, 0, 4, 1.0f));
  CHECK(core.cow_copies() == 1);
  CHECK(std::as_const(core).table(0).values.data() == now);
  CHECK(v[0] == -3.0f);
  // A range of half the shard is shared too (the rows at their offset); a shorter range and
  // keyed rows are copies, which a later write does not copy again.
  auto half = core.reply_payload(pull(0, 0, 2, 2), alloc);
  CHECK(reinterpret_cast<const float*>(half.data()) == now + 4);
  auto one = core.reply_payload(pull(0, 0, 1, 1), alloc);
  auto keyed = core.reply_payload(keyed_pull(0, 0, {0, 3}), alloc);
  CHECK(reinterpret_cast<const float*>(one.data()) != now + 2);
  half.reset();
  core.apply(range_push(0, 0, 0, 4, 1.0f));
  CHECK(core.cow_copies() == 1);
  CHECK(floats_of(one) == std::vector<float>(2, -3.5f));  // row 1 before the push
  CHECK(keyed.size() == key_bytes(2) + 4 * sizeof(float));
}

TEST_CASE("shard_core: a push of the whole table is written out of place: a reply held keeps "
          "its bytes without a copy, a refused push leaves the values' block as it was, and two "
          "blocks take turns") {
  auto core = make_core();  // rows [0, 4) x 2, all 0
  std::string detail;
  const auto values = [&] {
    const auto& v = std::as_const(core).table(0).values;
    return std::vector<float>(v.begin(), v.end());
  };
  const auto block = [&] { return std::as_const(core).table(0).values.data(); };
  const float* first = block();
  auto reply = core.reply_payload(pull(0, 0, 0, 4), alloc);
  CHECK(reinterpret_cast<const float*>(reply.data()) == first);
  // The whole table pushed while the reply is held: no copy-on-write, a new block.
  auto m = range_push(0, 0, 0, 4, 1.0f);
  REQUIRE(!core.check_and_apply(m, detail));
  CHECK(core.cow_copies() == 0);
  const float* second = block();
  CHECK(second != first);
  CHECK(floats_of(reply) == std::vector<float>(8, 0.0f));
  CHECK(values() == std::vector<float>(8, -1.0f));
  // Refused (a NaN in the last row's last value): the values and their block are unchanged.
  auto bad = range_push(0, 0, 0, 4, 1.0f);
  bad.payload.floats()[7] = std::numeric_limits<float>::quiet_NaN();
  CHECK(core.check_and_apply(bad, detail) == errc::non_finite_value);
  CHECK(block() == second);
  CHECK(values() == std::vector<float>(8, -1.0f));
  // The reply sent: the next whole push reuses its block (the spare), then the two alternate.
  reply.reset();
  REQUIRE(!core.check_and_apply(m, detail));
  CHECK(block() == first);
  CHECK(values() == std::vector<float>(8, -2.0f));
  REQUIRE(!core.check_and_apply(m, detail));
  CHECK(block() == second);
  CHECK(values() == std::vector<float>(8, -3.0f));
  // A push of part of the table writes in place, copying nothing: no reply holds the values.
  auto part = range_push(0, 0, 1, 2, 1.0f);
  REQUIRE(!core.check_and_apply(part, detail));
  CHECK(block() == second);
  CHECK(core.cow_copies() == 0);
  CHECK(values() == std::vector<float>{-3.0f, -3.0f, -4.0f, -4.0f, -4.0f, -4.0f, -3.0f, -3.0f});
}

TEST_CASE("shard_core: replies read and dropped on another thread while pushes apply are "
          "never torn (a TSan stage: the release of a reply orders its reads before the "
          "shard's next write)") {
  auto core = make_core();
  int torn = 0;
  for (int round = 0; round < 100; ++round) {
    auto reply = core.reply_payload(pull(0, 0, 0, 4), alloc);
    // A transport sending from its own thread: reads every float, then drops the reply.
    std::thread sender([r = std::move(reply), &torn]() mutable {
      const auto f = r.floats();
      for (const float x : f) torn += x != f[0] ? 1 : 0;  // every push writes every row
      r.reset();
    });
    // In place (copy-on-write first), then out of place (a whole-table push checked and
    // applied: written to the spare block only when no reply holds it).
    std::string detail;
    core.apply(range_push(0, 0, 0, 4, 1.0f));
    for (int i = 0; i < 2; ++i) CHECK(!core.check_and_apply(range_push(0, 0, 0, 4, 1.0f), detail));
    sender.join();
  }
  CHECK(torn == 0);
  CHECK(core.cow_copies() <= 100);  // at most one copy per reply, none once it is dropped
  CHECK(core.table(0).values[0] == -300.0f);
}

TEST_CASE("shard_core: every writer of a table copies it first while a reply holds it") {
  auto core = make_core();
  shard_state st;
  core.apply(range_push(0, 0, 0, 4, 1.0f));  // every value -1
  core.save_state(st);
  core.apply(range_push(0, 0, 0, 4, 1.0f));  // every value -2
  const std::vector<float> ones(8, 1.0f);
  const auto held = [&] { return core.reply_payload(pull(0, 0, 0, 4), alloc); };
  std::uint64_t copies = 0;
  const auto check = [&](const buffer& reply, float before) {
    CHECK(core.cow_copies() == ++copies);
    CHECK(floats_of(reply) == std::vector<float>(8, before));
  };
  {
    auto r = held();
    REQUIRE(!core.restore_state(st));  // a checkpoint, a replica's state
    check(r, -2.0f);
  }
  {
    auto r = held();
    core.set_values(0, ones);  // a group server adopting the central model
    check(r, -1.0f);
  }
  {
    auto r = held();
    core.install_replica(0, std::vector<float>(8, 4.0f));  // a replica rebuilt
    check(r, 1.0f);
  }
  {
    auto r = held();
    auto big = range_push(0, 0, 0, 4, -10.0f);
    core.apply(big);
    CHECK(core.clip_rows(big, 5.0f) == 8);  // clipping writes the same (owned) block
    check(r, 4.0f);
    CHECK(core.table(0).values[0] == 5.0f);
  }
  {  // a snapshot copy of the values is a reader too
    const auto snapshot = core.table(0).values;
    core.apply(range_push(0, 0, 0, 4, 1.0f));
    CHECK(core.cow_copies() == ++copies);
    CHECK(snapshot[0] == 5.0f);
    CHECK(core.table(0).values[0] == 4.0f);
  }
}

TEST_CASE("shard_core: save_state and restore_state round-trip; a foreign state is refused") {
  auto core = make_core();
  core.apply(range_push(0, 0, 0, 4, 1.0f));
  core.count_push(0, 0);
  core.last_seq(0) = 5;
  core.advance(0, 3);
  core.advance(1, 2);
  shard_state st;
  core.save_state(st);
  CHECK(st.server_clock == 2);
  CHECK(st.applied == std::vector<std::uint64_t>{1, 0});
  CHECK(st.last_seq == std::vector<std::uint64_t>{5, 0});

  auto fresh = make_core();
  REQUIRE(!fresh.restore_state(st));
  CHECK(fresh.clock() == 2);
  CHECK(fresh.worker_clock(0) == 3);
  CHECK(fresh.applied(0, 0) == 1);
  CHECK(fresh.last_seq(0) == 5);
  CHECK(fresh.table(0).values == core.table(0).values);
  CHECK(fresh.has_state());

  const std::vector<table_spec> other{table_spec{0, 8, 3, 0.0f}};
  core_t wide(0, 2, 2, other, 42, optimizer::sgd{1.0f});
  CHECK(wide.restore_state(st) == errc::layout_mismatch);
  CHECK(wide.clock() == 0);  // unchanged
}

TEST_CASE("shard_core: the constructor names the bad field") {
  const std::vector<table_spec> layout{table_spec{0, 8, 2, 0.0f}};
  CHECK_THROWS_WITH_AS(core_t(2, 2, 1, layout, 1), doctest::Contains("shard must be < num_shards"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(core_t(0, 1, 0, layout, 1), doctest::Contains("num_workers"),
                       std::invalid_argument);
}

TEST_CASE("initial_values: the rows every shard starts with, whatever the sharding") {
  // Two tables, one random (init_scale > 0), one zeros; split three ways.
  const std::vector<table_spec> layout{table_spec{0, 7, 5, 0.25f}, table_spec{1, 4, 3, 0.0f}};
  const std::uint64_t seed = 0x1234'5678'9abc'def0ull;
  for (table_id t = 0; t < layout.size(); ++t) {
    const auto& spec = layout[t];
    std::vector<float> whole(spec.size());
    initial_values(spec, key_range{0, spec.rows}, seed, whole);
    for (std::uint32_t s = 0; s < 3; ++s) {
      const core_t core(s, 3, 1, layout, seed);
      const auto& table = core.table(t);
      REQUIRE(table.values.size() == std::size_t{table.range.size()} * spec.width);
      CHECK(std::memcmp(table.values.data(),
                        whole.data() + std::size_t{table.range.begin} * spec.width,
                        table.values.size() * sizeof(float)) == 0);
    }
    if (spec.init_scale > 0.0f) {
      float lo = whole[0], hi = whole[0];
      for (float v : whole) lo = std::min(lo, v), hi = std::max(hi, v);
      CHECK(lo >= -spec.init_scale);
      CHECK(hi <= spec.init_scale);
      CHECK(hi > lo);  // drawn, not constant
      std::vector<float> other(spec.size());
      initial_values(spec, key_range{0, spec.rows}, seed + 1, other);
      CHECK(std::memcmp(other.data(), whole.data(), whole.size() * sizeof(float)) != 0);
    } else {
      for (float v : whole) CHECK(v == 0.0f);
    }
  }
}

// ---- detail::server_protocol, stepped through a recording shell ----

namespace {

using test_time = std::chrono::steady_clock::time_point;

// A connection that only has an address (the protocol names a peer by it in log lines).
struct test_conn {
  std::string remote_endpoint() const { return "192.0.2.7:4242"; }
};

// A session: the protocol only reads and writes its sans-io state (and its address).
struct test_session : detail::server_session_state<test_time> {
  explicit test_session(int tag_) : tag(tag_) {}
  int tag;
  test_conn conn;
  std::list<test_session>::iterator self;
};

// The shell: records what the protocol asks it to do.
struct test_io {
  struct ctx_type {};  // recovery::none declares no hooks: the context is never used
  ctx_type ctx() { return {}; }
  void wake(test_session& s) { woken.push_back(s.tag); }
  void close(test_session& s) { closed.push_back(s.tag); }
  buffer allocate(std::size_t n) {
    if (fail_allocations > 0) {  // an allocator out of memory (e.g. a huge reply)
      --fail_allocations;
      throw std::bad_alloc();
    }
    return pool.allocate(n);
  }
  test_time now() const { return time; }
  void wake_watchdog() { ++watchdog_wakes; }
  void wake_sweeper() { ++sweeper_wakes; }

  std::vector<int> woken;
  std::vector<int> closed;
  test_time time{};
  int watchdog_wakes = 0;
  int sweeper_wakes = 0;
  int fail_allocations = 0;  ///< the next this many `allocate` calls throw std::bad_alloc
};

using proto_t = detail::server_protocol<consistency::ssp<0>, recovery::none, optimizer::sgd,
                                        test_session, test_time, test_io>;

server_options proto_options() {
  server_options o;
  o.shard = 0;
  o.num_shards = 2;
  o.num_workers = 2;
  o.tables = {table_spec{0, 8, 2, 0.0f}};
  o.log = [](std::string_view) {};  // refusals are expected here
  return o;
}

message
hello_from(std::uint32_t w, clock_value c = 0, std::uint32_t width = 2,
           std::uint32_t fingerprint = policy_fingerprint<consistency::ssp<0>, recovery::none>(),
           std::uint64_t incarnation = 1) {
  return protocol::encode(protocol::hello{.worker = w,
                                          .clock = c,
                                          .fingerprint = fingerprint,
                                          .incarnation = incarnation,
                                          .layout = {{8, width}}},
                          alloc);
}

// The message queued to `s` at `i`, and the error code of a queued error.
std::optional<errc> error_code_of(const test_session& s) {
  REQUIRE(!s.outbox.empty());
  protocol::error e;
  std::string detail;
  REQUIRE(!protocol::decode(s.outbox.back(), e, detail));
  return e.code;
}

struct stepped {
  explicit stepped(server_options o = proto_options())
      : proto{io, std::move(o), optimizer::sgd{1.0f}, {}} {}
  test_io io;
  proto_t proto;
  test_session& connect(int tag) { return proto.add_session(tag); }
  // A registered worker session `w`, its welcome taken out of the outbox.
  test_session& worker(std::uint32_t w) {
    auto& s = connect(static_cast<int>(w));
    auto h = hello_from(w);
    REQUIRE(proto.receive(s, h));
    REQUIRE(s.outbox.size() == 1);
    drain(s);
    return s;
  }
  // What basic_server's write loop does when the peer reads: writes every queued message.
  void drain(test_session& s) {
    std::swap(s.outbox, s.sending);
    for (auto& m : s.sending) {
      proto.send_started(s);
      proto.sent(s, m.payload.size());
    }
    s.sending.clear();
  }
};

}  // namespace

TEST_CASE("server_protocol: a good hello registers the worker and queues its welcome") {
  stepped t;
  auto& s = t.connect(0);
  auto h = hello_from(1);
  CHECK(t.proto.receive(s, h));
  CHECK(s.is_worker());
  CHECK(s.worker == 1);
  CHECK(t.proto.worker_session(1) == &s);
  REQUIRE(s.outbox.size() == 1);
  CHECK(t.io.woken == std::vector<int>{0});
  protocol::welcome w;
  std::string detail;
  REQUIRE(!protocol::decode(s.outbox[0], w, detail));
  CHECK(w.shard == 0);
  CHECK(w.num_shards == 2);
  CHECK(w.server_clock == 0);
  REQUIRE(w.tables.size() == 1);
  CHECK(w.tables[0].rows == 8);
  CHECK(w.tables[0].width == 2);
  CHECK(w.local_step == 1.0f);  // sgd's rate: the worker's read-my-writes step
  CHECK(t.proto.stats().rejected == 0);
}

TEST_CASE("server_protocol: a bad hello is refused with its code, then the session closes") {
  stepped t;
  SUBCASE("wrong fingerprint") {
    auto& s = t.connect(0);
    auto h = hello_from(0, 0, 2, 12345);
    CHECK(!t.proto.receive(s, h));
    CHECK(error_code_of(s) == errc::policy_mismatch);
    CHECK(!s.open);  // closes after flushing the error
    CHECK(!s.is_worker());
  }
  SUBCASE("bad layout") {
    auto& s = t.connect(0);
    auto h = hello_from(0, 0, 3);
    CHECK(!t.proto.receive(s, h));
    CHECK(error_code_of(s) == errc::layout_mismatch);
  }
  SUBCASE("worker id out of range") {
    auto& s = t.connect(0);
    auto h = hello_from(2);
    CHECK(!t.proto.receive(s, h));
    CHECK(error_code_of(s) == errc::bad_sender);
  }
  SUBCASE("hello clock 10^12") {
    auto& s = t.connect(0);
    auto h = hello_from(0, 1'000'000'000'000);
    CHECK(!t.proto.receive(s, h));
    CHECK(error_code_of(s) == errc::bad_clock);
  }
  SUBCASE("hello clock INT64_MAX") {
    auto& s = t.connect(0);
    auto h = hello_from(0, std::numeric_limits<clock_value>::max());
    CHECK(!t.proto.receive(s, h));
    CHECK(error_code_of(s) == errc::bad_clock);
  }
  SUBCASE("negative hello clock") {
    auto& s = t.connect(0);
    auto h = hello_from(0, -1);
    CHECK(!t.proto.receive(s, h));
    CHECK(error_code_of(s) == errc::bad_clock);
  }
  SUBCASE("not a hello first") {
    auto& s = t.connect(0);
    auto m = pull(0, 0, 0, 4);
    CHECK(!t.proto.receive(s, m));
    CHECK(error_code_of(s) == errc::unexpected_message);
  }
  CHECK(t.proto.stats().rejected == 1);
  CHECK(t.io.closed.empty());  // refused sessions are flushed, not cut
}

TEST_CASE("server_protocol: a push then a pull; a deferred pull is answered when the clock "
          "advances") {
  stepped t;
  auto& w0 = t.worker(0);
  auto& w1 = t.worker(1);
  auto p = range_push(0, 0, 0, 4, 0.5f);
  p.header.flags |= frame_flags::want_ack;
  p.header.seq = 1;
  CHECK(t.proto.receive(w0, p));
  CHECK(t.proto.stats().pushes == 1);
  REQUIRE(w0.outbox.size() == 1);
  CHECK(w0.outbox[0].header.type == message_type::ack);
  CHECK(w0.outbox[0].header.seq == 1);
  w0.outbox.clear();

  auto now = pull(0, 0, 0, 4);  // wants server clock 0: answered at once
  CHECK(t.proto.receive(w0, now));
  REQUIRE(w0.outbox.size() == 1);
  const auto& rows = w0.outbox[0];
  CHECK(rows.header.type == message_type::rows);
  CHECK(rows.header.clock == 0);
  CHECK(rows.header.seq == 1);  // pushes of worker 0 applied to table 0
  CHECK(payload_floats(rows)[0] == -0.5f);
  w0.outbox.clear();

  // Worker 0 ends clock 0 and asks for server clock 1: it waits for worker 1.
  auto c = range_push(0, 0, 0, 1, 0.0f);
  c.header.flags |= frame_flags::end_of_clock;
  CHECK(t.proto.receive(w0, c));
  CHECK(t.proto.core().worker_clock(0) == 1);
  auto later = pull(0, 1, 0, 4);
  t.proto.watchdog_idle = true;
  CHECK(t.proto.receive(w0, later));
  CHECK(w0.outbox.empty());
  CHECK(t.proto.stats().deferred_pulls == 1);
  CHECK(w0.pending_pulls == 1);
  CHECK(t.io.watchdog_wakes == 1);  // a pull waits: the sleeping watchdog is woken
  CHECK(!t.proto.watchdog_idle);

  message clk;
  clk.header.type = message_type::clock;
  clk.header.sender = 1;
  clk.header.clock = 0;
  CHECK(t.proto.receive(w1, clk));  // the server clock advances to 1
  CHECK(t.proto.core().clock() == 1);
  REQUIRE(w0.outbox.size() == 1);
  CHECK(w0.outbox[0].header.type == message_type::rows);
  CHECK(w0.outbox[0].header.clock == 1);
  CHECK(w0.pending_pulls == 0);
  CHECK(t.proto.core().pending().empty());
  CHECK(t.proto.stats().pulls == 2);
}

TEST_CASE("server_protocol: a rows reply still queued keeps its values while pushes apply") {
  stepped t;
  auto& w0 = t.worker(0);
  auto& w1 = t.worker(1);
  auto first = range_push(0, 0, 0, 4, 0.5f);  // every value -0.5
  CHECK(t.proto.receive(w0, first));
  w0.outbox.clear();
  auto p = pull(0, 0, 0, 4);
  CHECK(t.proto.receive(w0, p));
  REQUIRE(w0.outbox.size() == 1);
  REQUIRE(w0.outbox[0].header.type == message_type::rows);
  CHECK(t.proto.core().cow_copies() == 0);
  // Worker 1 pushes while worker 0's reply waits in its queue (or in the socket's write).
  auto second = range_push(1, 0, 0, 2, 1.0f);
  CHECK(t.proto.receive(w1, second));
  CHECK(t.proto.core().cow_copies() == 1);
  CHECK(floats_of(w0.outbox[0].payload) == std::vector<float>(8, -0.5f));
  CHECK(t.proto.core().table(0).values[0] == -1.5f);
  CHECK(t.proto.core().table(0).values[7] == -0.5f);
  // Sent: the next push writes in place.
  t.drain(w0);
  auto third = range_push(1, 0, 0, 4, 1.0f);
  CHECK(t.proto.receive(w1, third));
  CHECK(t.proto.core().cow_copies() == 1);
  CHECK(t.proto.core().table(0).values[7] == -1.5f);
}

TEST_CASE("server_protocol: a push with a bad row range is refused with its code") {
  stepped t;
  auto& w0 = t.worker(0);
  auto p = range_push(0, 0, 3, 2, 1.0f);  // rows [3, 5): past this shard's rows [0, 4)
  CHECK(!t.proto.receive(w0, p));
  CHECK(error_code_of(w0) == errc::bad_row_range);
  CHECK(!w0.open);
  CHECK(t.proto.stats().pushes == 0);
  CHECK(t.proto.stats().rejected == 1);
  CHECK(t.proto.core().table(0).values[6] == 0.0f);  // nothing applied
}

TEST_CASE("server_protocol: a worker that does not read its messages is closed") {
  auto o = proto_options();
  o.max_queued_messages = 2;
  test_io io;
  proto_t proto{io, o, optimizer::sgd{1.0f}, {}};
  auto& s = proto.add_session(0);
  auto h = hello_from(0);
  REQUIRE(proto.receive(s, h));  // the welcome: 1 queued
  auto a = pull(0, 0, 0, 4);
  REQUIRE(proto.receive(s, a));  // rows: 2 queued
  auto b = pull(0, 0, 0, 4);
  CHECK(proto.receive(s, b));  // a third: over the limit, the connection is cut
  CHECK(io.closed == std::vector<int>{0});
  CHECK(!s.open);
  CHECK(s.outbox.size() == 2);
}

TEST_CASE("server_protocol: a finished session is forgotten with its waiting pulls") {
  stepped t;
  auto& w0 = t.worker(0);
  auto later = pull(0, 0, 0, 4);
  auto c = range_push(0, 0, 0, 1, 0.0f);
  c.header.flags |= frame_flags::end_of_clock;
  REQUIRE(t.proto.receive(w0, c));
  later.header.clock = 1;
  REQUIRE(t.proto.receive(w0, later));
  REQUIRE(t.proto.core().pending().size() == 1);
  t.proto.session_finished(w0);
  CHECK(t.proto.core().pending().empty());
  CHECK(t.proto.worker_session(0) == nullptr);
  CHECK(t.proto.sessions().empty());
  CHECK(t.io.watchdog_wakes == 1);  // the last worker left: the watchdog goes to sleep
}

TEST_CASE("server_protocol: hello clocks are bounded; refusals leave the other workers be") {
  stepped t;
  SUBCASE("a shard that knows no connected worker takes a rejoining clock as it comes") {
    // e.g. restarted without state: the first worker back says where training is.
    auto& s0 = t.connect(0);
    auto h0 = hello_from(0, 5918);
    CHECK(t.proto.receive(s0, h0));
    CHECK(t.proto.core().worker_clock(0) == 5918);
    auto& s1 = t.connect(1);
    auto h1 = hello_from(1, 5917);
    CHECK(t.proto.receive(s1, h1));
    CHECK(t.proto.core().clock() == 5917);
    CHECK(t.proto.stats().rejoins == 2);
  }
  SUBCASE("up to max_clock alone; a worker at max_clock cannot push (its clock cannot move)") {
    auto& s0 = t.connect(0);
    auto h0 = hello_from(0, protocol::max_clock);
    CHECK(t.proto.receive(s0, h0));
    auto p = range_push(0, protocol::max_clock, 0, 4, 0.5f);
    p.header.flags |= frame_flags::end_of_clock;
    CHECK(!t.proto.receive(s0, p));
    CHECK(error_code_of(s0) == errc::bad_clock);
    CHECK(t.proto.core().worker_clock(0) == protocol::max_clock);
  }
  SUBCASE("past max_clock, or past the connected workers that trained by more than s + 1 + "
          "rejoin_slack") {
    auto& w1 = t.worker(1);  // ssp<0>: a worker leads by at most 1 clock
    auto p = range_push(1, 0, 0, 4, 0.5f);
    p.header.flags |= frame_flags::end_of_clock;
    CHECK(t.proto.receive(w1, p));  // worker 1 trains here: its clock bounds hellos now
    CHECK(t.proto.core().worker_clock(1) == 1);
    auto& a = t.connect(10);
    auto too_far = hello_from(0, 1 + 1 + 1 + 1 + protocol::rejoin_slack);
    CHECK(!t.proto.receive(a, too_far));
    CHECK(error_code_of(a) == errc::bad_clock);
    auto& b = t.connect(11);
    auto huge = hello_from(0, protocol::max_clock + 1);
    CHECK(!t.proto.receive(b, huge));
    CHECK(error_code_of(b) == errc::bad_clock);
    CHECK(t.proto.stats().rejected == 2);
    // Worker 1 is unaffected: its clock, the server clock, its pushes.
    CHECK(t.proto.core().worker_clock(0) == 0);
    CHECK(t.proto.core().clock() == 0);
    auto p2 = range_push(1, 1, 0, 4, 0.5f);
    p2.header.flags |= frame_flags::end_of_clock;
    CHECK(t.proto.receive(w1, p2));
    CHECK(t.proto.core().worker_clock(1) == 2);
    // The most a rejoin may lead by is accepted.
    auto& c = t.connect(12);
    auto edge = hello_from(0, 2 + 0 + 1 + protocol::rejoin_slack);
    CHECK(t.proto.receive(c, edge));
  }
}

TEST_CASE("server_protocol: a hello with a connected worker's id takes the id over when the "
          "holder is silent or the same process") {
  // e.g. the id is held by a dead (half-open) connection: a hello of the same incarnation, or
  // any hello once the holder has been silent for takeover_silence, wins; the old connection
  // is told why and closed. (A hello of another incarnation while the holder is heard from
  // is refused: tests/unit/insider_test.cpp.)
  stepped t;
  auto& old = t.connect(0);
  auto h = hello_from(0, 0, 2, policy_fingerprint<consistency::ssp<0>, recovery::none>(), 7);
  REQUIRE(t.proto.receive(old, h));
  old.outbox.clear();
  auto p = range_push(0, 0, 0, 4, 0.5f);
  p.header.seq = 3;
  REQUIRE(t.proto.receive(old, p));
  std::uint64_t incarnation = 0;
  SUBCASE("another incarnation (the worker restarted), the holder silent") {
    incarnation = 8;
    t.io.time += proto_options().takeover_silence;
  }
  SUBCASE("the same incarnation (its old connection is stale)") { incarnation = 7; }
  auto& next = t.connect(1);
  auto h2 =
      hello_from(0, 0, 2, policy_fingerprint<consistency::ssp<0>, recovery::none>(), incarnation);
  CHECK(t.proto.receive(next, h2));
  CHECK(t.proto.worker_session(0) == &next);
  CHECK(t.proto.stats().takeovers == 1);
  CHECK(t.proto.stats().rejected == 0);
  CHECK(error_code_of(old) == errc::duplicate_worker);  // told why, closed after the flush
  CHECK(!old.open);
  // The welcome numbers the worker's next messages above those the shard applied.
  protocol::welcome w;
  std::string detail;
  REQUIRE(next.outbox.size() == 1);
  REQUIRE(!protocol::decode(next.outbox[0], w, detail));
  CHECK(w.last_seq == 3);
  CHECK(w.worker_clock == 0);
  // Whatever the old connection still sends is ignored; the new one is served.
  auto stale = range_push(0, 0, 0, 4, 100.0f);
  stale.header.seq = 4;
  CHECK(!t.proto.receive(old, stale));
  CHECK(t.proto.stats().pushes == 1);
  auto fresh = range_push(0, 0, 0, 4, 0.5f);
  fresh.header.flags |= frame_flags::end_of_clock;
  fresh.header.seq = 4;
  CHECK(t.proto.receive(next, fresh));
  CHECK(t.proto.stats().pushes == 2);
  CHECK(t.proto.core().table(0).values[0] == -1.0f);
  CHECK(t.proto.core().worker_clock(0) == 1);
  // The old session's end does not unregister the new one.
  t.proto.session_finished(old);
  CHECK(t.proto.worker_session(0) == &next);
}

// ---- hostile input (issue 15) ----

namespace {

// A keyed push of `keys` by worker `w` at clock `c`, every value `g`.
message keyed_push(std::uint32_t w, clock_value c, std::vector<row_id> keys, float g) {
  message m;
  m.header.type = message_type::push;
  m.header.sender = w;
  m.header.clock = c;
  m.header.row_count = static_cast<std::uint32_t>(keys.size());
  m.header.width = 2;
  const std::size_t kb = key_bytes(m.header.row_count);
  m.payload = pool.allocate(kb + keys.size() * 2 * sizeof(float));
  std::memset(m.payload.data(), 0, kb);
  std::memcpy(m.payload.data(), keys.data(), keys.size() * sizeof(row_id));
  auto* f = reinterpret_cast<float*>(m.payload.data() + kb);
  for (std::size_t i = 0; i < keys.size() * 2; ++i) f[i] = g;
  return m;
}

}  // namespace

TEST_CASE("server_protocol: sparse pulls and pushes with repeated or unordered keys are refused") {
  stepped t;
  auto& w0 = t.worker(0);
  // 2^20 copies of one key would make a reply 2 floats per copy: refused before any reply.
  auto dup = keyed_pull(0, 0, std::vector<row_id>(1u << 12, 1));
  CHECK(!t.proto.receive(w0, dup));
  REQUIRE(w0.outbox.size() == 1);  // the error frame only: no rows were built
  CHECK(error_code_of(w0) == errc::bad_key_order);
  CHECK(std::error_code(errc::bad_key_order) == condition::protocol_violation);

  auto& w1 = t.worker(1);
  auto unordered = keyed_push(1, 0, {2, 1}, 1.0f);
  CHECK(!t.proto.receive(w1, unordered));
  CHECK(error_code_of(w1) == errc::bad_key_order);
  CHECK(t.proto.core().table(0).values[2] == 0.0f);  // nothing applied

  std::string detail;
  CHECK(t.proto.core().check_rows(keyed_pull(0, 0, {0, 3, 3}), detail) == errc::bad_key_order);
  CHECK(detail == " (key 2 is row 3, after row 3)");
  CHECK(!t.proto.core().check_rows(keyed_pull(0, 0, {0, 1, 3}), detail));
}

TEST_CASE("server_protocol: a finite push that would make parameters infinite is refused whole") {
  stepped t;
  auto& w0 = t.worker(0);
  // sgd with rate 1: rows 0 and 1 move to +3.4e38 (finite).
  auto first = range_push(0, 0, 0, 2, -3.4e38f);
  REQUIRE(t.proto.receive(w0, first));
  const auto before = t.proto.core().table(0).values;
  CHECK(before[0] == 3.4e38f);
  CHECK(before[4] == 0.0f);
  // Rows [0, 4) again: rows 0 and 1 would overflow, rows 2 and 3 would not.
  auto second = range_push(0, 0, 0, 4, -3.4e38f);
  CHECK(!t.proto.receive(w0, second));
  CHECK(error_code_of(w0) == errc::non_finite_update);
  CHECK(std::error_code(errc::non_finite_update) == condition::fatal);
  CHECK(t.proto.core().table(0).values == before);  // nothing applied, rows 2-3 included
  CHECK(t.proto.core().table(0).step == 1);
  CHECK(t.proto.stats().pushes == 1);
  CHECK(t.proto.core().applied(0, 0) == 1);
  // A keyed push likewise.
  auto& w1 = t.worker(1);
  auto keyed = keyed_push(1, 0, {1, 2}, -3.4e38f);
  CHECK(!t.proto.receive(w1, keyed));
  CHECK(error_code_of(w1) == errc::non_finite_update);
  CHECK(t.proto.core().table(0).values == before);
}

TEST_CASE("shard_core: check_update refuses what would make optimizer state non-finite, in "
          "every chunk") {
  // AdaGrad: a += g^2 overflows for g = 3e38 although p stays finite.
  const std::vector<table_spec> small{table_spec{0, 4, 2, 0.0f}};
  detail::shard_core<optimizer::adagrad, int, int> ada(0, 1, 1, small, 1, optimizer::adagrad{});
  auto m = range_push(0, 0, 0, 4, 3e38f);
  std::string detail;
  CHECK(ada.check_update(m, detail) == errc::non_finite_update);
  CHECK(detail.find("table 0") != std::string::npos);
  auto ok = range_push(0, 0, 0, 4, 1.0f);
  CHECK(!ada.check_update(ok, detail));
  ada.apply(ok);
  // Adam: v overflows likewise.
  detail::shard_core<optimizer::adam, int, int> adam(0, 1, 1, small, 1, optimizer::adam{});
  CHECK(adam.check_update(m, detail) == errc::non_finite_update);
  CHECK(!adam.check_update(ok, detail));
  // Momentum: v = 0.9 v + g, p -= lr v: fine once, then p overflows.
  detail::shard_core<optimizer::momentum, int, int> mom(0, 1, 1, small, 1,
                                                        optimizer::momentum{1.0f, 0.9f});
  auto big = range_push(0, 0, 0, 4, -3e38f);
  REQUIRE(!mom.check_update(big, detail));
  mom.apply(big);
  CHECK(mom.check_update(big, detail) == errc::non_finite_update);

  // A table larger than one chunk: the overflow sits in the last row only.
  const std::uint32_t rows = 3 * core_t::check_chunk / 2 + 1;
  const std::vector<table_spec> wide{table_spec{0, rows, 2, 0.0f}};
  core_t big_core(0, 1, 1, wide, 1, optimizer::sgd{1.0f});
  message last;
  last.header.type = message_type::push;
  last.header.flags = frame_flags::range;
  last.header.first_row = rows - 1;
  last.header.row_count = 1;
  last.header.width = 2;
  last.payload = pool.allocate(2 * sizeof(float));
  const float g[2] = {-3.4e38f, -3.4e38f};
  std::memcpy(last.payload.data(), g, sizeof g);
  big_core.apply(last);  // the last row is now 3.4e38
  auto all = range_push(0, 0, 0, rows, 0.0f);
  auto* f = reinterpret_cast<float*>(all.payload.data());
  f[std::size_t{rows} * 2 - 1] = -3.4e38f;
  CHECK(big_core.check_update(all, detail) == errc::non_finite_update);
  CHECK(detail.find("row " + std::to_string(rows - 1)) != std::string::npos);

  // A NaN in the push itself, in its last chunk: refused as a non-finite value (the push's
  // values are checked chunk by chunk with the update they make, not in a pass of their own),
  // naming the row; nothing is written.
  const auto values_before = big_core.table(0).values;
  auto nan_last = range_push(0, 0, 0, rows, 0.0f);
  reinterpret_cast<float*>(nan_last.payload.data())[std::size_t{rows} * 2 - 2] =
      std::numeric_limits<float>::quiet_NaN();
  CHECK(big_core.check_update(nan_last, detail) == errc::non_finite_value);
  CHECK(detail.find("row " + std::to_string(rows - 1)) != std::string::npos);
  CHECK(big_core.table(0).values == values_before);
}

namespace fused {

// A push of table 0 (width `w`): rows [first, first + rows) when `keys` is empty, else the
// rows `keys`; the gradient `g` (rows x w floats).
message push(std::uint32_t w, row_id first, std::uint32_t rows, const std::vector<row_id>& keys,
             const std::vector<float>& g) {
  message m;
  m.header.type = message_type::push;
  m.header.width = w;
  const std::size_t kb = keys.empty() ? 0 : key_bytes(static_cast<std::uint32_t>(keys.size()));
  if (keys.empty()) {
    m.header.flags = frame_flags::range;
    m.header.first_row = first;
    m.header.row_count = rows;
  } else {
    m.header.row_count = static_cast<std::uint32_t>(keys.size());
  }
  m.payload = pool.allocate(kb + g.size() * sizeof(float));
  // An empty `keys` has a null data(): memcpy must not see it (UBSan's nonnull check).
  std::memset(m.payload.data(), 0, kb);
  if (!keys.empty()) std::memcpy(m.payload.data(), keys.data(), keys.size() * sizeof(row_id));
  std::memcpy(m.payload.data() + kb, g.data(), g.size() * sizeof(float));
  return m;
}

// Whether two shards' table 0 hold the same bits: values, optimizer state, step, versions.
template <class Core>
bool same_table(const Core& a, const Core& b) {
  const auto& x = a.table(0);
  const auto& y = b.table(0);
  const auto bits = [](std::span<const float> u, std::span<const float> v) {
    return u.size() == v.size() &&
           (u.empty() || std::memcmp(u.data(), v.data(), u.size() * sizeof(float)) == 0);
  };
  return bits(x.values, y.values) && bits(x.state, y.state) && x.step == y.step &&
         x.version == y.version && x.row_version == y.row_version &&
         x.all_changed == y.all_changed && a.has_state() == b.has_state();
}

// Pushes of every shape over a table of `rows` x `w` (several chunks: a range over all rows,
// a range of a few rows, keyed rows), gradients drawn from `rng` in [-scale, scale].
template <class Opt>
void check_same_bits(Opt opt, std::uint32_t rows, std::uint32_t w) {
  using core = detail::shard_core<Opt, int, int>;
  const std::vector<table_spec> layout{table_spec{0, rows, w, 0.5f}};
  core fused(0, 1, 1, layout, 7, opt);
  core split(0, 1, 1, layout, 7, opt);
  REQUIRE(same_table(fused, split));
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  const auto grads = [&](std::size_t n) {
    std::vector<float> g(n);
    for (float& x : g) x = d(rng);
    return g;
  };
  std::vector<message> pushes;
  pushes.push_back(push(w, 0, rows, {}, grads(std::size_t{rows} * w)));
  pushes.push_back(push(w, 1, 3, {}, grads(std::size_t{3} * w)));
  pushes.push_back(push(w, 0, 0, {0, 2, rows - 1}, grads(std::size_t{3} * w)));
  pushes.push_back(push(w, 0, rows, {}, grads(std::size_t{rows} * w)));
  std::string detail;
  for (const auto& m : pushes) {
    REQUIRE(!split.check_update(m, detail));
    split.apply(m);
    REQUIRE(!fused.check_and_apply(m, detail));
    CHECK(same_table(fused, split));
  }
}

// A push whose bad float sits in its last chunk is refused whole: every chunk applied before
// it is undone, to the bit (values, optimizer state, step, versions).
template <class Opt>
void check_undone(Opt opt, std::uint32_t rows, std::uint32_t w, float bad, std::error_code want) {
  using core = detail::shard_core<Opt, int, int>;
  const std::vector<table_spec> layout{table_spec{0, rows, w, 0.5f}};
  core c(0, 1, 1, layout, 7, opt);
  core before(0, 1, 1, layout, 7, opt);
  std::string detail;
  const std::vector<float> ones(std::size_t{rows} * w, 0.25f);  // non-zero optimizer state
  REQUIRE(!c.check_and_apply(push(w, 0, rows, {}, ones), detail));
  REQUIRE(!before.check_and_apply(push(w, 0, rows, {}, ones), detail));
  // Ranged, all rows: the last float is bad.
  auto g = ones;
  g.back() = bad;
  CHECK(c.check_and_apply(push(w, 0, rows, {}, g), detail) == want);
  CHECK(detail.find("table 0, at or after row ") != std::string::npos);  // the chunk's first
  CHECK(same_table(c, before));
  // Keyed: the last key's last float is bad.
  std::vector<float> k(std::size_t{3} * w, 0.25f);
  k.back() = bad;
  CHECK(c.check_and_apply(push(w, 0, 0, {0, 1, rows - 1}, k), detail) == want);
  CHECK(detail.find("row " + std::to_string(rows - 1)) != std::string::npos);
  CHECK(same_table(c, before));
  // And the shard goes on: the same push without the bad float applies as on a twin.
  REQUIRE(!c.check_and_apply(push(w, 0, rows, {}, ones), detail));
  REQUIRE(!before.check_and_apply(push(w, 0, rows, {}, ones), detail));
  CHECK(same_table(c, before));
}

}  // namespace fused

TEST_CASE("shard_core: check_and_apply gives the bits of check_update then apply") {
  constexpr auto chunk = static_cast<std::uint32_t>(core_t::check_chunk);
  // Tables whose state planes are aligned like the values (rows x width a multiple of 4:
  // the chunked pass), with pushes starting off alignment, and one that is not (check, then
  // apply, for Adam's second plane).
  for (const auto& dims :
       {std::pair{chunk + 8, 2u}, std::pair{8u, chunk + 6}, std::pair{9u, chunk + 5}}) {
    const std::uint32_t rows = dims.first;  // (not a structured binding: CAPTURE is a lambda)
    const std::uint32_t w = dims.second;
    CAPTURE(rows);
    CAPTURE(w);
    fused::check_same_bits(optimizer::sgd{0.1f}, rows, w);
    fused::check_same_bits(optimizer::momentum{0.05f, 0.9f}, rows, w);
    fused::check_same_bits(optimizer::adagrad{0.05f, 1e-8f}, rows, w);
    fused::check_same_bits(optimizer::adam{}, rows, w);
  }
}

TEST_CASE("shard_core: check_and_apply refuses a push whole, undoing the chunks it applied") {
  constexpr auto chunk = static_cast<std::uint32_t>(core_t::check_chunk);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Tables whose state planes are aligned like the values (rows x width a multiple of 4:
  // the chunked pass), with pushes starting off alignment, and one that is not (check, then
  // apply, for Adam's second plane).
  for (const auto& dims :
       {std::pair{chunk + 8, 2u}, std::pair{8u, chunk + 6}, std::pair{9u, chunk + 5}}) {
    const std::uint32_t rows = dims.first;  // (not a structured binding: CAPTURE is a lambda)
    const std::uint32_t w = dims.second;
    CAPTURE(rows);
    CAPTURE(w);
    const std::error_code value = errc::non_finite_value;
    const std::error_code update = errc::non_finite_update;
    fused::check_undone(optimizer::sgd{1.0f}, rows, w, nan, value);
    fused::check_undone(optimizer::sgd{1.0f}, rows, w, -3.4e38f * 2.0f, value);  // infinity
    fused::check_undone(optimizer::momentum{0.05f, 0.9f}, rows, w, nan, value);
    fused::check_undone(optimizer::adam{}, rows, w, nan, value);
    // Finite, but the update is not: sgd's value (0.5 - 1 * -3.4e38 overflows after two),
    // AdaGrad's and Adam's state (g^2 overflows).
    fused::check_undone(optimizer::sgd{1e30f}, rows, w, -3.4e38f, update);
    fused::check_undone(optimizer::adagrad{0.05f, 1e-8f}, rows, w, 3e38f, update);
    fused::check_undone(optimizer::adam{}, rows, w, 3e38f, update);
  }
}

TEST_CASE("server_protocol: out of memory while handling a message refuses that session and "
          "frees its worker id") {
  stepped t;
  auto& w0 = t.worker(0);
  t.io.fail_allocations = 1;  // the rows reply (keyed rows: a copy) cannot be allocated
  auto p = keyed_pull(0, 0, {0, 1});
  CHECK(!t.proto.receive(w0, p));
  CHECK(error_code_of(w0) == errc::resource_exhausted);
  CHECK(!w0.open);
  CHECK(t.proto.stats().rejected == 1);
  t.proto.session_finished(w0);  // the shell's loops end once the error is flushed
  CHECK(t.proto.worker_session(0) == nullptr);
  auto& again = t.worker(0);  // the worker id is free: a new hello is welcomed
  CHECK(t.proto.worker_session(0) == &again);

  // Not even the error frame can be allocated: the connection is closed at once.
  t.io.fail_allocations = 2;
  auto q = keyed_pull(0, 0, {0, 1});
  CHECK(!t.proto.receive(again, q));
  CHECK(!again.open);
  CHECK(t.io.closed == std::vector<int>{0});
}

TEST_CASE("server_protocol: peer text in log lines is bounded and escaped; rejections name the "
          "address; row ranges print without wrapping") {
  std::vector<std::string> lines;
  auto o = proto_options();
  o.log = [&](std::string_view l) { lines.emplace_back(l); };
  test_io io;
  proto_t proto{io, o, optimizer::sgd{1.0f}, {}};
  auto& stranger = proto.add_session(9);
  auto m = pull(0, 0, 0, 4);
  CHECK(!proto.receive(stranger, m));
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("unidentified peer 192.0.2.7:4242") != std::string::npos);

  auto& w = proto.add_session(0);
  auto h = hello_from(0);
  REQUIRE(proto.receive(w, h));
  std::string reason = "ok\nasyncps server 0: forged line\x1b[31m\\";
  reason += std::string(1 << 20, 'A');
  auto e =
      protocol::encode(protocol::error{.sender = 0, .code = std::nullopt, .reason = reason}, alloc);
  REQUIRE(proto.receive(w, e));
  REQUIRE(lines.size() == 2);
  const std::string& l = lines[1];
  CHECK(l.size() < 1200);
  CHECK(l.find('\n') == std::string::npos);
  CHECK(l.find('\x1b') == std::string::npos);
  CHECK(l.find("worker 0 192.0.2.7:4242 reported an error: ok\\x0aasyncps server 0: forged "
               "line\\x1b[31m\\x5c") != std::string::npos);
  CHECK(l.find("(" + std::to_string(reason.size()) + " bytes)") != std::string::npos);

  std::string detail;
  auto wrap = range_push(0, 0, 0, 1, 1.0f);
  wrap.header.first_row = std::numeric_limits<std::uint64_t>::max();
  CHECK(proto.core().check_rows(wrap, detail) == errc::bad_row_range);
  CHECK(detail.find("first row 18446744073709551615, 1 rows") != std::string::npos);
  CHECK(detail.find(", 0)") == std::string::npos);
}

TEST_CASE("peer_text: escapes control and non-ASCII bytes and bounds the length") {
  CHECK(detail::peer_text("plain text") == "plain text");
  CHECK(detail::peer_text(std::string_view("a\0b\r\n\xff\\", 7)) == "a\\x00b\\x0d\\x0a\\xff\\x5c");
  CHECK(detail::peer_text("abcdef", 3) == "abc... (6 bytes)");
  CHECK(detail::peer_text(std::string(10000, '\x07')).size() <= 4 * 200 + 32);
}

TEST_CASE("server_protocol: a hello at the largest clock is refused, so no clock overflows") {
  // Found while writing the `frame` fuzz target (its seed regression_clock_overflow): a hello
  // could rejoin at any clock >= 0, so a worker could reach clock INT64_MAX and its clock
  // message then overflowed `clock + 1`. Since wire version 3 hello clocks lie in
  // [0, protocol::max_clock] (the test above covers a worker at max_clock).
  constexpr clock_value top = std::numeric_limits<clock_value>::max();
  stepped t;
  auto& s = t.connect(0);
  auto h = hello_from(0, top);
  CHECK(!t.proto.receive(s, h));
  CHECK(error_code_of(s) == errc::bad_clock);
  CHECK(t.proto.worker_session(0) == nullptr);
  CHECK(t.proto.core().clock() == 0);
}

// ---- resource bounds across connections, and deadlines (issue 15) ----

namespace {

using namespace std::chrono_literals;

bool has_line(const std::vector<std::string>& lines, std::string_view what) {
  for (const auto& l : lines)
    if (l.find(what) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("server_protocol: over the server-wide queue budget the largest queue is closed; "
          "the other connections keep every message") {
  std::vector<std::string> lines;
  auto o = proto_options();
  o.num_workers = 3;
  o.tables = {table_spec{0, 8, 16, 0.0f}};  // shard 0: rows [0, 4); one row is 64 bytes
  o.max_total_queued_bytes = 200;
  o.log = [&](std::string_view l) { lines.emplace_back(l); };
  stepped t(o);
  auto hello = [&](std::uint32_t w) -> test_session& {
    auto& s = t.connect(static_cast<int>(w));
    auto h = hello_from(w, 0, 16);
    REQUIRE(t.proto.receive(s, h));
    t.drain(s);
    return s;
  };
  auto& w0 = hello(0);
  auto& w1 = hello(1);
  auto& w2 = hello(2);
  REQUIRE(t.proto.total_queued_bytes() == 0);
  // Worker 0 does not read: two replies of one row stay queued; worker 1 has one.
  for (int i = 0; i < 2; ++i) {
    auto p = pull(0, 0, 0, 1);
    REQUIRE(t.proto.receive(w0, p));
  }
  auto p1 = pull(1, 0, 0, 1);
  REQUIRE(t.proto.receive(w1, p1));
  REQUIRE(w0.outbox.size() == 2);
  REQUIRE(w0.queued_bytes == 128);
  CHECK(t.proto.total_queued_bytes() == 192);
  CHECK(t.proto.stats().over_budget_closes == 0);
  // Worker 2's reply would make 256 > 200: worker 0, the largest queue, is closed at once.
  auto p2 = pull(2, 0, 0, 1);
  CHECK(t.proto.receive(w2, p2));
  CHECK(t.io.closed == std::vector<int>{0});
  CHECK(!w0.open);
  CHECK(t.proto.stats().over_budget_closes == 1);
  CHECK(t.proto.stats().rejected == 0);
  CHECK(w1.open);
  CHECK(w1.outbox.size() == 1);
  CHECK(w2.open);
  REQUIRE(w2.outbox.size() == 1);  // queued, not dropped
  CHECK(w2.outbox[0].header.type == message_type::rows);
  CHECK(t.proto.total_queued_bytes() == 128);
  CHECK(has_line(lines, "closing connection of worker 0 192.0.2.7:4242: the server's queued "
                        "bytes would exceed max_total_queued_bytes 200 (all connections hold "
                        "192 bytes; this one holds 128 bytes in 2 messages, the largest queue; "
                        "64 more bytes were to be queued to worker 2 192.0.2.7:4242)"));
  // The closed session's messages no longer count, neither when its write loop drops them
  // nor when it ends.
  t.drain(w0);
  t.proto.session_finished(w0);
  CHECK(t.proto.total_queued_bytes() == 128);

  // A reply larger than the whole budget (4 rows: 256 bytes) closes its own connection; the
  // others are left alone.
  auto all = pull(1, 0, 0, 4);
  CHECK(t.proto.receive(w1, all));
  CHECK(!w1.open);
  CHECK(w1.outbox.size() == 1);  // its earlier reply only
  CHECK(w2.open);
  CHECK(t.proto.stats().over_budget_closes == 2);
  CHECK(t.io.closed == std::vector<int>{0, 1});
  CHECK(t.proto.total_queued_bytes() == 64);
  t.drain(w2);
  CHECK(t.proto.total_queued_bytes() == 0);
}

TEST_CASE("server_protocol: a connection without a hello within hello_timeout is refused with "
          "timeout; the sweeper's timer is armed only while something is watched") {
  std::vector<std::string> lines;
  auto o = proto_options();
  o.hello_timeout = 10s;
  o.send_timeout = 60s;
  o.log = [&](std::string_view l) { lines.emplace_back(l); };
  stepped t(o);
  const test_time start{};
  CHECK(!t.proto.sweep());  // nothing to watch: no timer
  auto& quiet = t.connect(5);
  CHECK(t.io.sweeper_wakes == 1);  // the sleeping sweeper learns of the deadline
  t.io.time = start + 4s;
  auto& w = t.worker(0);  // greeted at 4 s: its deadline ends with its hello
  auto next = t.proto.sweep();
  REQUIRE(next);
  CHECK(*next == start + 10s);
  t.io.time = start + 10s - 1ms;
  CHECK(t.proto.sweep() == start + 10s - 1ms + 1250ms);  // not yet; at most 1/8 late
  CHECK(quiet.open);
  t.io.time = start + 10s;
  CHECK(!t.proto.sweep());  // refused; nothing left to watch
  CHECK(!quiet.open);
  CHECK(error_code_of(quiet) == errc::timeout);  // told why, closed after the flush
  CHECK(t.io.closed.empty());
  CHECK(t.proto.stats().rejected == 1);
  CHECK(has_line(lines, "closing connection of unidentified peer 192.0.2.7:4242: operation "
                        "timed out (no hello or other valid first message within 10000 ms"));
  CHECK(w.open);  // the worker is not affected
  CHECK(t.proto.worker_session(0) == &w);

  // A connection that says hello in time disarms the timer at once (a simulation stays
  // quiescent): the sweeper is woken to sleep.
  const int wakes = t.io.sweeper_wakes;
  auto& late = t.connect(6);
  CHECK(t.io.sweeper_wakes == wakes + 1);
  auto h = hello_from(1);
  REQUIRE(t.proto.receive(late, h));
  CHECK(t.io.sweeper_wakes == wakes + 2);
  CHECK(!t.proto.sweep());
}

TEST_CASE("server_protocol: a write stalled for send_timeout closes its connection; time "
          "between messages does not count") {
  std::vector<std::string> lines;
  auto o = proto_options();
  o.send_timeout = 60s;
  o.log = [&](std::string_view l) { lines.emplace_back(l); };
  stepped t(o);
  const test_time start{};
  auto& w0 = t.worker(0);
  auto& w1 = t.worker(1);
  CHECK(!t.proto.sweep());
  // Worker 0's reply: the write loop starts writing it and the write never completes.
  auto p0 = pull(0, 0, 0, 4);
  REQUIRE(t.proto.receive(w0, p0));
  std::swap(w0.outbox, w0.sending);
  const std::size_t n = w0.sending[0].payload.size();
  t.proto.send_started(w0);
  CHECK(t.proto.sweep() == start + 60s);
  // Worker 1 keeps reading its replies.
  for (int i = 1; i < 6; ++i) {
    t.io.time = start + i * 10s;
    auto p = pull(1, 0, 0, 4);
    REQUIRE(t.proto.receive(w1, p));
    t.drain(w1);
    CHECK(t.proto.sweep());
    CHECK(w0.open);
  }
  t.io.time = start + 60s;
  CHECK(!t.proto.sweep());
  CHECK(!w0.open);
  CHECK(t.io.closed == std::vector<int>{0});  // at once: it reads nothing, not even an error
  CHECK(t.proto.stats().rejected == 1);
  CHECK(has_line(lines, "closing connection of worker 0 192.0.2.7:4242: a write has not "
                        "completed for 60000 ms (send_timeout; 1 messages, " +
                            std::to_string(n) + " bytes queued): the peer does not read"));
  t.proto.sent(w0, n);  // the aborted write
  w0.sending.clear();
  CHECK(t.proto.total_queued_bytes() == 0);
  // Worker 1 was idle between its messages, then computes for ten minutes: never closed.
  t.io.time = start + 11min;
  CHECK(!t.proto.sweep());
  CHECK(w1.open);
  auto p = pull(1, 0, 0, 4);
  CHECK(t.proto.receive(w1, p));
  CHECK(w1.outbox.size() == 1);
}

TEST_CASE("server_protocol: the keys of waiting pulls are bounded across connections") {
  // Each connection may have max_pending_pulls waiting; together their keys stay within
  // max_total_pending_pull_bytes: the pull that would exceed it is refused, the others wait.
  auto o = proto_options();
  o.num_workers = 3;
  constexpr std::uint64_t k = key_bytes(1);  // up to four keys (padded to 16 bytes)
  o.max_total_pending_pull_bytes = 2 * k;
  stepped t(o);
  auto& w0 = t.worker(0);
  auto& w1 = t.worker(1);
  t.worker(2);                        // stays at clock 0: the server clock stays 0
  for (std::uint32_t w : {0u, 1u}) {  // workers 0 and 1 end clock 0: their pulls of 1 wait
    auto c = range_push(w, 0, 0, 1, 0.0f);
    c.header.flags |= frame_flags::end_of_clock;
    REQUIRE(t.proto.receive(w == 0 ? w0 : w1, c));
  }
  const auto waiting = [](std::uint32_t w, std::vector<row_id> keys) {
    return keyed_pull(w, 1, std::move(keys));
  };
  w0.outbox.clear();
  auto a = waiting(0, {0, 1});
  CHECK(t.proto.receive(w0, a));  // k bytes of keys wait
  auto b = waiting(1, {2});
  CHECK(t.proto.receive(w1, b));  // 2k: at the bound
  CHECK(t.proto.core().pending().size() == 2);
  CHECK(t.proto.core().pending_bytes() == 2 * k);
  auto c = waiting(1, {3});
  CHECK(!t.proto.receive(w1, c));  // 3k: refused, its connection closed
  CHECK(error_code_of(w1) == errc::too_many_requests);
  CHECK(!w1.open);
  CHECK(w1.pending_pulls <= 2);
  CHECK(t.proto.core().pending_bytes() == 2 * k);
  // w1's pull is dropped with its session; w0's keeps waiting and room is freed.
  t.proto.session_finished(w1);
  CHECK(t.proto.core().pending_bytes() == k);
  CHECK(w0.open);
  auto d = waiting(0, {3});
  CHECK(t.proto.receive(w0, d));
  CHECK(t.proto.core().pending_bytes() == 2 * k);
  CHECK(w0.outbox.empty());
}

namespace {
// Worker session `s` (worker `w`) ends clock `c`: a one-row push marked end_of_clock.
void end_clock(stepped& t, test_session& s, std::uint32_t w, clock_value c) {
  auto m = range_push(w, c, 0, 1, 0.0f);
  m.header.flags |= frame_flags::end_of_clock;
  REQUIRE(t.proto.receive(s, m));
}
server_options elastic_options(std::uint32_t capacity, std::uint32_t start_members) {
  server_options o = proto_options();
  o.num_workers = capacity;
  o.elastic = membership_options{.start_members = start_members, .grace = std::chrono::seconds(2)};
  return o;
}
// The welcome queued to `s` by its hello (decoded), taken out of the outbox.
protocol::welcome welcome_of(stepped& t, test_session& s) {
  REQUIRE(s.outbox.size() == 1);
  protocol::welcome w;
  std::string detail;
  REQUIRE(!protocol::decode(s.outbox.front(), w, detail));
  t.drain(s);
  return w;
}
}  // namespace

TEST_CASE("elastic membership: the server clock follows the live members; a member gone for "
          "the grace period leaves and the others go on") {
  using namespace std::chrono_literals;
  for (const bool elastic : {false, true}) {
    CAPTURE(elastic);
    server_options o = elastic ? elastic_options(3, 2) : proto_options();
    if (!elastic) o.num_workers = 2;
    stepped t(o);
    t.io.time = test_time{} + 1h;
    auto& w0 = t.worker(0);
    end_clock(t, w0, 0, 0);
    CHECK(t.proto.core().clock() == 0);  // elastic: the start barrier waits for 2 members
    auto& w1 = t.worker(1);
    end_clock(t, w1, 1, 0);
    CHECK(t.proto.core().clock() == 1);
    end_clock(t, w0, 0, 1);
    auto wait = pull(0, 2, 0, 4);  // worker 0 needs server clock 2: worker 1 holds it at 1
    REQUIRE(t.proto.receive(w0, wait));
    REQUIRE(t.proto.core().pending().size() == 1);

    t.proto.session_finished(w1);  // worker 1 is killed: its connection ends, no bye
    t.io.time += 1s;
    (void)t.proto.sweep();
    CHECK(t.proto.core().clock() == 1);  // within the grace period
    t.io.time += 1s;
    (void)t.proto.sweep();
    if (elastic) {
      CHECK(t.proto.core().members() == 1);
      CHECK(t.proto.stats().departures == 1);
      CHECK(t.proto.core().clock() == 2);       // worker 0 alone now
      CHECK(t.proto.core().pending().empty());  // and its pull was answered
      REQUIRE(w0.outbox.size() == 1);
      CHECK(w0.outbox.back().header.type == message_type::rows);
      CHECK(!t.proto.sweep());  // nothing left to watch
    } else {
      CHECK(t.proto.core().clock() == 1);  // fixed membership: worker 1 holds it for good
      CHECK(t.proto.core().pending().size() == 1);
    }
  }
}

TEST_CASE("elastic membership: a hello within the grace keeps the place, bye leaves at once, a "
          "late joiner starts at the server clock") {
  using namespace std::chrono_literals;
  stepped t(elastic_options(3, 2));
  t.io.time = test_time{} + 1h;
  auto& w0 = t.worker(0);
  auto& w1 = t.worker(1);
  for (clock_value c = 0; c < 3; ++c) {
    end_clock(t, w0, 0, c);
    end_clock(t, w1, 1, c);
  }
  REQUIRE(t.proto.core().clock() == 3);
  CHECK(t.proto.stats().joins == 2);

  // Worker 1's connection drops; it is back within the grace period, at its clock.
  t.proto.session_finished(w1);
  t.io.time += 1s;
  auto& back = t.connect(11);
  auto h = hello_from(1, 3);
  REQUIRE(t.proto.receive(back, h));
  CHECK(welcome_of(t, back).worker_clock == 3);
  t.io.time += 5s;
  (void)t.proto.sweep();
  CHECK(t.proto.core().members() == 2);  // no departure: it came back in time
  CHECK(t.proto.stats().joins == 2);
  CHECK(t.proto.stats().departures == 0);

  // Worker 0 runs ahead; worker 1 says bye: it leaves at once and the clock moves on.
  end_clock(t, w0, 0, 3);
  end_clock(t, w0, 0, 4);
  CHECK(t.proto.core().clock() == 3);
  message bye;
  bye.header.type = message_type::bye;
  bye.header.sender = 1;
  REQUIRE(t.proto.receive(back, bye));
  CHECK(t.proto.core().members() == 1);
  CHECK(t.proto.stats().departures == 1);
  CHECK(t.proto.core().clock() == 5);

  // Worker 2 joins late, saying clock 0: it starts at the server clock, not behind it.
  auto& late = t.connect(12);
  auto h2 = hello_from(2, 0);
  REQUIRE(t.proto.receive(late, h2));
  CHECK(welcome_of(t, late).worker_clock == 5);
  CHECK(t.proto.core().worker_clock(2) == 5);
  CHECK(t.proto.core().members() == 2);
  CHECK(t.proto.stats().joins == 3);
  end_clock(t, w0, 0, 5);
  CHECK(t.proto.core().clock() == 5);  // worker 2 counts now: the clock waits for it
  end_clock(t, late, 2, 5);
  CHECK(t.proto.core().clock() == 6);
}

TEST_CASE("elastic membership: a message ahead of the worker's clock here catches it up; fixed "
          "membership refuses it") {
  for (const bool elastic : {false, true}) {
    CAPTURE(elastic);
    server_options o = elastic ? elastic_options(2, 1) : proto_options();
    stepped t(o);
    auto& w0 = t.worker(0);
    // Another shard welcomed worker 0 at clock 7 (it joined later there): its push says 7.
    auto ahead = range_push(0, 7, 0, 1, 0.0f);
    ahead.header.flags |= frame_flags::end_of_clock;
    if (elastic) {
      REQUIRE(t.proto.receive(w0, ahead));
      CHECK(t.proto.core().worker_clock(0) == 8);
      CHECK(t.proto.core().clock() == 8);  // worker 0 is the only member
    } else {
      CHECK(!t.proto.receive(w0, ahead));
      CHECK(error_code_of(w0) == errc::unexpected_message);
      CHECK(t.proto.core().worker_clock(0) == 0);
    }
  }
}

TEST_CASE("server_protocol: VAP acknowledges a writer's clock once every reader has acknowledged "
          "its rows; a reader that leaves is no longer waited for") {
  using vap_proto = detail::server_protocol<consistency::vap, recovery::none, optimizer::sgd,
                                            test_session, test_time, test_io>;
  server_options o = proto_options();
  o.num_workers = 3;
  test_io io;
  vap_proto proto{io, o, optimizer::sgd{1.0f}, {}};
  const auto drain = [&](test_session& s) {
    std::swap(s.outbox, s.sending);
    for (auto& m : s.sending) {
      proto.send_started(s);
      proto.sent(s, m.payload.size());
    }
    s.sending.clear();
  };
  const auto fingerprint = policy_fingerprint<consistency::vap, recovery::none>();
  const auto worker = [&](std::uint32_t w) -> test_session& {
    auto& s = proto.add_session(static_cast<int>(w));
    auto h = hello_from(w, 0, 2, fingerprint);
    REQUIRE(proto.receive(s, h));
    drain(s);
    return s;
  };
  auto& w0 = worker(0);
  auto& w1 = worker(1);
  auto& w2 = worker(2);
  for (auto* r : {&w1, &w2}) {  // the readers subscribe to the shard's rows
    auto p = pull(r == &w1 ? 1 : 2, 0, 0, 4);
    REQUIRE(proto.receive(*r, p));
    drain(*r);
  }
  const auto push_clock = [&](clock_value c, std::uint64_t seq) {
    auto p = range_push(0, c, 0, 1, 0.5f);
    p.header.flags |= frame_flags::end_of_clock | frame_flags::want_ack;
    p.header.seq = seq;
    REQUIRE(proto.receive(w0, p));
  };
  const auto ack_from = [&](test_session& s, std::uint32_t w, std::uint64_t count) {
    message a;
    a.header.type = message_type::ack;
    a.header.sender = w;
    a.header.seq = count;
    return proto.receive(s, a);
  };
  const auto acks_to_writer = [&] {
    std::vector<std::uint64_t> seqs;
    for (const auto& m : w0.outbox)
      if (m.header.type == message_type::ack) seqs.push_back(m.header.seq);
    return seqs;
  };

  push_clock(0, 1);
  for (auto* r : {&w1, &w2}) {  // the changed row goes to each reader, asking for an ack
    REQUIRE(r->outbox.size() == 1);
    CHECK(r->outbox[0].header.type == message_type::rows);
    CHECK(r->outbox[0].header.has(frame_flags::eager));
    CHECK(r->outbox[0].header.has(frame_flags::want_ack));
    drain(*r);
  }
  CHECK(acks_to_writer().empty());  // applied, but not visible yet
  CHECK(ack_from(w1, 1, 1));
  CHECK(acks_to_writer().empty());  // w2 has not answered
  CHECK(ack_from(w2, 2, 1));
  CHECK(acks_to_writer() == std::vector<std::uint64_t>{1});
  drain(w0);

  // Two clocks in flight: each reader's cumulative count releases them in order.
  push_clock(1, 2);
  push_clock(2, 3);
  drain(w1);
  drain(w2);
  CHECK(ack_from(w2, 2, 3));
  CHECK(acks_to_writer().empty());
  CHECK(ack_from(w1, 1, 2));
  CHECK(acks_to_writer() == std::vector<std::uint64_t>{2});
  CHECK(ack_from(w1, 1, 3));
  CHECK(acks_to_writer() == std::vector<std::uint64_t>{2, 3});
  drain(w0);

  // A reader that leaves is no longer waited for.
  push_clock(3, 4);
  CHECK(ack_from(w1, 1, 4));
  CHECK(acks_to_writer().empty());
  proto.session_finished(w2);
  CHECK(acks_to_writer() == std::vector<std::uint64_t>{4});
  drain(w0);

  // A count past the messages sent is refused.
  CHECK(!ack_from(w1, 1, 9));
  CHECK(error_code_of(w1) == errc::unexpected_message);
}

TEST_CASE("update rules: sum, mean, staleness-aware and linear scaling with warm-up") {
  const push_context fresh{.worker = 0, .workers = 16, .clock = 5, .server_clock = 5};
  push_context stale = fresh;
  stale.staleness = 7;
  CHECK(update_rule::sum{}.scale(stale) == 1.0f);
  CHECK(update_rule::mean{}.scale(stale) == doctest::Approx(1.0 / 16));
  CHECK(update_rule::staleness_aware{}.scale(fresh) == 1.0f);
  CHECK(update_rule::staleness_aware{}.scale(stale) == doctest::Approx(1.0 / 8));
  // Goyal et al.: from one worker's rate for the global batch (1/W per push) to W times it
  // (1 per push), linearly over the warm-up clocks; a cap limits the global rate.
  update_rule::linear_scaling lin{.warmup_clocks = 100};
  push_context c = fresh;
  c.server_clock = 0;
  CHECK(lin.scale(c) == doctest::Approx(1.0 / 16));
  c.server_clock = 50;
  CHECK(lin.scale(c) == doctest::Approx(1.0 / 16 + 0.5 * 15.0 / 16));
  c.server_clock = 100;
  CHECK(lin.scale(c) == 1.0f);
  lin.max_factor = 4;
  CHECK(lin.scale(c) == doctest::Approx(0.25));
  c.workers = 2;
  CHECK(lin.scale(c) == 1.0f);  // the cap is above 2 workers' factor
  update_rule::selectable sel;
  CHECK(sel.chosen_name() == "sum");
  CHECK(sel.choose("staleness-aware"));
  CHECK(sel.scale(stale) == doctest::Approx(1.0 / 8));
  CHECK(!sel.choose("median"));
  CHECK(sel.chosen_name() == "staleness-aware");
  for (std::string_view n : {"sum", "mean", "staleness-aware", "linear-scaling"}) {
    CHECK(sel.choose(n));
    CHECK(sel.chosen_name() == n);
  }
}

TEST_CASE("shard_core: an update rule scales each push by its staleness from the vector clock") {
  using rule_opt = optimizer::with_update_rule<optimizer::sgd, update_rule::staleness_aware>;
  using rule_core = detail::shard_core<rule_opt, int, int>;
  const std::vector<table_spec> layout{table_spec{0, 8, 2, 0.0f}};
  rule_core core(0, 2, 3, layout, 42, rule_opt{optimizer::sgd{1.0f}, {}});
  // Workers 1 and 2 finish clocks 0 and 1; worker 0's push of clock 0 then lacks their 4
  // updates of clocks >= 0: staleness 4, so 1/5 of the step.
  for (std::uint32_t w : {1u, 2u}) {
    core.advance(w, 1);
    core.advance(w, 2);
  }
  auto m = range_push(0, 0, 0, 1, 1.0f);
  CHECK(core.context_of(m).staleness == 4);
  CHECK(core.context_of(m).workers == 3);
  std::string detail;
  REQUIRE(!core.check_rows(m, detail));
  REQUIRE(!core.check_update(m, detail));
  core.apply(m);
  CHECK(core.table(0).values[0] == doctest::Approx(-0.2));
  // Worker 1's push of clock 2 is the newest: nothing newer applied, the full step.
  auto fresh = range_push(1, 2, 1, 1, 1.0f);
  CHECK(core.context_of(fresh).staleness == 0);
  core.apply(fresh);
  CHECK(core.table(0).values[2] == doctest::Approx(-1.0));
  // A fresh push's read-my-writes step (the welcome's local_step) is the full step.
  protocol::welcome w;
  core.welcome_tables(0, w);
  CHECK(w.local_step == doctest::Approx(1.0));
}

TEST_CASE("server_protocol: max_parameter_value clips the rows a push touched, and counts it") {
  auto o = proto_options();
  o.max_parameter_value = 1.0f;
  stepped t(o);
  auto& w0 = t.worker(0);
  // sgd at rate 1: value -= gradient. Rows [0, 2) move to +3: clipped to 1 (4 values).
  auto p = range_push(0, 0, 0, 2, -3.0f);
  REQUIRE(t.proto.receive(w0, p));
  const auto& v = t.proto.core().table(0).values;
  CHECK(v[0] == 1.0f);
  CHECK(v[3] == 1.0f);
  CHECK(v[4] == 0.0f);  // row 2 untouched
  CHECK(t.proto.stats().clipped_values == 4);
  // Within the bound nothing is clipped: rows [1, 3) by -0.5 and +0.25.
  auto q = range_push(0, 0, 1, 2, 0.5f);
  REQUIRE(t.proto.receive(w0, q));
  CHECK(v[2] == 0.5f);
  CHECK(v[4] == -0.5f);
  CHECK(t.proto.stats().clipped_values == 4);
  // A sparse push clips only its keyed rows: row 3 to -1 (from -2).
  message k = keyed_pull(0, 0, {3});
  k.header.type = message_type::push;
  k.header.table = 0;
  k.header.width = 2;
  k.payload = pool.allocate(key_bytes(1) + 2 * sizeof(float));
  std::memset(k.payload.data(), 0, k.payload.size());
  const row_id key = 3;
  std::memcpy(k.payload.data(), &key, sizeof key);
  const float g[2] = {2.0f, 0.5f};
  std::memcpy(k.payload.data() + key_bytes(1), g, sizeof g);
  REQUIRE(t.proto.receive(w0, k));
  CHECK(v[6] == -1.0f);
  CHECK(v[7] == -0.5f);
  CHECK(t.proto.stats().clipped_values == 5);
}
