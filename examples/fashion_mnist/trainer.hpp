// fashion_mnist — `train<Recovery, Optimizers...>`, which maps the command line's consistency
// and optimizer choices onto compile-time instantiations of basic_server and basic_worker, and
// `run`, which starts this process's servers and workers and reports the run. It names no
// concrete recovery policy: what differs between policies comes from `recovery_flags`
// (policy_flags.hpp), their counters from their stats (`for_each_counter`, `operator+=`).
// Progress and metrics: monitor.hpp.
//
// Build time on 2 cores shapes this file: the staleness bound is a run-time value
// (`ssp<>`/`essp<>`), servers are instantiated per (lazy/eager/VAP, optimizer) only, the
// models' Eigen kernels live in any_model.cpp, and each recovery policy's instantiations live
// in their own translation unit (train_*.cpp), so they compile in parallel.
#pragma once

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "any_model.hpp"
#include "asyncps/asyncps.hpp"
#include "config.hpp"
#include "dataset.hpp"
#include "monitor.hpp"
#include "policy_flags.hpp"
#include "serve_until_done.hpp"
#include "server_setup.hpp"

namespace fashion {

// A server only uses its policy's `eager` and value-bounded flags (the staleness bound travels
// in each pull as the minimum clock wanted, VAP's bound is the worker's), so the example
// instantiates one server per (eager / VAP / lazy, optimizer) rather than one per staleness
// value: this keeps its build time reasonable on 2 cores. The lazy and eager servers are
// `ssp<>` and `essp<>`, whose bound is a run-time value the server never holds: a server of a
// compile-time bound (`bsp`, `essp<0>`) would bound a hello's clock with that bound
// (docs/wire-format.md, "Clocks in hello"), 0 under --staleness 3 or ASP, and say "staleness
// 0" when it refused one (issue 32).
template <class Consistency>
using server_policy =
    std::conditional_t<asyncps::is_value_bounded_v<Consistency>, asyncps::consistency::vap,
                       std::conditional_t<Consistency::eager, asyncps::consistency::essp<>,
                                          asyncps::consistency::ssp<>>>;
/// Whether `Consistency` takes its staleness bound at run time (`ssp<>`, `essp<>`).
template <class Consistency>
inline constexpr bool run_time_bound = std::is_same_v<Consistency, asyncps::consistency::ssp<>> ||
                                       std::is_same_v<Consistency, asyncps::consistency::essp<>>;
template <class Consistency, class Optimizer, class Recovery>
using server_type =
    asyncps::basic_server<asyncps::tcp_transport, server_policy<Consistency>, Recovery, Optimizer>;
template <class Consistency, class Recovery>
using worker_type = asyncps::basic_worker<any_model, asyncps::tcp_transport, Consistency, Recovery>;

/// The counters of the recovery parts of `workers` (unique_ptrs to basic_worker), summed with
/// the stats' `operator+=` and keyed by the names `for_each_counter` gives; an empty object
/// when the policy's worker part keeps no counters.
template <class Workers>
nlohmann::json worker_part_counters(const Workers& workers) {
  nlohmann::json out = nlohmann::json::object();
  using worker = typename Workers::value_type::element_type;
  if constexpr (requires(const worker& w) { w.recovery().stats(); }) {
    std::remove_cvref_t<decltype(std::declval<const worker&>().recovery().stats())> sum{};
    for (const auto& w : workers) sum += w->recovery().stats();
    sum.for_each_counter([&](const char* name, const auto& value) { out[name] = value; });
  }
  return out;
}

/// Starts the servers --role asks for, one per shard (--role all: every shard on a free
/// loopback port; --role server: shard --shard on --listen, or the one the rendezvous
/// assigns), each serving until its workers are done; `extras` (the policy's
/// `server_extras`) is called around each. False, with a line on stderr, when one cannot
/// start.
template <class Server, class Optimizer, class Extras>
bool start_servers(server_setup<Server>& setup, Optimizer opt, Extras& extras) {
  using Recovery = typename Server::recovery_type;
  const config& c = setup.c;
  auto& endpoints = setup.endpoints;
  auto& servers = setup.servers;
  auto& server_transports = setup.server_transports;
  auto& io = setup.io;
  const auto& layout = setup.layout;
  const std::uint32_t first = c.role == "all" ? 0 : c.shard;
  const std::uint32_t last = c.role == "all" ? c.servers : c.shard + 1;
  for (std::uint32_t k = first; k < last; ++k) {
    std::uint32_t s = k;  // the shard (the rendezvous may assign another)
    auto ep = asyncps::parse_tcp_endpoint(c.role == "all" ? "127.0.0.1:0" : c.listen);
    if (!ep) {
      std::cerr << "fashion_mnist: --listen: expected host:port, got '" << c.listen << "'\n";
      return false;
    }
    auto& t = server_transports.emplace_back(
        std::make_unique<asyncps::tcp_transport>(asio::make_strand(io), tcp_opts(c)));
    auto acc = t->listen(ep.value());
    if (!acc) {
      std::cerr << "fashion_mnist: cannot listen on " << c.listen << ": " << acc.error().message()
                << '\n';
      return false;
    }
    endpoints.push_back(acc.value().local_endpoint());
    if (c.role == "server" && c.on_listening) {  // publish the address at the rendezvous
      const auto shard = c.on_listening(endpoints.back().port());
      if (!shard) return false;
      s = *shard;
    }
    auto so = server_opts(c, s, layout);
    auto part = recovery_flags<Recovery>::server_part(c, s);
    std::function<void(bool)> tick = extras.prepare(part);
    auto& srv = servers.emplace_back(std::make_unique<Server>(*t, so, opt, std::move(part)));
    extras.attach(*srv);
    // Elastic: the job ends once the workers needed to start have come and every member
    // has left again (the capacity need not be filled).
    const std::uint32_t until_seen = c.elastic && c.min_workers != 0 ? c.min_workers : c.workers;
    asio::co_spawn(
        t->get_executor(),
        serve_until_done(*srv, std::move(acc).value(), until_seen, std::move(tick),
                         std::chrono::milliseconds(static_cast<std::int64_t>(c.linger * 1000))),
        asio::detached);
    if (c.role == "server")
      std::cout << "server " << s << " of " << c.servers << " listening on " << endpoints.back()
                << " (" << c.consistency << ", recovery " << Recovery::name << ")" << std::endl;
  }
  return true;
}

template <class Consistency, class Optimizer, class Recovery>
int run(const config& c, Optimizer opt) {
  using server_t = server_type<Consistency, Optimizer, Recovery>;
  using worker_t = worker_type<Consistency, Recovery>;
  // Data: workers need the training set; the evaluating worker also the test set.
  // (a server process loads none, a worker process only its part: load_data).
  fashion::dataset train, test;
  std::vector<asyncps::table_spec> layout;
  if (!load_data(c, train, test, layout)) return 2;

  // Threads follow the cores: every server shard and every worker has a strand of its own on
  // `io`, run by `threads` threads; gradients run on `compute` (--io-threads and
  // --compute-threads; 0: the machine's cores).
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const unsigned threads = c.io_threads != 0 ? c.io_threads : cores;
  asio::io_context io(static_cast<int>(threads));
  asio::thread_pool compute(c.compute_threads != 0 ? c.compute_threads : cores);
  asio::thread_pool slow_compute(1);  // the straggler's own thread (--slow-worker)
  monitor mon(c, test);
  if (!mon.metrics) {
    std::cerr << "fashion_mnist: --metrics: cannot write " << c.metrics << '\n';
    return 2;
  }

  // Servers of this process: started by the policy's companion (`server_extras`, see
  // policy_flags.hpp), or one per shard by start_servers.
  using flags = recovery_flags<Recovery>;
  std::vector<std::unique_ptr<asyncps::tcp_transport>> server_transports;
  std::vector<std::unique_ptr<server_t>> servers;
  std::vector<asyncps::tcp_transport::endpoint_type> endpoints;
  std::vector<std::vector<asyncps::tcp_transport::endpoint_type>> replicas;
  using server_extras = typename flags::template server_extras<server_t>;
  server_extras extras(c);
  server_setup<server_t> setup{c, layout, io, server_transports, servers, endpoints, replicas};
  if constexpr (server_extras::starts_servers) {
    if (!extras.start(setup, opt)) return 2;
  } else if ((c.role == "all" && !c.external_servers) || c.role == "server") {
    if (!start_servers(setup, opt, extras)) return 2;
  }
  if (c.role == "worker" || c.external_servers) {
    // With several servers per shard (chain replication) --connect lists every server of
    // every shard, shard-major.
    const std::uint32_t per_shard = flags::servers_per_shard(c);
    for (std::size_t i = 0; i < c.connect.size(); ++i) {
      auto ep = asyncps::parse_tcp_endpoint(c.connect[i]);
      if (!ep) {
        std::cerr << "fashion_mnist: --connect: expected host:port, got '" << c.connect[i] << "'\n";
        return 2;
      }
      if (i % per_shard == 0) {
        endpoints.push_back(ep.value());
        replicas.emplace_back();
      } else {
        replicas.back().push_back(ep.value());
      }
    }
  }

  // Workers of this process.
  const double epochs = c.epochs;
  const auto shard_size = train.file_size() / c.workers;
  const auto clocks = static_cast<std::uint64_t>(epochs * static_cast<double>(shard_size) /
                                                 static_cast<double>(c.batch));
  std::vector<std::unique_ptr<asyncps::tcp_transport>> worker_transports;
  std::vector<std::unique_ptr<any_model>> models;
  std::vector<std::unique_ptr<worker_t>> workers;
  std::atomic<int> failures{0};
  std::atomic<int> shards_lost{0};  // workers that learned a shard is lost (worker_stats)
  std::atomic<std::size_t> finished{0};
  if (c.role == "all" || c.role == "worker") {
    const std::uint32_t first = c.role == "all" ? 0 : c.worker_id;
    const std::uint32_t last = c.role == "all" ? c.workers : c.worker_id + 1;
    for (std::uint32_t w = first; w < last; ++w) {
      const std::size_t i = w - first;
      auto& t = worker_transports.emplace_back(
          std::make_unique<asyncps::tcp_transport>(asio::make_strand(io), tcp_opts(c)));
      auto& m = models.emplace_back(std::make_unique<any_model>(c, train, w, c.workers));
      typename worker_t::options_type o;
      o.id = w;
      o.servers = endpoints;
      o.replicas = replicas;
      // Read-my-writes: the step a fresh push of this worker takes (exact for SGD under the
      // sum and mean rules; an estimate under the others).
      o.local_step = opt.local_step() * opt.rule.scale({.worker = w, .workers = c.workers});
      o.connect_timeout = std::chrono::seconds(30);
      if (c.push_window >= 0) o.push_window = static_cast<std::uint32_t>(c.push_window);
      // The job ends at clock `clocks`: a worker that joins late (elastic), or a restarted
      // worker process that rejoins where its shards have its clock, trains to that clock,
      // not `clocks` more from where it joined (it would run past the others' end and wait
      // for them until its wait timeout; issue 32).
      o.end_clock = static_cast<asyncps::clock_value>(clocks);
      // The first worker of this process reports progress and evaluates; `samples` counts
      // every worker's (in separate processes each worker reports for all, assuming equal speed).
      const std::uint64_t per_clock = std::uint64_t{c.batch} * (c.role == "all" ? 1 : c.workers);
      o.on_clock = [&, i, per_clock, model = m.get()](const asyncps::clock_report& r) {
        mon.samples += per_clock;
        if (i == 0) mon.on_clock(r, *model, workers[0]->staleness());
        if (mon.diverged) workers[i]->stop_at(r.clock);
      };
      workers.push_back(std::make_unique<worker_t>(
          *t, *m, o,
          any_model::is_slow(c, w) ? slow_compute.get_executor() : compute.get_executor(),
          flags::worker_part(c)));
      if constexpr (run_time_bound<Consistency>) {
        // BSP is SSP with bound 0.
        workers.back()->consistency().staleness = c.consistency == "bsp" ? 0 : c.staleness;
      }
      if constexpr (asyncps::is_value_bounded_v<Consistency>) {
        workers.back()->consistency().magnitude = c.vap_magnitude;
        workers.back()->consistency().shrink = c.vap_shrink;
      }
    }
    // --eval servers|both: the evaluations of this process's first worker read the servers'
    // model (asyncps::async_read_model), on a thread of their own.
    if (c.eval != "worker" && !models.empty())
      mon.reader =
          std::make_unique<evaluator>(endpoints, layout, tcp_opts(c), *models.front(), test);
    for (std::size_t i = 0; i < workers.size(); ++i) {
      asio::co_spawn(
          worker_transports[i]->get_executor(),
          [&, p = workers[i].get()]() -> asio::awaitable<void> {
            if (auto ec = co_await p->async_run(clocks)) {
              std::cerr << "\nworker " << p->options().id << ": " << ec.message() << '\n';
              ++failures;
              if (p->stats().shards_lost != 0) ++shards_lost;
            }
            // Once every worker is done the servers of this process stop (chain servers serve
            // until then), the policy's companion first (the chain master: so it does not
            // report the servers' exits as failures).
            if (++finished == workers.size()) {
              extras.stop();
              for (std::size_t k = 0; k < servers.size(); ++k)
                asio::post(server_transports[k]->get_executor(),
                           [s = servers[k].get()] { s->stop(); });
            }
          },
          asio::detached);
    }
  }

  std::cout << "fashion_mnist: " << c.model << ", " << c.consistency;
  if (c.consistency == "ssp" || c.consistency == "essp") std::cout << "(" << c.staleness << ")";
  if constexpr (asyncps::is_value_bounded_v<Consistency>)
    std::cout << "(magnitude " << c.vap_magnitude << (c.vap_shrink ? "/sqrt(c+1)" : "") << ")";
  if (c.slow_factor > 1) std::cout << ", worker " << c.slow_worker << " slowed x" << c.slow_factor;
  std::cout << ", recovery " << Recovery::name << ", " << c.servers << " servers, " << c.workers
            << " workers, " << epochs << " epochs (" << clocks << " clocks of " << c.batch
            << " per worker), update rule " << opt.rule.chosen_name() << ", lr " << c.lr
            << ", role " << c.role << std::endl;

  std::vector<std::thread> pool;
  for (unsigned i = 1; i < threads; ++i) pool.emplace_back([&] { io.run(); });
  io.run();
  for (auto& t : pool) t.join();
  compute.join();
  slow_compute.join();
  if (mon.tty && !c.quiet) std::cout << '\n';

  mon.stop_reader();
  if (c.role == "server") return failures == 0 ? 0 : 1;
  // Final model: the servers' parameters (read in place when they live in this process, else
  // as a reader while they still serve), else worker 0's cache.
  std::vector<float> final_params;
  const char* final_source = "servers";
  {  // One server per shard (chain replication: the head, it has every acknowledged push).
    std::vector<std::unique_ptr<server_t>> holders;
    for (auto& s : servers)
      if (flags::holds_final_model(s->recovery())) holders.push_back(std::move(s));
    servers = std::move(holders);
  }
  if (!servers.empty() && servers.size() == c.servers) {
    final_params.resize(asyncps::layout_size(layout));
    for (auto& s : servers) s->copy_values_into(final_params);
  } else if (std::string why = mon.reader ? mon.reader->read_now(final_params, clocks > 0 ? 1 : 0)
                                          : "--eval worker";
             !why.empty()) {
    final_source = "worker 0's cache";
    std::cout << "final model: worker 0's cache (the servers' model was not read: " << why << ")\n";
    final_params.clear();
    const auto view = workers.front()->cache();
    for (std::size_t t = 0; t < layout.size(); ++t) {
      const auto sp = view.span(static_cast<asyncps::table_id>(t));
      final_params.insert(final_params.end(), sp.begin(), sp.end());
    }
  }
  const asyncps::parameter_view final_view(layout, final_params.data());
  const auto e = models.front()->evaluate(final_view, test);
  asyncps::staleness_histogram st;
  for (auto& w : workers) st += w->staleness();
  const double secs = mon.elapsed();
  // The clock every worker of this process reached (a failed run stops short of `clocks`).
  auto reached = static_cast<asyncps::clock_value>(clocks);
  for (auto& w : workers) reached = std::min(reached, w->clock());
  const bool failed = failures != 0;
  mon.metrics << nlohmann::json{{"time_s", secs},           {"clock", reached},
                                {"clocks_planned", clocks}, {"final", true},
                                {"failed", failed},         {"test_accuracy", e.accuracy},
                                {"test_loss", e.loss},      {"eval_source", final_source}}
                     .dump()
              << '\n';
  if (failed)
    std::cerr << "fashion_mnist: the run failed: " << failures.load() << " of " << workers.size()
              << " workers stopped early; every worker of this process reached clock " << reached
              << " of " << clocks << '\n';
  if (shards_lost != 0) {
    std::uint64_t lost = 0, acked = 0;
    for (auto& w : workers) {
      lost += w->stats().lost_pushes;
      acked += w->stats().lost_acknowledged;
    }
    std::cerr << "fashion_mnist: a shard was lost: every server that held its state failed, and "
              << shards_lost.load() << " workers stopped with shard_lost; " << lost
              << " pushes lost with it";
    if (flags::counts_acknowledged) std::cerr << " (" << acked << " of them acknowledged)";
    std::cerr << '\n';
  }
  std::printf("observed staleness (clocks:reads): %s\n", st.to_string().c_str());
  // The push window (worker_options::push_window; the library's default unless --push-window):
  // how often a worker waited for its pushes in flight before computing
  // (worker_stats::window_waits). Printed when a worker waited or a window was set.
  std::uint64_t window_waits = 0;
  for (auto& w : workers) window_waits += w->stats().window_waits;
  if (window_waits != 0 || c.push_window > 0)
    std::printf("push window (%s): %llu clocks waited for pushes in flight\n",
                c.push_window >= 0 ? std::to_string(c.push_window).c_str() : "default",
                static_cast<unsigned long long>(window_waits));
  if constexpr (flags::reports) {
    asyncps::worker_stats ws;
    for (auto& w : workers) {
      const auto& s = w->stats();
      ws.reconnects += s.reconnects;
      ws.lost_pushes += s.lost_pushes;
      ws.lost_acknowledged += s.lost_acknowledged;
      ws.clocks += s.clocks;
      ws.wait_seconds += s.wait_seconds;
      ws.compute_seconds += s.compute_seconds;
    }
    // The counters of the workers' recovery parts, summed, by name (`local_clocks`: the
    // (shard, clock) pairs trained with a shard unreachable; absent counters read 0).
    const nlohmann::json parts = worker_part_counters(workers);
    const auto counter = [&](const char* name) { return parts.value(name, std::uint64_t{0}); };
    const double busy = 100.0 * ws.compute_seconds /
                        (secs * static_cast<double>(workers.empty() ? 1 : workers.size()));
    nlohmann::json summary{{"summary", true},
                           {"time_s", secs},
                           {"gradients", ws.clocks},
                           {"reconnects", ws.reconnects},
                           {"lost_pushes", ws.lost_pushes},
                           {"lost_acknowledged", ws.lost_acknowledged},
                           {"shard_lost", shards_lost.load() != 0},
                           {"local_clocks", counter("local_clocks")},
                           {"compute_s", ws.compute_seconds},
                           {"wait_s", ws.wait_seconds},
                           {"window_waits", window_waits},
                           {"workers", workers.size()}};
    if (!flags::report(report_context{c, Recovery::name, ws, busy}, servers, workers, summary)) {
      // The line of every policy without one of its own (e2e_recovery.sh reads it). Pushes
      // lost: what the workers counted (worker_stats::lost_pushes). Strict chain replication
      // resends instead of counting, so its figure is nonzero only when a shard was lost
      // (worker_stats::shards_lost); the workers then also count how many of those pushes had been
      // acknowledged. Trained locally, backlogs and replicas: the stateless worker part's
      // counters (0 under the other policies).
      const std::string acked = flags::counts_acknowledged
                                    ? " (" + std::to_string(ws.lost_acknowledged) + " acknowledged)"
                                    : std::string();
      std::printf("recovery %s: %llu reconnects, %llu pushes lost%s, %llu shard-clocks trained "
                  "locally, %llu backlogs and %llu replicas sent; %llu gradients, workers busy "
                  "%.0f%%\n",
                  std::string(Recovery::name).c_str(),
                  static_cast<unsigned long long>(ws.reconnects),
                  static_cast<unsigned long long>(ws.lost_pushes), acked.c_str(),
                  static_cast<unsigned long long>(counter("local_clocks")),
                  static_cast<unsigned long long>(counter("backlogs_sent")),
                  static_cast<unsigned long long>(counter("replicas_sent")),
                  static_cast<unsigned long long>(ws.clocks), busy);
    }
    mon.metrics << summary.dump() << '\n';
  }
  if constexpr (asyncps::is_value_bounded_v<Consistency>) {
    std::uint64_t waits = 0, grads = 0;
    double wait_s = 0, value_wait_s = 0, compute_s = 0;
    for (auto& w : workers) {
      const auto& s = w->stats();
      waits += s.value_waits;
      value_wait_s += s.value_wait_seconds;
      wait_s += s.wait_seconds;
      compute_s += s.compute_seconds;
      grads += s.clocks;
    }
    std::printf("vap: %llu of %llu clocks waited for visibility (%.2f s in all, %.2f s waiting "
                "of any kind, %.2f s computing; %zu workers)\n",
                static_cast<unsigned long long>(waits), static_cast<unsigned long long>(grads),
                value_wait_s, wait_s, compute_s, workers.size());
    mon.metrics << nlohmann::json{{"summary", true},
                                  {"time_s", secs},
                                  {"gradients", grads},
                                  {"value_waits", waits},
                                  {"value_wait_s", value_wait_s},
                                  {"wait_s", wait_s},
                                  {"compute_s", compute_s},
                                  {"vap_magnitude", c.vap_magnitude},
                                  {"vap_shrink", c.vap_shrink},
                                  {"workers", workers.size()}}
                       .dump()
                << '\n';
  }
  if (mon.diverged) {
    std::fprintf(stderr,
                 "fashion_mnist: training diverged at epoch %.2f (training loss %g over the last "
                 "16 clocks, %g at the "
                 "start; test accuracy %.4f) with learning rate %g, %u workers and update rule "
                 "%s: lower --lr, or pick --update-rule mean or staleness-aware\n",
                 mon.diverged_at, static_cast<double>(mon.diverged_loss),
                 static_cast<double>(mon.start_loss), e.accuracy, static_cast<double>(c.lr),
                 c.workers, c.update_rule.c_str());
    return 3;
  }
  if (failed) {  // what the servers' model reached, but not a final result of the run
    std::printf("test accuracy when the run failed %.4f (loss %.4f) after %.1f s; metrics in %s\n",
                e.accuracy, e.loss, secs, c.metrics.c_str());
    return 1;
  }
  std::printf("final test accuracy %.4f (loss %.4f) after %.1f s; metrics in %s\n", e.accuracy,
              e.loss, secs, c.metrics.c_str());
  return 0;
}

/// Runs `Consistency` and `Recovery` with the server optimizer `c.optimizer` names, for the
/// optimizers in `Optimizers...` (the first is the fallback). Recovery policies other than
/// `none` are compiled with SGD only (build time on 2 cores); main.cpp refuses other optimizers
/// with them.
template <class Consistency, class Recovery, class... Optimizers>
int with_optimizer(const config& c) {
  namespace opt = asyncps::optimizer;
  int rc = -1;
  // Every optimizer runs under the update rule --update-rule names (a run-time choice, so
  // the rules cost no extra instantiations).
  const auto make = [&]<class O>(std::type_identity<O>) {
    O inner{c.lr};
    if constexpr (std::is_same_v<O, opt::momentum>) inner = O{c.lr, 0.9f};
    return opt::with_update_rule<O, asyncps::update_rule::selectable>{inner, update_rule_of(c)};
  };
  const auto name = []<class O>(std::type_identity<O>) -> std::string_view {
    if constexpr (std::is_same_v<O, opt::momentum>)
      return "momentum";
    else if constexpr (std::is_same_v<O, opt::adagrad>)
      return "adagrad";
    else if constexpr (std::is_same_v<O, opt::adam>)
      return "adam";
    else
      return "sgd";
  };
  static_cast<void>(
      ((c.optimizer == name(std::type_identity<Optimizers>{})
            ? (rc = run<Consistency,
                        opt::with_update_rule<Optimizers, asyncps::update_rule::selectable>,
                        Recovery>(c, make(std::type_identity<Optimizers>{})),
               true)
            : false) ||
       ...));
  return rc;
}

/// Trains with recovery policy `Recovery`, the consistency `c.consistency` names and one of
/// `Optimizers...` (`c.optimizer`). BSP, SSP(s) and ESSP(s) use the run-time bound of
/// `ssp<>`/`essp<>` (run() sets it from `--staleness`; 0 for BSP), so each recovery policy
/// instantiates three workers (ASP, SSP, ESSP) and two servers (lazy, eager) per optimizer
/// instead of one per (policy, bound).
template <class Recovery, class... Optimizers>
int train(const config& c) {
  using namespace asyncps::consistency;
  if (c.consistency == "asp") return with_optimizer<asp, Recovery, Optimizers...>(c);
  if (c.consistency == "essp") return with_optimizer<essp<>, Recovery, Optimizers...>(c);
  return with_optimizer<ssp<>, Recovery, Optimizers...>(c);  // bsp, ssp
}

}  // namespace fashion
