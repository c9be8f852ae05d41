// asyncps — detail::server_protocol, the server clock: a worker's clock moved, what follows when
// the server clock advances (recovery part's on_clock, ready pulls answered, eager rows, the
// options' on_clock), elastic membership's join, leave and catch-up, and installing a shard state.
//
// Out-of-line definitions of members declared in asyncps/detail/server/protocol.hpp. Not a header
// to include on its own: protocol.hpp includes it at its end, after the class it defines
// members of (so this file does not include protocol.hpp back).
#pragma once

#include <cstdint>
#include <string>
#include <system_error>

#include "asyncps/detail/server/shard_core.hpp"
#include "asyncps/shard_state.hpp"

namespace asyncps::detail {

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::advance(
    std::uint32_t worker, clock_value c) {
  if (core_.advance(worker, c)) clock_advanced();
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::clock_advanced() {
  const clock_value m = core_.clock();
  // The two shapes of the hook, detected by recovery.hpp's concepts (the context's form first).
  if constexpr (has_on_clock_with_context<part_type, ctx_t<Io>>) {
    auto ctx = io_->ctx();
    part_.on_clock(m, ctx);  // e.g. snapshot at this clock boundary
  } else if constexpr (has_on_clock_alone<part_type>) {
    part_.on_clock(m);
  }
  answer_ready_pulls();
  if constexpr (Consistency::eager) push_subscribed();
  if (opts_.on_clock) opts_.on_clock(m);
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint,
                     Io>::answer_ready_pulls() {
  core_.take_ready([](Session* p) { return p->open; },
                   [this](Session* p, const message& req) {
                     --p->pending_pulls;
                     answer(*p, req, false);
                   });
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::join(
    std::uint32_t w) {
  membership_.present(w);
  if (core_.is_member(w)) return;
  const bool advanced = core_.join(w);
  ++stats_.joins;
  log("worker " + std::to_string(w) + " joins at clock " + std::to_string(core_.worker_clock(w)) +
      " (" + std::to_string(core_.members()) + " members, server clock " +
      std::to_string(core_.clock()) + ")");
  if (advanced) clock_advanced();
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::leave(
    std::uint32_t w, const std::string& why) {
  membership_.present(w);
  const bool advanced = core_.leave(w);
  ++stats_.departures;
  log("worker " + std::to_string(w) + " leaves at clock " + std::to_string(core_.worker_clock(w)) +
      ": " + why + " (" + std::to_string(core_.members()) + " members left, server clock " +
      std::to_string(core_.clock()) + ")");
  if (advanced) clock_advanced();
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::catch_up(
    std::uint32_t w, clock_value c) {
  if (membership_.elastic() && c > core_.worker_clock(w) && core_.is_member(w)) advance(w, c);
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::error_code
server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::restore_state(
    const shard_state& st) {
  std::string detail;
  if (auto ec = core_.restore_state(st, detail)) {
    log("refused to install a shard state: " + ec.message() + detail);
    return ec;
  }
  answer_ready_pulls();
  return {};
}

}  // namespace asyncps::detail
