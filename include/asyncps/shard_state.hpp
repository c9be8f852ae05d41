// asyncps — shard_state: a complete copy of one parameter-server shard's state.
//
// What a checkpoint persists, what a restarted server restores, and what a recovery policy
// transfers between servers. `basic_server::save_state` fills one (reusing its vectors'
// capacity, so a periodic snapshot allocates nothing after the first) and
// `basic_server::restore_state` installs one after checking that it fits the server.
#pragma once

#include <cstdint>
#include <vector>

#include "asyncps/layout.hpp"

namespace asyncps {

/// One table of a `shard_state`: this shard's rows of the table plus the optimizer's state.
struct table_state_copy {
  table_spec spec{};       ///< the table's shape (whole table, not just this shard)
  key_range range{};       ///< the rows this shard owns
  std::uint64_t step = 0;  ///< optimizer steps applied to this table (Adam's bias correction)
  /// `range.size() x spec.width` float32, row-major.
  std::vector<float> values;
  /// `state_per_param` planes of `values.size()` floats each (momentum, AdaGrad sums, Adam
  /// moments), plane-major; empty for plain SGD.
  std::vector<float> optimizer_state;
};

/// A copy of one shard's state at a server clock boundary.
struct shard_state {
  std::uint32_t shard = 0;                 ///< which shard
  std::uint32_t num_shards = 1;            ///< of how many
  std::uint32_t num_workers = 1;           ///< size of the vector clock
  std::uint32_t state_per_param = 0;       ///< the optimizer's `state_per_param`
  clock_value server_clock = 0;            ///< minimum of `worker_clocks`
  std::vector<clock_value> worker_clocks;  ///< `num_workers` clocks as the server saw them
  /// Pushes applied per (worker, table): `applied[w * tables.size() + t]`. A reconnecting
  /// worker compares it with what it sent to count its updates lost by a restore.
  std::vector<std::uint64_t> applied;
  /// Highest push sequence number applied per worker (`num_workers` entries), which chain
  /// replication uses to drop a push resent after a failover; empty when not tracked
  /// (checkpoint files do not store it).
  std::vector<std::uint64_t> last_seq;
  std::vector<table_state_copy> tables;  ///< one per table, in table-id order

  /// Bytes of parameter and optimizer data held (what a snapshot copies).
  std::uint64_t data_bytes() const noexcept {
    std::uint64_t n = 0;
    for (const auto& t : tables) n += (t.values.size() + t.optimizer_state.size()) * sizeof(float);
    return n;
  }
};

}  // namespace asyncps
