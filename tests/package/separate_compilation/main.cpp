// Consumer of asyncps under separate compilation: tcp_transport's member functions are only
// declared here (ASYNCPS_SEPARATE_COMPILATION), so this links only if they were compiled once
// elsewhere (asyncps::asyncps_compiled, or src.cpp). One message over loopback TCP.
#include <asyncps/transport/tcp.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include <cstdio>
#include <system_error>
#include <tuple>

#if !defined(ASYNCPS_SEPARATE_COMPILATION) || defined(ASYNCPS_HEADER_ONLY)
#error "this consumer must be compiled with ASYNCPS_SEPARATE_COMPILATION"
#endif

int main() {
  asio::io_context io;
  asyncps::tcp_transport server(io.get_executor()), client(io.get_executor());
  auto acc = server.listen({asio::ip::make_address("127.0.0.1"), 0});
  if (!acc) return 1;
  int status = 2;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        auto [ec, out] = co_await client.async_connect(acc.value().local_endpoint());
        auto [aec, in] = co_await acc.value().async_accept();
        if (ec || aec) co_return;
        asyncps::message m;
        m.header.type = asyncps::message_type::heartbeat;
        m.header.seq = 42;
        if (co_await out.async_send(std::move(m))) co_return;
        auto [rec, got] = co_await in.async_receive();
        status = !rec && got.header.seq == 42 ? 0 : 3;
      },
      asio::detached);
  io.run();
  std::printf("separate compilation consumer: %s\n", status == 0 ? "ok" : "failed");
  return status;
}
