// asyncps — model_ref: a non-owning reference to a user's model that erases its type but keeps
// what the worker decides at compile time (sparse reads, sparse gradients, a coroutine
// gradient), so that the worker's coroutine shell (detail/worker/shell.hpp) is generated once
// per kind of model rather than once per model type, and can be compiled once for the common
// configurations (asyncps/src.hpp; docs/build_time.md, "Separate compilation").
//
// Each call goes through one function pointer: a few nanoseconds per clock against a gradient
// computation; nothing is allocated or copied (the views are passed by reference).
#pragma once

#include <span>
#include <type_traits>

#include <asio/awaitable.hpp>

#include "asyncps/model.hpp"
#include "asyncps/table.hpp"

namespace asyncps::detail {

/// A reference to a model of `asyncps::model` whose optional parts are the template
/// arguments: `SparseReads` (`rows_to_read(t)`), `SparseGrads` (`touched_rows(t) const`) and
/// `Async` (`async_compute_gradient(p, g)`, awaited as `asio::awaitable<float>`; otherwise
/// `compute_gradient(p, g)`). It models `asyncps::model` with exactly those parts, so the
/// worker's concepts see through it. The referenced model must outlive it; copying copies
/// the reference. Thread safety: as the model's (a call is the model's call).
template <bool SparseReads, bool SparseGrads, bool Async>
class model_ref {
 public:
  /// References `m`, whose optional parts must be exactly the template arguments
  /// (`model_ref_for<M>` picks them).
  template <class M>
    requires(!std::is_same_v<std::remove_cvref_t<M>, model_ref>)
  explicit model_ref(M& m) noexcept : self_(&m), tables_(&tables_of<M>) {
    static_assert(sparse_read_source<M> == SparseReads &&
                      sparse_gradient_source<M> == SparseGrads && async_gradient_source<M> == Async,
                  "asyncps internal: model_ref's template arguments must be the model's parts");
    if constexpr (Async) {
      compute_ = &async_compute_of<M>;
    } else {
      compute_ = &compute_of<M>;
    }
    if constexpr (SparseReads) reads_ = &rows_to_read_of<M>;
    if constexpr (SparseGrads) touched_ = &touched_rows_of<M>;
  }

  /// The model's `tables()`.
  std::span<const table_spec> tables() const { return tables_(self_); }

  /// The model's `compute_gradient(p, g)`: the minibatch's mean loss.
  float compute_gradient(const parameter_view& p, gradient_view& g)
    requires(!Async)
  {
    return compute_(self_, p, g);
  }
  /// The model's `async_compute_gradient(p, g)`, as an `asio::awaitable<float>` (the model's
  /// own awaitable when it is one; otherwise a coroutine that awaits it).
  asio::awaitable<float> async_compute_gradient(const parameter_view& p, gradient_view& g)
    requires Async
  {
    return compute_(self_, p, g);
  }
  /// The model's `rows_to_read(t)`.
  std::span<const row_id> rows_to_read(table_id t)
    requires SparseReads
  {
    return reads_(self_, t);
  }
  /// The model's `touched_rows(t)`.
  std::span<const row_id> touched_rows(table_id t) const
    requires SparseGrads
  {
    return touched_(self_, t);
  }

 private:
  template <class M>
  static std::span<const table_spec> tables_of(const void* m) {
    return static_cast<const M*>(m)->tables();
  }
  template <class M>
  static float compute_of(void* m, const parameter_view& p, gradient_view& g) {
    return static_cast<M*>(m)->compute_gradient(p, g);
  }
  template <class M>
  static asio::awaitable<float> async_compute_of(void* m, const parameter_view& p,
                                                 gradient_view& g) {
    using result = decltype(static_cast<M*>(m)->async_compute_gradient(p, g));
    if constexpr (std::is_same_v<result, asio::awaitable<float>>) {
      return static_cast<M*>(m)->async_compute_gradient(p, g);  // no frame of our own
    } else {
      return await_as_float<M>(static_cast<M*>(m), p, g);
    }
  }
  template <class M>
  static asio::awaitable<float> await_as_float(M* m, const parameter_view& p, gradient_view& g) {
    co_return static_cast<float>(co_await m->async_compute_gradient(p, g));
  }
  template <class M>
  static std::span<const row_id> rows_to_read_of(void* m, table_id t) {
    return static_cast<M*>(m)->rows_to_read(t);
  }
  template <class M>
  static std::span<const row_id> touched_rows_of(const void* m, table_id t) {
    return static_cast<const M*>(m)->touched_rows(t);
  }

  using sync_fn = float (*)(void*, const parameter_view&, gradient_view&);
  using async_fn = asio::awaitable<float> (*)(void*, const parameter_view&, gradient_view&);

  void* self_;
  std::span<const table_spec> (*tables_)(const void*);
  std::conditional_t<Async, async_fn, sync_fn> compute_ = nullptr;
  std::span<const row_id> (*reads_)(void*, table_id) = nullptr;
  std::span<const row_id> (*touched_)(const void*, table_id) = nullptr;
};

/// The `model_ref` for model type `M`.
template <class M>
using model_ref_for =
    model_ref<sparse_read_source<M>, sparse_gradient_source<M>, async_gradient_source<M>>;

}  // namespace asyncps::detail
