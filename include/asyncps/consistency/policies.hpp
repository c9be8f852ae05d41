// asyncps — consistency policies: bsp, ssp<s>, essp<s>, asp.
#pragma once

#include <string_view>

#include "asyncps/consistency.hpp"

namespace asyncps::consistency {

/// Stale synchronous parallel (Ho et al. 2013): a worker at clock c sees every update from
/// clocks <= c-s-1 and its own writes. Rows are pulled lazily, only when the cached copy is
/// older than c-s (Bösen's SSPConsistencyController), so observed staleness spreads over 0..s.
template <clock_value Staleness>
struct ssp {
  static_assert(Staleness >= 0, "asyncps::consistency::ssp<s>: the staleness bound s must be >= 0");
  static constexpr std::string_view name = "ssp";
  static constexpr bool eager = false;
  static constexpr clock_value staleness = Staleness;
  constexpr clock_value min_server_clock(clock_value c) const noexcept { return c - Staleness; }
  constexpr read_action on_read(clock_value c, clock_value cached, bool have) const noexcept {
    return have && cached >= c - Staleness ? read_action::read : read_action::fetch;
  }
};

/// Bulk synchronous parallel: SSP with staleness 0 (every worker waits for all others each clock).
struct bsp : ssp<0> {
  static constexpr std::string_view name = "bsp";
};

/// Eager SSP (Dai et al. 2015; Bösen's SSPPush): the same bound as `ssp<s>`, but servers push
/// every subscribed row whenever their clock advances, so workers rarely wait and observed
/// staleness concentrates at 0-1 clocks. Costs more bandwidth (rows sent every clock).
template <clock_value Staleness>
struct essp {
  static_assert(Staleness >= 0,
                "asyncps::consistency::essp<s>: the staleness bound s must be >= 0");
  static constexpr std::string_view name = "essp";
  static constexpr bool eager = true;
  static constexpr clock_value staleness = Staleness;
  constexpr clock_value min_server_clock(clock_value c) const noexcept { return c - Staleness; }
  constexpr read_action on_read(clock_value c, clock_value cached, bool have) const noexcept {
    if (!have) return read_action::fetch;  // first touch subscribes
    return cached >= c - Staleness ? read_action::read : read_action::wait;
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

static_assert(consistency_policy<bsp> && consistency_policy<ssp<3>> &&
              consistency_policy<essp<3>> && consistency_policy<asp>);

}  // namespace asyncps::consistency
