// asyncps — internal Asio helpers (standalone Asio 1.22), and the check that Asio was
// configured with C++20 coroutine support.
#pragma once

// Asio 1.22 enables `co_await` support (`asio::awaitable`, `use_awaitable`, `co_spawn` of
// coroutines) on its own only for g++ and MSVC; with clang it needs two macros, defined in
// every translation unit before the first Asio header. The `asyncps::asyncps` CMake target
// defines them for clang; a build that does not use it (or that includes Asio before its
// definitions take effect) gets this error instead of pages of "no member named awaitable".
#include <asio/detail/config.hpp>

#if !defined(ASIO_HAS_CO_AWAIT) || !defined(ASIO_HAS_STD_COROUTINE)
// clang-format off
#error "asyncps needs Asio's C++20 coroutine support, which this Asio/compiler pair does not enable by itself: compile every translation unit with -DASIO_HAS_CO_AWAIT=1 -DASIO_HAS_STD_COROUTINE=1 (with C++20), or link the CMake target asyncps::asyncps, which adds them for clang"
// clang-format on
#endif

#include <asio/awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>

namespace asyncps::detail {

/// Completion token: `auto [ec, n] = co_await op(..., use_tuple);` never throws.
inline constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);

}  // namespace asyncps::detail
