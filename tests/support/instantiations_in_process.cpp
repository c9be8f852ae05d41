// The in-process servers the test executables share, compiled once
// (tests/support/instantiations.hpp).
#include "instantiations.hpp"

#define ASYNCPS_TEST_DEFINE_SERVER(T, C, R) template class basic_server<T, C, R>;
#define ASYNCPS_TEST_DEFINE_WORKER(T, C, R) template class ASYNCPS_TEST_WORKER_SHELL(T, C, R);
#define ASYNCPS_TEST_DEFINE(T, C, R)                                                               \
  ASYNCPS_TEST_DEFINE_SERVER(T, C, R) ASYNCPS_TEST_DEFINE_WORKER(T, C, R)

namespace asyncps {
ASYNCPS_TEST_SERVERS_IN_PROCESS(ASYNCPS_TEST_DEFINE)
}  // namespace asyncps
