// The simulated transport (virtual time) running the unchanged server and worker templates:
// reproducibility from a seed, the consistency bounds over 2000 random schedules (latencies,
// bandwidths, speed profiles 1x..4x; BSP, SSP(1), SSP(3), ESSP(1), ESSP(3), ASP; and the
// run-time bounds ssp<>/essp<> against them on 400 more), faults from a
// schedule (recovery::none and recovery::stateless), the virtual duration of BSP, elastic
// membership over 1000 random join/leave/death/restart schedules, and the transport's own
// semantics (its send buffer's flow control included). Every read is checked by the counter model
// (tests/support/counter_model.hpp), or in the elastic runs by `clock_column_model` against the
// bound over the live members. A failing schedule prints its policy and seed: replay it with
// `simulate<Policy>(random_config(seed, bound))` or
// `simulate_elastic<Policy>(random_elastic_config(seed, bound))`. The whole file runs in ~2 s
// at -O2, the elastic schedules about a sixth of it. Unoptimised (the clang-asan stage, -O0)
// the random tests run a quarter of their schedules (tests/support/build_mode.hpp).
#include <algorithm>
#include <array>
#include <bitset>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <doctest/doctest.h>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/wait_group.hpp"
#include "asyncps/recovery/none.hpp"
#include "asyncps/recovery/stateless.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/simulated.hpp"
#include "asyncps/update_rule.hpp"
#include "asyncps/worker.hpp"
#include "bench/sim_cluster.hpp"
#include "build_mode.hpp"
#include "counter_model.hpp"
#include "examples/tutorial/linear_regression.hpp"

using namespace asyncps;
using namespace std::chrono_literals;

namespace {

struct sim_config {
  std::uint32_t workers = 4;
  std::uint32_t shards = 2;
  std::uint64_t clocks = 30;
  std::int64_t bound = 0;  // the counter model's staleness bound (-1: none, ASP)
  simulation_options net{};
  // Called before the run (faults, scheduled actions).
  std::function<void(simulated_network&)> setup{};
  float vap_magnitude = 0;                     // consistency::vap's bound (when the policy is vap)
  std::uint32_t width = 4;                     // the counter model's row width (floats)
  std::optional<std::uint32_t> push_window{};  // worker_options::push_window
};

struct sim_result {
  std::vector<std::vector<float>> params;  // per shard: the server's values of table 0
  std::vector<clock_value> server_clocks;
  std::vector<std::int64_t> model_clocks;         // clocks each model computed
  std::vector<std::error_code> errors;            // per worker
  std::vector<simulated_clock::time_point> done;  // when each worker's run completed
  std::vector<double> compute_seconds;            // per worker (virtual)
  std::vector<worker_stats> workers;
  std::vector<recovery::stateless_worker_stats> stateless_workers;  // recovery::stateless
  std::vector<server_stats> servers;
  std::vector<recovery::stateless_stats> stateless_servers;  // recovery::stateless
  simulated_clock::time_point end{};  // virtual time when the workers' run was quiescent
  std::int64_t bound_violations = 0;
  std::int64_t own_write_violations = 0;
  std::int64_t max_lag = 0;
  std::int64_t max_missing = 0;  // most updates of another worker a read lacked
  staleness_histogram staleness;
  simulation_stats stats{};
  bool all_done = false;    // every worker's async_run completed
  bool all_served = false;  // every server's async_serve completed after stop()
};

// Runs `cfg.workers` counter-model workers against `cfg.shards` servers on a simulated
// network: servers on nodes "server<s>" listening at "shard<s>", workers on "worker<w>".
template <class Policy, class Recovery = recovery::none, class Model = test::counter_model>
sim_result simulate(const sim_config& cfg, typename Recovery::server_part server_part = {}) {
  using server_t = basic_server<simulated_transport, Policy, Recovery>;
  using worker_t = basic_worker<Model, simulated_transport, Policy, Recovery>;
  simulated_network net(cfg.net);
  if (cfg.setup) cfg.setup(net);
  std::vector<Model> models;
  // When each worker computed each of its updates (virtual time), to count at every read the
  // updates of other workers computed before the reader's snapshot that it lacks.
  std::vector<std::vector<simulated_clock::time_point>> generated(cfg.workers);
  models.reserve(cfg.workers);
  for (std::uint32_t w = 0; w < cfg.workers; ++w) {
    models.emplace_back(w, cfg.workers, cfg.bound, cfg.width, cfg.net.seed, 0);
    models.back().on_generated = [&](std::uint32_t id) { generated[id].push_back(net.now()); };
    models.back().generated_before_read = [&](std::uint32_t reader, std::uint32_t writer) {
      const auto& g = generated[writer];
      return static_cast<std::int64_t>(
          std::upper_bound(g.begin(), g.end(), net.compute_started(reader)) - g.begin());
    };
  }
  const auto quiet = [](std::string_view) {};

  std::vector<std::unique_ptr<simulated_transport>> sts;
  std::vector<std::unique_ptr<server_t>> servers;
  std::vector<std::string> eps;
  int served = 0;
  for (std::uint32_t s = 0; s < cfg.shards; ++s) {
    sts.push_back(std::make_unique<simulated_transport>(net, "server" + std::to_string(s)));
    server_options so;
    so.shard = s;
    so.num_shards = cfg.shards;
    so.num_workers = cfg.workers;
    so.tables = {models[0].spec[0]};
    so.log = quiet;
    servers.push_back(
        std::make_unique<server_t>(*sts.back(), so, optimizer::sgd{1.0f}, server_part));
    eps.push_back("shard" + std::to_string(s));
    auto acc = sts.back()->listen(eps.back());
    REQUIRE(acc.has_value());
    asio::co_spawn(
        net.get_executor(),
        [&served, &server = *servers.back(),
         a = std::move(acc).value()]() mutable -> asio::awaitable<void> {
          (void)co_await server.async_serve(std::move(a));
          ++served;
        },
        asio::detached);
  }

  sim_result r;
  r.errors.resize(cfg.workers);
  r.done.resize(cfg.workers);
  std::vector<std::unique_ptr<simulated_transport>> wts;
  std::vector<std::unique_ptr<worker_t>> ws;
  std::uint32_t done = 0;
  for (std::uint32_t w = 0; w < cfg.workers; ++w) {
    wts.push_back(std::make_unique<simulated_transport>(net, "worker" + std::to_string(w)));
    typename worker_t::options_type o;
    o.id = w;
    o.servers = eps;
    o.local_step = 1.0f;
    o.push_window = cfg.push_window;
    o.log = quiet;
    ws.push_back(std::make_unique<worker_t>(*wts.back(), models[w], o,
                                            asio::any_io_executor(net.compute_executor(w))));
    if constexpr (is_value_bounded_v<Policy>)
      ws.back()->consistency().magnitude = cfg.vap_magnitude;
    // ssp<>/essp<>: the bound is set at run time, to the counter model's.
    if constexpr (requires(Policy& p) { p.staleness = clock_value{}; })
      ws.back()->consistency().staleness = cfg.bound;
    asio::co_spawn(
        net.get_executor(),
        [&, w]() -> asio::awaitable<void> {
          r.errors[w] = co_await ws[w]->async_run(cfg.clocks);
          r.done[w] = simulated_clock::now();
          ++done;
        },
        asio::detached);
  }
  net.run();  // until quiescent: the workers are done (or stuck: all_done says which)
  r.end = net.now();
  r.all_done = done == cfg.workers;
  asio::post(net.get_executor(), [&] {
    for (auto& s : servers) s->stop();
  });
  net.run();
  r.all_served = served == static_cast<int>(cfg.shards);

  for (std::uint32_t s = 0; s < cfg.shards; ++s) {
    const auto v = servers[s]->values(0);
    r.params.emplace_back(v.begin(), v.end());
    r.server_clocks.push_back(servers[s]->clock());
    r.servers.push_back(servers[s]->stats());
    if constexpr (std::is_same_v<Recovery, recovery::stateless>)
      r.stateless_servers.push_back(servers[s]->recovery().stats());
  }
  for (std::uint32_t w = 0; w < cfg.workers; ++w) {
    r.model_clocks.push_back(models[w].clock);
    r.bound_violations += models[w].bound_violations;
    r.own_write_violations += models[w].own_write_violations;
    r.max_lag = std::max(r.max_lag, models[w].max_lag);
    r.max_missing = std::max(r.max_missing, models[w].max_missing);
    r.staleness += ws[w]->staleness();
    r.workers.push_back(ws[w]->stats());
    if constexpr (std::is_same_v<Recovery, recovery::stateless>)
      r.stateless_workers.push_back(ws[w]->recovery().stats());
    r.compute_seconds.push_back(ws[w]->stats().compute_seconds);
  }
  r.stats = net.stats();
  return r;
}

// A random schedule drawn from `seed`: 2..8 workers, 1..4 shards (a shard may own no rows),
// 15..30 clocks, latency 10 us..2 ms with jitter up to 2 ms, bandwidth 100 MB/s..10 GB/s, one
// interface per node or per connection, compute 1..20 ms with jitter up to 50 %, and a speed
// profile of factors in [1, 4].
sim_config random_config(std::uint64_t seed, std::int64_t bound) {
  std::mt19937_64 g(seed * 0x9e3779b97f4a7c15ull + 12345);
  auto uniform = [&](double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(g() >> 11) * 0x1.0p-53;
  };
  auto ns = [](double seconds) { return std::chrono::nanoseconds(std::llround(seconds * 1e9)); };
  sim_config c;
  c.workers = 2 + static_cast<std::uint32_t>(g() % 7);
  c.shards = 1 + static_cast<std::uint32_t>(g() % 4);
  c.clocks = 15 + g() % 16;
  c.bound = bound;
  c.net.seed = seed;
  c.net.latency.base = ns(uniform(10e-6, 2e-3));
  c.net.latency.jitter = ns(uniform(0, 2e-3));
  c.net.latency.bytes_per_second = uniform(1e8, 1e10);
  c.net.latency.shared_egress = g() % 2 == 0;
  c.net.compute.base = ns(uniform(1e-3, 20e-3));
  c.net.compute.jitter = uniform(0, 0.5);
  for (std::uint32_t w = 0; w < c.workers; ++w)
    c.net.compute.speed_factor.push_back(uniform(1.0, 4.0));
  return c;
}

std::string describe(const sim_config& c) {
  std::string s = std::to_string(c.workers) + " workers, " + std::to_string(c.shards) +
                  " shards, latency " + std::to_string(c.net.latency.base.count()) + " ns + " +
                  std::to_string(c.net.latency.jitter.count()) + " ns jitter, compute " +
                  std::to_string(c.net.compute.base.count()) + " ns, speeds";
  for (double f : c.net.compute.speed_factor) s += " " + std::to_string(f);
  return s;
}

// Runs `seeds` random schedules of `Policy` (bound `bound`, -1 for none) and checks every read.
// Returns the staleness observed over all of them. With the sparse counter model (sparse
// reads, rows of 16 floats) every row read is checked, and the pulls are counted in `pulls`.
template <class Policy, class Model = test::counter_model>
staleness_histogram check_schedules(std::string_view policy, std::int64_t bound,
                                    std::uint64_t first, std::uint64_t seeds,
                                    worker_stats* pulls = nullptr) {
  staleness_histogram all;
  for (std::uint64_t seed = first; seed < first + seeds; ++seed) {
    sim_config cfg = random_config(seed, bound);
    if constexpr (sparse_read_source<Model>) cfg.width = 16;
    INFO("replay: policy " << policy << ", seed " << seed << " (" << describe(cfg) << ")");
    const sim_result r = simulate<Policy, recovery::none, Model>(cfg);
    REQUIRE(r.all_done);
    CHECK(r.all_served);
    for (const auto& ec : r.errors) CHECK_MESSAGE(!ec, ec.message());
    CHECK(r.own_write_violations == 0);
    for (auto c : r.server_clocks) CHECK(c == static_cast<clock_value>(cfg.clocks));
    // Every push applied exactly once: row w of table 0 counts worker w's clocks.
    for (std::uint32_t s = 0; s < cfg.shards; ++s) {
      const auto range = shard_range(cfg.workers, s, cfg.shards);
      for (row_id row = range.begin; row < range.end; ++row)
        CHECK(r.params[s][std::size_t{row - range.begin} * cfg.width] ==
              static_cast<float>(cfg.clocks));
    }
    if (bound >= 0) {
      CHECK(r.bound_violations == 0);
      CHECK(r.staleness.max() <= bound);
      CHECK(r.max_lag <= 2 * bound + 1);
    }
    all += r.staleness;
    if (pulls != nullptr) {
      for (const auto& w : r.workers) {
        pulls->pulls += w.pulls;
        pulls->sparse_pulls += w.sparse_pulls;
        pulls->eager_messages += w.eager_messages;
      }
    }
  }
  MESSAGE(policy << ": " << seeds << " schedules, staleness " << all.to_string());
  return all;
}

}  // namespace

TEST_CASE("simulation: the same seed gives bit-identical runs; another seed other timings") {
  auto config = [](std::uint64_t seed) {
    sim_config c;
    c.workers = 5;
    c.shards = 2;
    c.clocks = 25;
    c.bound = 2;
    c.net.seed = seed;
    c.net.latency.base = 200us;
    c.net.latency.jitter = 300us;
    c.net.compute.base = 5ms;
    c.net.compute.jitter = 0.4;
    c.net.compute.speed_factor = {1, 1, 2, 3, 4};
    return c;
  };
  const auto a = simulate<consistency::ssp<2>>(config(7));
  const auto b = simulate<consistency::ssp<2>>(config(7));
  const auto c = simulate<consistency::ssp<2>>(config(8));
  for (const auto* r : {&a, &b, &c}) {
    REQUIRE(r->all_done);
    CHECK(r->bound_violations == 0);
    for (const auto& ec : r->errors) CHECK(!ec);
  }
  // Bit-identical: parameters, clocks, timings, staleness, traffic.
  REQUIRE(a.params.size() == b.params.size());
  for (std::size_t s = 0; s < a.params.size(); ++s) {
    REQUIRE(a.params[s].size() == b.params[s].size());
    CHECK(std::memcmp(a.params[s].data(), b.params[s].data(), a.params[s].size() * 4) == 0);
  }
  CHECK(a.model_clocks == b.model_clocks);
  CHECK(a.server_clocks == b.server_clocks);
  CHECK(a.done == b.done);
  CHECK(a.end == b.end);
  CHECK(a.compute_seconds == b.compute_seconds);
  CHECK(a.staleness.counts == b.staleness.counts);
  CHECK(a.stats.events == b.stats.events);
  CHECK(a.stats.messages == b.stats.messages);
  CHECK(a.stats.bytes == b.stats.bytes);
  // Another seed: the same training result (every push counted) on another schedule.
  CHECK(a.params == c.params);
  CHECK(a.end != c.end);
  CHECK(a.done != c.done);
  MESSAGE("seed 7: virtual end " << std::chrono::duration<double>(a.end.time_since_epoch()).count()
                                 << " s; seed 8: "
                                 << std::chrono::duration<double>(c.end.time_since_epoch()).count()
                                 << " s; " << a.stats.events << " events");
}

TEST_CASE("simulation: consistency bounds hold on every read over 1800 random schedules (450 "
          "unoptimised)") {
  // Seeds are disjoint per policy, so every schedule is different. The schedules reach each
  // bound (the largest staleness observed is the bound itself), so the checks are not vacuous.
  constexpr std::uint64_t n = test::random_runs(300);
  CHECK(check_schedules<consistency::bsp>("bsp", 0, 100000, n).max() == 0);
  CHECK(check_schedules<consistency::ssp<1>>("ssp<1>", 1, 200000, n).max() == 1);
  CHECK(check_schedules<consistency::ssp<3>>("ssp<3>", 3, 300000, n).max() == 3);
  CHECK(check_schedules<consistency::essp<1>>("essp<1>", 1, 400000, n).max() == 1);
  CHECK(check_schedules<consistency::essp<3>>("essp<3>", 3, 500000, n).max() == 3);
  check_schedules<consistency::asp>("asp", -1, 600000, n);
}

// The compile-time policies ssp<S>/essp<S> and the run-time ones ssp<>/essp<> with staleness S
// give the same answers on a grid of clocks; a negative run-time bound reads as 0.
template <clock_value S>
int run_time_decision_mismatches() {
  int mismatches = 0;
  consistency::ssp<> lazy;
  consistency::essp<> eager;
  lazy.staleness = S;
  eager.staleness = S;
  const consistency::ssp<S> lazy_s{};
  const consistency::essp<S> eager_s{};
  for (clock_value c = -2; c <= 20; ++c) {
    for (clock_value cached :
         {no_clock, clock_value{0}, c - S - 2, c - S - 1, c - S, c - S + 1, c, c + 1}) {
      for (bool have : {false, true}) {
        mismatches += lazy.on_read(c, cached, have) != lazy_s.on_read(c, cached, have);
        mismatches += eager.on_read(c, cached, have) != eager_s.on_read(c, cached, have);
      }
    }
    mismatches += lazy.min_server_clock(c) != lazy_s.min_server_clock(c);
    mismatches += eager.min_server_clock(c) != eager_s.min_server_clock(c);
  }
  return mismatches;
}

// The server and the handshake see only `eager`: one server type serves every bound.
static_assert(policy_fingerprint<consistency::ssp<>, recovery::none>() ==
              policy_fingerprint<consistency::ssp<3>, recovery::none>());
static_assert(policy_fingerprint<consistency::essp<>, recovery::none>() ==
              policy_fingerprint<consistency::essp<3>, recovery::none>());
static_assert(consistency_policy<consistency::ssp<>> && consistency_policy<consistency::essp<>>);

TEST_CASE("consistency: ssp<>/essp<> with a run-time bound decide as ssp<s>/essp<s>") {
  CHECK(run_time_decision_mismatches<0>() == 0);
  CHECK(run_time_decision_mismatches<1>() == 0);
  CHECK(run_time_decision_mismatches<3>() == 0);
  CHECK(run_time_decision_mismatches<15>() == 0);
  consistency::ssp<> p;
  CHECK(p.staleness == 0);  // default: BSP
  p.staleness = -4;         // precondition broken: read as 0
  CHECK(p.min_server_clock(7) == 7);
  CHECK(p.on_read(7, 6, true) == read_action::fetch);
  CHECK(p.on_read(7, 7, true) == read_action::read);
}

TEST_CASE("simulation: run-time bounds (ssp<>, essp<>) hold over 400 random schedules (100 "
          "unoptimised), exactly as the compile-time ones") {
  // Each run-time bound runs on the same seeds as its compile-time twin: the simulation is
  // deterministic, so identical decisions give identical staleness histograms and pull counts.
  // check_schedules checks the bound on every read of every schedule.
  constexpr std::uint64_t n = test::random_runs(40);
  const auto same = [](auto rt, auto ct, std::int64_t s, std::uint64_t first) {
    worker_stats a, b;
    const auto ha = check_schedules<decltype(rt)>("run-time", s, first, n, &a);
    const auto hb = check_schedules<decltype(ct)>("compile-time", s, first, n, &b);
    CHECK(ha.max() == s);  // the schedules reach the bound: the check is not vacuous
    CHECK(ha.counts == hb.counts);
    CHECK(a.pulls == b.pulls);
    CHECK(a.eager_messages == b.eager_messages);
  };
  same(consistency::ssp<>{}, consistency::bsp{}, 0, 800000);
  same(consistency::ssp<>{}, consistency::ssp<1>{}, 1, 810000);
  same(consistency::ssp<>{}, consistency::ssp<3>{}, 3, 820000);
  same(consistency::essp<>{}, consistency::essp<1>{}, 1, 830000);
  same(consistency::essp<>{}, consistency::essp<3>{}, 3, 840000);
}

TEST_CASE("simulation: sparse reads keep the bounds on every row read over 600 random schedules "
          "(150 unoptimised)") {
  // Each clock every worker reads a random half of the rows: it pulls (keyed) and waits for
  // only those, and ESSP subscribes it to only those. Rows it does not read may be older than
  // the bound; the rows it reads may not. Pushes stay dense, so every row counts exactly.
  constexpr std::uint64_t n = test::random_runs(100);
  using model = test::sparse_counter_model;
  worker_stats ssp, essp, asp;
  CHECK(check_schedules<consistency::bsp, model>("sparse bsp", 0, 110000, n).max() == 0);
  CHECK(check_schedules<consistency::ssp<1>, model>("sparse ssp<1>", 1, 210000, n, &ssp).max() ==
        1);
  CHECK(check_schedules<consistency::ssp<3>, model>("sparse ssp<3>", 3, 310000, n).max() == 3);
  CHECK(check_schedules<consistency::essp<1>, model>("sparse essp<1>", 1, 410000, n, &essp).max() ==
        1);
  CHECK(check_schedules<consistency::essp<3>, model>("sparse essp<3>", 3, 510000, n).max() <= 3);
  check_schedules<consistency::asp, model>("sparse asp", -1, 610000, n, &asp);
  MESSAGE("pulls (keyed): ssp<1> " << ssp.pulls << " (" << ssp.sparse_pulls << "), essp<1> "
                                   << essp.pulls << " (" << essp.sparse_pulls << ", "
                                   << essp.eager_messages << " rows messages pushed), asp "
                                   << asp.pulls << " (" << asp.sparse_pulls << ")");
  // Keyed pulls are used whenever they are smaller than the whole shard's rows.
  CHECK(ssp.sparse_pulls > ssp.pulls / 4);
  CHECK(essp.sparse_pulls > 0);
  CHECK(essp.eager_messages > 0);
  CHECK(asp.sparse_pulls > 0);
}

TEST_CASE("simulation: ESSP's observed staleness is lower than SSP's on the same schedules") {
  const auto ssp = check_schedules<consistency::ssp<3>>("ssp<3>", 3, 700000, 100);
  const auto essp = check_schedules<consistency::essp<3>>("essp<3>", 3, 700000, 100);
  CHECK(essp.mean() < ssp.mean());
}

TEST_CASE("simulation: VAP bounds the updates a read lacks; ASP on the same schedules does not") {
  // Counter model: each update is -1 on the worker's row of width 4 (L2 norm 2, lr 1). With
  // magnitude 2.5 a worker pushes only when nothing of its own is in transit, so a read lacks
  // at most: the writer's update not yet visible and the one it has computed since: 2. An
  // update is visible (acknowledged to its writer) only once every reader sent its rows has
  // acknowledged them, so none can still be on the wire to the reader (with the server's send
  // as visibility, rows still in flight made it 3).
  std::int64_t vap_worst = 0;
  std::int64_t asp_worst = 0;
  std::uint64_t vap_rows = 0;
  std::uint64_t vap_waits = 0;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    sim_config cfg = random_config(seed, -1);
    cfg.vap_magnitude = 2.5f;
    INFO("replay: policy vap, seed " << seed << " (" << describe(cfg) << ")");
    const auto v = simulate<consistency::vap>(cfg);
    REQUIRE(v.all_done);
    CHECK(v.all_served);
    for (const auto& ec : v.errors) CHECK_MESSAGE(!ec, ec.message());
    CHECK(v.own_write_violations == 0);
    CHECK(v.max_missing <= 2);
    for (std::uint32_t s = 0; s < cfg.shards; ++s) {
      const auto range = shard_range(cfg.workers, s, cfg.shards);
      for (row_id row = range.begin; row < range.end; ++row)
        CHECK(v.params[s][std::size_t{row - range.begin} * 4] == static_cast<float>(cfg.clocks));
    }
    vap_worst = std::max(vap_worst, v.max_missing);
    for (const auto& w : v.workers) {
      vap_rows += w.eager_messages;
      vap_waits += w.value_waits;
    }
    const auto a = simulate<consistency::asp>(cfg);
    REQUIRE(a.all_done);
    asp_worst = std::max(asp_worst, a.max_missing);
  }
  MESSAGE("60 schedules: most updates a read lacked: VAP " << vap_worst << ", ASP " << asp_worst
                                                           << "; VAP rows pushed " << vap_rows
                                                           << ", clocks that waited " << vap_waits);
  CHECK(asp_worst > 2);  // the bound is not met by accident
  CHECK(vap_waits > 0);
  CHECK(vap_rows > 0);
}

TEST_CASE("simulation: VAP with a huge bound never waits; the shrinking bound is v / sqrt(c + 1)") {
  sim_config cfg = random_config(5, -1);
  cfg.vap_magnitude = 1e9f;
  const auto loose = simulate<consistency::vap>(cfg);
  REQUIRE(loose.all_done);
  std::uint64_t loose_waits = 0;
  for (const auto& w : loose.workers) loose_waits += w.value_waits;
  CHECK(loose_waits == 0);
  consistency::vap shrinking;
  shrinking.magnitude = 8.0f;
  shrinking.shrink = true;
  CHECK(shrinking.threshold(0) == doctest::Approx(8.0f));
  CHECK(shrinking.threshold(3) == doctest::Approx(4.0f));
  CHECK(shrinking.threshold(-5) == doctest::Approx(8.0f));
}

TEST_CASE("simulation: BSP takes clocks x the slowest worker's compute time; ASP does not") {
  sim_config c;
  c.workers = 4;
  c.shards = 2;
  c.clocks = 20;
  c.net.latency.base = 50us;
  c.net.compute.base = 10ms;
  c.net.compute.speed_factor = {1, 1, 1, 4};
  c.bound = 0;
  const auto bsp = simulate<consistency::bsp>(c);
  REQUIRE(bsp.all_done);
  CHECK(bsp.bound_violations == 0);
  // 20 clocks of the 4x worker: 800 ms, plus a few latencies per clock.
  const double end = std::chrono::duration<double>(bsp.end.time_since_epoch()).count();
  CHECK(end >= 0.800);
  CHECK(end <= 0.800 * 1.02);
  for (std::uint32_t w = 0; w < c.workers; ++w) {
    CAPTURE(w);
    const double done = std::chrono::duration<double>(bsp.done[w].time_since_epoch()).count();
    // Everyone waits for the slowest every clock: clock 19 starts after its clock 18.
    CHECK(done >= 0.040 * static_cast<double>(c.clocks - 1) + (w == 3 ? 0.040 : 0.010));
    // The compute time a worker measures is virtual: its own speed times the clocks.
    CHECK(bsp.compute_seconds[w] == doctest::Approx(0.010 * c.clocks * (w == 3 ? 4 : 1)));
  }
  c.bound = -1;
  const auto asp = simulate<consistency::asp>(c);
  REQUIRE(asp.all_done);
  for (std::uint32_t w = 0; w < 3; ++w) {
    CAPTURE(w);
    const double done = std::chrono::duration<double>(asp.done[w].time_since_epoch()).count();
    CHECK(done <= 0.200 * 1.05);  // the fast workers are not held back
  }
  CHECK(std::chrono::duration<double>(asp.done[3].time_since_epoch()).count() >= 0.800);
}

TEST_CASE("simulation: under ASP the push window keeps reads fresh when a worker's link is "
          "slower than its compute") {
  sim_config c;
  c.workers = 4;
  c.shards = 1;
  c.clocks = 60;
  c.bound = -1;
  c.width = 32768;                          // 128 KiB rows: a worker's push is 512 KiB
  c.net.latency.bytes_per_second = 1.25e8;  // 1 Gbit/s: a push takes 4.2 ms to send
  c.net.compute.base = 1ms;                 // and its gradient 1 ms to compute
  c.push_window = 0;                        // no window: as before it existed
  const auto none = simulate<consistency::asp>(c);
  c.push_window.reset();  // the default: 2 clocks per server under ASP
  const auto window = simulate<consistency::asp>(c);
  c.push_window = 1;
  const auto one = simulate<consistency::asp>(c);
  for (const auto* r : {&none, &window, &one}) {
    REQUIRE(r->all_done);
    for (const auto& e : r->errors) CHECK(!e);
    CHECK(r->own_write_violations == 0);
  }
  MESSAGE("max lag (clocks of another worker's pushes a read lacked): none "
          << none.max_lag << ", default " << window.max_lag << ", 1 " << one.max_lag);
  std::uint64_t waits_none = 0, waits_window = 0;
  for (const auto& w : none.workers) waits_none += w.window_waits;
  for (const auto& w : window.workers) waits_window += w.window_waits;
  CHECK(waits_none == 0);
  CHECK(waits_window > 0);
  CHECK(none.max_lag >= 2 * window.max_lag);
  CHECK(one.max_lag <= window.max_lag);
}

TEST_CASE("simulation: a server node down with recovery::none ends the run with server_lost "
          "at that virtual time") {
  sim_config c;
  c.workers = 3;
  c.shards = 2;
  c.clocks = 50;
  c.net.compute.base = 10ms;
  const auto t1 = 105ms;
  c.setup = [&](simulated_network& net) { net.node_down("server0", t1, 1s); };
  const auto r = simulate<consistency::ssp<1>>(c);
  REQUIRE(r.all_done);
  CHECK(r.all_served);
  for (std::uint32_t w = 0; w < c.workers; ++w) {
    CAPTURE(w);
    CHECK(r.errors[w] == errc::server_lost);
    // Noticed at t1, reported when the gradient in progress finishes: not a hang, and not
    // the 60 s wait timeout.
    CHECK(r.done[w].time_since_epoch() >= t1);
    CHECK(r.done[w].time_since_epoch() <= t1 + c.net.compute.base + 1ms);
    CHECK(r.model_clocks[w] < 50);
  }
  CHECK(r.stats.faults == 1);
}

TEST_CASE("simulation: workers train through a partitioned server (recovery::stateless)") {
  // The partition starts at 80 offsets spread over one clock (~20 ms), so that some runs cut
  // pushes that are on the wire.
  std::uint64_t recovered_in_flight = 0;
  for (auto offset = 0us; offset < 20ms; offset += 250us) {
    CAPTURE(offset.count());
    sim_config c;
    c.workers = 4;
    c.shards = 2;
    c.clocks = 40;
    c.bound = 0;
    c.net.compute.base = 10ms;
    c.net.compute.speed_factor = {1, 1, 2, 1};
    c.net.latency.jitter = 100us;
    const auto t1 = 100ms + offset;
    c.setup = [&](simulated_network& net) { net.node_down("server0", t1, 300ms); };
    recovery::stateless::server_part part;
    part.options.rule = recovery::merge_rule::sum;  // exact: each delta counts once
    const auto r = simulate<consistency::bsp, recovery::stateless>(c, part);
    REQUIRE(r.all_done);
    CHECK(r.all_served);
    std::uint64_t local = 0;
    for (std::uint32_t w = 0; w < c.workers; ++w) {
      CAPTURE(w);
      CHECK(!r.errors[w]);
      CHECK(r.model_clocks[w] == 40);
      CHECK(r.workers[w].reconnects == 1);
      CHECK(r.stateless_workers[w].backlogs_sent == 1);
      local += r.stateless_workers[w].local_clocks;
      // Reconnected after the partition healed (virtual time), not before.
      CHECK(r.done[w].time_since_epoch() >= 300ms);
    }
    CHECK(local > 0);
    CHECK(r.stateless_servers[0].backlogs_merged == c.workers);
    CHECK(r.stateless_servers[0].replicas_installed == 0);  // it kept its state: nothing to rebuild
    CHECK(r.server_clocks[0] == 40);
    // Shard 0's rows count their workers' deltas exactly: a push on the wire when the
    // partition began is not applied by the server, so at the reconnect its gradient joins
    // the worker's backlog (the server's applied count says it is missing); nothing is lost
    // and nothing is applied twice.
    const auto range = shard_range(c.workers, 0, c.shards);
    for (row_id row = range.begin; row < range.end; ++row) {
      CAPTURE(row);
      CHECK(r.params[0][std::size_t{row - range.begin} * 4] == 40.0f);
    }
    CHECK(r.own_write_violations == 0);  // read-my-writes held through the outage
    // Backlog clocks beyond the clocks trained locally are such recovered pushes.
    CHECK(r.stateless_servers[0].backlog_clocks >= local);
    recovered_in_flight += r.stateless_servers[0].backlog_clocks - local;
    // Shard 1 was never down: exact.
    const auto r1 = shard_range(c.workers, 1, c.shards);
    for (row_id row = r1.begin; row < r1.end; ++row)
      CHECK(r.params[1][std::size_t{row - r1.begin} * 4] == 40.0f);
  }
  MESSAGE("pushes cut on the wire at the partition and recovered: " << recovered_in_flight);
  CHECK(recovered_in_flight >= 1);  // the sweep does cut a push on the wire (deterministic)
}

// ---- Elastic membership: random join / leave / death / restart schedules ----------------

namespace {

// Clocks an elastic schedule may reach: the model's table has one column per clock.
constexpr std::uint32_t elastic_columns = 128;
using clock_set = std::bitset<elastic_columns>;

// One read of an elastic run: incarnation `life` of worker `id`, computing clock `clock`, saw
// in row w the updates of w's clocks in `seen[w]`.
struct elastic_read {
  std::uint32_t id = 0;
  std::uint32_t life = 0;
  clock_value clock = 0;
  std::vector<clock_set> seen;
};

// The elastic runs' model: table 0 has a row per worker id and a column per clock, and worker
// w's update at clock k is +1 at (w, k) (gradient -1, SGD with learning rate 1). A read shows
// exactly which updates of which workers it reflects; the final values which were applied, and
// that each was applied once (a value of 2 would be a duplicate).
struct clock_column_model {
  clock_column_model(std::uint32_t id, std::uint32_t life, std::uint32_t capacity)
      : id(id), life(life) {
    spec[0] = table_spec{0, capacity, elastic_columns, 0.0f};
  }

  std::span<const table_spec> tables() const { return spec; }

  float compute_gradient(const parameter_view& p, gradient_view& g) {
    const clock_value c = clock();  // the worker's clock: the one being computed
    const auto t = p.table(0);
    elastic_read r{id, life, c, std::vector<clock_set>(static_cast<std::size_t>(t.rows()))};
    for (Eigen::Index w = 0; w < t.rows(); ++w) {
      for (Eigen::Index k = 0; k < t.cols(); ++k) {
        const float v = t(w, k);
        if (v != 0.0f) r.seen[static_cast<std::size_t>(w)].set(static_cast<std::size_t>(k));
        if (v != 0.0f && v != 1.0f) ++odd_values;
      }
    }
    reads->push_back(std::move(r));
    auto gt = g.table(0);
    gt.setZero();
    if (c >= 0 && c < static_cast<clock_value>(elastic_columns)) {
      gt(id, static_cast<Eigen::Index>(c)) = -1.0f;
    } else {
      ++out_of_range;  // the schedule outgrew the table: a test bug, reported as a failure
    }
    computed.push_back(c);
    if (on_computed) on_computed(computed.size() - 1);
    return 0.0f;
  }

  std::uint32_t id;
  std::uint32_t life;
  std::array<table_spec, 1> spec{};
  std::vector<elastic_read>* reads = nullptr;
  std::function<clock_value()> clock{};  // the worker's current clock
  /// Called after each gradient with its iteration (0 for the incarnation's first).
  std::function<void(std::size_t)> on_computed{};
  std::vector<clock_value> computed;  // the clocks this incarnation computed, in order
  std::int64_t odd_values = 0;        // values read that are neither 0 nor 1
  std::int64_t out_of_range = 0;
};

// One incarnation (a worker process) of a worker id in an elastic schedule.
struct elastic_life {
  std::uint64_t clocks = 10;    // the clocks its async_run runs
  std::int64_t die_after = -1;  // >= 0: its node goes down after this iteration's gradient
                                // (mid-run: before its next gradient completes); -1: it runs
                                // to the end and says bye
  // >= 0 (only when die_after is -1): after this iteration's gradient its link to shard
  // `blip_shard` (all its links when that is the number of shards) goes down for `blip_for`
  // (a blip: the connections are reset); the worker (recovery::none with a 5 s grace)
  // reconnects well within the servers' grace and keeps its place.
  std::int64_t blip_after = -1;
  std::uint32_t blip_shard = 0;
  std::chrono::nanoseconds blip_for{};
  // >= 0: the link to `blip_shard` goes down at this virtual time instead (for `blip_for`).
  std::chrono::nanoseconds blip_at{-1};
  enum class next { none, within_grace, after_grace } then = next::none;
  std::chrono::nanoseconds restart_delay{};  // the next incarnation starts this long after
                                             // the death (or the end of the run)
};

struct elastic_config {
  std::uint32_t capacity = 4;  // worker ids (server_options::num_workers)
  std::uint32_t shards = 2;
  std::int64_t bound = 0;
  membership_options membership{};
  simulation_options net{};
  std::vector<std::chrono::nanoseconds> start;   // per id: when its first incarnation starts
  std::vector<std::vector<elastic_life>> lives;  // per id (empty: the id never joins)
};

// A random elastic schedule drawn from `seed`: capacity 2..6 worker ids, 1..3 shards, a start
// barrier of 1..3 members, grace 100..300 ms, latency 10 us..1 ms with jitter up to 1 ms,
// compute 1..10 ms with jitter up to 50 % and speed factors in [1, 3]. The first
// `start_members` ids start in the first 20 ms; each other id starts then too (1/3), joins late
// at 20..400 ms (1/2), or never (1/6). An incarnation runs 4..18 clocks and dies mid-run (its
// node goes down: every connection reset, no bye) with probability 1/3; otherwise it may lose
// one link or all for a blip of 0.5..2 ms mid-run (1/6) and reconnect, and it leaves with bye.
// A dead one restarts with the same id within the grace (1/3: 0.1..0.4 x grace after the
// death), after it (1/3: 1.5..2.5 x grace) or never; one that left without a blip restarts with
// probability 1/6 (0..2 x grace later). At most 3 incarnations per id.
elastic_config random_elastic_config(std::uint64_t seed, std::int64_t bound) {
  std::mt19937_64 g(seed * 0x9e3779b97f4a7c15ull + 777);
  auto uniform = [&](double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(g() >> 11) * 0x1.0p-53;
  };
  auto ns = [](double seconds) { return std::chrono::nanoseconds(std::llround(seconds * 1e9)); };
  elastic_config c;
  c.capacity = 2 + static_cast<std::uint32_t>(g() % 5);
  c.shards = 1 + static_cast<std::uint32_t>(g() % 3);
  c.bound = bound;
  c.membership.start_members = 1 + static_cast<std::uint32_t>(g() % std::min(c.capacity, 3u));
  c.membership.grace = std::chrono::milliseconds(100 + g() % 201);
  c.net.seed = seed;
  c.net.latency.base = ns(uniform(10e-6, 1e-3));
  c.net.latency.jitter = ns(uniform(0, 1e-3));
  c.net.latency.bytes_per_second = uniform(1e8, 1e10);
  c.net.latency.shared_egress = g() % 2 == 0;
  c.net.compute.base = ns(uniform(1e-3, 10e-3));
  c.net.compute.jitter = uniform(0, 0.5);
  const double grace = std::chrono::duration<double>(c.membership.grace).count();
  for (std::uint32_t w = 0; w < c.capacity; ++w) {
    c.net.compute.speed_factor.push_back(uniform(1.0, 3.0));
    const auto kind = g() % 6;
    const bool early = w < c.membership.start_members || kind < 2;
    c.start.push_back(early ? ns(uniform(0, 20e-3)) : ns(uniform(20e-3, 400e-3)));
    auto& lives = c.lives.emplace_back();
    if (!early && kind == 5) continue;  // this id never joins
    for (int n = 0; n < 3; ++n) {
      elastic_life l;
      l.clocks = 4 + g() % 15;
      if (g() % 3 == 0) {
        l.die_after = static_cast<std::int64_t>(g() % (l.clocks - 1));
        const auto r = g() % 3;
        l.then = r == 0   ? elastic_life::next::within_grace
                 : r == 1 ? elastic_life::next::after_grace
                          : elastic_life::next::none;
        l.restart_delay = ns(grace * (r == 0 ? uniform(0.1, 0.4) : uniform(1.5, 2.5)));
      } else if (g() % 4 == 0) {
        // Up to the last clock: pushes built while a link is down keep the run from ending
        // until it is back (docs/concepts/membership.md). Not after the last gradient: a push
        // of the last clock cut on the wire after it was sent is not seen by recovery::none
        // (nothing acknowledges it; see "Not yet" there).
        l.blip_after = static_cast<std::int64_t>(g() % (l.clocks - 1));
        l.blip_shard = static_cast<std::uint32_t>(g() % (c.shards + 1));
        l.blip_for = ns(uniform(0.5e-3, 2e-3));
      } else if (g() % 4 == 0) {
        l.then = elastic_life::next::after_grace;  // left with bye: joins again
        l.restart_delay = ns(grace * uniform(0, 2));
      }
      if (n == 2) l.then = elastic_life::next::none;
      lives.push_back(l);
      if (l.then == elastic_life::next::none) break;
    }
  }
  return c;
}

std::string describe(const elastic_config& c) {
  std::string s = std::to_string(c.capacity) + " ids, " + std::to_string(c.shards) +
                  " shards, start_members " + std::to_string(c.membership.start_members) +
                  ", grace " + std::to_string(c.membership.grace.count()) + " ms, compute " +
                  std::to_string(c.net.compute.base.count()) + " ns; lives:";
  for (std::uint32_t w = 0; w < c.capacity; ++w) {
    s += " [" + std::to_string(w) + " at " + std::to_string(c.start[w].count() / 1000) + " us:";
    for (const auto& l : c.lives[w]) {
      s += " " + std::to_string(l.clocks) + " clocks";
      if (l.die_after >= 0) s += ", dies after " + std::to_string(l.die_after);
      if (l.blip_after >= 0)
        s += ", link " + std::to_string(l.blip_shard) + " down after " +
             std::to_string(l.blip_after) + " for " + std::to_string(l.blip_for.count() / 1000) +
             " us";
      if (l.then == elastic_life::next::within_grace) s += ", restarts within grace;";
      if (l.then == elastic_life::next::after_grace) s += ", restarts after grace;";
    }
    s += "]";
  }
  return s;
}

// What an elastic run did.
struct elastic_result {
  struct life_result {
    std::uint32_t id = 0;
    std::size_t index = 0;  // into elastic_config::lives[id]
    bool started = false;
    bool finished = false;  // its async_run completed
    std::error_code ec;
    simulated_clock::time_point done{};
    std::vector<clock_value> computed;
    staleness_histogram staleness;
    std::int64_t odd_values = 0;
    std::int64_t out_of_range = 0;
  };
  std::vector<life_result> lives;
  std::vector<elastic_read> reads;
  std::vector<std::vector<clock_value>> server_clocks;  // per shard: each advance, in order
  std::vector<server_stats> servers;
  std::vector<clock_set> applied;  // per id: the clocks whose update its row holds at the end
  std::int64_t duplicates = 0;     // final values other than 0 and 1
  std::vector<std::string> log;    // server and worker log lines (printed when a check fails)
  bool all_served = false;
};

// Runs `cfg` on a simulated network with elastic servers (recovery::none): each incarnation on
// its own node ("w<id>.<n>"), started at its time; a death is `node_down` of its node (every
// connection reset at once; the worker, recovery::none without grace, ends with
// errc::server_lost); a restart is a fresh worker object with the same id and a new
// incarnation number.
template <class Policy>
elastic_result simulate_elastic(const elastic_config& cfg) {
  using server_t = basic_server<simulated_transport, Policy, recovery::none>;
  using worker_t = basic_worker<clock_column_model, simulated_transport, Policy, recovery::none>;
  simulated_network net(cfg.net);
  std::mt19937_64 death_rng(cfg.net.seed + 99);
  elastic_result r;
  auto log = [&r](std::string_view line) {
    r.log.push_back(std::to_string(simulated_clock::now().time_since_epoch().count() / 1000) +
                    " us: " + std::string(line));
  };

  std::vector<std::unique_ptr<simulated_transport>> sts;
  std::vector<std::unique_ptr<server_t>> servers;
  std::vector<std::string> eps;
  r.server_clocks.resize(cfg.shards);
  int served = 0;
  const clock_column_model layout(0, 0, cfg.capacity);
  for (std::uint32_t s = 0; s < cfg.shards; ++s) {
    sts.push_back(std::make_unique<simulated_transport>(net, "server" + std::to_string(s)));
    server_options so;
    so.shard = s;
    so.num_shards = cfg.shards;
    so.num_workers = cfg.capacity;
    so.tables = {layout.spec[0]};
    so.elastic = cfg.membership;
    so.log = log;
    so.on_clock = [&r, s](clock_value c) { r.server_clocks[s].push_back(c); };
    servers.push_back(std::make_unique<server_t>(*sts.back(), so, optimizer::sgd{1.0f}));
    eps.push_back("shard" + std::to_string(s));
    auto acc = sts.back()->listen(eps.back());
    REQUIRE(acc.has_value());
    asio::co_spawn(
        net.get_executor(),
        [&served, &server = *servers.back(),
         a = std::move(acc).value()]() mutable -> asio::awaitable<void> {
          (void)co_await server.async_serve(std::move(a));
          ++served;
        },
        asio::detached);
  }

  // Every incarnation, made up front; `first[id]`: the index of id's first one.
  struct life_state {
    std::unique_ptr<simulated_transport> transport;
    std::unique_ptr<clock_column_model> model;
    std::unique_ptr<worker_t> worker;
  };
  std::vector<life_state> states;
  std::vector<std::size_t> first(cfg.capacity);
  for (std::uint32_t w = 0; w < cfg.capacity; ++w) {
    first[w] = states.size();
    for (std::size_t n = 0; n < cfg.lives[w].size(); ++n) {
      auto& st = states.emplace_back();
      auto& lr = r.lives.emplace_back();
      lr.id = w;
      lr.index = n;
      st.transport = std::make_unique<simulated_transport>(net, "w" + std::to_string(w) + "." +
                                                                    std::to_string(n));
      st.model =
          std::make_unique<clock_column_model>(w, static_cast<std::uint32_t>(n), cfg.capacity);
      st.model->reads = &r.reads;
      typename worker_t::options_type o;
      o.id = w;
      o.servers = eps;
      o.local_step = 1.0f;
      o.log = log;
      o.incarnation = (std::uint64_t{w} + 1) * 16 + n + 1;
      recovery::none_worker_part part;
      if (cfg.lives[w][n].blip_after >= 0 || cfg.lives[w][n].blip_at.count() >= 0) part.grace = 5s;
      st.worker = std::make_unique<worker_t>(*st.transport, *st.model, o,
                                             asio::any_io_executor(net.compute_executor(w)), part);
      st.model->clock = [&worker = *st.worker] { return worker.clock(); };
    }
  }
  std::function<void(std::size_t)> start = [&](std::size_t i) {
    auto& lr = r.lives[i];
    lr.started = true;
    asio::co_spawn(
        net.get_executor(),
        [&, i]() -> asio::awaitable<void> {
          auto& l = r.lives[i];
          const auto& plan = cfg.lives[l.id][l.index];
          l.ec = co_await states[i].worker->async_run(plan.clocks);
          l.done = simulated_clock::now();
          l.finished = true;
          if (plan.die_after < 0 && plan.then != elastic_life::next::none)
            net.at((l.done + plan.restart_delay).time_since_epoch(), [&, i] { start(i + 1); });
        },
        asio::detached);
  };
  for (std::size_t i = 0; i < states.size(); ++i) {
    const auto& l = r.lives[i];
    const auto& plan = cfg.lives[l.id][l.index];
    if (plan.blip_at.count() >= 0) {
      const std::string node =
          "w" + std::to_string(r.lives[i].id) + "." + std::to_string(r.lives[i].index);
      net.link_down(node, "server" + std::to_string(plan.blip_shard), plan.blip_at,
                    plan.blip_at + plan.blip_for);
    }
    if (plan.blip_after >= 0) {
      states[i].model->on_computed = [&, i](std::size_t iteration) {
        const auto& me = cfg.lives[r.lives[i].id][r.lives[i].index];
        if (static_cast<std::int64_t>(iteration) != me.blip_after) return;
        const auto base = cfg.net.compute.base.count();
        const auto from = net.now().time_since_epoch() +
                          simulated_clock::duration(base > 0 ? death_rng() % base : 0);
        const std::string node =
            "w" + std::to_string(r.lives[i].id) + "." + std::to_string(r.lives[i].index);
        if (me.blip_shard < cfg.shards)
          net.link_down(node, "server" + std::to_string(me.blip_shard), from, from + me.blip_for);
        else
          net.node_down(node, from, from + me.blip_for);
      };
    }
    if (plan.die_after >= 0) {
      states[i].model->on_computed = [&, i](std::size_t iteration) {
        const auto& me = cfg.lives[r.lives[i].id][r.lives[i].index];
        if (static_cast<std::int64_t>(iteration) != me.die_after) return;
        // Dies before its next gradient completes (each takes at least compute.base).
        const auto base = cfg.net.compute.base.count();
        const auto death = net.now().time_since_epoch() +
                           simulated_clock::duration(base > 0 ? death_rng() % base : 0);
        net.node_down("w" + std::to_string(r.lives[i].id) + "." + std::to_string(r.lives[i].index),
                      death, death + 1ms);
        if (me.then != elastic_life::next::none)
          net.at(death + me.restart_delay, [&, i] { start(i + 1); });
      };
    }
    if (l.index == 0) net.at(cfg.start[l.id], [&, i] { start(i); });
  }
  net.run();  // until quiescent: every incarnation done (or stuck: `finished` says which)
  asio::post(net.get_executor(), [&] {
    for (auto& s : servers) s->stop();
  });
  net.run();
  r.all_served = served == static_cast<int>(cfg.shards);

  r.applied.resize(cfg.capacity);
  for (std::uint32_t s = 0; s < cfg.shards; ++s) {
    r.servers.push_back(servers[s]->stats());
    const auto v = servers[s]->values(0);
    const auto range = shard_range(cfg.capacity, s, cfg.shards);
    for (row_id row = range.begin; row < range.end; ++row) {
      for (std::uint32_t k = 0; k < elastic_columns; ++k) {
        const float x = v[std::size_t{row - range.begin} * elastic_columns + k];
        if (x != 0.0f) r.applied[row].set(k);
        if (x != 0.0f && x != 1.0f) ++r.duplicates;
      }
    }
  }
  for (std::size_t i = 0; i < states.size(); ++i) {
    auto& l = r.lives[i];
    l.computed = states[i].model->computed;
    l.staleness = states[i].worker->staleness();
    l.odd_values = states[i].model->odd_values;
    l.out_of_range = states[i].model->out_of_range;
  }
  return r;
}

// The clocks [0, c] (none when c < 0).
clock_set clocks_through(clock_value c) {
  clock_set s;
  for (clock_value k = 0; k <= c && k < static_cast<clock_value>(elastic_columns); ++k)
    s.set(static_cast<std::size_t>(k));
  return s;
}

// Totals over the elastic schedules of one policy (to show the checks are not vacuous).
struct elastic_totals {
  std::uint64_t schedules = 0, lives = 0, late_joins = 0, deaths = 0, blips = 0, blip_lost = 0,
                within_grace = 0, after_grace = 0, reads = 0, required = 0, joins = 0,
                departures = 0;
  clock_value max_clock = 0;
  staleness_histogram staleness;
};

// Runs `seeds` random elastic schedules of `Policy` (staleness bound `bound`) and checks them.
template <class Policy>
elastic_totals check_elastic_schedules(std::string_view policy, std::int64_t bound,
                                       std::uint64_t first, std::uint64_t seeds) {
  elastic_totals t;
  for (std::uint64_t seed = first; seed < first + seeds; ++seed) {
    const elastic_config cfg = random_elastic_config(seed, bound);
    INFO("replay: policy " << policy << ", seed " << seed
                           << " (simulate_elastic<Policy>(random_elastic_config(seed, " << bound
                           << ")); " << describe(cfg) << ")");
    const elastic_result r = simulate_elastic<Policy>(cfg);
    bool ok = true;
    const auto expect = [&ok](bool c) {
      ok = ok && c;
      return c;
    };
    CHECK(expect(r.all_served));

    // No deadlock: every incarnation ran to its end, the dead ones with server_lost (their
    // node went down), the others without error, within a virtual-time limit far below
    // worker_options::wait_timeout (a stall would show as errc::timeout after 60 s).
    for (const auto& l : r.lives) {
      CAPTURE(l.id);
      CAPTURE(l.index);
      const auto& plan = cfg.lives[l.id][l.index];
      CHECK(expect(l.started));
      CHECK(expect(l.finished));
      if (plan.die_after >= 0) {
        CHECK_MESSAGE(expect(l.ec == errc::server_lost), l.ec.message());
      } else if (plan.blip_after >= 0) {
        // It reconnects; recovery::none gives up (server_lost) when a push was lost on the
        // cut link.
        CHECK_MESSAGE(expect(!l.ec || l.ec == errc::server_lost), l.ec.message());
        if (!l.ec) CHECK(expect(l.computed.size() == plan.clocks));
        if (l.ec) ++t.blip_lost;
        ++t.blips;
      } else {
        CHECK_MESSAGE(expect(!l.ec), l.ec.message());
        CHECK(expect(l.computed.size() == plan.clocks));
      }
      CHECK(expect(l.done < simulated_clock::time_point(10s)));
      CHECK(expect(l.out_of_range == 0));
      CHECK(expect(l.odd_values == 0));  // no update ever seen twice
      // The worker's own staleness record: every read within the bound.
      CHECK(expect(l.staleness.max() <= bound));
      t.staleness += l.staleness;
      ++t.lives;
      if (!l.computed.empty()) {
        t.max_clock = std::max(t.max_clock, l.computed.back());
        if (l.index == 0 && l.computed.front() > 0) ++t.late_joins;
      }
      if (plan.die_after >= 0) ++t.deaths;
      if (plan.then == elastic_life::next::within_grace) ++t.within_grace;
      if (plan.then == elastic_life::next::after_grace) ++t.after_grace;
    }

    // Every update applied at most once; none applied that nobody computed; every update of
    // an incarnation that finished applied.
    CHECK(expect(r.duplicates == 0));
    std::vector<clock_set> computed(cfg.capacity);
    for (const auto& l : r.lives) {
      clock_set mine;
      for (auto c : l.computed) mine.set(static_cast<std::size_t>(c));
      computed[l.id] |= mine;
      if (cfg.lives[l.id][l.index].die_after < 0 && !l.ec)
        CHECK(expect((mine & ~r.applied[l.id]).none()));
    }
    for (std::uint32_t w = 0; w < cfg.capacity; ++w)
      CHECK(expect((r.applied[w] & ~computed[w]).none()));

    // The bound over the live members, on every read: a worker computing clock c sees every
    // update of clocks <= c - s - 1 that any worker (itself included) got applied, and its own
    // incarnation's earlier updates (read-my-writes). An update applied at the end was made by
    // a member at that clock: the server took it while the worker's clock there was k, so its
    // clock could not pass k before (see docs/concepts/membership.md). It never sees an update
    // that was not applied (except its own, in its cache).
    std::uint64_t bad_reads = 0;
    for (const auto& rd : r.reads) {
      const clock_set due = clocks_through(rd.clock - bound - 1);
      const elastic_result::life_result* me = nullptr;
      for (const auto& l : r.lives)
        if (l.id == rd.id && l.index == rd.life) me = &l;
      clock_set own;
      for (auto c : me->computed)
        if (c < rd.clock) own.set(static_cast<std::size_t>(c));
      for (std::uint32_t w = 0; w < cfg.capacity; ++w) {
        const clock_set need = (r.applied[w] & due) | (w == rd.id ? own : clock_set{});
        const clock_set extra = rd.seen[w] & ~r.applied[w] & ~(w == rd.id ? own : clock_set{});
        t.required += need.count();
        if ((need & ~rd.seen[w]).any() || extra.any()) {
          if (bad_reads++ < 5)
            FAIL_CHECK("worker " << rd.id << " (incarnation " << rd.life << ") at clock "
                                 << rd.clock << " reads row " << w << " with clocks "
                                 << rd.seen[w].to_string().substr(elastic_columns - 40)
                                 << "; needed " << need.to_string().substr(elastic_columns - 40)
                                 << " (clocks 39..0)");
        }
      }
      ++t.reads;
    }
    if (bad_reads > 0) ok = false;

    // The server clock only moves forward.
    for (std::uint32_t s = 0; s < cfg.shards; ++s) {
      CAPTURE(s);
      const auto& c = r.server_clocks[s];
      CHECK(expect(std::adjacent_find(c.begin(), c.end(), std::greater_equal<>()) == c.end()));
      CHECK(expect(c.empty() || c.front() > 0));
    }

    // Joins and departures as scheduled, on every shard: each incarnation joins unless it
    // restarts a dead one within the grace (it keeps its place), and each leaves (bye, or its
    // connection gone for the grace) unless restarted within the grace.
    std::uint64_t joins = 0;
    std::uint64_t departures = 0;
    for (std::uint32_t w = 0; w < cfg.capacity; ++w) {
      for (std::size_t n = 0; n < cfg.lives[w].size(); ++n) {
        const auto& l = cfg.lives[w][n];
        const bool kept = l.die_after >= 0 && l.then == elastic_life::next::within_grace;
        if (n == 0 || !(cfg.lives[w][n - 1].die_after >= 0 &&
                        cfg.lives[w][n - 1].then == elastic_life::next::within_grace))
          ++joins;
        if (!kept) ++departures;
      }
    }
    for (std::uint32_t s = 0; s < cfg.shards; ++s) {
      CAPTURE(s);
      CHECK(expect(r.servers[s].joins == joins));
      CHECK(expect(r.servers[s].departures == departures));
      CHECK(expect(r.servers[s].rejected == 0));
    }
    t.joins += joins;
    t.departures += departures;
    ++t.schedules;
    if (!ok) {
      std::string tail;
      const std::size_t from = r.log.size() > 60 ? r.log.size() - 60 : 0;
      for (std::size_t i = from; i < r.log.size(); ++i) tail += r.log[i] + "\n";
      MESSAGE("log (last 60 lines):\n" << tail);
    }
  }
  MESSAGE(policy << ": " << t.schedules << " elastic schedules, " << t.lives << " incarnations ("
                 << t.late_joins << " joined late, " << t.deaths << " died, " << t.blips
                 << " lost links for a blip (" << t.blip_lost
                 << " of them gave up: a push was lost), " << t.within_grace
                 << " restarted within the grace, " << t.after_grace
                 << " restarted after it or after bye), " << t.joins << " joins and "
                 << t.departures << " departures per shard, " << t.reads << " reads checked ("
                 << t.required << " updates required), highest clock " << t.max_clock
                 << ", staleness " << t.staleness.to_string());
  return t;
}

}  // namespace

TEST_CASE("simulation: elastic membership keeps every bound over the live members on 1000 "
          "random join/leave/death/restart schedules (248 unoptimised)") {
  // Workers join late (at the server clock), leave with bye, die mid-run (their node goes down:
  // connections reset, no bye) and restart with the same id within the grace (keeping their
  // place) or after it (joining again), or lose their links for a blip and reconnect.
  // check_elastic_schedules checks every read against the bound over the members, that nobody
  // deadlocks, the server clock's progress, and the servers' joins and departures against the
  // schedule.
  constexpr std::uint64_t n = test::random_runs(250);
  const auto bsp = check_elastic_schedules<consistency::bsp>("bsp", 0, 900000, n);
  const auto ssp1 = check_elastic_schedules<consistency::ssp<1>>("ssp<1>", 1, 910000, n);
  const auto ssp3 = check_elastic_schedules<consistency::ssp<3>>("ssp<3>", 3, 920000, n);
  const auto essp1 = check_elastic_schedules<consistency::essp<1>>("essp<1>", 1, 930000, n);
  // The schedules reach each bound and every kind of event.
  CHECK(ssp1.staleness.max() == 1);
  CHECK(ssp3.staleness.max() == 3);
  for (const auto* t : {&bsp, &ssp1, &ssp3, &essp1}) {
    CHECK(t->late_joins > 0);
    CHECK(t->deaths > 0);
    CHECK(t->blips > t->blip_lost);
    CHECK(t->within_grace > 0);
    CHECK(t->after_grace > 0);
    CHECK(t->required > 0);
  }
}

TEST_CASE("simulation: a worker whose link is down for longer than the grace is taken back at "
          "the server clock and trains on from there") {
  // Worker 1's link goes down for 300 ms (grace 100 ms): the server lets it go, worker 0 trains
  // on alone, and worker 1 reconnects (recovery::none with a 5 s worker grace) and joins again
  // at the server clock, ahead of the clock it was on. It must go on from that clock (its
  // computed clocks jump) rather than push the old one, which the server refuses. A push cut
  // on the wire or built while the link is down (an outage that starts during a gradient)
  // ends the run with server_lost instead (recovery::none counts it lost), so the outage
  // starts at a different time per seed and at least one run must show the jump. Worker 0 is
  // 3x slower, so worker 1 spends most of each clock waiting (the case of the fix).
  int jumped = 0;
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    CAPTURE(seed);
    elastic_config c;
    c.capacity = 2;
    c.shards = 1;
    c.bound = 0;
    c.membership.start_members = 2;
    c.membership.grace = 100ms;
    c.net.seed = seed;
    c.net.latency.base = 100us;
    c.net.compute.base = 4ms;
    c.net.compute.speed_factor = {3.0, 1.0};
    c.start = {0ns, 0ns};
    elastic_life w0, w1;
    w0.clocks = 60;  // 60 x 12 ms outlasts the outage (and stays within the 128 columns)
    w1.clocks = 20;
    w1.blip_at = std::chrono::microseconds(60000 + 1700 * seed);
    w1.blip_shard = 0;
    w1.blip_for = 300ms;
    c.lives = {{w0}, {w1}};
    const auto r = simulate_elastic<consistency::bsp>(c);
    std::string tail;
    for (std::size_t i = r.log.size() > 30 ? r.log.size() - 30 : 0; i < r.log.size(); ++i)
      tail += r.log[i] + "\n";
    INFO(tail);
    REQUIRE(r.all_served);
    REQUIRE(r.lives.size() == 2);
    CHECK_MESSAGE(!r.lives[0].ec, r.lives[0].ec.message());
    const auto& l1 = r.lives[1];
    CHECK_MESSAGE((!l1.ec || l1.ec == errc::server_lost), l1.ec.message());
    CHECK(r.duplicates == 0);
    if (!l1.ec) {
      CHECK(r.servers[0].joins == 3);  // worker 0, worker 1, worker 1 again after its grace
      CHECK(l1.computed.size() >= w1.clocks);
      const bool jump = std::adjacent_find(l1.computed.begin(), l1.computed.end(),
                                           [](clock_value a, clock_value b) {
                                             return b > a + 1;
                                           }) != l1.computed.end();
      if (jump) ++jumped;
      // Every clock it pushed was applied once (a dropped clock's gradient is not pushed).
      CHECK(r.applied[1].count() == w1.clocks);
    }
  }
  CHECK(jumped > 0);
}

TEST_CASE("simulation: transport semantics (FIFO, latency, close, refusal, link faults)") {
  simulation_options o;
  o.latency.base = 1ms;
  o.latency.jitter = 500us;
  o.latency.bytes_per_second = 1e6;  // 1 MB/s: 1000 bytes take 1 ms
  simulated_network net(o);
  simulated_transport a(net, "a");
  simulated_transport b(net, "b");
  simulated_transport c(net, "c");
  net.link_down("a", "c", 50ms, 60ms);
  auto acc = b.listen("b:1");
  REQUIRE(acc.has_value());
  CHECK(!b.listen("b:1").has_value());
  bool finished = false;
  asio::co_spawn(
      net.get_executor(),
      [&]() -> asio::awaitable<void> {
        auto [ec, client] = co_await a.async_connect("b:1");
        REQUIRE(!ec);
        CHECK(simulated_clock::now() >= simulated_clock::time_point(2ms));  // SYN + SYN-ACK
        auto [ec2, server] = co_await acc.value().async_accept();
        REQUIRE(!ec2);
        const auto sent = simulated_clock::now();
        for (std::uint64_t i = 0; i < 20; ++i) {
          message m;
          m.header.type = message_type::heartbeat;
          m.header.seq = i;
          if (i == 0) {                           // 64-byte header + 936 bytes: 1 ms at 1 MB/s
            m.header.type = message_type::error;  // any payload is valid for an error
            m.payload = a.allocate(936);
          }
          CHECK(!(co_await client.async_send(std::move(m))));
        }
        CHECK(simulated_clock::now() == sent);  // sending never blocks
        for (std::uint64_t i = 0; i < 20; ++i) {
          auto [rec, m] = co_await server.async_receive();
          REQUIRE(!rec);
          CHECK(m.header.seq == i);  // FIFO despite the jitter
          if (i == 0) {
            const auto took = simulated_clock::now() - sent;
            CHECK(took >= 2ms);  // 1 ms transmission + 1 ms propagation
            CHECK(took < 2ms + 500us);
          }
        }
        client.close();
        auto [rec, m] = co_await server.async_receive();
        CHECK(rec == errc::connection_closed);
        const auto sec = co_await server.async_send(message{});
        CHECK(sec == errc::connection_closed);  // receiving the peer's close closed this end
        auto [ec3, nobody] = co_await a.async_connect("nowhere");
        CHECK(ec3 == std::errc::connection_refused);
        CHECK(!nobody.is_open());

        // A link fault resets the connections across it and refuses new ones until it ends.
        auto acc_c = c.listen("c:1");
        REQUIRE(acc_c.has_value());
        auto [ec4, ac] = co_await a.async_connect("c:1");
        REQUIRE(!ec4);
        auto [ec5, ca] = co_await acc_c.value().async_accept();
        REQUIRE(!ec5);
        simulated_timer t(net.get_executor());
        t.expires_at(simulated_clock::time_point(55ms));
        auto [rec2, m2] = co_await ca.async_receive();  // waits past the fault's start
        CHECK(rec2 == std::errc::connection_reset);
        CHECK(simulated_clock::now() == simulated_clock::time_point(50ms));
        CHECK(!ca.is_open());
        CHECK(!ac.is_open());
        CHECK(!net.reachable("a", "c"));
        CHECK(net.reachable("a", "b"));
        auto [ec6, refused] = co_await a.async_connect("c:1");
        CHECK(ec6 == std::errc::connection_refused);
        (void)co_await t.async_wait(detail::use_tuple);
        t.expires_at(simulated_clock::time_point(60ms));
        (void)co_await t.async_wait(detail::use_tuple);
        auto [ec7, again] = co_await a.async_connect("c:1");
        CHECK(!ec7);
        CHECK(again.is_open());

        // Timers: cancel completes the wait with operation_aborted, at once.
        simulated_timer forever(net.get_executor(), simulated_clock::time_point::max());
        asio::post(net.get_executor(), [&] { forever.cancel(); });
        const auto before = simulated_clock::now();
        auto [tec] = co_await forever.async_wait(detail::use_tuple);
        CHECK(tec == asio::error::operation_aborted);
        CHECK(simulated_clock::now() == before);
        finished = true;
      },
      asio::detached);
  net.run();
  CHECK(finished);
}

namespace {

// One direction of a connection with a slow reader: the sender sends `count` messages of
// `msg_bytes` (64-byte header included) as fast as its sends complete; the receiver takes one
// every `read_every` of virtual time. Records, at each send's completion, how many messages the
// receiver had taken, and what the receiver got.
struct flow_run {
  std::vector<std::uint64_t> taken_at_send;  // per send: messages received when it completed
  std::vector<simulated_clock::time_point> sent_at;
  std::vector<std::uint64_t> seqs;  // received, in order
  bool payloads_intact = true;
  simulation_stats stats;
};

flow_run run_flow(std::size_t send_buffer_bytes, std::uint64_t count, std::size_t msg_bytes,
                  std::chrono::nanoseconds read_every) {
  simulation_options o;
  o.latency.base = 100us;
  o.latency.bytes_per_second = 1e8;  // 100 MB/s: the link outruns the reader
  o.send_buffer_bytes = send_buffer_bytes;
  simulated_network net(o);
  simulated_transport a(net, "a");
  simulated_transport b(net, "b");
  auto acc = b.listen("b:1");
  REQUIRE(acc.has_value());
  flow_run r;
  std::uint64_t received = 0;
  simulated_transport::connection server;
  bool accepted = false;
  asio::co_spawn(
      net.get_executor(),
      [&]() -> asio::awaitable<void> {
        auto [ec, s] = co_await acc.value().async_accept();
        REQUIRE(!ec);
        server = std::move(s);
        accepted = true;
        simulated_timer t(net.get_executor());
        for (std::uint64_t i = 0; i < count; ++i) {
          t.expires_after(read_every);
          (void)co_await t.async_wait(detail::use_tuple);
          auto [rec, m] = co_await server.async_receive();
          REQUIRE(!rec);
          r.seqs.push_back(m.header.seq);
          for (std::byte x : m.payload.bytes())
            if (x != static_cast<std::byte>(m.header.seq & 0xff)) r.payloads_intact = false;
          ++received;
        }
      },
      asio::detached);
  asio::co_spawn(
      net.get_executor(),
      [&]() -> asio::awaitable<void> {
        auto [ec, client] = co_await a.async_connect("b:1");
        REQUIRE(!ec);
        for (std::uint64_t i = 0; i < count; ++i) {
          message m;
          m.header.type = message_type::error;  // any payload is valid for an error
          m.header.seq = i;
          m.payload = a.allocate(msg_bytes - header_size);
          std::memset(m.payload.data(), static_cast<int>(i & 0xff), m.payload.size());
          CHECK(!(co_await client.async_send(std::move(m))));
          r.taken_at_send.push_back(received);
          r.sent_at.push_back(simulated_clock::now());
        }
      },
      asio::detached);
  net.run();
  CHECK(accepted);
  r.stats = net.stats();
  return r;
}

}  // namespace

TEST_CASE("simulation: a sender that outruns its reader waits at the send buffer's bound") {
  constexpr std::uint64_t count = 100;
  constexpr std::size_t msg = 1024;    // 64-byte header + 960 bytes
  constexpr std::size_t bound = 4096;  // room for 4 such messages
  const flow_run r = run_flow(bound, count, msg, 5ms);

  // Everything arrives, in order, intact.
  REQUIRE(r.seqs.size() == count);
  for (std::uint64_t i = 0; i < count; ++i) CHECK(r.seqs[i] == i);
  CHECK(r.payloads_intact);
  CHECK(r.stats.messages == count);

  // Each send completed only once the messages sent and not yet received fit in the bound
  // (its own included): the sender runs at the reader's pace, at most 4 messages ahead.
  REQUIRE(r.taken_at_send.size() == count);
  for (std::uint64_t i = 0; i < count; ++i) {
    INFO("send " << i);
    CHECK((i + 1 - r.taken_at_send[i]) * msg <= bound);
  }
  CHECK(r.sent_at[3] == r.sent_at[0]);  // the first 4 fit at once
  CHECK(r.sent_at[4] > r.sent_at[3]);   // the 5th waited for the reader
  CHECK(r.sent_at.back() >= simulated_clock::time_point(5ms * static_cast<int>(count - 4)));
  CHECK(r.stats.send_waits == count - 4);
  // Memory stays bounded: one direction never held more than the bound plus one message.
  CHECK(r.stats.max_queued_bytes > bound);
  CHECK(r.stats.max_queued_bytes <= bound + msg);

  // Unbounded (0): every send completes at once and all 100 messages queue up.
  const flow_run u = run_flow(0, count, msg, 5ms);
  REQUIRE(u.seqs.size() == count);
  for (std::uint64_t i = 0; i < count; ++i) CHECK(u.seqs[i] == i);
  CHECK(u.sent_at.back() == u.sent_at.front());
  CHECK(u.stats.send_waits == 0);
  CHECK(u.stats.max_queued_bytes == count * msg);

  // A message larger than the bound is sent once nothing is queued ahead of it: whole
  // messages, one at a time, the sender one message ahead of the reader.
  const flow_run big = run_flow(bound, 10, 3 * bound, 5ms);
  REQUIRE(big.seqs.size() == 10);
  for (std::uint64_t i = 0; i < 10; ++i) {
    CHECK(big.seqs[i] == i);
    CHECK(big.taken_at_send[i] >= i);  // everything before it was received
  }
  CHECK(big.payloads_intact);
  CHECK(big.stats.max_queued_bytes <= 2 * 3 * bound);
}

TEST_CASE("simulation: closing or a fault ends a send that waits for room") {
  simulation_options o;
  o.latency.base = 100us;
  o.send_buffer_bytes = 2048;
  simulated_network net(o);
  simulated_transport a(net, "a");
  simulated_transport b(net, "b");
  simulated_transport c(net, "c");
  net.link_down("a", "c", 10ms, 20ms);
  auto acc = b.listen("b:1");
  auto acc_c = c.listen("c:1");
  REQUIRE(acc.has_value());
  REQUIRE(acc_c.has_value());
  int done = 0;
  asio::co_spawn(
      net.get_executor(),
      [&]() -> asio::awaitable<void> {
        // The reader closes while the sender waits: the waiting send succeeds (its bytes
        // dropped, as later sends' are), at the close.
        auto [ec, client] = co_await a.async_connect("b:1");
        REQUIRE(!ec);
        auto accepted = co_await acc.value().async_accept();
        REQUIRE(!std::get<0>(accepted));
        auto& server = std::get<1>(accepted);  // (clang 14: no lambda captures of bindings)
        simulated_timer t(net.get_executor());
        t.expires_after(1ms);
        asio::co_spawn(
            net.get_executor(),
            [&]() -> asio::awaitable<void> {
              (void)co_await t.async_wait(detail::use_tuple);
              server.close();
            },
            asio::detached);
        const auto start = simulated_clock::now();
        for (int i = 0; i < 3; ++i) {
          message m;
          m.header.type = message_type::error;
          m.payload = a.allocate(1024 - header_size);
          CHECK(!(co_await client.async_send(std::move(m))));
        }
        CHECK(simulated_clock::now() == start + 1ms);  // the third waited until the close
        ++done;

        // A fault resets the connection: the waiting send fails with connection_reset.
        auto [ec3, ac] = co_await a.async_connect("c:1");
        REQUIRE(!ec3);
        auto [ec4, ca] = co_await acc_c.value().async_accept();
        REQUIRE(!ec4);
        std::error_code last;
        for (int i = 0; i < 3 && !last; ++i) {
          message m;
          m.header.type = message_type::error;
          m.payload = a.allocate(1024 - header_size);
          last = co_await ac.async_send(std::move(m));
        }
        CHECK(last == std::errc::connection_reset);
        CHECK(simulated_clock::now() == simulated_clock::time_point(10ms));
        CHECK(!ac.is_open());
        ++done;
      },
      asio::detached);
  net.run();
  CHECK(done == 2);
  CHECK(net.stats().send_waits == 2);
}

TEST_CASE("simulation: a wait_group wakes every waiter once its last counted coroutine is done") {
  simulated_network net;
  detail::wait_group<simulated_timer> group(net.get_executor());
  group.add(2);
  int woken = 0;
  for (int i = 0; i < 2; ++i)  // two waiters: neither's wait may cancel the other's
    asio::co_spawn(
        net.get_executor(),
        [&]() -> asio::awaitable<void> {
          co_await group.async_wait();
          CHECK(group.count() == 0);
          CHECK(simulated_clock::now() == simulated_clock::time_point(20ms));
          ++woken;
          co_await group.async_wait();  // nothing counted: completes at once
          ++woken;
        },
        asio::detached);
  net.at(10ms, [&] { group.done(); });
  net.at(20ms, [&] { group.done(); });
  net.run();
  CHECK(woken == 4);
  CHECK(net.now() == simulated_clock::time_point(20ms));  // the waits never moved the clock
}

namespace {

// Linear regression (examples/tutorial/linear_regression.hpp: 8 weights, Hessian about I,
// so SGD is stable below a step of about 2) trained by `workers` workers under `Policy` for
// `clocks` clocks each, with SGD of rate `lr` under update rule `rule`, on one shard of the
// simulated network (compute 10 ms +- 50%, so the pushes interleave). Returns the distance of
// the server's weights from the true ones, or +inf when a worker's run failed (a push the
// server refused as non-finite ends it) or a weight is not finite.
template <class Policy, class Rule>
double regression_error(std::uint32_t workers, float lr, Rule rule, std::uint64_t clocks,
                        std::uint64_t seed) {
  using opt_t = optimizer::with_update_rule<optimizer::sgd, Rule>;
  simulation_options so;
  so.seed = seed;
  so.compute.jitter = 0.5;
  simulated_network net(so);
  const std::vector<table_spec> layout(tutorial::linear_regression::layout.begin(),
                                       tutorial::linear_regression::layout.end());
  bench::sim_cluster<tutorial::linear_regression, Policy, opt_t> cluster(
      net, 1, workers, layout, opt_t{optimizer::sgd{lr}, rule});
  std::vector<tutorial::linear_regression> models;
  models.reserve(workers);
  for (std::uint32_t w = 0; w < workers; ++w) models.emplace_back(static_cast<unsigned>(w + 1));
  for (auto& m : models) cluster.add_worker(m, {}, clocks);
  cluster.run();
  const auto v = cluster.server(0).values(0);
  if (cluster.errors() != 0 ||
      !std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); }))
    return std::numeric_limits<double>::infinity();
  return tutorial::linear_regression::error(v);
}

}  // namespace

TEST_CASE("simulation: with 64 workers the sum of their pushes diverges; mean and "
          "staleness-aware converge as 1 worker does (SSP(3), ASP); capped linear scaling too "
          "under SSP(3), not ASP") {
  constexpr float lr = 0.2f;  // one worker: stable; 64 full steps per clock: not
  const double one = regression_error<consistency::ssp<3>>(1, lr, update_rule::sum{}, 200, 1);
  CHECK(one < 0.01);
  const update_rule::linear_scaling capped{.warmup_clocks = 5, .max_factor = 4};
  const auto each_policy = [&]<class P>(std::type_identity<P>) {
    CAPTURE(P::name);
    CHECK(regression_error<P>(64, lr, update_rule::sum{}, 40, 1) > 1.0);
    CHECK(regression_error<P>(64, lr, update_rule::mean{}, 200, 1) < 0.01);
    CHECK(regression_error<P>(64, lr, update_rule::staleness_aware{}, 80, 1) < 0.01);
    // Goyal et al.'s rule past its range (64 x the rate) diverges as the sum does.
    CHECK(regression_error<P>(64, lr, update_rule::linear_scaling{.warmup_clocks = 5}, 40, 1) >
          1.0);
  };
  each_policy(std::type_identity<consistency::ssp<3>>{});
  each_policy(std::type_identity<consistency::asp>{});
  // Capped at 4 x one worker's rate it converges with bounded staleness; under ASP (reads
  // stale by about 64 pushes) the same rate does not: a rule for synchronous training.
  CHECK(regression_error<consistency::ssp<3>>(64, lr, capped, 40, 1) < 0.01);
  CHECK(regression_error<consistency::asp>(64, lr, capped, 200, 1) > 0.1);
}
