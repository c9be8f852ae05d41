// Compile-fail cases for asyncps::check_model / asyncps::checked_model (model.hpp): each
// ASYNCPS_CASE_* macro makes one member of an otherwise valid model wrong; the ctest test
// compiling it passes when the compiler prints check_model's message for that member (and no
// concept "disjunction" error). Registered in tests/CMakeLists.txt; never built by `all`.
#include <array>
#include <span>

#include "asyncps/model.hpp"

namespace {

using asyncps::gradient_view;
using asyncps::parameter_view;
using asyncps::row_id;
using asyncps::table_id;
using asyncps::table_spec;

inline constexpr std::array<table_spec, 1> layout{{{.id = 0, .rows = 2, .width = 3}}};
inline constexpr std::array<row_id, 1> rows{{0}};

struct wrong_model {
#if defined(ASYNCPS_CASE_NO_TABLES)
#elif defined(ASYNCPS_CASE_NON_CONST_TABLES)
  std::span<const table_spec> tables() { return layout; }
#elif defined(ASYNCPS_CASE_TABLES_WRONG_TYPE)
  int tables() const { return 1; }
#else
  std::span<const table_spec> tables() const { return layout; }
#endif

#if defined(ASYNCPS_CASE_NO_GRADIENT)
#elif defined(ASYNCPS_CASE_GRADIENT_WRONG_PARAMETERS)
  float compute_gradient(parameter_view&, gradient_view&) { return 0.0f; }
#elif defined(ASYNCPS_CASE_GRADIENT_VOID) || defined(ASYNCPS_CASE_CHECKED_MODEL_PARAMETER)
  void compute_gradient(const parameter_view&, gradient_view&) {}
#else
  float compute_gradient(const parameter_view&, gradient_view&) { return 0.0f; }
#endif

#if defined(ASYNCPS_CASE_TOUCHED_ROWS_WRONG)
  std::span<const row_id> touched_rows(table_id) { return rows; }  // not const
#elif defined(ASYNCPS_CASE_ROWS_TO_READ_WRONG)
  int rows_to_read(table_id) { return 0; }
#endif
};

#if defined(ASYNCPS_CASE_CHECKED_MODEL_PARAMETER)
// As a library class template would use it (`template <checked_model Model, ...>`).
template <asyncps::checked_model M>
struct uses_model {};
[[maybe_unused]] uses_model<wrong_model> instance;
#else
static_assert(asyncps::check_model<wrong_model>());
#endif

}  // namespace
