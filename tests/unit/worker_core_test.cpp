// The worker's sans-io pieces stepped message by message, without a transport: the cache
// (detail/worker/cache.hpp), push building (detail/worker/push_builder.hpp) and the recovery
// policies' worker parts (detail/worker/hooks.hpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <doctest/doctest.h>

#include "asyncps/buffer.hpp"
#include "asyncps/consistency/policies.hpp"
#include "asyncps/detail/worker/cache.hpp"
#include "asyncps/detail/worker/fsm.hpp"
#include "asyncps/detail/worker/hooks.hpp"
#include "asyncps/detail/worker/push_builder.hpp"
#include "asyncps/recovery/chain_replication.hpp"
#include "asyncps/recovery/none.hpp"
#include "asyncps/recovery/replica_log.hpp"
#include "asyncps/recovery/stateless.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/simulated.hpp"
#include "asyncps/worker.hpp"
#include "counter_model.hpp"

using namespace asyncps;

namespace {

// Two tables over two shards: table 0 is 4 rows x 2, table 1 is 2 rows x 3.
const std::vector<table_spec> layout{{0, 4, 2, 0.0f}, {1, 2, 3, 0.0f}};

// A rows message from a server: range [first, first + rows) of table `t`, every value `v`.
message rows_message(buffer_pool& pool, table_id t, std::uint32_t first, std::uint32_t rows,
                     std::uint32_t width, clock_value clock, std::uint64_t applied, float v,
                     std::uint8_t extra_flags = 0) {
  message m;
  m.header.type = message_type::rows;
  m.header.flags = static_cast<std::uint8_t>(frame_flags::range | extra_flags);
  m.header.table = t;
  m.header.clock = clock;
  m.header.seq = applied;
  m.header.first_row = first;
  m.header.row_count = rows;
  m.header.width = width;
  m.payload = pool.allocate(std::size_t{rows} * width * sizeof(float));
  for (float& x : m.payload.floats()) x = v;
  return m;
}

// A keyed rows message: rows `keys` of table `t`, every value `v`.
message keyed_rows(buffer_pool& pool, table_id t, std::vector<row_id> keys, std::uint32_t width,
                   clock_value clock, float v) {
  message m;
  m.header.type = message_type::rows;
  m.header.table = t;
  m.header.clock = clock;
  m.header.row_count = static_cast<std::uint32_t>(keys.size());
  m.header.width = width;
  const auto kb = key_bytes(m.header.row_count);
  m.payload = pool.allocate(kb + keys.size() * width * sizeof(float));
  std::memset(m.payload.data(), 0, kb);
  if (!keys.empty()) std::memcpy(m.payload.data(), keys.data(), keys.size() * sizeof(row_id));
  auto* vals = reinterpret_cast<float*>(m.payload.data() + kb);
  for (std::size_t i = 0; i < keys.size() * width; ++i) vals[i] = v;
  return m;
}

buffer gradient(buffer_pool& pool, float v) {
  buffer g = pool.allocate(layout_size(layout) * sizeof(float));
  for (float& x : g.floats()) x = v;
  return g;
}

// A cache of 64 x 4 and 16 x 8 over 2 shards (384 floats: up to 96 changed floats refresh row by
// row), its compute snapshot (poisoned), and whether the snapshot equals the cache's values.
struct snapshot_setup {
  std::vector<table_spec> tables{{0, 64, 4, 0.0f}, {1, 16, 8, 0.0f}};
  detail::worker_cache<false> cache{tables, 2};
  std::vector<float> snap = std::vector<float>(cache.size(), -7.0f);
  bool current() const {
    return std::equal(snap.begin(), snap.end(), cache.values().begin(), cache.values().end());
  }
};

}  // namespace

TEST_CASE("worker_cache: parts split every table over the shards; rows install and stamp them") {
  buffer_pool pool;
  detail::worker_cache<false> cache(layout, 2);
  CHECK(cache.parts(0)[0].range == key_range{0, 2});
  CHECK(cache.parts(1)[0].range == key_range{2, 4});
  CHECK(cache.parts(0)[1].range == key_range{0, 1});
  CHECK(cache.part_offset(1, 1) == 8 + 3);
  CHECK(cache.part_floats(1, 0) == 4);

  // A wrong shape is refused before anything is counted or written.
  message bad = rows_message(pool, 0, 2, 2, 3, 0, 0, 1.0f);
  CHECK(cache.check_shape(bad.header) == make_error_code(errc::bad_width));
  bad.header.table = 2;
  CHECK(cache.check_shape(bad.header) == make_error_code(errc::bad_table));
  // Rows outside the shard's part.
  CHECK(cache.install(0, rows_message(pool, 0, 2, 2, 2, 0, 0, 1.0f)) ==
        make_error_code(errc::bad_row_range));

  auto& p = cache.parts(1)[0];
  p.pulling = true;
  REQUIRE(!cache.install(1, rows_message(pool, 0, 2, 2, 2, 5, 0, 1.5f)));
  CHECK(p.have);
  CHECK(p.clock == 5);
  CHECK(!p.pulling);
  CHECK(cache.values()[4] == 1.5f);
  CHECK(cache.values()[7] == 1.5f);
  CHECK(cache.values()[3] == 0.0f);  // shard 0's rows untouched
  // Eager rows re-stamp the whole part and leave an outstanding pull outstanding.
  p.pulling = true;
  REQUIRE(!cache.install(1, rows_message(pool, 0, 3, 1, 2, 7, 0, 2.0f, frame_flags::eager)));
  CHECK(p.clock == 7);
  CHECK(p.pulling);
  CHECK(cache.values()[4] == 1.5f);
  CHECK(cache.values()[6] == 2.0f);
}

TEST_CASE("worker_cache: the compute snapshot copies the changed rows only, nothing when none "
          "changed") {
  buffer_pool pool;
  snapshot_setup f;
  auto& cache = f.cache;
  auto& snap = f.snap;
  const auto current = [&] { return f.current(); };
  const auto& n = cache.snapshot_stats();
  cache.refresh_snapshot(snap);  // the first refresh copies everything
  CHECK(n.whole == 1);
  CHECK(current());
  cache.refresh_snapshot(snap);  // nothing changed: nothing copied
  CHECK(n.skipped == 1);
  CHECK(n.whole == 1);
  CHECK(n.partial == 0);

  // Poison an unchanged row of the snapshot: a refresh that recopied it would heal it.
  snap[cache.offset(0) + 10 * 4] = -99.0f;
  // One keyed row of table 0 (shard 1 owns rows [32, 64)) changes: only it is copied.
  REQUIRE(!cache.install(1, keyed_rows(pool, 0, {40}, 4, 3, 2.5f)));
  cache.refresh_snapshot(snap);
  CHECK(n.partial == 1);
  CHECK(n.rows == 1);
  CHECK(snap[cache.offset(0) + 40 * 4] == 2.5f);
  CHECK(snap[cache.offset(0) + 40 * 4 + 3] == 2.5f);
  CHECK(snap[cache.offset(0) + 10 * 4] == -99.0f);  // not recopied
  snap[cache.offset(0) + 10 * 4] = 0.0f;
  CHECK(current());
  cache.refresh_snapshot(snap);
  CHECK(n.skipped == 2);

  // Read-my-writes on rows [0, 2) of table 1 (16 floats) and the same row twice: 3 rows.
  const std::vector<float> g(16, 1.0f);
  cache.local_apply(0.5f, 1, key_range{0, 2}, g);
  REQUIRE(!cache.install(1, keyed_rows(pool, 0, {40}, 4, 4, 3.0f)));
  REQUIRE(!cache.install(1, keyed_rows(pool, 0, {40}, 4, 5, 3.5f)));
  cache.refresh_snapshot(snap);
  CHECK(n.partial == 2);
  CHECK(n.rows == 1 + 3);
  CHECK(current());

  // A whole part (32 rows x 4 = 128 floats, over a quarter of the cache): one whole copy.
  REQUIRE(!cache.install(0, rows_message(pool, 0, 0, 32, 4, 6, 0, 1.25f)));
  cache.refresh_snapshot(snap);
  CHECK(n.whole == 2);
  CHECK(n.partial == 2);
  CHECK(current());
  cache.refresh_snapshot(snap);
  CHECK(n.skipped == 3);
}

TEST_CASE("worker_cache: rows of a whole part are held by reference until the part is written "
          "or the values are read") {
  buffer_pool pool;
  // Shard 0 owns rows [0, 32) of table 0 and [0, 8) of table 1.
  snapshot_setup f;
  auto& cache = f.cache;
  auto& snap = f.snap;
  const auto current = [&] { return f.current(); };
  const auto& n = cache.snapshot_stats();
  cache.refresh_snapshot(snap);

  // Rows of the whole part (0, 0): the cache keeps the payload, no copy into its values.
  message whole = rows_message(pool, 0, 0, 32, 4, 1, 0, 1.5f);
  REQUIRE(!cache.install(0, whole));
  CHECK(cache.held_parts() == 1);
  CHECK(!whole.payload.unique());  // the cache holds a reference
  CHECK(cache.parts(0)[0].have);
  // The snapshot is copied from the payload (a whole copy: 128 of 384 floats changed).
  cache.refresh_snapshot(snap);
  CHECK(n.whole == 2);
  CHECK(snap[cache.offset(0)] == 1.5f);
  CHECK(snap[cache.offset(0) + 32 * 4 - 1] == 1.5f);
  CHECK(snap[cache.offset(0) + 32 * 4] == 0.0f);  // shard 1's rows
  CHECK(cache.held_parts() == 1);                 // a refresh does not copy the rows in
  // Reading the values copies them in and drops the reference.
  CHECK(current());
  CHECK(cache.held_parts() == 0);
  CHECK(whole.payload.unique());
  CHECK(cache.values()[cache.offset(0) + 5] == 1.5f);

  // Held again; rows of part of the part (row 3 only) copy the held rows in first.
  REQUIRE(!cache.install(0, rows_message(pool, 0, 0, 32, 4, 2, 0, 2.0f)));
  CHECK(cache.held_parts() == 1);
  REQUIRE(!cache.install(0, rows_message(pool, 0, 3, 1, 4, 2, 0, 9.0f)));
  CHECK(cache.held_parts() == 0);
  cache.refresh_snapshot(snap);
  CHECK(snap[cache.offset(0) + 3 * 4] == 9.0f);
  CHECK(snap[cache.offset(0) + 4 * 4] == 2.0f);
  CHECK(current());

  // A small whole part (table 1, shard 0: 8 rows x 8 = 64 floats) refreshes row by row, each
  // row from the payload; a second part held at once.
  REQUIRE(!cache.install(0, rows_message(pool, 0, 0, 32, 4, 3, 0, 4.0f)));
  cache.refresh_snapshot(snap);
  REQUIRE(!cache.install(0, rows_message(pool, 1, 0, 8, 8, 3, 0, -2.5f)));
  CHECK(cache.held_parts() == 2);
  const auto partial = n.partial;
  cache.refresh_snapshot(snap);
  CHECK(n.partial == partial + 1);
  CHECK(snap[cache.offset(1)] == -2.5f);
  CHECK(snap[cache.offset(1) + 8 * 8 - 1] == -2.5f);
  CHECK(snap[cache.offset(0)] == 4.0f);

  // Read-my-writes into a held part copies its rows in first, then applies.
  cache.set_step(0, 0.5f);
  const buffer g = [&] {
    buffer b = pool.allocate(cache.size() * sizeof(float));
    std::fill(b.floats().begin(), b.floats().end(), 2.0f);
    return b;
  }();
  cache.note_push(0, 1, g);
  CHECK(cache.held_parts() == 2);  // kept, not applied yet
  cache.refresh_snapshot(snap);    // a read: applies it
  CHECK(cache.held_parts() == 1);  // part (0, 1) was written
  CHECK(snap[cache.offset(1)] == -3.5f);
  CHECK(current());
  CHECK(cache.held_parts() == 0);
  // Two shards split every table: no table is one held part, so none was shared.
  CHECK(n.shared == 0);
  for (table_id t = 0; t < 2; ++t)
    CHECK(cache.snapshot_tables()[t] == snap.data() + cache.offset(t));
}

TEST_CASE("worker_cache: a table one shard holds whole is shared with the snapshot, not copied") {
  buffer_pool pool;
  detail::worker_cache<false> cache(layout, 1);  // one shard owns both tables
  std::vector<float> snap(cache.size(), -7.0f);
  const auto& n = cache.snapshot_stats();
  const auto at = [&](table_id t, std::size_t i) { return cache.snapshot_tables()[t][i]; };
  const auto in_snap = [&](table_id t) {
    return cache.snapshot_tables()[t] == snap.data() + cache.offset(t);
  };
  cache.refresh_snapshot(snap);  // nothing held: both tables copied
  CHECK(in_snap(0));
  CHECK(in_snap(1));
  CHECK(at(0, 0) == 0.0f);

  // Table 0's whole part, held: the snapshot reads the payload itself (the buffer's rows of
  // table 0 are not written), and keeps a reference to it.
  message m = rows_message(pool, 0, 0, 4, 2, 1, 0, 1.5f);
  REQUIRE(!cache.install(0, m));
  cache.refresh_snapshot(snap);
  CHECK(n.shared == 1);
  CHECK(cache.snapshot_tables()[0] == m.payload.floats().data());
  CHECK(in_snap(1));
  CHECK(at(0, 7) == 1.5f);
  CHECK(snap[cache.offset(0)] == 0.0f);  // not copied
  // The values read copy the rows into the cache and drop the part's reference; the
  // snapshot's own reference keeps the payload (nothing may reuse it) until the next refresh.
  CHECK(cache.values()[3] == 1.5f);
  CHECK(cache.held_parts() == 0);
  CHECK(!m.payload.unique());
  CHECK(cache.snapshot_tables()[0] == m.payload.floats().data());
  // Not held any more: the next refresh copies the whole table back into the buffer, though
  // no row changed since the last refresh, and lets the payload go.
  cache.refresh_snapshot(snap);
  CHECK(n.skipped == 1);
  CHECK(in_snap(0));
  CHECK(m.payload.unique());
  for (std::size_t i = 0; i < 8; ++i) CHECK(at(0, i) == 1.5f);

  // Held again, then one row of it (row 1) arrives: copied in, so the table is copied.
  REQUIRE(!cache.install(0, rows_message(pool, 0, 0, 4, 2, 2, 0, 2.0f)));
  cache.refresh_snapshot(snap);
  CHECK(n.shared == 2);
  CHECK(!in_snap(0));
  REQUIRE(!cache.install(0, rows_message(pool, 0, 1, 1, 2, 2, 0, 9.0f)));
  cache.refresh_snapshot(snap);
  CHECK(in_snap(0));
  const std::vector<float> expect{2.0f, 2.0f, 9.0f, 9.0f, 2.0f, 2.0f, 2.0f, 2.0f};
  for (std::size_t i = 0; i < 8; ++i) CHECK(at(0, i) == expect[i]);

  // Read-my-writes: a push the next whole rows do not reflect is applied at the read, which
  // writes the part, so the table is copied, with the push applied.
  cache.set_step(0, 0.5f);
  const buffer g = gradient(pool, 2.0f);
  cache.note_push(0, 1, g);
  REQUIRE(!cache.install(0, rows_message(pool, 1, 0, 2, 3, 3, 0, 4.0f)));
  cache.refresh_snapshot(snap);
  CHECK(in_snap(1));
  CHECK(at(1, 5) == 3.0f);
  // Rows that reflect it: shared again, the push dropped unapplied.
  message r = rows_message(pool, 1, 0, 2, 3, 4, 1, 5.0f);
  REQUIRE(!cache.install(0, r));
  cache.refresh_snapshot(snap);
  CHECK(cache.snapshot_tables()[1] == r.payload.floats().data());
  CHECK(at(1, 0) == 5.0f);
  CHECK(n.shared == 3);
}

TEST_CASE("worker_cache: read-my-writes re-applies own pushes the server had not applied") {
  buffer_pool pool;
  detail::worker_cache<false> cache(layout, 2);
  cache.set_step(0, 0.5f);
  cache.set_step(1, std::nanf(""));  // a NaN step is off
  CHECK(cache.step(1) == 0.0f);
  const buffer g = gradient(pool, 2.0f);
  // Push 1 of part (0, 0): kept, applied at the next read (rows 0-1 of table 0 move by
  // -0.5 * 2), not when sent.
  cache.note_push(0, 0, g);
  CHECK(cache.parts(0)[0].pushed == 1);
  CHECK(cache.parts(0)[0].local.size() == 1);
  CHECK(cache.values()[0] == 0.0f);
  cache.apply_local(0);
  CHECK(cache.values()[0] == -1.0f);
  CHECK(cache.values()[4] == 0.0f);  // shard 1's rows are not part of this push
  cache.apply_local(0);              // applied once only
  CHECK(cache.values()[0] == -1.0f);
  cache.note_push(1, 0, g);  // step off: counted, not applied, not kept
  CHECK(cache.parts(1)[0].pushed == 1);
  CHECK(cache.parts(1)[0].local.empty());
  cache.apply_local(1);
  CHECK(cache.values()[4] == 0.0f);

  // Rows of the whole part that do not reflect push 1 yet (applied = 0): the push is kept and
  // applied on top at the next read.
  REQUIRE(!cache.install(0, rows_message(pool, 0, 0, 2, 2, 1, 0, 10.0f)));
  CHECK(cache.values()[0] == 10.0f);
  CHECK(cache.parts(0)[0].local.size() == 1);
  std::vector<float> snap(cache.values().size(), 0.0f);
  cache.refresh_snapshot(snap);  // a read
  CHECK(cache.values()[0] == 9.0f);
  CHECK(snap[0] == 9.0f);
  // Rows that reflect it (applied = 1): installed as they are, and the push is dropped.
  REQUIRE(!cache.install(0, rows_message(pool, 0, 0, 2, 2, 2, 1, 10.0f)));
  CHECK(cache.values()[0] == 10.0f);
  CHECK(cache.parts(0)[0].local.empty());
  cache.refresh_snapshot(snap);
  CHECK(snap[0] == 10.0f);

  // A BSP clock: push 2, then rows of the whole part that reflect it: the push is never
  // applied (no pass over the part), and the read sees the server's rows.
  cache.note_push(0, 0, g);
  REQUIRE(!cache.install(0, rows_message(pool, 0, 0, 2, 2, 3, 2, 7.0f)));
  CHECK(cache.parts(0)[0].local.empty());
  cache.refresh_snapshot(snap);
  CHECK(snap[0] == 7.0f);
}

TEST_CASE("worker_cache: lazy read-my-writes gives the bits of applying each push when sent") {
  // Reference: each push applied to the cache when sent, every kept push re-applied after an
  // install, in order (the cache's behaviour before read-my-writes became lazy).
  buffer_pool pool;
  detail::worker_cache<false> cache(layout, 2);
  const float step = 0.37f;
  cache.set_step(0, step);
  std::vector<float> ref(cache.values().size(), 0.0f);
  std::vector<std::pair<std::uint64_t, std::vector<float>>> kept;  // index, part (0, 0) slice
  const std::size_t off = cache.part_offset(0, 0);
  const std::size_t n = cache.part_floats(0, 0);
  const auto ref_apply = [&](const std::vector<float>& g, std::size_t first, std::size_t count) {
    for (std::size_t i = first; i < first + count; ++i) ref[off + i] -= step * g[i];
  };
  std::vector<float> snap(cache.values().size(), 0.0f);
  const auto same = [&] {
    cache.refresh_snapshot(snap);
    return std::memcmp(snap.data(), ref.data(), ref.size() * sizeof(float)) == 0;
  };
  std::uint64_t pushed = 0;
  float v = 1.3f;
  for (int round = 0; round < 6; ++round) {
    // Two pushes with different values, then rows that reflect the first one only.
    for (int k = 0; k < 2; ++k) {
      buffer g = pool.allocate(layout_size(layout) * sizeof(float));
      auto f = g.floats();
      for (std::size_t i = 0; i < f.size(); ++i) f[i] = 0.1f * static_cast<float>(i + 1) + v;
      v *= 1.7f;
      cache.note_push(0, 0, g);
      ++pushed;
      std::vector<float> slice(f.begin() + static_cast<std::ptrdiff_t>(off),
                               f.begin() + static_cast<std::ptrdiff_t>(off + n));
      ref_apply(slice, 0, n);
      kept.emplace_back(pushed, std::move(slice));
    }
    if (round == 4) CHECK(same());  // a read between the pushes and the rows
    // Whole part (rounds 0, 3) or its first row only (the others), reflecting the first push.
    const bool whole = round % 3 == 0;
    const std::uint32_t rows = whole ? 2 : 1;
    const float server = 3.0f + static_cast<float>(round);
    REQUIRE(!cache.install(0, rows_message(pool, 0, 0, rows, 2, 1, pushed - 1, server)));
    std::erase_if(kept, [&](const auto& u) { return u.first <= pushed - 1; });
    for (std::size_t i = 0; i < std::size_t{rows} * 2; ++i) ref[off + i] = server;
    for (const auto& u : kept) ref_apply(u.second, 0, std::size_t{rows} * 2);
    CHECK(same());
  }
}

TEST_CASE("worker_cache: read decisions under ssp<1> and the pulls they send") {
  buffer_pool pool;
  detail::worker_cache<false> cache(layout, 2);
  const consistency::ssp<1> policy;
  const auto alloc = [&](std::size_t n) { return pool.allocate(n); };
  // Nothing cached: fetch rows of server clock >= c - 1.
  CHECK(cache.pull_clock(policy, 0, 0, 3, 2) == clock_value{2});
  std::uint64_t seq = 0;
  const message m = cache.pull(0, 0, 2, 9, seq, alloc);
  CHECK(m.header.type == message_type::pull);
  CHECK(m.header.has(frame_flags::range));
  CHECK(m.header.sender == 9);
  CHECK(m.header.clock == 2);
  CHECK(m.header.seq == 1);
  CHECK(m.header.first_row == 0);
  CHECK(m.header.row_count == 2);
  CHECK(m.header.width == 2);
  CHECK(cache.parts(0)[0].pulling);
  CHECK(!cache.pull_clock(policy, 0, 0, 3, 2));  // one pull at a time
  CHECK(!cache.ready(0, 2, true, false));
  for (std::uint32_t s = 0; s < 2; ++s) {
    for (table_id t = 0; t < 2; ++t) {
      const auto& p = cache.parts(s)[t];
      REQUIRE(!cache.install(
          s, rows_message(pool, t, p.range.begin, p.range.size(), layout[t].width, 2, 0, 1.0f)));
    }
  }
  CHECK(cache.ready(0, 2, true, false));
  CHECK(!cache.pull_clock(policy, 0, 0, 3, 2));                   // fresh enough: read
  CHECK(cache.pull_clock(policy, 0, 0, 4, 3) == clock_value{3});  // too stale at clock 4
  CHECK(!cache.ready(0, 3, true, false));
  CHECK(cache.stale(0, 3));
  // A shard that is down: ready only when the worker trains on and has the rows cached.
  CHECK(!cache.ready(1, 2, false, false));
  CHECK(cache.ready(1, 3, false, true));
  staleness_histogram h;
  cache.record_staleness(0, 3, h);  // one sample per row read: every row of shard 0's parts
  const std::uint64_t rows0 = cache.parts(0)[0].range.size() + cache.parts(0)[1].range.size();
  REQUIRE(rows0 > 2);
  CHECK(h.total() == rows0);
  CHECK(h.counts[1] == rows0);
  cache.forget(0);
  CHECK(!cache.parts(0)[0].have);
}

TEST_CASE("worker_cache: sparse reads track each row's clock and pull only stale rows") {
  buffer_pool pool;
  const std::vector<table_spec> big{{0, 64, 4, 0.0f}};
  detail::worker_cache<true> cache(big, 1);
  const std::vector<row_id> read{3, 10, 40};
  cache.select_rows([&](table_id) { return std::span<const row_id>(read); });
  auto& p = cache.parts(0)[0];
  CHECK(p.want.size() == 3);
  CHECK(cache.read_state(p) == std::pair<bool, clock_value>{false, no_clock});
  REQUIRE(!cache.install(0, keyed_rows(pool, 0, {3, 10}, 4, 5, 1.0f)));
  CHECK(p.rows_cached == 2);
  CHECK(!p.have);
  CHECK(cache.read_state(p).first == false);  // row 40 is missing
  const consistency::ssp<0> policy;
  const auto want = cache.pull_clock(policy, 0, 0, 5, 5);
  REQUIRE(want);
  std::uint64_t seq = 0;
  const message m =
      cache.pull(0, 0, *want, 0, seq, [&](std::size_t n) { return pool.allocate(n); });
  CHECK(!m.header.has(frame_flags::range));  // keyed: 1 row is smaller than 64
  REQUIRE(m.header.row_count == 1);
  CHECK(payload_keys(m)[0] == 40);
  REQUIRE(!cache.install(0, keyed_rows(pool, 0, {40}, 4, 6, 2.0f)));
  CHECK(cache.read_state(p) == std::pair<bool, clock_value>{true, 5});
  CHECK(cache.values()[40 * 4] == 2.0f);
  // Staleness per row read, each row with its own clock: rows 3 and 10 (clock 5) and row 40
  // (clock 6) read at clock 7; the other 61 rows of the part are not read and not counted.
  staleness_histogram h;
  cache.record_staleness(0, 7, h);
  CHECK(h.total() == 3);
  CHECK(h.counts[2] == 2);
  CHECK(h.counts[1] == 1);
  CHECK(p.clock == 5);
  // Eager rows re-stamp every cached row.
  message e = keyed_rows(pool, 0, {}, 4, 8, 0.0f);
  e.header.flags = frame_flags::eager;
  REQUIRE(!cache.install(0, e));
  CHECK(cache.read_state(p) == std::pair<bool, clock_value>{true, 8});
}

TEST_CASE("push_builder: range pushes share the gradient; the last one ends the clock") {
  buffer_pool pool;
  detail::worker_cache<false> cache(layout, 2);
  const buffer g = gradient(pool, 1.0f);
  std::uint64_t seq = 0;
  const auto& parts = cache.parts(1);
  auto m0 = detail::build_push(parts, 0, 4, g, cache.part_offset(1, 0), 2, 7, seq);
  auto m1 = detail::build_push(parts, 1, 4, g, cache.part_offset(1, 1), 3, 7, seq);
  REQUIRE(m0);
  REQUIRE(m1);
  CHECK(m0->payload.data() == g.data() + cache.part_offset(1, 0) * sizeof(float));  // no copy
  CHECK(m0->payload.size() == 4 * sizeof(float));
  CHECK(m0->header.has(frame_flags::range));
  CHECK(!m0->header.has(frame_flags::end_of_clock));
  CHECK(m1->header.has(frame_flags::end_of_clock));
  CHECK(m0->header.seq == 1);
  CHECK(m1->header.seq == 2);
  CHECK(m1->header.first_row == 1);
  CHECK(m1->header.row_count == 1);
  CHECK(!detail::build_push(parts, 2, 4, g, 0, 0, 7, seq));  // the shard owns rows
  // A shard that owns no rows at all gets a bare clock message, unnumbered.
  const std::vector<table_spec> one{{0, 2, 2, 0.0f}};
  detail::worker_cache<false> empty(one, 3);  // shard 0 of 3 owns no row of a 2-row table
  CHECK(empty.parts(0)[0].range.empty());
  CHECK(!detail::build_push(empty.parts(0), 0, 4, g, 0, 2, 7, seq));
  auto c = detail::build_push(empty.parts(0), 1, 4, g, 0, 0, 7, seq);
  REQUIRE(c);
  CHECK(c->header.type == message_type::clock);
  CHECK(c->header.clock == 4);
  CHECK(c->header.seq == 0);
  CHECK(seq == 2);
}

TEST_CASE("push_builder: sparsify sends only the touched rows when smaller") {
  buffer_pool pool;
  const std::vector<table_spec> big{{0, 64, 4, 0.0f}};
  detail::worker_cache<false> cache(big, 1);
  buffer g = pool.allocate(64 * 4 * sizeof(float));
  for (std::size_t i = 0; i < 64 * 4; ++i) g.floats()[i] = static_cast<float>(i);
  std::uint64_t seq = 0;
  auto m = detail::build_push(cache.parts(0), 0, 0, g, 0, 4, 0, seq);
  REQUIRE(m);
  const std::vector<row_id> touched{5, 9};
  const auto alloc = [&](std::size_t n) { return pool.allocate(n); };
  detail::sparsify(*m, cache.parts(0)[0].range, touched, g.floats().data(), 4, alloc);
  CHECK(!m->header.has(frame_flags::range));
  CHECK(m->header.has(frame_flags::end_of_clock));
  REQUIRE(m->header.row_count == 2);
  CHECK(payload_keys(*m)[1] == 9);
  CHECK(payload_floats(*m)[4] == 9.0f * 4);  // row 9, column 0
  // Touching every row: the range push is smaller and stays.
  auto r = detail::build_push(cache.parts(0), 0, 0, g, 0, 4, 0, seq);
  std::vector<row_id> all(64);
  for (row_id k = 0; k < 64; ++k) all[k] = k;
  detail::sparsify(*r, cache.parts(0)[0].range, all, g.floats().data(), 4, alloc);
  CHECK(r->header.has(frame_flags::range));
}

TEST_CASE("push_builder: VAP magnitude and gradient checks") {
  buffer_pool pool;
  detail::worker_cache<false> cache(layout, 2);
  buffer g = gradient(pool, 0.0f);
  g.floats()[cache.part_offset(1, 0)] = 3.0f;
  g.floats()[cache.part_offset(1, 1)] = 4.0f;
  CHECK(detail::update_magnitude(cache, 1, g.floats(), 0.5f) == doctest::Approx(2.5f));
  CHECK(detail::update_magnitude(cache, 0, g.floats(), 1.0f) == 0.0f);
  CHECK(!detail::find_bad_value(layout, g, 0x7fc5a5a5u));
  detail::fill_bits(g, 0x7fc5a5a5u);
  for (std::size_t i = 0; i < 8 + 4; ++i) g.floats()[i] = 1.0f;  // table 1's row 0 and col 1
  const auto bad = detail::find_bad_value(layout, g, 0x7fc5a5a5u);
  REQUIRE(bad);
  CHECK(bad->table == 1);
  CHECK(bad->index == 4);
  CHECK(bad->unwritten);
  g.floats()[12] = std::numeric_limits<float>::infinity();
  CHECK(!detail::find_bad_value(layout, g, 0x7fc5a5a5u)->unwritten);
}

TEST_CASE("recovery worker parts: none gives up on lost pushes; relaxed chain has no hooks") {
  recovery::none_worker_part none;
  welcome_part w{0, 0, 3, 5, false, 0, {}};
  CHECK(detail::worker_hooks::on_welcome(none, w) == welcome_action::give_up);
  w.applied = 5;
  CHECK(detail::worker_hooks::on_welcome(none, w) == welcome_action::count_lost);
  recovery::chain_worker_part<recovery::chain_mode::relaxed> relaxed;
  w.applied = 3;
  CHECK(detail::worker_hooks::on_welcome(relaxed, w) == welcome_action::count_lost);
  CHECK(detail::worker_hooks::push_flags(relaxed) == 0);
  CHECK(detail::worker_hooks::on_ack(relaxed, 0, 1));
  CHECK(detail::worker_hooks::hello_clock(relaxed, 0, 9) == 9);
}

TEST_CASE("recovery worker parts: strict chain keeps pushes until acked and resends them") {
  buffer_pool pool;
  recovery::chain_worker_part<recovery::chain_mode::strict> chain;
  chain.options.max_unacked = 2;
  detail::worker_hooks::on_start(chain, worker_setup{2, 1});
  CHECK(detail::worker_hooks::push_flags(chain) == frame_flags::want_ack);
  for (std::uint64_t q = 1; q <= 2; ++q) {
    message m;
    m.header.type = message_type::push;
    m.header.seq = q;
    m.header.clock = static_cast<clock_value>(q + 10);
    m.payload = pool.allocate(16);
    detail::worker_hooks::on_push(chain, 1, m);
  }
  CHECK(detail::worker_hooks::flow_blocked(chain, 1));  // max_unacked = 2
  CHECK(!detail::worker_hooks::flow_blocked(chain, 0));
  CHECK(detail::worker_hooks::hello_clock(chain, 1, 20) == 11);  // the oldest unacked push
  CHECK(detail::worker_hooks::has_pending(chain, 1, true));
  std::vector<rejoin_message> out;
  std::vector<rejoin_part> parts(1);
  rejoin_context r(1, 0, 11, 20, false, parts, nullptr, nullptr, out);
  detail::worker_hooks::on_rejoin(chain, r);
  REQUIRE(out.size() == 2);
  CHECK(out[0].msg.header.seq == 1);
  CHECK(out[1].msg.payload.size() == 16);
  CHECK(out[1].counted_bytes == 0);
  CHECK(detail::worker_hooks::on_ack(chain, 1, 1));  // was full, now below: wake
  CHECK(!detail::worker_hooks::flow_blocked(chain, 1));
  CHECK(detail::worker_hooks::on_ack(chain, 1, 2));  // empty: wake
  CHECK(!detail::worker_hooks::has_pending(chain, 1, false));
}

namespace {

// A push of seq `seq` (16 payload bytes, ack wanted) to shard 0, logged by `part`.
void log_push(recovery::replica_log_worker_part& part, buffer_pool& pool, std::uint64_t seq) {
  message m;
  m.header.type = message_type::push;
  m.header.flags = frame_flags::want_ack;
  m.header.seq = seq;
  m.payload = pool.allocate(16);
  detail::worker_hooks::on_push(part, 0, m);
}

}  // namespace

TEST_CASE("recovery worker parts: replica_log takes batched orders with one cumulative "
          "commit, and frees an applied entry that lost its order with the next ordered one") {
  buffer_pool pool;
  recovery::replica_log_worker_part part;
  detail::worker_hooks::on_start(part, worker_setup{1, 1});
  auto push = [&](std::uint64_t seq) { log_push(part, pool, seq); };
  auto order = [&](std::uint64_t stable, bool applied, std::vector<protocol::order_entry> entries) {
    return protocol::encode(
        protocol::order{.stable = stable, .applied = applied, .entries = entries},
        [&](std::size_t n) { return pool.allocate(n); });
  };
  std::vector<message> replies;

  // Write-ahead: one order for two messages, one commit naming the last position.
  push(1);
  push(2);
  auto o1 = order(0, false, {{1, 1}, {2, 3}});
  REQUIRE(!part.on_server_message(0, o1, replies));
  REQUIRE(replies.size() == 1);
  CHECK(replies[0].header.type == protocol::commit_type);
  CHECK(replies[0].header.seq == 3);
  CHECK(part.stats().orders == 2);
  replies.clear();
  detail::worker_hooks::on_ack(part, 0, 2);

  // Apply-first: no commit. Seq 3's order was lost with a connection; its resend was
  // acknowledged as a duplicate (applied, no position). It stays while nothing after it is
  // stable...
  push(3);
  push(4);
  detail::worker_hooks::on_ack(part, 0, 3);
  auto o2 = order(3, true, {{4, 5}});
  REQUIRE(!part.on_server_message(0, o2, replies));
  CHECK(replies.empty());
  detail::worker_hooks::on_ack(part, 0, 4);
  CHECK(part.stats().log_entries == 2);  // seqs 3 and 4: seq 4's position 5 is not stable
  // ... and goes with seq 4 once a replica at or above 5 is stored (seq 3 was applied before
  // seq 4 got its position, so that replica holds it).
  push(5);
  auto o3 = order(5, true, {{5, 6}});
  REQUIRE(!part.on_server_message(0, o3, replies));
  CHECK(part.stats().log_entries == 1);  // seq 5, not yet acknowledged
  CHECK(part.stats().log_bytes == 16);

  // Apply-first's order on the clock's ack (wire version 7): the part logs the positions,
  // sends no commit; the shell then takes the ack (on_ack) and the entry is applied.
  push(6);
  auto a = protocol::encode_on_ack(protocol::order{.stable = 5, .applied = true, .entries = {}}, 6,
                                   [&](std::size_t n) { return pool.allocate(n); });
  std::string why;
  protocol::order decoded;
  CHECK(protocol::decode(a, decoded, why) == errc::unexpected_message);  // no entry: malformed
  CHECK(why.find("malformed order on an ack") != std::string::npos);
  const std::vector<protocol::order_entry> e6{{6, 7}};
  a = protocol::encode_on_ack(protocol::order{.stable = 5, .applied = true, .entries = e6}, 6,
                              [&](std::size_t n) { return pool.allocate(n); });
  CHECK(a.header.type == message_type::ack);
  CHECK(a.header.seq == 6);
  REQUIRE(!part.on_server_message(0, a, replies));
  CHECK(replies.empty());
  CHECK(part.stats().orders == 5);
  detail::worker_hooks::on_ack(part, 0, 6);
  CHECK(!detail::worker_hooks::has_pending(part, 0, false));
  // An ack without the flag is not an order.
  a.header.flags = 0;
  CHECK(part.on_server_message(0, a, replies) == errc::unexpected_message);
}

TEST_CASE("recovery worker parts: replica_log keeps every replica at or above the stable "
          "position it learned, sends them all to a rebuild, and takes an applied order whose "
          "positions a stored replica holds") {
  buffer_pool pool;
  recovery::replica_log_worker_part part;
  part.options.ordering = recovery::replica_log_ordering::apply_first;
  detail::worker_hooks::on_start(part, worker_setup{1, 1});
  std::vector<message> replies;
  auto replica = [&](std::uint64_t position) {
    message m;
    m.header.type = protocol::replica_type;
    m.header.seq = position;
    m.payload = pool.allocate(8);
    replies.clear();
    REQUIRE(!part.on_server_message(0, m, replies));
    REQUIRE(replies.size() == 1);
    CHECK(replies[0].header.type == protocol::commit_type);
    CHECK(replies[0].header.has(protocol::replica_stored_flag));
    CHECK(replies[0].header.seq == position);
  };
  auto push = [&](std::uint64_t seq) { log_push(part, pool, seq); };
  auto rebuild_replicas = [&] {
    welcome_part w{0, 0, 1, 1, true, 0, {}};  // the shard rebuilds: it asks for replicas
    detail::worker_hooks::on_welcome(part, w);
    std::vector<rejoin_message> out;
    rejoin_context r(
        0, 0, 0, 0, true, {},
        [](void* p, std::size_t n) { return static_cast<buffer_pool*>(p)->allocate(n); }, &pool,
        out);
    detail::worker_hooks::on_rejoin(part, r);
    std::vector<std::uint64_t> positions;
    for (const auto& q : out)
      if (q.msg.header.type == protocol::replica_type) positions.push_back(q.msg.header.seq);
    return positions;
  };

  // Two replicas before any order said a position is stable (orders held back, ack_delay):
  // both are kept, since the rebuild may start from either.
  replica(4);
  replica(9);
  CHECK(part.stats().replica_bytes == 16);
  CHECK(rebuild_replicas() == std::vector<std::uint64_t>{4, 9});

  // An applied order (on the ack of seq 1) whose position 3 lies below its stable position 4:
  // taken (the replica of 4 holds that update). The replica of 4 stays (4 is the stable one).
  push(1);
  const std::vector<protocol::order_entry> e1{{1, 3}};
  auto a = protocol::encode_on_ack(protocol::order{.stable = 4, .applied = true, .entries = e1}, 1,
                                   [&](std::size_t n) { return pool.allocate(n); });
  replies.clear();
  REQUIRE(!part.on_server_message(0, a, replies));
  CHECK(replies.empty());
  detail::worker_hooks::on_ack(part, 0, 1);
  CHECK(part.stats().log_entries == 0);  // position 3 <= stable 4: freed once applied
  CHECK(rebuild_replicas() == std::vector<std::uint64_t>{4, 9});

  // The same below the stable position, unapplied (write-ahead): refused.
  std::string why;
  protocol::order decoded;
  auto u = protocol::encode(protocol::order{.stable = 4, .applied = false, .entries = e1},
                            [&](std::size_t n) { return pool.allocate(n); });
  CHECK(protocol::decode(u, decoded, why) == errc::unexpected_message);

  // Once 9 is stable, the replica of 4 goes.
  push(2);
  const std::vector<protocol::order_entry> e2{{2, 10}};
  a = protocol::encode_on_ack(protocol::order{.stable = 9, .applied = true, .entries = e2}, 2,
                              [&](std::size_t n) { return pool.allocate(n); });
  REQUIRE(!part.on_server_message(0, a, replies));
  CHECK(part.stats().replica_bytes == 8);
  CHECK(rebuild_replicas() == std::vector<std::uint64_t>{9});

  // At most max_held_replicas: the oldest goes first.
  for (std::uint64_t p = 20; p < 20 + protocol::max_held_replicas; ++p) replica(p);
  const auto held = rebuild_replicas();
  REQUIRE(held.size() == protocol::max_held_replicas);
  CHECK(held.front() == 20);
  CHECK(part.stats().replica_bytes == 8 * protocol::max_held_replicas);

  // Write-ahead: the logs back the newest replica (every position was logged before it was
  // applied), so only the newest is kept.
  part = recovery::replica_log_worker_part{};
  detail::worker_hooks::on_start(part, worker_setup{1, 1});
  replica(4);
  replica(9);
  CHECK(part.stats().replica_bytes == 8);
  CHECK(rebuild_replicas() == std::vector<std::uint64_t>{9});
}

TEST_CASE("recovery worker parts: stateless buffers while away and delivers on rejoin") {
  buffer_pool pool;
  recovery::stateless_worker_part st;
  detail::worker_hooks::on_start(st, worker_setup{2, 1});
  const std::vector<float> g{1, 2, 3, 4};
  const away_slice slice{0, key_range{2, 4}, 6, g};
  detail::worker_hooks::while_away(st, 1, std::span<const away_slice>(&slice, 1));
  detail::worker_hooks::while_away(st, 1, std::span<const away_slice>(&slice, 1));
  CHECK(st.stats().local_clocks == 2);
  CHECK(detail::worker_hooks::has_pending(st, 1, false));
  CHECK(!detail::worker_hooks::has_pending(st, 1, true));
  CHECK(!detail::worker_hooks::has_pending(st, 0, false));
  // A push on the wire when the link dropped joins the backlog when the server kept state.
  buffer lost = pool.allocate(4 * sizeof(float));
  for (float& x : lost.floats()) x = 10.0f;
  std::vector<unapplied_push> local;
  local.push_back(unapplied_push{3, std::move(lost)});
  welcome_part w{1, 0, 2, 3, false, 6, local};
  CHECK(detail::worker_hooks::on_welcome(st, w) == welcome_action::recovered);
  // Rejoin at clock 9 after a hello at clock 7: 2 clock messages, replica, backlog.
  std::vector<float> rows(4, 0.5f);
  std::vector<rejoin_part> parts{rejoin_part{key_range{2, 4}, 2, true, rows.data()}};
  std::vector<rejoin_message> out;
  rejoin_context r(
      1, 3, 7, 9, true, parts,
      [](void* p, std::size_t n) { return static_cast<buffer_pool*>(p)->allocate(n); }, &pool, out);
  detail::worker_hooks::on_rejoin(st, r);
  REQUIRE(out.size() == 4);
  CHECK(out[0].msg.header.type == message_type::clock);
  CHECK(out[0].msg.header.clock == 7);
  CHECK(out[1].msg.header.clock == 8);
  CHECK(out[2].msg.header.has(frame_flags::policy));
  CHECK(out[2].msg.header.clock == 9);
  CHECK(payload_floats(out[2].msg)[0] == 0.5f);
  const auto& b = out[3].msg.header;
  CHECK(b.has(frame_flags::prefixed));
  CHECK(protocol::backlog_clocks(out[3].msg) == 3);  // clocks in the backlog (its prefix)
  CHECK(b.seq == 0);
  CHECK(b.clock == 6);  // rows clock of the first
  CHECK(payload_floats(out[3].msg)[3] == 4 + 4 + 10.0f);
  CHECK(out[3].counted_bytes == push_prefix_bytes + 16);
  for (const auto& q : out) detail::worker_hooks::on_rejoin_sent(st, 1, q.msg.header);
  CHECK(st.stats().replicas_sent == 1);
  CHECK(st.stats().backlogs_sent == 1);
  CHECK(!detail::worker_hooks::has_pending(st, 1, false));
}

namespace {

struct tiny_model {
  std::vector<table_spec> layout{{0, 4, 2, 0.0f}};
  std::span<const table_spec> tables() const { return layout; }
};
struct pool_alloc {
  buffer_pool pool;
  buffer allocate(std::size_t n) { return pool.allocate(n); }
};
using clk = std::chrono::steady_clock;
using core_t = detail::worker_core<tiny_model, consistency::ssp<0>, recovery::none, pool_alloc, clk,
                                   std::string>;

}  // namespace

TEST_CASE("worker_core: the clock loop stepped event by event (pull, wait, compute, push)") {
  tiny_model model;
  pool_alloc alloc;
  worker_options<std::string> opts;
  opts.id = 3;
  opts.servers = {"server0"};
  opts.local_step = 0.0f;
  opts.wait_timeout = std::chrono::milliseconds(500);
  std::vector<clock_value> reported;
  opts.on_clock = [&](const clock_report& r) { reported.push_back(r.clock); };
  core_t core(model, opts, alloc, {});
  core.link_of(0).up = true;  // as connect_all leaves it
  const auto t0 = clk::now();
  core.start(2, {});
  using detail::loop_step;
  for (clock_value c = 0; c < 2; ++c) {
    CAPTURE(c);
    CHECK(core.resume(t0).kind == loop_step::join);
    auto a = core.resume(t0);  // nothing cached fresh enough: a range pull for server clock c
    REQUIRE(a.kind == loop_step::send);
    CHECK(a.msg.header.type == message_type::pull);
    CHECK(a.msg.header.clock == c);
    a = core.resume(t0);
    REQUIRE(a.kind == loop_step::wait);
    CHECK(a.wait == std::chrono::milliseconds(500));
    // The server answers: rows of server clock c, reflecting this worker's c pushes.
    const auto out = core.on_message(
        0, rows_message(alloc.pool, 0, 0, 4, 2, c, static_cast<std::uint64_t>(c), 1.0f));
    CHECK(out.wake);
    CHECK(core.resume(t0).kind == loop_step::join);  // woken: finish rejoins, then re-check
    REQUIRE(core.resume(t0).kind == loop_step::compute);
    CHECK(core.parameters().span(0)[0] == 1.0f);
    // The pull replaced every row of the cache: a whole refresh, which shares the table (one
    // shard holds it whole) instead of copying it.
    CHECK(core.snapshot_stats().whole == static_cast<std::uint64_t>(c) + 1);
    CHECK(core.snapshot_stats().shared == static_cast<std::uint64_t>(c) + 1);
    CHECK(core.snapshot_stats().skipped == 0);
    core.computed(gradient(alloc.pool, 0.25f), 0.5f, t0 + std::chrono::milliseconds(10));
    a = core.resume(t0);
    REQUIRE(a.kind == loop_step::send);
    CHECK(a.msg.header.type == message_type::push);
    CHECK(a.msg.header.clock == c);
    CHECK(a.msg.header.has(frame_flags::end_of_clock));
    CHECK(core.clock() == c);  // the clock ends once its pushes are out
  }
  const auto done = core.resume(t0);
  CHECK(done.kind == loop_step::done);
  CHECK(!done.ec);
  CHECK(core.clock() == 2);
  CHECK(reported == std::vector<clock_value>{0, 1});
  CHECK(core.stats().pulls == 2);
  CHECK(core.stats().pushes == 2);
  CHECK(core.stats().compute_seconds == doctest::Approx(0.02));
}

namespace {

using asp_core_t =
    detail::worker_core<tiny_model, consistency::asp, recovery::none, pool_alloc, clk, std::string>;

// Resumes `core` past joins and pull requests; returns the first other step.
template <class Core>
typename Core::action next_step(Core& core, clk::time_point t) {
  for (;;) {
    auto a = core.resume(t);
    if (a.kind == detail::loop_step::join) continue;
    if (a.kind == detail::loop_step::send && a.msg.header.type == message_type::pull) continue;
    return a;
  }
}

// Starts `core` (`clocks` clocks, its one link up), answers its first pull with rows of server
// clock 0, computes clock 0 and returns the step after it: the clock's push.
template <class Core>
typename Core::action first_push(Core& core, pool_alloc& alloc, std::uint64_t clocks,
                                 clk::time_point t) {
  core.link_of(0).up = true;
  core.start(clocks, {});
  REQUIRE(next_step(core, t).kind == detail::loop_step::wait);  // nothing cached: waits
  core.on_message(0, rows_message(alloc.pool, 0, 0, 4, 2, 0, 0, 1.0f));
  REQUIRE(next_step(core, t).kind == detail::loop_step::compute);
  core.computed(gradient(alloc.pool, 0.25f), 0.5f, t);
  return next_step(core, t);
}

}  // namespace

TEST_CASE("worker_core: under ASP the push window holds a clock until an earlier one is acked") {
  using detail::loop_step;
  tiny_model model;
  pool_alloc alloc;
  worker_options<std::string> opts;
  opts.servers = {"server0"};
  opts.local_step = 0.0f;
  opts.wait_timeout = std::chrono::milliseconds(500);
  const auto t0 = clk::now();
  SUBCASE("the default window: 2 clocks per server") {
    asp_core_t core(model, opts, alloc, {});
    core.link_of(0).up = true;
    core.start(4, {});
    REQUIRE(next_step(core, t0).kind == loop_step::wait);  // nothing cached: waits for rows
    CHECK(core.on_message(0, rows_message(alloc.pool, 0, 0, 4, 2, 0, 0, 1.0f)).wake);
    std::vector<std::uint64_t> seqs;
    for (clock_value c = 0; c < 2; ++c) {
      CAPTURE(c);
      // Clocks 0 and 1 compute at once: fewer than 2 clocks are unacknowledged.
      REQUIRE(next_step(core, t0).kind == loop_step::compute);
      core.computed(gradient(alloc.pool, 0.25f), 0.5f, t0);
      auto a = next_step(core, t0);
      REQUIRE(a.kind == loop_step::send);
      CHECK(a.msg.header.type == message_type::push);
      CHECK(a.msg.header.has(frame_flags::end_of_clock));
      CHECK(a.msg.header.has(frame_flags::want_ack));  // the window asks for an ack
      seqs.push_back(a.msg.header.seq);
    }
    CHECK(core.link_of(0).in_transit.size() == 2);
    // Clock 2 waits: clocks 0 and 1 are both in flight.
    auto a = next_step(core, t0);
    REQUIRE(a.kind == loop_step::wait);
    CHECK(core.stats().window_waits == 0);  // counted once the clock computes
    message ack;
    ack.header.type = message_type::ack;
    ack.header.seq = seqs[0];
    CHECK(core.on_message(0, ack).wake);  // clock 0 applied: the loop re-checks
    REQUIRE(next_step(core, t0).kind == loop_step::compute);
    CHECK(core.stats().window_waits == 1);
    CHECK(core.link_of(0).in_transit.size() == 1);
    // One ack covers every clock up to its seq.
    core.computed(gradient(alloc.pool, 0.25f), 0.5f, t0);
    a = next_step(core, t0);
    REQUIRE(a.kind == loop_step::send);
    ack.header.seq = a.msg.header.seq;
    CHECK(core.on_message(0, ack).wake);
    CHECK(core.link_of(0).in_transit.empty());
    REQUIRE(next_step(core, t0).kind == loop_step::compute);
    CHECK(core.stats().window_waits == 1);
  }
  SUBCASE("an ack with bytes is refused unless flagged for a policy that takes them") {
    asp_core_t core(model, opts, alloc, {});
    REQUIRE(first_push(core, alloc, 3, t0).kind == loop_step::send);
    message ack;
    ack.header.type = message_type::ack;
    ack.header.seq = 1;
    ack.payload = alloc.pool.allocate(24);
    CHECK(core.on_message(0, ack).error == errc::payload_size_mismatch);
    ack.header.flags = frame_flags::policy;  // recovery::none takes no policy bytes
    CHECK(core.on_message(0, ack).error == errc::unexpected_message);
    CHECK(core.link_of(0).in_transit.size() == 1);  // neither counted as an ack
  }
  SUBCASE("a window of 1 waits for every clock's ack; 0 turns it off") {
    for (std::uint32_t window : {1u, 0u}) {
      CAPTURE(window);
      opts.push_window = window;
      asp_core_t core(model, opts, alloc, {});
      const auto a = first_push(core, alloc, 3, t0);
      REQUIRE(a.kind == loop_step::send);
      CHECK(a.msg.header.has(frame_flags::want_ack) == (window > 0));
      CHECK(next_step(core, t0).kind == (window > 0 ? loop_step::wait : loop_step::compute));
    }
  }
  SUBCASE("no window where the consistency policy bounds reads (SSP), unless asked for") {
    for (const bool asked : {false, true}) {
      CAPTURE(asked);
      if (asked) opts.push_window = 2;
      core_t core(model, opts, alloc, {});
      const auto a = first_push(core, alloc, 1, t0);
      REQUIRE(a.kind == loop_step::send);
      CHECK(a.msg.header.has(frame_flags::want_ack) == asked);
      CHECK(core.link_of(0).in_transit.size() == (asked ? 1u : 0u));
    }
  }
  SUBCASE("a lost link forgets its unacknowledged clocks; the window does not hold the loop") {
    asp_core_t core(model, opts, alloc, {});
    REQUIRE(first_push(core, alloc, 3, t0).kind == loop_step::send);
    REQUIRE(next_step(core, t0).kind == loop_step::compute);
    core.computed(gradient(alloc.pool, 0.25f), 0.5f, t0);
    REQUIRE(next_step(core, t0).kind == loop_step::send);
    CHECK(core.link_of(0).in_transit.size() == 2);
    CHECK(core.fail(0, make_error_code(errc::connection_closed), ""));
    CHECK(core.link_of(0).in_transit.empty());
  }
}

TEST_CASE("worker_core: a wait for rows times out; a lost link asks for a reconnect") {
  tiny_model model;
  pool_alloc alloc;
  worker_options<std::string> opts;
  opts.servers = {"server0"};
  opts.wait_timeout = std::chrono::milliseconds(500);
  using detail::loop_step;
  {
    core_t core(model, opts, alloc, {});
    core.link_of(0).up = true;
    const auto t0 = clk::now();
    core.start(1, {});
    CHECK(core.resume(t0).kind == loop_step::join);
    CHECK(core.resume(t0).kind == loop_step::send);
    CHECK(core.resume(t0).kind == loop_step::wait);
    CHECK(core.resume(t0 + std::chrono::milliseconds(400)).kind == loop_step::join);
    CHECK(core.resume(t0 + std::chrono::milliseconds(400)).kind == loop_step::wait);
    CHECK(core.resume(t0 + std::chrono::milliseconds(501)).kind == loop_step::join);
    const auto a = core.resume(t0 + std::chrono::milliseconds(501));
    CHECK(a.kind == loop_step::done);
    CHECK(a.ec == make_error_code(errc::timeout));
  }
  {
    recovery::none_worker_part grace;
    grace.grace = std::chrono::milliseconds(100);
    core_t core(model, opts, alloc, grace);
    core.link_of(0).up = true;
    const auto t0 = clk::now();
    core.start(1, {});
    CHECK(core.resume(t0).kind == loop_step::join);
    CHECK(core.resume(t0).kind == loop_step::send);
    CHECK(core.fail(0, make_error_code(errc::connection_closed), ""));
    const auto a = core.resume(t0);
    CHECK(a.kind == loop_step::reconnect);
    CHECK(a.shard == 0);
    CHECK(core.link_of(0).reconnecting);
    const auto w = core.resume(t0);  // waits (100 ms ticks) while the link is down
    CHECK(w.kind == loop_step::wait);
    CHECK(w.wait == std::chrono::milliseconds(100));
  }
}

namespace {

struct two_table_model {
  std::vector<table_spec> layout{{0, 4, 2, 0.0f}, {1, 2, 3, 0.0f}};
  std::span<const table_spec> tables() const { return layout; }
};

}  // namespace

// A link that fails between two pushes of one clock: the rest of the clock's pushes are still
// built and handed to the policy (strict chain keeps them to resend; recovery::none's next
// welcome counts them as lost). Before, they were never built: lost without a count.
TEST_CASE("worker_core: a link lost between two pushes of a clock keeps the clock's other push") {
  two_table_model model;
  pool_alloc alloc;
  worker_options<std::string> opts;
  opts.servers = {"server0"};
  opts.local_step = 0.0f;
  opts.wait_timeout = std::chrono::milliseconds(500);
  using chain_core =
      detail::worker_core<two_table_model, consistency::ssp<0>, recovery::chain_replication<>,
                          pool_alloc, clk, std::string>;
  chain_core core(model, opts, alloc, {});
  core.link_of(0).up = true;
  const auto t0 = clk::now();
  core.start(2, {});
  using detail::loop_step;
  CHECK(core.resume(t0).kind == loop_step::join);
  REQUIRE(core.resume(t0).kind == loop_step::send);  // pull table 0
  REQUIRE(core.resume(t0).kind == loop_step::send);  // pull table 1
  REQUIRE(core.resume(t0).kind == loop_step::wait);
  (void)core.on_message(0, rows_message(alloc.pool, 0, 0, 4, 2, 0, 0, 1.0f));
  (void)core.on_message(0, rows_message(alloc.pool, 1, 0, 2, 3, 0, 0, 1.0f));
  CHECK(core.resume(t0).kind == loop_step::join);
  REQUIRE(core.resume(t0).kind == loop_step::compute);
  buffer g = alloc.pool.allocate(layout_size(model.layout) * sizeof(float));
  for (float& x : g.floats()) x = 0.5f;
  core.computed(std::move(g), 0.5f, t0);
  auto a = core.resume(t0);
  REQUIRE(a.kind == loop_step::send);
  CHECK(a.msg.header.table == 0);
  CHECK(core.fail(0, make_error_code(errc::connection_closed), ""));  // the send failed
  CHECK(core.resume(t0).kind == loop_step::join);  // table 1's push built, not sent; clock 1
  a = core.resume(t0);
  CHECK(a.kind == loop_step::reconnect);
  CHECK(core.clock() == 1);
  CHECK(core.stats().pushes == 2);
  // Strict chain keeps both pushes of the clock to resend after the rejoin.
  std::vector<rejoin_message> out;
  std::vector<rejoin_part> parts(2);
  rejoin_context r(0, 0, 0, 1, false, parts, nullptr, nullptr, out);
  detail::worker_hooks::on_rejoin(core.recovery(), r);
  REQUIRE(out.size() == 2);
  CHECK(out[0].msg.header.table == 0);
  CHECK(out[1].msg.header.table == 1);
}

namespace {

// A recovery policy whose worker part implements every worker hook with the default's
// behaviour and records the calls: the order below is the order the worker calls them in.
struct counting_hooks {
  static constexpr std::string_view name = "counting-hooks";
  struct server_part {};
  struct worker_part {
    std::vector<std::string>* calls = nullptr;
    void note(const char* hook) const {
      if (calls->empty() || calls->back() != hook) calls->push_back(hook);
    }
    recovery_action on_server_lost(std::error_code) const noexcept { return recovery_action::fail; }
    std::chrono::milliseconds reconnect_timeout() const noexcept { return {}; }
    void on_start(const worker_setup&) { note("on_start"); }
    clock_value hello_clock(std::uint32_t, clock_value c) const {
      note("hello_clock");
      return c;
    }
    std::uint8_t hello_flags(std::uint32_t) const {
      note("hello_flags");
      return 0;
    }
    // Never called here: the server sends no message the worker does not know.
    std::error_code on_server_message(std::uint32_t, message&, std::vector<message>&) {
      note("on_server_message");
      return errc::unexpected_message;
    }
    welcome_action on_welcome(const welcome_part&) {
      note("on_welcome");
      return welcome_action::count_lost;
    }
    std::uint8_t push_flags() const {
      note("push_flags");
      return 0;
    }
    void on_push(std::uint32_t, const message&) { note("on_push"); }
    bool on_ack(std::uint32_t, std::uint64_t) {
      note("on_ack");
      return true;
    }
    bool flow_blocked(std::uint32_t) const {
      note("flow_blocked");
      return false;
    }
    void while_away(std::uint32_t, std::span<const away_slice>) { note("while_away"); }
    void on_rejoin(rejoin_context&) { note("on_rejoin"); }
    void on_rejoin_sent(std::uint32_t, const frame_header&) { note("on_rejoin_sent"); }
    bool has_pending(std::uint32_t, bool) const {
      note("has_pending");
      return false;
    }
  };
};
static_assert(recovery_policy<counting_hooks>);
static_assert(check_worker_part<counting_hooks::worker_part>());

}  // namespace

TEST_CASE("worker hooks: the order a worker calls them in (2 clocks, no failure)") {
  simulated_network net;
  test::counter_model model(0, 1, 0, 2, 1, 0);
  simulated_transport st(net, "server0"), wt(net, "worker0");
  server_options so;
  so.num_workers = 1;
  so.tables = {model.spec[0]};
  so.log = [](std::string_view) {};
  basic_server<simulated_transport, consistency::bsp, counting_hooks> server(st, so);
  auto acc = st.listen("shard0");
  REQUIRE(acc.has_value());
  asio::co_spawn(
      net.get_executor(),
      [&server, a = std::move(acc).value()]() mutable -> asio::awaitable<void> {
        (void)co_await server.async_serve(std::move(a));
      },
      asio::detached);
  std::vector<std::string> calls;
  counting_hooks::worker_part part;
  part.calls = &calls;
  worker_options<std::string> o;
  o.servers = {"shard0"};
  o.log = [](std::string_view) {};
  basic_worker<test::counter_model, simulated_transport, consistency::bsp, counting_hooks> w(
      wt, model, o, std::nullopt, part);
  std::error_code ec = errc::timeout;
  asio::co_spawn(
      net.get_executor(), [&]() -> asio::awaitable<void> { ec = co_await w.async_run(2); },
      asio::detached);
  net.run();
  asio::post(net.get_executor(), [&] { server.stop(); });
  net.run();
  CHECK(!ec);
  // One table, one shard: per clock the consistency check (flow control once the rows are
  // fresh), then the push's flags and the push; at the end whether anything is pending.
  CHECK(calls == std::vector<std::string>{"on_start", "hello_clock", "hello_flags", "on_welcome",
                                          "flow_blocked", "push_flags", "on_push", "flow_blocked",
                                          "push_flags", "on_push", "has_pending"});
}

namespace {

// A worker's transport whose allocations fail on request: the simulated transport, but the
// `receive_at`-th frame received (0: the first, the handshake reply) throws std::bad_alloc
// (as tcp_transport's receive does when no block for the frame's payload can be allocated;
// the frame is lost), and so does the `allocate_at`-th `allocate` (pulls, pushes' keys,
// gradient buffers), and so does the first receive on the `first_receive_on`-th connection
// made (0: the first; a reconnect's handshake reply). -1: never.
struct alloc_faults {
  int receive_at = -1;
  int allocate_at = -1;
  int first_receive_on = -1;
  int receives = 0;
  int allocations = 0;
  int connections = 0;
};

class faulty_transport {
 public:
  using executor_type = simulated_transport::executor_type;
  using endpoint_type = simulated_transport::endpoint_type;
  using clock_type = simulated_transport::clock_type;
  using timer_type = simulated_transport::timer_type;

  class connection {
   public:
    connection() = default;
    connection(simulated_transport::connection c, alloc_faults* f, int number)
        : c_(std::move(c)), f_(f), number_(number) {}
    asio::awaitable<std::error_code> async_send(message m) {
      co_return co_await c_.async_send(std::move(m));
    }
    asio::awaitable<std::tuple<std::error_code, message>> async_receive() {
      auto r = co_await c_.async_receive();
      const bool first = std::exchange(first_, false);
      if (f_ != nullptr && !std::get<0>(r) &&
          (f_->receives++ == f_->receive_at || (first && number_ == f_->first_receive_on)))
        throw std::bad_alloc();
      co_return r;
    }
    void close() noexcept { c_.close(); }
    bool is_open() const noexcept { return c_.is_open(); }

   private:
    simulated_transport::connection c_;
    alloc_faults* f_ = nullptr;
    int number_ = -1;
    bool first_ = true;
  };
  class acceptor {
   public:
    explicit acceptor(simulated_transport::acceptor a) : a_(std::move(a)) {}
    asio::awaitable<std::tuple<std::error_code, connection>> async_accept() {
      auto [ec, c] = co_await a_.async_accept();
      co_return std::tuple{ec, connection(std::move(c), nullptr, -1)};
    }
    void close() noexcept { a_.close(); }

   private:
    simulated_transport::acceptor a_;
  };
  using connection_type = connection;
  using acceptor_type = acceptor;

  faulty_transport(simulated_network& net, std::string_view node, alloc_faults& f)
      : t_(net, node), f_(&f) {}
  executor_type get_executor() const { return t_.get_executor(); }
  const wire_limits& limits() const noexcept { return t_.limits(); }
  result<acceptor> listen(const endpoint_type& name) {
    auto a = t_.listen(name);
    if (!a) return a.error();
    return acceptor(std::move(a).value());
  }
  asio::awaitable<std::tuple<std::error_code, connection>> async_connect(endpoint_type name) {
    auto [ec, c] = co_await t_.async_connect(std::move(name));
    const int number = ec ? -1 : f_->connections++;
    co_return std::tuple{ec, connection(std::move(c), f_, number)};
  }
  buffer allocate(std::size_t bytes) {
    if (f_->allocations++ == f_->allocate_at) throw std::bad_alloc();
    return t_.allocate(bytes);
  }

 private:
  simulated_transport t_;
  alloc_faults* f_;
};
static_assert(transport<faulty_transport>);

struct faulty_run {
  std::error_code ec;
  bool completed = false;
  std::vector<std::string> log;
  worker_stats stats;
  alloc_faults faults;
};

// One worker (`faults` applied to its transport) against one shard server (`policy` and
// `Recovery`, one table of 1 row x 2), for 6 clocks; then the server is stopped. `on_clock`
// runs after each of the worker's clocks.
template <class Recovery = recovery::none>
faulty_run
run_with_faults(alloc_faults faults, consistency_policy auto policy,
                std::function<void(simulated_network&, const clock_report&)> on_clock = {}) {
  using policy_type = decltype(policy);
  faulty_run out;
  out.faults = faults;
  simulated_network net;
  test::counter_model model(0, 1, 0, 2, 1, 0);
  simulated_transport st(net, "server0");
  faulty_transport wt(net, "worker0", out.faults);
  server_options so;
  so.num_workers = 1;
  so.tables = {model.spec[0]};
  so.log = [](std::string_view) {};
  basic_server<simulated_transport, policy_type, Recovery> server(st, so);
  auto acc = st.listen("shard0");
  REQUIRE(acc.has_value());
  bool served = false;
  asio::co_spawn(
      net.get_executor(),
      [&, a = std::move(acc).value()]() mutable -> asio::awaitable<void> {
        (void)co_await server.async_serve(std::move(a));
        served = true;
      },
      asio::detached);
  worker_options<std::string> o;
  o.servers = {"shard0"};
  o.log = [&out](std::string_view line) { out.log.emplace_back(line); };
  if (on_clock) o.on_clock = [&](const clock_report& r) { on_clock(net, r); };
  basic_worker<test::counter_model, faulty_transport, policy_type, Recovery> w(wt, model, o);
  asio::co_spawn(
      net.get_executor(),
      [&]() -> asio::awaitable<void> {
        out.ec = co_await w.async_run(6);
        out.completed = true;
      },
      asio::detached);
  net.run_for(std::chrono::minutes(10));  // virtual time: a worker that hangs fails the test
  asio::post(net.get_executor(), [&] { server.stop(); });
  net.run_for(std::chrono::minutes(10));
  CHECK(served);  // the server was not brought down
  out.stats = w.stats();
  return out;
}

std::size_t out_of_memory_lines(const faulty_run& r) {
  return static_cast<std::size_t>(std::count_if(r.log.begin(), r.log.end(), [](const auto& l) {
    return l.find("out of memory while") != std::string::npos;
  }));
}

}  // namespace

TEST_CASE("worker: an allocation failure while receiving ends the run with resource_exhausted") {
  // Every frame the worker receives fails in turn: the handshake reply (0), then rows, acks
  // and heartbeats in the read loop; under SSP the worker also computes while a pull is
  // pending.
  const auto each_receive = [](auto policy) {
    const auto clean = run_with_faults({}, policy);
    REQUIRE(clean.completed);
    REQUIRE(!clean.ec);
    REQUIRE(clean.stats.clocks == 6);
    REQUIRE(clean.faults.receives >= 3);  // the handshake reply and two rows at least
    CHECK(clean.stats.out_of_memory == 0);
    CHECK(out_of_memory_lines(clean) == 0);
    for (int at = 0; at < clean.faults.receives; ++at) {
      CAPTURE(at);
      const auto r = run_with_faults({.receive_at = at}, policy);
      CHECK(r.completed);  // no hang, no exception out of a coroutine
      CHECK(r.ec == errc::resource_exhausted);
      CHECK(r.stats.out_of_memory == 1);
      CHECK(out_of_memory_lines(r) == 1);
      if (at == 0) CHECK(r.log.front().find("while connecting") != std::string::npos);
      if (at > 0) CHECK(r.log.front().find("while receiving from server 0") != std::string::npos);
    }
  };
  each_receive(consistency::bsp{});
  each_receive(consistency::ssp<2>{});
  each_receive(consistency::vap{});  // the read loops may send (acks): the shell's reply path
}

TEST_CASE("worker: an allocation failure building a pull or a gradient ends the run cleanly") {
  const auto clean = run_with_faults({}, consistency::bsp{});
  REQUIRE(!clean.ec);
  REQUIRE(clean.faults.allocations > 6);  // at least the gradient buffer of every clock
  for (int at = 0; at < clean.faults.allocations; ++at) {
    CAPTURE(at);
    const auto r = run_with_faults({.allocate_at = at}, consistency::bsp{});
    CHECK(r.completed);
    CHECK(r.ec == errc::resource_exhausted);
    CHECK(r.stats.out_of_memory == 1);
    CHECK(out_of_memory_lines(r) == 1);
  }
}

TEST_CASE("worker: an allocation failure while reconnecting ends the run with resource_exhausted") {
  // After clock 2 the link is cut for 50 ms; recovery::stateless reconnects, and the
  // reconnect's handshake reply (the first receive on the second connection) fails.
  const auto cut = [](simulated_network& net, const clock_report& r) {
    if (r.clock == 2)
      net.link_down("worker0", "server0", net.now().time_since_epoch(),
                    net.now().time_since_epoch() + std::chrono::milliseconds(50));
  };
  const auto clean = run_with_faults<recovery::stateless>({}, consistency::bsp{}, cut);
  REQUIRE(clean.completed);
  REQUIRE(!clean.ec);
  REQUIRE(clean.faults.connections == 2);  // the cut was survived by one reconnect
  CHECK(clean.stats.reconnects == 1);
  const auto r =
      run_with_faults<recovery::stateless>({.first_receive_on = 1}, consistency::bsp{}, cut);
  CHECK(r.completed);
  CHECK(r.ec == errc::resource_exhausted);
  CHECK(r.stats.out_of_memory == 1);
  CHECK(out_of_memory_lines(r) == 1);
  CHECK(std::any_of(r.log.begin(), r.log.end(), [](const auto& l) {
    return l.find("out of memory while reconnecting to server 0") != std::string::npos;
  }));
}

TEST_CASE("worker: stop() during a reconnect's backoff ends the run at once, not after the wait") {
  // recovery::stateless reconnects for up to 10 minutes. From clock 2 on the link to the
  // server is down for an hour, so the worker waits between refused connect attempts (a
  // backoff of 20 ms doubling up to 500 ms); it trains on locally meanwhile, and once its
  // clocks are done it waits for the reconnect to deliver its backlog. stop() comes 3.01 s
  // into the outage, in virtual time: the run must end at that instant, not when the backoff
  // wait it came into would have ended.
  simulated_network net;
  test::counter_model model(0, 1, 0, 2, 1, 0);
  simulated_transport st(net, "server0");
  simulated_transport wt(net, "worker0");
  server_options so;
  so.num_workers = 1;
  so.tables = {model.spec[0]};
  so.log = [](std::string_view) {};
  basic_server<simulated_transport, consistency::bsp, recovery::stateless> server(st, so);
  auto acc = st.listen("shard0");
  REQUIRE(acc.has_value());
  asio::co_spawn(
      net.get_executor(),
      [&, a = std::move(acc).value()]() mutable -> asio::awaitable<void> {
        (void)co_await server.async_serve(std::move(a));
      },
      asio::detached);
  worker_options<std::string> o;
  o.servers = {"shard0"};
  std::vector<std::string> log;
  o.log = [&](std::string_view l) { log.emplace_back(l); };
  using worker_t =
      basic_worker<test::counter_model, simulated_transport, consistency::bsp, recovery::stateless>;
  worker_t* wp = nullptr;
  simulated_timer stop_timer(net.get_executor());
  std::optional<simulated_clock::time_point> stopped_at, ended_at;
  o.on_clock = [&](const clock_report& r) {
    if (r.clock != 2) return;
    const auto t = net.now().time_since_epoch();
    net.link_down("worker0", "server0", t, t + std::chrono::hours(1));
    stop_timer.expires_after(std::chrono::milliseconds(3010));
    stop_timer.async_wait([&](std::error_code ec) {
      if (ec) return;
      stopped_at = net.now();
      wp->stop();
    });
  };
  worker_t w(wt, model, o);
  wp = &w;
  std::optional<std::error_code> ec;
  asio::co_spawn(
      net.get_executor(),
      [&]() -> asio::awaitable<void> {
        ec = co_await w.async_run(100);
        ended_at = net.now();
      },
      asio::detached);
  net.run_for(std::chrono::minutes(30));  // virtual time: a broken stop() ends at the timeout
  asio::post(net.get_executor(), [&] { server.stop(); });
  net.run_for(std::chrono::minutes(1));
  std::string all;
  for (const auto& l : log) all += l + "\n";
  INFO(all);
  REQUIRE(stopped_at.has_value());
  REQUIRE(ended_at.has_value());
  REQUIRE(ec.has_value());
  CHECK(*ec == errc::stopped);
  // The worker was reconnecting when it was stopped: never reconnected, had not given up.
  CHECK(w.stats().reconnects == 0);
  CHECK(std::none_of(log.begin(), log.end(), [](const std::string& l) {
    return l.find("giving up") != std::string::npos;
  }));
  // No virtual time passed between stop() and the run's end: the backoff wait was cut.
  CHECK(*ended_at - *stopped_at == simulated_clock::duration::zero());
}
