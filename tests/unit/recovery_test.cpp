// Recovery in the server and worker loops, in process: a server is stopped mid-training and a
// fresh one (no state) takes its place after an outage; workers train on through it
// (recovery::stateless) and the new server is rebuilt from their replicas and backlogs.
// The counter model makes every delta countable: row w holds the number of worker w's pushes.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <stdexcept>
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
#include "asyncps/local_cluster.hpp"
#include "asyncps/recovery/chain/master.hpp"
#include "asyncps/recovery/chain_replication.hpp"
#include "asyncps/recovery/checkpoint.hpp"
#include "asyncps/recovery/replica_log.hpp"
#include "asyncps/recovery/stateless.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/in_process.hpp"
#include "asyncps/transport/simulated.hpp"
#include "asyncps/worker.hpp"
#include "counter_model.hpp"
#include "listen_and_serve.hpp"

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
  recovery::stateless_stats second_recovery{};  // the replacement server's part
  worker_stats workers{};
  recovery::stateless_worker_stats stateless{};  // summed over the workers' recovery parts
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
  asio::co_spawn(st.get_executor(), test::listen_and_serve(st, "shard0", *first), asio::detached);
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
        co_await test::listen_and_serve(st, "shard0", *second);
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
  r.second_recovery = second->recovery().stats();
  const auto v = second->values(0);
  for (std::uint32_t w = 0; w < workers; ++w) {
    r.rows.push_back(v[std::size_t{w} * 4]);
    r.clocks.push_back(models[w].clock);
    r.own_write_violations.push_back(models[w].own_write_violations);
    const auto& s = ws[w]->stats();
    r.workers.reconnects += s.reconnects;
    const auto& rs = ws[w]->recovery().stats();
    r.stateless.local_clocks += rs.local_clocks;
    r.stateless.backlogs_sent += rs.backlogs_sent;
    r.stateless.replicas_sent += rs.replicas_sent;
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
    CHECK(r.second_recovery.replicas_installed == 1);  // one table, rebuilt once
    CHECK(r.stateless.local_clocks > 0);               // they trained on during the outage
    CHECK(r.first.pushes < 400 * workers);             // the kill happened mid-run
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
  CHECK(result == errc::policy_mismatch);  // the refusal's own code (the error frame's seq)
  CHECK(server.stats().rejected == 1);
  CHECK(server.stats().pushes == 0);
  CHECK(logged.find("recovery 'stateless'") != std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Chain replication: one shard served by a chain of 3 servers and a chain master, 3 workers
// pushing integer deltas (row w counts worker w's pushes). Servers are killed (stopped with
// their connections cut, state gone) and restarted fresh while the workers train; a restarted
// server rejoins as the tail after a state transfer.
// ---------------------------------------------------------------------------------------------
namespace {

template <recovery::chain_mode Mode>
struct chain_run {
  using policy_t = recovery::chain_replication<Mode>;
  using cserver_t = basic_server<in_process_transport, consistency::ssp<2>, policy_t>;
  using cworker_t =
      basic_worker<test::counter_model, in_process_transport, consistency::ssp<2>, policy_t>;

  struct outcome {
    int kills = 0;
    int errors = 0;
    std::vector<std::int64_t> clocks;                // per worker
    std::vector<std::uint64_t> lost;                 // per worker (relaxed)
    std::vector<std::int64_t> own_write_violations;  // per worker
    std::vector<std::vector<float>> rows;            // per live member: row w (column 0)
    std::vector<std::vector<float>> values;          // per live member: whole shard
    std::vector<std::uint64_t> positions;            // per live member: log position
    std::uint64_t unacked_left = 0;
    std::uint64_t duplicates = 0, resent = 0, states = 0;
    std::string log;
  };

  // `kills` kills, cycling head, middle, tail (by the master's current chain order); each
  // after the head's server clock advanced `every` clocks since the previous recovery.
  static outcome run(std::uint32_t workers, std::uint64_t clocks, int kills, clock_value every,
                     std::uint64_t replicate_every = 200) {
    constexpr std::uint32_t members = 3;
    asio::io_context io(1);
    in_process_network net;
    outcome out;
    const auto t0 = std::chrono::steady_clock::now();
    auto sink = [&out, t0](std::string_view line) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - t0);
      out.log += std::to_string(ms.count()) + " ms " + std::string(line) + '\n';
      if (out.log.size() > (1u << 20)) out.log.erase(0, out.log.size() / 2);
    };
    std::vector<test::counter_model> models;
    for (std::uint32_t w = 0; w < workers; ++w) models.emplace_back(w, workers, 2, 4, 3 + w);
    server_options so;
    so.num_workers = workers;
    so.tables = {models[0].spec[0]};
    so.log = sink;
    typename policy_t::server_part part;
    part.options.heartbeat_interval = std::chrono::milliseconds(20);
    part.options.replicate_every = replicate_every;

    in_process_transport mt(asio::make_strand(io), net);
    chain_master_options mo;
    mo.members = members;
    mo.heartbeat_timeout = std::chrono::milliseconds(2000);
    mo.log = sink;
    basic_chain_master<in_process_transport> master(mt, mo);
    asio::co_spawn(mt.get_executor(), test::listen_and_serve(mt, "master", master), asio::detached);

    const std::vector<std::string> names{"s0", "s1", "s2"};
    std::vector<std::unique_ptr<in_process_transport>> sts;
    std::vector<std::unique_ptr<cserver_t>> generations;  // every server ever started
    std::vector<cserver_t*> live(members, nullptr);
    auto start = [&](std::uint32_t m) {
      sts.push_back(std::make_unique<in_process_transport>(asio::make_strand(io), net));
      auto& t = *sts.back();
      generations.push_back(std::make_unique<cserver_t>(t, so, optimizer::sgd{1.0f}, part));
      cserver_t* s = generations.back().get();
      s->recovery().set_chain(std::string("master"), names, m);
      live[m] = s;
      // The killed server's name may not be released yet: listen_and_serve retries.
      asio::co_spawn(t.get_executor(), test::listen_and_serve(t, names[m], *s), asio::detached);
    };
    for (std::uint32_t m = 0; m < members; ++m) start(m);

    std::vector<std::unique_ptr<in_process_transport>> wts;
    std::vector<std::unique_ptr<cworker_t>> ws;
    for (std::uint32_t w = 0; w < workers; ++w) {
      wts.push_back(std::make_unique<in_process_transport>(asio::make_strand(io), net));
      typename cworker_t::options_type o;
      o.id = w;
      o.servers = {"s0"};
      o.replicas = {{"s1", "s2"}};
      o.local_step = 1.0f;
      o.log = sink;
      ws.push_back(std::make_unique<cworker_t>(*wts.back(), models[w], o, std::nullopt));
    }
    bool training = true;
    std::uint32_t done = 0;
    auto finish_all = [&]() -> asio::awaitable<void> {
      // Quiescence: every live member at the same log position, then stop everything.
      asio::steady_timer t(mt.get_executor());
      for (int i = 0; i < 5000; ++i) {
        bool same = master.chain(0).size() == members;
        for (auto* s : live)
          same = same && s->recovery().log_position() == live[0]->recovery().log_position();
        if (same) break;
        t.expires_after(std::chrono::milliseconds(1));
        co_await t.async_wait(detail::use_tuple);
      }
      for (auto* s : live) {
        out.rows.emplace_back();
        const auto v = s->values(0);
        out.values.emplace_back(v.begin(), v.end());
        for (std::uint32_t w = 0; w < workers; ++w)
          out.rows.back().push_back(v[std::size_t{w} * 4]);
        out.positions.push_back(s->recovery().log_position());
      }
      for (auto& g : generations) {
        g->stop();
        out.duplicates += g->recovery().stats().duplicates;
        out.resent += g->recovery().stats().resent;
        out.states += g->recovery().stats().states_installed;
      }
      master.stop();
    };
    for (std::uint32_t w = 0; w < workers; ++w) {
      asio::co_spawn(
          wts[w]->get_executor(),
          [&, w]() -> asio::awaitable<void> {
            if (auto ec = co_await ws[w]->async_run(clocks)) {
              MESSAGE("worker " << w << ": " << ec.message());
              ++out.errors;
            }
            if (++done == workers) {
              training = false;
              asio::co_spawn(mt.get_executor(), finish_all(), asio::detached);
            }
          },
          asio::detached);
    }
    // The faults.
    asio::co_spawn(
        mt.get_executor(),
        [&]() -> asio::awaitable<void> {
          asio::steady_timer t(mt.get_executor());
          clock_value last = 0;
          for (int k = 0; k < kills && training; ++k) {
            // Wait for a full, caught-up chain and `every` clocks of progress at the head.
            for (;;) {
              const auto chain = master.chain(0);
              bool ready = chain.size() == members;
              for (auto* s : live) ready = ready && s->recovery().log_position() > 0;
              if (ready && live[chain[0]]->clock() >= last + every) break;
              if (!training) co_return;
              t.expires_after(std::chrono::microseconds(500));
              co_await t.async_wait(detail::use_tuple);
            }
            const auto chain = master.chain(0);
            const std::uint32_t victim = chain[static_cast<std::size_t>(k) % members];
            live[victim]->stop();
            ++out.kills;
            t.expires_after(std::chrono::milliseconds(2 + k % 5));
            co_await t.async_wait(detail::use_tuple);
            start(victim);
            last = live[chain[0] == victim ? chain[1] : chain[0]]->clock();
          }
        },
        asio::detached);
    io.run();
    for (std::uint32_t w = 0; w < workers; ++w) {
      out.clocks.push_back(models[w].clock);
      out.lost.push_back(ws[w]->stats().lost_pushes);
      out.own_write_violations.push_back(models[w].own_write_violations);
    }
    return out;
  }
};

}  // namespace

TEST_CASE("chain replication (strict): 21 kills of head, middle and tail lose and repeat nothing") {
  using run_t = chain_run<recovery::chain_mode::strict>;
  // The longer run: ASYNCPS_CHAIN_KILLS=N (e.g. 210) runs N kills, with the clocks scaled.
  int kills = 21;
  if (const char* env = std::getenv("ASYNCPS_CHAIN_KILLS")) kills = std::max(21, std::atoi(env));
  const std::uint32_t workers = 3;
  const std::uint64_t clocks = 8000 * static_cast<std::uint64_t>(kills) / 21;
  const auto r = run_t::run(workers, clocks, kills, 10);
  INFO(r.log.substr(r.log.size() > 6000 ? r.log.size() - 6000 : 0));
  REQUIRE(r.errors == 0);
  CHECK(r.kills == kills);
  CHECK(r.states >= static_cast<std::uint64_t>(kills));  // every restart got a state transfer
  REQUIRE(r.rows.size() == 3);
  for (std::size_t m = 0; m < r.rows.size(); ++m) {
    CAPTURE(m);
    CHECK(r.positions[m] == r.positions[0]);
    CHECK(r.values[m] == r.values[0]);  // replicas equal after quiescence, bit for bit
    for (std::uint32_t w = 0; w < workers; ++w) {
      CAPTURE(w);
      // Every push was acknowledged (a worker ends only when none is pending) and row w
      // counts worker w's applied pushes: equal means 0 lost and 0 applied twice.
      CHECK(r.clocks[w] == static_cast<std::int64_t>(clocks));
      CHECK(r.rows[m][w] == static_cast<float>(clocks));
      // Read-my-writes held through every failover (the resent pushes are not re-applied to
      // the worker's cache).
      if (m == 0) CHECK(r.own_write_violations[w] == 0);
    }
  }
  MESSAGE("strict chain: " << r.kills << " kills, " << r.duplicates << " duplicate pushes dropped, "
                           << r.resent << " entries resent, " << r.states << " state transfers");
}

TEST_CASE("chain replication (relaxed): a failover loses at most the pushes since the last copy") {
  using run_t = chain_run<recovery::chain_mode::relaxed>;
  const std::uint32_t workers = 3;
  const std::uint64_t clocks = 6000;
  const auto r = run_t::run(workers, clocks, 6, 40, 30);
  INFO(r.log.substr(r.log.size() > 6000 ? r.log.size() - 6000 : 0));
  if (std::getenv("CHAIN_LOG")) MESSAGE(r.log);
  REQUIRE(r.errors == 0);
  CHECK(r.kills >= 4);  // at least two of them hit the head (kills 0 and 3)
  REQUIRE(!r.rows.empty());
  // The head (first live member listed by the master) holds the result; row w = pushes of
  // worker w that survived: exactly its clocks minus the pushes it counted as lost.
  std::uint64_t lost = 0;
  for (std::uint32_t w = 0; w < workers; ++w) {
    CAPTURE(w);
    CHECK(r.clocks[w] == static_cast<std::int64_t>(clocks));
    lost += r.lost[w];
    bool some = false;
    for (const auto& rows : r.rows)
      some = some || rows[w] == static_cast<float>(clocks - r.lost[w]);
    CHECK(some);
  }
  // Two of the six kills hit the head; each loses at most replicate_every pushes (30) plus
  // the ones in flight (one clock per worker).
  CHECK(lost <= 2 * (30 + workers));
}

namespace {

// The whole chain dies: a chain of 2 (members 0 and 1), 2 workers. Member 0 (the head) is
// killed; once it is restarted and has registered with the master as the new tail, member 1 is
// killed before it can send the restarted server its state (the kill is posted from the
// master's log line "joins as the tail", before the master sends the new configurations).
// Member 1 is then restarted too. No server alive holds the shard's state.
template <recovery::chain_mode Mode>
struct chain_loss_outcome {
  std::vector<std::error_code> errors;  // per worker: async_run's result
  std::vector<std::uint64_t> lost, lost_acked, pushes, clocks, shards_lost;
  bool restarted_lost = false;         // the restarted member 0's shard_lost()
  std::uint64_t restarted_pushes = 0;  // pushes the restarted members applied
  std::uint64_t restarted_states = 0;  // state transfers they installed
  std::uint64_t restarted_shard_lost_refusals = 0;
  std::string log;
};

template <recovery::chain_mode Mode>
chain_loss_outcome<Mode> run_chain_total_loss() {
  using policy_t = recovery::chain_replication<Mode>;
  using cserver_t = basic_server<in_process_transport, consistency::ssp<2>, policy_t>;
  using cworker_t =
      basic_worker<test::counter_model, in_process_transport, consistency::ssp<2>, policy_t>;
  constexpr std::uint32_t workers = 2, members = 2;
  constexpr std::uint64_t clocks = 4000;  // far more than run before the faults
  asio::io_context io(1);
  in_process_network net;
  chain_loss_outcome<Mode> out;
  auto sink = [&out](std::string_view line) {
    out.log += std::string(line) + '\n';
    if (out.log.size() > (1u << 20)) out.log.erase(0, out.log.size() / 2);
  };
  std::vector<test::counter_model> models;
  for (std::uint32_t w = 0; w < workers; ++w) models.emplace_back(w, workers, 2, 4, 5 + w);
  server_options so;
  so.num_workers = workers;
  so.tables = {models[0].spec[0]};
  so.log = sink;
  typename policy_t::server_part part;
  part.options.heartbeat_interval = std::chrono::milliseconds(20);
  part.options.replicate_every = 10;

  const std::vector<std::string> names{"s0", "s1"};
  std::vector<std::unique_ptr<in_process_transport>> sts;
  std::vector<std::unique_ptr<cserver_t>> generations;
  std::vector<cserver_t*> live(members, nullptr);
  auto start = [&](std::uint32_t m) {
    sts.push_back(std::make_unique<in_process_transport>(asio::make_strand(io), net));
    auto& t = *sts.back();
    generations.push_back(std::make_unique<cserver_t>(t, so, optimizer::sgd{1.0f}, part));
    live[m] = generations.back().get();
    live[m]->recovery().set_chain(std::string("master"), names, m);
    asio::co_spawn(t.get_executor(), test::listen_and_serve(t, names[m], *live[m]), asio::detached);
  };

  in_process_transport mt(asio::make_strand(io), net);
  bool kill_on_join = false;
  chain_master_options mo;
  mo.members = members;
  mo.heartbeat_timeout = std::chrono::milliseconds(2000);
  mo.log = [&](std::string_view line) {
    sink(line);
    if (kill_on_join && line.find("joins as the tail") != std::string_view::npos) {
      kill_on_join = false;
      asio::post(mt.get_executor(), [&] { live[1]->stop(); });  // before the new configs
    }
  };
  basic_chain_master<in_process_transport> master(mt, mo);
  asio::co_spawn(mt.get_executor(), test::listen_and_serve(mt, "master", master), asio::detached);
  for (std::uint32_t m = 0; m < members; ++m) start(m);

  std::vector<std::unique_ptr<in_process_transport>> wts;
  std::vector<std::unique_ptr<cworker_t>> ws;
  out.errors.resize(workers);
  for (std::uint32_t w = 0; w < workers; ++w) {
    wts.push_back(std::make_unique<in_process_transport>(asio::make_strand(io), net));
    typename cworker_t::options_type o;
    o.id = w;
    o.servers = {"s0"};
    o.replicas = {{"s1"}};
    o.local_step = 1.0f;
    o.log = sink;
    ws.push_back(std::make_unique<cworker_t>(*wts.back(), models[w], o, std::nullopt));
  }
  std::uint32_t done = 0;
  for (std::uint32_t w = 0; w < workers; ++w) {
    asio::co_spawn(
        wts[w]->get_executor(),
        [&, w]() -> asio::awaitable<void> {
          out.errors[w] = co_await ws[w]->async_run(clocks);
          if (++done < workers) co_return;
          asio::post(mt.get_executor(), [&] {
            for (std::size_t g = 2; g < generations.size(); ++g) {  // the restarted members
              const auto& r = generations[g]->recovery();
              out.restarted_pushes += generations[g]->stats().pushes;
              out.restarted_states += r.stats().states_installed;
              if (g == 2) out.restarted_lost = r.shard_lost();
            }
            for (auto& g : generations) g->stop();
            master.stop();
          });
        },
        asio::detached);
  }
  // The faults.
  asio::co_spawn(
      mt.get_executor(),
      [&]() -> asio::awaitable<void> {
        asio::steady_timer t(mt.get_executor());
        const auto wait_for = [&](auto pred) -> asio::awaitable<void> {
          while (!pred()) {
            t.expires_after(std::chrono::microseconds(500));
            co_await t.async_wait(detail::use_tuple);
          }
        };
        co_await wait_for([&] {
          return master.chain(0).size() == members && live[1]->recovery().log_position() > 0 &&
                 live[0]->clock() >= 30;
        });
        live[0]->stop();  // the head
        co_await wait_for([&] { return master.chain(0) == std::vector<std::uint32_t>{1}; });
        kill_on_join = true;
        start(0);  // registers, joins as the tail; member 1 dies before the state transfer
        co_await wait_for([&] { return master.chain(0) == std::vector<std::uint32_t>{0}; });
        start(1);
      },
      asio::detached);
  io.run();
  for (std::uint32_t w = 0; w < workers; ++w) {
    out.lost.push_back(ws[w]->stats().lost_pushes);
    out.lost_acked.push_back(ws[w]->stats().lost_acknowledged);
    out.shards_lost.push_back(ws[w]->stats().shards_lost);
    out.pushes.push_back(ws[w]->stats().pushes);
    out.clocks.push_back(static_cast<std::uint64_t>(models[w].clock));
  }
  return out;
}

template <recovery::chain_mode Mode>
void check_chain_total_loss() {
  const auto r = run_chain_total_loss<Mode>();
  INFO(r.log.substr(r.log.size() > 8000 ? r.log.size() - 8000 : 0));
  // The restarted member 0 became head without the shard's state: it serves nothing.
  CHECK(r.restarted_lost);
  CHECK(r.restarted_states == 0);
  CHECK(r.restarted_pushes == 0);
  CHECK(r.log.find("shard 0 is lost") != std::string::npos);
  for (std::size_t w = 0; w < r.errors.size(); ++w) {
    CAPTURE(w);
    // Every worker stops with the named error, and counts every push it made as lost: the
    // shard's state, and with it every push applied to it, is gone.
    CHECK(r.errors[w] == recovery::chain_errc::shard_lost);
    CHECK(r.errors[w] == condition::fatal);
    CHECK(r.shards_lost[w] == 1);  // generic: the policy answered refusal_action::lost once
    CHECK(r.clocks[w] < 4000);
    CHECK(r.lost[w] > 0);
    CHECK(r.lost[w] + 2 >= r.clocks[w]);  // one push per clock; the last may not have gone out
    CHECK(r.lost[w] <= r.clocks[w]);
    if constexpr (Mode == recovery::chain_mode::strict) {
      // Acknowledged: all but the window of unacked pushes (max_unacked, 64).
      CHECK(r.lost_acked[w] > 0);
      CHECK(r.lost_acked[w] <= r.lost[w]);
      CHECK(r.lost[w] - r.lost_acked[w] <= 64);
    } else {
      CHECK(r.lost_acked[w] == 0);  // relaxed workers get no acks
    }
    MESSAGE("worker " << w << ": " << r.clocks[w] << " clocks, " << r.lost[w] << " pushes lost ("
                      << r.lost_acked[w] << " acknowledged)");
  }
}

}  // namespace

TEST_CASE("chain replication (strict): a whole chain dies: no initial state is served and the loss "
          "is counted") {
  check_chain_total_loss<recovery::chain_mode::strict>();
}

TEST_CASE("chain replication (relaxed): a whole chain dies: no initial state is served and the "
          "loss is counted") {
  check_chain_total_loss<recovery::chain_mode::relaxed>();
}

TEST_CASE("recovery::none: a grace period rides out nothing it should not; the run ends cleanly") {
  // The server is stopped mid-run; during the grace period a fresh server (without the
  // worker's pushes) comes back. The worker must end with server_lost, never train on from
  // lost parameters and never hang; without a server at all it ends after the grace period.
  for (const bool comes_back : {false, true}) {
    CAPTURE(comes_back);
    using none_server = basic_server<in_process_transport, policy>;
    using none_worker = basic_worker<test::counter_model, in_process_transport, policy>;
    asio::io_context io(1);
    in_process_network net;
    in_process_transport st(asio::make_strand(io), net);
    in_process_transport wt(asio::make_strand(io), net);
    test::counter_model model(0, 1, 0);
    server_options so;
    so.tables = {model.spec[0]};
    so.log = [](std::string_view) {};
    auto first = std::make_unique<none_server>(st, so, optimizer::sgd{1.0f});
    std::unique_ptr<none_server> second;
    none_worker::options_type o;
    o.servers = {"s"};
    std::string logged;
    o.log = [&](std::string_view line) { logged += std::string(line) + '\n'; };
    recovery::none::worker_part part;
    part.grace = std::chrono::milliseconds(300);
    none_worker worker(wt, model, o, std::nullopt, part);
    asio::co_spawn(st.get_executor(), test::listen_and_serve(st, "s", *first), asio::detached);
    asio::co_spawn(
        st.get_executor(),
        [&]() -> asio::awaitable<void> {
          asio::steady_timer t(st.get_executor());
          while (first->clock() < 20) {
            t.expires_after(std::chrono::microseconds(200));
            co_await t.async_wait(detail::use_tuple);
          }
          first->stop();
          if (!comes_back) co_return;
          t.expires_after(std::chrono::milliseconds(50));
          co_await t.async_wait(detail::use_tuple);
          second = std::make_unique<none_server>(st, so, optimizer::sgd{1.0f});
          co_await test::listen_and_serve(st, "s", *second);
        },
        asio::detached);
    std::error_code result;
    asio::co_spawn(
        wt.get_executor(),
        [&]() -> asio::awaitable<void> {
          result = co_await worker.async_run(1000000);
          asio::post(st.get_executor(), [&] {
            if (second) second->stop();
          });
        },
        asio::detached);
    const auto start = std::chrono::steady_clock::now();
    io.run();
    const auto took = std::chrono::steady_clock::now() - start;
    CHECK(result == errc::server_lost);
    CHECK(model.clock < 1000000);
    if (comes_back) {
      CHECK(logged.find("came back without") != std::string::npos);
    } else {
      CHECK(took >= std::chrono::milliseconds(300));  // it tried for the whole grace period
      CHECK(logged.find("giving up") != std::string::npos);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// local_cluster: the in-process bring-up of S shards and W workers, and its failure reports.
// ---------------------------------------------------------------------------------------------
namespace {

// Two tables (5 x 3 and 4 x 2, so both are split across 2 shards); worker w's gradient at
// position k (k = 1, 2, ... in table-major order, table 1 from 101) is -(w + 1) * k. With SGD
// (learning rate 1) and W workers after C clocks every value is C * W(W+1)/2 * k: the
// assembled tables show whether each row came from the right shard. Under BSP a read at
// clock c must see every update of clocks < c (read-my-writes included), and no more than the
// other workers' clock-c updates.
struct grid_model {
  explicit grid_model(std::uint32_t id, std::uint32_t workers, std::uint32_t extra_rows = 0)
      : id(id), workers(workers), layout{{{0, 5 + extra_rows, 3, 0.0f}, {1, 4, 2, 0.0f}}} {}
  std::span<const table_spec> tables() const { return layout; }
  static float position(table_id t, std::size_t i) { return float(t * 100 + i + 1); }
  float compute_gradient(const parameter_view& p, gradient_view& g) {
    if (throw_at == clock) throw std::runtime_error("grid_model: failing on purpose");
    const float per_clock = float(workers * (workers + 1) / 2);
    for (table_id t = 0; t < 2; ++t) {
      const auto in = p.span(t);
      const auto out = g.span(t);
      for (std::size_t i = 0; i < in.size(); ++i) {
        // Updates seen, in units of one clock's gradient of worker 0: all of clocks < c, maybe
        // some other workers' clock-c updates, never this worker's own clock-c update.
        const float seen = in[i] / position(t, i);
        const float low = float(clock) * per_clock, high = low + per_clock - float(id + 1);
        if (seen < low || seen > high || seen != std::floor(seen)) ++bsp_violations;
        out[i] = -float(id + 1) * position(t, i);
      }
    }
    ++clock;
    return 0.0f;
  }
  std::uint32_t id, workers;
  std::array<table_spec, 2> layout;
  std::int64_t clock = 0;
  std::int64_t bsp_violations = 0;
  std::int64_t throw_at = -1;
};

template <class Transport>
void check_exact_sum(cluster_threads threads,
                     std::chrono::microseconds spin = std::chrono::microseconds(0)) {
  constexpr std::uint32_t workers = 3;
  constexpr std::uint64_t clocks = 30;
  local_cluster<grid_model, consistency::bsp, recovery::none, optimizer::sgd, Transport> cluster(
      {.servers = 2,
       .workers = workers,
       .threads = threads,
       .pool_threads = 2,
       .spin = spin,
       .log = [](std::string_view) {}},
      [](std::uint32_t w) { return grid_model(w, workers); }, optimizer::sgd{1.0f});
  const auto r = cluster.run(clocks);
  INFO(r.failure);
  REQUIRE(r.ok());
  REQUIRE(r.tables.size() == 2);
  for (table_id t = 0; t < 2; ++t) {
    REQUIRE(r.tables[t].size() == r.layout[t].size());
    for (std::size_t i = 0; i < r.tables[t].size(); ++i) {
      CAPTURE(t);
      CAPTURE(i);
      CHECK(r.tables[t][i] == float(clocks * 6) * grid_model::position(t, i));
    }
  }
  CHECK(r.table(1)(3, 1) == float(clocks * 6 * 108));  // the last row, from shard 1
  for (const auto& s : r.servers) {
    CHECK(!s.error);
    CHECK(s.clock == clocks);
    CHECK(s.stats.pushes >= clocks * workers);  // every worker pushed every clock to it
  }
  REQUIRE(r.models.size() == workers);
  for (std::uint32_t w = 0; w < workers; ++w) {
    CAPTURE(w);
    CHECK(!r.workers[w].error);
    CHECK(r.workers[w].clock == clocks);
    CHECK(r.workers[w].stats.clocks == clocks);
    CHECK(r.models[w].clock == clocks);
    CHECK(r.models[w].bsp_violations == 0);
    CHECK(r.workers[w].staleness.max() == 0);
  }
}

}  // namespace

TEST_CASE("local_cluster: BSP server values are the exact sum of every worker's updates") {
  SUBCASE("in-process, a thread per node") {
    check_exact_sum<in_process_transport>(cluster_threads::one_per_node);
  }
  SUBCASE("in-process, one thread") {
    check_exact_sum<in_process_transport>(cluster_threads::single);
  }
  SUBCASE("loopback TCP, a thread per node") {
    check_exact_sum<tcp_transport>(cluster_threads::one_per_node);
  }
  SUBCASE("in-process, a strand per node on a pool of 2 threads") {
    check_exact_sum<in_process_transport>(cluster_threads::pool);
  }
  SUBCASE("loopback TCP, a strand per node on a pool of 2 threads") {
    check_exact_sum<tcp_transport>(cluster_threads::pool);
  }
  // local_cluster_options::spin: the node threads poll before they sleep (run_polling); the
  // sums are the same, and the run ends (a polling thread still sees its context stop).
  SUBCASE("in-process, a thread per node, polling 50 us before sleeping") {
    check_exact_sum<in_process_transport>(cluster_threads::one_per_node,
                                          std::chrono::microseconds(50));
  }
  SUBCASE("loopback TCP, a pool of 2 threads, polling 50 us before sleeping") {
    check_exact_sum<tcp_transport>(cluster_threads::pool, std::chrono::microseconds(50));
  }
}

TEST_CASE("local_cluster: a failing worker is named with its error and the others stop") {
  constexpr std::uint32_t workers = 3;
  for (const auto threads : {cluster_threads::one_per_node, cluster_threads::single}) {
    // Worker 1's layout has an extra row: the servers refuse it.
    local_cluster<grid_model, consistency::bsp> cluster(
        {.servers = 2, .workers = workers, .threads = threads, .log = [](std::string_view) {}},
        [](std::uint32_t w) { return grid_model(w, workers, w == 1 ? 1 : 0); },
        optimizer::sgd{1.0f});
    const auto r = cluster.run(1000);
    CHECK(!r.ok());
    CHECK(r.error == errc::layout_mismatch);
    CHECK(r.failure.rfind("worker 1: ", 0) == 0);
    CHECK(r.workers[1].error == errc::layout_mismatch);
    // BSP: the others cannot pass clock 1 without worker 1, and end when the servers stop.
    CHECK(r.workers[0].error);
    CHECK(r.workers[2].error);
    CHECK(r.workers[0].clock <= 1);
    for (const auto& s : r.servers) CHECK(!s.error);
  }
}

TEST_CASE("local_cluster: an exception in compute_gradient stops the cluster and is rethrown") {
  for (const auto threads : {cluster_threads::single, cluster_threads::one_per_node}) {
    CAPTURE(threads == cluster_threads::single);
    local_cluster<grid_model, consistency::bsp> cluster(
        {.servers = 1, .workers = 2, .threads = threads, .log = [](std::string_view) {}},
        [](std::uint32_t w) {
          grid_model m(w, 2);
          if (w == 1) m.throw_at = 5;
          return m;
        });
    CHECK_THROWS_AS(cluster.run(1000), std::runtime_error);
  }
  CHECK_THROWS_AS((local_cluster<grid_model, consistency::bsp>({.workers = 0}, nullptr).run(1)),
                  std::invalid_argument);
}

namespace {

// A recovery policy whose server part implements every server hook with the default's
// behaviour and records the calls (consecutive repeats once): the order below is the order
// basic_server calls them in. `refuse` makes on_hello refuse workers (a policy-made error).
struct counting_server_hooks {
  static constexpr std::string_view name = "counting-server-hooks";
  // Refusals use chain replication's codes (a policy may name another's enum as its own).
  using error_enum = recovery::chain_errc;
  static constexpr recovery::chain_errc last_error = recovery::chain_errc::member_id_in_use;
  struct server_part {
    std::vector<std::string>* calls = nullptr;
    bool refuse = false;
    void note(const char* hook) const {
      if (calls->empty() || calls->back() != hook) calls->push_back(hook);
    }
    template <class Ctx>
    void on_start(Ctx&) {
      note("on_start");
    }
    template <class Ctx>
    std::error_code on_serve(Ctx) {
      note("on_serve");
      return {};
    }
    template <class Ctx>
    std::error_code on_hello(Ctx, const frame_header&, std::string& detail) {
      note("on_hello");
      if (!refuse) return {};
      detail = " (refused by the test policy)";
      return recovery::chain_errc::not_head;
    }
    template <class Ctx>
    std::uint8_t welcome_flags(Ctx, const frame_header&) {
      note("welcome_flags");
      return 0;
    }
    template <class Ctx>
    void on_rejoin(Ctx, std::uint32_t, clock_value, clock_value) {
      note("on_rejoin");
    }
    template <class Ctx>
    std::optional<std::error_code> on_unknown_peer(Ctx, detail::session_base&, const message&,
                                                   std::string&) {
      note("on_unknown_peer");
      return std::nullopt;
    }
    template <class Ctx>
    std::error_code on_peer_message(Ctx, detail::session_base&, message&, std::string&) {
      note("on_peer_message");
      return {};
    }
    template <class Ctx>
    void on_session_closed(Ctx, detail::session_base&) {
      note("on_session_closed");
    }
    template <class Ctx>
    std::error_code on_recovery_push(Ctx, detail::session_base&, message&, std::string&) {
      note("on_recovery_push");
      return errc::unexpected_message;
    }
    template <class Ctx>
    std::optional<std::error_code> on_worker_message(Ctx, detail::session_base&, message& m,
                                                     std::string&) {
      note(m.header.type == message_type::push   ? "on_worker_message(push)"
           : m.header.type == message_type::pull ? "on_worker_message(pull)"
                                                 : "on_worker_message");
      return std::nullopt;
    }
    template <class Ctx>
    bool on_push(Ctx, detail::session_base&, const frame_header&) {
      note("on_push");
      return false;
    }
    void on_update(table_id, std::uint64_t, std::uint32_t, std::span<const float>) {
      note("on_update");
    }
    template <class Ctx>
    bool on_applied(Ctx, detail::session_base&, const message&) {
      note("on_applied");
      return false;
    }
    template <class Ctx>
    void on_clock(clock_value, Ctx&) {
      note("on_clock");
    }
    void on_stop() { note("on_stop"); }
  };
  using worker_part = recovery::none::worker_part;
};
static_assert(recovery_policy<counting_server_hooks>);

// counting_server_hooks' server part, with a worker part that records the refusals the
// worker hands to its recovery policy (`on_refused`) and answers each with `answer`.
struct refusal_hooks {
  static constexpr std::string_view name = "refusal-hooks";
  using server_part = counting_server_hooks::server_part;
  using error_enum = counting_server_hooks::error_enum;
  static constexpr auto last_error = counting_server_hooks::last_error;
  struct worker_part : recovery::none_worker_part {
    std::vector<std::error_code>* refusals = nullptr;
    refusal_action answer = refusal_action::fail;
    refusal_action on_refused(std::uint32_t shard, std::error_code code) const noexcept {
      CHECK(shard == 0);
      refusals->push_back(code);
      return answer;
    }
  };
};
static_assert(recovery_policy<refusal_hooks>);

// Serves one simulated shard with `part`, runs one worker (recovery part `wpart`) for `clocks`
// clocks; returns the worker's result.
template <class Policy = counting_server_hooks>
std::error_code run_counting(counting_server_hooks::server_part part, int clocks,
                             typename Policy::worker_part wpart = {}) {
  simulated_network net;
  test::counter_model model(0, 1, 0, 2, 1, 0);
  simulated_transport st(net, "server0"), wt(net, "worker0");
  server_options so;
  so.num_workers = 1;
  so.tables = {model.spec[0]};
  so.log = [](std::string_view) {};
  basic_server<simulated_transport, consistency::bsp, Policy> server(st, so, {}, part);
  auto acc = st.listen("shard0");
  REQUIRE(acc.has_value());
  asio::co_spawn(
      net.get_executor(),
      [&server, a = std::move(acc).value()]() mutable -> asio::awaitable<void> {
        (void)co_await server.async_serve(std::move(a));
      },
      asio::detached);
  worker_options<std::string> o;
  o.servers = {"shard0"};
  o.connect_timeout = std::chrono::milliseconds(50);
  o.log = [](std::string_view) {};
  basic_worker<test::counter_model, simulated_transport, consistency::bsp, Policy> w(
      wt, model, o, std::nullopt, wpart);
  std::error_code ec = errc::timeout;
  asio::co_spawn(
      net.get_executor(),
      [&]() -> asio::awaitable<void> {
        ec = co_await w.async_run(static_cast<std::uint64_t>(clocks));
      },
      asio::detached);
  net.run();
  asio::post(net.get_executor(), [&] { server.stop(); });
  net.run();
  return ec;
}

}  // namespace

TEST_CASE("server hooks: the order a server calls them in (2 clocks, no failure)") {
  std::vector<std::string> calls;
  counting_server_hooks::server_part part;
  part.calls = &calls;
  CHECK(!run_counting(part, 2));
  // Start, serve, the worker's hello and welcome; per clock its push is checked, applied
  // (on_update, on_applied) and advances the server clock (on_clock); its session closes
  // after its bye, and the server stops.
  // Every message of the registered worker passes on_worker_message first (pull, push, bye).
  CHECK(calls == std::vector<std::string>{"on_start", "on_serve", "on_hello", "welcome_flags",
                                          "on_worker_message(pull)", "on_worker_message(push)",
                                          "on_push", "on_update", "on_applied", "on_clock",
                                          "on_worker_message(pull)", "on_worker_message(push)",
                                          "on_push", "on_update", "on_applied", "on_clock",
                                          "on_worker_message", "on_session_closed", "on_stop"});
}

TEST_CASE("server hooks: a hook's refusal reaches the worker with its code") {
  std::vector<std::string> calls;
  counting_server_hooks::server_part part;
  part.calls = &calls;
  part.refuse = true;  // not_head; recovery::none's worker does not fail over: fails at once
  CHECK(run_counting(part, 2) == recovery::chain_errc::not_head);
  CHECK(std::count(calls.begin(), calls.end(), "welcome_flags") == 0);
  CHECK(std::count(calls.begin(), calls.end(), "on_push") == 0);
}

TEST_CASE("worker hooks: the recovery policy decides what a server's refusal means") {
  std::vector<std::string> calls;
  counting_server_hooks::server_part part;
  part.calls = &calls;
  part.refuse = true;  // every hello is refused with not_head
  std::vector<std::error_code> refusals;
  refusal_hooks::worker_part wpart;
  wpart.refusals = &refusals;
  const std::error_code not_head = recovery::chain_errc::not_head;
  SUBCASE("fail: the run ends with the refusal's code, after one hello") {
    wpart.answer = refusal_action::fail;
    CHECK(run_counting<refusal_hooks>(part, 2, wpart) == not_head);
    CHECK(refusals == std::vector<std::error_code>{not_head});
  }
  SUBCASE("next_server: the worker tries again (its only server) until connect_timeout") {
    wpart.answer = refusal_action::next_server;
    CHECK(run_counting<refusal_hooks>(part, 2, wpart) == not_head);
    CHECK(refusals.size() >= 2);
    CHECK(std::count(refusals.begin(), refusals.end(), not_head) ==
          static_cast<std::ptrdiff_t>(refusals.size()));
  }
  CHECK(std::count(calls.begin(), calls.end(), "on_push") == 0);
}

TEST_CASE("chain replication (strict): a restarted worker's pushes are applied on every member") {
  // Worker 0 trains, finishes; a new worker object with the same id (a restarted process: a
  // new incarnation whose sequence numbers start again at 1) trains on. Its pushes must be
  // applied by the head and the tail, not dropped as duplicates of the first one's.
  using policy_t = recovery::chain_replication<recovery::chain_mode::strict>;
  using cserver_t = basic_server<in_process_transport, consistency::ssp<2>, policy_t>;
  using cworker_t =
      basic_worker<test::counter_model, in_process_transport, consistency::ssp<2>, policy_t>;
  asio::io_context io(1);
  in_process_network net;
  std::string log;
  auto sink = [&log](std::string_view line) { (log += line) += '\n'; };
  server_options so;
  so.num_workers = 1;
  so.tables = {test::counter_model(0, 1, 2).spec[0]};
  so.log = sink;
  policy_t::server_part part;
  part.options.heartbeat_interval = std::chrono::milliseconds(20);
  in_process_transport mt(io.get_executor(), net);
  chain_master_options mo;
  mo.members = 2;
  mo.log = sink;
  basic_chain_master<in_process_transport> master(mt, mo);
  asio::co_spawn(io, test::listen_and_serve(mt, "master", master), asio::detached);
  const std::vector<std::string> names{"s0", "s1"};
  std::vector<std::unique_ptr<in_process_transport>> sts;
  std::vector<std::unique_ptr<cserver_t>> servers;
  for (std::uint32_t m = 0; m < 2; ++m) {
    sts.push_back(std::make_unique<in_process_transport>(io.get_executor(), net));
    servers.push_back(std::make_unique<cserver_t>(*sts.back(), so, optimizer::sgd{1.0f}, part));
    servers.back()->recovery().set_chain(std::string("master"), names, m);
    asio::co_spawn(io, test::listen_and_serve(*sts.back(), names[m], *servers.back()),
                   asio::detached);
  }
  in_process_transport wt(io.get_executor(), net);
  std::array<test::counter_model, 2> models{test::counter_model(0, 1, 2),
                                            test::counter_model(0, 1, 2)};
  std::array<std::error_code, 2> errors;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        for (std::size_t i = 0; i < 2; ++i) {
          cworker_t::options_type o;
          o.id = 0;
          o.servers = {"s0"};
          o.replicas = {{"s1"}};
          o.local_step = 1.0f;
          o.wait_timeout = std::chrono::seconds(10);
          o.log = sink;
          cworker_t w(wt, models[i], o, std::nullopt);
          errors[i] = co_await w.async_run(20 * (i + 1));
        }
        // Let the tail catch up, then compare the members.
        asio::steady_timer t(io.get_executor());
        for (int k = 0; k < 2000 && servers[1]->recovery().log_position() !=
                                        servers[0]->recovery().log_position();
             ++k) {
          t.expires_after(std::chrono::milliseconds(1));
          co_await t.async_wait(detail::use_tuple);
        }
        for (auto& s : servers) s->stop();
        master.stop();
      },
      asio::detached);
  io.run();
  INFO(log);
  CHECK(!errors[0]);
  CHECK(!errors[1]);
  REQUIRE(models[1].clock > 0);  // the restarted worker trained
  const float pushes = static_cast<float>(models[0].clock + models[1].clock);
  for (auto& s : servers) {
    CHECK(s->values(0)[0] == pushes);  // row 0 counts worker 0's applied pushes
    CHECK(s->recovery().stats().duplicates == 0);
  }
  CHECK(servers[0]->recovery().log_position() == servers[1]->recovery().log_position());
}

TEST_CASE("recovery stats: for_each_counter lists every counter by name, += adds them up") {
  // The names, and the values as doubles (every counter here is small).
  struct listing {
    std::vector<std::string> names;
    std::vector<double> values;
  };
  const auto list = [](const auto& stats) {
    listing l;
    stats.for_each_counter([&](const char* name, const auto& value) {
      l.names.emplace_back(name);
      l.values.push_back(static_cast<double>(value));
    });
    return l;
  };

  recovery::stateless_worker_stats sw{1, 2, 3};
  sw += recovery::stateless_worker_stats{10, 20, 30};
  const auto lsw = list(sw);
  CHECK(lsw.names == std::vector<std::string>{"local_clocks", "backlogs_sent", "replicas_sent"});
  CHECK(lsw.values == std::vector<double>{11, 22, 33});

  recovery::stateless_stats ss{1, 2, 3};
  ss += ss;
  const auto lss = list(ss);
  CHECK(lss.names ==
        std::vector<std::string>{"replicas_installed", "backlogs_merged", "backlog_clocks"});
  CHECK(lss.values == std::vector<double>{2, 4, 6});

  recovery::chain_stats cs{1, 2, 3, 4, 5, 6, 7};
  cs += recovery::chain_stats{1, 1, 1, 1, 1, 1, 1};
  const auto lcs = list(cs);
  CHECK(lcs.names == std::vector<std::string>{"entries", "duplicates", "resent", "states_sent",
                                              "states_installed", "configs", "claims_refused"});
  CHECK(lcs.values == std::vector<double>{2, 3, 4, 5, 6, 7, 8});

  // Over several workers the max_* counters are the most one worker held; the rest add up.
  recovery::replica_log_worker_stats rw{1, 100, 500, 10, 70, 2, 3, 4};
  rw += recovery::replica_log_worker_stats{1, 50, 900, 20, 60, 1, 1, 1};
  const auto lrw = list(rw);
  CHECK(lrw.names == std::vector<std::string>{"log_entries", "log_bytes", "max_log_bytes",
                                              "replica_bytes", "max_replica_bytes",
                                              "replicas_stored", "replayed", "orders"});
  CHECK(lrw.values == std::vector<double>{2, 150, 900, 30, 70, 3, 4, 5});

  // Per-shard figures (positions, seconds): listed, not summed.
  recovery::replica_log_stats rs{};
  rs.recoveries = 2;
  rs.last_recovery_seconds = 0.5;
  const auto lrs = list(rs);
  REQUIRE(lrs.names.size() == 19);
  CHECK(lrs.names[1] == "orders_sent");
  CHECK(lrs.names[5] == "recoveries");
  CHECK(lrs.values[5] == 2);
  CHECK(lrs.names.back() == "last_recovery_seconds");
  CHECK(lrs.values.back() == 0.5);

  recovery::checkpoint_stats ks{};
  ks.checkpoints_persisted = 3;
  const auto lks = list(ks);
  REQUIRE(lks.names.size() == 13);
  CHECK(lks.names.front() == "checkpoints_persisted");
  CHECK(lks.values.front() == 3);
  CHECK(lks.names[3] == "last_persisted_clock");
  CHECK(lks.values[3] == -1);  // no file persisted yet
}
