// asyncps_end_to_end — what the parameter server adds to a training step: the Fashion-MNIST MLP
// of examples/fashion_mnist trained for the same number of steps in one process without a
// parameter server, and by 1 server shard + N workers over the in-process transport and over
// TCP on loopback (docs/performance.md, "End-to-end overhead").
//
//   asyncps_end_to_end [--quick] [--steps N] [--warmup N] [--reps N] [--workers 1,2,4]
//                      [--modes single,in-process,tcp] [--consistency bsp,asp] [--staleness S]
//                      [--servers S] [--batch B] [--threads per-node|single|pool]
//                      [--spin-us N] [--cpu LIST] [--data DIR] [--json FILE] [--check]
//
// Modes (same model, initial values, optimizer, learning rate, minibatch size and steps):
//   single      one thread, no parameter server: draw a minibatch, forward + backward
//               (`fashion::mlp_model::compute_gradient`), `optimizer::sgd::apply` on the
//               parameters in place. It starts from the servers' initial values
//               (`asyncps::initial_values`) and draws worker 0-of-1's minibatches, so it
//               computes exactly what one worker computes per step.
//   in-process  `local_cluster` over `in_process_transport`: every server shard and every worker
//               on its own io_context and thread; a worker computes its gradient on its thread.
//   tcp         the same over `tcp_transport` on 127.0.0.1.
// `--threads` places the nodes of both (`local_cluster_options::threads`: `per-node`, the
// default, is `one_per_node`; `single` runs every node and gradient on one thread; `pool` on
// the machine's cores); `--spin-us N` makes each node thread poll N us before it sleeps
// (`local_cluster_options::spin`; default 0).
// Consistency: `bsp` (ssp<> with bound 0), `ssp` (ssp<> with --staleness, the trainer's
// default 3), `asp`. Each worker trains its own shard of the training set (as the trainer's).
//
// Per run: the time of each clock of each worker (between the ends of successive clocks, from
// `worker_options::on_clock`) after `warmup` clocks; over all workers and repetitions, its
// median and 90th percentile, the median's ratio to `single`'s, the steps per second of all
// workers together, and the mean time per clock in `compute_gradient` and waiting for rows
// (`worker_stats`; single: compute only, over every clock). Then the minibatch loss of the last
// tenth of the steps, and the final parameters' loss and accuracy on (a subset of) the training and
// the test set. With one worker the run is compared with `single` step by step: "same as single"
// says whether every minibatch loss and every final parameter is bit-identical. Repetitions
// interleave the modes (single, then each PS configuration, then again), so slow drift of the
// machine's load affects them alike. The 1-minute load average is printed at the start and the end.
//
// --check: exit 1 unless every run completed and every 1-worker BSP run is bit-identical to
// `single` (ctest's end_to_end_smoke runs `--quick --check`).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <sched.h>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/local_cluster.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/table.hpp"
#include "asyncps/transport/in_process.hpp"
#include "asyncps/transport/tcp.hpp"
#include "bench/json_output.hpp"
#include "examples/fashion_mnist/config.hpp"
#include "examples/fashion_mnist/dataset.hpp"
#include "examples/fashion_mnist/models.hpp"

namespace {

using bench_clock = std::chrono::steady_clock;
using asyncps::bench::num;

struct options {
  std::uint32_t steps = 500;
  std::uint32_t warmup = 0;  // 0: steps / 10
  unsigned reps = 3;
  std::vector<unsigned> workers{1, 2, 4};
  std::vector<std::string> modes{"single", "in-process", "tcp"};
  std::vector<std::string> consistency{"bsp", "asp"};
  int staleness = 3;
  std::uint32_t servers = 1;
  std::uint32_t batch = 0;  // 0: the trainer's default
  asyncps::cluster_threads threads = asyncps::cluster_threads::one_per_node;
  std::string threads_name = "per-node";
  unsigned spin_us = 0;
  std::vector<int> cpus;
  std::string data = fashion::default_data_dir().string();
  std::string json;
  bool quick = false;
  bool check = false;
  std::size_t train_size = 0;  // 0: all 60,000
  std::size_t eval_size = 10000;
};

// What one run measured.
struct run_result {
  bool ok = true;
  std::string failure;
  std::vector<double> step_s;  // post-warm-up clock times, every worker
  double steps_per_s = 0;      // all workers together, post-warm-up
  std::vector<float> losses;   // worker 0's minibatch losses, one per step
  double tail_loss = 0;        // mean minibatch loss of the last tenth of the steps, all workers
  double compute_s = 0;        // mean time in compute_gradient per clock (every clock)
  double wait_s = 0;           // mean time waiting for rows per clock (worker_stats)
  // Per clock of one worker (worker_stats): messages and payload bytes.
  double pulls = 0, pushes = 0, bytes_in = 0, bytes_out = 0;
  std::vector<float> params;  // final parameters, table-major
};

// One row of the report: a configuration, over its repetitions.
struct row {
  std::string mode;
  std::string consistency;  // "-" for single
  unsigned workers = 1;
  std::vector<double> step_s;
  std::vector<double> steps_per_s;  // per repetition
  std::vector<double> tail_loss;
  std::vector<double> compute_s, wait_s;                      // per repetition
  double pulls = 0, pushes = 0, bytes_in = 0, bytes_out = 0;  // of the last repetition
  std::vector<float> losses;                                  // of the last repetition
  std::vector<float> params;
  bool ok = true;
  std::string failure;
  // Filled by finish():
  double median_ms = 0, p90_ms = 0, mean_ms = 0, ratio = 0;
  double overhead_us = 0;  // median_ms - single's, in microseconds
  fashion::evaluation train_eval{}, test_eval{};
  int same_as_single = -1;  // -1: not compared (workers != 1 or no single run)
  std::size_t identical_losses = 0;
  double max_param_diff = 0;
};

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto i = static_cast<std::size_t>(pos);
  const double f = pos - static_cast<double>(i);
  return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

row make_row(std::string mode, std::string consistency, unsigned workers) {
  row r;
  r.mode = std::move(mode);
  r.consistency = std::move(consistency);
  r.workers = workers;
  return r;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string one;
  in >> one;
  return in ? one : std::string("?");
}

// The training setup every mode shares.
struct setup {
  const options& opt;
  fashion::config cfg;  // the trainer's settings (apply_defaults)
  fashion::dataset train, train_eval, test;
  std::uint32_t warmup = 0;
};

fashion::mlp_model make_model(const setup& su, std::uint32_t worker, std::uint32_t workers) {
  return fashion::mlp_model(su.train, worker, workers, su.cfg.batch, su.cfg.seed, su.cfg.l2,
                            su.cfg.hidden);
}

// Post-warm-up clock times and throughput from `stamps[w][k]`, the end of worker w's k-th clock
// (stamps[w][0]: before the first).
void timing(const setup& su, const std::vector<std::vector<bench_clock::time_point>>& stamps,
            run_result& r) {
  const std::uint32_t steps = su.opt.steps, w0 = su.warmup;
  auto first = bench_clock::time_point::max(), last = bench_clock::time_point::min();
  for (const auto& s : stamps) {
    for (std::uint32_t k = w0 + 1; k <= steps; ++k)
      r.step_s.push_back(std::chrono::duration<double>(s[k] - s[k - 1]).count());
    first = std::min(first, s[w0]);
    last = std::max(last, s[steps]);
  }
  const double span = std::chrono::duration<double>(last - first).count();
  r.steps_per_s =
      span > 0 ? static_cast<double>(stamps.size()) * static_cast<double>(steps - w0) / span : 0;
}

double tail_mean(const std::vector<std::vector<float>>& losses, std::uint32_t steps) {
  const std::uint32_t tail = std::max<std::uint32_t>(1, steps / 10);
  double s = 0;
  for (const auto& l : losses)
    for (std::uint32_t k = steps - tail; k < steps; ++k) s += l[k];
  return s / static_cast<double>(tail * losses.size());
}

// single: the plain training loop, no parameter server.
run_result run_single(const setup& su) {
  const std::uint32_t steps = su.opt.steps;
  auto model = make_model(su, 0, 1);
  const std::vector<asyncps::table_spec> layout(model.tables().begin(), model.tables().end());
  std::vector<float> params(asyncps::layout_size(layout)), grad(params.size());
  for (asyncps::table_id t = 0; t < layout.size(); ++t)
    asyncps::initial_values(
        layout[t], asyncps::key_range{0, layout[t].rows}, su.cfg.seed,
        std::span<float>(params.data() + asyncps::table_offset(layout, t), layout[t].size()));
  const asyncps::optimizer::sgd sgd{su.cfg.lr};
  const asyncps::parameter_view pv(layout, params.data());
  asyncps::gradient_view gv(layout, grad.data());
  std::vector<std::vector<bench_clock::time_point>> stamps(
      1, std::vector<bench_clock::time_point>(steps + 1));
  std::vector<std::vector<float>> losses(1, std::vector<float>(steps));
  double compute = 0;
  stamps[0][0] = bench_clock::now();
  for (std::uint32_t k = 0; k < steps; ++k) {
    losses[0][k] = model.compute_gradient(pv, gv);
    compute += std::chrono::duration<double>(bench_clock::now() - stamps[0][k]).count();
    for (asyncps::table_id t = 0; t < layout.size(); ++t) {
      const auto off = asyncps::table_offset(layout, t);
      sgd.apply(std::span<float>(params.data() + off, layout[t].size()),
                std::span<const float>(grad.data() + off, layout[t].size()),
                asyncps::optimizer_state<0>{}, k + 1);
    }
    stamps[0][k + 1] = bench_clock::now();
  }
  run_result r;
  timing(su, stamps, r);
  r.tail_loss = tail_mean(losses, steps);
  r.compute_s = compute / steps;
  r.losses = std::move(losses[0]);
  r.params = std::move(params);
  return r;
}

// in-process / tcp: 1+ server shards and `workers` workers in this process (local_cluster).
template <class Consistency, class Transport>
run_result run_cluster(const setup& su, unsigned workers, int staleness) {
  const std::uint32_t steps = su.opt.steps;
  std::vector<std::vector<bench_clock::time_point>> stamps(
      workers, std::vector<bench_clock::time_point>(steps + 1));
  std::vector<std::vector<float>> losses(workers, std::vector<float>(steps));
  asyncps::local_cluster_options o;
  o.servers = su.opt.servers;
  o.workers = workers;
  o.seed = su.cfg.seed;
  o.threads = su.opt.threads;
  o.spin = std::chrono::microseconds(su.opt.spin_us);
  // Each worker writes only its own vectors, on its own thread.
  o.on_clock = [&](const asyncps::clock_report& r) {
    const auto k = static_cast<std::size_t>(r.clock);
    if (r.worker >= workers || k >= steps) return;
    stamps[r.worker][k + 1] = bench_clock::now();
    losses[r.worker][k] = r.loss;
  };
  using cluster_t = asyncps::local_cluster<fashion::mlp_model, Consistency, asyncps::recovery::none,
                                           asyncps::optimizer::sgd, Transport>;
  cluster_t cluster(
      o, [&](std::uint32_t w) { return make_model(su, w, workers); },
      asyncps::optimizer::sgd{su.cfg.lr});
  if constexpr (std::is_same_v<Consistency, asyncps::consistency::ssp<>>) {
    cluster.set_worker_setup([staleness](std::uint32_t, typename cluster_t::worker_type& w) {
      w.consistency().staleness = staleness;
    });
  }
  // stamps[w][0]: the clocks start once every node is up; the first clock (connecting) is in
  // the warm-up, which is at least 1 clock.
  const auto start = bench_clock::now();
  for (auto& s : stamps) s[0] = start;
  auto report = cluster.run(steps);
  run_result r;
  if (!report.ok()) {
    r.ok = false;
    r.failure = report.failure;
    return r;
  }
  timing(su, stamps, r);
  r.tail_loss = tail_mean(losses, steps);
  for (const auto& w : report.workers) {
    r.compute_s += w.stats.compute_seconds;
    r.wait_s += w.stats.wait_seconds;
    r.pulls += static_cast<double>(w.stats.pulls);
    r.pushes += static_cast<double>(w.stats.pushes);
    r.bytes_in += static_cast<double>(w.stats.bytes_in);
    r.bytes_out += static_cast<double>(w.stats.bytes_out);
  }
  const double clocks = static_cast<double>(workers) * steps;
  for (double* x : {&r.compute_s, &r.wait_s, &r.pulls, &r.pushes, &r.bytes_in, &r.bytes_out})
    *x /= clocks;
  r.losses = std::move(losses[0]);
  for (const auto& t : report.tables) r.params.insert(r.params.end(), t.begin(), t.end());
  return r;
}

run_result run_one(const setup& su, const std::string& mode, const std::string& consistency,
                   unsigned workers) {
  using namespace asyncps::consistency;
  const bool tcp = mode == "tcp";
  if (consistency == "asp")
    return tcp ? run_cluster<asp, asyncps::tcp_transport>(su, workers, 0)
               : run_cluster<asp, asyncps::in_process_transport>(su, workers, 0);
  const int s = consistency == "bsp" ? 0 : su.opt.staleness;
  return tcp ? run_cluster<ssp<>, asyncps::tcp_transport>(su, workers, s)
             : run_cluster<ssp<>, asyncps::in_process_transport>(su, workers, s);
}

void add(row& rw, run_result&& r) {
  if (!r.ok) {
    rw.ok = false;
    if (rw.failure.empty()) rw.failure = r.failure;
    return;
  }
  rw.step_s.insert(rw.step_s.end(), r.step_s.begin(), r.step_s.end());
  rw.steps_per_s.push_back(r.steps_per_s);
  rw.tail_loss.push_back(r.tail_loss);
  rw.compute_s.push_back(r.compute_s);
  rw.wait_s.push_back(r.wait_s);
  rw.pulls = r.pulls;
  rw.pushes = r.pushes;
  rw.bytes_in = r.bytes_in;
  rw.bytes_out = r.bytes_out;
  rw.losses = std::move(r.losses);
  rw.params = std::move(r.params);
}

void finish(const setup& su, std::vector<row>& rows) {
  const row* single = nullptr;
  for (const auto& r : rows)
    if (r.mode == "single" && r.ok) single = &r;
  const auto layout_model = make_model(su, 0, 1);
  const auto layout = layout_model.tables();
  for (auto& r : rows) {
    if (!r.ok) continue;
    r.median_ms = 1e3 * quantile(r.step_s, 0.5);
    r.p90_ms = 1e3 * quantile(r.step_s, 0.9);
    r.mean_ms = 1e3 * mean(r.step_s);
    if (single != nullptr && single->median_ms > 0) {
      r.ratio = r.median_ms / single->median_ms;
      r.overhead_us = 1e3 * (r.median_ms - single->median_ms);
    }
    const asyncps::parameter_view p(layout, r.params.data());
    r.train_eval = fashion::mlp_model::evaluate(p, su.train_eval);
    r.test_eval = fashion::mlp_model::evaluate(p, su.test);
    if (single != nullptr && r.workers == 1 && &r != single) {
      for (std::size_t k = 0; k < r.losses.size(); ++k)
        r.identical_losses += std::memcmp(&r.losses[k], &single->losses[k], sizeof(float)) == 0;
      for (std::size_t i = 0; i < r.params.size(); ++i)
        r.max_param_diff = std::max(
            r.max_param_diff, static_cast<double>(std::fabs(r.params[i] - single->params[i])));
      r.same_as_single =
          r.identical_losses == r.losses.size() &&
          std::memcmp(r.params.data(), single->params.data(), r.params.size() * sizeof(float)) == 0;
    }
  }
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t b = 0;
  while (b <= s.size()) {
    const auto e = std::min(s.find(',', b), s.size());
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

// "0,1" or "0-3" or a mix.
std::vector<int> parse_cpus(const std::string& s) {
  std::vector<int> out;
  for (const auto& part : split(s)) {
    const auto dash = part.find('-');
    const int lo = std::stoi(part.substr(0, dash));
    const int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
    if (lo < 0 || hi < lo || hi >= CPU_SETSIZE)
      throw std::invalid_argument("bad CPU range " + part);
    for (int c = lo; c <= hi; ++c) out.push_back(c);
  }
  return out;
}

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "asyncps_end_to_end: %s\nusage: asyncps_end_to_end [--quick] [--steps N] "
               "[--warmup N] [--reps N] [--workers 1,2,4] [--modes single,in-process,tcp] "
               "[--consistency bsp,ssp,asp] [--staleness S] [--servers S] [--batch B] "
               "[--threads per-node|single|pool] [--spin-us N] [--cpu LIST] [--data DIR] "
               "[--json FILE] [--check]\n",
               msg);
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  bool steps_set = false, reps_set = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage((std::string(a) + " needs a value").c_str());
      return argv[++i];
    };
    auto number = [&]() -> unsigned long {
      const std::string v = value();
      char* end = nullptr;
      const unsigned long n = std::strtoul(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0') usage((std::string(a) + ": not a number: " + v).c_str());
      return n;
    };
    if (a == "--quick") {
      o.quick = true;
    } else if (a == "--check") {
      o.check = true;
    } else if (a == "--steps") {
      o.steps = static_cast<std::uint32_t>(number());
      steps_set = true;
    } else if (a == "--warmup") {
      o.warmup = static_cast<std::uint32_t>(number());
    } else if (a == "--reps") {
      o.reps = static_cast<unsigned>(number());
      reps_set = true;
    } else if (a == "--staleness") {
      o.staleness = static_cast<int>(number());
    } else if (a == "--servers") {
      o.servers = static_cast<std::uint32_t>(number());
    } else if (a == "--batch") {
      o.batch = static_cast<std::uint32_t>(number());
    } else if (a == "--workers") {
      o.workers.clear();
      for (const auto& w : split(value())) {
        const int n = std::atoi(w.c_str());
        if (n < 1 || n > 64) usage(("--workers: " + w + " not in 1..64").c_str());
        o.workers.push_back(static_cast<unsigned>(n));
      }
    } else if (a == "--modes") {
      o.modes = split(value());
      for (const auto& m : o.modes)
        if (m != "single" && m != "in-process" && m != "tcp")
          usage(("--modes: " + m + " not in {single,in-process,tcp}").c_str());
    } else if (a == "--consistency") {
      o.consistency = split(value());
      for (const auto& c : o.consistency)
        if (c != "bsp" && c != "ssp" && c != "asp")
          usage(("--consistency: " + c + " not in {bsp,ssp,asp}").c_str());
    } else if (a == "--threads") {
      o.threads_name = value();
      if (o.threads_name == "per-node")
        o.threads = asyncps::cluster_threads::one_per_node;
      else if (o.threads_name == "single")
        o.threads = asyncps::cluster_threads::single;
      else if (o.threads_name == "pool")
        o.threads = asyncps::cluster_threads::pool;
      else
        usage(("--threads: " + o.threads_name + " not in {per-node,single,pool}").c_str());
    } else if (a == "--spin-us") {
      o.spin_us = static_cast<unsigned>(number());
      if (o.spin_us > 1000000) usage("--spin-us must be <= 1000000");
    } else if (a == "--cpu") {
      try {
        o.cpus = parse_cpus(value());
      } catch (const std::exception& e) {
        usage((std::string("--cpu: ") + e.what()).c_str());
      }
    } else if (a == "--data") {
      o.data = value();
    } else if (a == "--json") {
      o.json = value();
    } else {
      usage(("unknown option " + std::string(a)).c_str());
    }
  }
  if (o.quick) {
    // Seconds, not minutes: a small part of the data, few steps, one repetition.
    if (!steps_set) o.steps = 30;
    if (!reps_set) o.reps = 1;
    o.train_size = 6000;
    o.eval_size = 1000;
  }
  if (o.steps < 2) usage("--steps must be >= 2");
  if (o.reps < 1) usage("--reps must be >= 1");
  if (o.servers < 1) usage("--servers must be >= 1");
  if (o.warmup >= o.steps) usage("--warmup must be < --steps");
  return o;
}

fashion::dataset first_rows(const fashion::dataset& d, std::size_t n) {
  n = std::min(n, d.size());
  fashion::dataset out;
  out.images = d.images.topRows(static_cast<Eigen::Index>(n));
  out.labels.assign(d.labels.begin(), d.labels.begin() + static_cast<std::ptrdiff_t>(n));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const options opt = parse(argc, argv);
  if (!opt.cpus.empty()) {
    // Pins this thread before any other starts: every node thread inherits the set.
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : opt.cpus) CPU_SET(c, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
      std::perror("asyncps_end_to_end: --cpu: sched_setaffinity");
      return 2;
    }
  }
  const std::string load_start = loadavg();

  setup su{opt, {}, {}, {}, {}, 0};
  su.cfg.model = "mlp";
  su.cfg.optimizer = "sgd";
  if (opt.batch != 0) su.cfg.batch = opt.batch;
  fashion::apply_defaults(su.cfg);
  su.cfg.decay_at = -1;  // a fixed number of steps: no learning-rate schedule
  su.warmup = opt.warmup != 0 ? opt.warmup : std::max<std::uint32_t>(1, opt.steps / 10);

  auto loaded = fashion::load_fashion_mnist(opt.data);
  if (!loaded) {
    std::fprintf(stderr,
                 "asyncps_end_to_end: %s (apt-get install dataset-fashion-mnist, or --data)\n",
                 loaded.error().message.c_str());
    return 2;
  }
  auto& [full_train, full_test] = loaded.value();
  su.train = opt.train_size != 0 ? first_rows(full_train, opt.train_size) : std::move(full_train);
  su.train_eval = first_rows(su.train, opt.eval_size);
  su.test = first_rows(full_test, opt.eval_size);
  for (unsigned w : opt.workers)
    if (su.train.size() / w < su.cfg.batch) {
      std::fprintf(stderr, "asyncps_end_to_end: %u workers: shards smaller than a batch\n", w);
      return 2;
    }

#ifdef NDEBUG
  const bool ndebug = true;
#else
  const bool ndebug = false;
#endif
  std::printf("asyncps_end_to_end: Fashion-MNIST MLP 784-%u-10, batch %u, SGD lr %g, %u steps "
              "per worker (%u warm-up), %u repetition(s), %u server shard(s), threads %s, "
              "spin %u us, %zu training images; load average %s at start%s%s\n",
              su.cfg.hidden, su.cfg.batch, static_cast<double>(su.cfg.lr), opt.steps, su.warmup,
              opt.reps, opt.servers, opt.threads_name.c_str(), opt.spin_us, su.train.size(),
              load_start.c_str(), opt.cpus.empty() ? ", not pinned" : ", pinned to --cpu",
              ndebug ? "" : "; ASSERTIONS ON (no NDEBUG: check_gradients on), not for figures");
  std::fflush(stdout);

  // The rows, in report order; repetitions interleave them.
  std::vector<row> rows;
  const bool want_single =
      std::find(opt.modes.begin(), opt.modes.end(), "single") != opt.modes.end();
  if (want_single) rows.push_back(make_row("single", "-", 1));
  for (const auto& c : opt.consistency)
    for (const auto& m : opt.modes)
      if (m != "single")
        for (unsigned w : opt.workers) rows.push_back(make_row(m, c, w));

  const auto wall_start = bench_clock::now();
  for (unsigned rep = 0; rep < opt.reps; ++rep) {
    for (auto& r : rows) {
      try {
        add(r, r.mode == "single" ? run_single(su) : run_one(su, r.mode, r.consistency, r.workers));
      } catch (const std::exception& e) {
        r.ok = false;
        r.failure = e.what();
      }
    }
  }
  const double wall = std::chrono::duration<double>(bench_clock::now() - wall_start).count();
  finish(su, rows);
  const std::string load_end = loadavg();

  std::printf("\n| mode | consistency | workers | ms/clock median | p90 | vs single | +us/clock | "
              "steps/s (all workers) | compute ms | wait ms | minibatch loss (last 10%%) | "
              "train loss | train acc | test acc | same as single |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
  for (const auto& r : rows) {
    if (!r.ok) {
      std::printf("| %s | %s | %u | FAILED: %s |\n", r.mode.c_str(), r.consistency.c_str(),
                  r.workers, r.failure.c_str());
      continue;
    }
    char ratio[32] = "-", extra[32] = "-";
    if (r.ratio > 0 && r.mode != "single") {
      std::snprintf(ratio, sizeof ratio, "%.3f", r.ratio);
      std::snprintf(extra, sizeof extra, "%+.0f", r.overhead_us);
    }
    char same[96] = "-";
    if (r.same_as_single == 1)
      std::snprintf(same, sizeof same, "bit-identical");
    else if (r.same_as_single == 0)
      std::snprintf(same, sizeof same, "no (%zu/%zu losses equal, max |dparam| %.2g)",
                    r.identical_losses, r.losses.size(), r.max_param_diff);
    std::printf("| %s | %s | %u | %.3f | %.3f | %s | %s | %.0f | %.3f | %.3f | %.4f | %.4f | "
                "%.4f | %.4f | %s |\n",
                r.mode.c_str(), r.consistency.c_str(), r.workers, r.median_ms, r.p90_ms, ratio,
                extra, quantile(r.steps_per_s, 0.5), 1e3 * mean(r.compute_s), 1e3 * mean(r.wait_s),
                mean(r.tail_loss), r.train_eval.loss, r.train_eval.accuracy, r.test_eval.accuracy,
                same);
  }
  std::printf("\nload average (1 min): %s at start, %s at end; %.1f s in all\n", load_start.c_str(),
              load_end.c_str(), wall);

  if (!opt.json.empty()) {
    nlohmann::json j;
    j["meta"] = {{"bench", "asyncps_end_to_end"},
                 {"model", "mlp"},
                 {"hidden", su.cfg.hidden},
                 {"batch", su.cfg.batch},
                 {"lr", su.cfg.lr},
                 {"seed", su.cfg.seed},
                 {"steps", opt.steps},
                 {"warmup", su.warmup},
                 {"reps", opt.reps},
                 {"servers", opt.servers},
                 {"threads", opt.threads_name},
                 {"spin_us", opt.spin_us},
                 {"staleness_ssp", opt.staleness},
                 {"train_images", su.train.size()},
                 {"eval_images", su.test.size()},
                 {"cpus", opt.cpus},
                 {"ndebug", ndebug},
                 {"quick", opt.quick},
                 {"loadavg_start", load_start},
                 {"loadavg_end", load_end},
                 {"wall_s", wall}};
    j["rows"] = nlohmann::json::array();
    for (const auto& r : rows) {
      nlohmann::json x{
          {"mode", r.mode}, {"consistency", r.consistency}, {"workers", r.workers}, {"ok", r.ok}};
      if (!r.ok) {
        x["failure"] = r.failure;
      } else {
        x["clock_ms_median"] = num(r.median_ms);
        x["clock_ms_p90"] = num(r.p90_ms);
        x["clock_ms_mean"] = num(r.mean_ms);
        x["clocks_measured"] = r.step_s.size();
        x["ratio_to_single"] = r.ratio > 0 ? num(r.ratio) : nlohmann::json();
        x["steps_per_s"] = num(quantile(r.steps_per_s, 0.5));
        if (r.ratio > 0 && r.mode != "single") x["overhead_us"] = num(r.overhead_us);
        if (r.mode != "single") {
          x["pulls_per_clock"] = num(r.pulls);
          x["pushes_per_clock"] = num(r.pushes);
          x["bytes_in_per_clock"] = num(r.bytes_in);
          x["bytes_out_per_clock"] = num(r.bytes_out);
        }
        x["compute_ms_mean"] = num(1e3 * mean(r.compute_s));
        x["wait_ms_mean"] = num(1e3 * mean(r.wait_s));
        x["minibatch_loss_tail"] = num(mean(r.tail_loss));
        x["train_loss"] = num(r.train_eval.loss);
        x["train_accuracy"] = num(r.train_eval.accuracy);
        x["test_loss"] = num(r.test_eval.loss);
        x["test_accuracy"] = num(r.test_eval.accuracy);
        if (r.same_as_single >= 0) {
          x["same_as_single"] = r.same_as_single == 1;
          x["identical_losses"] = r.identical_losses;
          x["max_param_diff"] = num(r.max_param_diff);
        }
      }
      j["rows"].push_back(std::move(x));
    }
    std::ofstream out(opt.json);
    out << j.dump(2) << '\n';
    if (!out) {
      std::fprintf(stderr, "asyncps_end_to_end: --json: cannot write %s\n", opt.json.c_str());
      return 2;
    }
  }

  if (opt.check) {
    int bad = 0;
    for (const auto& r : rows) {
      if (!r.ok) {
        std::fprintf(stderr, "check: %s %s %u workers failed: %s\n", r.mode.c_str(),
                     r.consistency.c_str(), r.workers, r.failure.c_str());
        ++bad;
      } else if (r.consistency == "bsp" && r.same_as_single == 0) {
        std::fprintf(stderr,
                     "check: %s bsp with 1 worker is not bit-identical to single (%zu of %zu "
                     "losses equal, max |dparam| %g)\n",
                     r.mode.c_str(), r.identical_losses, r.losses.size(), r.max_param_diff);
        ++bad;
      }
    }
    if (bad != 0) return 1;
    std::printf("check: every run completed; 1-worker BSP runs are bit-identical to single\n");
  }
  return 0;
}
