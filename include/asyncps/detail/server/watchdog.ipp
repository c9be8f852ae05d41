// asyncps — detail::server_protocol, the watchdog's reports: whether it has something to watch, the
// counts of workers connected, seen and trained, the workers not connected yet, and the worker
// holding the server clock back while a pull waits.
//
// Out-of-line definitions of members declared in asyncps/detail/server/protocol.hpp. Not a header
// to include on its own: protocol.hpp includes it at its end, after the class it defines
// members of (so this file does not include protocol.hpp back).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include "asyncps/detail/server/hooks.hpp"
#include "asyncps/protocol.hpp"

namespace asyncps::detail {

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
bool server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::watchdog_has_work(
    bool& watch_connect, std::uint64_t& deferred_seen) {
  if constexpr (has_serves_workers<part_type>) {
    watch_connect = watch_connect && part_.serves_workers();  // e.g. a chain's head
  }
  const bool any_worker = std::any_of(registered_.begin(), registered_.end(),
                                      [](const Session* p) { return p != nullptr; });
  const bool watch_pulls =
      !core_.pending().empty() || (any_worker && stats_.deferred_pulls != deferred_seen);
  deferred_seen = stats_.deferred_pulls;
  watchdog_idle = !(watch_connect || watch_pulls);
  return !watchdog_idle;
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::uint32_t
server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::workers_connected()
    const noexcept {
  return static_cast<std::uint32_t>(std::count_if(registered_.begin(), registered_.end(),
                                                  [](const Session* p) { return p != nullptr; }));
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::uint32_t
server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::workers_seen()
    const noexcept {
  return static_cast<std::uint32_t>(
      std::count(connected_once_.begin(), connected_once_.end(), char{1}));
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::uint32_t
server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::workers_trained()
    const noexcept {
  return static_cast<std::uint32_t>(
      std::count(trained_once_.begin(), trained_once_.end(), char{1}));
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
bool server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint,
                     Io>::some_never_connected() const {
  if (membership_.elastic()) return false;  // ids are a capacity: absent ones are normal
  return std::any_of(connected_once_.begin(), connected_once_.end(), [](char c) { return c == 0; });
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
bool server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint,
                     Io>::report_unconnected() {
  std::string missing;
  std::uint32_t connected = 0;
  for (std::uint32_t w = 0; w < opts_.num_workers; ++w) {
    if (worker_session(w) != nullptr) {
      ++connected;
    } else {
      missing += (missing.empty() ? "" : ", ") + std::to_string(w);
    }
  }
  if (missing.empty()) return false;
  log("waiting for worker" + std::string(opts_.num_workers - connected > 1 ? "s " : " ") + missing +
      " to connect (" + std::to_string(connected) + " of " + std::to_string(opts_.num_workers) +
      " connected)");
  return true;
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::report_blocked(
    std::chrono::milliseconds every) {
  const typename core_type::pending_type* oldest = nullptr;
  for (const auto& p : core_.pending())
    if (p.reader->open) {
      oldest = &p;
      break;
    }
  if (oldest == nullptr) return;
  const auto waited = io_->now() - oldest->since;
  if (waited < every) return;
  const auto& clocks = core_.worker_clocks();
  const std::uint32_t slowest = core_.slowest_member();
  if (slowest >= clocks.size()) return;  // elastic, no member: nothing holds the clock
  const bool connected = worker_session(slowest) != nullptr;
  log("a pull of " + who(*oldest->reader) + " has waited " +
      std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()) +
      " ms for server clock " + std::to_string(oldest->request.header.clock) + " (server clock " +
      std::to_string(core_.clock()) + "): worker " + std::to_string(slowest) +
      " holds it back at clock " + std::to_string(clocks[slowest]) +
      (connected ? " (connected)" : " (not connected)"));
  for (auto& s : sessions_) {
    if (!s.open || !s.is_worker() || s.pending_pulls == 0) continue;
    enqueue(s, protocol::encode(protocol::report{.shard = opts_.shard,
                                                 .server_clock = core_.clock(),
                                                 .slowest = slowest,
                                                 .slowest_clock = clocks[slowest],
                                                 .slowest_connected = connected},
                                alloc()));
  }
}

}  // namespace asyncps::detail
