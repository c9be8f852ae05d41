// Quick start: one parameter server and one worker, talking TCP on loopback in one process,
// fit y = a x + b to points of the line y = 3x + 1.
// Include what you use (docs/build_time.md): each asyncps header compiles alone;
// <asyncps/asyncps.hpp> includes them all, at a cost in compile time.
#include <array>
#include <cmath>
#include <cstdio>
#include <span>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asyncps/consistency/policies.hpp>  // bsp, ssp<N>, essp<N>, asp, vap
#include <asyncps/optimizer/optimizers.hpp>  // sgd, momentum, adagrad, adam
#include <asyncps/server.hpp>                // server<Consistency>: basic_server over TCP
#include <asyncps/table.hpp>                 // table_spec, parameter_view, gradient_view
#include <asyncps/transport/tcp.hpp>         // tcp_transport (its TLS and secret options too)
#include <asyncps/worker.hpp>                // worker<Model, Consistency>, clock_report

struct line_fit {  // a model: a parameter layout and a gradient
  std::array<asyncps::table_spec, 1> layout{{{.id = 0, .rows = 1, .width = 2}}};  // (a, b)
  std::span<const asyncps::table_spec> tables() const { return layout; }
  float x = 0;  // the next sample: x sweeps [-1, 1]
  float compute_gradient(const asyncps::parameter_view& p, asyncps::gradient_view& g) {
    x = x >= 1 ? -1 : x + 0.125f;
    const float error = p.table(0)(0, 0) * x + p.table(0)(0, 1) - (3 * x + 1);
    g.table(0)(0, 0) = error * x;  // d(error^2 / 2) / da
    g.table(0)(0, 1) = error;      // d(error^2 / 2) / db
    return error * error / 2;      // the loss, reported to on_clock
  }
};

int main() {
  using policy = asyncps::consistency::bsp;  // or ssp<3>, essp<3>, asp, vap
  const asyncps::optimizer::sgd sgd{0.2f};   // the server applies w -= 0.2 * gradient
  line_fit model;
  asio::io_context io;  // one thread runs both nodes
  asyncps::tcp_transport server_net(io.get_executor()), worker_net(io.get_executor());
  asyncps::server<policy> server(server_net, model, {.num_workers = 1}, sgd);  // layout: model's
  auto acceptor = server_net.listen({asio::ip::make_address("127.0.0.1"), 0}).value();
  asyncps::worker<line_fit, policy> worker(
      worker_net, model,
      {.servers = {acceptor.local_endpoint()},  // shard 0's address
       .on_clock = [](const asyncps::clock_report& r) {
         if (r.clock % 40 == 0) std::printf("clock %3ld: loss %.2e\n", long(r.clock), r.loss);
       }});

  asio::co_spawn(io, server.async_serve(std::move(acceptor)), asio::detached);  // until stop()
  std::error_code result;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        result = co_await worker.async_run(200);  // 200 clocks of pull -> gradient -> push
        server.stop();                            // then async_serve completes
      },
      asio::detached);
  io.run();  // returns when both have finished

  const float a = server.values(0)[0], b = server.values(0)[1];
  std::printf("%s: y = %.4f x + %.4f\n", result ? result.message().c_str() : "trained", a, b);
  return !result && std::abs(a - 3) < 1e-3f && std::abs(b - 1) < 1e-3f ? 0 : 1;
}
