// asyncps — the hooks a recovery policy's server part may implement, their detection and their
// checker.
//
// `basic_server` calls each hook at a fixed point of its loops (see docs/concepts/recovery.md,
// "Server hooks"); a hook that a part does not declare has a default in the server. The server
// never asks which policy it has: everything policy-specific is one of these hooks. Hooks that
// need the server's internals receive a `Ctx` (the server's `basic_server::context`, a small
// copyable handle; every call on the server's executor).
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include "asyncps/layout.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::detail {

/// The policy-independent part of one server connection, as recovery parts see it.
///
/// A session is unknown until its first message: a worker's hello makes it a worker session;
/// a recovery part may claim it as a peer (`Ctx::claim`, or `Ctx::add_peer` for a connection
/// the part opened). Thread safety: the server's executor.
struct session_base {
  /// What the peer of a session is.
  /// `reader`: a read-only session (`protocol::reader_id`), greeted by the server itself.
  enum class kind_type : std::uint8_t { unknown, worker, peer, reader };
  static constexpr std::uint32_t none = 0xffffffffu;
  kind_type kind = kind_type::unknown;
  std::uint8_t role = 0;        ///< peer sessions: the recovery part's own tag
  bool open = true;             ///< false once closing (nothing more is sent or read)
  bool ready = false;           ///< peer sessions: the part's "handshake done" flag
  std::uint32_t worker = none;  ///< worker sessions: the worker id
  std::uint32_t peer = none;    ///< peer sessions: the part's peer id (e.g. a chain member)

  bool is_worker() const noexcept { return kind == kind_type::worker; }
  bool is_peer() const noexcept { return kind == kind_type::peer; }
  bool is_reader() const noexcept { return kind == kind_type::reader; }
  /// Whether its first message has not been taken yet (no hello, no peer handshake).
  bool is_unknown() const noexcept { return kind == kind_type::unknown; }
};

/// A member that is default-constructed again when copied (and keeps its value when moved):
/// lets a configured recovery part be copied into several servers without copying run-time
/// state (connections, logs). `T` is default-constructible and movable.
template <class T>
struct fresh_on_copy {
  T value{};
  fresh_on_copy() = default;
  fresh_on_copy(const fresh_on_copy&) : value{} {}
  fresh_on_copy(fresh_on_copy&&) noexcept = default;
  fresh_on_copy& operator=(const fresh_on_copy&) {
    value = T{};
    return *this;
  }
  fresh_on_copy& operator=(fresh_on_copy&&) noexcept = default;
};

// ------------------------------------------------------------------------------------------
// Detection: each `has_*` says whether `Part` implements that hook with the expected shape.
// ------------------------------------------------------------------------------------------

/// `std::error_code p.on_serve(ctx)`: after `on_start`, before accepting; an error ends
/// `async_serve` with it (e.g. chain replication without its endpoints).
template <class P, class Ctx>
concept has_on_serve = requires(P& p, Ctx c) {
  { p.on_serve(c) } -> std::same_as<std::error_code>;
};
/// `std::error_code p.on_hello(ctx, hello_header, detail)`: a worker's valid hello, before it
/// is registered; an error refuses it (e.g. `errc::not_head`), `detail` is appended to the
/// error's message.
template <class P, class Ctx>
concept has_on_hello = requires(P& p, Ctx c, const frame_header& h, std::string& d) {
  { p.on_hello(c, h, d) } -> std::same_as<std::error_code>;
};
/// `std::uint8_t p.welcome_flags(ctx, hello_header)`: flags of the welcome to a registered
/// worker (e.g. `frame_flags::state`: send your replica).
template <class P, class Ctx>
concept has_welcome_flags = requires(P& p, Ctx c, const frame_header& h) {
  { p.welcome_flags(c, h) } -> std::convertible_to<std::uint8_t>;
};
/// `void p.on_rejoin(ctx, worker, from, to)`: a worker's hello carried clock `to`, ahead of its
/// clock `from` here; called before the server moves the worker's clock to `to`.
template <class P, class Ctx>
concept has_on_rejoin = requires(P& p, Ctx c, std::uint32_t w, clock_value a, clock_value b) {
  p.on_rejoin(c, w, a, b);
};
/// `std::optional<std::error_code> p.on_unknown_peer(ctx, session, message, detail)`: the first
/// message of a session that is not a hello; a value claims the session (the part calls
/// `ctx.claim`) with that result, `std::nullopt` leaves it to the server (which refuses it).
template <class P, class Ctx>
concept has_on_unknown_peer =
    requires(P& p, Ctx c, session_base& s, const message& m, std::string& d) {
      { p.on_unknown_peer(c, s, m, d) } -> std::same_as<std::optional<std::error_code>>;
    };
/// `std::error_code p.on_peer_message(ctx, session, message, detail)`: a message on a peer
/// session; an error closes it.
template <class P, class Ctx>
concept has_on_peer_message = requires(P& p, Ctx c, session_base& s, message& m, std::string& d) {
  { p.on_peer_message(c, s, m, d) } -> std::same_as<std::error_code>;
};
/// `void p.on_session_closed(ctx, session)`: a session ended (both of its loops finished).
template <class P, class Ctx>
concept has_on_session_closed =
    requires(P& p, Ctx c, session_base& s) { p.on_session_closed(c, s); };
/// `std::error_code p.on_recovery_push(ctx, session, message, detail)`: a worker's valid push
/// with flag `state` or `backlog` (rows and values already checked). Without this hook such
/// a push is refused with `errc::unexpected_message`.
template <class P, class Ctx>
concept has_on_recovery_push = requires(P& p, Ctx c, session_base& s, message& m, std::string& d) {
  { p.on_recovery_push(c, s, m, d) } -> std::same_as<std::error_code>;
};
/// `std::optional<std::error_code> p.on_worker_message(ctx, session, message, detail)`: every
/// message of a registered worker, before the server dispatches it; a value means the part
/// took it (moved it, e.g. to hold it until it may be applied, and hands it back later with
/// `ctx.dispatch`) with that result, `std::nullopt` lets the server dispatch it now.
template <class P, class Ctx>
concept has_on_worker_message = requires(P& p, Ctx c, session_base& s, message& m, std::string& d) {
  { p.on_worker_message(c, s, m, d) } -> std::same_as<std::optional<std::error_code>>;
};
/// `bool p.on_push(ctx, session, header)`: a worker's push or clock message, checked, before
/// its clock is checked and before it is applied; `true` drops it (e.g. a duplicate resent
/// after a failover).
template <class P, class Ctx>
concept has_on_push = requires(P& p, Ctx c, session_base& s, const frame_header& h) {
  { p.on_push(c, s, h) } -> std::same_as<bool>;
};
/// `bool p.on_applied(ctx, session, message)`: a worker's push or clock message was applied
/// (before the worker's clock advances); `true` means the part acknowledges pushes itself
/// (now or later) and the server sends no ack.
template <class P, class Ctx>
concept has_on_applied = requires(P& p, Ctx c, session_base& s, const message& m) {
  { p.on_applied(c, s, m) } -> std::same_as<bool>;
};
/// `bool p.serves_workers() const`: whether this server serves workers now (the watchdog
/// reports missing workers only then). Default: true.
template <class P>
concept has_serves_workers = requires(const P& p) {
  { p.serves_workers() } -> std::same_as<bool>;
};
/// `bool p.recovering() const`: the shard is rebuilding its state after a restart, so what it
/// holds is not the model yet: a reader's pull is refused with `errc::recovering`.
template <class P>
concept has_recovering = requires(const P& p) {
  { p.recovering() } -> std::same_as<bool>;
};
/// `std::string p.log_suffix() const`: appended to "asyncps server <shard>" in log lines.
template <class P>
concept has_log_suffix = requires(const P& p) {
  { p.log_suffix() } -> std::convertible_to<std::string>;
};
/// `std::string p.peer_name(session) const`: names a peer session in log lines.
template <class P>
concept has_peer_name = requires(const P& p, const session_base& s) {
  { p.peer_name(s) } -> std::convertible_to<std::string>;
};

/// Compile-time check of a server part against the server context `Ctx`: a hook declared
/// under a known name (as a member template of `Ctx`) but with another shape fails here with
/// a message naming the hook and the shape the server calls it with.
template <class Part, class Ctx>
consteval bool check_server_part() {
  static_assert(
      !requires { &Part::template on_serve<Ctx>; } || has_on_serve<Part, Ctx>,
      "recovery server part: on_serve must be `template <class Ctx> std::error_code "
      "on_serve(Ctx)`");
  static_assert(
      !requires { &Part::template on_hello<Ctx>; } || has_on_hello<Part, Ctx>,
      "recovery server part: on_hello must be `template <class Ctx> std::error_code "
      "on_hello(Ctx, const frame_header& hello, std::string& detail)`");
  static_assert(
      !requires { &Part::template welcome_flags<Ctx>; } || has_welcome_flags<Part, Ctx>,
      "recovery server part: welcome_flags must be `template <class Ctx> std::uint8_t "
      "welcome_flags(Ctx, const frame_header& hello)`");
  static_assert(
      !requires { &Part::template on_rejoin<Ctx>; } || has_on_rejoin<Part, Ctx>,
      "recovery server part: on_rejoin must be `template <class Ctx> void "
      "on_rejoin(Ctx, std::uint32_t worker, clock_value from, clock_value to)`");
  static_assert(
      !requires { &Part::template on_unknown_peer<Ctx>; } || has_on_unknown_peer<Part, Ctx>,
      "recovery server part: on_unknown_peer must be `template <class Ctx> "
      "std::optional<std::error_code> on_unknown_peer(Ctx, detail::session_base&, const "
      "message&, std::string& detail)`");
  static_assert(
      !requires { &Part::template on_peer_message<Ctx>; } || has_on_peer_message<Part, Ctx>,
      "recovery server part: on_peer_message must be `template <class Ctx> "
      "std::error_code on_peer_message(Ctx, detail::session_base&, message&, "
      "std::string& detail)`");
  static_assert(
      !requires { &Part::template on_session_closed<Ctx>; } || has_on_session_closed<Part, Ctx>,
      "recovery server part: on_session_closed must be `template <class Ctx> void "
      "on_session_closed(Ctx, detail::session_base&)`");
  static_assert(
      !requires { &Part::template on_recovery_push<Ctx>; } || has_on_recovery_push<Part, Ctx>,
      "recovery server part: on_recovery_push must be `template <class Ctx> "
      "std::error_code on_recovery_push(Ctx, detail::session_base&, message&, "
      "std::string& detail)`");
  static_assert(
      !requires { &Part::template on_worker_message<Ctx>; } || has_on_worker_message<Part, Ctx>,
      "recovery server part: on_worker_message must be `template <class Ctx> "
      "std::optional<std::error_code> on_worker_message(Ctx, detail::session_base&, message&, "
      "std::string& detail)`");
  static_assert(
      !requires { &Part::template on_push<Ctx>; } || has_on_push<Part, Ctx>,
      "recovery server part: on_push must be `template <class Ctx> bool on_push(Ctx, "
      "detail::session_base&, const frame_header&)` (true: drop the message)");
  static_assert(
      !requires { &Part::template on_applied<Ctx>; } || has_on_applied<Part, Ctx>,
      "recovery server part: on_applied must be `template <class Ctx> bool "
      "on_applied(Ctx, detail::session_base&, const message&)` (true: the part acks)");
  static_assert(
      !requires { &Part::serves_workers; } || has_serves_workers<Part>,
      "recovery server part: serves_workers must be `bool serves_workers() const`");
  static_assert(
      !requires { &Part::log_suffix; } || has_log_suffix<Part>,
      "recovery server part: log_suffix must be `std::string log_suffix() const`");
  return true;
}

}  // namespace asyncps::detail
