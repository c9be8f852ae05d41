// asyncps — detail::shard_core, the read path: a pull reply's rows, a reader's subscription,
// and the eager rows a subscribed reader gets when the server clock advances.
//
// Out-of-line definitions of members declared in asyncps/detail/server/shard_core.hpp. Not a header
// to include on its own: shard_core.hpp includes it at its end, after the class it defines members
// of (so this file does not include shard_core.hpp back).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <system_error>
#include <utility>

#include "asyncps/buffer.hpp"
#include "asyncps/error.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/shard_state.hpp"
#include "asyncps/table.hpp"
#include "asyncps/wire.hpp"
namespace asyncps::detail {

template <optimizer_policy Optimizer, class Reader, class TimePoint>
template <class Alloc>
buffer shard_core<Optimizer, Reader, TimePoint>::rows_payload(table_id tid, bool ranged,
                                                              std::uint64_t first,
                                                              std::uint32_t count,
                                                              std::span<const row_id> keys,
                                                              Alloc&& alloc) const {
  const auto& t = tables_[tid];
  const std::uint32_t w = t.spec.width;
  const std::size_t kb = ranged ? 0 : key_bytes(count);
  buffer b = alloc(kb + std::size_t{count} * w * sizeof(float));
  auto* out = reinterpret_cast<float*>(b.data() + kb);
  if (ranged) {
    std::memcpy(out, t.values.data() + std::size_t{static_cast<row_id>(first) - t.range.begin} * w,
                std::size_t{count} * w * sizeof(float));
  } else {
    if (kb != 0) {
      std::memset(b.data(), 0, kb);
      std::memcpy(b.data(), keys.data(), keys.size() * sizeof(row_id));
    }
    for (std::uint32_t i = 0; i < count; ++i)
      std::memcpy(out + std::size_t{i} * w,
                  t.values.data() + std::size_t{keys[i] - t.range.begin} * w, w * sizeof(float));
  }
  return b;
}

template <optimizer_policy Optimizer, class Reader, class TimePoint>
void shard_core<Optimizer, Reader, TimePoint>::subscribe(subscription& sub,
                                                         const message& req) const {
  const key_range all = tables_[req.header.table].range;
  // The reply just sent has these rows as of now; rows subscribed earlier are current as of
  // `synced` (older), so a first subscription starts at the table's current version.
  if (!sub.ranged && sub.keys.empty()) sub.synced = tables_[req.header.table].version;
  if (req.header.has(frame_flags::range)) {
    const key_range r{static_cast<row_id>(req.header.first_row),
                      static_cast<row_id>(req.header.first_row + req.header.row_count)};
    sub.range = sub.ranged
                    ? key_range{std::min(sub.range.begin, r.begin), std::max(sub.range.end, r.end)}
                    : r;
    sub.ranged = true;
    std::erase_if(sub.keys, [&](row_id k) {
      if (!sub.range.contains(k)) return false;
      sub.keyed[k - all.begin] = false;
      return true;
    });
  } else {
    if (sub.keyed.empty()) sub.keyed.assign(all.size(), false);
    for (const row_id k : payload_keys(req)) {
      if ((sub.ranged && sub.range.contains(k)) || sub.keyed[k - all.begin]) continue;
      sub.keyed[k - all.begin] = true;
      sub.keys.push_back(k);
    }
    if (sub.keys.size() + (sub.ranged ? sub.range.size() : 0) == all.size()) {
      sub.ranged = true;
      sub.range = all;
      sub.keys.clear();
      std::fill(sub.keyed.begin(), sub.keyed.end(), false);
    }
  }
}

template <optimizer_policy Optimizer, class Reader, class TimePoint>
template <class Alloc>
eager_rows shard_core<Optimizer, Reader, TimePoint>::eager_rows_for(table_id t, subscription& sub,
                                                                    buffer& whole,
                                                                    Alloc&& alloc) const {
  const auto& ts = tables_[t];
  const key_range all = ts.range;
  const std::uint32_t w = ts.spec.width;
  eager_rows out;
  // Every row changed since `synced` (dense models: always) needs no scan.
  const bool all_fresh = ts.all_changed > sub.synced;
  const auto fresh = [&](row_id r) {
    return all_fresh || ts.row_version[r - all.begin] > sub.synced;
  };
  auto n = static_cast<std::uint32_t>(sub.keys.size() + (sub.ranged ? sub.range.size() : 0));
  if (!all_fresh) {
    n = 0;
    if (sub.ranged)
      for (row_id r = sub.range.begin; r < sub.range.end; ++r) n += fresh(r) ? 1 : 0;
    for (const row_id k : sub.keys) n += fresh(k) ? 1 : 0;
  }
  if (sub.ranged && sub.range == all && n == all.size()) {
    if (whole.empty()) whole = rows_payload(t, true, all.begin, all.size(), {}, alloc);
    out.ranged = true;
    out.range = all;
    out.count = all.size();
    out.payload = whole.share();
  } else {
    const std::size_t kb = key_bytes(n);
    buffer b = alloc(kb + std::size_t{n} * w * sizeof(float));
    std::memset(b.data(), 0, kb);
    auto* keys = reinterpret_cast<row_id*>(b.data());
    auto* rows = reinterpret_cast<float*>(b.data() + kb);
    const auto add = [&](row_id r) {
      if (!fresh(r)) return;
      *keys++ = r;
      std::memcpy(rows, ts.values.data() + std::size_t{r - all.begin} * w, w * sizeof(float));
      rows += w;
    };
    if (sub.ranged)
      for (row_id r = sub.range.begin; r < sub.range.end; ++r) add(r);
    for (const row_id k : sub.keys) add(k);
    out.count = n;
    out.payload = std::move(b);
  }
  sub.synced = ts.version;
  return out;
}

}  // namespace asyncps::detail
