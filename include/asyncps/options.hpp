// asyncps — plain aggregates of numbers shared by several components.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace asyncps {

/// Limits every received frame header is validated against (see wire.hpp). A frame outside
/// them closes only the connection that sent it, with an error naming the field.
struct wire_limits {
  std::uint64_t max_frame_bytes = std::uint64_t{64} << 20;  ///< max payload bytes per frame
  std::uint32_t max_rows = 1u << 20;                        ///< max rows per frame
  std::uint32_t max_width = 1u << 20;                       ///< max floats per row
  std::uint32_t max_tables = 1024;                          ///< max tables in a layout
};

}  // namespace asyncps
