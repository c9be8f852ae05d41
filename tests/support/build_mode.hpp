// Test helper: how much random work a test does in this build. The dev stage runs every test
// optimised (-O2) with the full counts; the clang-asan stage builds without optimisation (-O0,
// to halve its build time), where the simulation and Eigen run about 10x slower, and runs a
// quarter of the random schedules: it is there to catch memory errors and undefined behaviour
// on every code path, which a quarter of the schedules still reach.
#pragma once

#include <algorithm>
#include <cstdint>

namespace asyncps::test {

/// Whether this test binary was compiled with optimisation (`__OPTIMIZE__`).
inline constexpr bool optimized_build =
#ifdef __OPTIMIZE__
    true;
#else
    false;
#endif

/// `n` in an optimised build; a quarter of it (at least 1) in an unoptimised one.
constexpr std::uint64_t random_runs(std::uint64_t n) noexcept {
  return optimized_build ? n : std::max<std::uint64_t>(1, n / 4);
}

}  // namespace asyncps::test
