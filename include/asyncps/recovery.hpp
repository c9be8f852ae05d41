// asyncps — the `recovery_policy` concept: what servers and workers do about server failures;
// and the server hooks: every hook a policy's server part may implement, its detection and its
// checker (the one place that says how `basic_server` finds and calls them).
//
// A recovery policy has a server part and a worker part; `basic_server` and `basic_worker`
// are instantiated with the same policy type. The loops call the parts' hooks at fixed
// points (see docs/concepts/recovery.md); optional hooks are detected with `requires`.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "asyncps/detail/server/session_base.hpp"
#include "asyncps/error.hpp"
#include "asyncps/layout.hpp"
#include "asyncps/wire.hpp"

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
/// Optional: `R::elastic_membership`, a `static constexpr bool`: whether servers of this policy
/// may run with elastic membership (`server_options::elastic`; see
/// `allows_elastic_membership_v`). Absent: they may not.
///
/// Optional: `R::error_enum`, the policy's own error codes (an enum for which
/// `std::is_error_code_enum` holds, values 1 to `R::last_error`, at most `max_policy_error`),
/// declared in `recovery/<p>/errors.hpp` with its own `std::error_category`. A server part
/// refuses a session with one of them like with an `errc`; the error frame carries it as
/// `policy_error_base` + value, and the worker of the same policy reads it back as that code
/// (its `on_refused` hook gets it). Absent: the policy refuses with `errc` values only.
///
/// Optional server hooks: the table below ("Server hooks"), checked by `check_server_part`.
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

/// Whether servers with recovery policy `R` may run with elastic membership
/// (`server_options::elastic`): `R::elastic_membership` when `R` declares it, else false (a
/// policy that keeps state per worker, or failover traffic, must opt in; `basic_server` refuses
/// elastic options otherwise).
template <class R>
inline constexpr bool allows_elastic_membership_v = false;
template <class R>
  requires requires {
    { R::elastic_membership } -> std::convertible_to<bool>;
  }
inline constexpr bool allows_elastic_membership_v<R> = static_cast<bool>(R::elastic_membership);

namespace detail {

/// Whether recovery policy `R` declares its own error codes (`R::error_enum`, `R::last_error`).
template <class R>
concept has_policy_errors =
    requires {
      typename R::error_enum;
      { R::last_error } -> std::convertible_to<typename R::error_enum>;
    } && std::is_error_code_enum_v<typename R::error_enum> &&
    static_cast<std::uint64_t>(R::last_error) >= 1 &&
    static_cast<std::uint64_t>(R::last_error) <= max_policy_error;

/// A policy that declares `R::error_enum` but not in the shape `has_policy_errors` asks for
/// stops the build here (the server and the worker both map codes through the two functions
/// below), instead of its codes silently travelling as none.
template <class R>
constexpr void check_policy_errors() noexcept {
  if constexpr (requires { typename R::error_enum; })
    static_assert(has_policy_errors<R>,
                  "asyncps: recovery policy: declare `using error_enum = E;` with "
                  "std::is_error_code_enum<E> true (and make_error_code(E) found by ADL), and "
                  "`static constexpr E last_error`, the highest code, between 1 and 255");
}

/// The policy code an error frame carries for `ec` (1 to `max_policy_error`): `ec`'s value
/// when it is one of `R`'s own codes, else 0 (an `errc`, or a code no peer could read back).
/// Complexity: O(1). Thread safety: pure.
template <class R>
std::uint32_t policy_error_to_wire(const std::error_code& ec) noexcept {
  check_policy_errors<R>();
  if constexpr (has_policy_errors<R>) {
    const std::error_code last = R::last_error;
    if (ec.category() == last.category() && ec.value() >= 1 && ec.value() <= last.value())
      return static_cast<std::uint32_t>(ec.value());
  }
  return 0;
}

/// `R`'s code `c` as an error frame named it (1 to `R::last_error`), or `std::nullopt` when `R`
/// has no such code (untrusted input). Complexity: O(1). Thread safety: pure.
template <class R>
std::optional<std::error_code> policy_error_from_wire(std::uint32_t c) noexcept {
  check_policy_errors<R>();
  if constexpr (has_policy_errors<R>) {
    if (c >= 1 && c <= static_cast<std::uint32_t>(R::last_error))
      return std::error_code(static_cast<typename R::error_enum>(c));
  }
  return std::nullopt;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Server hooks
// ---------------------------------------------------------------------------------------------
//
// Every hook is optional: `basic_server` calls one only when the part declares it with the shape
// below (detected by the `detail::has_*` concepts here, and nowhere else), and otherwise does
// what the last column says. The server never asks which policy it has: everything
// policy-specific is one of these hooks. `Ctx` is the server's `basic_server::context` (a small
// copyable handle through which a hook reads and changes the shard, talks to sessions, logs,
// arms the part's timers (`ctx.arm_timer(id, ms)`, hook `on_timer`) and asks for connects
// (`ctx.connect(role, endpoint)`, hooks `on_connected` / `on_connect_failed`): a part has no
// coroutine, timer or socket of its own; every call on the server's executor), so context
// hooks are member templates
// `template <class Ctx> ...` (`on_start` and `on_clock` receive it as an lvalue); a session is
// seen as a
// `detail::session_base&`; `detail` is a `std::string&` appended to the error's message.
//
// | hook | signature | called | default |
// |------|-----------|--------|---------|
// | on_start | `void on_start(Ctx&)` | once, when `async_serve` starts, before the first accept (e.g. restore a checkpoint) | nothing |
// | on_serve | `std::error_code on_serve(Ctx)` | once, after `on_start`, before the first accept; an error ends `async_serve` with it | nothing |
// | on_hello | `std::error_code on_hello(Ctx, const frame_header& hello, std::string& detail)` | a worker's valid hello, before it is registered; an error refuses it | accept |
// | welcome_flags | `std::uint8_t welcome_flags(Ctx, const frame_header& hello)` | the worker is registered: flags of its welcome (`frame_flags::policy` or 0) | 0 |
// | on_rejoin | `void on_rejoin(Ctx, std::uint32_t worker, clock_value from, clock_value to)` | a hello's clock `to` is ahead of `from` here, before the worker's clock moves | nothing |
// | on_unknown_peer | `std::optional<std::error_code> on_unknown_peer(Ctx, detail::session_base&, const message&, std::string& detail)` | a session's first message is not a hello; a value claims the session (`ctx.claim`) with that result | refuse (`unexpected_message`) |
// | on_peer_message | `std::error_code on_peer_message(Ctx, detail::session_base&, message&, std::string& detail)` | every message of a claimed (peer) session; an error closes it | ignore |
// | on_session_closed | `void on_session_closed(Ctx, detail::session_base&)` | a session ended (both of its loops finished) | nothing |
// | on_recovery_push | `std::error_code on_recovery_push(Ctx, detail::session_base&, message&, std::string& detail)` | a worker's push with flag `policy` or `prefixed` (the policy's own push), rows and values checked | refuse (`unexpected_message`) |
// | on_worker_message | `std::optional<std::error_code> on_worker_message(Ctx, detail::session_base&, message&, std::string& detail)` | every message of a registered worker, before dispatch; a value: the part took it (hands it back with `ctx.dispatch`) | dispatch now |
// | on_push | `bool on_push(Ctx, detail::session_base&, const frame_header&)` | a worker's push or clock, checked, before its clock is checked; `true` drops it | apply |
// | on_update | `void on_update(table_id table, std::uint64_t first_row, std::uint32_t rows, std::span<const float> grad)` | after every applied update (`grad`: `rows * width` floats, valid during the call) | nothing |
// | on_applied | `bool on_applied(Ctx, detail::session_base&, const message&)` | a worker's push or clock was applied, before its clock advances; `true`: the part acks | the server acks |
// | on_clock | `void on_clock(clock_value server_clock, Ctx&)` or `void on_clock(clock_value)` | the server clock advanced, before waiting pulls are answered and eager rows pushed | nothing |
// | on_timer | `void on_timer(Ctx, std::uint32_t timer)` | the part's timer `timer` armed with `ctx.arm_timer` is due (fired once, by the server's sweeper; not after `stop()`) | nothing |
// | on_connected | `void on_connected(Ctx, detail::session_base&)` | a connect the part asked for (`ctx.connect(role, endpoint)`) made a peer session, tagged `role` | the session is closed |
// | on_connect_failed | `void on_connect_failed(Ctx, std::uint8_t role, std::error_code ec)` | a connect the part asked for with tag `role` failed | nothing |
// | on_stop | `void on_stop()` | once, after `async_serve` closed every connection | nothing |
// | serves_workers | `bool serves_workers() const` | by the watchdog: report missing workers only when true | true |
// | recovering | `bool recovering() const` | by a reader's pull: while true it is refused with `errc::recovering` | false |
// | routine_refusal | `bool routine_refusal(std::error_code refusal) const` | the server refuses a session with `refusal` (e.g. from `on_hello`); `true`: routine, not logged nor counted in `stats().rejected` (a chain member that is not the head) | false |
// | log_suffix | `std::string log_suffix() const` | appended to "asyncps server <shard>" in log lines | none |
// | peer_name | `std::string peer_name(const detail::session_base&) const` | names a peer session in log lines | "peer" |

namespace detail {

/// Detection, one concept per hook (the table above): whether `P` implements it with the shape
/// the server calls it with. `Ctx`: the server context.
template <class P, class Ctx>
concept has_on_start = requires(P& p, Ctx& c) { p.on_start(c); };
template <class P, class Ctx>
concept has_on_serve = requires(P& p, Ctx c) {
  { p.on_serve(c) } -> std::same_as<std::error_code>;
};
template <class P, class Ctx>
concept has_on_hello = requires(P& p, Ctx c, const frame_header& h, std::string& d) {
  { p.on_hello(c, h, d) } -> std::same_as<std::error_code>;
};
template <class P, class Ctx>
concept has_welcome_flags = requires(P& p, Ctx c, const frame_header& h) {
  { p.welcome_flags(c, h) } -> std::convertible_to<std::uint8_t>;
};
template <class P, class Ctx>
concept has_on_rejoin = requires(P& p, Ctx c, std::uint32_t w, clock_value a, clock_value b) {
  p.on_rejoin(c, w, a, b);
};
template <class P, class Ctx>
concept has_on_unknown_peer =
    requires(P& p, Ctx c, session_base& s, const message& m, std::string& d) {
      { p.on_unknown_peer(c, s, m, d) } -> std::same_as<std::optional<std::error_code>>;
    };
template <class P, class Ctx>
concept has_on_peer_message = requires(P& p, Ctx c, session_base& s, message& m, std::string& d) {
  { p.on_peer_message(c, s, m, d) } -> std::same_as<std::error_code>;
};
template <class P, class Ctx>
concept has_on_session_closed =
    requires(P& p, Ctx c, session_base& s) { p.on_session_closed(c, s); };
template <class P, class Ctx>
concept has_on_recovery_push = requires(P& p, Ctx c, session_base& s, message& m, std::string& d) {
  { p.on_recovery_push(c, s, m, d) } -> std::same_as<std::error_code>;
};
template <class P, class Ctx>
concept has_on_worker_message = requires(P& p, Ctx c, session_base& s, message& m, std::string& d) {
  { p.on_worker_message(c, s, m, d) } -> std::same_as<std::optional<std::error_code>>;
};
template <class P, class Ctx>
concept has_on_push = requires(P& p, Ctx c, session_base& s, const frame_header& h) {
  { p.on_push(c, s, h) } -> std::same_as<bool>;
};
/// Called with the applied frame's header fields (const lvalues) and its floats.
template <class P>
concept has_on_update = requires(P& p, const frame_header& h) {
  p.on_update(h.table, h.first_row, h.row_count, std::span<const float>{});
};
template <class P, class Ctx>
concept has_on_applied = requires(P& p, Ctx c, session_base& s, const message& m) {
  { p.on_applied(c, s, m) } -> std::same_as<bool>;
};
/// `on_clock(server_clock, ctx)`, preferred when both shapes are declared.
template <class P, class Ctx>
concept has_on_clock_with_context =
    requires(P& p, const clock_value c, Ctx& x) { p.on_clock(c, x); };
template <class P>
concept has_on_clock_alone = requires(P& p, const clock_value c) { p.on_clock(c); };
template <class P, class Ctx>
concept has_on_clock = has_on_clock_with_context<P, Ctx> || has_on_clock_alone<P>;
template <class P, class Ctx>
concept has_on_timer = requires(P& p, Ctx c, std::uint32_t id) { p.on_timer(c, id); };
template <class P, class Ctx>
concept has_on_connected = requires(P& p, Ctx c, session_base& s) { p.on_connected(c, s); };
template <class P, class Ctx>
concept has_on_connect_failed = requires(P& p, Ctx c, std::uint8_t role, std::error_code ec) {
  p.on_connect_failed(c, role, ec);
};
template <class P>
concept has_on_stop = requires(P& p) { p.on_stop(); };
template <class P>
concept has_serves_workers = requires(const P& p) {
  { p.serves_workers() } -> std::same_as<bool>;
};
template <class P>
concept has_recovering = requires(const P& p) {
  { p.recovering() } -> std::same_as<bool>;
};
template <class P>
concept has_routine_refusal = requires(const P& p, std::error_code ec) {
  { p.routine_refusal(ec) } -> std::same_as<bool>;
};
template <class P>
concept has_log_suffix = requires(const P& p) {
  { p.log_suffix() } -> std::convertible_to<std::string>;
};
template <class P>
concept has_peer_name = requires(const P& p, const session_base& s) {
  { p.peer_name(s) } -> std::convertible_to<std::string>;
};

/// Whether a part declares a member of a given name, whatever it is (a function, a template,
/// an overload set, a data member): `hook_probe<P>` derives from `P` and from `hook_names`,
/// which has a member of every name below, so naming one is ambiguous exactly when `P` has a
/// member of that name too. A final class or a non-class is never probed (nothing declared).
struct hook_names {
  // The hooks.
  int on_start, on_serve, on_hello, welcome_flags, on_rejoin, on_unknown_peer, on_peer_message,
      on_session_closed, on_recovery_push, on_worker_message, on_push, on_update, on_applied,
      on_clock, on_timer, on_connected, on_connect_failed, on_stop, serves_workers, recovering,
      routine_refusal, log_suffix, peer_name;
  // Near misses of their names, which the server would silently never call.
  int on_starts, on_serves, on_hellos, welcome_flag, on_rejoins, on_unknown_peers, on_peer_messages,
      on_session_close, on_recovery_pushes, on_worker_messages, on_pushes, on_updates, on_clocks,
      on_timers, on_connect, on_connection_failed, on_stops, serve_workers, serves_worker,
      routine_refusals, peer_names;
};
template <class P, bool = std::is_class_v<P> && !std::is_final_v<P>>
struct hook_probe : P, hook_names {};
template <class P>
struct hook_probe<P, false> : hook_names {};

}  // namespace detail

/// Checks a recovery policy's server part `Part` against the server hooks (the table above),
/// with one `static_assert` per hook declared with another shape than the server calls it
/// with, and one per member whose name is a near miss of a hook's (`on_clocks`,
/// `on_updates`, ...: the server would never call it), each naming the hook and its expected
/// signature. `Ctx` is the server context the hooks receive; `basic_server` checks its part with
/// its own. A hook the part does not
/// declare is not an error (the server's default applies). After a failed check it still
/// returns `true`, so that each wrong member gives exactly one error.
template <class Part, class Ctx>
consteval bool check_server_part() {
  using namespace detail;
  // `requires { &probe::x; }`: `Part` declares no member named `x` (see `hook_probe`).
  using probe = hook_probe<Part>;
  // -- hooks declared with another shape --
  static_assert(
      requires { &probe::on_start; } || has_on_start<Part, Ctx>,
      "asyncps: recovery server part: `on_start` must be "
      "`template <class Ctx> void on_start(Ctx& ctx)` (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_serve; } || has_on_serve<Part, Ctx>,
      "asyncps: recovery server part: `on_serve` must be "
      "`template <class Ctx> std::error_code on_serve(Ctx)` (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_hello; } || has_on_hello<Part, Ctx>,
      "asyncps: recovery server part: `on_hello` must be `template <class Ctx> "
      "std::error_code on_hello(Ctx, const frame_header& hello, std::string& detail)` "
      "(recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::welcome_flags; } || has_welcome_flags<Part, Ctx>,
      "asyncps: recovery server part: `welcome_flags` must be `template <class Ctx> "
      "std::uint8_t welcome_flags(Ctx, const frame_header& hello)` (recovery.hpp, "
      "server hooks)");
  static_assert(
      requires { &probe::on_rejoin; } || has_on_rejoin<Part, Ctx>,
      "asyncps: recovery server part: `on_rejoin` must be `template <class Ctx> void "
      "on_rejoin(Ctx, std::uint32_t worker, clock_value from, clock_value to)` "
      "(recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_unknown_peer; } || has_on_unknown_peer<Part, Ctx>,
      "asyncps: recovery server part: `on_unknown_peer` must be `template <class Ctx> "
      "std::optional<std::error_code> on_unknown_peer(Ctx, detail::session_base&, "
      "const message&, std::string& detail)` (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_peer_message; } || has_on_peer_message<Part, Ctx>,
      "asyncps: recovery server part: `on_peer_message` must be `template <class Ctx> "
      "std::error_code on_peer_message(Ctx, detail::session_base&, message&, "
      "std::string& detail)` (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_session_closed; } || has_on_session_closed<Part, Ctx>,
      "asyncps: recovery server part: `on_session_closed` must be `template <class "
      "Ctx> void on_session_closed(Ctx, detail::session_base&)` (recovery.hpp, server "
      "hooks)");
  static_assert(
      requires { &probe::on_recovery_push; } || has_on_recovery_push<Part, Ctx>,
      "asyncps: recovery server part: `on_recovery_push` must be `template <class Ctx> "
      "std::error_code on_recovery_push(Ctx, detail::session_base&, message&, "
      "std::string& detail)` (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_worker_message; } || has_on_worker_message<Part, Ctx>,
      "asyncps: recovery server part: `on_worker_message` must be `template <class "
      "Ctx> std::optional<std::error_code> on_worker_message(Ctx, "
      "detail::session_base&, message&, std::string& detail)` (recovery.hpp, server "
      "hooks)");
  static_assert(
      requires { &probe::on_push; } || has_on_push<Part, Ctx>,
      "asyncps: recovery server part: `on_push` must be `template <class Ctx> bool "
      "on_push(Ctx, detail::session_base&, const frame_header&)` (true: drop the "
      "message; recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_update; } || has_on_update<Part>,
      "asyncps: recovery server part: `on_update` must be callable as `void "
      "on_update(table_id table, std::uint64_t first_row, std::uint32_t rows, "
      "std::span<const float> grad)` (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_applied; } || has_on_applied<Part, Ctx>,
      "asyncps: recovery server part: `on_applied` must be `template <class Ctx> bool "
      "on_applied(Ctx, detail::session_base&, const message&)` (true: the part acks; "
      "recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_clock; } || has_on_clock<Part, Ctx>,
      "asyncps: recovery server part: `on_clock` must be `template <class Ctx> void "
      "on_clock(clock_value server_clock, Ctx& ctx)` or `void "
      "on_clock(clock_value server_clock)` (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_timer; } || has_on_timer<Part, Ctx>,
      "asyncps: recovery server part: `on_timer` must be `template <class Ctx> void "
      "on_timer(Ctx, std::uint32_t timer)` (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_connected; } || has_on_connected<Part, Ctx>,
      "asyncps: recovery server part: `on_connected` must be `template <class Ctx> void "
      "on_connected(Ctx, detail::session_base&)` (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_connect_failed; } || has_on_connect_failed<Part, Ctx>,
      "asyncps: recovery server part: `on_connect_failed` must be `template <class Ctx> void "
      "on_connect_failed(Ctx, std::uint8_t role, std::error_code ec)` (recovery.hpp, server "
      "hooks)");
  static_assert(
      requires { &probe::on_stop; } || has_on_stop<Part>,
      "asyncps: recovery server part: `on_stop` must be callable as `void on_stop()` "
      "(recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::serves_workers; } || has_serves_workers<Part>,
      "asyncps: recovery server part: `serves_workers` must be `bool serves_workers() "
      "const` (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::recovering; } || has_recovering<Part>,
      "asyncps: recovery server part: `recovering` must be `bool recovering() const` "
      "(recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::routine_refusal; } || has_routine_refusal<Part>,
      "asyncps: recovery server part: `routine_refusal` must be `bool "
      "routine_refusal(std::error_code refusal) const` (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::log_suffix; } || has_log_suffix<Part>,
      "asyncps: recovery server part: `log_suffix` must be `std::string log_suffix() "
      "const` (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::peer_name; } || has_peer_name<Part>,
      "asyncps: recovery server part: `peer_name` must be `std::string "
      "peer_name(const detail::session_base&) const` (recovery.hpp, server hooks)");
  // -- near misses of a hook's name (never called) --
  static_assert(
      requires { &probe::on_starts; },
      "asyncps: recovery server part declares `on_starts`, which is no server hook: "
      "did you mean `template <class Ctx> void on_start(Ctx& ctx)`? (recovery.hpp, server "
      "hooks)");
  static_assert(
      requires { &probe::on_serves; },
      "asyncps: recovery server part declares `on_serves`, which is no server hook: "
      "did you mean `template <class Ctx> std::error_code on_serve(Ctx)`? "
      "(recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_hellos; },
      "asyncps: recovery server part declares `on_hellos`, which is no server hook: "
      "did you mean `template <class Ctx> std::error_code on_hello(Ctx, const "
      "frame_header& hello, std::string& detail)`? (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::welcome_flag; },
      "asyncps: recovery server part declares `welcome_flag`, which is no server hook: "
      "did you mean `template <class Ctx> std::uint8_t welcome_flags(Ctx, const "
      "frame_header& hello)`? (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_rejoins; },
      "asyncps: recovery server part declares `on_rejoins`, which is no server hook: "
      "did you mean `template <class Ctx> void on_rejoin(Ctx, std::uint32_t worker, "
      "clock_value from, clock_value to)`? (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_unknown_peers; },
      "asyncps: recovery server part declares `on_unknown_peers`, which is no server "
      "hook: did you mean `on_unknown_peer`? (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_peer_messages; },
      "asyncps: recovery server part declares `on_peer_messages`, which is no server "
      "hook: did you mean `on_peer_message`? (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_session_close; },
      "asyncps: recovery server part declares `on_session_close`, which is no server "
      "hook: did you mean `template <class Ctx> void on_session_closed(Ctx, "
      "detail::session_base&)`? (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_recovery_pushes; },
      "asyncps: recovery server part declares `on_recovery_pushes`, which is no server "
      "hook: did you mean `on_recovery_push`? (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_worker_messages; },
      "asyncps: recovery server part declares `on_worker_messages`, which is no server "
      "hook: did you mean `on_worker_message`? (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_pushes; },
      "asyncps: recovery server part declares `on_pushes`, which is no server hook: "
      "did you mean `template <class Ctx> bool on_push(Ctx, detail::session_base&, "
      "const frame_header&)`? (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_updates; },
      "asyncps: recovery server part declares `on_updates`, which is no server hook: "
      "did you mean `void on_update(table_id table, std::uint64_t first_row, "
      "std::uint32_t rows, std::span<const float> grad)`? (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_clocks; },
      "asyncps: recovery server part declares `on_clocks`, which is no server hook: "
      "did you mean `template <class Ctx> void on_clock(clock_value server_clock, Ctx& ctx)` "
      "or `void on_clock(clock_value server_clock)`? (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_timers; },
      "asyncps: recovery server part declares `on_timers`, which is no server hook: "
      "did you mean `template <class Ctx> void on_timer(Ctx, std::uint32_t timer)`? "
      "(recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_connect; },
      "asyncps: recovery server part declares `on_connect`, which is no server hook: did you "
      "mean `template <class Ctx> void on_connected(Ctx, detail::session_base&)`? "
      "(recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_connection_failed; },
      "asyncps: recovery server part declares `on_connection_failed`, which is no server hook: "
      "did you mean `on_connect_failed`? (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::on_stops; },
      "asyncps: recovery server part declares `on_stops`, which is no server hook: did "
      "you mean `void on_stop()`? (recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::serve_workers; } && requires { &probe::serves_worker; },
      "asyncps: recovery server part declares `serve_workers` or `serves_worker`, "
      "which is no server hook: did you mean `bool serves_workers() const`? "
      "(recovery.hpp, server hooks)");
  static_assert(
      requires { &probe::routine_refusals; },
      "asyncps: recovery server part declares `routine_refusals`, which is no server hook: "
      "did you mean `bool routine_refusal(std::error_code refusal) const`? (recovery.hpp, "
      "server hooks)");
  static_assert(
      requires { &probe::peer_names; },
      "asyncps: recovery server part declares `peer_names`, which is no server hook: "
      "did you mean `std::string peer_name(const detail::session_base&) const`? "
      "(recovery.hpp, server hooks)");
  return true;
}

/// A server part that passes `check_server_part<Part, Ctx>()`: for a class template's
/// parameter, where a wrong hook should stop the build with the checker's messages. Not for
/// overload resolution or `if constexpr`: a wrong part is a hard error here, not `false`.
template <class Part, class Ctx>
concept checked_server_part = check_server_part<Part, Ctx>();

}  // namespace asyncps
