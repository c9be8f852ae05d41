// asyncps_straggler_experiment — paper C ("Balancing stragglers against staleness", HiPC 2018)
// in the deterministic simulation: 8 workers, one of them slowed by 300% (4x compute time) or
// none, trained as BSP (one BSP server), ASP (one ASP server), and 2 or 4 speed-aware groups
// (include/asyncps/group.hpp: BSP inside a group, groups push to a central ASP server), on a
// Fashion-MNIST MLP and on synthetic matrix factorization; plus a regrouping demo in which a
// second worker becomes slow halfway. Results: docs/results/stragglers.md; plots:
// bench/straggler_experiment.py.
//
//   asyncps_straggler_experiment --out FILE.jsonl [--quick] [--models mlp,mf] [--seeds N]
//       [--seed0 N] [--epochs X] [--hidden N] [--mlp-lr X] [--mf-lr X] [--mf-gradients N]
//       [--evals N] [--no-sweep] [--no-regroup] [--data DIR]
//
// Work budget. Every configuration computes the same total number of gradients N (MLP:
// `epochs` passes over the 60,000 training images in minibatches of 32; MF: `mf-gradients`
// minibatches of 1% of a worker's shard), split by throughput so that no one waits for work
// that a slower part would not finish: BSP gives every worker N/8 clocks; ASP gives worker w a
// share proportional to its speed 1/f_w; a group g gets a share proportional to |g| x (its
// slowest member's speed), i.e. group_clocks = share / |g|. Speeds come from the profile (the
// simulation's compute time is exactly base x f_w x (1 + jitter u)); the regrouping demo
// measures them instead (worker_stats::compute_seconds / clocks).
//
// One JSON object per run goes to --out (see `to_json`); a summary line per run to stderr.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <nlohmann/json.hpp>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/group.hpp"
#include "asyncps/server.hpp"
#include "asyncps/staleness.hpp"
#include "asyncps/transport/simulated.hpp"
#include "asyncps/worker.hpp"
#include "bench/json_output.hpp"
#include "examples/fashion_mnist/dataset.hpp"
#include "examples/fashion_mnist/models.hpp"
#include "examples/matrix_factorization/mf.hpp"

namespace asyncps::bench {
namespace {

namespace mf = asyncps::examples::mf;

/// Everything fixed for a sweep.
struct experiment {
  std::uint32_t workers = 8;
  std::uint32_t straggler = 7;    // the slowed worker
  double straggler_factor = 4.0;  // +300% compute time
  std::uint32_t second = 2;       // the worker that also slows down halfway (regrouping demo)
  double jitter = 0.1;            // compute time x (1 + U[0, jitter))
  double link_bytes_per_second = 1.25e9;  // 10 Gbit/s per node, shared egress
  std::chrono::microseconds latency{100};
  std::chrono::microseconds latency_jitter{50};
  // MLP (Fashion-MNIST).
  double epochs = 2.0;  // passes over the training set, all workers together
  std::uint32_t batch = 32;
  std::uint32_t hidden = 128;
  float mlp_lr = 0.05f;
  std::chrono::microseconds mlp_compute{10000};  // one minibatch gradient at speed 1
  std::size_t eval_subset = 2000;                // test images evaluated along the run
  std::string data_dir = fashion::default_data_dir().string();
  // MF (synthetic, as docs/results/consistency.md).
  std::uint32_t users = 2000;
  std::uint32_t items = 2000;
  std::uint32_t rank = 10;
  std::size_t count = 120000;
  std::uint64_t mf_gradients = 8000;  // 1000 clocks per worker under BSP (10 passes)
  float mf_lr = 4.0f;
  float lambda = 0.001f;
  double us_per_rating = 15.0;
  // Sweep.
  std::uint32_t evals = 25;
  std::uint64_t seed0 = 1;
  std::uint32_t seeds = 1;
  std::vector<std::string> models{"mlp", "mf"};
  bool sweep = true;
  bool regroup = true;
  std::string out = "stragglers.jsonl";
};

/// How the workers are organised in one phase.
enum class mode { bsp, asp, groups };

/// One phase of training: organisation, per-worker clocks, speeds, starting point.
struct phase_spec {
  mode m = mode::bsp;
  group_plan plan{};                  // groups: who trains where
  std::vector<std::uint64_t> clocks;  // per worker (a group's members run the same)
  std::vector<double> speed;          // per-worker slowdown factors
  std::uint64_t seed = 1;
  std::vector<float> start{};  // model values (table-major) to start from; empty: from seed
};

/// One point of a learning curve.
struct sample {
  double gradients;  // gradients computed so far, all workers
  double time;       // simulated seconds
  double metric;     // accuracy (MLP, test subset) or test RMSE (MF)
};

/// Learning-curve state carried across phases.
struct trace {
  double t0 = 0;         // simulated seconds before this phase
  std::uint64_t g0 = 0;  // gradients before this phase
  std::uint64_t every = 1;
  std::vector<sample> series;
  std::function<double(const parameter_view&)> metric;
};

/// What one phase produced.
struct phase_result {
  std::vector<float> values;  // final central model, table-major
  double seconds = 0;         // phase duration: the last worker's or group's completion
  staleness_histogram push_staleness{};
  std::vector<double> done;               // per worker, phase-relative seconds
  std::vector<double> seconds_per_clock;  // per worker: compute_seconds / clocks
  std::vector<std::uint64_t> clocks;      // per worker
  int errors = 0;
};

/// Seconds since the start of the simulation.
double seconds(simulated_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

/// Network options for `ps` with gradient time `compute`.
simulation_options net_options(const experiment& ex, const phase_spec& ps,
                               std::chrono::nanoseconds compute) {
  simulation_options o;
  o.seed = ps.seed;
  o.latency.base = ex.latency;
  o.latency.jitter = ex.latency_jitter;
  o.latency.bytes_per_second = ex.link_bytes_per_second;
  o.compute.base = compute;
  o.compute.speed_factor = ps.speed;
  o.compute.jitter = ex.jitter;
  return o;
}

/// Copies the model tables of `server` (the first `layout.size()` tables) into `out`.
template <class Server>
void read_values(const Server& server, std::span<const table_spec> layout,
                 std::vector<float>& out) {
  out.resize(layout_size(layout));
  std::size_t off = 0;
  for (table_id t = 0; t < layout.size(); ++t) {
    const auto v = server.values(t);
    std::copy(v.begin(), v.end(), out.begin() + static_cast<std::ptrdiff_t>(off));
    off += v.size();
  }
}

/// Sets the model tables of `server` from `values` (table-major).
template <class Server>
void write_values(Server& server, std::span<const table_spec> layout,
                  std::span<const float> values) {
  std::size_t off = 0;
  for (table_id t = 0; t < layout.size(); ++t) {
    server.set_values(t, values.subspan(off, layout[t].size()));
    off += layout[t].size();
  }
}

/// Workers of one phase and their transports (kept alive until the phase ends).
template <class Model, class Policy>
struct worker_set {
  using worker_t = basic_worker<Model, simulated_transport, Policy>;
  std::vector<std::unique_ptr<simulated_transport>> ts;
  std::vector<std::unique_ptr<worker_t>> ws;
};

/// Starts every worker of `ps` on `net`: worker w has id `id_of(w)` on server `server_of(w)`,
/// runs `ps.clocks[w]` clocks, and calls `on_clock` after each.
template <class Policy, class Model, class IdOf, class ServerOf>
void spawn_workers(simulated_network& net, std::vector<Model>& models, const phase_spec& ps,
                   float lr, IdOf id_of, ServerOf server_of, const std::function<void()>& on_clock,
                   phase_result& r, worker_set<Model, Policy>& set) {
  const auto n = static_cast<std::uint32_t>(models.size());
  r.done.assign(n, 0.0);
  for (std::uint32_t w = 0; w < n; ++w) {
    set.ts.push_back(std::make_unique<simulated_transport>(net, "worker" + std::to_string(w)));
    worker_options<std::string> o;
    o.id = id_of(w);
    o.servers = {server_of(w)};
    o.local_step = lr;
    o.log = [](std::string_view) {};
    o.on_clock = [&on_clock](const clock_report&) { on_clock(); };
    set.ws.push_back(std::make_unique<typename worker_set<Model, Policy>::worker_t>(
        *set.ts.back(), models[w], o, asio::any_io_executor(net.compute_executor(w))));
    asio::co_spawn(
        net.get_executor(),
        [&, w]() -> asio::awaitable<void> {
          if (co_await set.ws[w]->async_run(ps.clocks[w])) ++r.errors;
          r.done[w] = seconds(net.now());
        },
        asio::detached);
  }
}

/// Fills the per-worker counters of `r` from `set`.
template <class Model, class Policy>
void collect(const worker_set<Model, Policy>& set, phase_result& r) {
  for (const auto& w : set.ws) {
    const auto& s = w->stats();
    r.clocks.push_back(s.clocks);
    r.seconds_per_clock.push_back(s.clocks > 0 ? s.compute_seconds / static_cast<double>(s.clocks)
                                               : 0.0);
  }
  r.seconds = *std::max_element(r.done.begin(), r.done.end());
}

/// Runs one phase on a plain server (BSP or ASP, by `Policy`) with learning rate `lr`.
template <class Policy, class Model>
phase_result run_plain(const experiment& ex, std::vector<Model>& models, const phase_spec& ps,
                       float lr, std::chrono::nanoseconds compute, trace& tr) {
  simulated_network net(net_options(ex, ps, compute));
  const std::span<const table_spec> layout = models[0].tables();
  simulated_transport st(net, "server");
  server_options so;
  so.num_workers = static_cast<std::uint32_t>(models.size());
  so.tables.assign(layout.begin(), layout.end());
  so.seed = ps.seed;
  so.log = [](std::string_view) {};
  basic_server<simulated_transport, Policy> server(st, so, optimizer::sgd{lr});
  if (!ps.start.empty()) write_values(server, layout, ps.start);
  auto acc = st.listen("server");
  if (!acc) throw std::runtime_error("listen failed");
  asio::co_spawn(net.get_executor(), server.async_serve(std::move(acc).value()), asio::detached);

  phase_result r;
  std::vector<float> scratch;
  std::uint64_t total = 0;
  const auto record = [&] {
    read_values(server, layout, scratch);
    tr.series.push_back(sample{static_cast<double>(tr.g0 + total), tr.t0 + seconds(net.now()),
                               tr.metric(parameter_view(layout, scratch.data()))});
  };
  if (tr.series.empty()) record();  // the initial model
  const std::function<void()> on_clock = [&] {
    if (++total % tr.every == 0) record();
  };
  worker_set<Model, Policy> set;
  spawn_workers<Policy>(
      net, models, ps, lr, [](std::uint32_t w) { return w; },
      [](std::uint32_t) { return std::string("server"); }, on_clock, r, set);
  net.run();
  collect(set, r);
  asio::post(net.get_executor(), [&] { server.stop(); });
  net.run();
  read_values(server, layout, r.values);
  tr.g0 += total;
  tr.t0 += r.seconds;
  return r;
}

/// Runs one phase with group servers (`ps.plan`) pushing to one central ASP server.
template <class Model>
phase_result run_groups(const experiment& ex, std::vector<Model>& models, const phase_spec& ps,
                        float lr, std::chrono::nanoseconds compute, trace& tr) {
  simulated_network net(net_options(ex, ps, compute));
  const auto quiet = [](std::string_view) {};
  const std::span<const table_spec> layout = models[0].tables();
  const std::uint32_t groups = ps.plan.groups;
  simulated_transport ct(net, "central");
  server_options co;
  co.num_workers = groups;
  co.tables = central_layout(layout, groups);
  co.seed = ps.seed;
  co.log = quiet;
  basic_server<simulated_transport, consistency::asp> central(ct, co, optimizer::sgd{1.0f});
  if (!ps.start.empty()) write_values(central, layout, ps.start);
  auto cacc = ct.listen("central");
  if (!cacc) throw std::runtime_error("listen failed");
  asio::co_spawn(net.get_executor(), central.async_serve(std::move(cacc).value()), asio::detached);

  phase_result r;
  using group_t = basic_group_server<simulated_transport>;
  std::vector<std::unique_ptr<simulated_transport>> gts;
  std::vector<std::unique_ptr<group_t>> gs;
  std::vector<double> group_done(groups, 0.0);
  for (std::uint32_t g = 0; g < groups; ++g) {
    const auto members = ps.plan.members(g);
    gts.push_back(std::make_unique<simulated_transport>(net, "group" + std::to_string(g)));
    server_options go;
    go.num_workers = static_cast<std::uint32_t>(members.size());
    go.tables.assign(layout.begin(), layout.end());
    go.seed = ps.seed;
    go.log = quiet;
    worker_options<std::string> lo;
    lo.servers = {"central"};
    lo.log = quiet;
    const group_options gl{
        .group = g, .groups = groups, .push_every = 1, .group_clocks = ps.clocks[members.front()]};
    gs.push_back(std::make_unique<group_t>(*gts.back(), go, lo, gl, optimizer::sgd{lr}));
    if (!ps.start.empty()) gs.back()->set_values(ps.start);
    auto acc = gts.back()->listen("group" + std::to_string(g));
    if (!acc) throw std::runtime_error("listen failed");
    asio::co_spawn(
        net.get_executor(),
        [&, g, a = std::move(acc).value()]() mutable -> asio::awaitable<void> {
          if (co_await gs[g]->async_run(std::move(a))) ++r.errors;
          group_done[g] = seconds(net.now());
        },
        asio::detached);
  }

  std::vector<float> scratch;
  std::uint64_t total = 0;
  const auto record = [&] {
    read_values(central, layout, scratch);
    tr.series.push_back(sample{static_cast<double>(tr.g0 + total), tr.t0 + seconds(net.now()),
                               tr.metric(parameter_view(layout, scratch.data()))});
  };
  if (tr.series.empty()) record();  // the initial model
  const std::function<void()> on_clock = [&] {
    if (++total % tr.every == 0) record();
  };
  worker_set<Model, consistency::bsp> set;
  spawn_workers<consistency::bsp>(
      net, models, ps, lr, [&](std::uint32_t w) { return ps.plan.local_id(w); },
      [&](std::uint32_t w) { return "group" + std::to_string(ps.plan.group_of[w]); }, on_clock, r,
      set);
  net.run();
  collect(set, r);
  r.seconds = std::max(r.seconds, *std::max_element(group_done.begin(), group_done.end()));
  asio::post(net.get_executor(), [&] { central.stop(); });
  net.run();
  read_values(central, layout, r.values);
  for (const auto& g : gs) r.push_staleness += g->link_model().staleness();
  tr.g0 += total;
  tr.t0 += r.seconds;
  return r;
}

/// Runs phase `ps` in its mode.
template <class Model>
phase_result run_phase(const experiment& ex, std::vector<Model>& models, const phase_spec& ps,
                       float lr, std::chrono::nanoseconds compute, trace& tr) {
  switch (ps.m) {
    case mode::bsp: return run_plain<consistency::bsp>(ex, models, ps, lr, compute, tr);
    case mode::asp: return run_plain<consistency::asp>(ex, models, ps, lr, compute, tr);
    case mode::groups: break;
  }
  return run_groups(ex, models, ps, lr, compute, tr);
}

// ---------------------------------------------------------------------------------------------
// Splitting the budget
// ---------------------------------------------------------------------------------------------

/// Per-worker clocks for `budget` gradients in mode `m` with per-worker seconds per gradient
/// `cost` (any unit; only ratios matter), as in the file comment. Every worker gets >= 1.
std::vector<std::uint64_t> split_budget(mode m, const group_plan& plan,
                                        std::span<const double> cost, std::uint64_t budget) {
  const std::size_t n = cost.size();
  std::vector<std::uint64_t> clocks(n, 1);
  const auto share = [&](double part, double whole, double per) {
    return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::llround(
                                          static_cast<double>(budget) * part / whole / per)));
  };
  if (m == mode::bsp) {
    for (auto& c : clocks) c = share(1.0, static_cast<double>(n), 1.0);
  } else if (m == mode::asp) {
    double sum = 0;
    for (double c : cost) sum += 1.0 / c;
    for (std::size_t w = 0; w < n; ++w) clocks[w] = share(1.0 / cost[w], sum, 1.0);
  } else {
    std::vector<double> thr(plan.groups);
    for (std::uint32_t g = 0; g < plan.groups; ++g) {
      double slowest = 0;
      const auto mem = plan.members(g);
      for (auto w : mem) slowest = std::max(slowest, cost[w]);
      thr[g] = static_cast<double>(mem.size()) / slowest;
    }
    const double sum = std::accumulate(thr.begin(), thr.end(), 0.0);
    for (std::uint32_t g = 0; g < plan.groups; ++g) {
      const auto mem = plan.members(g);
      const auto c = share(thr[g], sum, static_cast<double>(mem.size()));
      for (auto w : mem) clocks[w] = c;
    }
  }
  return clocks;
}

// ---------------------------------------------------------------------------------------------
// Models and data
// ---------------------------------------------------------------------------------------------

/// The data of both models (loaded or generated once).
struct data_sets {
  fashion::dataset train, test, test_subset;
  mf::ratings mf_train, mf_test;
  std::vector<mf::ratings> mf_shards;
};

/// A model family: how to make the workers' models, its budget, rate and metrics.
struct family {
  std::string name;  // "mlp" or "mf"
  std::string metric_name;
  std::uint64_t budget = 0;
  float lr = 0;
  std::chrono::nanoseconds compute{};
};

/// Ratings per MF minibatch: 1% of a worker's shard.
double mf_batch(const data_sets& d) {
  return std::max(1.0, std::round(static_cast<double>(d.mf_shards[0].size()) / 100.0));
}

/// The MLP family of `ex`.
family mlp_family(const experiment& ex, const data_sets& d) {
  const auto budget = static_cast<std::uint64_t>(
      std::llround(ex.epochs * static_cast<double>(d.train.size()) / ex.batch));
  return {"mlp", "accuracy", budget, ex.mlp_lr, ex.mlp_compute};
}

/// The MF family of `ex` (compute time per gradient from the minibatch size).
family mf_family(const experiment& ex, const data_sets& d) {
  const auto batch = mf_batch(d);
  return {"mf", "test_rmse", ex.mf_gradients, ex.mf_lr,
          std::chrono::nanoseconds(std::llround(ex.us_per_rating * 1e3 * batch))};
}

/// The workers' MLP models for seed `seed`.
std::vector<fashion::mlp_model> make_models(const experiment& ex, const data_sets& d,
                                            const fashion::mlp_model*, std::uint64_t seed) {
  std::vector<fashion::mlp_model> m;
  m.reserve(ex.workers);
  for (std::uint32_t w = 0; w < ex.workers; ++w)
    m.emplace_back(d.train, w, ex.workers, ex.batch, seed * 1000 + w, 0.0f, ex.hidden);
  return m;
}

/// The workers' MF models for seed `seed`.
std::vector<mf::mf_model> make_models(const experiment& ex, const data_sets& d, const mf::mf_model*,
                                      std::uint64_t seed) {
  std::vector<mf::mf_model> m;
  m.reserve(ex.workers);
  const auto batch = static_cast<std::uint32_t>(mf_batch(d));
  for (std::uint32_t w = 0; w < ex.workers; ++w)
    m.emplace_back(d.mf_shards[w], ex.rank, batch, ex.lambda, seed * 1000 + w);
  return m;
}

/// Quick metric along the run: accuracy on the test subset.
std::function<double(const parameter_view&)> quick_metric(const data_sets& d,
                                                          const fashion::mlp_model*) {
  return [&d](const parameter_view& p) {
    return fashion::mlp_model::evaluate(p, d.test_subset).accuracy;
  };
}

/// Quick metric along the run: test RMSE.
std::function<double(const parameter_view&)> quick_metric(const data_sets& d, const mf::mf_model*) {
  return [&d](const parameter_view& p) { return mf::rmse(p, d.mf_test); };
}

/// Final metrics {primary, secondary}: MLP {test accuracy, test loss} on all 10,000 images.
std::pair<double, double> final_metrics(const data_sets& d, const parameter_view& p,
                                        const fashion::mlp_model*) {
  const auto e = fashion::mlp_model::evaluate(p, d.test);
  return {e.accuracy, e.loss};
}

/// Final metrics {primary, secondary}: MF {test RMSE, training RMSE}.
std::pair<double, double> final_metrics(const data_sets& d, const parameter_view& p,
                                        const mf::mf_model*) {
  return {mf::rmse(p, d.mf_test), mf::rmse(p, d.mf_train)};
}

// ---------------------------------------------------------------------------------------------
// JSON output
// ---------------------------------------------------------------------------------------------

/// One run's record (a single phase, or the phases of a regrouping run).
struct run_record {
  std::string kind;    // "sweep" or "regroup"
  std::string model;   // "mlp" or "mf"
  std::string config;  // "BSP", "ASP", "2 groups", "4 groups"; regroup: the variant
  std::uint32_t groups = 0;
  bool straggler = false;
  std::uint64_t seed = 0;
  std::uint64_t budget = 0;
  float lr = 0;
  std::vector<phase_spec> phases;
  std::vector<phase_result> results;
  std::vector<sample> series;
  double final_metric = 0;
  double final_secondary = 0;
  double wall_seconds = 0;
};

/// The JSON line of `r`.
std::string to_json(const experiment& ex, const family& f, const run_record& r) {
  double total = 0;
  staleness_histogram st;
  int errors = 0;
  for (const auto& p : r.results) {
    total += p.seconds;
    st += p.push_staleness;
    errors += p.errors;
  }
  nlohmann::json phases = nlohmann::json::array();
  for (std::size_t i = 0; i < r.phases.size(); ++i) {
    const auto& ps = r.phases[i];
    const auto& pr = r.results[i];
    phases.push_back(
        {{"mode", ps.m == mode::bsp   ? "bsp"
                  : ps.m == mode::asp ? "asp"
                                      : "groups"},
         {"group_of", ps.plan.group_of},
         {"speed", numbers(ps.speed, [](double x) { return x; })},
         {"clocks", ps.clocks},
         {"seconds", num(pr.seconds)},
         {"done", numbers(pr.done, [](double x) { return x; })},
         {"seconds_per_clock", numbers(pr.seconds_per_clock, [](double x) { return x; })},
         {"push_staleness", pr.push_staleness.counts},
         {"errors", pr.errors}});
  }
  const nlohmann::json j = {
      {"kind", r.kind},
      {"model", r.model},
      {"config", r.config},
      {"groups", r.groups},
      {"straggler", r.straggler},
      {"seed", r.seed},
      {"workers", ex.workers},
      {"budget", r.budget},
      {"lr", num(r.lr)},
      {"compute_ms", num(static_cast<double>(f.compute.count()) / 1e6)},
      {"jitter", num(ex.jitter)},
      {"metric", f.metric_name},
      {"sim_seconds", num(total)},
      {"final_metric", num(r.final_metric)},
      {"final_secondary", num(r.final_secondary)},
      {"push_staleness", st.counts},
      {"push_staleness_mean", num(st.total() > 0 ? st.mean() : 0.0)},
      {"phases", std::move(phases)},
      {"series",
       {{"gradients", numbers(r.series, [](const sample& x) { return x.gradients; })},
        {"time", numbers(r.series, [](const sample& x) { return x.time; })},
        {"metric", numbers(r.series, [](const sample& x) { return x.metric; })}}},
      {"errors", errors},
      {"wall_seconds", num(r.wall_seconds)}};
  return j.dump();
}

// ---------------------------------------------------------------------------------------------
// Runs
// ---------------------------------------------------------------------------------------------

/// Writes `r` to `out` and a summary line to stderr; returns whether it had no errors.
bool emit(std::FILE* out, const experiment& ex, const family& f, const run_record& r) {
  const std::string line = to_json(ex, f, r);
  std::fprintf(out, "%s\n", line.c_str());
  std::fflush(out);
  double total = 0;
  int errors = 0;
  staleness_histogram st;
  for (const auto& p : r.results) {
    total += p.seconds;
    errors += p.errors;
    st += p.push_staleness;
  }
  std::fprintf(stderr,
               "%-4s %-7s %-22s %-9s seed %llu: %8.2f sim s, %s %.4f, push staleness %s%s"
               " (%.1f s wall)\n",
               r.model.c_str(), r.kind.c_str(), r.config.c_str(),
               r.straggler ? "straggler" : "even", static_cast<unsigned long long>(r.seed), total,
               f.metric_name.c_str(), r.final_metric, st.total() > 0 ? st.to_string().c_str() : "-",
               errors > 0 ? " ERRORS" : "", r.wall_seconds);
  return errors == 0;
}

/// Fills the final metrics and the series of `r` from the last phase of `tr`.
template <class Model>
void finish(const data_sets& d, const std::vector<Model>& models, trace& tr, run_record& r) {
  const parameter_view view(models[0].tables(), r.results.back().values.data());
  std::tie(r.final_metric, r.final_secondary) =
      final_metrics(d, view, static_cast<const Model*>(nullptr));
  tr.series.push_back(sample{static_cast<double>(tr.g0), tr.t0,
                             quick_metric(d, static_cast<const Model*>(nullptr))(view)});
  r.series = std::move(tr.series);
}

/// A fresh trace for family `f` sampling every `budget / evals` gradients.
/// (The first phase records the initial model's metric.)
template <class Model>
trace start_trace(const experiment& ex, const family& f, const data_sets& d) {
  trace tr;
  tr.every = std::max<std::uint64_t>(1, f.budget / ex.evals);
  tr.metric = quick_metric(d, static_cast<const Model*>(nullptr));
  return tr;
}

/// The per-worker slowdown factors: all 1, `slow` workers at `factor`.
std::vector<double> profile(const experiment& ex, std::initializer_list<std::uint32_t> slow) {
  std::vector<double> s(ex.workers, 1.0);
  for (auto w : slow) s[w] = ex.straggler_factor;
  return s;
}

/// The main sweep for one model family and seed: {BSP, ASP, 2 groups, 4 groups} x {even,
/// straggler}. Returns false when a run had errors.
template <class Model>
bool sweep(std::FILE* out, const experiment& ex, const data_sets& d, const family& f,
           std::uint64_t seed) {
  bool ok = true;
  for (bool straggler : {false, true}) {
    const auto speed = straggler ? profile(ex, {ex.straggler}) : profile(ex, {});
    for (std::uint32_t groups : {0u, 1u, 2u, 4u}) {  // 0: ASP, 1: BSP
      const auto wall0 = std::chrono::steady_clock::now();
      auto models = make_models(ex, d, static_cast<const Model*>(nullptr), seed);
      phase_spec ps;
      ps.m = groups == 0 ? mode::asp : groups == 1 ? mode::bsp : mode::groups;
      if (ps.m == mode::groups) ps.plan = groups_by_speed(speed, groups);
      ps.speed = speed;
      ps.seed = seed;
      ps.clocks = split_budget(ps.m, ps.plan, speed, f.budget);
      run_record r;
      r.kind = "sweep";
      r.model = f.name;
      r.config = groups == 0 ? "ASP" : groups == 1 ? "BSP" : std::to_string(groups) + " groups";
      r.groups = groups;
      r.straggler = straggler;
      r.seed = seed;
      r.budget = f.budget;
      r.lr = f.lr;
      trace tr = start_trace<Model>(ex, f, d);
      r.results.push_back(run_phase(ex, models, ps, f.lr, f.compute, tr));
      r.phases.push_back(ps);
      finish(d, models, tr, r);
      r.wall_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
      ok = emit(out, ex, f, r) && ok;
    }
  }
  return ok;
}

/// The regrouping demo for one family, seed and group count: worker `straggler` is slow from
/// the start; at 50% of the budget worker `second` becomes slow too. Phase 1 (50%): groups and
/// shares by the initial speeds. Phase 2 (5%): unchanged (the change is not known yet); the
/// workers' speeds are measured from worker_stats. Phase 3 (45%), three variants from the same
/// central model: "static" (old groups, old shares), "rebalance" (old groups, shares by the
/// measured speeds), "regroup" (groups_by_speed on the measured speeds, shares by them; the
/// new group servers start from the central model via set_values).
template <class Model>
bool regroup_demo(std::FILE* out, const experiment& ex, const data_sets& d, const family& f,
                  std::uint64_t seed, std::uint32_t groups) {
  const auto wall0 = std::chrono::steady_clock::now();
  const auto before = profile(ex, {ex.straggler});
  const auto after = profile(ex, {ex.straggler, ex.second});
  const std::uint64_t b1 = f.budget / 2;
  const std::uint64_t b2 = f.budget / 20;
  const std::uint64_t b3 = f.budget - b1 - b2;
  auto models = make_models(ex, d, static_cast<const Model*>(nullptr), seed);
  trace tr = start_trace<Model>(ex, f, d);
  phase_spec p1;
  p1.m = mode::groups;
  p1.plan = groups_by_speed(before, groups);
  p1.speed = before;
  p1.seed = seed;
  p1.clocks = split_budget(p1.m, p1.plan, before, b1);
  const auto r1 = run_phase(ex, models, p1, f.lr, f.compute, tr);
  phase_spec p2 = p1;
  p2.speed = after;
  p2.seed = seed + 100;
  p2.clocks = split_budget(p2.m, p2.plan, before, b2);
  p2.start = r1.values;
  const auto r2 = run_phase(ex, models, p2, f.lr, f.compute, tr);
  const std::vector<double>& measured = r2.seconds_per_clock;
  const double head_wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();

  bool ok = true;
  for (std::string_view variant : {"static", "rebalance", "regroup"}) {
    const auto wall1 = std::chrono::steady_clock::now();
    // Each variant continues from copies of the same worker models (minibatch order).
    auto vmodels = models;
    trace vtr = tr;
    phase_spec p3 = p2;
    p3.seed = seed + 200;
    p3.start = r2.values;
    if (variant == "static") {
      p3.clocks = split_budget(p3.m, p3.plan, before, b3);
    } else {
      if (variant == "regroup") p3.plan = groups_by_speed(measured, groups);
      p3.clocks = split_budget(p3.m, p3.plan, measured, b3);
    }
    run_record r;
    r.kind = "regroup";
    r.model = f.name;
    r.config = std::string(variant);
    r.groups = groups;
    r.straggler = true;
    r.seed = seed;
    r.budget = f.budget;
    r.lr = f.lr;
    r.phases = {p1, p2, p3};
    r.results = {r1, r2};
    r.results.push_back(run_phase(ex, vmodels, p3, f.lr, f.compute, vtr));
    finish(d, vmodels, vtr, r);
    r.wall_seconds =
        head_wall + std::chrono::duration<double>(std::chrono::steady_clock::now() - wall1).count();
    ok = emit(out, ex, f, r) && ok;
  }
  return ok;
}

/// Everything for one model family.
template <class Model>
bool run_family(std::FILE* out, const experiment& ex, const data_sets& d, const family& f) {
  bool ok = true;
  for (std::uint32_t i = 0; i < ex.seeds; ++i) {
    const std::uint64_t seed = ex.seed0 + i;
    if (ex.sweep) ok = sweep<Model>(out, ex, d, f, seed) && ok;
    if (ex.regroup)
      for (std::uint32_t g : {2u, 4u}) ok = regroup_demo<Model>(out, ex, d, f, seed, g) && ok;
  }
  return ok;
}

// ---------------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------------

/// Prints the usage line.
void usage() {
  std::fprintf(stderr,
               "usage: asyncps_straggler_experiment --out FILE [--quick] [--models mlp,mf]\n"
               "    [--seeds N] [--seed0 N] [--epochs X] [--hidden N] [--mlp-lr X] [--mf-lr X]\n"
               "    [--mf-gradients N] [--evals N] [--no-sweep] [--no-regroup] [--data DIR]\n");
}

/// Splits "a,b,c".
std::vector<std::string> split_list(std::string_view s) {
  std::vector<std::string> out;
  std::size_t b = 0;
  while (b <= s.size()) {
    const auto e = std::min(s.find(',', b), s.size());
    if (e > b) out.emplace_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

/// Parses the command line; throws `std::invalid_argument` on a bad flag.
experiment parse(int argc, char** argv) {
  experiment ex;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(std::string(a) + " needs a value");
      return argv[++i];
    };
    if (a == "--out") {
      ex.out = value();
    } else if (a == "--quick") {  // MF only, small: the ctest smoke test
      ex.models = {"mf"};
      ex.users = 300;
      ex.items = 300;
      ex.count = 12000;
      ex.mf_gradients = 400;
      ex.mf_lr = 0.5f;  // 14-rating minibatches: lr 4 diverges
      ex.evals = 5;
    } else if (a == "--models") {
      ex.models = split_list(value());
    } else if (a == "--seeds") {
      ex.seeds = static_cast<std::uint32_t>(std::stoul(value()));
    } else if (a == "--seed0") {
      ex.seed0 = std::stoull(value());
    } else if (a == "--epochs") {
      ex.epochs = std::stod(value());
    } else if (a == "--hidden") {
      ex.hidden = static_cast<std::uint32_t>(std::stoul(value()));
    } else if (a == "--mlp-lr") {
      ex.mlp_lr = std::stof(value());
    } else if (a == "--mf-lr") {
      ex.mf_lr = std::stof(value());
    } else if (a == "--mf-gradients") {
      ex.mf_gradients = std::stoull(value());
    } else if (a == "--evals") {
      ex.evals = static_cast<std::uint32_t>(std::stoul(value()));
    } else if (a == "--no-sweep") {
      ex.sweep = false;
    } else if (a == "--no-regroup") {
      ex.regroup = false;
    } else if (a == "--data") {
      ex.data_dir = value();
    } else {
      throw std::invalid_argument("unknown flag " + std::string(a));
    }
  }
  if (ex.evals == 0) throw std::invalid_argument("--evals must be > 0");
  return ex;
}

/// Loads Fashion-MNIST and generates the MF data, as `ex.models` needs.
data_sets load(const experiment& ex) {
  data_sets d;
  const auto wants = [&](std::string_view m) {
    return std::find(ex.models.begin(), ex.models.end(), m) != ex.models.end();
  };
  if (wants("mlp")) {
    auto sets = fashion::load_fashion_mnist(ex.data_dir);
    if (!sets) throw std::runtime_error("cannot load Fashion-MNIST from " + ex.data_dir);
    d.train = std::move(sets.value().first);
    d.test = std::move(sets.value().second);
    const auto n = std::min(ex.eval_subset, d.test.size());
    d.test_subset.images = d.test.images.topRows(static_cast<Eigen::Index>(n));
    d.test_subset.labels.assign(d.test.labels.begin(),
                                d.test.labels.begin() + static_cast<std::ptrdiff_t>(n));
  }
  if (wants("mf")) {
    mf::synthetic_options o;
    o.users = ex.users;
    o.items = ex.items;
    o.rank = ex.rank;
    o.count = ex.count;
    auto [train, test] = mf::split(mf::make_synthetic(o), 0.1, 1);
    d.mf_train = std::move(train);
    d.mf_test = std::move(test);
    for (std::uint32_t w = 0; w < ex.workers; ++w)
      d.mf_shards.push_back(mf::take_shard(d.mf_train, w, ex.workers));
  }
  return d;
}

}  // namespace
}  // namespace asyncps::bench

/// Runs the sweep described in the file comment.
int main(int argc, char** argv) {
  using namespace asyncps::bench;
  try {
    const experiment ex = parse(argc, argv);
    const data_sets d = load(ex);
    std::FILE* out = std::fopen(ex.out.c_str(), "w");
    if (out == nullptr) throw std::runtime_error("cannot open " + ex.out);
    bool ok = true;
    for (const auto& m : ex.models) {
      if (m == "mlp") {
        ok = run_family<fashion::mlp_model>(out, ex, d, mlp_family(ex, d)) && ok;
      } else if (m == "mf") {
        ok = run_family<asyncps::examples::mf::mf_model>(out, ex, d, mf_family(ex, d)) && ok;
      } else {
        throw std::invalid_argument("unknown model " + m + " (mlp, mf)");
      }
    }
    std::fclose(out);
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "asyncps_straggler_experiment: %s\n", e.what());
    usage();
    return 2;
  }
}
