// asyncps — local_cluster: S server shards and W workers in one process, for tests, examples
// and experiments. It does the bring-up every such program repeats (transports, listening,
// endpoints, the worker-to-shard wiring, stopping the servers once every worker has finished,
// a safe teardown order) and hands back the trained parameters, assembled from the shards.
//
//   asyncps::local_cluster<my_model, asyncps::consistency::ssp<2>> cluster(
//       {.servers = 2, .workers = 4}, [](std::uint32_t w) { return my_model(w); },
//       asyncps::optimizer::sgd{0.05f});
//   auto report = cluster.run(500);  // 500 clocks per worker; blocks until all are done
//   if (!report.ok()) std::puts(report.failure.c_str());  // e.g. "worker 2: server lost"
//   report.table(0);                 // the servers' table 0, whole rows from every shard
//
// Example: examples/tutorial/2_local_cluster.cpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/address_v4.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/this_coro.hpp>

#include "asyncps/consistency.hpp"
#include "asyncps/consistency/policies.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/error.hpp"
#include "asyncps/model.hpp"
#include "asyncps/optimizer.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/recovery.hpp"
#include "asyncps/recovery/none.hpp"
#include "asyncps/run_loop.hpp"
#include "asyncps/server.hpp"
#include "asyncps/staleness.hpp"
#include "asyncps/table.hpp"
#include "asyncps/transport/in_process.hpp"
#include "asyncps/transport/tcp.hpp"
#include "asyncps/worker.hpp"

namespace asyncps {

/// How a `local_cluster` places its nodes on threads.
enum class cluster_threads {
  /// Every server and every worker has its own `asio::io_context` and thread (real
  /// concurrency: S + W threads; gradients run on their worker's thread).
  one_per_node,
  /// Every node on one `asio::io_context`, run by the thread that calls `run()` (nodes and
  /// gradients interleave; handy for debugging and allocation counting).
  single,
  /// Every node on a strand of its own on one `asio::io_context` run by
  /// `local_cluster_options::pool_threads` threads (default: the machine's cores): as many
  /// nodes run at once as there are threads, whatever the number of nodes.
  pool,
};

/// Configuration of a `local_cluster` (plain numbers and callbacks).
struct local_cluster_options {
  std::uint32_t servers = 1;  ///< server shards (> 0); shard s owns rows per `shard_range`
  std::uint32_t workers = 1;  ///< workers (> 0), ids 0..workers-1
  cluster_threads threads = cluster_threads::one_per_node;
  /// Threads of `cluster_threads::pool` (0: `std::thread::hardware_concurrency()`).
  unsigned pool_threads = 0;
  /// How long a node thread keeps polling for ready handlers before it sleeps in the kernel
  /// (`run_polling`, run_loop.hpp); 0 (the default): it sleeps at once (`io_context::run`).
  /// Every hand-off between a worker and a server (a push, a pull's reply) wakes the other
  /// node's thread, and on virtual machines that wake-up costs tens of microseconds; a thread
  /// still polling takes the message at once. The price: each node thread burns its core for
  /// up to `spin` after each burst of work, so use it only when every node thread has a core
  /// of its own (docs/performance.md, "End-to-end overhead").
  std::chrono::microseconds spin{0};
  std::uint64_t seed = 42;  ///< the servers' initial-value seed (`server_options::seed`)
  /// Longest wait of a worker for fresh rows (`worker_options::wait_timeout`).
  std::chrono::milliseconds wait_timeout{std::chrono::seconds(60)};
  /// After the last worker finished, how long a server may wait for its connections to close
  /// (the workers' goodbyes) before it is stopped anyway.
  std::chrono::milliseconds drain_timeout{std::chrono::seconds(2)};
  /// Called after each clock of each worker, on that worker's thread: with `one_per_node`
  /// or `pool`, calls for different workers may run concurrently. May be empty.
  std::function<void(const clock_report&)> on_clock{};
  /// Receives the servers' and workers' log lines (connection events, rejected frames), from
  /// their threads (concurrently with `one_per_node`). Empty: stderr.
  log_function log{};
};

/// What one server shard of a `local_cluster` ended with.
struct local_server_report {
  std::error_code error{};  ///< how its `async_serve` completed (empty: stopped normally)
  clock_value clock = 0;    ///< its server clock at the end
  server_stats stats{};
};

/// What one worker of a `local_cluster` ended with.
struct local_worker_report {
  std::error_code error{};  ///< how its `async_run` completed (empty: every clock ran)
  clock_value clock = 0;    ///< clocks it completed
  worker_stats stats{};
  staleness_histogram staleness{};  ///< observed staleness of its reads
};

/// The outcome of `local_cluster::run`.
template <class Model>
struct local_cluster_report {
  /// The first failure (empty: every worker ran all its clocks and every server stopped
  /// normally). Later failures caused by it (e.g. other workers losing the stopped servers)
  /// are only in `servers[s].error` / `workers[w].error`.
  std::error_code error{};
  /// The first failure in words: "worker 2: <message>" or "server 1: <message>"; empty if none.
  std::string failure{};
  std::vector<table_spec> layout{};  ///< the model layout (worker 0's `tables()`)
  /// The servers' parameters at the end: `tables[t]` is table t, `rows x width` floats,
  /// row-major, every row taken from the shard that owns it.
  std::vector<std::vector<float>> tables{};
  std::vector<local_server_report> servers{};  ///< indexed by shard
  std::vector<local_worker_report> workers{};  ///< indexed by worker id
  std::vector<Model> models{};                 ///< the workers' models after training, by id

  /// True when nothing failed.
  bool ok() const noexcept { return !error; }
  /// Table `t` of `tables` as a `rows x width` matrix. Precondition: `t < layout.size()`.
  Eigen::Map<const row_matrix> table(table_id t) const noexcept {
    return {tables[t].data(), layout[t].rows, layout[t].width};
  }
};

/// S server shards and W workers of one model in one process, over the in-process transport
/// (default) or loopback TCP (`Transport = tcp_transport`).
///
/// Template parameters: `Model` (models `model`; move-constructible, since the trained models
/// are returned), `Consistency`, `Recovery` and `Optimizer` as for `basic_server` and
/// `basic_worker` (every node uses the same), `Transport`: `in_process_transport` or
/// `tcp_transport` (servers listen on 127.0.0.1, port chosen by the system).
///
/// Each `run(clocks)` builds a fresh cluster: the servers (layout from worker 0's model,
/// `server_options::seed` from the options), then the workers, each training its own model
/// made by `make_model(worker_id)`, each with `local_step` = the optimizer's `local_step()`
/// (read-my-writes). When every worker has run `clocks` clocks the servers are stopped; when
/// a worker or a server fails, every server is stopped at once (workers then end as their
/// recovery policy says: `recovery::none` at once, a reconnecting policy when its
/// `reconnect_timeout` expires) and the report names the first failure. Teardown order:
/// every node has finished and every thread is joined before servers, then workers, then
/// transports, then io_contexts are destroyed.
///
/// Thread safety: one `run` at a time per object; `run` blocks the calling thread. The
/// callbacks run on node threads (see `cluster_threads`).
template <checked_model Model, consistency_policy Consistency,
          recovery_policy Recovery = recovery::none, optimizer_policy Optimizer = optimizer::sgd,
          transport Transport = in_process_transport>
class local_cluster {
  static_assert(std::same_as<Transport, in_process_transport> ||
                    std::same_as<Transport, tcp_transport>,
                "asyncps::local_cluster: Transport must be in_process_transport or tcp_transport "
                "(for another transport, write the bring-up yourself: "
                "examples/tutorial/4_custom_transport.cpp)");

 public:
  using model_type = Model;
  using server_type = basic_server<Transport, Consistency, Recovery, Optimizer>;
  using worker_type = basic_worker<Model, Transport, Consistency, Recovery>;
  using report_type = local_cluster_report<Model>;
  /// Makes worker `w`'s model (its data shard, its random generator). Called on the thread
  /// that calls `run`, once per worker per run, in id order.
  using model_factory = std::function<Model(std::uint32_t worker)>;

  /// `make_model`: see `model_factory`. `optimizer`: the servers' optimizer (e.g.
  /// `optimizer::sgd{0.05f}`). Nothing starts before `run`.
  local_cluster(local_cluster_options opts, model_factory make_model, Optimizer optimizer = {})
      : opts_(std::move(opts)), make_model_(std::move(make_model)), optimizer_(optimizer) {}

  /// Makes shard s's server part of the recovery policy (e.g. a checkpoint directory per
  /// shard). Unset: default-constructed.
  void set_server_recovery(std::function<typename Recovery::server_part(std::uint32_t)> f) {
    server_recovery_ = std::move(f);
  }
  /// Makes worker w's worker part of the recovery policy. Unset: default-constructed.
  void set_worker_recovery(std::function<typename Recovery::worker_part(std::uint32_t)> f) {
    worker_recovery_ = std::move(f);
  }
  /// Called for each worker after it is built and before it runs, on the thread that calls
  /// `run` (e.g. to set `consistency().magnitude` for VAP). Unset: nothing.
  void set_worker_setup(std::function<void(std::uint32_t, worker_type&)> f) {
    worker_setup_ = std::move(f);
  }

  const local_cluster_options& options() const noexcept { return opts_; }

  /// Builds the cluster, runs every worker for `clocks` clocks, stops the servers, joins every
  /// thread and returns what the servers and workers ended with (see `local_cluster_report`).
  ///
  /// Errors (in the report, nothing thrown): a worker's `async_run` error, a server's
  /// `async_serve` error, or a failed `listen` (named "server s: listen: ..."); then
  /// `report.error` is the first of them and `report.failure` names the node.
  /// Exceptions: `std::invalid_argument` when `servers` or `workers` is 0, or from the server
  /// and worker constructors (a bad layout); whatever `make_model` throws (nothing has started
  /// then). An exception thrown on a node thread (e.g. by `compute_gradient`) stops the
  /// cluster like a failure and is rethrown here after every thread has been joined.
  report_type run(std::uint64_t clocks) {
    static_assert(std::move_constructible<Model>,
                  "asyncps::local_cluster: Model must be move-constructible (run() returns the "
                  "trained models in its report)");
    const std::uint32_t num_servers = opts_.servers, num_workers = opts_.workers;
    if (num_servers == 0 || num_workers == 0)
      throw std::invalid_argument(
          "asyncps::local_cluster_options: servers and workers must be > 0");
    report_type report;
    report.models.reserve(num_workers);  // workers refer to them: no reallocation
    for (std::uint32_t w = 0; w < num_workers; ++w) report.models.push_back(make_model_(w));
    {
      const std::span<const table_spec> layout = report.models[0].tables();
      report.layout.assign(layout.begin(), layout.end());
    }
    report.servers.resize(num_servers);
    report.workers.resize(num_workers);

    // Declared first, destroyed last: every node, transport and pipe is gone before them.
    const bool pooled = opts_.threads == cluster_threads::pool;
    const bool single = opts_.threads == cluster_threads::single || pooled;
    const unsigned pool_threads = opts_.pool_threads != 0
                                      ? opts_.pool_threads
                                      : std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::unique_ptr<asio::io_context>> contexts;
    for (std::uint32_t i = 0; i < (single ? 1u : num_servers + num_workers); ++i)
      contexts.push_back(
          std::make_unique<asio::io_context>(pooled ? static_cast<int>(pool_threads) : 1));
    auto server_context = [&](std::uint32_t s) -> asio::io_context& {
      return *contexts[single ? 0 : s];
    };
    auto worker_context = [&](std::uint32_t w) -> asio::io_context& {
      return *contexts[single ? 0 : num_servers + w];
    };
    std::optional<in_process_network> network;
    if constexpr (std::same_as<Transport, in_process_transport>) network.emplace();
    // Each node's transport on the context's executor, or with `pool` on a strand of it.
    auto make_transport = [&](asio::io_context& io) {
      asio::any_io_executor ex = io.get_executor();
      if (pooled) ex = asio::make_strand(io);
      if constexpr (std::same_as<Transport, in_process_transport>) {
        return std::make_unique<Transport>(ex, *network);
      } else {
        return std::make_unique<Transport>(ex);
      }
    };

    // Servers, listening (nothing runs yet).
    using endpoint_type = typename Transport::endpoint_type;
    run_state state;
    std::vector<std::unique_ptr<Transport>> server_nets;
    std::vector<std::unique_ptr<server_type>> servers;
    std::vector<std::optional<typename Transport::acceptor_type>> acceptors;
    std::vector<endpoint_type> endpoints;
    for (std::uint32_t s = 0; s < num_servers; ++s) {
      server_nets.push_back(make_transport(server_context(s)));
      server_options so;
      so.shard = s;
      so.num_shards = num_servers;
      so.num_workers = num_workers;
      so.seed = opts_.seed;
      so.log = opts_.log;
      servers.push_back(std::make_unique<server_type>(
          *server_nets.back(), report.models[0], std::move(so), optimizer_,
          server_recovery_ ? server_recovery_(s) : typename Recovery::server_part{}));
      endpoint_type ep{};
      if constexpr (std::same_as<Transport, in_process_transport>) {
        ep = "asyncps-local-cluster/shard-" + std::to_string(s);
      } else {
        ep = endpoint_type{asio::ip::address_v4::loopback(), 0};
      }
      auto acc = server_nets.back()->listen(ep);
      if (!acc) {
        state.fail("server " + std::to_string(s) + ": listen", acc.error());
        acceptors.emplace_back();
      } else {
        if constexpr (std::same_as<Transport, tcp_transport>) ep = acc.value().local_endpoint();
        acceptors.emplace_back(std::move(acc).value());
      }
      endpoints.push_back(ep);
    }

    // Workers.
    std::vector<std::unique_ptr<Transport>> worker_nets;
    std::vector<std::unique_ptr<worker_type>> workers;
    for (std::uint32_t w = 0; w < num_workers; ++w) {
      worker_nets.push_back(make_transport(worker_context(w)));
      typename worker_type::options_type wo;
      wo.id = w;
      wo.servers = endpoints;
      wo.wait_timeout = opts_.wait_timeout;
      wo.on_clock = opts_.on_clock;
      wo.log = opts_.log;
      workers.push_back(std::make_unique<worker_type>(
          *worker_nets.back(), report.models[w], std::move(wo), std::nullopt,
          worker_recovery_ ? worker_recovery_(w) : typename Recovery::worker_part{}));
      if (worker_setup_) worker_setup_(w, *workers.back());
    }

    // Start: servers first (on their executors), then workers; the last worker to finish
    // drains and stops the servers.
    auto stop_servers = [&](bool drain) {
      if (state.servers_stopping.exchange(true)) return;
      for (std::uint32_t s = 0; s < num_servers; ++s)
        asio::co_spawn(
            server_nets[s]->get_executor(),
            stop_server(*servers[s], drain ? opts_.drain_timeout : std::chrono::milliseconds(0)),
            [&state](std::exception_ptr e) {
              if (e) state.fail("local_cluster", errc::stopped, e);
            });
    };
    // After a failure: every worker ends its run now (one still connecting would otherwise
    // retry the stopped servers for its whole connect_timeout), on its own executor.
    auto stop_workers = [&] {
      if (state.workers_stopping.exchange(true)) return;
      for (std::uint32_t w = 0; w < num_workers; ++w)
        asio::post(worker_nets[w]->get_executor(), [&workers, w] { workers[w]->stop(); });
    };
    if (!state.failed()) {
      for (std::uint32_t s = 0; s < num_servers; ++s) {
        asio::co_spawn(server_nets[s]->get_executor(),
                       servers[s]->async_serve(std::move(*acceptors[s])),
                       [&, s](std::exception_ptr e, std::error_code ec) {
                         report.servers[s].error = ec;
                         if (e || ec) {
                           state.fail("server " + std::to_string(s),
                                      ec ? ec : make_error_code(errc::stopped), e);
                           stop_workers();
                           stop_servers(false);
                         }
                       });
      }
      for (std::uint32_t w = 0; w < num_workers; ++w) {
        asio::co_spawn(worker_nets[w]->get_executor(), workers[w]->async_run(clocks),
                       [&, w](std::exception_ptr e, std::error_code ec) {
                         report.workers[w].error = ec;
                         if (e || ec) {
                           state.fail("worker " + std::to_string(w),
                                      ec ? ec : make_error_code(errc::stopped), e);
                           stop_workers();
                           stop_servers(false);
                         }
                         if (++state.finished == num_workers) stop_servers(true);
                       });
      }
    }
    // Run every context to completion (each node's coroutines keep its context busy).
    std::vector<std::thread> threads;
    for (std::size_t i = 1; i < contexts.size(); ++i)
      threads.emplace_back([&, &io = *contexts[i]] { run_context(io, state, opts_.spin); });
    for (unsigned i = 1; pooled && i < pool_threads; ++i)
      threads.emplace_back([&, &io = *contexts[0]] { run_context(io, state, opts_.spin); });
    run_context(*contexts[0], state, opts_.spin);
    for (auto& t : threads) t.join();

    // Every node has finished: collect, then tear down in order.
    for (table_id t = 0; t < report.layout.size(); ++t) {
      const auto width = std::size_t{report.layout[t].width};
      auto& table = report.tables.emplace_back(report.layout[t].size(), 0.0f);
      for (const auto& s : servers) {
        const auto v = s->values(t);
        std::copy(v.begin(), v.end(), table.begin() + s->range(t).begin * width);
      }
    }
    for (std::uint32_t s = 0; s < num_servers; ++s) {
      report.servers[s].clock = servers[s]->clock();
      report.servers[s].stats = servers[s]->stats();
    }
    for (std::uint32_t w = 0; w < num_workers; ++w) {
      report.workers[w].clock = workers[w]->clock();
      report.workers[w].stats = workers[w]->stats();
      report.workers[w].staleness = workers[w]->staleness();
    }
    report.error = state.error;
    report.failure = state.failure;
    servers.clear();
    workers.clear();
    acceptors.clear();
    server_nets.clear();
    worker_nets.clear();
    network.reset();
    contexts.clear();
    if (state.exception) std::rethrow_exception(state.exception);
    return report;
  }

 private:
  // What the node threads share during one run.
  struct run_state {
    std::mutex mutex;
    std::error_code error;
    std::string failure;
    std::exception_ptr exception;
    std::atomic<std::uint32_t> finished{0};
    std::atomic<bool> servers_stopping{false};
    std::atomic<bool> workers_stopping{false};
    std::atomic<bool> any_failure{false};

    bool failed() const noexcept { return any_failure.load(); }
    // Records a failure of node `who` ("worker 2"): an error code, or an exception (then
    // `ec` is `errc::stopped` and the failure text says "exception").
    void fail(const std::string& who, std::error_code ec, std::exception_ptr e = nullptr) {
      std::lock_guard lock(mutex);
      any_failure = true;
      if (e && !exception) exception = e;
      if (error) return;
      error = ec;
      failure = who + ": " + (e ? std::string("exception") : ec.message());
    }
  };

  // Runs `io` until it has no work left; an exception escaping a handler is recorded (and
  // rethrown by `run`), and the context keeps running so every node still finishes.
  static void run_context(asio::io_context& io, run_state& state, std::chrono::microseconds spin) {
    for (;;) {
      try {
        run_polling(io, spin);
        return;
      } catch (...) {
        state.fail("local_cluster", errc::stopped, std::current_exception());
      }
    }
  }

  // On the server's executor: wait up to `drain` for its connections to close (the workers'
  // goodbyes have been read then), then stop it. A 1 ms poll: `basic_server` announces no
  // "connection closed" event that a `detail::wait_group` could count (only `connections()`).
  static asio::awaitable<void> stop_server(server_type& server, std::chrono::milliseconds drain) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    const auto deadline = std::chrono::steady_clock::now() + drain;
    while (server.connections() != 0 && std::chrono::steady_clock::now() < deadline) {
      timer.expires_after(std::chrono::milliseconds(1));
      co_await timer.async_wait(detail::use_tuple);
    }
    server.stop();
  }

  local_cluster_options opts_;
  model_factory make_model_;
  Optimizer optimizer_;
  std::function<typename Recovery::server_part(std::uint32_t)> server_recovery_{};
  std::function<typename Recovery::worker_part(std::uint32_t)> worker_recovery_{};
  std::function<void(std::uint32_t, worker_type&)> worker_setup_{};
};

}  // namespace asyncps
