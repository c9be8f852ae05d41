// asyncps — the `consistency_policy` concept: when may a worker read its cached rows?
//
// Policies are pure logic over clocks (no network), following Ho et al. (NIPS 2013, SSP) and
// Dai et al. (AAAI 2015, ESSP/VAP) as implemented in Petuum Bösen. Clocks count completed
// iterations; a server's clock is the minimum over its workers' clocks, so rows stamped with
// server clock m reflect every update from clocks <= m-1. Requirements:
// docs/concepts/consistency.md.
#pragma once

#include <concepts>
#include <cstdint>
#include <limits>
#include <string_view>

#include "asyncps/layout.hpp"

namespace asyncps {

/// What a worker does before reading a (table, shard) part of its cache at a clock.
enum class read_action {
  read,              ///< the cache is fresh enough: read it
  read_and_refresh,  ///< read it now, and ask for fresher rows without waiting (ASP)
  fetch,             ///< send a pull for rows at least `min_server_clock` fresh, then wait
  wait,              ///< wait: fresh rows will be pushed by the server (ESSP)
};

/// Smallest representable clock: "no requirement".
inline constexpr clock_value no_clock = std::numeric_limits<clock_value>::min() / 2;

/// A consistency model.
///
/// | expression                          | type               | semantics |
/// |-------------------------------------|--------------------|-----------|
/// | `P::name`                           | `std::string_view` | for logs and reports |
/// | `P::eager`                          | `bool` constant    | servers push subscribed rows whenever their clock advances |
/// | `p.min_server_clock(c)`             | `clock_value`          | oldest server clock a worker at clock `c` may read (`no_clock`: any) |
/// | `p.on_read(c, cached, have_cache)`  | `read_action`      | decision for a cache part stamped `cached` |
///
/// Invariant every policy must keep: `on_read` returns `read`/`read_and_refresh` only when
/// `have_cache && cached >= min_server_clock(c)`.
template <class P>
concept consistency_policy = std::default_initializable<P> &&
                             requires(const P& p, clock_value c, clock_value cached, bool have) {
                               { P::name } -> std::convertible_to<std::string_view>;
                               typename std::bool_constant<P::eager>;  // a constant expression
                               { P::eager } -> std::convertible_to<bool>;
                               { p.min_server_clock(c) } -> std::same_as<clock_value>;
                               { p.on_read(c, cached, have) } -> std::same_as<read_action>;
                             };

/// Whether `P` is a value-bounded policy (VAP, Dai et al. 2015): besides the clock rules above
/// it declares `static constexpr bool value_bounded = true` and `float threshold(clock_value c)`
/// (the most update magnitude a worker at clock `c` may have in transit). Servers then push
/// fresh rows to every reader after each writer's clock and acknowledge it; workers block
/// while their unacknowledged (not yet visible) updates would exceed the threshold.
template <class P>
inline constexpr bool is_value_bounded_v = [] {
  if constexpr (requires { P::value_bounded; }) {
    return static_cast<bool>(P::value_bounded);
  } else {
    return false;
  }
}();

}  // namespace asyncps
