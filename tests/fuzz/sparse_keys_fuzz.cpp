// libFuzzer target `sparse_keys`: the key lists of sparse pushes and pulls as a shard checks,
// applies, answers and subscribes them (detail::shard_core: check_rows, apply, rows_payload,
// subscribe, eager_rows_for). Input: frames as fuzz_support.hpp reads them; pushes and pulls
// go to the shard (any sender and clock: the session checks are the `frame` target's), other
// types are skipped.
//
// Invariants (abort on violation): an accepted message names only rows of the shard, in
// increasing order; an accepted push (check_rows, finite, check_update) changes exactly its
// rows by its gradient (sgd, rate 1) and leaves them finite; a pull's answer holds its keys
// and the shard's values; a subscription holds each row once, keyed rows outside its range,
// and its bitmap agrees with its keys; an eager rows message holds subscribed rows with the
// shard's values.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "asyncps/detail/server/shard_core.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/wire.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace asyncps;
using fuzz::require;
using core_t = detail::shard_core<optimizer::sgd, int, int>;

core_t make_core() {
  // Shard 1 of 3: table 0 rows [3, 6) x 3, table 1 rows [33, 66) x 1.
  const std::vector<table_spec> layout{table_spec{0, 10, 3, 0.25f}, table_spec{1, 100, 1, 0.0f}};
  return core_t(1, 3, 2, layout, 7, optimizer::sgd{1.0f});
}

void check_subscription(const core_t& core, table_id t, const detail::subscription& sub) {
  const key_range all = core.table(t).range;
  if (sub.ranged)
    require(sub.range.begin >= all.begin && sub.range.end <= all.end &&
                sub.range.begin <= sub.range.end,
            "a subscribed range is inside the shard");
  std::vector<row_id> keys = sub.keys;
  std::sort(keys.begin(), keys.end());
  require(std::adjacent_find(keys.begin(), keys.end()) == keys.end(), "each row once");
  for (row_id k : sub.keys) {
    require(all.contains(k), "subscribed keys are rows of the shard");
    require(!(sub.ranged && sub.range.contains(k)), "keyed rows lie outside the range");
    require(sub.keyed.size() == all.size() && sub.keyed[k - all.begin], "bitmap has the key");
  }
  const auto marked =
      static_cast<std::size_t>(std::count(sub.keyed.begin(), sub.keyed.end(), true));
  require(marked == sub.keys.size(), "the bitmap marks exactly the keys");
}

// Rows `n` of `payload` (keys first unless `ranged`) hold the shard's values of table `t`.
void check_rows(const core_t& core, table_id t, bool ranged, std::uint64_t first, std::uint32_t n,
                const buffer& payload) {
  const auto& ts = core.table(t);
  const std::uint32_t w = ts.spec.width;
  const std::size_t kb = ranged ? 0 : key_bytes(n);
  require(payload.size() == kb + std::size_t{n} * w * sizeof(float), "rows payload size");
  for (std::uint32_t i = 0; i < n; ++i) {
    row_id r = static_cast<row_id>(first + i);
    if (!ranged) std::memcpy(&r, payload.data() + 4 * std::size_t{i}, 4);
    require(ts.range.contains(r), "answered rows are rows of the shard");
    require(std::memcmp(payload.data() + kb + std::size_t{i} * w * sizeof(float),
                        ts.values.data() + std::size_t{r - ts.range.begin} * w,
                        w * sizeof(float)) == 0,
            "answered rows carry the shard's values");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::byte_reader in(std::as_bytes(std::span(data, size)));
  const wire_limits limits{};
  auto core = make_core();
  std::vector<detail::subscription> subs(core.num_tables());
  while (in.left() != 0) {
    message m;
    const auto r = fuzz::read_frame(in, limits, m);
    if (r.truncated) break;
    if (r.ec) continue;
    const auto& h = m.header;
    if (h.type != message_type::push && h.type != message_type::pull) continue;
    if (h.type == message_type::push && h.has(frame_flags::prefixed)) continue;  // a policy's
    std::string detail;
    const bool ok = !core.check_rows(m, detail);
    require(ok || !detail.empty(), "a refusal names what is wrong");
    if (!ok) continue;
    const auto& t = core.table(h.table);
    const auto keys = payload_keys(m);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      require(t.range.contains(keys[i]), "accepted keys are rows of the shard");
      require(i == 0 || keys[i] > keys[i - 1], "accepted keys are strictly increasing");
    }
    if (h.type == message_type::push) {
      // As the server: finite gradients whose update keeps the rows finite (check_update).
      if (!core_t::all_finite(payload_floats(m)) || core.check_update(m, detail)) continue;
      std::vector<float> expected(t.values.begin(), t.values.end());
      const auto g = payload_floats(m);
      const std::uint32_t w = t.spec.width;
      for (std::uint32_t i = 0; i < h.row_count; ++i) {
        const std::uint64_t row = h.has(frame_flags::range) ? h.first_row + i : keys[i];
        for (std::uint32_t j = 0; j < w; ++j)
          expected[(row - t.range.begin) * w + j] -= g[std::size_t{i} * w + j];
      }
      core.apply(m);
      require(std::memcmp(expected.data(), core.table(h.table).values.data(),
                          expected.size() * sizeof(float)) == 0,
              "an accepted push changes exactly its rows by its gradient");
      for (float v : core.table(h.table).values) require(std::isfinite(v), "values stay finite");
    } else {
      const bool ranged = h.has(frame_flags::range);
      auto rows =
          core.rows_payload(h.table, ranged, h.first_row, h.row_count, keys, fuzz::allocate);
      check_rows(core, h.table, ranged, h.first_row, h.row_count, rows);
      core.subscribe(subs[h.table], m);
      check_subscription(core, h.table, subs[h.table]);
    }
    // Eager rows for every subscribed table, as ESSP sends them when the clock advances.
    for (table_id tid = 0; tid < core.num_tables(); ++tid) {
      auto& sub = subs[tid];
      if (!sub.ranged && sub.keys.empty()) continue;
      buffer whole;
      auto e = core.eager_rows_for(tid, sub, whole, fuzz::allocate);
      check_rows(core, tid, e.ranged, e.ranged ? e.range.begin : 0, e.count, e.payload);
      require(e.count <= sub.keys.size() + (sub.ranged ? sub.range.size() : 0),
              "eager rows are subscribed rows");
    }
  }
  return 0;
}
