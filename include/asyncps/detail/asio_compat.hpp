// asyncps — internal Asio helpers (standalone Asio 1.22).
#pragma once

#include <asio/awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>

namespace asyncps::detail {

/// Completion token: `auto [ec, n] = co_await op(..., use_tuple);` never throws.
inline constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);

}  // namespace asyncps::detail
