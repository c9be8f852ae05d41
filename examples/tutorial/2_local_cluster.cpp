// Step 2: a whole cluster in one process. `asyncps::local_cluster` starts 2 server shards and
// 4 workers (each node on its own thread, over the in-process transport), runs every worker
// for the same number of clocks, stops the servers and returns their parameters.
//
// Each worker trains the tutorial's linear regression on its own data (linear_regression.hpp)
// under SSP(2): a worker may read parameters that miss up to 2 clocks of the others' updates.
#include <cstdio>
#include <mutex>

#include <asyncps/local_cluster.hpp>

#include "linear_regression.hpp"

int main() {
  using tutorial::linear_regression;
  std::mutex print;  // on_clock runs on each worker's own thread
  asyncps::local_cluster_options opts{
      .servers = 2, .workers = 4, .on_clock = [&](const asyncps::clock_report& r) {
        if (r.worker == 0 && r.clock % 50 == 0) {
          std::lock_guard lock(print);
          std::printf("worker 0, clock %3ld: minibatch loss %.6f\n", long(r.clock), r.loss);
        }
      }};
  // One model per worker, made from its id (here: the seed of its data).
  auto make_model = [](std::uint32_t worker) { return linear_regression(worker + 1); };

  asyncps::local_cluster<linear_regression, asyncps::consistency::ssp<2>> cluster(
      opts, make_model, asyncps::optimizer::sgd{0.05f});
  const auto report = cluster.run(300);  // clocks per worker; blocks until all are done

  if (!report.ok()) {
    std::printf("FAILED: %s\n", report.failure.c_str());  // e.g. "worker 2: server lost"
    return 1;
  }
  const float error = linear_regression::error(report.tables[0]);
  for (std::size_t id = 0; id < report.workers.size(); ++id) {
    const auto& w = report.workers[id];  // clocks:reads at that staleness
    std::printf("worker %zu: %ld clocks, %.3f s waiting, staleness %s\n", id, long(w.clock),
                w.stats.wait_seconds, w.staleness.to_string().c_str());
  }
  std::printf("|w - w_true| = %.6f after %ld server clocks\n", error,
              long(report.servers[0].clock));
  std::puts(error < 0.02f ? "converged" : "FAILED: did not converge");
  return error < 0.02f ? 0 : 1;
}
