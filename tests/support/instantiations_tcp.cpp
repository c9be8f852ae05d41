// asyncps compiled once for the test executables (tests/support/instantiations.hpp):
// asyncps/src.hpp (tcp_transport, the error categories, make_tls_context, server<bsp> and
// server<ssp<>> over TCP) and the other TCP servers the tests share.
#include "asyncps/src.hpp"
#include "instantiations.hpp"

#define ASYNCPS_TEST_DEFINE_SERVER(T, C, R) template class basic_server<T, C, R>;
#define ASYNCPS_TEST_DEFINE_WORKER(T, C, R) template class ASYNCPS_TEST_WORKER_SHELL(T, C, R);
#define ASYNCPS_TEST_DEFINE(T, C, R)                                                               \
  ASYNCPS_TEST_DEFINE_SERVER(T, C, R) ASYNCPS_TEST_DEFINE_WORKER(T, C, R)

namespace asyncps {
ASYNCPS_TEST_SERVERS_TCP(ASYNCPS_TEST_DEFINE)
}  // namespace asyncps
