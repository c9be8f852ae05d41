// asyncps — the `recovery_policy` concept: what servers and workers do about server failures.
//
// A recovery policy has a server part and a worker part; `basic_server` and `basic_worker`
// are instantiated with the same policy type. The loops call the parts' hooks at fixed
// points (see docs/concepts/recovery.md); optional hooks are detected with `requires`.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <string_view>
#include <system_error>

namespace asyncps {

/// What a worker does when it loses a server connection.
enum class recovery_action {
  fail,            ///< end the run with `errc::server_lost`
  reconnect,       ///< reconnect with backoff and resume (idle meanwhile)
  continue_local,  ///< keep computing locally and buffer updates (stateless server)
};

/// A recovery policy.
///
/// | expression                              | type                 | semantics |
/// |-----------------------------------------|----------------------|-----------|
/// | `R::name`                               | `std::string_view`   | for logs and reports |
/// | `R::server_part`                        | default-constructible, movable | per-server state and hooks (configured parts are moved into `basic_server`) |
/// | `R::worker_part`                        | default-constructible, movable | per-worker state and hooks (moved into `basic_worker`) |
/// | `w.on_server_lost(ec)`                  | `recovery_action`    | called by the worker loop when a shard's connection fails |
/// | `w.reconnect_timeout()`                 | `std::chrono::milliseconds` | how long the worker may try before giving up |
///
/// Optional server hooks (detected): `s.on_update(table, first_row, rows, grad)`,
/// `s.on_clock(server_clock)`.
template <class R>
concept recovery_policy =
    requires {
      { R::name } -> std::convertible_to<std::string_view>;
      typename R::server_part;
      typename R::worker_part;
    } && std::default_initializable<typename R::server_part> &&
    std::move_constructible<typename R::server_part> &&
    std::default_initializable<typename R::worker_part> &&
    std::move_constructible<typename R::worker_part> &&
    requires(typename R::worker_part& w, std::error_code ec) {
      { w.on_server_lost(ec) } -> std::same_as<recovery_action>;
      { w.reconnect_timeout() } -> std::convertible_to<std::chrono::milliseconds>;
    };

}  // namespace asyncps
