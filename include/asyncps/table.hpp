// asyncps — parameter tables as Eigen matrices: `parameter_view` and `gradient_view`, the
// views a model reads its parameters through and writes its gradient into, over the layout
// of asyncps/layout.hpp (included: ids, `table_spec`, key ranges, shards, initial values).
//
// Include it where a model computes (it includes <Eigen/Core>); headers and tools that only
// describe or split a layout include asyncps/layout.hpp instead.
#pragma once

#include <cstddef>
#include <span>

#include <Eigen/Core>

#include "asyncps/layout.hpp"

namespace asyncps {

/// Row-major float matrix type used for table views.
using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// A read-only view of a model's tables: laid out table-major in one contiguous float array
/// (table 0's rows, then table 1's rows, ...), or each table in storage of its own (the worker
/// hands a table that one shard holds whole to the model where it received it, without a
/// copy). Read the tables through `table(t)` or `span(t)`. Non-owning; valid while the storage
/// it was made from is. Thread safety: concurrent reads are safe.
class parameter_view {
 public:
  parameter_view() = default;
  /// `data` holds sum(tables[i].size()) floats; `tables` must outlive the view.
  parameter_view(std::span<const table_spec> tables, const float* data) noexcept
      : tables_(tables), data_(data) {}
  /// Each table apart: `table_data[t]` holds table `t`'s `tables[t].size()` floats, row-major.
  /// Precondition: `table_data.size() == tables.size()`; both must outlive the view.
  parameter_view(std::span<const table_spec> tables,
                 std::span<const float* const> table_data) noexcept
      : tables_(tables), table_data_(table_data.data()) {}

  /// The layout this view was made with.
  std::span<const table_spec> tables() const noexcept { return tables_; }
  /// Table `t` as a `rows x width` row-major matrix. Precondition: `t < tables().size()`.
  Eigen::Map<const row_matrix> table(table_id t) const noexcept {
    return {first(t), tables_[t].rows, tables_[t].width};
  }
  /// Table `t` as a flat span of `rows * width` floats.
  std::span<const float> span(table_id t) const noexcept { return {first(t), tables_[t].size()}; }

 private:
  const float* first(table_id t) const noexcept {
    return table_data_ != nullptr ? table_data_[t] : data_ + table_offset(tables_, t);
  }
  std::span<const table_spec> tables_{};
  const float* data_ = nullptr;               // one array (the first constructor)
  const float* const* table_data_ = nullptr;  // or one pointer per table (the second)
};

/// A writable view of a gradient laid out like `parameter_view`. The worker hands one to
/// `model::compute_gradient`; it maps the pooled buffer that is then pushed without a copy.
/// Every value must be written (the buffer is not zeroed). Thread safety: not shared.
class gradient_view {
 public:
  gradient_view() = default;
  gradient_view(std::span<const table_spec> tables, float* data) noexcept
      : tables_(tables), data_(data) {}

  std::span<const table_spec> tables() const noexcept { return tables_; }
  /// Table `t` as a writable `rows x width` row-major matrix.
  Eigen::Map<row_matrix> table(table_id t) const noexcept {
    return {data_ + offset(t), tables_[t].rows, tables_[t].width};
  }
  /// Table `t` as a flat writable span of `rows * width` floats.
  std::span<float> span(table_id t) const noexcept {
    return {data_ + offset(t), tables_[t].size()};
  }

 private:
  std::size_t offset(table_id t) const noexcept { return table_offset(tables_, t); }
  std::span<const table_spec> tables_{};
  float* data_ = nullptr;
};

}  // namespace asyncps
