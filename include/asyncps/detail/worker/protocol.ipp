// asyncps — the out-of-line definition of detail/worker/protocol.hpp's `draw_incarnation`.
//
// Not a header to include on its own: detail/worker/protocol.hpp includes it (header-only, the
// default), or asyncps/src.hpp compiles it once (ASYNCPS_SEPARATE_COMPILATION defined;
// docs/build_time.md, "Separate compilation"), so that a translation unit that only declares it
// skips `<random>`. It does not include that header back (no include cycle): whoever includes
// this file has included the header first.
#pragma once

#include <cstdint>
#include <optional>
#include <random>

#include "asyncps/detail/config.hpp"

namespace asyncps::detail {

ASYNCPS_DECL std::uint64_t draw_incarnation(std::optional<std::uint64_t> given) {
  if (given && *given != 0) return *given;
  std::random_device rd;
  std::uint64_t v = 0;
  while (v == 0) v = (std::uint64_t{rd()} << 32) ^ std::uint64_t{rd()};
  return v;
}

}  // namespace asyncps::detail
