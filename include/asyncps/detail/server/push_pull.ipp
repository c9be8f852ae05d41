// asyncps — detail::server_protocol, the push and pull path: a worker's push and clock message
// checked, applied (norm and finiteness checks) and acknowledged; VAP's visibility
// acknowledgements; a pull answered at once or deferred; the rows messages, and the eager rows
// pushed to subscribed readers.
//
// Out-of-line definitions of members declared in asyncps/detail/server/protocol.hpp. Not a header
// to include on its own: protocol.hpp includes it at its end, after the class it defines
// members of (so this file does not include protocol.hpp back).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <system_error>
#include <utility>

#include <Eigen/Core>

#include "asyncps/consistency.hpp"
#include "asyncps/detail/server/hooks.hpp"
#include "asyncps/detail/server/shard_core.hpp"
#include "asyncps/error.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::detail {

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::send_ack(
    Session& s, std::uint64_t seq) {
  message a;
  a.header.type = message_type::ack;
  a.header.sender = opts_.shard;
  a.header.seq = seq;
  enqueue(s, std::move(a));
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
double server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::payload_norm(
    const message& m) noexcept {
  const auto g = payload_floats(m);
  const Eigen::Map<const Eigen::ArrayXf> a(g.data(), static_cast<Eigen::Index>(g.size()));
  return std::sqrt(a.template cast<double>().square().sum());
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::string
server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::error_code server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::apply(
    const message& m, std::string& detail) {
  if (opts_.max_update_norm > 0) {
    const double norm = payload_norm(m);
    if (!(norm <= opts_.max_update_norm)) {
      detail = " (table " + std::to_string(m.header.table) + ": L2 norm " + number_text(norm) +
               " of the push from worker " + std::to_string(m.header.sender) +
               ", max_update_norm " + number_text(opts_.max_update_norm) + ")";
      return errc::update_too_large;
    }
  }
  if (auto ec = core_.check_and_apply(m, detail)) return ec;  // one pass, whole or nothing
  if (opts_.max_parameter_value > 0)
    stats_.clipped_values += core_.clip_rows(m, opts_.max_parameter_value);
  const auto& h = m.header;
  if constexpr (has_on_update<part_type>) {  // recovery.hpp's hook table
    part_.on_update(h.table, h.first_row, h.row_count, payload_floats(m));
  }
  return {};
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::error_code
server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::check_clock_room(
    clock_value c, std::string& detail) {
  if (c < protocol::max_clock) return {};
  detail = " (clock " + std::to_string(c) + " reaches the maximum clock " +
           std::to_string(protocol::max_clock) + ")";
  return errc::bad_clock;
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::error_code server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::on_push(
    Session& s, message& m, std::string& detail) {
  const auto& h = m.header;
  if (h.sender != s.worker) {
    detail = " (got " + std::to_string(h.sender) + " on the connection of worker " +
             std::to_string(s.worker) + ")";
    return errc::bad_sender;
  }
  if (auto ec = core_.check_rows(m, detail)) return ec;
  // A plain push's values are checked finite by `apply` (`shard_core::check_and_apply`),
  // chunk by chunk as the update is applied: one pass over the push. A policy's push
  // (e.g. a replica or a backlog) goes to the recovery part, which may keep it unapplied:
  // checked here.
  if (h.has(frame_flags::policy) || h.has(frame_flags::prefixed)) {
    if (!core_type::all_finite(payload_floats(m))) return errc::non_finite_value;
    if constexpr (has_on_recovery_push<part_type, ctx_t<Io>>) {
      return part_.on_recovery_push(io_->ctx(), s, m, detail);
    } else {
      detail = std::string(" (a push flagged `policy` or `prefixed`, but recovery policy '") +
               std::string(Recovery::name) + "' takes none)";
      return errc::unexpected_message;
    }
  }
  if constexpr (has_on_push<part_type, ctx_t<Io>>) {
    if (part_.on_push(io_->ctx(), s, h)) return {};  // e.g. a duplicate after a failover
  }
  return push_of(&s, s.worker, m, detail);
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::error_code server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::clock_of(
    Session* s, std::uint32_t w, message& m, std::string& detail) {
  const auto& h = m.header;
  if (auto ec = check_clock_room(h.clock, detail)) return ec;
  catch_up(w, h.clock);
  if (h.clock != core_.worker_clock(w)) {
    detail = " (clock " + std::to_string(h.clock) + ", worker is at clock " +
             std::to_string(core_.worker_clock(w)) + ")";
    return errc::unexpected_message;
  }
  if (h.clock == std::numeric_limits<clock_value>::max()) {  // clock + 1 would overflow
    detail = " (clock " + std::to_string(h.clock) + ")";
    return errc::unexpected_message;
  }
  if (h.seq != 0) core_.last_seq(w) = h.seq;
  if constexpr (has_on_applied<part_type, ctx_t<Io>>) {
    if (s != nullptr) (void)part_.on_applied(io_->ctx(), *s, m);
  }
  advance(w, h.clock + 1);
  return {};
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::error_code server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::push_of(
    Session* s, std::uint32_t w, message& m, std::string& detail) {
  const auto& h = m.header;
  if (auto ec = check_clock_room(h.clock, detail)) return ec;
  catch_up(w, h.clock);
  if (h.clock != core_.worker_clock(w)) {
    detail = " (push for clock " + std::to_string(h.clock) + ", worker is at clock " +
             std::to_string(core_.worker_clock(w)) + ")";
    return errc::unexpected_message;
  }
  if (h.has(frame_flags::end_of_clock) && h.clock == std::numeric_limits<clock_value>::max()) {
    detail = " (push for clock " + std::to_string(h.clock) + ": clock + 1 would overflow)";
    return errc::unexpected_message;
  }
  if (auto ec = apply(m, detail)) return ec;
  core_.count_push(w, h.table);
  core_.last_seq(w) = h.seq;
  ++stats_.pushes;
  bool part_acks = s == nullptr;  // the recovery part acknowledges (e.g. once replicated)
  if constexpr (has_on_applied<part_type, ctx_t<Io>>) {
    if (s != nullptr) part_acks = part_.on_applied(io_->ctx(), *s, m);
  }
  // VAP: the writer's clock is acknowledged once it is visible, i.e. once every reader that
  // the rows below were sent to has acknowledged them (on_visibility_ack), not when applied.
  const bool visibility_ack = is_value_bounded_v<Consistency> && !part_acks &&
                              h.has(frame_flags::want_ack) && h.has(frame_flags::end_of_clock);
  if (!part_acks && h.has(frame_flags::want_ack) && !visibility_ack) send_ack(*s, h.seq);
  if (h.has(frame_flags::end_of_clock)) {
    advance(w, h.clock + 1);
    if constexpr (is_value_bounded_v<Consistency>)
      push_subscribed(visibility_ack ? s : nullptr, h.seq);
  }
  return {};
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::error_code
server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::on_visibility_ack(
    Session& s, const message& m, std::string& detail) {
  if (m.header.sender != s.worker) return errc::bad_sender;
  return visibility_.on_ack(s, m.header.seq, detail, acker());
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::error_code server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::on_pull(
    Session& s, message& m, std::string& detail) {
  const auto& h = m.header;
  if (h.sender != s.worker) return errc::bad_sender;
  if (h.clock <= protocol::max_clock) catch_up(s.worker, h.clock);
  if (h.clock > core_.worker_clock(s.worker)) {  // no reader needs rows fresher than its own
    detail = " (pull wants server clock " + std::to_string(h.clock) + ", worker is at " +
             std::to_string(core_.worker_clock(s.worker)) + ")";
    return errc::unexpected_message;
  }
  if (auto ec = core_.check_rows(m, detail)) return ec;
  if (core_.clock() >= h.clock) {
    answer(s, m, false);
  } else {
    ++stats_.deferred_pulls;
    if (++s.pending_pulls > opts_.max_pending_pulls) {
      detail = " (more than " + std::to_string(opts_.max_pending_pulls) + " pulls waiting)";
      return errc::too_many_requests;
    }
    if (core_.pending_bytes() + m.payload.size() > opts_.max_total_pending_pull_bytes) {
      --s.pending_pulls;
      detail = " (its " + std::to_string(m.payload.size()) +
               " bytes of keys would take the pulls waiting here past "
               "max_total_pending_pull_bytes " +
               std::to_string(opts_.max_total_pending_pull_bytes) + "; they hold " +
               std::to_string(core_.pending_bytes()) + ")";
      return errc::too_many_requests;
    }
    core_.defer(&s, std::move(m), io_->now());
    if (watchdog_idle) {  // the watchdog sleeps while nothing waits: wake it
      watchdog_idle = false;
      io_->wake_watchdog();
    }
  }
  return {};
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::answer(
    Session& s, const message& req, bool eager) {
  const auto& h = req.header;
  send_requested_rows(s, req, eager);
  if (!eager) ++stats_.pulls;
  if constexpr (Consistency::eager || is_value_bounded_v<Consistency>) {
    if (!eager) core_.subscribe(s.subs[h.table], req);
  }
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::send_requested_rows(
    Session& s, const message& req, bool eager) {
  const auto& h = req.header;
  send_rows(s, h.table, h.has(frame_flags::range), h.first_row, h.row_count, eager,
            core_.reply_payload(req, alloc()));
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::send_rows(
    Session& s, table_id tid, bool ranged, std::uint64_t first, std::uint32_t count, bool eager,
    buffer payload, bool want_ack) {
  message r;
  r.header.type = message_type::rows;
  r.header.flags = static_cast<std::uint8_t>((ranged ? frame_flags::range : 0) |
                                             (eager ? frame_flags::eager : 0) |
                                             (want_ack ? frame_flags::want_ack : 0));
  r.header.sender = opts_.shard;
  r.header.table = tid;
  r.header.clock = core_.clock();
  r.header.seq = s.worker == no_worker ? 0 : core_.applied(s.worker, tid);
  r.header.row_count = count;
  r.header.width = core_.table(tid).spec.width;
  r.header.first_row = ranged ? first : 0;
  r.payload = std::move(payload);
  enqueue(s, std::move(r));
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::push_subscribed(
    Session* writer, std::uint64_t seq) {
  const std::uint64_t id = visibility_.next_id();  // this writer clock's
  std::uint32_t readers = 0;
  for (table_id t = 0; t < core_.num_tables(); ++t) {
    // The whole shard, when sent as a range: the table's own bytes, shared by the readers
    // (copy-on-write keeps them while a reply holds them; see shard_core::reply_payload).
    const auto& values = core_.table(t).values;
    buffer whole = values.share(0, values.size());
    for (auto& s : sessions_) {
      if (!s.open || !s.is_worker()) continue;
      auto& sub = s.subs[t];
      if (!sub.ranged && sub.keys.empty()) continue;
      auto e = core_.eager_rows_for(t, sub, whole, alloc());
      const bool want_ack =
          is_value_bounded_v<Consistency> && writer != nullptr && &s != writer && e.count > 0;
      send_rows(s, t, e.ranged, e.ranged ? e.range.begin : 0, e.count, true, std::move(e.payload),
                want_ack);
      ++stats_.eager_messages;
      // (enqueue closes a session over its queue limits: then it is no reader)
      if (want_ack && s.open && visibility_.sent(s, id)) ++readers;
    }
  }
  if constexpr (is_value_bounded_v<Consistency>) {
    if (writer != nullptr) visibility_.add(*writer, seq, readers, acker());
  }
}

}  // namespace asyncps::detail
