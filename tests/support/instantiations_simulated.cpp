// The simulated servers the test executables share, compiled once
// (tests/support/instantiations.hpp).
#include "instantiations.hpp"

#define ASYNCPS_TEST_DEFINE_SERVER(T, C, R) template class basic_server<T, C, R>;

namespace asyncps {
ASYNCPS_TEST_SERVERS_SIMULATED(ASYNCPS_TEST_DEFINE_SERVER)
}  // namespace asyncps
