// Consistency bounds under real concurrency: servers and workers on their own strands of a
// multi-threaded io_context, gradients on a thread pool, random compute delays per clock.
// Every read is checked by the counter model (tests/support/counter_model.hpp):
//   - bounded policies: a worker at clock c has seen every update from clocks <= c-s-1,
//   - every policy: it sees all of its own writes (read-my-writes),
// and ESSP's observed staleness is lower than SSP's on the same schedule; VAP (visibility acks
// and row broadcasts) completes with every update applied once. The sparse counter model
// (sparse pulls: a random half of the rows each clock) is checked on every row it reads.
#include <memory>
#include <thread>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>
#include <doctest/doctest.h>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/in_process.hpp"
#include "asyncps/transport/tcp.hpp"
#include "asyncps/worker.hpp"
#include "counter_model.hpp"

using namespace asyncps;

namespace {

struct run_result {
  std::int64_t bound_violations = 0;
  std::int64_t own_write_violations = 0;
  std::int64_t max_lag = 0;
  staleness_histogram staleness;
  int errors = 0;
  clock_value server_clock = 0;
  std::uint64_t value_waits = 0;  // VAP
  std::uint64_t rows_pushed = 0;  // rows messages the workers got unrequested
  std::uint64_t sparse_pulls = 0;
};

template <class Transport, class Policy, class Model = test::counter_model>
run_result run(std::int64_t bound, std::uint64_t seed, int max_delay_us, std::uint32_t workers,
               std::uint64_t clocks, float vap_magnitude = 0) {
  asio::io_context io(4);
  asio::thread_pool compute(2);
  std::unique_ptr<in_process_network> net;
  auto make = [&]() {
    if constexpr (std::is_same_v<Transport, tcp_transport>) {
      return std::make_unique<tcp_transport>(asio::make_strand(io));
    } else {
      if (!net) net = std::make_unique<in_process_network>();
      return std::make_unique<in_process_transport>(asio::make_strand(io), *net);
    }
  };
  using endpoint = typename Transport::endpoint_type;
  std::vector<Model> models;
  for (std::uint32_t w = 0; w < workers; ++w)
    models.emplace_back(w, workers, bound, 8, seed, max_delay_us);
  const std::uint32_t shards = 2;
  std::vector<std::unique_ptr<Transport>> sts;
  std::vector<std::unique_ptr<basic_server<Transport, Policy>>> servers;
  std::vector<endpoint> eps;
  for (std::uint32_t s = 0; s < shards; ++s) {
    sts.push_back(make());
    server_options so;
    so.shard = s;
    so.num_shards = shards;
    so.num_workers = workers;
    so.tables = {models[0].spec[0]};
    servers.push_back(
        std::make_unique<basic_server<Transport, Policy>>(*sts.back(), so, optimizer::sgd{1.0f}));
    endpoint ep{};
    if constexpr (std::is_same_v<Transport, tcp_transport>) {
      ep = endpoint{asio::ip::make_address("127.0.0.1"), 0};
    } else {
      ep = "shard" + std::to_string(s);
    }
    auto acc = sts.back()->listen(ep);
    REQUIRE(acc.has_value());
    if constexpr (std::is_same_v<Transport, tcp_transport>) ep = acc.value().local_endpoint();
    eps.push_back(ep);
    asio::co_spawn(sts.back()->get_executor(), servers.back()->async_serve(std::move(acc).value()),
                   asio::detached);
  }
  using worker_t = basic_worker<Model, Transport, Policy>;
  std::vector<std::unique_ptr<Transport>> wts;
  std::vector<std::unique_ptr<worker_t>> ws;
  std::atomic<std::uint32_t> done{0};
  std::atomic<int> errors{0};
  for (std::uint32_t w = 0; w < workers; ++w) {
    wts.push_back(make());
    typename worker_t::options_type o;
    o.id = w;
    o.servers = eps;
    o.local_step = 1.0f;
    ws.push_back(std::make_unique<worker_t>(*wts.back(), models[w], o, compute.get_executor()));
    if constexpr (is_value_bounded_v<Policy>) ws.back()->consistency().magnitude = vap_magnitude;
  }
  for (std::uint32_t w = 0; w < workers; ++w) {
    asio::co_spawn(
        wts[w]->get_executor(),
        [&, w]() -> asio::awaitable<void> {
          if (auto ec = co_await ws[w]->async_run(clocks)) {
            MESSAGE("worker " << w << ": " << ec.message());
            ++errors;
          }
          if (++done == workers) {
            // Stop each server once it has read everything its workers sent (they said bye).
            for (std::uint32_t s = 0; s < shards; ++s) {
              asio::co_spawn(
                  sts[s]->get_executor(),
                  [&, s]() -> asio::awaitable<void> {
                    asio::steady_timer t(co_await asio::this_coro::executor);
                    while (servers[s]->connections() != 0) {
                      t.expires_after(std::chrono::milliseconds(1));
                      co_await t.async_wait(detail::use_tuple);
                    }
                    servers[s]->stop();
                  },
                  asio::detached);
            }
          }
        },
        asio::detached);
  }
  std::thread t1([&] { io.run(); });
  std::thread t2([&] { io.run(); });
  io.run();
  t1.join();
  t2.join();
  compute.join();
  run_result r;
  r.errors = errors;
  r.server_clock = servers[0]->clock();
  for (std::uint32_t w = 0; w < workers; ++w) {
    r.bound_violations += models[w].bound_violations;
    r.own_write_violations += models[w].own_write_violations;
    r.max_lag = std::max(r.max_lag, models[w].max_lag);
    r.staleness += ws[w]->staleness();
    r.value_waits += ws[w]->stats().value_waits;
    r.rows_pushed += ws[w]->stats().eager_messages;
    r.sparse_pulls += ws[w]->stats().sparse_pulls;
  }
  return r;
}

template <class Transport, class Policy, class Model = test::counter_model>
void check_bounded(std::int64_t s, std::uint64_t seeds) {
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    const auto r = run<Transport, Policy, Model>(s, seed, 400, 4, 40);
    if constexpr (sparse_read_source<Model>) CHECK(r.sparse_pulls > 0);
    CHECK(r.errors == 0);
    CHECK(r.bound_violations == 0);
    CHECK(r.own_write_violations == 0);
    CHECK(r.max_lag <= 2 * s + 1);
    CHECK(r.staleness.max() <= s);
    CHECK(r.server_clock == 40);
  }
}

}  // namespace

TEST_CASE("BSP, SSP and ESSP bounds hold on every read under random delays (in-process)") {
  check_bounded<in_process_transport, consistency::bsp>(0, 3);
  check_bounded<in_process_transport, consistency::ssp<1>>(1, 3);
  check_bounded<in_process_transport, consistency::ssp<3>>(3, 3);
  check_bounded<in_process_transport, consistency::essp<2>>(2, 3);
}

TEST_CASE("BSP, SSP and ESSP bounds hold on every read under random delays (TCP)") {
  check_bounded<tcp_transport, consistency::bsp>(0, 2);
  check_bounded<tcp_transport, consistency::ssp<2>>(2, 2);
  check_bounded<tcp_transport, consistency::essp<2>>(2, 2);
}

TEST_CASE("sparse reads: bounds hold on every row read under random delays (TCP, in-process)") {
  using model = test::sparse_counter_model;
  check_bounded<in_process_transport, consistency::bsp, model>(0, 2);
  check_bounded<tcp_transport, consistency::ssp<2>, model>(2, 2);
  check_bounded<tcp_transport, consistency::essp<2>, model>(2, 2);
  const auto r = run<tcp_transport, consistency::asp, model>(-1, 3, 400, 4, 40);
  CHECK(r.errors == 0);
  CHECK(r.own_write_violations == 0);
  CHECK(r.server_clock == 40);
  CHECK(r.sparse_pulls > 0);
}

TEST_CASE("ASP: no bound, but every update arrives and own writes are visible") {
  const auto r = run<in_process_transport, consistency::asp>(-1, 7, 400, 4, 40);
  CHECK(r.errors == 0);
  CHECK(r.own_write_violations == 0);
  CHECK(r.server_clock == 40);
}

#if defined(__SANITIZE_THREAD__)
constexpr bool built_with_tsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool built_with_tsan = true;
#else
constexpr bool built_with_tsan = false;
#endif
#else
constexpr bool built_with_tsan = false;
#endif

TEST_CASE("ESSP's observed staleness is lower than SSP's on the same schedule") {
  double ssp_mean = 0, essp_mean = 0;
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    const auto a = run<in_process_transport, consistency::ssp<3>>(3, seed, 300, 4, 60);
    const auto b = run<in_process_transport, consistency::essp<3>>(3, seed, 300, 4, 60);
    CHECK(a.bound_violations == 0);
    CHECK(b.bound_violations == 0);
    MESSAGE("seed " << seed << ": SSP(3) staleness " << a.staleness.to_string() << " mean "
                    << a.staleness.mean() << "; ESSP(3) " << b.staleness.to_string() << " mean "
                    << b.staleness.mean());
    ssp_mean += a.staleness.mean();
    essp_mean += b.staleness.mean();
  }
  // Real threads: the comparison depends on timing. ThreadSanitizer slows every access 5-15x,
  // so ESSP's eager rows no longer arrive ahead of the reads (one TSan run of 7 under load:
  // 5.860 vs 5.848). The schedule-exact claim is simulation_test's ("ESSP's observed
  // staleness is lower than SSP's on the same schedules"); under TSan this test checks the
  // bounds only.
  if (!built_with_tsan) CHECK(essp_mean < ssp_mean);
}

TEST_CASE("VAP under real concurrency: visibility acks, row broadcasts, every update once") {
  // Counter model, width 8: each update has L2 norm sqrt(8) ~ 2.83 (learning rate 1). A bound
  // of 3 lets one update be in transit; the next waits for its visibility ack.
  const auto a = run<in_process_transport, consistency::vap>(-1, 3, 300, 4, 40, 3.0f);
  CHECK(a.errors == 0);
  CHECK(a.own_write_violations == 0);
  CHECK(a.server_clock == 40);
  CHECK(a.rows_pushed > 0);
  const auto b = run<tcp_transport, consistency::vap>(-1, 4, 300, 4, 40, 3.0f);
  CHECK(b.errors == 0);
  CHECK(b.own_write_violations == 0);
  CHECK(b.server_clock == 40);
  MESSAGE("VAP: clocks that waited for visibility: in-process " << a.value_waits << ", TCP "
                                                                << b.value_waits);
}
