// asyncps — detail::accept_backoff: what every accept loop of the library (the shard server's,
// and detail::serve_sessions of the chain master and the rendezvous) does when an accept
// fails. A transient failure (out of descriptors or memory, a connection that died in the
// backlog) pauses the loop, 1 ms at first and twice as long after each further failure up to
// 1 s, and the loop accepts again; an accept that succeeds resets the pause. The failure is
// logged rate-limited (detail::log_limiter). Only another error, or the owner's stop, ends the
// loop: a descriptor flood never ends a service. An allocation failure (`std::bad_alloc`,
// `std::length_error`) while accepting is one more transient failure (`accept_no_memory_error`),
// and `despite_no_memory` keeps a log line that cannot be allocated from ending a cleanup.
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>

#include "asyncps/detail/log_limiter.hpp"
#include "asyncps/error.hpp"

namespace asyncps::detail {

/// The pause of an accept loop after transient accept failures (see the file comment).
/// Thread safety: none; the loop's own state.
class accept_backoff {
 public:
  static constexpr std::chrono::milliseconds first_pause{1};       ///< after one failure
  static constexpr std::chrono::milliseconds longest_pause{1000};  ///< the doubling's cap

  /// Whether an accept that failed with `ec` may succeed when tried again: the process or the
  /// system is out of descriptors (EMFILE, ENFILE) or memory (ENOBUFS, ENOMEM), the call was
  /// interrupted or would block (EINTR, EAGAIN), or the pending connection itself failed
  /// before it was taken (ECONNABORTED, EPROTO, EPERM, and the network errors Linux passes on
  /// from accept: ENETDOWN, ENETUNREACH, EHOSTDOWN, EHOSTUNREACH, ENONET, ENOPROTOOPT,
  /// EOPNOTSUPP). Compared by number in any category `posix_errc` reads (Asio reports these
  /// in its own "asio.system" category). Complexity: O(1). Thread safety: pure.
  static bool transient(const std::error_code& ec) noexcept {
    const auto e = posix_errc(ec);
    if (!e) return false;
    const int v = static_cast<int>(*e);
    if (v == EAGAIN || v == EWOULDBLOCK) return true;
    static constexpr int codes[] = {
        EMFILE, ENFILE,   ENOBUFS,     ENOMEM,    ECONNABORTED, EINTR,       EPROTO,
        EPERM,  ENETDOWN, ENETUNREACH, EHOSTDOWN, EHOSTUNREACH, ENOPROTOOPT, EOPNOTSUPP,
#ifdef ENONET
        ENONET,
#endif
    };
    return std::find(std::begin(codes), std::end(codes), v) != std::end(codes);
  }

  /// Records a transient failure; returns how long to pause before the next accept (1 ms,
  /// doubling with each failure in a row up to `longest_pause`).
  std::chrono::milliseconds failed() noexcept {
    const auto pause = next_;
    next_ = std::min(next_ * 2, longest_pause);
    ++failures_;
    return pause;
  }
  /// An accept succeeded: the next failure pauses `first_pause` again.
  void succeeded() noexcept { next_ = first_pause; }
  /// Transient failures since construction.
  std::uint64_t failures() const noexcept { return failures_; }

 private:
  std::chrono::milliseconds next_ = first_pause;
  std::uint64_t failures_ = 0;
};

/// The error code an accept loop reports for an allocation failure (`std::bad_alloc`,
/// `std::length_error`) while accepting or starting a session: `std::errc::not_enough_memory`
/// (ENOMEM, "Cannot allocate memory"), which `accept_backoff::transient` retries.
inline std::error_code accept_no_memory_error() noexcept {
  return std::make_error_code(std::errc::not_enough_memory);
}

/// Calls `f()` and drops an allocation failure in it (`std::bad_alloc`, `std::length_error`):
/// for a log line written while handling memory exhaustion, which may be lost but must not
/// stop the caller's cleanup (closing and finishing a session). Other exceptions pass.
template <class F>
void despite_no_memory(F&& f) {
  try {
    f();
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {}
}

/// Logs the transient accept failure `ec` ("accept failed (REASON); retrying in N ms", the
/// loop pausing `pause`) through `log` (called with a `const std::string&`), unless `limiter`
/// holds it back (kind `log_kind::failed_accept`, no peer: an accept has none).
template <class TimePoint, class Log>
void log_accept_failure(log_limiter<TimePoint>& limiter, TimePoint now, const std::error_code& ec,
                        std::chrono::milliseconds pause, Log&& log) {
  if (!limiter.admit(log_kind::failed_accept, {}, now, log)) return;
  const std::string line =
      "accept failed (" + ec.message() + "); retrying in " + std::to_string(pause.count()) + " ms";
  log(line);
}

}  // namespace asyncps::detail
