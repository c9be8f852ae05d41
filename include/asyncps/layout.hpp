// asyncps — parameter layouts without Eigen: table and row ids, clocks, `table_spec`, key
// ranges, shard arithmetic and initial values.
//
// Parameters are tables of rows: each table is `rows x width` float32, row-major, addressed
// by (table, row). Servers own contiguous row ranges (shards) of every table: shard `s` of
// `S` owns rows [floor(rows*s/S), floor(rows*(s+1)/S)). A dense model is one or a few tables;
// matrix factorization or embeddings use sparse row sets of large tables.
//
// Include this header where a layout is described or split and no parameter is read through
// a matrix (wire formats, options, state machines, tools): it does not include Eigen.
// `asyncps/table.hpp` adds the Eigen views a model reads and writes (`parameter_view`,
// `gradient_view`) and includes this header.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "asyncps/detail/config.hpp"

namespace asyncps {

/// Index of a row inside a table.
using row_id = std::uint32_t;
/// Index of a table.
using table_id = std::uint32_t;
/// A logical clock: the number of iterations a worker has completed (0 at start).
using clock_value = std::int64_t;

/// Shape of one parameter table. `init_scale` > 0 initialises every value uniformly in
/// [-init_scale, init_scale] from a generator seeded by (seed, table, row), so the initial
/// state does not depend on how the table is sharded; 0 initialises to zeros.
struct table_spec {
  table_id id = 0;          ///< must equal the table's index in its layout
  std::uint32_t rows = 0;   ///< number of rows (> 0)
  std::uint32_t width = 0;  ///< floats per row (> 0)
  float init_scale = 0.0f;  ///< see above

  /// Number of floats in the table.
  constexpr std::size_t size() const noexcept { return std::size_t{rows} * width; }
  friend constexpr bool operator==(const table_spec&, const table_spec&) = default;
};

/// A half-open range of rows [begin, end) of one table.
struct key_range {
  row_id begin = 0;
  row_id end = 0;
  constexpr std::uint32_t size() const noexcept { return end - begin; }
  constexpr bool empty() const noexcept { return end <= begin; }
  constexpr bool contains(row_id r) const noexcept { return r >= begin && r < end; }
  friend constexpr bool operator==(const key_range&, const key_range&) = default;
};

/// The rows of a `rows`-row table owned by `shard` of `num_shards` (balanced contiguous split).
/// Preconditions: `num_shards > 0`, `shard < num_shards`. Complexity: O(1).
constexpr key_range shard_range(std::uint32_t rows, std::uint32_t shard,
                                std::uint32_t num_shards) noexcept {
  const auto r = std::uint64_t{rows};
  return {static_cast<row_id>(r * shard / num_shards),
          static_cast<row_id>(r * (shard + 1) / num_shards)};
}

/// The shard that owns row `row` of a `rows`-row table split `num_shards` ways.
/// Preconditions: `row < rows`, `num_shards > 0`. Complexity: O(1).
constexpr std::uint32_t shard_of(std::uint32_t rows, row_id row,
                                 std::uint32_t num_shards) noexcept {
  // The inverse of shard_range: the largest s with floor(rows*s/S) <= row.
  auto s = static_cast<std::uint32_t>((std::uint64_t{row} * num_shards + num_shards - 1) / rows);
  while (s > 0 && shard_range(rows, s, num_shards).begin > row) --s;
  while (s + 1 < num_shards && shard_range(rows, s + 1, num_shards).begin <= row) ++s;
  return s;
}

/// Writes the initial values of rows `rows` of table `spec` under the initial-value seed
/// `seed` (`server_options::seed`) into `out`, row-major: what every server shard holding those
/// rows starts with. Zeros when `spec.init_scale == 0`; otherwise each row r is drawn uniformly
/// from [-init_scale, init_scale] by a `std::mt19937` seeded with the `std::seed_seq` of
/// (seed low 32 bits, seed high 32 bits, spec.id, r), so the values do not depend on the
/// sharding, and a program without servers (e.g. a single-process baseline) can start from
/// exactly the servers' initial state.
/// Preconditions: `out.size() == rows.size() * spec.width`.
/// Errors: `std::bad_alloc` (from `std::seed_seq`). Complexity: O(out.size()).
/// Thread safety: reentrant.
ASYNCPS_DECL void initial_values(const table_spec& spec, key_range rows, std::uint64_t seed,
                                 std::span<float> out);

/// Offset, in floats, of table `t` in the table-major layout of `tables` (the sum of the sizes
/// of the tables before it). Precondition: `t <= tables.size()`. Complexity: O(t).
constexpr std::size_t table_offset(std::span<const table_spec> tables, table_id t) noexcept {
  std::size_t off = 0;
  for (table_id i = 0; i < t; ++i) off += tables[i].size();
  return off;
}

/// Total number of floats in a layout.
constexpr std::size_t layout_size(std::span<const table_spec> tables) noexcept {
  std::size_t n = 0;
  for (const auto& t : tables) n += t.size();
  return n;
}

}  // namespace asyncps

#if !defined(ASYNCPS_SEPARATE_COMPILATION)
#include "asyncps/impl/layout.ipp"
#endif
