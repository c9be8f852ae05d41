// asyncps — recovery::checkpoint: its options and counters (see recovery/checkpoint.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <system_error>

#include "asyncps/layout.hpp"
#include "asyncps/result.hpp"
#include "asyncps/shard_state.hpp"

namespace asyncps::recovery {

/// How the checkpoint policy persists one snapshot: write `state` to `file` (atomically: a
/// reader must never see a partial file under that name). Called on the persist thread, one
/// call at a time. The default is `detail::write_checkpoint`. Replace it to inject delays or
/// failures in tests, or to copy the file elsewhere after writing it.
using checkpoint_writer =
    std::function<result<void>(const std::filesystem::path& file, const shard_state& state)>;

/// The time source of the checkpoint schedule: returns the current time of a monotonic clock.
/// Called on the server's executor (around each clock boundary and snapshot) and on the
/// persist thread (around each write), so it must be thread-safe. The default is
/// `std::chrono::steady_clock::now`; tests inject a fake clock to drive the schedule without
/// sleeping.
using checkpoint_clock = std::function<std::chrono::steady_clock::time_point()>;

/// Configuration of `checkpoint::server_part` (and of `checkpoint::worker_part`'s timeout).
///
/// Triggers: with `max_overhead == 0` a checkpoint is due when `every_clocks > 0` and that many
/// server clocks have passed since the last one, or when `every_seconds > 0` and that much time
/// has passed (whichever comes first). With `max_overhead > 0` the interval is adaptive (see
/// `checkpoint_schedule`); `every_clocks` is then only the first interval and `every_seconds`
/// is ignored. Triggers are evaluated when the server clock advances (an idle server takes no
/// checkpoints). With all three zero nothing is written: the policy only restores.
struct checkpoint_options {
  /// Where the checkpoint files live (`shard-<s>-clock-<c>.ckpt`); several shards may share
  /// it. Created when missing. Empty: the policy is disabled (no restore, no checkpoints).
  std::filesystem::path directory{};
  std::uint64_t every_clocks = 0;  ///< fixed interval in server clocks; 0: no clock trigger
  double every_seconds = 0;        ///< fixed interval in seconds (of `clock`); 0: none
  /// Adaptive interval when > 0: the largest fraction of the server's time that checkpointing
  /// may cost (snapshot time plus the slowdown while persisting), e.g. 0.05 = 5%.
  double max_overhead = 0;
  /// Checkpoint files of this shard kept after each successful persist (newest first);
  /// 0 keeps all.
  std::uint32_t keep = 2;
  /// Log sink for restores, rejected files and failed persists: one line, no trailing
  /// newline. Called only on the server's executor. Empty: stderr.
  std::function<void(std::string_view)> log{};
  /// How long a worker may try to reconnect to a lost server (`worker_part`).
  std::chrono::milliseconds reconnect_timeout{30000};
  /// How a snapshot is written; empty: `detail::write_checkpoint`. Called on the persist
  /// thread.
  checkpoint_writer writer{};
  /// Where the schedule and the timing counters read the time; empty:
  /// `std::chrono::steady_clock::now`.
  checkpoint_clock clock{};
};

/// Counters of a `checkpoint::server_part`. A copy, taken under the part's lock.
struct checkpoint_stats {
  std::uint64_t checkpoints_persisted = 0;  ///< snapshots written successfully
  /// Checkpoints that fell due while the previous persist was still running (not taken).
  std::uint64_t skipped = 0;
  std::uint64_t failed = 0;               ///< snapshots or persists that failed (see `last_error`)
  clock_value last_persisted_clock = -1;  ///< server clock of the newest persisted file; -1: none
  clock_value restored_clock = -1;        ///< server clock restored at start; -1: started fresh
  double snapshot_seconds_total = 0;      ///< seconds spent snapshotting on the server's executor
  double persist_seconds_total = 0;       ///< seconds spent persisting on the background thread
  double last_snapshot_seconds = 0;       ///< seconds of the newest snapshot
  double last_persist_seconds = 0;        ///< seconds of the newest successful persist
  std::uint64_t last_bytes = 0;           ///< parameter + optimizer bytes of the newest snapshot
  /// The current interval k in server clocks: `every_clocks` in fixed mode, the adaptive k
  /// otherwise; 0 when no clock trigger is set.
  std::uint64_t interval_clocks = 0;
  double clock_seconds = 0;  ///< measured seconds between server clocks (moving average)
  /// Adaptive mode: the overhead measured over the last completed interval (fraction of time).
  double observed_overhead = 0;
  std::error_code last_error{};    ///< the newest failure; empty if none
  std::string last_error_message;  ///< a line naming the file and the reason

  /// Calls `f(name, value)` for every number above, in declaration order (not `last_error`
  /// and its message); `name` is the member's name (a `const char*`), `value` a
  /// `std::uint64_t` count or byte count, a `clock_value` server clock (-1: none) or a
  /// `double` in seconds or as a fraction, as documented on the member. No `operator+=`:
  /// the clocks and the `last_*` members describe one server and do not add up.
  template <class F>
  void for_each_counter(F&& f) const {
    f("checkpoints_persisted", checkpoints_persisted);
    f("skipped", skipped);
    f("failed", failed);
    f("last_persisted_clock", last_persisted_clock);
    f("restored_clock", restored_clock);
    f("snapshot_seconds_total", snapshot_seconds_total);
    f("persist_seconds_total", persist_seconds_total);
    f("last_snapshot_seconds", last_snapshot_seconds);
    f("last_persist_seconds", last_persist_seconds);
    f("last_bytes", last_bytes);
    f("interval_clocks", interval_clocks);
    f("clock_seconds", clock_seconds);
    f("observed_overhead", observed_overhead);
  }
};

}  // namespace asyncps::recovery
