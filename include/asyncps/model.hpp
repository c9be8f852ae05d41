// asyncps — the `model` concept: what a user writes to train with asyncps.
//
// See docs/concepts/model.md for the requirements table and an example.
#pragma once

#include <concepts>
#include <span>

#include "asyncps/table.hpp"

namespace asyncps {

/// A model whose gradient comes from elsewhere (another server, a device stream): instead of
/// `compute_gradient` it provides `m.async_compute_gradient(p, g)`, an
/// `asio::awaitable<float>` with the same contract that runs on the worker's executor and may
/// wait (e.g. `group_link`, the central side of a group server). The worker's `compute`
/// executor is not used for it.
template <class M>
concept async_gradient_source =
    requires(M& m, const parameter_view& p, gradient_view& g) { m.async_compute_gradient(p, g); };

/// A model whose gradients are sparse: after `compute_gradient`, `cm.touched_rows(t)` gives the
/// rows of table `t` it wrote (sorted ascending, no repeats, global row ids); every other row of
/// that gradient is zero. The worker then pushes only those rows (a keyed push: 4 bytes of key
/// per row plus the rows) whenever that is smaller than the shard's whole slice. Valid until
/// the next `compute_gradient` (or `rows_to_read`). Example: `mf_model` in
/// `examples/matrix_factorization/mf.hpp`.
template <class M>
concept sparse_gradient_source = requires(const M& cm, table_id t) {
  { cm.touched_rows(t) } -> std::convertible_to<std::span<const row_id>>;
};

/// A model whose reads are sparse: before each `compute_gradient` the worker calls
/// `m.rows_to_read(t)` once per table; it names the rows of table `t` that the next
/// `compute_gradient` will read (sorted ascending, no repeats, global row ids). The first call
/// after a `compute_gradient` fixes the next minibatch (and the calls for the other tables
/// return that same minibatch's rows). The worker then pulls only those rows (a keyed pull),
/// checks the consistency policy against the clocks of those rows alone, and subscribes only
/// to them for server-pushed rows (ESSP, VAP); other rows of its cache may be arbitrarily old.
/// Returned spans stay valid until the next `compute_gradient`. Example: `mf_model`.
template <class M>
concept sparse_read_source = requires(M& m, table_id t) {
  { m.rows_to_read(t) } -> std::convertible_to<std::span<const row_id>>;
};

/// A trainable model, one object per worker (it usually owns that worker's data shard and
/// random generator).
///
/// | expression                      | type                        | semantics |
/// |---------------------------------|-----------------------------|-----------|
/// | `cm.tables()`                   | convertible to `std::span<const table_spec>` | the parameter layout; identical on every worker and server |
/// | `m.compute_gradient(p, g)`      | convertible to `float`      | draws the next minibatch, writes d(loss)/d(params) into every value of `g`, returns the minibatch's mean loss |
/// | or `m.async_compute_gradient(p, g)` | `asio::awaitable<float>` | the same, as a coroutine on the worker's executor (see `async_gradient_source`) |
/// | optional `cm.touched_rows(t)`   | `std::span<const row_id>`   | sparse pushes (see `sparse_gradient_source`) |
/// | optional `m.rows_to_read(t)`    | `std::span<const row_id>`   | sparse pulls (see `sparse_read_source`) |
///
/// `compute_gradient` runs on the worker's compute executor, never on an I/O thread, and is
/// never called concurrently on the same object. `p` is a consistent snapshot: it does not
/// change while the call runs.
template <class M>
concept model = requires(M& m, const M& cm, const parameter_view& p, gradient_view& g) {
  { cm.tables() } -> std::convertible_to<std::span<const table_spec>>;
} && (requires(M& m, const parameter_view& p, gradient_view& g) {
                  { m.compute_gradient(p, g) } -> std::convertible_to<float>;
                } || async_gradient_source<M>);

}  // namespace asyncps
