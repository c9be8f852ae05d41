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

/// Checks `M` against the `model` requirements (and the optional hooks it declares) with one
/// `static_assert` per requirement, each naming the member and docs/concepts/model.md. Call
/// `static_assert(asyncps::check_model<my_model>());` to get those messages instead of a concept's
/// "no operand of the disjunction is satisfied". After a failed check it still returns `true`, so
/// that each wrong member gives exactly one error.
///
/// Checked: `cm.tables()` exists, is `const`, and converts to `std::span<const table_spec>`;
/// `m.compute_gradient(p, g)` returns something convertible to `float`, or else
/// `m.async_compute_gradient(p, g)` can be called; a `touched_rows` or `rows_to_read` member,
/// when the model declares one, can be called as documented and returns something
/// convertible to `std::span<const row_id>` (a wrong one would otherwise be ignored silently
/// and the worker would push or pull every row).
template <class M>
consteval bool check_model() {
  // tables()
  constexpr bool tables_callable = requires(M& m) { m.tables(); };
  constexpr bool tables_const = requires(const M& cm) { cm.tables(); };
  constexpr bool tables_ok = requires(const M& cm) {
    { cm.tables() } -> std::convertible_to<std::span<const table_spec>>;
  };
  static_assert(tables_callable,
                "asyncps: a model needs `std::span<const asyncps::table_spec> tables() const`, "
                "its parameter layout (docs/concepts/model.md, tables())");
  static_assert(!tables_callable || tables_const,
                "asyncps: the model's `tables()` must be a const member function "
                "(docs/concepts/model.md, tables())");
  static_assert(!tables_const || tables_ok,
                "asyncps: the model's `tables() const` must return something convertible to "
                "`std::span<const asyncps::table_spec>` (docs/concepts/model.md, tables())");

  // compute_gradient(p, g) -> float, or async_compute_gradient(p, g)
  constexpr bool sync_callable =
      requires(M& m, const parameter_view& p, gradient_view& g) { m.compute_gradient(p, g); };
  constexpr bool sync_ok = requires(M& m, const parameter_view& p, gradient_view& g) {
    { m.compute_gradient(p, g) } -> std::convertible_to<float>;
  };
  constexpr bool async_ok = async_gradient_source<M>;
  constexpr bool sync_declared = sync_callable || requires { &M::compute_gradient; };
  static_assert(sync_callable || async_ok || !sync_declared,
                "asyncps: the model's `compute_gradient` cannot be called as "
                "`m.compute_gradient(p, g)` with `const asyncps::parameter_view& p` and "
                "`asyncps::gradient_view& g` on a non-const model (docs/concepts/model.md, "
                "compute_gradient(p, g))");
  static_assert(sync_callable || async_ok || sync_declared,
                "asyncps: a model needs `float compute_gradient(const asyncps::parameter_view& "
                "p, asyncps::gradient_view& g)` (or `asio::awaitable<float> "
                "async_compute_gradient(p, g)`) (docs/concepts/model.md, compute_gradient(p, "
                "g))");
  static_assert(!sync_callable || sync_ok || async_ok,
                "asyncps: the model's `compute_gradient(p, g)` must return the minibatch's mean "
                "loss as `float` (docs/concepts/model.md, compute_gradient(p, g))");

  // Optional hooks: a wrong one is an error, not silently ignored (the worker would push or
  // pull every row).
  constexpr bool touched_declared =
      requires { &M::touched_rows; } || requires(M& m, table_id t) { m.touched_rows(t); };
  constexpr bool touched_ok = !touched_declared || sparse_gradient_source<M>;
  static_assert(touched_ok,
                "asyncps: the model's `touched_rows` must be `std::span<const asyncps::row_id> "
                "touched_rows(asyncps::table_id) const` (docs/concepts/model.md, Optional: "
                "sparse models)");
  constexpr bool read_declared =
      requires { &M::rows_to_read; } || requires(M& m, table_id t) { m.rows_to_read(t); };
  constexpr bool read_ok = !read_declared || sparse_read_source<M>;
  static_assert(read_ok,
                "asyncps: the model's `rows_to_read` must be `std::span<const asyncps::row_id> "
                "rows_to_read(asyncps::table_id)` (docs/concepts/model.md, Optional: sparse "
                "models)");

  // A failure above was reported by its own message; `false` here (an unnamed follow-on
  // error) only if the checks above missed something `model<M>` requires.
  constexpr bool reported = !(tables_ok && (sync_ok || async_ok) && touched_ok && read_ok);
  return model<M> || reported;
}

/// `model<M>`, checked by `check_model<M>()`: for a class template's parameter, where a type
/// that is not a model should stop the build with `check_model`'s messages (one per wrong
/// member). Not for overload resolution or `if constexpr`: a non-model is a hard error here,
/// not `false` (use `model` there).
template <class M>
concept checked_model = check_model<M>();

}  // namespace asyncps
