// Consumer of asyncps under separate compilation: tcp_transport's member functions, and the
// coroutines of server<bsp> and of worker<M, bsp>'s shell, are only declared here
// (ASYNCPS_SEPARATE_COMPILATION: `extern template` in server.hpp and worker.hpp), so this links
// only if they were compiled once elsewhere (asyncps::asyncps_compiled, or src.cpp). One message
// over loopback TCP, then a server and a worker fit a line over it.
#include <asyncps/consistency/policies.hpp>
#include <asyncps/server.hpp>
#include <asyncps/table.hpp>
#include <asyncps/transport/tcp.hpp>
#include <asyncps/worker.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <span>
#include <system_error>
#include <tuple>

#if !defined(ASYNCPS_SEPARATE_COMPILATION) || defined(ASYNCPS_HEADER_ONLY)
#error "this consumer must be compiled with ASYNCPS_SEPARATE_COMPILATION"
#endif

namespace {

// y = 3x + 1 from points on the line (a model with dense reads and gradients: the worker shell
// src.hpp compiles).
struct line_fit {
  std::array<asyncps::table_spec, 1> layout{{{.id = 0, .rows = 1, .width = 2}}};
  std::span<const asyncps::table_spec> tables() const { return layout; }
  float x = 0;
  float compute_gradient(const asyncps::parameter_view& p, asyncps::gradient_view& g) {
    x = x >= 1 ? -1 : x + 0.125f;
    const float error = p.table(0)(0, 0) * x + p.table(0)(0, 1) - (3 * x + 1);
    g.table(0)(0, 0) = error * x;
    g.table(0)(0, 1) = error;
    return error * error / 2;
  }
};

// 0 when a server<bsp> and a worker<line_fit, bsp> fit the line to 1e-3 in 200 clocks.
int train() {
  using policy = asyncps::consistency::bsp;
  line_fit model;
  asio::io_context io;
  asyncps::tcp_transport server_net(io.get_executor()), worker_net(io.get_executor());
  asyncps::server<policy> server(server_net, model, {.num_workers = 1},
                                 asyncps::optimizer::sgd{0.2f});
  auto acceptor = server_net.listen({asio::ip::make_address("127.0.0.1"), 0});
  if (!acceptor) return 4;
  asyncps::worker<line_fit, policy> worker(worker_net, model,
                                           {.servers = {acceptor.value().local_endpoint()}});
  asio::co_spawn(io, server.async_serve(std::move(acceptor.value())), asio::detached);
  std::error_code result = make_error_code(std::errc::interrupted);
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        result = co_await worker.async_run(200);
        server.stop();
      },
      asio::detached);
  io.run();
  const float a = server.values(0)[0], b = server.values(0)[1];
  std::printf("separate compilation consumer: %s, y = %.4f x + %.4f\n",
              result ? result.message().c_str() : "trained", a, b);
  return !result && std::abs(a - 3) < 1e-3f && std::abs(b - 1) < 1e-3f ? 0 : 5;
}

}  // namespace

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
  if (status != 0) return status;
  return train();
}
