// asyncps_scaling — aggregate push+pull throughput and clocks/s against the number of workers
// and of server shards: over TCP loopback on this machine, and on the simulated transport with
// a link model (virtual time), with the unchanged basic_server / basic_worker
// (docs/performance/scaling.md; plots: bench/scaling_plot.py).
//
//   asyncps_scaling [--quick] [--json FILE] [--mode tcp|sim|both] [--seconds S] [--reps N]
//                   [--workers 1,2,4,8] [--shards 1,2,4] [--sim-workers 1,2,4,8,16,32,64]
//                   [--sim-shards 1,2,4,8] [--size BYTES] [--policy ssp|asp] [--staleness S]
//                   [--worker-threads N] [--compute-us US] [--sim-clocks N] [--gbit G]
//                   [--latency-us US]
//
// Workload: one dense table of `size` bytes (rows of 1024 floats, default 1 MiB = 256 rows)
// split over the shards; a synthetic model whose gradient is a fixed buffer copied into the
// worker's pooled gradient buffer (no compute, or `--compute-us` of fixed compute time per
// gradient). Each clock a worker pushes its whole gradient (each shard its slice) and reads
// the whole table, pulling a shard's slice when its consistency policy asks for one: SSP with
// staleness `--staleness` (`ssp<>`, the bound set at run time; default 0, the one bound under
// which every clock pulls the whole table; s >= 1 skips pulls while the cache is fresh enough)
// or ASP (a refresh pull every clock unless the last one is still on its way; without compute
// time its clocks are paced by nothing but the transport's send buffers).
//
// TCP: each shard is a basic_server on its own thread and io_context; the workers run on
// `--worker-threads` io_context threads (default 1, workers dealt round-robin), each worker
// with its own tcp_transport; loopback. A compute time is a sleep on a thread pool of one
// thread per worker (an accelerator: it holds no core). Each (workers, shards) cell is run once
// to calibrate the clock count, then `--reps` times (fresh servers and workers each) for about
// `--seconds` each; the figure is the median. Measured: the steady state, from when every
// worker has completed a tenth of its clocks to when the first worker finishes.
//
// Simulation: the same servers and workers on simulated_network, every node with one
// `--gbit` Gbit/s interface (its outgoing messages transmitted one after the other) and
// `--latency-us` one-way latency, no jitter; compute time from the simulated compute model
// (`--compute-us`, default 0). `--sim-clocks` clocks per worker; figures per simulated
// second, over the same steady-state window. Deterministic: reruns give the same figures.
//
// Figures: GB/s = 1e9 payload bytes per second, pushes (worker to server) plus rows
// (server to worker), summed over workers; clocks/s summed over workers.
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/thread_pool.hpp>
#include <nlohmann/json.hpp>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/tcp.hpp"
#include "asyncps/worker.hpp"

#include "fixed_gradient.hpp"
#include "json_output.hpp"
#include "report.hpp"
#include "sim_cluster.hpp"

namespace asyncps::bench {
namespace {

constexpr std::uint32_t row_width = 1024;  // floats per row: one row = 4 KiB

struct config {
  bool tcp = true;
  bool sim = true;
  std::vector<unsigned> workers{1, 2, 4, 8};
  std::vector<unsigned> shards{1, 2, 4};
  std::vector<unsigned> sim_workers{1, 2, 4, 8, 16, 32, 64};
  std::vector<unsigned> sim_shards{1, 2, 4, 8};
  std::size_t size = std::size_t{1} << 20;  // table bytes
  std::string policy = "ssp";
  clock_value staleness = 0;
  unsigned worker_threads = 1;
  unsigned compute_us = 0;
  double seconds = 1.0;  // per TCP repetition
  unsigned reps = 3;
  std::uint64_t sim_clocks = 40;
  double gbit = 10.0;
  double latency_us = 25.0;
  bool quick = false;
  std::string json;
};

std::string policy_text(const config& cfg) {
  return cfg.policy == "ssp" ? "ssp(" + std::to_string(cfg.staleness) + ")" : cfg.policy;
}

// ---------------------------------------------------------------------------------------------
// Progress of each worker, and the steady-state window
// ---------------------------------------------------------------------------------------------
/// A worker's counters after one clock, at `t` seconds (wall or simulated).
struct progress {
  double t = 0;
  std::uint64_t clocks = 0, bytes_out = 0, bytes_in = 0, pulls = 0;
};

/// One worker and its progress log (one entry per clock, reserved before the run: recording
/// does not allocate).
template <class Worker>
struct traced {
  Worker* worker = nullptr;
  std::vector<progress> log;
};

/// Sets `opts.on_clock` to append `*node.worker`'s counters at `now()` seconds to `node.log`.
template <class Worker, class Now>
void trace(typename Worker::options_type& opts, traced<Worker>& node, std::uint64_t clocks,
           Now now) {
  node.log.reserve(clocks);
  opts.on_clock = [&node, now](const clock_report&) {
    const worker_stats& s = node.worker->stats();
    node.log.push_back(progress{now(), s.clocks, s.bytes_out, s.bytes_in, s.pulls});
  };
}

/// What every worker did in a time window. `pulls` counts pulls of one shard's part.
struct window {
  double seconds = 0;
  double clocks = 0, bytes_out = 0, bytes_in = 0, pulls = 0;
  bool whole_run = false;  // the steady state was empty: the whole run instead
  double gbps() const { return seconds > 0 ? (bytes_out + bytes_in) / seconds / 1e9 : 0.0; }
  double clocks_per_s() const { return seconds > 0 ? clocks / seconds : 0.0; }
};

/// The steady state of a run: what every worker did between the moment all had completed
/// `warm` clocks and the moment the first completed its last. When that is empty (workers
/// that never wait drift apart: ASP without compute time), the whole run from `start` to
/// `end` (the same clock as the log's times) instead.
template <class Worker>
window steady_window(const std::vector<traced<Worker>>& nodes, std::size_t warm, double start,
                     double end) {
  double t0 = -std::numeric_limits<double>::infinity();
  double t1 = std::numeric_limits<double>::infinity();
  for (const auto& n : nodes) {
    if (warm == 0 || n.log.size() <= warm) return {};
    t0 = std::max(t0, n.log[warm - 1].t);
    t1 = std::min(t1, n.log.back().t);
  }
  window w;
  if (!(t1 > t0)) {
    w.whole_run = true;
    w.seconds = end - start;
    for (const auto& n : nodes) {
      const progress& b = n.log.back();
      w.clocks += static_cast<double>(b.clocks);
      w.bytes_out += static_cast<double>(b.bytes_out);
      w.bytes_in += static_cast<double>(b.bytes_in);
      w.pulls += static_cast<double>(b.pulls);
    }
    return w;
  }
  w.seconds = t1 - t0;
  const auto at = [](const std::vector<progress>& log, double t) -> const progress& {
    const auto it = std::upper_bound(log.begin(), log.end(), t,
                                     [](double x, const progress& p) { return x < p.t; });
    return *(it - 1);  // the log's entry `warm - 1` is at or before t0 <= t
  };
  for (const auto& n : nodes) {
    const progress& a = at(n.log, t0);
    const progress& b = at(n.log, t1);
    w.clocks += static_cast<double>(b.clocks - a.clocks);
    w.bytes_out += static_cast<double>(b.bytes_out - a.bytes_out);
    w.bytes_in += static_cast<double>(b.bytes_in - a.bytes_in);
    w.pulls += static_cast<double>(b.pulls - a.pulls);
  }
  return w;
}

std::size_t warm_clocks(std::uint64_t clocks) {
  return static_cast<std::size_t>(std::max<std::uint64_t>(1, clocks / 10));
}

/// One run of one (workers, shards) cell.
struct run_result {
  window win;
  std::uint64_t clocks = 0;  // per worker
  std::string error;         // the first worker error, empty when none
  // TCP: CPU time over the workers' run in cores (CPU seconds per wall second): the process,
  // the worker threads, the server threads, and the busiest single thread.
  double cpu_cores = 0, worker_cores = 0, server_cores = 0;
  double busiest = 0;
  std::string busiest_name;
  // Simulation: simulated seconds until the last worker finished, wall seconds, events.
  double simulated = 0, wall = 0;
  std::uint64_t events = 0;
};

template <class Worker>
void configure(Worker& w, const config& cfg) {
  if constexpr (requires { w.consistency().staleness = clock_value{0}; })
    w.consistency().staleness = cfg.staleness;  // ssp<>: the bound is set at run time
}

table_spec layout(const config& cfg) {
  return table_spec{0, static_cast<std::uint32_t>(cfg.size / (row_width * sizeof(float))),
                    row_width, 0.0f};
}

fixed_gradient model_of(const config& cfg, std::span<const float> gradient, bool sleep) {
  fixed_gradient m;
  m.spec[0] = layout(cfg);
  m.gradient = gradient;
  if (sleep) m.sleep = std::chrono::microseconds(cfg.compute_us);
  return m;
}

// ---------------------------------------------------------------------------------------------
// TCP
// ---------------------------------------------------------------------------------------------
double process_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const auto s = [](const timeval& tv) {
    return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) * 1e-6;
  };
  return s(ru.ru_utime) + s(ru.ru_stime);
}
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <class Policy>
run_result run_tcp(const config& cfg, unsigned num_workers, unsigned num_shards,
                   std::uint64_t clocks, std::span<const float> gradient) {
  using server_t = basic_server<tcp_transport, Policy>;
  using worker_t = basic_worker<fixed_gradient, tcp_transport, Policy>;
  struct server_node {
    asio::io_context ctx{1};
    tcp_transport net{ctx.get_executor()};
    std::optional<server_t> server;
    double cpu = 0;  // thread CPU seconds
  };
  struct worker_thread {
    asio::io_context ctx{1};
    double cpu = 0;
  };
  const float lr = 1e-3f;
  std::vector<std::unique_ptr<server_node>> servers;
  std::vector<tcp_transport::endpoint_type> endpoints;
  for (unsigned s = 0; s < num_shards; ++s) {
    auto& n = *servers.emplace_back(std::make_unique<server_node>());
    server_options so;
    so.shard = s;
    so.num_shards = num_shards;
    so.num_workers = num_workers;
    so.tables = {layout(cfg)};
    so.log = [](std::string_view) {};
    n.server.emplace(n.net, so, optimizer::sgd{lr});
    auto acc = n.net.listen({asio::ip::address_v4::loopback(), 0});
    if (!acc) throw std::runtime_error("listen: " + acc.error().message());
    endpoints.push_back(acc.value().local_endpoint());
    asio::co_spawn(n.ctx, n.server->async_serve(std::move(acc).value()), asio::detached);
  }

  const unsigned num_threads = std::max(1u, std::min(cfg.worker_threads, num_workers));
  std::vector<std::unique_ptr<worker_thread>> threads;
  for (unsigned t = 0; t < num_threads; ++t) threads.push_back(std::make_unique<worker_thread>());
  std::optional<asio::thread_pool> compute;
  if (cfg.compute_us > 0) compute.emplace(num_workers);
  std::vector<std::unique_ptr<tcp_transport>> nets;
  std::vector<fixed_gradient> models(num_workers, model_of(cfg, gradient, true));
  std::vector<std::unique_ptr<worker_t>> workers;
  std::vector<traced<worker_t>> nodes(num_workers);
  std::vector<std::error_code> results(num_workers);
  for (unsigned w = 0; w < num_workers; ++w) {
    auto& ctx = threads[w % num_threads]->ctx;
    nets.push_back(std::make_unique<tcp_transport>(ctx.get_executor()));
    typename worker_t::options_type o;
    o.id = w;
    o.servers = endpoints;
    o.check_gradients = false;
    o.log = [w](std::string_view m) {
      std::fprintf(stderr, "  worker %u: %.*s\n", w, static_cast<int>(m.size()), m.data());
    };
    trace(o, nodes[w], clocks, wall_seconds);
    std::optional<asio::any_io_executor> ex;
    if (compute) ex = compute->get_executor();
    workers.push_back(std::make_unique<worker_t>(*nets.back(), models[w], std::move(o), ex));
    nodes[w].worker = workers.back().get();
    configure(*workers.back(), cfg);
    asio::co_spawn(
        ctx,
        [&, w]() -> asio::awaitable<void> { results[w] = co_await workers[w]->async_run(clocks); },
        asio::detached);
  }

  std::vector<std::thread> server_threads;
  for (auto& n : servers) {
    server_threads.emplace_back([&n = *n] {
      n.ctx.run();
      n.cpu = thread_cpu_seconds();
    });
  }
  const double cpu0 = process_cpu_seconds();
  const double wall0 = wall_seconds();
  std::vector<std::thread> worker_threads;
  for (auto& t : threads) {
    worker_threads.emplace_back([&t = *t] {
      t.ctx.run();
      t.cpu = thread_cpu_seconds();
    });
  }
  for (auto& t : worker_threads) t.join();
  const double wall = wall_seconds() - wall0;
  const double cpu = process_cpu_seconds() - cpu0;
  for (auto& n : servers) asio::post(n->ctx, [&n = *n] { n.server->stop(); });
  for (auto& t : server_threads) t.join();

  run_result r;
  r.clocks = clocks;
  r.win = steady_window(nodes, warm_clocks(clocks), wall0, wall0 + wall);
  for (unsigned w = 0; w < num_workers; ++w) {
    if (results[w] && r.error.empty())
      r.error = "worker " + std::to_string(w) + ": " + results[w].message();
  }
  r.cpu_cores = wall > 0 ? cpu / wall : 0;
  const auto busiest = [&](double c, const std::string& name) {
    if (wall > 0 && c / wall > r.busiest) {
      r.busiest = c / wall;
      r.busiest_name = name;
    }
  };
  for (unsigned t = 0; t < num_threads; ++t) {
    busiest(threads[t]->cpu, num_threads == 1 ? "workers" : "workers " + std::to_string(t));
    r.worker_cores += wall > 0 ? threads[t]->cpu / wall : 0;
  }
  for (unsigned s = 0; s < num_shards; ++s) {
    busiest(servers[s]->cpu, "server " + std::to_string(s));
    r.server_cores += wall > 0 ? servers[s]->cpu / wall : 0;
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// Simulation
// ---------------------------------------------------------------------------------------------
template <class Policy>
run_result run_sim(const config& cfg, unsigned num_workers, unsigned num_shards,
                   std::span<const float> gradient) {
  using cluster_t = sim_cluster<fixed_gradient, Policy>;
  using worker_t = typename cluster_t::worker_type;
  simulation_options o;
  o.seed = 1;
  o.latency.base = std::chrono::nanoseconds(static_cast<std::int64_t>(cfg.latency_us * 1e3));
  o.latency.jitter = std::chrono::nanoseconds(0);
  o.latency.bytes_per_second = cfg.gbit * 1e9 / 8;
  o.compute.base = std::chrono::microseconds(cfg.compute_us);

  const double wall0 = wall_seconds();
  run_result r;
  r.clocks = cfg.sim_clocks;
  {
    simulated_network net(o);
    std::vector<fixed_gradient> models(num_workers, model_of(cfg, gradient, false));
    std::vector<traced<worker_t>> nodes(num_workers);
    cluster_t cluster(net, num_shards, num_workers, {layout(cfg)}, 1e-3f);
    for (unsigned w = 0; w < num_workers; ++w) {
      typename cluster_t::worker_options_type wo;
      wo.check_gradients = false;
      trace(wo, nodes[w], cfg.sim_clocks, [&net] { return cluster_t::seconds(net.now()); });
      nodes[w].worker = &cluster.add_worker(models[w], std::move(wo), cfg.sim_clocks);
      configure(*nodes[w].worker, cfg);
    }
    r.simulated = cluster.run();
    if (cluster.errors() > 0) r.error = std::to_string(cluster.errors()) + " worker(s) failed";
    r.win = steady_window(nodes, warm_clocks(cfg.sim_clocks), 0.0, r.simulated);
    r.events = net.stats().events;
  }
  r.wall = wall_seconds() - wall0;
  return r;
}

// ---------------------------------------------------------------------------------------------
// The grids
// ---------------------------------------------------------------------------------------------
/// One (workers, shards) cell: medians over its repetitions (the simulation runs once).
struct cell {
  unsigned workers = 0, shards = 0;
  summary gbps, clocks_per_s;
  double push_gbps = 0, pull_gbps = 0, pulls_per_clock = 0;
  std::vector<run_result> runs;
  std::string error;
  bool whole_run = false;  // some run's steady state was empty (see steady_window)
};

cell summarize_cell(unsigned w, unsigned s, std::vector<run_result> runs) {
  cell c;
  c.workers = w;
  c.shards = s;
  std::vector<double> gbps, cps, push, pull, ppc;
  for (const auto& r : runs) {
    if (!r.error.empty() && c.error.empty()) c.error = r.error;
    if (r.win.seconds <= 0 && c.error.empty()) c.error = "no clock measured";
    gbps.push_back(r.win.gbps());
    cps.push_back(r.win.clocks_per_s());
    push.push_back(r.win.seconds > 0 ? r.win.bytes_out / r.win.seconds / 1e9 : 0.0);
    pull.push_back(r.win.seconds > 0 ? r.win.bytes_in / r.win.seconds / 1e9 : 0.0);
    // Pulls of the whole table per clock: each pull fetches one shard's part.
    ppc.push_back(r.win.clocks > 0 ? r.win.pulls / r.win.clocks / s : 0.0);
    if (r.win.whole_run) c.whole_run = true;
  }
  c.gbps = summarize(gbps);
  c.clocks_per_s = summarize(cps);
  c.push_gbps = median(push);
  c.pull_gbps = median(pull);
  c.pulls_per_clock = median(ppc);
  c.runs = std::move(runs);
  return c;
}

/// What to say after a cell's line: the whole run was measured, an error.
std::string remarks(const cell& c) {
  std::string s;
  if (c.whole_run) s += "  (whole run: no steady state)";
  if (!c.error.empty()) s += "  ERROR: " + c.error;
  return s;
}

/// CPU seconds the process spent per GB moved (cores / GB/s); 0 when nothing moved.
double core_seconds_per_gb(const run_result& r) {
  return r.win.gbps() > 0 ? r.cpu_cores / r.win.gbps() : 0.0;
}

/// The run whose GB/s is the cell's median (the middle one for an odd count).
const run_result& median_run(const cell& c) {
  const auto gap = [&](const run_result& r) { return std::abs(r.win.gbps() - c.gbps.median); };
  return *std::min_element(
      c.runs.begin(), c.runs.end(),
      [&](const run_result& x, const run_result& y) { return gap(x) < gap(y); });
}

template <class Policy>
std::vector<cell> tcp_grid(const config& cfg, std::span<const float> gradient) {
  std::printf("\nTCP loopback: policy %s, table %s (%u x %u floats), %u us compute, workers on "
              "%u io_context thread(s), each shard on its own, %u x ~%.2f s per cell\n",
              policy_text(cfg).c_str(), size_text(cfg.size).c_str(), layout(cfg).rows, row_width,
              cfg.compute_us, cfg.worker_threads, cfg.reps, cfg.seconds);
  std::printf("%7s %6s %8s %-15s %10s %-17s %6s %6s %6s %5s %5s %5s %6s  %s\n", "workers", "shards",
              "GB/s", "[min..max]", "clocks/s", "[min..max]", "push", "pull", "pulls", "cpu", "wrk",
              "srv", "cs/GB", "busiest thread");
  std::vector<cell> cells;
  for (unsigned s : cfg.shards) {
    for (unsigned w : cfg.workers) {
      // Calibrate: a short run gives the clock rate per worker; size the runs from it.
      const std::uint64_t cal_clocks = cfg.quick ? 8 : 20;
      const run_result cal = run_tcp<Policy>(cfg, w, s, cal_clocks, gradient);
      if (!cal.error.empty())
        std::fprintf(stderr, "asyncps_scaling: tcp %u x %u: %s\n", w, s, cal.error.c_str());
      const double per_worker = cal.win.clocks_per_s() / w;
      auto clocks = static_cast<std::uint64_t>(per_worker * cfg.seconds / 0.9);
      clocks = std::clamp<std::uint64_t>(clocks, 10, 1'000'000);
      std::vector<run_result> runs;
      for (unsigned k = 0; k < cfg.reps; ++k)
        runs.push_back(run_tcp<Policy>(cfg, w, s, clocks, gradient));
      cell c = summarize_cell(w, s, std::move(runs));
      const run_result& mid = median_run(c);
      char gb[40], cl[40];
      std::snprintf(gb, sizeof gb, "[%.2f..%.2f]", c.gbps.min, c.gbps.max);
      std::snprintf(cl, sizeof cl, "[%.0f..%.0f]", c.clocks_per_s.min, c.clocks_per_s.max);
      std::printf("%7u %6u %8.2f %-15s %10.0f %-17s %6.2f %6.2f %6.2f %5.2f %5.2f %5.2f %6.2f  "
                  "%s %.2f%s\n",
                  w, s, c.gbps.median, gb, c.clocks_per_s.median, cl, c.push_gbps, c.pull_gbps,
                  c.pulls_per_clock, mid.cpu_cores, mid.worker_cores, mid.server_cores,
                  core_seconds_per_gb(mid), mid.busiest_name.c_str(), mid.busiest,
                  remarks(c).c_str());
      std::fflush(stdout);
      cells.push_back(std::move(c));
    }
  }
  return cells;
}

template <class Policy>
std::vector<cell> sim_grid(const config& cfg, std::span<const float> gradient) {
  std::printf("\nSimulated: policy %s, table %s, %.3g Gbit/s per node interface, %.3g us "
              "latency, %u us compute, %llu clocks per worker (figures per simulated second)\n",
              policy_text(cfg).c_str(), size_text(cfg.size).c_str(), cfg.gbit, cfg.latency_us,
              cfg.compute_us, static_cast<unsigned long long>(cfg.sim_clocks));
  std::printf("%7s %6s %8s %10s %6s %6s %6s %12s %8s\n", "workers", "shards", "GB/s", "clocks/s",
              "push", "pull", "pulls", "simulated s", "wall s");
  std::vector<cell> cells;
  for (unsigned s : cfg.sim_shards) {
    for (unsigned w : cfg.sim_workers) {
      std::vector<run_result> runs;
      runs.push_back(run_sim<Policy>(cfg, w, s, gradient));
      cell c = summarize_cell(w, s, std::move(runs));
      const run_result& r = c.runs[0];
      std::printf("%7u %6u %8.2f %10.0f %6.2f %6.2f %6.2f %12.4f %8.2f%s\n", w, s, c.gbps.median,
                  c.clocks_per_s.median, c.push_gbps, c.pull_gbps, c.pulls_per_clock, r.simulated,
                  r.wall, remarks(c).c_str());
      std::fflush(stdout);
      cells.push_back(std::move(c));
    }
  }
  return cells;
}

nlohmann::json to_json(const cell& c, bool tcp) {
  nlohmann::json j{{"workers", c.workers},
                   {"shards", c.shards},
                   {"gbps", num(c.gbps.median)},
                   {"gbps_min", num(c.gbps.min)},
                   {"gbps_max", num(c.gbps.max)},
                   {"clocks_per_s", num(c.clocks_per_s.median)},
                   {"clocks_per_s_min", num(c.clocks_per_s.min)},
                   {"clocks_per_s_max", num(c.clocks_per_s.max)},
                   {"push_gbps", num(c.push_gbps)},
                   {"pull_gbps", num(c.pull_gbps)},
                   {"pulls_per_clock", num(c.pulls_per_clock)},
                   {"whole_run", c.whole_run},
                   {"error", c.error}};
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& r : c.runs) {
    nlohmann::json x{{"clocks", r.clocks},
                     {"window_s", num(r.win.seconds)},
                     {"window_clocks", num(r.win.clocks)},
                     {"gbps", num(r.win.gbps())},
                     {"clocks_per_s", num(r.win.clocks_per_s())}};
    if (tcp) {
      x["cpu_cores"] = num(r.cpu_cores);
      x["worker_thread_cores"] = num(r.worker_cores);
      x["server_thread_cores"] = num(r.server_cores);
      x["core_seconds_per_gb"] = num(core_seconds_per_gb(r));
      x["busiest_thread"] = r.busiest_name;
      x["busiest_thread_busy"] = num(r.busiest);
    } else {
      x["simulated_s"] = num(r.simulated);
      x["wall_s"] = num(r.wall);
      x["events"] = r.events;
    }
    runs.push_back(std::move(x));
  }
  j["runs"] = std::move(runs);
  return j;
}

// ---------------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------------
[[noreturn]] void usage(const std::string& msg) {
  std::fprintf(stderr,
               "asyncps_scaling: %s\n"
               "usage: asyncps_scaling [--quick] [--json FILE] [--mode tcp|sim|both]\n"
               "                       [--seconds S] [--reps N] [--workers 1,2,4,8]\n"
               "                       [--shards 1,2,4] [--sim-workers 1,2,4,8,16,32,64]\n"
               "                       [--sim-shards 1,2,4,8] [--size BYTES]\n"
               "                       [--policy ssp|asp] [--staleness S] [--worker-threads N]\n"
               "                       [--compute-us US] [--sim-clocks N] [--gbit G]\n"
               "                       [--latency-us US]\n",
               msg.c_str());
  std::exit(2);
}

std::vector<unsigned> parse_list(const std::string& v, const char* flag) {
  std::vector<unsigned> out;
  for (std::size_t pos = 0; pos <= v.size();) {
    const std::size_t comma = std::min(v.find(',', pos), v.size());
    const std::string item = v.substr(pos, comma - pos);
    char* end = nullptr;
    const unsigned long n = std::strtoul(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || n == 0 || n > 4096)
      usage(std::string(flag) + " takes a comma-separated list of numbers in 1..4096");
    out.push_back(static_cast<unsigned>(n));
    pos = comma + 1;
  }
  return out;
}

config parse(int argc, char** argv) {
  config cfg;
  std::optional<double> seconds;
  std::optional<unsigned> reps;
  std::optional<std::size_t> size;
  std::optional<std::uint64_t> sim_clocks;
  std::optional<std::vector<unsigned>> workers, shards, sim_workers, sim_shards;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value after " + std::string(a));
      return argv[++i];
    };
    const auto number = [&]() -> double {
      const std::string v = value();
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !std::isfinite(d) || d < 0)
        usage(std::string(a) + " takes a non-negative number, not '" + v + "'");
      return d;
    };
    if (a == "--quick") {
      cfg.quick = true;
    } else if (a == "--json") {
      cfg.json = value();
    } else if (a == "--mode") {
      const std::string v = value();
      if (v != "tcp" && v != "sim" && v != "both") usage("--mode takes tcp, sim or both");
      cfg.tcp = v != "sim";
      cfg.sim = v != "tcp";
    } else if (a == "--seconds") {
      seconds = number();
    } else if (a == "--reps") {
      reps = static_cast<unsigned>(number());
    } else if (a == "--workers") {
      workers = parse_list(value(), "--workers");
    } else if (a == "--shards") {
      shards = parse_list(value(), "--shards");
    } else if (a == "--sim-workers") {
      sim_workers = parse_list(value(), "--sim-workers");
    } else if (a == "--sim-shards") {
      sim_shards = parse_list(value(), "--sim-shards");
    } else if (a == "--size") {
      size = static_cast<std::size_t>(number());
    } else if (a == "--policy") {
      cfg.policy = value();
      if (cfg.policy != "ssp" && cfg.policy != "asp") usage("--policy takes ssp or asp");
    } else if (a == "--staleness") {
      cfg.staleness = static_cast<clock_value>(number());
    } else if (a == "--worker-threads") {
      cfg.worker_threads = static_cast<unsigned>(number());
    } else if (a == "--compute-us") {
      cfg.compute_us = static_cast<unsigned>(number());
    } else if (a == "--sim-clocks") {
      sim_clocks = static_cast<std::uint64_t>(number());
    } else if (a == "--gbit") {
      cfg.gbit = number();
    } else if (a == "--latency-us") {
      cfg.latency_us = number();
    } else if (a == "--help" || a == "-h") {
      usage("help");
    } else {
      usage("unknown argument " + std::string(a));
    }
  }
  if (cfg.quick) {  // a smoke test of both modes in a few seconds
    cfg.workers = {1, 2};
    cfg.shards = {1, 2};
    cfg.sim_workers = {1, 4};
    cfg.sim_shards = {1, 2};
    cfg.size = std::size_t{256} << 10;
    cfg.seconds = 0.05;
    cfg.reps = 1;
    cfg.sim_clocks = 10;
  }
  if (seconds) cfg.seconds = *seconds;
  if (reps) cfg.reps = *reps;
  if (size) cfg.size = *size;
  if (sim_clocks) cfg.sim_clocks = *sim_clocks;
  if (workers) cfg.workers = *workers;
  if (shards) cfg.shards = *shards;
  if (sim_workers) cfg.sim_workers = *sim_workers;
  if (sim_shards) cfg.sim_shards = *sim_shards;

  const std::size_t row_bytes = row_width * sizeof(float);
  if (cfg.size == 0 || cfg.size % row_bytes != 0)
    usage("--size must be a positive multiple of 4096 (rows of 1024 floats)");
  unsigned max_shards = 0;
  for (unsigned s : cfg.shards) max_shards = std::max(max_shards, cfg.tcp ? s : 0u);
  for (unsigned s : cfg.sim_shards) max_shards = std::max(max_shards, cfg.sim ? s : 0u);
  if (cfg.size / row_bytes < max_shards)
    usage("--size gives " + std::to_string(cfg.size / row_bytes) + " rows of 4 KiB, fewer than " +
          std::to_string(max_shards) + " shards");
  if (cfg.seconds <= 0 || cfg.reps == 0) usage("--seconds and --reps must be > 0");
  if (cfg.worker_threads == 0) usage("--worker-threads must be >= 1");
  if (cfg.sim_clocks < 2) usage("--sim-clocks must be >= 2");
  if (cfg.gbit <= 0) usage("--gbit must be > 0");
  return cfg;
}

template <class Policy>
int run(const config& cfg) {
  const double wall0 = wall_seconds();
  const double load_before = load_average();
  std::printf("asyncps_scaling: %u hardware threads, load average (1 min) %.2f at start\n",
              std::thread::hardware_concurrency(), load_before);
  std::fflush(stdout);
  // The fixed gradient: small, so that the parameters stay finite however long the run.
  const std::vector<float> gradient(cfg.size / sizeof(float), 1e-6f);
  std::vector<cell> tcp, sim;
  if (cfg.tcp) tcp = tcp_grid<Policy>(cfg, gradient);
  if (cfg.sim) sim = sim_grid<Policy>(cfg, gradient);
  const double load_after = load_average();
  const double elapsed = wall_seconds() - wall0;
  std::printf(
      "\nGB/s = 1e9 payload bytes/s, pushes + rows (push, pull: each part); clocks/s summed over "
      "workers;\npulls = pulls of the whole table per clock. TCP, median run: cpu = process CPU "
      "seconds per wall second\nof the workers' run (cores busy), wrk / srv = of which worker / "
      "server threads; cs/GB = CPU seconds\nper GB moved (cpu / GB/s); busiest thread = its CPU "
      "seconds per wall second\n");
  std::printf("load average (1 min) %.2f at start, %.2f at end; %.0f s in all\n", load_before,
              load_after, elapsed);

  int errors = 0;
  for (const auto* cells : {&tcp, &sim})
    for (const auto& c : *cells) errors += c.error.empty() ? 0 : 1;
  if (!cfg.json.empty()) {
    nlohmann::json j;
    j["meta"] = {{"policy", policy_text(cfg)},
                 {"table_bytes", cfg.size},
                 {"rows", layout(cfg).rows},
                 {"width", row_width},
                 {"worker_threads", cfg.worker_threads},
                 {"compute_us", cfg.compute_us},
                 {"seconds", cfg.seconds},
                 {"reps", cfg.reps},
                 {"sim_clocks", cfg.sim_clocks},
                 {"sim_gbit", cfg.gbit},
                 {"sim_latency_us", cfg.latency_us},
                 {"hardware_threads", std::thread::hardware_concurrency()},
                 {"quick", cfg.quick},
                 {"load_before", num(load_before)},
                 {"load_after", num(load_after)},
                 {"elapsed_s", num(elapsed)}};
    j["tcp"] = nlohmann::json::array();
    for (const auto& c : tcp) j["tcp"].push_back(to_json(c, true));
    j["sim"] = nlohmann::json::array();
    for (const auto& c : sim) j["sim"].push_back(to_json(c, false));
    std::ofstream f(cfg.json);
    f << j.dump(1) << '\n';
    if (!f) {
      std::fprintf(stderr, "asyncps_scaling: cannot write %s\n", cfg.json.c_str());
      return 1;
    }
  }
  if (errors > 0) std::fprintf(stderr, "asyncps_scaling: %d cell(s) had errors\n", errors);
  return errors == 0 ? 0 : 1;
}

}  // namespace
}  // namespace asyncps::bench

int main(int argc, char** argv) {
  try {
    const auto cfg = asyncps::bench::parse(argc, argv);
    if (cfg.policy == "asp") return asyncps::bench::run<asyncps::consistency::asp>(cfg);
    return asyncps::bench::run<asyncps::consistency::ssp<>>(cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "asyncps_scaling: %s\n", e.what());
    return 1;
  }
}
