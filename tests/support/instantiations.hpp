// Test support: the server configurations that several test translation units share, and their
// worker shells, compiled once (docs/build_time.md, "CI time"). The test executables are built with
// ASYNCPS_SEPARATE_COMPILATION and link asyncps_test_compiled (tests/CMakeLists.txt), whose
// translation units (tests/support/instantiations_*.cpp) compile asyncps/src.hpp and define the
// instantiations declared `extern template` below; a test TU then generates none of their
// out-of-line members (the servers' coroutines above all) and links the one copy instead.
// Nothing here changes what a test runs: the same templates, with the same definitions
// (tests/CMakeLists.txt gives the library and the tests the same macros), compiled elsewhere.
// The header-only route stays tested by the examples, the tutorials, header_self_containment
// and the package tests.
//
// tests/CMakeLists.txt includes this header first (-include) in every test file that includes
// asyncps/server.hpp, local_cluster.hpp or group.hpp; each group is declared only when its
// translation unit is part of the build (ASYNCPS_TEST_COMPILED_<GROUP>, set by
// tests/CMakeLists.txt).
#pragma once

#include "asyncps/consistency/policies.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/recovery/none.hpp"
#include "asyncps/server.hpp"
#include "asyncps/worker.hpp"

#if defined(ASYNCPS_TEST_COMPILED_IN_PROCESS)
#include "asyncps/transport/in_process.hpp"
#endif
#if defined(ASYNCPS_TEST_COMPILED_SIMULATED)
#include "asyncps/recovery/stateless.hpp"
#include "asyncps/transport/simulated.hpp"
#endif

// The configurations, as X(transport, consistency, recovery): those that two or more test TUs
// instantiated (from the weak symbols of the dev build's objects; docs/build_time.md).
// server<bsp> and server<ssp<>> over TCP are asyncps/src.hpp's own (server.hpp declares them).
#define ASYNCPS_TEST_SERVERS_TCP(X)                                                                \
  X(tcp_transport, consistency::ssp<1>, recovery::none)                                            \
  X(tcp_transport, consistency::asp, recovery::none)
#define ASYNCPS_TEST_SERVERS_IN_PROCESS(X)                                                         \
  X(in_process_transport, consistency::bsp, recovery::none)                                        \
  X(in_process_transport, consistency::ssp<1>, recovery::none)                                     \
  X(in_process_transport, consistency::ssp<3>, recovery::none)                                     \
  X(in_process_transport, consistency::asp, recovery::none)
#define ASYNCPS_TEST_SERVERS_SIMULATED(X)                                                          \
  X(simulated_transport, consistency::bsp, recovery::none)                                         \
  X(simulated_transport, consistency::ssp<2>, recovery::none)                                      \
  X(simulated_transport, consistency::asp, recovery::none)                                         \
  X(simulated_transport, consistency::vap, recovery::none)                                         \
  X(simulated_transport, consistency::bsp, recovery::stateless)

#define ASYNCPS_TEST_EXTERN_SERVER(T, C, R) extern template class basic_server<T, C, R>;
// The worker shells of the same configurations, for models with dense reads and gradients and a
// plain compute_gradient (test::counter_model and most test models; detail/worker/model_ref.hpp).
#define ASYNCPS_TEST_WORKER_SHELL(T, C, R)                                                         \
  detail::worker_shell<detail::model_ref<false, false, false>, T, C, R>
#define ASYNCPS_TEST_EXTERN_WORKER(T, C, R)                                                        \
  extern template class ASYNCPS_TEST_WORKER_SHELL(T, C, R);
#define ASYNCPS_TEST_EXTERN(T, C, R)                                                               \
  ASYNCPS_TEST_EXTERN_SERVER(T, C, R) ASYNCPS_TEST_EXTERN_WORKER(T, C, R)

namespace asyncps {
#if defined(ASYNCPS_TEST_COMPILED_TCP)
ASYNCPS_TEST_SERVERS_TCP(ASYNCPS_TEST_EXTERN)
#endif
#if defined(ASYNCPS_TEST_COMPILED_IN_PROCESS)
ASYNCPS_TEST_SERVERS_IN_PROCESS(ASYNCPS_TEST_EXTERN)
#endif
#if defined(ASYNCPS_TEST_COMPILED_SIMULATED)
ASYNCPS_TEST_SERVERS_SIMULATED(ASYNCPS_TEST_EXTERN)
#endif
}  // namespace asyncps
