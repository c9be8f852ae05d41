// asyncps — the types a server shard keeps (detail::shard_core): one table's rows, optimizer
// state and change versions; a reader's subscription; an eager rows message; a waiting pull.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "asyncps/buffer.hpp"
#include "asyncps/table.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::detail {

/// A table's values: `size()` floats in a pooled `buffer`, copy-on-write. `share` lends rows
/// to a pull reply without a copy; every write access (the non-const `data`, `begin`, `end`,
/// `operator[]`) first checks whether a reply (or a copy of this object) still holds the
/// bytes and, if so, moves the values to a fresh block of the same pool (`copies()` counts
/// these moves), so a reply keeps the bytes it was given, whole rows of one version, however
/// many pushes apply after it. With no reply outstanding a write costs one atomic load.
/// A writer that rewrites every value (a push of the whole table) writes out of place instead:
/// into `fresh_block()`, then `replace`, with no copy whether or not a reply holds the old
/// block. The block replaced is kept as a spare for the next such write (or copy), so the
/// values take up to two blocks. Copying a `table_values` shares the bytes too (a snapshot;
/// not the spare). Const access never copies.
/// Thread safety: one thread at a time (the shard's); the buffers `share` returns may be read
/// and dropped on any thread (the reference count is atomic; see `buffer::unique`).
class table_values {
 public:
  table_values() noexcept = default;
  /// Values in `storage`, a pooled buffer of a multiple of 4 bytes.
  explicit table_values(buffer storage) noexcept : storage_(std::move(storage)) {}
  table_values(const table_values& o) noexcept : storage_(o.storage_.share()) {}
  table_values& operator=(const table_values& o) noexcept {
    if (this != &o) storage_ = o.storage_.share();
    return *this;
  }
  table_values(table_values&&) noexcept = default;
  table_values& operator=(table_values&&) noexcept = default;
  ~table_values() = default;

  std::size_t size() const noexcept { return storage_.size() / sizeof(float); }
  bool empty() const noexcept { return size() == 0; }
  const float* data() const noexcept { return storage_.floats().data(); }
  /// For writing: copies the values first when they are shared. Exceptions: `std::bad_alloc`.
  float* data() {
    own();
    return storage_.floats().data();
  }
  const float* begin() const noexcept { return data(); }
  const float* end() const noexcept { return data() + size(); }
  float* begin() { return data(); }
  float* end() { return data() + size(); }
  float operator[](std::size_t i) const noexcept { return data()[i]; }
  float& operator[](std::size_t i) { return data()[i]; }
  operator std::span<const float>() const noexcept { return storage_.floats(); }
  friend bool operator==(const table_values& a, const table_values& b) noexcept {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

  /// A reference to floats [first, first + count), no copy: a later write access leaves these
  /// bytes as they are now. Precondition: `first + count <= size()`. Complexity: one atomic
  /// add.
  buffer share(std::size_t first, std::size_t count) const noexcept {
    return storage_.share(first * sizeof(float), count * sizeof(float));
  }
  /// Whether another reference holds the bytes (the next write access copies them).
  bool shared() const noexcept { return !storage_.empty() && !storage_.unique(); }
  /// A block of the values' size to write the next values into, out of place (`replace`):
  /// the spare (the block the values had before, once no reply holds it any more), else one
  /// from the values' pool; an empty buffer when the values have no pool. Exceptions:
  /// `std::bad_alloc`.
  buffer fresh_block() {
    if (spare_usable()) return std::move(spare_);
    buffer_pool* p = storage_.pool();
    return p != nullptr ? p->allocate(storage_.size()) : buffer{};
  }
  /// Makes `next` (a block from `fresh_block`, fully written) the values. The old block is
  /// kept as the spare (replies may still hold it: they keep its bytes), so that writing out
  /// of place in turn needs no allocation once warm: the values take two blocks.
  void replace(buffer next) noexcept {
    spare_ = std::move(storage_);
    storage_ = std::move(next);
  }
  /// Write accesses that found the values shared and copied them to a fresh block.
  std::uint64_t copies() const noexcept { return copies_; }

 private:
  void own() {
    if (!shared()) return;
    buffer fresh = fresh_block();  // values always have a pool here (the constructor's contract)
    std::memcpy(fresh.data(), storage_.data(), storage_.size());
    replace(std::move(fresh));
    ++copies_;
  }
  bool spare_usable() const noexcept {
    return !spare_.empty() && spare_.unique() && spare_.size() == storage_.size();
  }
  buffer storage_;
  buffer spare_;  // the values' previous block (see `replace`), or empty
  std::uint64_t copies_ = 0;
};

/// One table of a shard: this shard's rows of it, their optimizer state and change versions.
struct shard_table {
  table_spec spec;
  key_range range;
  table_values values;       ///< `range.size() x width`, row-major
  std::vector<float> state;  ///< `state_per_param` planes of `values.size()`
  std::uint64_t step = 0;    ///< optimizer steps applied
  // Change tracking for eager rows (only changed rows are pushed): `version` counts changes
  // of the table, `row_version[r]` is the version of row r's last change, `all_changed` the
  // last version that changed every row at once (dense pushes, restores).
  std::uint64_t version = 0;
  std::vector<std::uint64_t> row_version;
  std::uint64_t all_changed = 0;
};

/// The rows a reader subscribed to (by pulling them) in one table: a range (dense reads)
/// and/or single rows outside it (sparse reads), in order of their first pull.
struct subscription {
  bool ranged = false;
  key_range range{};
  std::vector<row_id> keys;
  std::vector<bool> keyed;  ///< per row of the shard: in `keys` (sized on the first keyed pull)
  /// The table version the reader's subscribed rows are current at (as of the last rows sent
  /// to it): eager rows carry only rows changed since.
  std::uint64_t synced = 0;
};

/// What an eager rows message to one reader holds (see `shard_core::eager_rows`).
struct eager_rows {
  bool ranged = false;      ///< the whole shard as a range (payload shared between readers)
  key_range range{};        ///< ranged: the rows
  std::uint32_t count = 0;  ///< rows in the payload
  buffer payload{};
};

/// A pull waiting for the server clock: its reader, the request, and when it was deferred.
template <class Reader, class TimePoint>
struct pending_pull {
  Reader reader;
  message request;
  TimePoint since{};
};

}  // namespace asyncps::detail
