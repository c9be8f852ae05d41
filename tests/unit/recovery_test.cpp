// Recovery in the server and worker loops, in process: a server is stopped mid-training and a
// fresh one (no state) takes its place after an outage; workers train on through it
// (recovery::stateless) and the new server is rebuilt from their replicas and backlogs.
// The counter model makes every delta countable: row w holds the number of worker w's pushes.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>
#include <doctest/doctest.h>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/recovery/stateless.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/in_process.hpp"
#include "asyncps/worker.hpp"
#include "counter_model.hpp"

using namespace asyncps;

namespace {

using policy = consistency::bsp;
using server_t = basic_server<in_process_transport, policy, recovery::stateless>;
using worker_t =
    basic_worker<test::counter_model, in_process_transport, policy, recovery::stateless>;

struct outage_result {
  std::vector<float> rows;  // the final server's value of row w (column 0)
  std::vector<std::int64_t> clocks;
  std::vector<std::int64_t> own_write_violations;
  server_stats first{}, second{};
  worker_stats workers{};
  int errors = 0;
};

// Runs `workers` workers for `clocks` clocks against one shard; when the server clock reaches
// `kill_at` the server is stopped, and `outage` later a fresh server replaces it.
outage_result run_outage(std::uint32_t workers, std::uint64_t clocks, clock_value kill_at,
                         std::chrono::milliseconds outage) {
  asio::io_context io(1);
  asio::thread_pool compute(2);
  in_process_network net;
  std::vector<test::counter_model> models;
  for (std::uint32_t w = 0; w < workers; ++w) models.emplace_back(w, workers, 0, 4, 7, 300);
  server_options so;
  so.num_workers = workers;
  so.tables = {models[0].spec[0]};
  so.log = [](std::string_view) {};
  recovery::stateless::server_part part;
  part.options.rule = recovery::merge_rule::sum;  // exact: each delta counts once

  in_process_transport st(asio::make_strand(io), net);
  auto first = std::make_unique<server_t>(st, so, optimizer::sgd{1.0f}, part);
  std::unique_ptr<server_t> second;
  outage_result r;

  std::atomic<std::uint32_t> done{0};
  auto serve = [&](server_t& s) -> asio::awaitable<void> {
    auto acc = st.listen("shard0");
    REQUIRE(acc.has_value());
    (void)co_await s.async_serve(std::move(acc).value());
  };
  asio::co_spawn(st.get_executor(), serve(*first), asio::detached);
  // The fault: stop the first server at `kill_at`, start a fresh one after `outage`.
  asio::co_spawn(
      st.get_executor(),
      [&]() -> asio::awaitable<void> {
        asio::steady_timer t(st.get_executor());
        while (first->clock() < kill_at) {
          t.expires_after(std::chrono::microseconds(200));
          co_await t.async_wait(detail::use_tuple);
        }
        first->stop();
        t.expires_after(outage);
        co_await t.async_wait(detail::use_tuple);
        r.first = first->stats();
        second = std::make_unique<server_t>(st, so, optimizer::sgd{1.0f}, part);
        co_await serve(*second);
      },
      asio::detached);

  std::vector<std::unique_ptr<in_process_transport>> wts;
  std::vector<std::unique_ptr<worker_t>> ws;
  for (std::uint32_t w = 0; w < workers; ++w) {
    wts.push_back(std::make_unique<in_process_transport>(asio::make_strand(io), net));
    worker_t::options_type o;
    o.id = w;
    o.servers = {"shard0"};
    o.local_step = 1.0f;
    o.log = [](std::string_view) {};
    ws.push_back(std::make_unique<worker_t>(*wts.back(), models[w], o, compute.get_executor()));
  }
  for (std::uint32_t w = 0; w < workers; ++w) {
    asio::co_spawn(
        wts[w]->get_executor(),
        [&, w]() -> asio::awaitable<void> {
          if (auto ec = co_await ws[w]->async_run(clocks)) {
            MESSAGE("worker " << w << ": " << ec.message());
            ++r.errors;
          }
          if (++done == workers) {
            asio::co_spawn(
                st.get_executor(),
                [&]() -> asio::awaitable<void> {
                  asio::steady_timer t(st.get_executor());
                  while (!second || second->connections() != 0) {
                    t.expires_after(std::chrono::milliseconds(1));
                    co_await t.async_wait(detail::use_tuple);
                  }
                  second->stop();
                },
                asio::detached);
          }
        },
        asio::detached);
  }
  io.run();
  compute.join();
  REQUIRE(second);
  r.second = second->stats();
  const auto v = second->values(0);
  for (std::uint32_t w = 0; w < workers; ++w) {
    r.rows.push_back(v[std::size_t{w} * 4]);
    r.clocks.push_back(models[w].clock);
    r.own_write_violations.push_back(models[w].own_write_violations);
    const auto& s = ws[w]->stats();
    r.workers.reconnects += s.reconnects;
    r.workers.local_clocks += s.local_clocks;
    r.workers.backlogs_sent += s.backlogs_sent;
    r.workers.replicas_sent += s.replicas_sent;
  }
  return r;
}

}  // namespace

TEST_CASE("stateless: a restarted server is rebuilt from replicas, backlogs merged exactly once") {
  for (const int ms : {5, 40, 150}) {
    CAPTURE(ms);
    const std::uint32_t workers = 3;
    const auto r = run_outage(workers, 400, 60, std::chrono::milliseconds(ms));
    REQUIRE(r.errors == 0);
    CHECK(r.workers.reconnects == workers);
    CHECK(r.second.replicas_installed == 1);  // one table, rebuilt once
    CHECK(r.workers.local_clocks > 0);        // they trained on during the outage
    CHECK(r.first.pushes < 400 * workers);    // the kill happened mid-run
    int exact = 0;
    for (std::uint32_t w = 0; w < workers; ++w) {
      CAPTURE(w);
      CHECK(r.clocks[w] == 400);
      // Row w counts worker w's deltas (SGD, learning rate 1, sum rule). Never more than it
      // made: nothing is applied twice. The installed replica's own row is exact; another
      // worker may miss one clock (BSP): pushes the dead server took after the replica's last
      // read of them.
      const auto pushes = static_cast<float>(r.clocks[w]);
      CHECK(r.rows[w] <= pushes);
      CHECK(r.rows[w] >= pushes - 1.0f);
      if (r.rows[w] == pushes) {
        ++exact;
        CHECK(r.own_write_violations[w] == 0);  // read-my-writes held through the outage
      }
    }
    CHECK(exact >= 1);
  }
}

TEST_CASE("a worker built with another recovery policy is refused by name, not misread") {
  asio::io_context io(1);
  in_process_network net;
  in_process_transport st(asio::make_strand(io), net);
  in_process_transport wt(asio::make_strand(io), net);
  test::counter_model model(0, 1, 0);
  server_options so;
  so.tables = {model.spec[0]};
  std::string logged;
  so.log = [&](std::string_view line) { logged += std::string(line) + '\n'; };
  server_t server(st, so, optimizer::sgd{1.0f});
  using none_worker = basic_worker<test::counter_model, in_process_transport, policy>;
  none_worker::options_type o;
  o.servers = {"s"};
  o.log = [](std::string_view) {};
  none_worker worker(wt, model, o);
  auto acc = st.listen("s");
  REQUIRE(acc.has_value());
  asio::co_spawn(
      st.get_executor(),
      [&]() -> asio::awaitable<void> { (void)co_await server.async_serve(std::move(acc).value()); },
      asio::detached);
  std::error_code result;
  asio::co_spawn(
      wt.get_executor(),
      [&]() -> asio::awaitable<void> {
        result = co_await worker.async_run(5);
        server.stop();
      },
      asio::detached);
  io.run();
  CHECK(result == errc::unexpected_message);
  CHECK(server.stats().rejected == 1);
  CHECK(server.stats().pushes == 0);
  CHECK(logged.find("recovery 'stateless'") != std::string::npos);
}
