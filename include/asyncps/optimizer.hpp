// asyncps — the `optimizer_policy` concept: how a server applies a pushed gradient to its rows.
// Requirements table: docs/concepts/optimizer.md.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

namespace asyncps {

/// The per-parameter state planes handed to `optimizer_policy::apply`.
template <std::size_t N>
using optimizer_state = std::array<std::span<float>, N>;

/// A server-side optimizer. Per-parameter state (momentum, second moments, ...) is
/// `P::state_per_param` floats per parameter, stored by the server next to the rows (and part
/// of every snapshot, replica and replay).
///
/// | expression                          | type     | semantics |
/// |-------------------------------------|----------|-----------|
/// | `P::state_per_param`                | `std::size_t` constant | floats of state per parameter (0..4) |
/// | `o.apply(params, grad, state, step)`| `void`   | updates `params` (n floats) in place from `grad` (n floats); `state` is an `optimizer_state<P::state_per_param>`: one span of n floats per state plane, zero-initialised; `step` >= 1 counts updates applied to this table by this server |
/// | `o.local_step()`                    | convertible to `float` | the learning rate a worker may use to apply its own gradient to its cache (read-my-writes estimate); exact for SGD |
///
/// `apply` must not allocate and must leave `params` unchanged for a zero gradient when the
/// state is zero. Thread safety: called from the server's strand only.
template <class P>
concept optimizer_policy =
    std::copy_constructible<P> &&
    requires(const P& o, std::span<float> params, std::span<const float> grad,
             const optimizer_state<P::state_per_param>& state, std::uint64_t step) {
      { P::state_per_param } -> std::convertible_to<std::size_t>;
      { o.apply(params, grad, state, step) } -> std::same_as<void>;
      { o.local_step() } -> std::convertible_to<float>;
    };

}  // namespace asyncps
