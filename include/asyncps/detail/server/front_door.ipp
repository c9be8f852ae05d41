// asyncps — detail::server_protocol, the front door: a session's first message (a worker's hello, a
// reader's hello, or through the recovery part a peer's), the hello's checks (policy fingerprint,
// sender, the certificate's identity, clock, layout), registering the worker and its welcome, and
// taking a worker id over from an older connection.
//
// Out-of-line definitions of members declared in asyncps/detail/server/protocol.hpp. Not a header
// to include on its own: protocol.hpp includes it at its end, after the class it defines
// members of (so this file does not include protocol.hpp back).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <system_error>

#include "asyncps/consistency.hpp"
#include "asyncps/detail/server/hooks.hpp"
#include "asyncps/detail/server/session.hpp"
#include "asyncps/detail/server/shard_core.hpp"
#include "asyncps/error.hpp"
#include "asyncps/peer_identity.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::detail {

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::error_code server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::greet(
    Session& s, const message& m, std::string& detail) {
  const auto& h = m.header;
  if constexpr (has_on_unknown_peer<part_type, ctx_t<Io>>) {
    if (h.type != message_type::hello) {
      if (auto r = part_.on_unknown_peer(io_->ctx(), s, m, detail)) return *r;
    }
  }
  if (h.type != message_type::hello) {
    detail = " (expected hello first)";
    return errc::unexpected_message;
  }
  protocol::hello& hello = hello_;  // reused: a hello decodes into the same vector
  if (auto ec = protocol::decode(m, hello, detail)) return ec;
  if (h.sender == protocol::reader_id) {
    // A reader only reads the model: a reader's or a worker's certificate may.
    if (s.identity && !s.identity->has_role(peer_role::reader) &&
        !s.identity->has_role(peer_role::worker)) {
      detail = " (a reader's hello, but this connection's certificate names " +
               asyncps::to_string(*s.identity) + ")";
      return errc::bad_sender;
    }
    return greet_reader(s, hello, detail);
  }
  if (hello.fingerprint != policy_fingerprint<Consistency, Recovery>()) {
    detail = std::string(" (this server runs ") + (Consistency::eager ? "eager" : "lazy") +
             " consistency and recovery '" + std::string(Recovery::name) + "')";
    return errc::policy_mismatch;
  }
  if (h.sender >= opts_.num_workers) {
    detail = " (got " + std::to_string(h.sender) + ", num_workers " +
             std::to_string(opts_.num_workers) + ")";
    return errc::bad_sender;
  }
  if (auto why = identity_refusal(s.identity.get(), "a hello as worker " + std::to_string(h.sender),
                                  peer_role::worker, h.sender);
      !why.empty()) {
    detail = " (" + why + ")";
    return errc::bad_sender;
  }
  if (auto ec = check_hello_clock(h.sender, h.clock, detail)) return ec;
  if (!core_.layout_matches(hello.layout)) {
    detail = " (" + core_.layout_difference_from(hello.layout) + ")";
    return errc::layout_mismatch;
  }
  if constexpr (has_on_hello<part_type, ctx_t<Io>>) {
    if (auto ec = part_.on_hello(io_->ctx(), h, detail)) return ec;  // e.g. not the head
  }
  if (registered_.empty()) {
    registered_.assign(opts_.num_workers, nullptr);
    incarnation_.assign(opts_.num_workers, 0);
    seen_seq_.assign(opts_.num_workers, 0);
  }
  if (Session* old = registered_[h.sender]; old != nullptr && old != &s) {
    if (auto ec = may_take_over(*old, hello.incarnation, detail)) return ec;
    take_over(*old, s, hello.incarnation);
  }
  incarnation_[h.sender] = hello.incarnation;
  registered_[h.sender] = &s;
  connected_once_[h.sender] = 1;
  s.worker = h.sender;
  s.kind = session_base::kind_type::worker;
  s.subs.assign(core_.num_tables(), subscription{});
  if (membership_.elastic()) join(s.worker);
  std::uint8_t flags = 0;
  if constexpr (has_welcome_flags<part_type, ctx_t<Io>>) {
    flags = part_.welcome_flags(io_->ctx(), h);  // e.g. ask for replicas
  }
  protocol::welcome w{.shard = opts_.shard,
                      .num_shards = opts_.num_shards,
                      .server_clock = core_.clock(),
                      .last_seq = std::max(core_.last_seq(s.worker), seen_seq_[s.worker]),
                      .worker_clock = std::max(core_.worker_clock(s.worker), h.clock),
                      .policy_bit = (flags & frame_flags::policy) != 0,
                      .tables = {},
                      .local_step = 0};
  core_.welcome_tables(s.worker, w);
  enqueue(s, protocol::encode(w, alloc()));
  if (h.clock > core_.worker_clock(s.worker)) {
    // The worker kept training while this shard was away (a restart from a checkpoint, or
    // without state): its updates of the clocks in between are lost here, so its clock at
    // this shard moves up to its own.
    log("worker " + std::to_string(s.worker) + " rejoins at clock " + std::to_string(h.clock) +
        " (this shard had it at " + std::to_string(core_.worker_clock(s.worker)) + ")");
    ++stats_.rejoins;
    if constexpr (has_on_rejoin<part_type, ctx_t<Io>>) {
      part_.on_rejoin(io_->ctx(), s.worker, core_.worker_clock(s.worker),
                      h.clock);  // e.g. log the jump
    }
    s.raised_from = core_.worker_clock(s.worker);
    advance(s.worker, h.clock);
  }
  return {};
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::error_code
server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::greet_reader(
    Session& s, const protocol::hello& hello, std::string& detail) {
  if (!core_.layout_matches(hello.layout)) {
    detail = " (" + core_.layout_difference_from(hello.layout) + ")";
    return errc::layout_mismatch;
  }
  s.kind = session_base::kind_type::reader;
  ++stats_.readers;
  protocol::welcome w{.shard = opts_.shard,
                      .num_shards = opts_.num_shards,
                      .server_clock = core_.clock(),
                      .last_seq = 0,
                      .worker_clock = core_.clock(),
                      .policy_bit = false,
                      .tables = {},
                      .local_step = 0};
  core_.welcome_tables(no_worker, w);
  enqueue(s, protocol::encode(w, alloc()));
  return {};
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::error_code
server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::check_hello_clock(
    std::uint32_t w, clock_value c, std::string& detail) const {
  if (c < 0 || c > protocol::max_clock) {
    detail = " (worker " + std::to_string(w) + " says hello at clock " + std::to_string(c) +
             "; clocks lie in [0, " + std::to_string(protocol::max_clock) + "])";
    return errc::bad_clock;
  }
  constexpr auto s = static_staleness();
  if constexpr (s.has_value()) {
    if (*s > protocol::max_clock) return {};
    std::optional<clock_value> lead;  // the highest clock of another connected worker
    for (std::uint32_t v = 0; v < registered_.size(); ++v)
      if (v != w && registered_[v] != nullptr && registered_[v]->open && registered_[v]->trained)
        lead = std::max(lead.value_or(0), core_.worker_clock(v));
    // lead <= max_clock + 1 and s <= max_clock: no overflow.
    if (lead && c > *lead + *s + 1 + protocol::rejoin_slack) {
      detail = " (worker " + std::to_string(w) + " says hello at clock " + std::to_string(c) +
               "; the connected workers are at clock " + std::to_string(*lead) +
               " or below, and staleness " + std::to_string(*s) + " lets a worker lead by " +
               std::to_string(*s + 1) + " clocks, plus " + std::to_string(protocol::rejoin_slack) +
               " for a rejoin)";
      return errc::bad_clock;
    }
  }
  return {};
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::error_code
server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::may_take_over(
    const Session& old, std::uint64_t incarnation, std::string& detail) const {
  const auto silent = io_->now() - old.heard;
  if (!old.open || incarnation == incarnation_[old.worker] || silent >= opts_.takeover_silence)
    return {};
  detail = " (worker " + std::to_string(old.worker) + " is held by a connection" +
           (old.address.empty() ? std::string() : " at " + old.address) + " heard from " +
           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(silent).count()) +
           " ms ago, another incarnation; the id is taken over once it is closed or silent "
           "for takeover_silence " +
           std::to_string(opts_.takeover_silence.count()) + " ms)";
  return errc::worker_id_in_use;
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint,
                     Io>::undo_untrained_raise(Session& s) {
  if (s.raised_from < 0 || s.trained || core_.clock() > s.raised_from) return;
  log("worker " + std::to_string(s.worker) + "'s clock goes back from " +
      std::to_string(core_.worker_clock(s.worker)) + " to " + std::to_string(s.raised_from) +
      ": the connection whose hello moved it up never trained");
  core_.set_worker_clock(s.worker, s.raised_from);
  s.raised_from = -1;
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::take_over(
    Session& old, Session& next, std::uint64_t incarnation) {
  const std::uint32_t w = old.worker;
  const bool restarted = incarnation != incarnation_[w];
  ++stats_.takeovers;
  const auto from = address(next);
  const auto was = address(old);
  log("worker " + std::to_string(w) + (from ? " at " + *from : " on a new connection") +
      " takes over its id from " + (was ? "the connection at " + *was : "its old connection") +
      (restarted ? " (a new incarnation: the worker restarted)"
                 : " (the same incarnation: its old connection is stale)") +
      "; closing the old connection");
  const std::string reason = make_error_code(errc::duplicate_worker).message() + " (worker " +
                             std::to_string(w) + (from ? ", now at " + *from : "") + ")";
  enqueue(old, protocol::encode(protocol::error{.sender = opts_.shard,
                                                .code = errc::duplicate_worker,
                                                .reason = reason},
                                alloc()));
  close_after_flush(old);
  core_.drop(&old);
  old.pending_pulls = 0;
  undo_untrained_raise(old);
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::optional<std::string>
server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::address(
    const Session& s) const {
  if constexpr (requires { io_->address(s); }) {
    return io_->address(s);
  } else {
    return std::nullopt;
  }
}

}  // namespace asyncps::detail
