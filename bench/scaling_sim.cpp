// asyncps_scaling_sim — the Fashion-MNIST trainer's models (examples/fashion_mnist) with many
// workers on the simulated transport (virtual time), to extend docs/results/scaling.md past
// the cores of one machine: the unchanged basic_server / basic_worker, 4 server shards, W
// workers each training on its 1/W of the 60,000 images, every gradient computed for real but
// taking its share of `--compute-ms` of virtual time (the measured time of 64 samples), SSP with a
// run-time bound (0: BSP), or ASP (`--consistency asp`: reads never wait, every read refreshes
// the cache in the background). Each connection direction's send buffer
// (`--send-buffer BYTES`, simulation_options::send_buffer_bytes; default 4 MiB, 0: unbounded)
// paces a sender that produces bytes faster than the link model carries them; unbounded, ASP
// with 16 and 64 workers of the MLP at 1 ms per 64 samples ran out of memory
// (docs/results/scaling/sim/asp_defaults.log). `--rules default` takes
// the trainer's defaults for each worker count (its update rule, batch and learning rate:
// examples/fashion_mnist/config.hpp). Deterministic: the same arguments give the same figures. One
// JSON object per run to stdout and to
// `--out`: workers, rule, bound, final test accuracy and loss of the servers' model, virtual
// seconds, clocks per worker, the send buffer, the sends that waited for room in it, the most
// bytes one connection direction held (sent, not yet received), the rows messages (pull
// replies) all workers received, and the clocks that waited on the push window
// (`--push-window N`, worker_options::push_window; unset: the trainer's default for the worker
// count with `--rules default`, else the library's, 2 under ASP).
//
//   asyncps_scaling_sim [--model mlp|softmax|cnn] [--epochs E] [--workers 1,16,64]
//       [--rules default,sum,staleness-aware,mean] [--consistency ssp|asp] [--staleness S]
//       [--compute-ms MS] [--send-buffer BYTES] [--push-window N] [--lr X]
//       [--batch B] [--seed N] [--data DIR] [--out FILE.jsonl]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/transport/simulated.hpp"
#include "asyncps/update_rule.hpp"
#include "bench/sim_cluster.hpp"
#include "examples/fashion_mnist/any_model.hpp"
#include "examples/fashion_mnist/config.hpp"

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

using opt_t =
    asyncps::optimizer::with_update_rule<asyncps::optimizer::sgd, asyncps::update_rule::selectable>;

// Trains `models` for `clocks` clocks each on 4 (rc.servers) shards under `Consistency` (the
// run-time SSP bound rc.staleness for ssp<>), then copies the servers' parameters into
// `params`. Returns the virtual seconds; `errors` gets the workers' failures.
template <class Consistency>
double run_cluster(asyncps::simulated_network& net, const fashion::config& rc,
                   const std::vector<asyncps::table_spec>& layout, const opt_t& opt,
                   std::vector<fashion::any_model>& models, std::uint64_t clocks,
                   std::vector<float>& params, int& errors, std::uint64_t& rows_messages,
                   std::optional<std::uint32_t> push_window, std::uint64_t& window_waits) {
  using namespace asyncps;
  bench::sim_cluster<fashion::any_model, Consistency, opt_t> cluster(net, rc.servers, rc.workers,
                                                                     layout, opt);
  for (std::uint32_t w = 0; w < rc.workers; ++w) {
    typename decltype(cluster)::worker_options_type wo;
    wo.local_step = opt.local_step() * opt.rule.scale({.worker = w, .workers = rc.workers});
    wo.push_window = push_window;
    auto& worker = cluster.add_worker(models[w], wo, clocks);
    if constexpr (requires { worker.consistency().staleness = rc.staleness; })
      worker.consistency().staleness = rc.staleness;
  }
  const double seconds = cluster.run();
  for (std::uint32_t s = 0; s < rc.servers; ++s) cluster.server(s).copy_values_into(params);
  errors = cluster.errors();
  rows_messages = 0;
  window_waits = 0;
  for (std::uint32_t w = 0; w < rc.workers; ++w) {
    rows_messages += cluster.worker(w).stats().rows_messages;
    window_waits += cluster.worker(w).stats().window_waits;
  }
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace asyncps;
  fashion::config c;
  c.model = "mlp";
  c.servers = 4;
  std::string workers_list = "1,16,64", rules_list = "sum,staleness-aware,mean", out_path;
  std::string consistency_name = "ssp";
  double compute_ms = 1.0;
  std::size_t send_buffer = simulation_options{}.send_buffer_bytes;
  std::optional<std::uint32_t> push_window;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "asyncps_scaling_sim: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model")
      c.model = next();
    else if (a == "--epochs")
      c.epochs = std::stod(next());
    else if (a == "--workers")
      workers_list = next();
    else if (a == "--rules")
      rules_list = next();
    else if (a == "--consistency") {
      consistency_name = next();
      if (consistency_name != "ssp" && consistency_name != "asp") {
        std::cerr << "asyncps_scaling_sim: --consistency must be ssp or asp\n";
        return 2;
      }
    } else if (a == "--staleness")
      c.staleness = std::stoll(next());
    else if (a == "--compute-ms")
      compute_ms = std::stod(next());
    else if (a == "--send-buffer")
      send_buffer = static_cast<std::size_t>(std::stoull(next()));
    else if (a == "--push-window")
      push_window = static_cast<std::uint32_t>(std::stoul(next()));
    else if (a == "--lr")
      c.lr = std::stof(next());
    else if (a == "--batch")
      c.batch = static_cast<std::uint32_t>(std::stoul(next()));
    else if (a == "--seed")
      c.seed = std::stoull(next());
    else if (a == "--data")
      c.data = next();
    else if (a == "--out")
      out_path = next();
    else {
      std::cerr << "asyncps_scaling_sim: unknown argument " << a << " (see the file's header)\n";
      return 2;
    }
  }
  std::ofstream out;
  if (!out_path.empty()) out.open(out_path, std::ios::app);

  for (const auto& ws : split(workers_list)) {
    for (const auto& rule : split(rules_list)) {
      fashion::config rc = c;
      rc.consistency = consistency_name;
      rc.workers = static_cast<std::uint32_t>(std::stoul(ws));
      rc.update_rule = rule == "default" ? "" : rule;  // "default": the trainer's
      fashion::apply_defaults(rc);
      // --push-window, else the trainer's default for this worker count (apply_defaults),
      // else the library's.
      std::optional<std::uint32_t> window = push_window;
      if (!window && rc.push_window >= 0) window = static_cast<std::uint32_t>(rc.push_window);
      fashion::dataset train, test;
      std::vector<table_spec> layout;
      if (!fashion::load_data(rc, train, test, layout)) return 2;
      const opt_t opt{optimizer::sgd{rc.lr}, fashion::update_rule_of(rc)};
      simulation_options so;
      so.seed = rc.seed;
      // --compute-ms is the time of 64 samples; a minibatch of `batch` takes its share.
      so.compute.base =
          std::chrono::microseconds(static_cast<std::int64_t>(compute_ms * 1000 * rc.batch / 64));
      so.compute.jitter = 0.2;
      so.send_buffer_bytes = send_buffer;
      simulated_network net(so);
      std::vector<fashion::any_model> models;
      models.reserve(rc.workers);
      for (std::uint32_t w = 0; w < rc.workers; ++w) models.emplace_back(rc, train, w, rc.workers);
      const auto clocks = static_cast<std::uint64_t>(
          rc.epochs * static_cast<double>(train.file_size() / rc.workers) / rc.batch);
      std::vector<float> params(layout_size(layout));
      int errors = 0;
      std::uint64_t rows_messages = 0, window_waits = 0;
      const double seconds =
          consistency_name == "asp"
              ? run_cluster<consistency::asp>(net, rc, layout, opt, models, clocks, params, errors,
                                              rows_messages, window, window_waits)
              : run_cluster<consistency::ssp<>>(net, rc, layout, opt, models, clocks, params,
                                                errors, rows_messages, window, window_waits);
      const auto e = models.front().evaluate(parameter_view(layout, params.data()), test);
      const nlohmann::json j{
          {"model", rc.model},
          {"workers", rc.workers},
          {"rule", rc.update_rule},
          {"consistency", consistency_name},
          {"staleness", consistency_name == "asp" ? -1 : rc.staleness},
          {"lr", rc.lr},
          {"batch", rc.batch},
          {"epochs", rc.epochs},
          {"clocks", clocks},
          {"compute_ms", compute_ms},
          {"worker_errors", errors},
          {"virtual_s", seconds},
          {"test_accuracy", e.accuracy},
          {"test_loss", e.loss},
          {"send_buffer_bytes", send_buffer},
          {"send_waits", net.stats().send_waits},
          {"max_queued_bytes", net.stats().max_queued_bytes},
          {"rows_messages", rows_messages},
          {"push_window", window ? nlohmann::json(*window) : nlohmann::json("default")},
          {"window_waits", window_waits}};
      std::cout << j.dump() << std::endl;
      if (out) out << j.dump() << '\n';
    }
  }
  return 0;
}
