// asyncps — detail::server_protocol, the server's log lines: the line prefix, the per-host rate
// limit of refusals, the accept loop's failures, and how a session is named.
//
// Out-of-line definitions of members declared in asyncps/detail/server/protocol.hpp. Not a header
// to include on its own: protocol.hpp includes it at its end, after the class it defines
// members of (so this file does not include protocol.hpp back).
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <system_error>

#include "asyncps/detail/accept_retry.hpp"
#include "asyncps/detail/log_limiter.hpp"
#include "asyncps/detail/server/hooks.hpp"
#include "asyncps/log.hpp"

namespace asyncps::detail {

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::log(
    const std::string& line) const {
  std::string who = "asyncps server " + std::to_string(opts_.shard);
  if constexpr (has_log_suffix<part_type>) who += part_.log_suffix();
  emit(opts_.log, who + ": " + line);
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
bool server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::log_allowed(
    std::string_view kind, std::string_view address) {
  return limiter_.admit(kind, host_of(address), io_->now(),
                        [this](const std::string& line) { log(line); });
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
void server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::log_accept_failure(
    std::error_code ec, std::chrono::milliseconds pause) {
  detail::log_accept_failure(limiter_, io_->now(), ec, pause,
                             [this](const std::string& line) { log(line); });
}

template <class Consistency, class Recovery, class Optimizer, class Session, class TimePoint,
          class Io>
std::string server_protocol<Consistency, Recovery, Optimizer, Session, TimePoint, Io>::who(
    const Session& s) const {
  std::string name;
  if (s.is_worker()) {
    name = "worker " + std::to_string(s.worker);
  } else if (s.is_reader()) {
    name = "reader";
  } else if (s.is_peer()) {
    name = "peer";
    if constexpr (has_peer_name<part_type>) name = part_.peer_name(s);
  } else {
    name = "unidentified peer";
  }
  if (!s.address.empty()) name += " " + s.address;
  return name;
}

}  // namespace asyncps::detail
