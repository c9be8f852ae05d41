// asyncps — the `model` concept: what a user writes to train with asyncps.
//
// See docs/concepts/model.md for the requirements table and an example.
#pragma once

#include <concepts>
#include <span>

#include "asyncps/table.hpp"

namespace asyncps {

/// A trainable model, one object per worker (it usually owns that worker's data shard and
/// random generator).
///
/// | expression                      | type                        | semantics |
/// |---------------------------------|-----------------------------|-----------|
/// | `cm.tables()`                   | convertible to `std::span<const table_spec>` | the parameter layout; identical on every worker and server |
/// | `m.compute_gradient(p, g)`      | convertible to `float`      | draws the next minibatch, writes d(loss)/d(params) into every value of `g`, returns the minibatch's mean loss |
///
/// `compute_gradient` runs on the worker's compute executor, never on an I/O thread, and is
/// never called concurrently on the same object. `p` is a consistent snapshot: it does not
/// change while the call runs.
template <class M>
concept model = requires(M& m, const M& cm, const parameter_view& p, gradient_view& g) {
  { cm.tables() } -> std::convertible_to<std::span<const table_spec>>;
  { m.compute_gradient(p, g) } -> std::convertible_to<float>;
};

}  // namespace asyncps
