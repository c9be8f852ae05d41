// asyncps — detail: how `basic_worker` calls a recovery policy's worker part: each hook's
// detection (with `requires`) and its default when the part lacks it. The types the hooks take
// and return, and `check_worker_part<Part>()`, are public: asyncps/recovery/worker_hooks.hpp.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <system_error>
#include <vector>

#include "asyncps/error.hpp"
#include "asyncps/layout.hpp"
#include "asyncps/recovery/worker_hooks.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

namespace detail::worker_hooks {

// Each hook: called when the part declares it (detected with `requires`), else the default.

/// `void on_start(const worker_setup&)`: once, from the worker's constructor.
template <class P>
void on_start(P& p, const worker_setup& s) {
  if constexpr (requires { p.on_start(s); }) p.on_start(s);
}

/// `clock_value hello_clock(std::uint32_t shard, clock_value clock)`: the clock a (re)connect's
/// hello carries. Default: the worker's clock.
template <class P>
clock_value hello_clock(const P& p, std::uint32_t shard, clock_value clock) {
  if constexpr (requires { p.hello_clock(shard, clock); })
    return p.hello_clock(shard, clock);
  else
    return clock;
}

/// `std::uint8_t hello_flags(std::uint32_t shard)`: `frame_flags` a (re)connect's hello
/// carries (e.g. `frame_flags::policy`: recovery::replica_log's `holds_log_flag`). Default: none.
template <class P>
std::uint8_t hello_flags(const P& p, std::uint32_t shard) noexcept {
  if constexpr (requires { p.hello_flags(shard); })
    return p.hello_flags(shard);
  else
    return 0;
}

// takes_server_messages<P>: recovery/worker_hooks.hpp (check_worker_part uses it).

/// `std::error_code on_server_message(std::uint32_t shard, message& m, std::vector<message>&
/// replies)`: a message from `shard` of a type the worker does not handle itself (e.g. the
/// replica log's `order` and state replica); the part may keep `m`'s payload and queue replies
/// (sent on the link, in order, right away). An error fails the link. Default:
/// `errc::unexpected_message`.
template <class P>
std::error_code on_server_message(P& p, std::uint32_t shard, message& m,
                                  std::vector<message>& replies) {
  if constexpr (takes_server_messages<P>)
    return p.on_server_message(shard, m, replies);
  else
    return errc::unexpected_message;
}

/// `refusal_action on_refused(std::uint32_t shard, std::error_code code)`: a server of `shard`
/// refused this worker with `code` (an error frame answering the hello, or closing the link
/// mid-run): an `errc`, or the policy's own code (`R::error_enum`). Default:
/// `refusal_action::fail`.
template <class P>
refusal_action on_refused(const P& p, std::uint32_t shard, std::error_code code) noexcept {
  if constexpr (requires { p.on_refused(shard, code); })
    return p.on_refused(shard, code);
  else
    return refusal_action::fail;
}

/// `welcome_action on_welcome(const welcome_part&)`: per part of a welcome. Default:
/// `count_lost`.
template <class P>
welcome_action on_welcome(P& p, const welcome_part& w) {
  if constexpr (requires { p.on_welcome(w); })
    return p.on_welcome(w);
  else
    return welcome_action::count_lost;
}

/// `std::uint8_t push_flags()`: `frame_flags` every push and clock message carries (a message
/// with `want_ack` is numbered). Default: none.
template <class P>
std::uint8_t push_flags(const P& p) noexcept {
  if constexpr (requires { p.push_flags(); })
    return p.push_flags();
  else
    return 0;
}

/// `void on_push(std::uint32_t shard, const message& m)`: a push or clock message about to be
/// sent (header and payload final; a part may keep `m.payload.share()`). Default: nothing.
template <class P>
void on_push(P& p, std::uint32_t shard, const message& m) {
  if constexpr (requires { p.on_push(shard, m); }) p.on_push(shard, m);
}

/// `bool on_ack(std::uint32_t shard, std::uint64_t seq)`: an ack of pushes up to `seq`;
/// returns whether the clock loop should re-check its wait. Default: true.
template <class P>
bool on_ack(P& p, std::uint32_t shard, std::uint64_t seq) {
  if constexpr (requires { p.on_ack(shard, seq); })
    return p.on_ack(shard, seq);
  else
    return true;
}

/// `bool flow_blocked(std::uint32_t shard)`: the worker waits before its next gradient while
/// this holds for a shard that is up. Default: false.
template <class P>
bool flow_blocked(const P& p, std::uint32_t shard) noexcept {
  if constexpr (requires { p.flow_blocked(shard); })
    return p.flow_blocked(shard);
  else
    return false;
}

/// `void while_away(std::uint32_t shard, std::span<const away_slice>)`: a clock's gradient for
/// a shard that is down, when the part's `on_server_lost` answered `continue_local` (the worker
/// applies it to its cache itself). Default: nothing (the gradient is dropped).
template <class P>
void while_away(P& p, std::uint32_t shard, std::span<const away_slice> slices) {
  if constexpr (requires { p.while_away(shard, slices); }) p.while_away(shard, slices);
}

/// `void on_rejoin(rejoin_context&)`: a link reconnected; queue what to send before it is up.
/// Default: nothing.
template <class P>
void on_rejoin(P& p, rejoin_context& r) {
  if constexpr (requires { p.on_rejoin(r); }) p.on_rejoin(r);
}

/// `void on_rejoin_sent(std::uint32_t shard, const frame_header&)`: a queued rejoin message
/// went out. Default: nothing.
template <class P>
void on_rejoin_sent(P& p, std::uint32_t shard, const frame_header& h) {
  if constexpr (requires { p.on_rejoin_sent(shard, h); }) p.on_rejoin_sent(shard, h);
}

/// `std::uint64_t unacknowledged(std::uint32_t shard)`: pushes to `shard` sent and not
/// acknowledged yet (a part whose `push_flags` ask for acks). Read when a shard is lost, to
/// tell the acknowledged pushes lost with it from the others. Default: 0.
template <class P>
std::uint64_t unacknowledged(const P& p, std::uint32_t shard) noexcept {
  if constexpr (requires { p.unacknowledged(shard); })
    return p.unacknowledged(shard);
  else
    return 0;
}

/// `bool has_pending(std::uint32_t shard, bool up)`: the worker has something to deliver to
/// `shard` before it may finish (it waits, within the reconnect timeout). Default: false.
template <class P>
bool has_pending(const P& p, std::uint32_t shard, bool up) noexcept {
  if constexpr (requires { p.has_pending(shard, up); })
    return p.has_pending(shard, up);
  else
    return false;
}

}  // namespace detail::worker_hooks

}  // namespace asyncps
