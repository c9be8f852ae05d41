// asyncps — the protocol vocabulary above the frame format (wire.hpp): what both ends must
// agree on before they exchange rows.
#pragma once

#include <cstdint>
#include <string_view>

#include "asyncps/consistency.hpp"

namespace asyncps {

namespace detail {
/// FNV-1a (32 bit) of `s`, continuing from `h`.
constexpr std::uint32_t fnv1a(std::string_view s, std::uint32_t h = 2166136261u) noexcept {
  for (char c : s) h = (h ^ static_cast<std::uint8_t>(c)) * 16777619u;
  return h;
}
}  // namespace detail

/// The policy fingerprint a worker sends in its hello and a server checks: FNV-1a of
/// "<eager|lazy|vap>/<recovery name>". It covers what both sides must agree on: whether the
/// server pushes rows eagerly (an ESSP worker waits for those pushes; a lazy server never
/// sends them), whether it acknowledges visibility (VAP), and the recovery protocol. The
/// staleness bound is not part of it: it travels in every pull. A mismatch is refused with
/// `errc::policy_mismatch` instead of a silent disagreement about what the messages mean.
/// `Recovery` needs only a `name` (a `std::string_view` constant).
template <class Consistency, class Recovery>
constexpr std::uint32_t policy_fingerprint() noexcept {
  return detail::fnv1a(Recovery::name, detail::fnv1a(is_value_bounded_v<Consistency> ? "vap/"
                                                     : Consistency::eager            ? "eager/"
                                                                                     : "lazy/"));
}

}  // namespace asyncps
