// asyncps — detail::server_protocol, sessions and their bounds: a connection opened and finished,
// messages queued under the per-connection limits and the server-wide queue budget (closing the
// largest queues to make room), closing a session, and the hello, send and membership deadlines
// that the sweeper enforces.
//
// Out-of-line definitions of members declared in asyncps/detail/server/protocol.hpp. Not a header
// to include on its own: protocol.hpp includes it at its end, after the class it defines
// members of (so this file does not include protocol.hpp back).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "asyncps/consistency.hpp"
#include "asyncps/detail/server/bounds.hpp"
#include "asyncps/detail/server/hooks.hpp"
#include "asyncps/detail/server/session.hpp"
#include "asyncps/detail/text.hpp"
#include "asyncps/error.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::detail {

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
template <class... Args>
Session& server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::add_session(
    Args&&... args) {
  auto& s = sessions_.emplace_back(std::forward<Args>(args)...);
  s.self = std::prev(sessions_.end());
  if constexpr (requires { s.conn.remote_endpoint(); }) {
    // Taken now: once the peer has gone, a socket no longer knows it.
    s.address = endpoint_string(s.conn.remote_endpoint());
  }
  if (bounds_.on_opened(s, io_->now())) io_->wake_sweeper();
  return s;
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::session_finished(
    Session& s) {
  if (s.is_worker() && worker_session(s.worker) == &s) {
    undo_untrained_raise(s);
    registered_[s.worker] = nullptr;
    // Elastic: a member whose connection ended without bye leaves after the grace period,
    // unless it says hello again first.
    if (membership_.elastic() && core_.is_member(s.worker)) {
      membership_.absent(s.worker, io_->now());
      io_->wake_sweeper();
    }
    // The last worker left: nothing can wait any more, so the watchdog stops ticking now
    // (a simulation becomes quiescent when its workers are done, not a tick later).
    if (!watchdog_idle && std::none_of(registered_.begin(), registered_.end(),
                                       [](const Session* p) { return p != nullptr; }))
      io_->wake_watchdog();
  }
  if constexpr (has_on_session_closed<part_type, ctx_t<Io>>) {
    part_.on_session_closed(io_->ctx(), s);
  }
  core_.drop(&s);
  if constexpr (is_value_bounded_v<Consistency>) visibility_.forget(s, acker());
  bounds_.on_finished(s);
  sessions_.erase(s.self);
  settle();  // e.g. the last connection ended: the sweeper's timer is disarmed
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::enqueue(Session& s,
                                                                                        message m,
                                                                                        bool peer) {
  if (!s.open) return;
  if (!peer &&
      s.over(queue_limits{opts_.max_queued_messages, opts_.max_queued_bytes}, m.payload.size())) {
    log("closing connection of " + who(s) + ": it does not read its messages (" +
        std::to_string(s.queued()) + " messages, " + std::to_string(s.queued_bytes) +
        " bytes queued)");
    close(s);
    return;
  }
  if (!peer && !make_room(s, m.payload.size())) return;
  stats_.bytes_out += m.payload.size();
  bounds_.on_queued(m.payload.size());
  s.queue(std::move(m));
  io_->wake(s);
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::close(Session& s) {
  s.open = false;
  bounds_.on_cut(s);
  io_->close(s);
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::send_started(
    Session& s) {
  if (bounds_.on_send_started(s, io_->now())) io_->wake_sweeper();
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::optional<TimePoint>
server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::sweep() {
  if (membership_.elastic()) {
    membership_.due(io_->now(), [this](std::uint32_t w) {
      if (worker_session(w) == nullptr && core_.is_member(w))
        leave(w, "its connection has been gone for " + std::to_string(membership_.grace().count()) +
                     " ms");
    });
  }
  limiter_.flush(io_->now(), [this](const std::string& line) { log(line); });
  if constexpr (has_on_timer<part_type, ctx_t<Io>>) {
    // The part's timers that are due, in id order; each fires once (it may arm itself again).
    for (std::uint32_t id = 0; id < part_timer_count; ++id) {
      if (part_timers_[id] && *part_timers_[id] <= io_->now()) {
        part_timers_[id].reset();
        part_.on_timer(io_->ctx(), id);
      }
    }
  }
  auto next = sweep_sessions();
  if (const auto d = membership_.next()) next = next ? std::min(*next, *d) : *d;
  for (const auto& d : part_timers_)
    if (d) next = next ? std::min(*next, *d) : *d;
  return next;
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::part_connected(
    Session& s) {
  if constexpr (has_on_connected<part_type, ctx_t<Io>>) {
    part_.on_connected(io_->ctx(), s);
  } else {
    close(s);  // nobody asked for it
  }
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::part_connect_failed(
    std::uint8_t role, std::error_code ec) {
  if constexpr (has_on_connect_failed<part_type, ctx_t<Io>>)
    part_.on_connect_failed(io_->ctx(), role, ec);
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::arm_part_timer(
    std::uint32_t id, std::chrono::milliseconds after) {
  if (id >= part_timer_count)
    throw std::out_of_range("asyncps: a recovery part armed timer " + std::to_string(id) +
                            "; its timers are 0 to " + std::to_string(part_timer_count - 1) +
                            " (part_context::timer_count)");
  part_timers_[id] = io_->now() + std::chrono::duration_cast<typename TimePoint::duration>(after);
  io_->wake_sweeper();
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::optional<TimePoint>
server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::sweep_sessions() {
  return bounds_.sweep(
      sessions_, io_->now(),
      [this](Session& s) {
        ++stats_.rejected;
        log("closing connection of " + who(s) + ": a write has not completed for " +
            std::to_string(opts_.send_timeout.count()) + " ms (send_timeout; " +
            std::to_string(s.queued()) + " messages, " + std::to_string(s.queued_bytes) +
            " bytes queued): the peer does not read");
        close(s);
      },
      [this](Session& s) {
        reject(s, errc::timeout,
               " (no hello or other valid first message within " +
                   std::to_string(opts_.hello_timeout.count()) + " ms of the connection)");
      });
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::close_after_flush(
    Session& s) {
  s.open = false;
  io_->wake(s);
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
bool server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::make_room(
    Session& s, std::size_t bytes) {
  while (Session* victim = bounds_.over_budget(sessions_, s, bytes)) {
    ++stats_.over_budget_closes;
    log("closing connection of " + who(*victim) +
        ": the server's queued bytes would exceed max_total_queued_bytes " +
        std::to_string(opts_.max_total_queued_bytes) + " (all connections hold " +
        std::to_string(bounds_.queued_bytes()) + " bytes; this one holds " +
        std::to_string(victim->queued_bytes) + " bytes in " + std::to_string(victim->queued()) +
        " messages" + (victim == &s ? "" : ", the largest queue") + "; " + std::to_string(bytes) +
        " more bytes were to be queued to " + (victim == &s ? "it" : who(s)) + ")");
    close(*victim);
    if (victim == &s) return false;
  }
  return true;
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::settle() {
  if (bounds_.settle(sessions_)) io_->wake_sweeper();
}

}  // namespace asyncps::detail
