// asyncps — recovery::checkpoint: periodic two-phase checkpoints of every server shard, restored
// when a server starts; workers reconnect to a restarted server.
//
// Follows CheckFreq (Mohan et al., FAST'21): a checkpoint is a cheap in-memory *snapshot* taken
// on the server's executor at a clock boundary (`basic_server::save_state`, one memcpy of
// parameters and optimizer state), then a *persist* on one background thread
// (`detail::write_checkpoint`: write, fsync, atomic rename). At most one persist is in flight;
// a checkpoint that falls due while one is still running is skipped. The interval is fixed
// (every N clocks and/or every T seconds) or adaptive: profiled from the measured snapshot,
// persist and clock times, and grown while the observed overhead exceeds a bound.
//
// The parts live in recovery/checkpoint/: options.hpp (options, counters), schedule.hpp (the
// interval math, pure), store.hpp (the files), persister.hpp (the thread), server_part.hpp,
// worker_part.hpp. A restarted server loses at most the updates since its newest valid
// checkpoint (one interval, plus the one being persisted when it died). See
// docs/recovery/checkpoint.md.
#pragma once

#include <string_view>
#include <type_traits>

#include "asyncps/recovery.hpp"
#include "asyncps/recovery/checkpoint/options.hpp"
#include "asyncps/recovery/checkpoint/server_part.hpp"
#include "asyncps/recovery/checkpoint/worker_part.hpp"

namespace asyncps::recovery {

/// The checkpoint recovery policy. Follows CheckFreq (Mohan et al., FAST'21).
///
/// Server part (`checkpoint_server_part`): restores the newest valid checkpoint of its shard
/// when `async_serve` starts and checkpoints at server clock boundaries. Worker part
/// (`checkpoint_worker_part`): on a lost server connection, reconnect (within
/// `reconnect_timeout`) and resume from the restored state.
struct checkpoint {
  static constexpr std::string_view name = "checkpoint";

  using server_part = checkpoint_server_part;
  using worker_part = checkpoint_worker_part;
};

static_assert(recovery_policy<checkpoint>);
static_assert(std::is_nothrow_move_constructible_v<checkpoint::server_part>,
              "asyncps: checkpoint::server_part must be nothrow-movable (basic_server moves it)");

}  // namespace asyncps::recovery
