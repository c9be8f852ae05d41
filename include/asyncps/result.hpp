// asyncps — result<T>: the return type of fallible synchronous calls.
#pragma once

#include <system_error>

#include <boost/outcome/std_result.hpp>

namespace asyncps {

/// `result<T>` holds either a `T` or a `std::error_code` (Boost.Outcome `std_result`).
/// Synchronous fallible calls return it; asynchronous operations complete with a
/// `std::error_code` instead (see docs/errors.md).
template <class T>
using result = BOOST_OUTCOME_V2_NAMESPACE::std_result<T>;

}  // namespace asyncps
