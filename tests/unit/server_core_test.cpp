// Tests of detail::shard_core, the sans-io state of one server shard, stepped message by
// message: no transport, no executor, no timer.
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/shard_core.hpp"
#include "asyncps/optimizer/optimizers.hpp"
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
