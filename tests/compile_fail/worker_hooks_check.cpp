// Compile-fail cases for asyncps::check_worker_part (recovery/worker_hooks.hpp, docs/concepts/
// recovery.md "Worker hooks"): each ASYNCPS_CASE_* macro declares one hook of an otherwise valid
// recovery worker part with another signature than the worker calls it with; the ctest test
// compiling it passes when the compiler prints the checker's message for that hook (without the
// check, the worker would silently call the default instead). Registered in tests/CMakeLists.txt;
// never built by `all`.
#include <chrono>
#include <cstdint>
#include <system_error>

#include "asyncps/recovery.hpp"
#include "asyncps/recovery/worker_hooks.hpp"

namespace {

using asyncps::errc;
using asyncps::recovery_action;
using asyncps::refusal_action;

struct wrong_worker_part {
  // What every worker part has, and hooks every case declares correctly: the checker must not
  // complain about them.
  recovery_action on_server_lost(std::error_code) const noexcept {
    return recovery_action::reconnect;
  }
  std::chrono::milliseconds reconnect_timeout() const noexcept {
    return std::chrono::milliseconds(100);
  }
  bool has_pending(std::uint32_t, bool) const noexcept { return false; }

#if defined(ASYNCPS_CASE_ON_REFUSED_WRONG_RETURN)
  // returns bool, not refusal_action
  bool on_refused(std::uint32_t, std::error_code) const noexcept { return true; }
#elif defined(ASYNCPS_CASE_ON_REFUSED_WRONG_PARAMETERS)
  // no shard parameter
  refusal_action on_refused(std::error_code) const noexcept { return refusal_action::fail; }
#elif defined(ASYNCPS_CASE_ON_REFUSED_OLD_CODE_TYPE)
  // the hook of wire version 4: an errc cannot hold a policy's own code
  refusal_action on_refused(std::uint32_t, errc) const noexcept { return refusal_action::fail; }
#else
  refusal_action on_refused(std::uint32_t, std::error_code) const noexcept {
    return refusal_action::fail;
  }
#endif

#if defined(ASYNCPS_CASE_ON_ACK_WRONG_RETURN)
  void on_ack(std::uint32_t, std::uint64_t) {}  // must return bool (wake the clock loop)
#else
  bool on_ack(std::uint32_t, std::uint64_t) { return true; }
#endif
};

static_assert(asyncps::check_worker_part<wrong_worker_part>());

}  // namespace
