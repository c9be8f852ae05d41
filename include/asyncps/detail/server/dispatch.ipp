// asyncps — detail::server_protocol, messages in: `receive` (the allocation-failure refusal around
// it), routing a message by session kind to the front door, the recovery part or the worker's
// dispatch, the reader's and the worker's message switches, error frames in, and refusing a session
// with an error frame (`reject`).
//
// Out-of-line definitions of members declared in asyncps/detail/server/protocol.hpp. Not a header
// to include on its own: protocol.hpp includes it at its end, after the class it defines
// members of (so this file does not include protocol.hpp back).
#pragma once

#include <algorithm>
#include <cstdint>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>

#include "asyncps/consistency.hpp"
#include "asyncps/detail/server/hooks.hpp"
#include "asyncps/detail/text.hpp"
#include "asyncps/error.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::detail {

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::reject(
    Session& s, std::error_code ec, const std::string& detail) {
  const std::string reason = ec.message() + detail;
  bool routine = false;  // e.g. a chain member that is not the head: the worker tries the next
  if constexpr (has_routine_refusal<part_type>) routine = part_.routine_refusal(ec);
  if (!routine) {
    ++stats_.rejected;
    if (log_allowed(log_kind::refused_request, s.address))
      log("closing connection of " + who(s) + ": " + reason);
  }
  // An errc, or the recovery policy's own code (its worker reads it back), or no code.
  enqueue(s, protocol::encode(
                 protocol::error{.sender = opts_.shard,
                                 .code = ec.category() == error_category()
                                             ? std::optional<errc>(static_cast<errc>(ec.value()))
                                             : std::nullopt,
                                 .policy_code = policy_error_to_wire<Recovery>(ec),
                                 .reason = reason},
                 alloc()));
  close_after_flush(s);  // the write loop flushes the error, then closes
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
bool server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::receive(
    Session& s, message& m) {
  stats_.bytes_in += m.payload.size();
  s.heard = io_->now();
  std::string detail;
  std::error_code err;
  if (s.is_worker() && worker_session(s.worker) != &s) return false;  // taken over: ignored
  const bool first = bounds_.awaits_hello(s);
  try {
    err = handle(s, m, detail);
  } catch (const std::bad_alloc&) {
    err = errc::resource_exhausted;
    detail = " (type " + std::to_string(static_cast<int>(m.header.type)) + ", " +
             std::to_string(m.payload.size()) + " payload bytes)";
  } catch (const std::length_error&) {
    err = errc::resource_exhausted;
    detail = " (type " + std::to_string(static_cast<int>(m.header.type)) + ", " +
             std::to_string(m.payload.size()) + " payload bytes)";
  }
  if (err) {
    try {
      reject(s, err, detail);
    } catch (const std::exception&) {  // no memory for the error frame either: just close
      close(s);
    }
  }
  if (first) settle();  // greeted, claimed or refused: its hello deadline is over
  return !err;
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::error_code server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::handle(
    Session& s, message& m, std::string& detail) {
  std::error_code err;
  if (s.is_reader()) {
    err = on_reader_message(s, m, detail);
  } else if (s.is_worker()) {
    if constexpr (has_on_worker_message<part_type, ctx_t<Io>>) {
      // e.g. held until the message's apply position is logged (recovery::replica_log)
      if (auto r = part_.on_worker_message(io_->ctx(), s, m, detail))
        err = *r;
      else
        err = dispatch(s, m, detail);
    } else {
      err = dispatch(s, m, detail);
    }
  } else if (!s.is_peer()) {
    err = greet(s, m, detail);
  } else if constexpr (has_on_peer_message<part_type, ctx_t<Io>>) {
    err = part_.on_peer_message(io_->ctx(), s, m, detail);
  }
  // A push or clock message taken (applied, or held by the recovery part): the next
  // incarnation of the worker numbers its messages above it (see greet's welcome).
  if (!err && s.is_worker() && numbered_type(m.header.type) && m.header.sender == s.worker) {
    seen_seq_[s.worker] = std::max(seen_seq_[s.worker], m.header.seq);
    s.trained = true;
    trained_once_[s.worker] = 1;
  }
  return err;
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::error_code
server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::on_reader_message(
    Session& s, message& m, std::string& detail) {
  const auto& h = m.header;
  switch (h.type) {
    case message_type::pull:
      if (h.sender != protocol::reader_id) return errc::bad_sender;
      if (auto ec = core_.check_rows(m, detail)) return ec;
      if constexpr (has_recovering<part_type>) {
        if (part_.recovering()) {
          detail = " (a reader's pull while the shard rebuilds its state after a restart)";
          return errc::recovering;
        }
      }
      send_requested_rows(s, m, false);
      ++stats_.reader_pulls;
      return {};
    case message_type::heartbeat: return {};
    case message_type::bye: close_after_flush(s); return {};
    case message_type::error: return on_error_frame(s, m, detail);
    default:
      detail = " (type " + std::to_string(static_cast<int>(h.type)) +
               " from a reader, which may only pull)";
      return errc::unexpected_message;
  }
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::error_code
server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::on_error_frame(
    Session& s, const message& m, std::string& detail) {
  protocol::error e;
  if (auto ec = protocol::decode(m, e, detail)) return ec;
  log(who(s) + " reported an error: " + peer_text(e.reason));
  close_after_flush(s);
  return {};
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::error_code server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::dispatch(
    Session& s, message& m, std::string& detail) {
  const auto& h = m.header;
  switch (h.type) {
    case message_type::push: return on_push(s, m, detail);
    case message_type::clock:
      if (h.sender != s.worker) return errc::bad_sender;
      if constexpr (has_on_push<part_type, ctx_t<Io>>) {
        if (part_.on_push(io_->ctx(), s, h)) return {};  // e.g. a duplicate after a failover
      }
      return clock_of(&s, s.worker, m, detail);
    case message_type::pull: return on_pull(s, m, detail);
    case message_type::heartbeat: return {};
    case message_type::bye:
      if (membership_.elastic() && core_.is_member(s.worker)) leave(s.worker, "it said bye");
      close_after_flush(s);
      return {};
    case message_type::error: return on_error_frame(s, m, detail);
    case message_type::ack:  // VAP: the reader has the eager rows up to `seq`
      if constexpr (is_value_bounded_v<Consistency>) return on_visibility_ack(s, m, detail);
      detail = " (ack from a worker; only a VAP server asks readers for them)";
      return errc::unexpected_message;
    default:
      detail = " (type " + std::to_string(static_cast<int>(h.type)) + " from a worker)";
      return errc::unexpected_message;
  }
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::error_code
server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::dispatch_held(
    std::uint32_t w, Session* s, message& m, std::string& detail) {
  if (s != nullptr) return dispatch(*s, m, detail);
  if (m.header.type == message_type::push) return push_of(nullptr, w, m, detail);
  if (m.header.type == message_type::clock) return clock_of(nullptr, w, m, detail);
  return {};
}

}  // namespace asyncps::detail
