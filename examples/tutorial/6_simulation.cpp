// Step 6: the same server and worker code on a simulated network with a virtual clock.
//
// `simulated_network` runs every node on one thread and never sleeps: message delivery takes
// the latency model's time, a gradient takes the compute model's time (here 10 ms, plus up to
// 200% random jitter per gradient), and everything is drawn from one seed, so a run is
// reproducible. We train 4 workers with BSP and with SSP(3) on the same schedule of compute
// times and compare the simulated time each takes: with BSP every clock waits for that
// clock's slowest worker, SSP(3) lets a fast worker run up to 3 clocks ahead.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asyncps/asyncps.hpp>
#include <asyncps/transport/simulated.hpp>

#include "linear_regression.hpp"

using tutorial::linear_regression;

struct outcome {
  double seconds = 0;  // simulated time until every worker finished
  float error = 0;     // |w - w_true| on the server
  bool ok = false;
};

template <class Policy>
outcome train(std::uint32_t workers, std::uint64_t clocks) {
  asyncps::simulation_options sim{.seed = 7};
  sim.latency.base = std::chrono::microseconds(100);  // one-way message delay
  sim.compute.base = std::chrono::milliseconds(10);   // one gradient
  sim.compute.jitter = 2.0;                           // + [0, 200%) per gradient
  asyncps::simulated_network net(sim);                // owns the one io_context
  const asyncps::optimizer::sgd sgd{0.05f};
  const auto quiet = [](std::string_view) {};

  using server_type = asyncps::basic_server<asyncps::simulated_transport, Policy>;
  using worker_type =
      asyncps::basic_worker<linear_regression, asyncps::simulated_transport, Policy>;
  asyncps::simulated_transport server_net(net, "server");  // node names
  server_type server(
      server_net, {.num_workers = workers, .tables = {linear_regression::layout[0]}, .log = quiet},
      sgd);
  asio::co_spawn(net.get_executor(), server.async_serve(server_net.listen("shard0").value()),
                 asio::detached);

  std::vector<linear_regression> models;
  std::vector<std::unique_ptr<asyncps::simulated_transport>> nets;
  std::vector<std::unique_ptr<worker_type>> nodes;
  std::uint32_t failed = 0;
  for (std::uint32_t w = 0; w < workers; ++w) models.emplace_back(w + 1);
  for (std::uint32_t w = 0; w < workers; ++w) {
    nets.push_back(
        std::make_unique<asyncps::simulated_transport>(net, "worker" + std::to_string(w)));
    // The compute executor is what makes a gradient take simulated time.
    nodes.push_back(std::make_unique<worker_type>(
        *nets.back(), models[w],
        typename worker_type::options_type{
            .id = w, .servers = {"shard0"}, .local_step = sgd.local_step(), .log = quiet},
        asio::any_io_executor(net.compute_executor(w))));
    asio::co_spawn(
        net.get_executor(),
        [&, w]() -> asio::awaitable<void> {
          if (co_await nodes[w]->async_run(clocks)) ++failed;
        },
        asio::detached);
  }
  net.run();  // until every worker is done (nothing else left to happen)
  outcome out;
  out.seconds = std::chrono::duration<double>(net.now().time_since_epoch()).count();
  asio::post(net.get_executor(), [&] { server.stop(); });
  net.run();  // lets async_serve finish
  out.error = linear_regression::error(server.values(0));
  out.ok = failed == 0 && out.error < 0.02f;
  return out;
}

int main() {
  const auto bsp = train<asyncps::consistency::bsp>(4, 300);
  std::printf("bsp:    300 clocks in %.3f simulated s, |w - w_true| = %.6f\n", bsp.seconds,
              bsp.error);
  const auto ssp = train<asyncps::consistency::ssp<3>>(4, 300);
  std::printf("ssp(3): 300 clocks in %.3f simulated s, |w - w_true| = %.6f\n", ssp.seconds,
              ssp.error);
  std::printf("ssp(3) took %.0f%% of bsp's time\n", 100.0 * ssp.seconds / bsp.seconds);
  const bool ok = bsp.ok && ssp.ok;
  std::puts(ok ? "both converged" : "FAILED");
  return ok ? 0 : 1;
}
