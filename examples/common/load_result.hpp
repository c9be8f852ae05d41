// load_result — how the asyncps examples' data loaders report failure: a `T` or a `load_error`
// (an error code plus a printable message). Shared by examples/fashion_mnist/dataset.hpp
// (namespace `fashion`) and examples/matrix_factorization/mf.hpp (`asyncps::examples::mf`),
// which re-export these names with using-declarations.
//
//   auto r = loader(path);
//   if (!r) { std::cerr << r.error().message << '\n'; return 1; }  // or test r.error().code
#pragma once

#include <string>
#include <system_error>

#include <boost/outcome/std_result.hpp>

namespace asyncps::examples {

/// Why a load failed.
struct load_error {
  std::error_code code;  ///< `asyncps::errc::bad_file` in every example (condition `fatal`)
  std::string message;   ///< "<file>: <what>" or "<file>:<line>: <what>", ready to print
};

/// Lets Boost.Outcome (and callers) see a `load_error` as its error code (found by ADL).
/// Complexity: O(1). Thread safety: reentrant.
inline std::error_code make_error_code(const load_error& e) noexcept { return e.code; }

/// Called by Boost.Outcome when `.value()` is used on a failed `load_result`: throws
/// `std::system_error(e.code, e.message)`, carrying both the code and the message (found by ADL).
[[noreturn]] inline void outcome_throw_as_system_error_with_payload(const load_error& e) {
  throw std::system_error(e.code, e.message);
}

/// The result of a loader: a `T` or a `load_error`. Reading `.value()` of a failure throws
/// `std::system_error(code, message)`; test with `if (!r)` and read `r.error()` instead.
template <class T>
using load_result = BOOST_OUTCOME_V2_NAMESPACE::std_result<T, load_error>;

}  // namespace asyncps::examples
