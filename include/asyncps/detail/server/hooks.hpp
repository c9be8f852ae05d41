// asyncps — what a recovery policy's server part builds on: `detail::session_base` (a
// connection as the part sees it), `detail::fresh_on_copy` (run-time state a copy does not
// take), and the server hooks themselves, declared, documented and checked in
// asyncps/recovery.hpp (the one place that detects every server hook).
#pragma once

#include <utility>

#include "asyncps/detail/server/session_base.hpp"
#include "asyncps/recovery.hpp"

namespace asyncps::detail {

/// A member that is default-constructed again when copied (and keeps its value when moved):
/// lets a configured recovery part be copied into several servers without copying run-time
/// state (connections, logs). `T` is default-constructible and movable.
template <class T>
struct fresh_on_copy {
  T value{};
  fresh_on_copy() = default;
  fresh_on_copy(const fresh_on_copy&) : value{} {}
  fresh_on_copy(fresh_on_copy&&) noexcept = default;
  fresh_on_copy& operator=(const fresh_on_copy&) {
    value = T{};
    return *this;
  }
  fresh_on_copy& operator=(fresh_on_copy&&) noexcept = default;
};

}  // namespace asyncps::detail
