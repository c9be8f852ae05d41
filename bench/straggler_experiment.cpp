// asyncps_straggler_experiment — paper C ("Balancing stragglers against staleness", HiPC 2018)
// in the deterministic simulation: 8 workers, one of them (worker 7) slowed by a factor f in
// {1, 2, 3, 4, 5, 9} (+0% ... +800% compute time), trained as BSP (one BSP server), ASP (one
// ASP server), and 2 or 4 groups (include/asyncps/group.hpp: BSP inside a group, groups push to
// a central ASP server) formed from speeds measured during the run, on a Fashion-MNIST MLP and on
// synthetic matrix factorization; plus a regrouping demo in which a second worker becomes slow
// halfway. Results: docs/results/stragglers.md; tables and plots: bench/straggler_experiment.py.
//
//   asyncps_straggler_experiment --out FILE.jsonl [--quick] [--models mlp,mf] [--seeds N]
//       [--seed0 N] [--delays 1,2,...] [--configs BSP,ASP,...] [--epochs X] [--hidden N]
//       [--mlp-lr X] [--mf-lr X] [--mf-gradients N] [--drop-at X] [--drop-factor X]
//       [--measure X] [--slow-threshold X] [--evals N] [--no-sweep] [--no-regroup]
//       [--demo-models mf,mlp] [--data DIR]
//
// Stop condition: equal total work. Every run of a model computes the same total number N of
// gradients, counted over all workers as they complete (MLP: `epochs` passes over the 60,000
// training images in minibatches of 32; MF: `mf-gradients` minibatches of 1% of a worker's
// shard). Nobody is given a share of N in advance: every worker (or group) runs as fast as it
// can, and the run is cut the instant the N-th gradient is counted (gradients still being
// computed then are discarded). So a fast worker does more of the work than a slow one exactly
// as far as the protocol lets it, and the simulated time to N, or to an accuracy target on the
// way, is an outcome of the protocol, not of a budget split.
//
// Schedule: the same for every configuration, by work: learning rate `lr` per gradient until
// `drop-at` x N gradients, then `lr x drop-factor`. Each rate change is a phase boundary: the
// phase is cut as above and the next phase starts fresh servers (and group servers) from the
// central model; the workers keep their models (minibatch order). Phase times add up.
//
// Grouping from measured speeds: a grouped run starts with `groups_by_id` (no knowledge of the
// speeds) for a measuring window of `measure` x N gradients; at that boundary and at every later
// one, each worker's seconds per gradient is measured as worker_stats::compute_seconds / clocks
// over the phase that just ended (a worker with no completed clock counts as taking the whole
// phase), and the next phase's groups come from those numbers: "by speed" (`groups_by_speed`:
// equal sizes, the slowest share the last group) or "isolating" (workers measured slower than
// `slow-threshold` x the median form the last group alone; the others are split by speed over
// the remaining groups; with none or too many slow workers the same as "by speed").
//
// Samples: the central model (BSP/ASP: the server's values; groups: the central server's model
// tables) every N / `evals` gradients on the first 2,000 test images (MLP) or the test ratings
// (MF), at that instant of simulated time; at every phase end and at the end on the whole test
// set. One JSON object per run goes to --out (see `to_json`); a summary line per run to stderr.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
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
  std::uint32_t straggler = 7;                               // the slowed worker
  std::vector<double> delays{1.0, 2.0, 3.0, 4.0, 5.0, 9.0};  // its compute-time factors
  std::uint32_t second = 2;     // the worker that also slows down halfway (regrouping demo)
  double demo_factor = 4.0;     // both slow workers' factor in the regrouping demo
  double demo_change_at = 0.5;  // when (fraction of N) the second worker slows down
  double jitter = 0.1;          // compute time x (1 + U[0, jitter))
  double link_bytes_per_second = 1.25e9;  // 10 Gbit/s per node, shared egress
  std::chrono::microseconds latency{100};
  std::chrono::microseconds latency_jitter{50};
  // Schedule and grouping (fractions of N).
  double drop_at = 0.75;  // learning rate x drop_factor from here on
  double drop_factor = 0.1;
  double measure = 0.02;        // the measuring window of a grouped run
  double slow_threshold = 1.5;  // "isolating": slower than this x the median is slow
  // MLP (Fashion-MNIST).
  double epochs = 5.0;  // passes over the training set, all workers together
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
  std::uint64_t mf_gradients = 24000;  // 3000 clocks per worker under BSP (30 passes)
  float mf_lr = 4.0f;
  float lambda = 0.001f;
  double us_per_rating = 15.0;
  // Sweep.
  std::uint32_t evals = 80;
  std::uint64_t seed0 = 1;
  std::uint32_t seeds = 5;
  std::vector<std::string> models{"mlp", "mf"};
  std::vector<std::string> configs{
      "BSP", "ASP", "2 groups", "4 groups", "2 groups isolating", "4 groups isolating"};
  bool sweep = true;
  bool regroup = true;
  std::vector<std::string> demo_models{"mf"};  // the models the regrouping demo runs for
  std::string out = "stragglers.jsonl";
};

/// How the workers are organised in one phase.
enum class mode { bsp, asp, groups };

/// How a grouped run forms its groups from measured speeds (see the file comment).
enum class policy { by_speed, isolating };

/// One configuration of the sweep.
struct config {
  std::string name;  // "BSP", "ASP", "2 groups", "4 groups isolating", ...
  mode m = mode::bsp;
  std::uint32_t groups = 0;  // groups: 2 or 4; BSP 1, ASP 0 (for the JSON)
  policy pol = policy::by_speed;
};

/// The configuration called `name`; throws `std::invalid_argument` for an unknown one.
config config_named(const std::string& name) {
  if (name == "BSP") return {name, mode::bsp, 1, policy::by_speed};
  if (name == "ASP") return {name, mode::asp, 0, policy::by_speed};
  for (std::uint32_t g : {2u, 4u}) {
    if (name == std::to_string(g) + " groups") return {name, mode::groups, g, policy::by_speed};
    if (name == std::to_string(g) + " groups isolating")
      return {name, mode::groups, g, policy::isolating};
  }
  throw std::invalid_argument("unknown config '" + name +
                              "' (BSP, ASP, 2 groups, 4 groups, 2 groups isolating, "
                              "4 groups isolating)");
}

/// One phase of training: organisation, per-worker clock limits, speeds, starting point.
struct phase_spec {
  mode m = mode::bsp;
  group_plan plan{};                  // groups: who trains where
  std::vector<std::uint64_t> clocks;  // per worker: an upper bound (the phase is cut first)
  std::vector<double> speed;          // per-worker slowdown factors
  std::uint64_t seed = 1;
  float lr = 0;                // learning rate per gradient in this phase
  std::uint64_t budget = 0;    // gradients (all workers) after which the phase is cut
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
  std::vector<float> values;  // central model at the cut (or at the end), table-major
  double seconds = 0;         // phase duration: until the cut (or the last worker's end)
  bool cut = false;           // cut at `budget` gradients (else every worker ran out first)
  staleness_histogram push_staleness{};   // groups: central pushes up to the cut
  std::vector<double> seconds_per_clock;  // per worker: compute_seconds / clocks at the cut
  std::vector<std::uint64_t> clocks;      // per worker: clocks completed by the cut
  double full_metric = 0;                 // the central model on the whole test set
  int errors = 0;                         // runs that failed before the cut
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
/// runs up to `ps.clocks[w]` clocks, and calls `on_clock` after each. A run that fails before
/// the phase is cut counts in `r.errors` (after the cut the servers are stopped on purpose).
template <class Policy, class Model, class IdOf, class ServerOf>
void spawn_workers(simulated_network& net, std::vector<Model>& models, const phase_spec& ps,
                   IdOf id_of, ServerOf server_of, const std::function<void()>& on_clock,
                   phase_result& r, std::vector<double>& done, worker_set<Model, Policy>& set) {
  const auto n = static_cast<std::uint32_t>(models.size());
  done.assign(n, 0.0);
  for (std::uint32_t w = 0; w < n; ++w) {
    set.ts.push_back(std::make_unique<simulated_transport>(net, "worker" + std::to_string(w)));
    worker_options<std::string> o;
    o.id = id_of(w);
    o.servers = {server_of(w)};
    o.local_step = ps.lr;
    o.log = [](std::string_view) {};
    o.on_clock = [&on_clock](const clock_report&) { on_clock(); };
    set.ws.push_back(std::make_unique<typename worker_set<Model, Policy>::worker_t>(
        *set.ts.back(), models[w], o, asio::any_io_executor(net.compute_executor(w))));
    asio::co_spawn(
        net.get_executor(),
        [&, w]() -> asio::awaitable<void> {
          const std::error_code ec = co_await set.ws[w]->async_run(ps.clocks[w]);
          if (ec && !r.cut) ++r.errors;
          done[w] = seconds(net.now());
        },
        asio::detached);
  }
}

/// Fills the per-worker counters of `r` from `set` (clocks and measured seconds per clock;
/// a worker without a completed clock counts as taking `elapsed` seconds).
template <class Model, class Policy>
void measure(const worker_set<Model, Policy>& set, double elapsed, phase_result& r) {
  r.clocks.clear();
  r.seconds_per_clock.clear();
  for (const auto& w : set.ws) {
    const auto& s = w->stats();
    r.clocks.push_back(s.clocks);
    r.seconds_per_clock.push_back(s.clocks > 0 ? s.compute_seconds / static_cast<double>(s.clocks)
                                               : elapsed);
  }
}

/// The server type of the plain configurations.
template <class Policy>
using plain_server = basic_server<simulated_transport, Policy>;

/// Runs one phase on a plain server (BSP or ASP, by `Policy`).
template <class Policy, class Model>
phase_result run_plain(const experiment& ex, std::vector<Model>& models, const phase_spec& ps,
                       std::chrono::nanoseconds compute, trace& tr) {
  simulated_network net(net_options(ex, ps, compute));
  const std::span<const table_spec> layout = models[0].tables();
  simulated_transport st(net, "server");
  server_options so;
  so.num_workers = static_cast<std::uint32_t>(models.size());
  so.tables.assign(layout.begin(), layout.end());
  so.seed = ps.seed;
  so.log = [](std::string_view) {};
  plain_server<Policy> server(st, so, optimizer::sgd{ps.lr});
  if (!ps.start.empty()) write_values(server, layout, ps.start);
  auto acc = st.listen("server");
  if (!acc) throw std::runtime_error("listen failed");
  asio::co_spawn(net.get_executor(), server.async_serve(std::move(acc).value()), asio::detached);

  phase_result r;
  worker_set<Model, Policy> set;
  std::vector<double> done;
  std::vector<float> scratch;
  std::uint64_t total = 0;
  const auto record = [&] {
    read_values(server, layout, scratch);
    tr.series.push_back(sample{static_cast<double>(tr.g0 + total), tr.t0 + seconds(net.now()),
                               tr.metric(parameter_view(layout, scratch.data()))});
  };
  if (tr.series.empty()) record();  // the initial model
  const std::function<void()> on_clock = [&] {
    if (r.cut) return;
    ++total;
    if ((tr.g0 + total) % tr.every == 0) record();
    if (total == ps.budget) {  // cut: the central model and the counters as of now
      r.cut = true;
      r.seconds = seconds(net.now());
      read_values(server, layout, r.values);
      measure(set, r.seconds, r);
      net.stop();
    }
  };
  spawn_workers<Policy>(
      net, models, ps, [](std::uint32_t w) { return w; },
      [](std::uint32_t) { return std::string("server"); }, on_clock, r, done, set);
  net.run();
  if (!r.cut) {
    r.seconds = *std::max_element(done.begin(), done.end());
    read_values(server, layout, r.values);
    measure(set, r.seconds, r);
  }
  asio::post(net.get_executor(), [&] { server.stop(); });
  net.run();  // the workers fail and end; nothing of theirs is counted any more
  tr.g0 += total;
  tr.t0 += r.seconds;
  return r;
}

/// Runs one phase with group servers (`ps.plan`) pushing to one central ASP server.
template <class Model>
phase_result run_groups(const experiment& ex, std::vector<Model>& models, const phase_spec& ps,
                        std::chrono::nanoseconds compute, trace& tr) {
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
    gs.push_back(std::make_unique<group_t>(*gts.back(), go, lo, gl, optimizer::sgd{ps.lr}));
    if (!ps.start.empty()) gs.back()->set_values(ps.start);
    auto acc = gts.back()->listen("group" + std::to_string(g));
    if (!acc) throw std::runtime_error("listen failed");
    asio::co_spawn(
        net.get_executor(),
        [&, g, a = std::move(acc).value()]() mutable -> asio::awaitable<void> {
          const std::error_code ec = co_await gs[g]->async_run(std::move(a));
          if (ec && !r.cut) ++r.errors;
          group_done[g] = seconds(net.now());
        },
        asio::detached);
  }

  worker_set<Model, consistency::bsp> set;
  std::vector<double> done;
  std::vector<float> scratch;
  std::uint64_t total = 0;
  const auto record = [&] {
    read_values(central, layout, scratch);
    tr.series.push_back(sample{static_cast<double>(tr.g0 + total), tr.t0 + seconds(net.now()),
                               tr.metric(parameter_view(layout, scratch.data()))});
  };
  if (tr.series.empty()) record();  // the initial model
  const std::function<void()> on_clock = [&] {
    if (r.cut) return;
    ++total;
    if ((tr.g0 + total) % tr.every == 0) record();
    if (total == ps.budget) {
      r.cut = true;
      r.seconds = seconds(net.now());
      read_values(central, layout, r.values);
      measure(set, r.seconds, r);
      for (const auto& g : gs) r.push_staleness += g->link_model().staleness();
      net.stop();
    }
  };
  spawn_workers<consistency::bsp>(
      net, models, ps, [&](std::uint32_t w) { return ps.plan.local_id(w); },
      [&](std::uint32_t w) { return "group" + std::to_string(ps.plan.group_of[w]); }, on_clock, r,
      done, set);
  net.run();
  if (!r.cut) {
    r.seconds = std::max(*std::max_element(done.begin(), done.end()),
                         *std::max_element(group_done.begin(), group_done.end()));
    read_values(central, layout, r.values);
    measure(set, r.seconds, r);
    for (const auto& g : gs) r.push_staleness += g->link_model().staleness();
  }
  // Stop the central server only: a link whose group server stopped first would push its
  // remaining (empty) progress once per group clock it has left, without a pause.
  asio::post(net.get_executor(), [&] { central.stop(); });
  net.run();  // the links fail, stop their group servers, and the workers end
  tr.g0 += total;
  tr.t0 += r.seconds;
  return r;
}

/// Runs phase `ps` in its mode.
template <class Model>
phase_result run_phase(const experiment& ex, std::vector<Model>& models, const phase_spec& ps,
                       std::chrono::nanoseconds compute, trace& tr) {
  switch (ps.m) {
    case mode::bsp: return run_plain<consistency::bsp>(ex, models, ps, compute, tr);
    case mode::asp: return run_plain<consistency::asp>(ex, models, ps, compute, tr);
    case mode::groups: break;
  }
  return run_groups(ex, models, ps, compute, tr);
}

// ---------------------------------------------------------------------------------------------
// Grouping and clock limits
// ---------------------------------------------------------------------------------------------

/// The groups for measured seconds per gradient `cost` (see the file comment).
group_plan make_plan(const experiment& ex, const config& c, std::span<const double> cost) {
  if (c.pol == policy::isolating) {
    std::vector<double> sorted(cost.begin(), cost.end());
    std::sort(sorted.begin(), sorted.end());
    const double median = 0.5 * (sorted[(sorted.size() - 1) / 2] + sorted[sorted.size() / 2]);
    std::vector<std::uint32_t> fast;
    std::vector<double> fast_cost;
    for (std::uint32_t w = 0; w < cost.size(); ++w)
      if (cost[w] <= ex.slow_threshold * median) {
        fast.push_back(w);
        fast_cost.push_back(cost[w]);
      }
    if (fast.size() < cost.size() && fast.size() >= c.groups - 1) {
      const group_plan f = groups_by_speed(fast_cost, c.groups - 1);
      group_plan p{c.groups, std::vector<std::uint32_t>(cost.size(), c.groups - 1)};
      for (std::size_t i = 0; i < fast.size(); ++i) p.group_of[fast[i]] = f.group_of[i];
      return p;
    }
  }
  return groups_by_speed(cost, c.groups);
}

/// Per-worker clock limits for a phase of `budget` gradients: more than any worker can do
/// before the phase is cut (a BSP worker at most budget / n + 1; a group's members at most
/// budget / |g| + 1; an ASP worker at most budget).
std::vector<std::uint64_t> clock_limits(mode m, const group_plan& plan, std::size_t n,
                                        std::uint64_t budget) {
  std::vector<std::uint64_t> clocks(n, budget);
  if (m == mode::bsp) {
    for (auto& c : clocks) c = budget / n + 2;
  } else if (m == mode::groups) {
    for (std::uint32_t g = 0; g < plan.groups; ++g) {
      const auto mem = plan.members(g);
      for (auto w : mem) clocks[w] = budget / mem.size() + 2;
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
// Runs
// ---------------------------------------------------------------------------------------------

/// What one run does: its configuration, the speeds before and after a change, and whether it
/// regroups at every phase boundary or keeps the groups of the first measurement.
struct run_setup {
  std::string kind;  // "sweep" or "regroup"
  config cfg;
  double delay = 1;            // the straggler's factor (sweep)
  std::vector<double> before;  // per-worker factors from the start
  std::vector<double> after;   // from `change_at` x N on
  double change_at = 2.0;      // > 1: never
  bool regroup_always = true;  // false: keep the groups of the first measurement
  std::string variant;         // regroup demo: "static" or "regroup"
  std::uint64_t seed = 1;
};

/// One run's record.
struct run_record {
  run_setup setup;
  std::string model;
  std::uint64_t budget = 0;
  float lr = 0;
  std::vector<phase_spec> phases;
  std::vector<phase_result> results;
  std::vector<sample> series;
  double final_metric = 0;
  double final_secondary = 0;
  double wall_seconds = 0;
};

/// The phase boundaries of a run of `budget` gradients, in gradients, increasing, last = budget.
std::vector<std::uint64_t> boundaries(const experiment& ex, const run_setup& s,
                                      std::uint64_t budget) {
  const auto at = [&](double f) {
    return static_cast<std::uint64_t>(std::llround(f * static_cast<double>(budget)));
  };
  std::vector<std::uint64_t> b{budget, at(ex.drop_at)};
  if (s.cfg.m == mode::groups) b.push_back(at(ex.measure));
  if (s.change_at < 1.0) {
    b.push_back(at(s.change_at));
    if (s.cfg.m == mode::groups) b.push_back(at(s.change_at + ex.measure));
  }
  std::sort(b.begin(), b.end());
  b.erase(std::unique(b.begin(), b.end()), b.end());
  b.erase(std::remove_if(b.begin(), b.end(), [&](auto x) { return x == 0 || x > budget; }),
          b.end());
  return b;
}

/// Runs `s` for model family `f` (phases as in the file comment).
template <class Model>
run_record run_one(const experiment& ex, const data_sets& d, const family& f, const run_setup& s) {
  const auto wall0 = std::chrono::steady_clock::now();
  run_record r;
  r.setup = s;
  r.model = f.name;
  r.budget = f.budget;
  r.lr = f.lr;
  auto models = make_models(ex, d, static_cast<const Model*>(nullptr), s.seed);
  trace tr;
  tr.every = std::max<std::uint64_t>(1, f.budget / ex.evals);
  tr.metric = quick_metric(d, static_cast<const Model*>(nullptr));
  const auto bounds = boundaries(ex, s, f.budget);
  const auto change =
      static_cast<std::uint64_t>(std::llround(s.change_at * static_cast<double>(f.budget)));
  const auto drop =
      static_cast<std::uint64_t>(std::llround(ex.drop_at * static_cast<double>(f.budget)));
  std::uint64_t from = 0;
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    phase_spec ps;
    ps.m = s.cfg.m;
    ps.speed = s.change_at < 1.0 && from >= change ? s.after : s.before;
    ps.seed = s.seed + 100 * i;
    ps.lr = from >= drop ? f.lr * static_cast<float>(ex.drop_factor) : f.lr;
    ps.budget = bounds[i] - from;
    if (ps.m == mode::groups) {
      if (i == 0)
        ps.plan = groups_by_id(ex.workers, s.cfg.groups);
      else if (i == 1 || s.regroup_always)
        ps.plan = make_plan(ex, s.cfg, r.results.back().seconds_per_clock);
      else
        ps.plan = r.phases.back().plan;
    }
    ps.clocks = clock_limits(ps.m, ps.plan, ex.workers, ps.budget);
    if (i > 0) ps.start = r.results.back().values;
    auto res = run_phase(ex, models, ps, f.compute, tr);
    const parameter_view view(models[0].tables(), res.values.data());
    res.full_metric = final_metrics(d, view, static_cast<const Model*>(nullptr)).first;
    r.phases.push_back(std::move(ps));
    r.results.push_back(std::move(res));
    from = bounds[i];
  }
  const parameter_view view(models[0].tables(), r.results.back().values.data());
  std::tie(r.final_metric, r.final_secondary) =
      final_metrics(d, view, static_cast<const Model*>(nullptr));
  if (tr.series.empty() || tr.series.back().gradients != static_cast<double>(tr.g0))
    tr.series.push_back(sample{static_cast<double>(tr.g0), tr.t0, tr.metric(view)});
  r.series = std::move(tr.series);
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return r;
}

/// Mode name for the JSON.
const char* mode_name(mode m) { return m == mode::bsp ? "bsp" : m == mode::asp ? "asp" : "groups"; }

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
        {{"mode", mode_name(ps.m)},
         {"group_of", ps.plan.group_of},
         {"speed", numbers(ps.speed, [](double x) { return x; })},
         {"lr", num(ps.lr)},
         {"budget", ps.budget},
         {"cut", pr.cut},
         {"seconds", num(pr.seconds)},
         {"clocks", pr.clocks},
         {"seconds_per_clock", numbers(pr.seconds_per_clock, [](double x) { return x; })},
         {"full_metric", num(pr.full_metric)},
         {"push_staleness", pr.push_staleness.counts},
         {"errors", pr.errors}});
  }
  const auto& s = r.setup;
  const nlohmann::json j = {
      {"kind", s.kind},
      {"model", r.model},
      {"config", s.cfg.name},
      {"mode", mode_name(s.cfg.m)},
      {"groups", s.cfg.groups},
      {"policy", s.cfg.pol == policy::isolating ? "isolating" : "by_speed"},
      {"delay", num(s.delay)},
      {"straggler", ex.straggler},
      {"variant", s.variant},
      {"change_at", num(s.change_at)},
      {"seed", s.seed},
      {"workers", ex.workers},
      {"budget", r.budget},
      {"lr", num(r.lr)},
      {"drop_at", num(ex.drop_at)},
      {"drop_factor", num(ex.drop_factor)},
      {"measure", num(ex.measure)},
      {"slow_threshold", num(ex.slow_threshold)},
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

/// Writes `r` to `out` and a summary line to stderr; returns whether it had no errors.
bool emit(std::FILE* out, const experiment& ex, const family& f, const run_record& r) {
  const std::string line = to_json(ex, f, r);
  std::fprintf(out, "%s\n", line.c_str());
  std::fflush(out);
  double total = 0;
  int errors = 0;
  for (const auto& p : r.results) {
    total += p.seconds;
    errors += p.errors;
  }
  std::string plan;
  for (auto g : r.phases.back().plan.group_of) plan += std::to_string(g);
  std::fprintf(stderr,
               "%-4s %-7s %-19s x%-4g %-9s seed %llu: %8.3f sim s, %s %.4f, groups %s%s"
               " (%.1f s wall)\n",
               r.model.c_str(), r.setup.kind.c_str(), r.setup.cfg.name.c_str(), r.setup.delay,
               r.setup.variant.c_str(), static_cast<unsigned long long>(r.setup.seed), total,
               f.metric_name.c_str(), r.final_metric, plan.empty() ? "-" : plan.c_str(),
               errors > 0 ? " ERRORS" : "", r.wall_seconds);
  return errors == 0;
}

/// The per-worker slowdown factors: all 1, `slow` workers at `factor`.
std::vector<double> profile(const experiment& ex, std::vector<std::uint32_t> slow, double factor) {
  std::vector<double> s(ex.workers, 1.0);
  for (auto w : slow) s[w] = factor;
  return s;
}

/// The delay sweep for one model family and seed: every delay x every configuration.
template <class Model>
bool sweep(std::FILE* out, const experiment& ex, const data_sets& d, const family& f,
           std::uint64_t seed) {
  bool ok = true;
  for (double delay : ex.delays) {
    for (const auto& name : ex.configs) {
      run_setup s;
      s.kind = "sweep";
      s.cfg = config_named(name);
      s.delay = delay;
      s.before = profile(ex, {ex.straggler}, delay);
      s.after = s.before;
      s.seed = seed;
      ok = emit(out, ex, f, run_one<Model>(ex, d, f, s)) && ok;
    }
  }
  return ok;
}

/// The regrouping demo for one family and seed: worker `straggler` is `demo_factor` slow from
/// the start; at `demo_change_at` x N worker `second` becomes as slow. "static" keeps the groups
/// of the first measurement; "regroup" regroups at every boundary from the speeds just measured
/// (the first after the change is the measuring window that follows it).
template <class Model>
bool regroup_demo(std::FILE* out, const experiment& ex, const data_sets& d, const family& f,
                  std::uint64_t seed) {
  bool ok = true;
  for (std::uint32_t g : {2u, 4u}) {
    for (bool always : {false, true}) {
      run_setup s;
      s.kind = "regroup";
      s.cfg = config_named(std::to_string(g) + " groups");
      s.delay = ex.demo_factor;
      s.before = profile(ex, {ex.straggler}, ex.demo_factor);
      s.after = profile(ex, {ex.straggler, ex.second}, ex.demo_factor);
      s.change_at = ex.demo_change_at;
      s.regroup_always = always;
      s.variant = always ? "regroup" : "static";
      s.seed = seed;
      ok = emit(out, ex, f, run_one<Model>(ex, d, f, s)) && ok;
    }
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
    if (ex.regroup &&
        std::find(ex.demo_models.begin(), ex.demo_models.end(), f.name) != ex.demo_models.end())
      ok = regroup_demo<Model>(out, ex, d, f, seed) && ok;
  }
  return ok;
}

// ---------------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------------

/// Prints the usage line.
void usage() {
  std::fprintf(
      stderr,
      "usage: asyncps_straggler_experiment --out FILE [--quick] [--models mlp,mf] [--seeds N]\n"
      "    [--seed0 N] [--delays 1,2,...] [--configs BSP,ASP,...] [--epochs X] [--hidden N]\n"
      "    [--mlp-lr X] [--mf-lr X] [--mf-gradients N] [--drop-at X] [--drop-factor X]\n"
      "    [--measure X] [--slow-threshold X] [--evals N] [--no-sweep] [--no-regroup]\n"
      "    [--demo-models mf,mlp] [--data DIR]\n");
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
      ex.seeds = 1;
      ex.delays = {1.0, 4.0};
    } else if (a == "--models") {
      ex.models = split_list(value());
    } else if (a == "--seeds") {
      ex.seeds = static_cast<std::uint32_t>(std::stoul(value()));
    } else if (a == "--seed0") {
      ex.seed0 = std::stoull(value());
    } else if (a == "--delays") {
      ex.delays.clear();
      for (const auto& x : split_list(value())) ex.delays.push_back(std::stod(x));
    } else if (a == "--configs") {
      ex.configs = split_list(value());
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
    } else if (a == "--drop-at") {
      ex.drop_at = std::stod(value());
    } else if (a == "--drop-factor") {
      ex.drop_factor = std::stod(value());
    } else if (a == "--measure") {
      ex.measure = std::stod(value());
    } else if (a == "--slow-threshold") {
      ex.slow_threshold = std::stod(value());
    } else if (a == "--evals") {
      ex.evals = static_cast<std::uint32_t>(std::stoul(value()));
    } else if (a == "--no-sweep") {
      ex.sweep = false;
    } else if (a == "--demo-models") {
      ex.demo_models = split_list(value());
    } else if (a == "--no-regroup") {
      ex.regroup = false;
    } else if (a == "--data") {
      ex.data_dir = value();
    } else {
      throw std::invalid_argument("unknown flag " + std::string(a));
    }
  }
  if (ex.evals == 0) throw std::invalid_argument("--evals must be > 0");
  for (double x : ex.delays)
    if (!(x > 0)) throw std::invalid_argument("--delays must be > 0");
  for (const auto& c : ex.configs) (void)config_named(c);
  if (!(ex.measure > 0 && ex.measure < ex.drop_at && ex.drop_at <= 1))
    throw std::invalid_argument("need 0 < --measure < --drop-at <= 1");
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
