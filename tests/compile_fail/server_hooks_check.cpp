// Compile-fail cases for asyncps::check_server_part / asyncps::checked_server_part
// (recovery.hpp, "Server hooks"): each ASYNCPS_CASE_* macro makes one hook of an otherwise
// valid recovery server part wrong (a misspelt name, or a right name with another signature);
// the ctest test compiling it passes when the compiler prints the checker's message for that
// hook. Registered in tests/CMakeLists.txt; never built by `all`.
#include <cstdint>
#include <span>
#include <string>
#include <system_error>

#include "asyncps/recovery.hpp"
#if defined(ASYNCPS_CASE_THROUGH_SERVER)
#include "asyncps/consistency/policies.hpp"
#include "asyncps/recovery/none.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/in_process.hpp"
#endif

namespace {

using asyncps::clock_value;
using asyncps::frame_header;
using asyncps::table_id;
using asyncps::detail::session_base;

// A stand-in for the server context: the checker only looks at the hooks' declarations.
struct test_context {};

struct wrong_part {
  // Hooks every case declares correctly: the checker must not complain about them.
  template <class Ctx>
  bool on_push(Ctx, session_base&, const frame_header&) {
    return false;
  }
  template <class Ctx>
  void on_start(Ctx&) {}
  bool serves_workers() const { return true; }

#if defined(ASYNCPS_CASE_MISSPELT_ON_CLOCK) || defined(ASYNCPS_CASE_CHECKED_PART_PARAMETER) ||     \
    defined(ASYNCPS_CASE_THROUGH_SERVER)
  void on_clocks(clock_value) {}  // never called: the hook is on_clock
#else
  void on_clock(clock_value) {}
#endif

#if defined(ASYNCPS_CASE_MISSPELT_WELCOME_FLAGS)
  template <class Ctx>
  std::uint8_t welcome_flag(Ctx, const frame_header&) {
    return 0;
  }
#endif

#if defined(ASYNCPS_CASE_ON_UPDATE_WRONG_PARAMETERS)
  void on_update(table_id, std::span<const float>) {}  // first_row and rows are missing
#else
  void on_update(table_id, std::uint64_t, std::uint32_t, std::span<const float>) {}
#endif

#if defined(ASYNCPS_CASE_ON_HELLO_WRONG_RETURN)
  template <class Ctx>
  bool on_hello(Ctx, const frame_header&, std::string&) {  // must return std::error_code
    return true;
  }
#endif

#if defined(ASYNCPS_CASE_ON_TIMER_WRONG_PARAMETERS)
  template <class Ctx>
  void on_timer(Ctx) {}  // the timer's id is missing
#elif defined(ASYNCPS_CASE_MISSPELT_ON_TIMER)
  template <class Ctx>
  void on_timers(Ctx, std::uint32_t) {}  // never called: the hook is on_timer
#else
  template <class Ctx>
  void on_timer(Ctx, std::uint32_t) {}
#endif

#if defined(ASYNCPS_CASE_RECOVERING_NOT_CONST)
  bool recovering() { return false; }  // must be const
#endif
};

#if defined(ASYNCPS_CASE_THROUGH_SERVER)
// A policy with the wrong part, as a user would write it: the server's constructor checks it.
struct wrong_policy {
  static constexpr std::string_view name = "wrong";
  using server_part = wrong_part;
  using worker_part = asyncps::recovery::none::worker_part;
};
[[maybe_unused]] void serve(asyncps::in_process_transport& t) {
  asyncps::basic_server<asyncps::in_process_transport, asyncps::consistency::ssp<1>, wrong_policy>
      s(t, asyncps::server_options{});
}
#elif defined(ASYNCPS_CASE_CHECKED_PART_PARAMETER)
// As a library class template would use it (`template <checked_server_part<Ctx> P, ...>`).
template <class P>
  requires asyncps::checked_server_part<P, test_context>
struct uses_part {};
[[maybe_unused]] uses_part<wrong_part> instance;
#else
static_assert(asyncps::check_server_part<wrong_part, test_context>());
#endif

}  // namespace
