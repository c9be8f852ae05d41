// asyncps — the types a server shard keeps (detail::shard_core): one table's rows, optimizer
// state and change versions; a reader's subscription; an eager rows message; a waiting pull.
#pragma once

#include <cstdint>
#include <vector>

#include "asyncps/buffer.hpp"
#include "asyncps/table.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::detail {

/// One table of a shard: this shard's rows of it, their optimizer state and change versions.
struct shard_table {
  table_spec spec;
  key_range range;
  std::vector<float> values;  ///< `range.size() x width`, row-major
  std::vector<float> state;   ///< `state_per_param` planes of `values.size()`
  std::uint64_t step = 0;     ///< optimizer steps applied
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
