// asyncps_sim_bench — many workers and servers on the simulated transport (virtual time), in
// one thread: the unchanged basic_server / basic_worker, a fixed workload, simulated time next
// to the wall time it took (docs/performance.md, "Simulation").
//
//   asyncps_sim_bench [--workers N] [--servers N] [--clocks N] [--policy bsp|ssp|essp|asp]
//                     [--rows N] [--width N] [--seed N] [--quick]
//
// Workload: a quadratic model, loss = |x - x*|^2 / 2n over one table of rows x width floats
// (default 512 x 64 = 32768 parameters, 128 KiB), sharded over the servers. Every worker pulls
// the whole table and pushes its whole gradient each clock. Speed profile 1x,1x,1x,4x repeated
// (every fourth worker is four times slower), 20 ms of compute per gradient at 1x, latency
// 100 us + up to 50 us jitter, 10 Gbit/s per node interface. SSP and ESSP use staleness 3.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/staleness.hpp"

#include "sim_cluster.hpp"

namespace asyncps::bench {
namespace {

struct config {
  std::uint32_t workers = 64;
  std::uint32_t servers = 8;
  std::uint64_t clocks = 200;
  std::uint32_t rows = 512;
  std::uint32_t width = 64;
  std::uint64_t seed = 1;
  std::string policy = "ssp";
};

/// loss = |x - x*|^2 / 2n with x*_i = sin(i); the gradient written is x - x* (the mean loss
/// per parameter is reported).
struct quadratic_model {
  quadratic_model(std::uint32_t rows, std::uint32_t width) : target(std::size_t{rows} * width) {
    spec[0] = table_spec{0, rows, width, 0.0f};
    for (std::size_t i = 0; i < target.size(); ++i)
      target[i] = static_cast<float>(std::sin(static_cast<double>(i)));
  }
  std::span<const table_spec> tables() const { return spec; }
  float compute_gradient(const parameter_view& p, gradient_view& g) {
    const auto x = p.span(0);
    auto out = g.span(0);
    double loss = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      out[i] = x[i] - target[i];
      loss += 0.5 * static_cast<double>(out[i]) * out[i];
    }
    return static_cast<float>(loss / static_cast<double>(x.size()));
  }
  std::array<table_spec, 1> spec{};
  std::vector<float> target;
};

struct outcome {
  double simulated_seconds = 0;         // when the last worker finished
  std::vector<double> done;             // when each worker finished (simulated seconds)
  double fast_wait = 0, slow_wait = 0;  // mean seconds a 1x / 4x worker waited for rows
  double wall_seconds = 0;
  float last_loss = 0;
  int errors = 0;
  staleness_histogram staleness;
  simulation_stats stats;
};

template <class Policy>
outcome run(const config& cfg) {
  simulation_options o;
  o.seed = cfg.seed;
  o.latency.base = std::chrono::microseconds(100);
  o.latency.jitter = std::chrono::microseconds(50);
  o.latency.bytes_per_second = 1.25e9;
  o.compute.base = std::chrono::milliseconds(20);
  for (std::uint32_t w = 0; w < cfg.workers; ++w)
    o.compute.speed_factor.push_back(w % 4 == 3 ? 4.0 : 1.0);

  const auto wall0 = std::chrono::steady_clock::now();
  outcome r;
  {
    simulated_network net(o);
    const float lr = 1.0f / static_cast<float>(cfg.workers);
    std::vector<quadratic_model> models;
    models.reserve(cfg.workers);
    for (std::uint32_t w = 0; w < cfg.workers; ++w) models.emplace_back(cfg.rows, cfg.width);

    sim_cluster<quadratic_model, Policy> cluster(net, cfg.servers, cfg.workers, {models[0].spec[0]},
                                                 lr);
    for (std::uint32_t w = 0; w < cfg.workers; ++w) {
      typename sim_cluster<quadratic_model, Policy>::worker_options_type wo;
      wo.local_step = lr;
      if (w == 0) wo.on_clock = [&](const clock_report& c) { r.last_loss = c.loss; };
      cluster.add_worker(models[w], std::move(wo), cfg.clocks);
    }
    r.simulated_seconds = cluster.run();
    r.errors = cluster.errors();
    r.done.resize(cfg.workers);
    std::uint32_t slow = 0;
    for (std::uint32_t w = 0; w < cfg.workers; ++w) {
      r.done[w] = cluster.done(w);
      r.staleness += cluster.worker(w).staleness();
      (w % 4 == 3 ? r.slow_wait : r.fast_wait) += cluster.worker(w).stats().wait_seconds;
      slow += w % 4 == 3 ? 1 : 0;
    }
    if (slow > 0) r.slow_wait /= slow;
    if (cfg.workers > slow) r.fast_wait /= cfg.workers - slow;
    r.stats = net.stats();
  }
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return r;
}

[[noreturn]] void usage() {
  std::fprintf(stderr, "usage: asyncps_sim_bench [--workers N] [--servers N] [--clocks N]\n"
                       "                         [--policy bsp|ssp|essp|asp] [--rows N] "
                       "[--width N] [--seed N] [--quick]\n");
  std::exit(2);
}

config parse(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto next = [&]() -> std::uint64_t {
      if (i + 1 >= argc) usage();
      return std::strtoull(argv[++i], nullptr, 10);
    };
    if (a == "--workers") {
      c.workers = static_cast<std::uint32_t>(next());
    } else if (a == "--servers") {
      c.servers = static_cast<std::uint32_t>(next());
    } else if (a == "--clocks") {
      c.clocks = next();
    } else if (a == "--rows") {
      c.rows = static_cast<std::uint32_t>(next());
    } else if (a == "--width") {
      c.width = static_cast<std::uint32_t>(next());
    } else if (a == "--seed") {
      c.seed = next();
    } else if (a == "--policy") {
      if (i + 1 >= argc) usage();
      c.policy = argv[++i];
    } else if (a == "--quick") {
      c.workers = 16;
      c.servers = 4;
      c.clocks = 20;
    } else {
      usage();
    }
  }
  if (c.workers == 0 || c.servers == 0 || c.rows < c.servers || c.width == 0) usage();
  return c;
}

int main_impl(int argc, char** argv) {
  const config cfg = parse(argc, argv);
  outcome r;
  if (cfg.policy == "bsp") {
    r = run<consistency::bsp>(cfg);
  } else if (cfg.policy == "ssp") {
    r = run<consistency::ssp<3>>(cfg);
  } else if (cfg.policy == "essp") {
    r = run<consistency::essp<3>>(cfg);
  } else if (cfg.policy == "asp") {
    r = run<consistency::asp>(cfg);
  } else {
    usage();
  }
  std::printf("policy %s, %u workers, %u servers, %llu clocks, %u x %u parameters, seed %llu\n",
              cfg.policy.c_str(), cfg.workers, cfg.servers,
              static_cast<unsigned long long>(cfg.clocks), cfg.rows, cfg.width,
              static_cast<unsigned long long>(cfg.seed));
  std::vector<double> fast, slow;
  for (std::uint32_t w = 0; w < cfg.workers; ++w) (w % 4 == 3 ? slow : fast).push_back(r.done[w]);
  auto range = [](const std::vector<double>& v) {
    if (v.empty()) return std::string("-");
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f..%.3f s", *lo, *hi);
    return std::string(buf);
  };
  std::printf("simulated time   %.3f s (1x workers done at %s, 4x at %s)\n", r.simulated_seconds,
              range(fast).c_str(), range(slow).c_str());
  std::printf("waiting for rows %.3f s per 1x worker, %.3f s per 4x worker (simulated)\n",
              r.fast_wait, r.slow_wait);
  std::printf("wall time        %.3f s (%.1fx faster than simulated)\n", r.wall_seconds,
              r.simulated_seconds / r.wall_seconds);
  std::printf("events           %llu (%.0f per wall second)\n",
              static_cast<unsigned long long>(r.stats.events),
              static_cast<double>(r.stats.events) / r.wall_seconds);
  std::printf("messages         %llu (%.1f MB)\n",
              static_cast<unsigned long long>(r.stats.messages),
              static_cast<double>(r.stats.bytes) / 1e6);
  std::printf("gradients        %llu\n", static_cast<unsigned long long>(r.stats.computations));
  std::printf("staleness        mean %.2f, max %d\n", r.staleness.mean(), r.staleness.max());
  std::printf("worker 0 loss    %.3g (last clock)\n", static_cast<double>(r.last_loss));
  std::printf("errors           %d\n", r.errors);
  return r.errors == 0 ? 0 : 1;
}

}  // namespace
}  // namespace asyncps::bench

int main(int argc, char** argv) {
  try {
    return asyncps::bench::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "asyncps_sim_bench: %s\n", e.what());
    return 1;
  }
}
