// asyncps_consistency_experiment — paper D (Dai et al., "High-Performance Distributed ML at
// Scale through Parameter Server Consistency Models", AAAI 2015) in the deterministic
// simulation: matrix factorization by SGD on 8 workers over the simulated transport (virtual
// time), under BSP, SSP(s), ESSP(s), ASP and VAP, s in {1, 3, 7, 15}, with minibatches of 1%
// and 10% of each worker's ratings per clock. Results and how to regenerate them:
// docs/results/consistency.md; plots: bench/consistency_experiment.py.
//
//   asyncps_consistency_experiment --out FILE.jsonl [--quick | --vap-sweep] [--seeds N]
//       [--seed0 N] [--profiles mixed,uniform,noisy] [--batches 1,10]
//       [--policies bsp,ssp3,essp3,asp,vap] [--clocks1 N] [--clocks10 N] [--lr1 X] [--lr10 X]
//       [--vap1 V[s],..] [--vap10 V[s],..] [--evals N] [--users N] [--items N] [--count N]
//       [--rank N] [--lambda X] [--us-per-rating X] [--user-exponent X] [--item-exponent X]
//       [--init-scale X] [--link-gbit X] [--latency-us N] [--jitter-us N]
//
// Fixed work: every run computes the same number of gradients in total, workers x clocks
// (clocks = --clocks1 or --clocks10: the mean per worker), however they are split among the
// workers: a worker starts another clock only while the clocks started by all workers stay
// within that budget, so a fast worker computes more of them than a slow one (unless the
// policy holds it back). A worker that stops says bye and leaves the servers' membership
// (the servers run with elastic membership, all workers joining before the first clock), so
// the server clock, and with it every BSP/SSP/ESSP bound, no longer waits for it.
//
// --vap-sweep: the preset of the value-bound sweep (docs/results/consistency.md, "VAP"):
// compute 10x faster (1.5 us per rating: 0.2 ms per clock at 1%, shorter than a visibility
// round trip of four network hops) and links 10x faster (10 Gbit/s, so that the row
// broadcasts do not saturate them), 1% minibatches, uniform and mixed profiles, BSP, SSP(3),
// ESSP(3), ASP and VAP with bounds 0.5, 1, 2, 4, 8 (one clock's update is about 0.9) and
// 16 / sqrt(c + 1).
//
// One JSON object per run (one line each) goes to --out: the configuration, the observed
// staleness histogram (all workers' reads), the training RMSE of the servers' model sampled
// every 1/evals of the run (mean worker clock, simulated seconds, server clock), messages and
// bytes, time blocked, the distribution of the per-clock update magnitudes, wall time. A summary
// line per run goes to stderr. A run whose model diverges (a non-finite gradient: the servers
// refuse it and the workers stop) is recorded with "diverged": true; the exit status is 1 only when
// a run that did not diverge failed.
//
// Loss: the training RMSE of the global model, i.e. the concatenation of the server shards'
// current values (basic_server::values), over every training rating; evaluated whenever the
// workers together have completed another `workers * clocks / evals` clocks (so the x axis
// "clock" is the mean clock over workers: work done, comparable across policies), at that
// instant of virtual time. Pushes still in flight at that instant are not in it. Final
// figures are taken after every worker finished and every push was applied.
//
// Traffic: the model is a `sparse_gradient_source` and a `sparse_read_source`, so a worker
// pushes only the rows its minibatch touched and pulls only the rows it will read (keyed, per
// shard and table); the servers' eager (ESSP) and visibility (VAP) row pushes carry only the
// subscribed rows that changed.
#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
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
#include "asyncps/model.hpp"
#include "asyncps/server.hpp"
#include "asyncps/staleness.hpp"
#include "asyncps/transport/simulated.hpp"
#include "asyncps/worker.hpp"
#include "bench/json_output.hpp"
#include "examples/matrix_factorization/mf.hpp"

namespace asyncps::bench {
namespace {

namespace mf = asyncps::examples::mf;

/// A VAP bound of the sweep: v_thr, constant or shrinking as v_thr / sqrt(c + 1).
struct vap_bound {
  float magnitude;
  bool shrink = false;
};

/// Everything that is fixed for a sweep (data, cluster, timing, learning rates).
struct experiment {
  // Data: a synthetic Netflix-like matrix (mf::make_synthetic), 10% held out as a test set.
  std::uint32_t users = 2000;
  std::uint32_t items = 2000;
  std::uint32_t rank = 10;     // rank of the truth and of the model
  std::size_t count = 120000;  // observed entries (3%)
  float noise = 0.1f;
  double user_exponent = 0.5;  // Zipf skew of user activity (mf::synthetic_options)
  double item_exponent = 1.0;  // Zipf skew of item popularity
  double test_fraction = 0.1;
  std::uint64_t data_seed = 1;
  // Cluster.
  std::uint32_t workers = 8;
  std::uint32_t servers = 4;
  // Simulated time: compute per clock = us_per_rating * batch * speed * (1 + jitter * u).
  double us_per_rating = 15.0;
  double link_bytes_per_second = 1.25e8;  // 1 Gbit/s per node, shared egress
  std::chrono::microseconds latency{100};
  std::chrono::microseconds latency_jitter{50};
  // Training.
  // L2 coefficient at 1% minibatches; a run with b% minibatches uses lambda / b, because
  // mf_model adds lambda * row to every row a minibatch touches (once per minibatch, not per
  // rating) while the data term is a mean over the minibatch: without the scaling the penalty
  // weighs 10x more at 10% and pulls the factors to the saddle at 0.
  float lambda = 0.001f;
  float init_scale = 0.1f;  // factors start uniform in [-init_scale, init_scale]
  // Fixed work: workers * clocks gradients per run in total (mean clocks per worker).
  std::uint64_t clocks1 = 1000;  // mean clocks per worker with 1% minibatches
  std::uint64_t clocks10 = 300;  // mean clocks per worker with 10% minibatches
  // Half the best BSP rate of a grid (8 at 1%, 32 at 10%): at the best rate itself many
  // delayed runs diverge (docs/results/consistency.md, "Choices").
  float lr1 = 4.0f;          // server SGD learning rate with 1% minibatches
  float lr10 = 16.0f;        // with 10% minibatches
  std::uint32_t evals = 50;  // loss samples per run
  // Sweep.
  std::uint64_t seed0 = 1;
  std::uint32_t seeds = 1;
  std::vector<std::string> profiles{"mixed", "noisy"};
  std::vector<int> batches{1, 10};  // percent of a worker's ratings per clock
  // Policies (command-line names; empty: every clock policy, and VAP when vap1/vap10 are
  // not empty).
  std::vector<std::string> policies{};
  // VAP bounds v_thr (the worker's measure of in-transit parameter change: per server, the L2
  // norm of lr * the clock's gradient slice, summed over servers), one run per value; the
  // mean per-clock magnitude is printed per run ("|lr g|") to pick them. "s" = shrinking bound.
  // None by default: at 2 ms of compute per clock VAP's bound cannot bind (see --vap-sweep).
  std::vector<vap_bound> vap1{};
  std::vector<vap_bound> vap10{};
  std::string out = "consistency.jsonl";
};

/// A worker speed profile: per-worker slowdown factors and relative compute jitter.
struct speed_profile {
  std::string name;
  std::vector<double> speed;
  double jitter = 0.0;
};

/// The profile called `name` for `workers` workers: "mixed" repeats 1,1,1.5,1.5,2,2,3,3 with
/// 20% jitter; "uniform" is all 1x with 20% jitter (a homogeneous cluster, as in the paper);
/// "noisy" is all 1x with 100% jitter (a homogeneous cluster with large random delays).
speed_profile make_profile(std::string_view name, std::uint32_t workers) {
  speed_profile p;
  p.name = std::string(name);
  if (name == "mixed") {
    constexpr std::array<double, 8> f{1.0, 1.0, 1.5, 1.5, 2.0, 2.0, 3.0, 3.0};
    for (std::uint32_t w = 0; w < workers; ++w) p.speed.push_back(f[w % f.size()]);
    p.jitter = 0.2;
  } else if (name == "uniform") {
    p.speed.assign(workers, 1.0);
    p.jitter = 0.2;
  } else if (name == "noisy") {
    p.speed.assign(workers, 1.0);
    p.jitter = 1.0;
  } else {
    throw std::invalid_argument("unknown profile '" + p.name + "' (mixed, uniform, noisy)");
  }
  return p;
}

/// The data of a sweep: training and test ratings and each worker's shard of the training set.
struct dataset {
  mf::ratings train;
  mf::ratings test;
  std::vector<mf::ratings> shards;
};

/// Generates the synthetic matrix of `ex`, splits it and shards the training part.
dataset make_dataset(const experiment& ex) {
  mf::synthetic_options o;
  o.users = ex.users;
  o.items = ex.items;
  o.rank = ex.rank;
  o.count = ex.count;
  o.noise = ex.noise;
  o.user_exponent = ex.user_exponent;
  o.item_exponent = ex.item_exponent;
  o.seed = ex.data_seed;
  auto [train, test] = mf::split(mf::make_synthetic(o), ex.test_fraction, ex.data_seed);
  dataset d{std::move(train), std::move(test), {}};
  for (std::uint32_t w = 0; w < ex.workers; ++w)
    d.shards.push_back(mf::take_shard(d.train, w, ex.workers));
  return d;
}

/// Log-spaced histogram of per-clock update magnitudes: bucket i holds [lo * 10^(i/per_decade),
/// lo * 10^((i+1)/per_decade)); the first also holds smaller values, the last larger ones.
struct magnitude_histogram {
  static constexpr double lo = 1e-3;
  static constexpr int per_decade = 10;
  static constexpr std::size_t buckets = 60;  // 1e-3 .. 1e3
  std::array<std::uint64_t, buckets> counts{};
  void record(double x) noexcept {
    const double k = x > 0 ? std::floor(std::log10(x / lo) * per_decade) : 0.0;
    counts[static_cast<std::size_t>(std::clamp(k, 0.0, double{buckets - 1}))] += 1;
  }
  magnitude_histogram& operator+=(const magnitude_histogram& o) noexcept {
    for (std::size_t i = 0; i < buckets; ++i) counts[i] += o.counts[i];
    return *this;
  }
};

/// `mf_model` plus the norms of the gradients it writes (to size VAP thresholds relative to a
/// typical update); forwards `touched_rows` and `rows_to_read`, so like `mf_model` it is a
/// `sparse_gradient_source` and a `sparse_read_source`: the workers push and pull only the
/// rows a minibatch touches.
struct measured_model {
  mf::mf_model inner;
  float lr = 1;              // the servers' SGD step (the parameter change is lr * g)
  std::uint32_t shards = 1;  // server shards (VAP measures each shard's slice)
  double l2_sum = 0;         // sum over clocks of |g|_2
  double inf_sum = 0;        // sum over clocks of |g|_inf
  double vap_sum = 0;        // sum over clocks of the VAP magnitude (below)
  std::uint64_t n = 0;
  /// Per clock, what VAP's worker adds to its in-transit magnitude: over the shards, the sum of
  /// lr * |the clock's gradient slice of that shard|_2 (asyncps::detail::update_magnitude).
  magnitude_histogram vap_magnitude;

  /// Wraps `m`; `lr` is the servers' SGD step, `shards` the number of server shards.
  measured_model(mf::mf_model m, float lr, std::uint32_t shards)
      : inner(std::move(m)), lr(lr), shards(shards) {}

  /// The layout of the wrapped model.
  std::span<const table_spec> tables() const noexcept { return inner.tables(); }
  /// The rows the last gradient touched (so the worker pushes only those, keyed).
  std::span<const row_id> touched_rows(table_id t) const noexcept { return inner.touched_rows(t); }
  /// The rows the next gradient reads (so the worker pulls and checks only those).
  std::span<const row_id> rows_to_read(table_id t) noexcept { return inner.rows_to_read(t); }
  /// The wrapped model's gradient; records its L2 and max norm.
  float compute_gradient(const parameter_view& p, gradient_view& g) noexcept {
    const float loss = inner.compute_gradient(p, g);
    double sq = 0, mx = 0, vap = 0;
    for (table_id t = 0; t < g.tables().size(); ++t) {
      const auto m = g.table(t);
      sq += static_cast<double>(m.squaredNorm());
      mx = std::max(mx, static_cast<double>(m.cwiseAbs().maxCoeff()));
    }
    for (std::uint32_t s = 0; s < shards; ++s) {
      double part = 0;
      for (table_id t = 0; t < g.tables().size(); ++t) {
        const auto m = g.table(t);
        const key_range r = shard_range(static_cast<std::uint32_t>(m.rows()), s, shards);
        part += static_cast<double>(
            m.middleRows(static_cast<Eigen::Index>(r.begin), static_cast<Eigen::Index>(r.size()))
                .squaredNorm());
      }
      vap += lr * std::sqrt(part);
    }
    l2_sum += std::sqrt(sq);
    inf_sum += mx;
    vap_sum += vap;
    vap_magnitude.record(vap);
    ++n;
    return loss;
  }
};
static_assert(sparse_gradient_source<measured_model> && sparse_read_source<measured_model>);

/// What to run: one point of the sweep.
struct run_spec {
  std::string label;   // "ESSP(3)"
  std::string family;  // bsp, ssp, essp, asp, vap
  int staleness = 0;   // s (-1: unbounded)
  std::string profile;
  int batch_percent = 1;
  std::uint64_t clocks = 0;  // mean per worker: workers * clocks gradients in all
  float lr = 0;
  std::uint64_t seed = 1;
  float vap_threshold = 0;  // VAP only
  bool vap_shrink = false;  // VAP only
};

/// One loss sample.
struct sample {
  double clock;         // mean clock over workers (completed clocks / workers)
  double time;          // simulated seconds
  clock_value min_srv;  // smallest server clock over shards
  double rmse;          // training RMSE of the servers' model
};

/// The measurements of one run.
struct run_result {
  std::vector<sample> series;
  staleness_histogram staleness;
  std::vector<double> worker_staleness;  // mean per worker
  std::vector<double> done;              // when each worker finished (simulated s)
  std::vector<double> wait;              // seconds each worker was blocked
  std::vector<double> compute;           // seconds each worker computed
  std::vector<std::uint64_t> clocks;     // clocks each worker computed
  magnitude_histogram vap_magnitude;     // per-clock VAP update magnitudes, all workers
  worker_stats wsum{};                   // counters summed over workers
  server_stats ssum{};                   // counters summed over servers
  simulation_stats net{};
  double sim_seconds = 0;
  double final_train = 0;
  double final_test = 0;
  double update_l2 = 0;   // mean lr * |g|_2 per clock
  double update_inf = 0;  // mean lr * |g|_inf per clock
  double update_vap = 0;  // mean per-clock VAP magnitude (sum over shards of lr * |slice|_2)
  double wall_seconds = 0;
  int errors = 0;
};

/// Training RMSE and test RMSE of the model held by `servers` (shard values concatenated).
template <class Server>
std::pair<double, double> evaluate(const std::vector<std::unique_ptr<Server>>& servers,
                                   std::span<const table_spec> layout, std::vector<float>& scratch,
                                   const mf::ratings& train, const mf::ratings* test) {
  scratch.resize(layout_size(layout));
  std::size_t off = 0;
  for (table_id t = 0; t < layout.size(); ++t)
    for (const auto& s : servers) {
      const auto v = s->values(t);
      std::copy(v.begin(), v.end(), scratch.begin() + static_cast<std::ptrdiff_t>(off));
      off += v.size();
    }
  const parameter_view view(layout, scratch.data());
  return {mf::rmse(view, train), test ? mf::rmse(view, *test) : 0.0};
}

/// Adds `b`'s counters to `a`.
void accumulate(worker_stats& a, const worker_stats& b) {
  a.clocks += b.clocks;
  a.pushes += b.pushes;
  a.pulls += b.pulls;
  a.rows_messages += b.rows_messages;
  a.eager_messages += b.eager_messages;
  a.bytes_out += b.bytes_out;
  a.bytes_in += b.bytes_in;
  a.wait_seconds += b.wait_seconds;
  a.compute_seconds += b.compute_seconds;
  a.value_waits += b.value_waits;
  a.value_wait_seconds += b.value_wait_seconds;
}

/// Adds `b`'s counters to `a`.
void accumulate(server_stats& a, const server_stats& b) {
  a.pushes += b.pushes;
  a.pulls += b.pulls;
  a.deferred_pulls += b.deferred_pulls;
  a.eager_messages += b.eager_messages;
  a.bytes_in += b.bytes_in;
  a.bytes_out += b.bytes_out;
}

/// Seconds since the simulation started.
double seconds(simulated_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

/// Runs one configuration with consistency policy `Policy`; `configure(worker)` is called on
/// every worker before it starts (VAP thresholds).
template <class Policy, class Configure>
run_result simulate(const experiment& ex, const dataset& data, const run_spec& rs,
                    Configure&& configure) {
  using server_t = basic_server<simulated_transport, Policy>;
  using worker_t = basic_worker<measured_model, simulated_transport, Policy>;
  const speed_profile prof = make_profile(rs.profile, ex.workers);
  simulation_options o;
  o.seed = rs.seed;
  o.latency.base = ex.latency;
  o.latency.jitter = ex.latency_jitter;
  o.latency.bytes_per_second = ex.link_bytes_per_second;
  const auto shard_size = static_cast<double>(data.shards[0].size());
  const auto batch =
      static_cast<std::uint32_t>(std::max(1.0, std::round(shard_size * rs.batch_percent / 100.0)));
  o.compute.base = std::chrono::nanoseconds(
      static_cast<std::int64_t>(ex.us_per_rating * 1e3 * static_cast<double>(batch)));
  o.compute.speed_factor = prof.speed;
  o.compute.jitter = prof.jitter;

  const auto wall0 = std::chrono::steady_clock::now();
  run_result r;
  {
    simulated_network net(o);
    const auto quiet = [](std::string_view) {};
    std::vector<measured_model> models;
    models.reserve(ex.workers);
    for (std::uint32_t w = 0; w < ex.workers; ++w)
      models.emplace_back(mf::mf_model(data.shards[w], ex.rank, batch,
                                       ex.lambda / static_cast<float>(rs.batch_percent),
                                       rs.seed * 1000 + w, ex.init_scale),
                          rs.lr, ex.servers);
    const std::span<const table_spec> layout = models[0].tables();

    std::vector<std::unique_ptr<simulated_transport>> sts;
    std::vector<std::unique_ptr<server_t>> servers;
    std::vector<std::string> eps;
    for (std::uint32_t s = 0; s < ex.servers; ++s) {
      sts.push_back(std::make_unique<simulated_transport>(net, "server" + std::to_string(s)));
      server_options so;
      so.shard = s;
      so.num_shards = ex.servers;
      so.num_workers = ex.workers;
      so.tables = {layout[mf::mf_model::user_table], layout[mf::mf_model::item_table]};
      so.seed = rs.seed;
      // Elastic membership: a worker whose share of the fixed work is done says bye and
      // leaves, so the server clock (every clock bound) stops waiting for it. All workers
      // join before the server clock first advances.
      so.elastic = membership_options{.start_members = ex.workers};
      so.log = quiet;
      servers.push_back(std::make_unique<server_t>(*sts.back(), so, optimizer::sgd{rs.lr}));
      eps.push_back("shard" + std::to_string(s));
      auto acc = sts.back()->listen(eps.back());
      if (!acc) throw std::runtime_error("listen failed");
      asio::co_spawn(net.get_executor(), servers.back()->async_serve(std::move(acc).value()),
                     asio::detached);
    }

    std::vector<float> scratch;
    std::uint64_t total = 0;  // clocks completed by all workers
    const std::uint64_t budget = ex.workers * rs.clocks;
    std::uint32_t active = ex.workers;  // workers that have not stopped (each is in a clock)
    const std::uint64_t every =
        std::max<std::uint64_t>(1, budget / std::max<std::uint32_t>(1, ex.evals));
    const auto record = [&] {
      clock_value m = servers[0]->clock();
      for (const auto& s : servers) m = std::min(m, s->clock());
      const double loss = evaluate(servers, layout, scratch, data.train, nullptr).first;
      r.series.push_back(
          sample{static_cast<double>(total) / ex.workers, seconds(net.now()), m, loss});
    };
    record();

    std::vector<std::unique_ptr<simulated_transport>> wts;
    std::vector<std::unique_ptr<worker_t>> ws;
    r.done.assign(ex.workers, 0.0);
    for (std::uint32_t w = 0; w < ex.workers; ++w) {
      wts.push_back(std::make_unique<simulated_transport>(net, "worker" + std::to_string(w)));
      typename worker_t::options_type wo;
      wo.id = w;
      wo.servers = eps;
      wo.local_step = rs.lr;
      wo.log = quiet;
      // Fixed work: a worker that ends a clock starts another only while the clocks completed
      // plus those in progress (one per other active worker) plus its next stay within the
      // budget; otherwise it stops now (basic_worker::stop_at its current clock). Every clock
      // started is finished, so exactly `budget` gradients are computed.
      wo.on_clock = [&, w](const clock_report&) {
        if (++total % every == 0) record();
        if (total + active > budget) {
          --active;
          ws[w]->stop_at(ws[w]->clock());
        }
      };
      ws.push_back(std::make_unique<worker_t>(*wts.back(), models[w], wo,
                                              asio::any_io_executor(net.compute_executor(w))));
      configure(*ws.back());
      asio::co_spawn(
          net.get_executor(),
          [&, w]() -> asio::awaitable<void> {
            // At most the whole budget; the fixed-work rule above stops it sooner.
            if (co_await ws[w]->async_run(budget)) ++r.errors;
            r.done[w] = seconds(net.now());
          },
          asio::detached);
    }
    net.run();
    r.sim_seconds = seconds(net.now());
    asio::post(net.get_executor(), [&] {
      for (auto& s : servers) s->stop();
    });
    net.run();
    if (total % every != 0) record();
    std::tie(r.final_train, r.final_test) =
        evaluate(servers, layout, scratch, data.train, &data.test);
    double l2 = 0, inf = 0, vap = 0, n = 0;
    for (std::uint32_t w = 0; w < ex.workers; ++w) {
      r.staleness += ws[w]->staleness();
      r.worker_staleness.push_back(ws[w]->staleness().mean());
      accumulate(r.wsum, ws[w]->stats());
      r.wait.push_back(ws[w]->stats().wait_seconds);
      r.compute.push_back(ws[w]->stats().compute_seconds);
      r.clocks.push_back(ws[w]->stats().clocks);
      r.vap_magnitude += models[w].vap_magnitude;
      l2 += models[w].l2_sum;
      inf += models[w].inf_sum;
      vap += models[w].vap_sum;
      n += static_cast<double>(models[w].n);
    }
    r.update_l2 = n > 0 ? rs.lr * l2 / n : 0;
    r.update_inf = n > 0 ? rs.lr * inf / n : 0;
    r.update_vap = n > 0 ? vap / n : 0;
    for (const auto& s : servers) accumulate(r.ssum, s->stats());
    r.net = net.stats();
  }
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return r;
}

// ---------------------------------------------------------------------------------------------
// JSON output
// ---------------------------------------------------------------------------------------------

/// `x` with up to 6 significant digits, for labels ("1.5", "0.25").
std::string short_number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

/// The JSON line of one run.
std::string to_json(const experiment& ex, const run_spec& rs, const run_result& r) {
  const auto same = [](double x) { return x; };
  double done_sum = 0, wait_sum = 0;
  for (std::size_t w = 0; w < r.done.size(); ++w) {
    done_sum += r.done[w];
    wait_sum += r.wait[w];
  }
  const nlohmann::json j = {
      {"label", rs.label},
      {"family", rs.family},
      {"s", rs.staleness},
      {"profile", rs.profile},
      {"batch_percent", rs.batch_percent},
      {"seed", rs.seed},
      {"clocks", rs.clocks},
      {"total_clocks", ex.workers * rs.clocks},
      {"worker_clocks", r.clocks},
      {"lr", num(rs.lr)},
      {"vap_threshold", num(rs.vap_threshold)},
      {"vap_shrink", rs.vap_shrink},
      {"workers", ex.workers},
      {"servers", ex.servers},
      {"users", ex.users},
      {"items", ex.items},
      {"rank", ex.rank},
      {"ratings", ex.count},
      {"user_exponent", num(ex.user_exponent)},
      {"item_exponent", num(ex.item_exponent)},
      {"lambda", num(ex.lambda)},
      {"init_scale", num(ex.init_scale)},
      {"us_per_rating", num(ex.us_per_rating)},
      {"link_bytes_per_second", num(ex.link_bytes_per_second)},
      {"latency_us", ex.latency.count()},
      {"latency_jitter_us", ex.latency_jitter.count()},
      {"staleness", r.staleness.counts},
      {"staleness_mean", num(r.staleness.mean())},
      {"staleness_per_worker", numbers(r.worker_staleness, same)},
      {"series",
       {{"clock", numbers(r.series, [](const sample& x) { return x.clock; })},
        {"time", numbers(r.series, [](const sample& x) { return x.time; })},
        {"server_clock", numbers(r.series, [](const sample& x) { return x.min_srv; })},
        {"rmse", numbers(r.series, [](const sample& x) { return x.rmse; })}}},
      {"final_train_rmse", num(r.final_train)},
      {"final_test_rmse", num(r.final_test)},
      {"sim_seconds", num(r.sim_seconds)},
      {"worker_done", numbers(r.done, same)},
      {"wait_seconds", numbers(r.wait, same)},
      {"compute_seconds", numbers(r.compute, same)},
      {"wait_fraction", num(done_sum > 0 ? wait_sum / done_sum : 0)},
      {"messages", r.net.messages},
      {"bytes", r.net.bytes},
      {"worker_pushes", r.wsum.pushes},
      {"worker_pulls", r.wsum.pulls},
      {"rows_messages", r.wsum.rows_messages},
      {"eager_messages", r.wsum.eager_messages},
      {"worker_bytes_out", r.wsum.bytes_out},
      {"worker_bytes_in", r.wsum.bytes_in},
      {"server_deferred_pulls", r.ssum.deferred_pulls},
      {"value_waits", r.wsum.value_waits},
      {"value_wait_seconds", num(r.wsum.value_wait_seconds)},
      {"diverged", !std::isfinite(r.final_train)},
      {"update_l2", num(r.update_l2)},
      {"update_inf", num(r.update_inf)},
      {"update_vap", num(r.update_vap)},
      {"vap_magnitude_hist",
       {{"lo", magnitude_histogram::lo},
        {"per_decade", magnitude_histogram::per_decade},
        {"counts", r.vap_magnitude.counts}}},
      {"wall_seconds", num(r.wall_seconds)},
      {"errors", r.errors}};
  return j.dump();
}

// ---------------------------------------------------------------------------------------------
// The sweep
// ---------------------------------------------------------------------------------------------

/// A policy of the sweep: its label, family, staleness and how to run it.
struct policy_entry {
  std::string_view label;  // command-line name
  std::string_view family;
  int staleness;
  run_result (*run)(const experiment&, const dataset&, const run_spec&);
};

/// `simulate` for a policy that needs no configuration.
template <class Policy>
run_result run_plain(const experiment& ex, const dataset& data, const run_spec& rs) {
  return simulate<Policy>(ex, data, rs, [](auto&) {});
}

/// Every clock-bounded policy of the sweep, in report order.
constexpr std::array<policy_entry, 10> clock_policies{{
    {"bsp", "bsp", 0, &run_plain<consistency::bsp>},
    {"ssp1", "ssp", 1, &run_plain<consistency::ssp<1>>},
    {"ssp3", "ssp", 3, &run_plain<consistency::ssp<3>>},
    {"ssp7", "ssp", 7, &run_plain<consistency::ssp<7>>},
    {"ssp15", "ssp", 15, &run_plain<consistency::ssp<15>>},
    {"essp1", "essp", 1, &run_plain<consistency::essp<1>>},
    {"essp3", "essp", 3, &run_plain<consistency::essp<3>>},
    {"essp7", "essp", 7, &run_plain<consistency::essp<7>>},
    {"essp15", "essp", 15, &run_plain<consistency::essp<15>>},
    {"asp", "asp", -1, &run_plain<consistency::asp>},
}};

/// `simulate` for VAP with bound `rs.vap_threshold` (shrinking when `rs.vap_shrink`).
run_result run_vap(const experiment& ex, const dataset& data, const run_spec& rs) {
  return simulate<consistency::vap>(ex, data, rs, [&](auto& worker) {
    worker.consistency().magnitude = rs.vap_threshold;
    worker.consistency().shrink = rs.vap_shrink;
  });
}

/// "ESSP(3)", "BSP", ... for an entry.
std::string display_label(std::string_view family, int s) {
  std::string f(family);
  for (auto& c : f) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s > 0 ? f + "(" + std::to_string(s) + ")" : f;
}

/// Splits "a,b,c".
std::vector<std::string> split_list(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const auto k = s.find(',');
    out.emplace_back(s.substr(0, k));
    if (k == std::string_view::npos) break;
    s.remove_prefix(k + 1);
  }
  return out;
}

[[noreturn]] void usage() {
  std::fprintf(
      stderr,
      "usage: asyncps_consistency_experiment --out FILE [--quick | --vap-sweep] [--seeds N] "
      "[--seed0 N]\n"
      "    [--profiles mixed,uniform,noisy] [--batches 1,10] [--policies bsp,ssp3,...,vap]\n"
      "    [--clocks1 N] [--clocks10 N] [--lr1 X] [--lr10 X] [--vap1 V[s],..] [--vap10 V[s],..]\n"
      "    [--evals N] [--users N] [--items N] [--count N] [--rank N] [--lambda X]\n"
      "    [--us-per-rating X] [--user-exponent X] [--item-exponent X] "
      "[--init-scale X]\n"
      "    [--link-gbit X] [--latency-us N] [--jitter-us N]\n");
  std::exit(2);
}

/// Parses the command line into an experiment.
experiment parse(int argc, char** argv) {
  experiment ex;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto next = [&]() -> std::string_view {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    const auto uint = [&] { return std::strtoull(next().data(), nullptr, 10); };
    const auto real = [&] { return std::strtod(next().data(), nullptr); };
    if (a == "--out") {
      ex.out = next();
    } else if (a == "--quick") {
      ex.users = 300;
      ex.items = 300;
      ex.count = 9000;
      ex.clocks1 = 60;
      ex.clocks10 = 20;
      ex.lr1 = 0.5f;
      ex.lr10 = 2.0f;
      ex.vap1 = {{0.2f}, {0.5f, true}};
      ex.vap10 = {{0.2f}, {0.5f, true}};
      ex.servers = 2;
      ex.evals = 10;
      ex.profiles = {"mixed"};
    } else if (a == "--vap-sweep") {
      ex.us_per_rating = 1.5;
      ex.link_bytes_per_second = 1.25e9;
      ex.batches = {1};
      ex.profiles = {"uniform", "mixed"};
      ex.policies = {"bsp", "ssp3", "essp3", "asp", "vap"};
      ex.vap1 = {{0.5f}, {1.0f}, {2.0f}, {4.0f}, {8.0f}, {16.0f, true}};
    } else if (a == "--seeds") {
      ex.seeds = static_cast<std::uint32_t>(uint());
    } else if (a == "--seed0") {
      ex.seed0 = uint();
    } else if (a == "--profiles") {
      ex.profiles = split_list(next());
    } else if (a == "--batches") {
      ex.batches.clear();
      for (const auto& b : split_list(next())) ex.batches.push_back(std::atoi(b.c_str()));
    } else if (a == "--policies") {
      ex.policies = split_list(next());
    } else if (a == "--clocks1") {
      ex.clocks1 = uint();
    } else if (a == "--clocks10") {
      ex.clocks10 = uint();
    } else if (a == "--lr1") {
      ex.lr1 = static_cast<float>(real());
    } else if (a == "--lr10") {
      ex.lr10 = static_cast<float>(real());
    } else if (a == "--vap1" || a == "--vap10") {
      auto& v = a == "--vap1" ? ex.vap1 : ex.vap10;
      v.clear();
      for (const auto& t : split_list(next()))
        v.push_back(
            {static_cast<float>(std::strtod(t.c_str(), nullptr)), !t.empty() && t.back() == 's'});
    } else if (a == "--evals") {
      ex.evals = static_cast<std::uint32_t>(uint());
    } else if (a == "--users") {
      ex.users = static_cast<std::uint32_t>(uint());
    } else if (a == "--items") {
      ex.items = static_cast<std::uint32_t>(uint());
    } else if (a == "--count") {
      ex.count = uint();
    } else if (a == "--rank") {
      ex.rank = static_cast<std::uint32_t>(uint());
    } else if (a == "--user-exponent") {
      ex.user_exponent = real();
    } else if (a == "--item-exponent") {
      ex.item_exponent = real();
    } else if (a == "--init-scale") {
      ex.init_scale = static_cast<float>(real());
    } else if (a == "--lambda") {
      ex.lambda = static_cast<float>(real());
    } else if (a == "--us-per-rating") {
      ex.us_per_rating = real();
    } else if (a == "--link-gbit") {
      ex.link_bytes_per_second = real() * 1e9 / 8;
    } else if (a == "--latency-us") {
      ex.latency = std::chrono::microseconds(uint());
    } else if (a == "--jitter-us") {
      ex.latency_jitter = std::chrono::microseconds(uint());
    } else {
      usage();
    }
  }
  for (int b : ex.batches)
    if (b <= 0 || b > 100) usage();
  return ex;
}

/// Whether `label` was selected on the command line (all when none was).
bool selected(const experiment& ex, std::string_view label) {
  return ex.policies.empty() ||
         std::find(ex.policies.begin(), ex.policies.end(), label) != ex.policies.end();
}

/// Runs the sweep and writes its JSON lines.
int main_impl(int argc, char** argv) {
  const experiment ex = parse(argc, argv);
  const dataset data = make_dataset(ex);
  std::FILE* out = std::fopen(ex.out.c_str(), "w");
  if (out == nullptr) throw std::runtime_error("cannot open " + ex.out);
  std::fprintf(stderr,
               "data: %u x %u, rank %u, %zu ratings (%zu train, %zu test), %u workers (%zu "
               "ratings each), %u servers\n",
               ex.users, ex.items, ex.rank, ex.count, data.train.size(), data.test.size(),
               ex.workers, data.shards[0].size(), ex.servers);
  int errors = 0;  // failed runs that did not diverge
  const auto report = [&](const run_spec& rs, const run_result& r) {
    std::fprintf(out, "%s\n", to_json(ex, rs, r).c_str());
    std::fflush(out);
    std::fprintf(stderr,
                 "%-8s %3d%% %-10s seed %llu: train rmse %.4f test %.4f, sim %.3f s, staleness "
                 "%.2f, wait %.3f s, %llu msgs, %.1f MB, |lr g| %.3g (max %.3g), wall %.2f s%s\n",
                 rs.profile.c_str(), rs.batch_percent, rs.label.c_str(),
                 static_cast<unsigned long long>(rs.seed), r.final_train, r.final_test,
                 r.sim_seconds, r.staleness.mean(), r.wsum.wait_seconds,
                 static_cast<unsigned long long>(r.net.messages),
                 static_cast<double>(r.net.bytes) / 1e6, r.update_l2, r.update_inf, r.wall_seconds,
                 !std::isfinite(r.final_train) ? "  DIVERGED" : (r.errors ? "  ERRORS" : ""));
    if (std::isfinite(r.final_train)) errors += r.errors;
  };
  for (const auto& profile : ex.profiles) {
    for (const int b : ex.batches) {
      for (std::uint32_t k = 0; k < ex.seeds; ++k) {
        run_spec base;
        base.profile = profile;
        base.batch_percent = b;
        base.clocks = b == 1 ? ex.clocks1 : ex.clocks10;
        base.lr = b == 1 ? ex.lr1 : ex.lr10;
        base.seed = ex.seed0 + k;
        for (const auto& p : clock_policies) {
          if (!selected(ex, p.label)) continue;
          run_spec rs = base;
          rs.family = p.family;
          rs.staleness = p.staleness;
          rs.label = display_label(p.family, p.staleness);
          report(rs, p.run(ex, data, rs));
        }
        if (!selected(ex, "vap")) continue;
        for (const vap_bound& v : b == 1 ? ex.vap1 : ex.vap10) {
          run_spec rs = base;
          rs.family = "vap";
          rs.staleness = -1;
          rs.vap_threshold = v.magnitude;
          rs.vap_shrink = v.shrink;
          rs.label = "VAP(" + short_number(v.magnitude) + (v.shrink ? "/sqrt(c+1))" : ")");
          report(rs, run_vap(ex, data, rs));
        }
      }
    }
  }
  std::fclose(out);
  return errors == 0 ? 0 : 1;
}

}  // namespace
}  // namespace asyncps::bench

/// Entry point: runs the sweep; exit status 1 when a run failed, 2 on bad arguments.
int main(int argc, char** argv) {
  try {
    return asyncps::bench::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "asyncps_consistency_experiment: %s\n", e.what());
    return 1;
  }
}
