// asyncps — detail: building the pushes of one clock from the gradient buffer, sans-io.
//
// Per shard, one push per table the shard owns rows of: a range push whose payload is the
// shard's slice of the gradient buffer itself (shared, never copied), the last one marked
// `end_of_clock`; a shard that owns no rows at all gets a bare `clock` message instead. A model
// that names the rows it touched (`sparse_gradient_source`) gets a keyed push of only those
// rows when that is smaller. VAP: the magnitude of a clock's update to each shard.
// tests/unit/worker_core_test.cpp steps these against a `worker_cache`.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>

#include <Eigen/Core>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/worker/cache.hpp"
#include "asyncps/table.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::detail {

/// Message `t` of the pushes of clock `c` to shard `s` (`parts`: the shard's cache parts):
/// for `t < parts.size()` the range push of table t's slice of `grad` (nothing when the shard
/// owns no rows of it), numbered `++seq`, with `end_of_clock` on the shard's last push; for
/// `t == parts.size()` a bare `clock` message (unnumbered) when the shard owns no rows at all.
/// `part_offset`: the slice's offset in `grad` (floats). No copy: the payload shares `grad`.
inline std::optional<message> build_push(std::span<const cache_part> parts, table_id t,
                                         clock_value c, const buffer& grad, std::size_t part_offset,
                                         std::uint32_t width, std::uint32_t sender,
                                         std::uint64_t& seq) {
  table_id last = 0;
  bool any = false;
  for (table_id i = 0; i < parts.size(); ++i)
    if (!parts[i].range.empty()) {
      last = i;
      any = true;
    }
  message m;
  m.header.sender = sender;
  m.header.clock = c;
  if (t == parts.size()) {
    if (any) return std::nullopt;
    m.header.type = message_type::clock;
    return m;
  }
  const auto& p = parts[t];
  if (p.range.empty()) return std::nullopt;
  const std::size_t bytes = std::size_t{p.range.size()} * width * sizeof(float);
  m.header.type = message_type::push;
  m.header.flags =
      static_cast<std::uint8_t>(frame_flags::range | (t == last ? frame_flags::end_of_clock : 0));
  m.header.table = t;
  m.header.seq = ++seq;
  m.header.first_row = p.range.begin;
  m.header.row_count = p.range.size();
  m.header.width = width;
  m.payload = grad.share(part_offset * sizeof(float), bytes);
  return m;
}

/// Sparse models: turns range push `m` of part `range` (table values at `table_values`, a
/// table of `width` floats per row inside the gradient) into a keyed push of only the rows in
/// `touched` (sorted) that fall in the part, when that is smaller on the wire. The rows are
/// copied into one buffer from `allocate(bytes)` (keys, padded to 16 bytes, then the rows).
template <class Allocate>
void sparsify(message& m, key_range range, std::span<const row_id> touched,
              const float* table_values, std::uint32_t width, Allocate&& allocate) {
  const auto lo = std::lower_bound(touched.begin(), touched.end(), range.begin);
  const auto hi = std::lower_bound(lo, touched.end(), range.end);
  const auto n = static_cast<std::uint32_t>(hi - lo);
  const std::size_t keys = key_bytes(n);
  const std::size_t bytes = keys + std::size_t{n} * width * sizeof(float);
  if (bytes >= m.payload.size()) return;
  buffer b = allocate(bytes);
  std::memset(b.data(), 0, keys);
  if (n > 0) std::memcpy(b.data(), std::to_address(lo), std::size_t{n} * sizeof(row_id));
  float* rows = reinterpret_cast<float*>(b.data() + keys);
  for (std::uint32_t i = 0; i < n; ++i)
    std::memcpy(rows + std::size_t{i} * width, table_values + std::size_t{lo[i]} * width,
                width * sizeof(float));
  m.header.flags = static_cast<std::uint8_t>(m.header.flags & ~frame_flags::range);
  m.header.first_row = 0;
  m.header.row_count = n;
  m.payload = std::move(b);
}

/// VAP: the magnitude of a clock's update to shard `s`: `lr` times the L2 norm of the shard's
/// slices of `grad` (one per table).
template <bool SparseReads>
float update_magnitude(const worker_cache<SparseReads>& cache, std::uint32_t s,
                       std::span<const float> grad, float lr) {
  double sq = 0;
  const auto& parts = cache.parts(s);
  for (table_id t = 0; t < parts.size(); ++t) {
    if (parts[t].range.empty()) continue;
    const Eigen::Map<const Eigen::VectorXf> g(grad.data() + cache.part_offset(s, t),
                                              static_cast<Eigen::Index>(cache.part_floats(s, t)));
    sq += static_cast<double>(g.squaredNorm());
  }
  return lr * static_cast<float>(std::sqrt(sq));
}

/// check_gradients: fills `grad` with the bit pattern `bits` (a NaN no computation produces).
inline void fill_bits(buffer& grad, std::uint32_t bits) noexcept {
  const auto n = grad.size() / sizeof(std::uint32_t);
  auto* p = reinterpret_cast<std::uint32_t*>(grad.data());
  std::fill(p, p + n, bits);
}

/// A value of a gradient that must not be pushed (see `find_bad_value`).
struct bad_value {
  table_id table = 0;
  std::size_t index = 0;   ///< in the table (row = index / width, column = index % width)
  bool unwritten = false;  ///< still the fill pattern (else NaN or infinite, computed)
  float value = 0;
};

/// check_gradients: the first value of `grad` (table-major over `tables`) that is still the
/// fill pattern `bits` or is NaN/infinite; nothing when every value is finite.
inline std::optional<bad_value> find_bad_value(std::span<const table_spec> tables,
                                               const buffer& grad, std::uint32_t bits) noexcept {
  const auto* raw = reinterpret_cast<const std::uint32_t*>(grad.data());
  const float* vals = grad.floats().data();
  std::size_t off = 0;
  for (table_id t = 0; t < tables.size(); ++t) {
    const std::size_t n = tables[t].size();
    for (std::size_t i = 0; i < n; ++i) {
      const bool unwritten = raw[off + i] == bits;
      if (!unwritten && std::isfinite(vals[off + i])) continue;
      return bad_value{t, i, unwritten, vals[off + i]};
    }
    off += n;
  }
  return std::nullopt;
}

}  // namespace asyncps::detail
