// asyncps — the definition of layout.hpp's `initial_values` (a seeded `std::mt19937` per row).
//
// Not a header to include on its own: layout.hpp includes it (header-only, the default), or
// asyncps/src.hpp compiles it once (ASYNCPS_SEPARATE_COMPILATION defined; docs/build_time.md,
// "Separate compilation"), so that a translation unit that only declares it skips `<random>`.
// It does not include that header back (no include cycle): whoever includes this file has
// included the header first.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>

#include "asyncps/detail/config.hpp"

namespace asyncps {

ASYNCPS_DECL void initial_values(const table_spec& spec, key_range rows, std::uint64_t seed,
                                 std::span<float> out) {
  if (spec.init_scale == 0.0f) {
    std::fill(out.begin(), out.end(), 0.0f);
    return;
  }
  for (row_id r = rows.begin; r < rows.end; ++r) {
    std::seed_seq seq{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                      spec.id, r};
    std::mt19937 gen(seq);
    std::uniform_real_distribution<float> dist(-spec.init_scale, spec.init_scale);
    float* row = out.data() + std::size_t{r - rows.begin} * spec.width;
    for (std::uint32_t j = 0; j < spec.width; ++j) row[j] = dist(gen);
  }
}

}  // namespace asyncps
