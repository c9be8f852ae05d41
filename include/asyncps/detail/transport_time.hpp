// asyncps — the optional time part of the `transport` concept: which timer and which clock the
// server, worker and chain master loops use for a transport.
//
// A transport may declare `T::timer_type` and `T::clock_type` (both or neither). Then every
// wait (backoff, heartbeats, "sleep until woken") and every time reading of the loops goes
// through them, so a transport with a virtual clock (transport/simulated.hpp) runs the
// unchanged templates in simulated time. Without them the loops use `asio::steady_timer` and
// `std::chrono::steady_clock`, as they always did. Requirements: docs/concepts/transport.md
// ("Time").
#pragma once

#include <chrono>
#include <concepts>
#include <system_error>
#include <tuple>

#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>

#include "asyncps/detail/asio_compat.hpp"

namespace asyncps::detail {

/// Checks the optional time members of transport `T`; one `static_assert` per requirement,
/// each naming the member. Evaluated by `transport_time_traits<T>`.
template <class T>
consteval bool check_transport_time() {
  constexpr bool has_timer = requires { typename T::timer_type; };
  constexpr bool has_clock = requires { typename T::clock_type; };
  static_assert(has_timer == has_clock,
                "asyncps: a transport declares both `timer_type` and `clock_type`, or neither "
                "(docs/concepts/transport.md, Time)");
  if constexpr (has_timer && has_clock) {
    using timer = typename T::timer_type;
    using clock = typename T::clock_type;
    using executor = typename T::executor_type;
    static_assert(
        requires {
          { clock::now() } -> std::same_as<typename clock::time_point>;
        }, "asyncps: `T::clock_type::now()` must return `T::clock_type::time_point` "
           "(docs/concepts/transport.md, Time)");
    static_assert(std::constructible_from<timer, const executor&>,
                  "asyncps: `T::timer_type` must be constructible from `const T::executor_type&` "
                  "(docs/concepts/transport.md, Time)");
    static_assert(std::constructible_from<timer, const executor&, typename clock::time_point>,
                  "asyncps: `T::timer_type` must be constructible from (`T::executor_type`, "
                  "`T::clock_type::time_point`) (docs/concepts/transport.md, Time)");
    static_assert(
        requires(timer& t, typename clock::time_point p) {
          t.expires_after(std::chrono::milliseconds(1));
          t.expires_at(p);
        }, "asyncps: `T::timer_type` needs `expires_after(duration)` (taking "
           "std::chrono::milliseconds) and `expires_at(time_point)` (docs/concepts/transport.md, "
           "Time)");
    static_assert(
        requires(timer& t) { t.cancel(); },
        "asyncps: `T::timer_type` needs `cancel()` (docs/concepts/transport.md, Time)");
    static_assert(
        requires(timer& t) {
          { t.async_wait(use_tuple) } -> std::same_as<asio::awaitable<std::tuple<std::error_code>>>;
        }, "asyncps: `T::timer_type::async_wait(detail::use_tuple)` must be an "
           "`asio::awaitable<std::tuple<std::error_code>>` (docs/concepts/transport.md, Time)");
  }
  return true;
}

/// The timer and clock the library's loops use for transport `T`: `T::timer_type` and
/// `T::clock_type` when `T` declares them, else `asio::steady_timer` and
/// `std::chrono::steady_clock`.
template <class T>
struct transport_time_traits {
  static_assert(check_transport_time<T>());
  using timer_type = asio::steady_timer;
  using clock_type = std::chrono::steady_clock;
};

template <class T>
  requires requires {
    typename T::timer_type;
    typename T::clock_type;
  }
struct transport_time_traits<T> {
  static_assert(check_transport_time<T>());
  using timer_type = typename T::timer_type;
  using clock_type = typename T::clock_type;
};

/// The timer type of transport `T` (see `transport_time_traits`).
template <class T>
using transport_timer_t = typename transport_time_traits<T>::timer_type;

/// The clock type of transport `T` (see `transport_time_traits`).
template <class T>
using transport_clock_t = typename transport_time_traits<T>::clock_type;

/// Ends when `timer` expires, then closes `conn` (which ends a receive that ignores
/// cancellation), or when the wait is cancelled (then `conn` is left alone). Race it against an
/// operation on `conn` with `||` to bound that operation (the rendezvous and reader clients).
template <class Timer, class Connection>
asio::awaitable<void> close_at_deadline(Timer& timer, Connection& conn) {
  auto [ec] = co_await timer.async_wait(use_tuple);
  if (!ec) conn.close();
}

}  // namespace asyncps::detail
