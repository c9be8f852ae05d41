// asyncps — consistency policies: bsp, ssp<s>, essp<s> (or ssp<>/essp<>: s set at run time),
// asp, vap.
#pragma once

#include <cmath>
#include <limits>
#include <string_view>

#include "asyncps/consistency.hpp"

namespace asyncps::consistency {

/// The staleness template argument of `ssp` and `essp` that means "set at run time": `ssp<>`
/// and `essp<>` hold the bound in a `clock_value staleness` member instead, so one
/// instantiation of `basic_worker`/`basic_server` serves every bound. Servers never read the
/// bound (it travels in each pull), and `policy_fingerprint` depends only on `eager`, so an
/// `ssp<>` worker interoperates with an `ssp<s>` server and the reverse.
inline constexpr clock_value run_time_staleness = std::numeric_limits<clock_value>::min();

/// Stale synchronous parallel (Ho et al. 2013): a worker at clock c sees every update from
/// clocks <= c-s-1 and its own writes. Rows are pulled lazily, only when the cached copy is
/// older than c-s (Bösen's SSPConsistencyController), so observed staleness spreads over 0..s.
/// `Staleness` is s in clocks (>= 0); `ssp<>` (`run_time_staleness`) takes s at run time.
template <clock_value Staleness = run_time_staleness>
struct ssp {
  static_assert(Staleness >= 0,
                "asyncps::consistency::ssp<s>: the staleness bound s must be >= 0 (or use ssp<> "
                "and set consistency().staleness at run time)");
  static constexpr std::string_view name = "ssp";
  static constexpr bool eager = false;
  static constexpr clock_value staleness = Staleness;
  constexpr clock_value min_server_clock(clock_value c) const noexcept { return c - Staleness; }
  constexpr read_action on_read(clock_value c, clock_value cached, bool have) const noexcept {
    return have && cached >= c - Staleness ? read_action::read : read_action::fetch;
  }
};

/// SSP with the bound set at run time: decides exactly as `ssp<staleness>`. Set `staleness`
/// through `basic_worker::consistency()` before `async_run`, on the worker's executor (like
/// `vap`'s fields); it must not change during a run.
/// Precondition: `staleness >= 0`; a negative value is read as 0 (BSP).
template <>
struct ssp<run_time_staleness> {
  static constexpr std::string_view name = "ssp";
  static constexpr bool eager = false;
  clock_value staleness = 0;  ///< the bound s in clocks (default 0: BSP)
  /// `staleness`, or 0 when it is negative.
  constexpr clock_value bound() const noexcept { return staleness < 0 ? 0 : staleness; }
  constexpr clock_value min_server_clock(clock_value c) const noexcept { return c - bound(); }
  constexpr read_action on_read(clock_value c, clock_value cached, bool have) const noexcept {
    return have && cached >= c - bound() ? read_action::read : read_action::fetch;
  }
};

/// Bulk synchronous parallel: SSP with staleness 0 (every worker waits for all others each clock).
struct bsp : ssp<0> {
  static constexpr std::string_view name = "bsp";
};

/// Eager SSP (Dai et al. 2015; Bösen's SSPPush): the same bound as `ssp<s>`, but servers push
/// every subscribed row whenever their clock advances, so workers rarely wait and observed
/// staleness concentrates at 0-1 clocks. Costs more bandwidth (rows sent every clock).
/// `Staleness` is s in clocks (>= 0); `essp<>` (`run_time_staleness`) takes s at run time.
template <clock_value Staleness = run_time_staleness>
struct essp {
  static_assert(Staleness >= 0,
                "asyncps::consistency::essp<s>: the staleness bound s must be >= 0 (or use "
                "essp<> and set consistency().staleness at run time)");
  static constexpr std::string_view name = "essp";
  static constexpr bool eager = true;
  static constexpr clock_value staleness = Staleness;
  constexpr clock_value min_server_clock(clock_value c) const noexcept { return c - Staleness; }
  constexpr read_action on_read(clock_value c, clock_value cached, bool have) const noexcept {
    if (!have) return read_action::fetch;  // first touch subscribes
    return cached >= c - Staleness ? read_action::read : read_action::wait;
  }
};

/// ESSP with the bound set at run time: decides exactly as `essp<staleness>`. Set `staleness`
/// through `basic_worker::consistency()` before `async_run`, on the worker's executor; it must
/// not change during a run. Precondition: `staleness >= 0`; a negative value is read as 0.
template <>
struct essp<run_time_staleness> {
  static constexpr std::string_view name = "essp";
  static constexpr bool eager = true;
  clock_value staleness = 0;  ///< the bound s in clocks (default 0)
  /// `staleness`, or 0 when it is negative.
  constexpr clock_value bound() const noexcept { return staleness < 0 ? 0 : staleness; }
  constexpr clock_value min_server_clock(clock_value c) const noexcept { return c - bound(); }
  constexpr read_action on_read(clock_value c, clock_value cached, bool have) const noexcept {
    if (!have) return read_action::fetch;  // first touch subscribes
    return cached >= c - bound() ? read_action::read : read_action::wait;
  }
};

/// Asynchronous parallel (Hogwild!/Downpour style): no bound. A worker reads whatever it has
/// and asks for fresh rows every clock without waiting for them.
struct asp {
  static constexpr std::string_view name = "asp";
  static constexpr bool eager = false;
  constexpr clock_value min_server_clock(clock_value) const noexcept { return no_clock; }
  constexpr read_action on_read(clock_value, clock_value, bool have) const noexcept {
    return have ? read_action::read_and_refresh : read_action::fetch;
  }
};

/// Value-bounded asynchronous parallel (VAP, Dai et al. 2015): no clock bound, but the
/// magnitude of a worker's updates that are not yet visible to every reader stays at most
/// `threshold(c)`. A worker reads whatever it has (like ASP); after computing a gradient it
/// waits, before pushing, while `in_transit + lr * |g|_2 > threshold(c)` and something is in
/// transit (an update larger than the threshold on its own is sent, then waited for: a
/// synchronous flush). `lr` is `worker_options::local_step` (1 when it is 0), so the magnitude
/// is that of the parameter change; `in_transit` sums the magnitudes of the worker's
/// unacknowledged clocks per server (a bound on the norm of their sum).
///
/// Visibility means the readers have the update: after applying a writer's last push of a
/// clock the server sends every reader its subscribed rows that changed (one eager rows message
/// per reader and table); each message that holds rows, to a reader other than the writer,
/// asks for an acknowledgement (`frame_flags::want_ack`), which the reader sends (an `ack`
/// carrying how many such messages it has installed) as soon as it has installed the rows. The
/// server acknowledges the writer's clock once every one of those readers has answered (a
/// reader whose connection closed no longer counts), at once when no other reader was sent
/// rows. Message cost per writer clock and shard: one ack to the writer, plus one rows message
/// per reader and table and one ack per reader sent rows — W² rows messages per round of W
/// clocks, against W for ESSP. Configure at run time through `basic_worker::consistency()`.
struct vap {
  static constexpr std::string_view name = "vap";
  static constexpr bool eager = false;  // rows go out after every writer clock instead
  static constexpr bool value_bounded = true;
  float magnitude = 0.5f;  ///< v_thr: the bound at clock 0 (parameter units, L2 norm)
  bool shrink = false;     ///< when true, the bound is magnitude / sqrt(c + 1)
  /// The bound on in-transit update magnitude at clock `c` (>= 0).
  float threshold(clock_value c) const noexcept {
    return shrink ? magnitude / std::sqrt(static_cast<float>(c < 0 ? 0 : c) + 1.0f) : magnitude;
  }
  constexpr clock_value min_server_clock(clock_value) const noexcept { return no_clock; }
  constexpr read_action on_read(clock_value, clock_value, bool have) const noexcept {
    return have ? read_action::read : read_action::fetch;
  }
};

static_assert(consistency_policy<bsp> && consistency_policy<ssp<3>> &&
              consistency_policy<essp<3>> && consistency_policy<ssp<>> &&
              consistency_policy<essp<>> && consistency_policy<asp> && consistency_policy<vap> &&
              is_value_bounded_v<vap> && !is_value_bounded_v<asp>);

}  // namespace asyncps::consistency
