// asyncps — little-endian field access shared by the wire format and checkpoint files.
#pragma once

#include <bit>
#include <cstddef>
#include <cstring>

namespace asyncps::detail {

static_assert(std::endian::native == std::endian::little,
              "asyncps: the wire format, checkpoint files and float payloads are little-endian; "
              "big-endian hosts are not supported");

/// Writes `v` at `p` (no alignment needed). Little-endian host: a plain copy.
template <class T>
void store_le(std::byte* p, T v) noexcept {
  std::memcpy(p, &v, sizeof(T));
}

/// Reads a `T` from `p` (no alignment needed).
template <class T>
T load_le(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace asyncps::detail
