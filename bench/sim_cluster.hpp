// asyncps bench — a simulated cluster: S server shards and W workers of one model type on one
// `simulated_network`, the unchanged `basic_server` / `basic_worker`, each worker training for a
// fixed number of clocks. Shared by bench/simulation.cpp (asyncps_sim_bench) and
// bench/scaling.cpp (asyncps_scaling).
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>

#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/simulated.hpp"
#include "asyncps/worker.hpp"

namespace asyncps::bench {

/// `servers` shards of one layout and up to `workers` workers on a simulated network. Node
/// names: "server<s>" (listening at "shard<s>") and "worker<w>"; worker w computes on
/// `net.compute_executor(w)`. Servers and workers log nothing.
///
/// Thread safety: one thread; `run()` drives the network. Object lifetime: `net` outlives the
/// cluster; the cluster must not be destroyed while `net.run()` executes.
template <class Model, class Policy, optimizer_policy Optimizer = optimizer::sgd>
class sim_cluster {
 public:
  using server_type = basic_server<simulated_transport, Policy, recovery::none, Optimizer>;
  using worker_type = basic_worker<Model, simulated_transport, Policy>;
  using worker_options_type = typename worker_type::options_type;

  /// Creates the shards (one table layout `tables`, SGD with learning rate `lr`, a vector
  /// clock over `workers` workers) and spawns their `async_serve` on `net`'s executor.
  /// Throws `std::runtime_error` when a listen fails, `std::invalid_argument` for a layout the
  /// server refuses (e.g. fewer rows than shards).
  sim_cluster(simulated_network& net, std::uint32_t servers, std::uint32_t workers,
              std::vector<table_spec> tables, float lr)
    requires std::same_as<Optimizer, optimizer::sgd>
      : sim_cluster(net, servers, workers, std::move(tables), optimizer::sgd{lr}) {}
  /// As above, with the servers' optimizer `opt` (e.g. one with an update rule).
  sim_cluster(simulated_network& net, std::uint32_t servers, std::uint32_t workers,
              std::vector<table_spec> tables, Optimizer opt)
      : net_(net), done_(workers, 0.0) {
    const auto quiet = [](std::string_view) {};
    for (std::uint32_t s = 0; s < servers; ++s) {
      server_nets_.push_back(
          std::make_unique<simulated_transport>(net, "server" + std::to_string(s)));
      server_options so;
      so.shard = s;
      so.num_shards = servers;
      so.num_workers = workers;
      so.tables = tables;
      so.log = quiet;
      servers_.push_back(std::make_unique<server_type>(*server_nets_.back(), so, opt));
      endpoints_.push_back("shard" + std::to_string(s));
      auto acc = server_nets_.back()->listen(endpoints_.back());
      if (!acc) throw std::runtime_error("listen failed: " + acc.error().message());
      asio::co_spawn(net.get_executor(), servers_.back()->async_serve(std::move(acc).value()),
                     asio::detached);
    }
  }

  sim_cluster(const sim_cluster&) = delete;
  sim_cluster& operator=(const sim_cluster&) = delete;

  /// Adds the next worker (id = the number added before) training `model` for `clocks` clocks;
  /// `opts.id`, `opts.servers` and `opts.log` are filled in. It starts when `run()` runs.
  /// Precondition: fewer than `workers` added; `model` outlives the cluster.
  worker_type& add_worker(Model& model, worker_options_type opts, std::uint64_t clocks) {
    const auto w = static_cast<std::uint32_t>(workers_.size());
    worker_nets_.push_back(
        std::make_unique<simulated_transport>(net_, "worker" + std::to_string(w)));
    opts.id = w;
    opts.servers = endpoints_;
    opts.log = [](std::string_view) {};
    workers_.push_back(
        std::make_unique<worker_type>(*worker_nets_.back(), model, std::move(opts),
                                      asio::any_io_executor(net_.compute_executor(w))));
    asio::co_spawn(
        net_.get_executor(),
        [this, w, clocks]() -> asio::awaitable<void> {
          if (co_await workers_[w]->async_run(clocks)) ++errors_;
          done_[w] = seconds(net_.now());
        },
        asio::detached);
    return *workers_.back();
  }

  /// Runs the network until every worker has finished, then stops the servers and runs it
  /// until they have. Returns the simulated seconds when the last worker finished.
  double run() {
    net_.run();
    const double end = seconds(net_.now());
    asio::post(net_.get_executor(), [this] {
      for (auto& s : servers_) s->stop();
    });
    net_.run();
    return end;
  }

  std::uint32_t num_workers() const noexcept { return static_cast<std::uint32_t>(workers_.size()); }
  worker_type& worker(std::uint32_t w) { return *workers_[w]; }
  server_type& server(std::uint32_t s) { return *servers_[s]; }
  /// Simulated seconds when worker `w` finished (after `run()`).
  double done(std::uint32_t w) const { return done_[w]; }
  /// Workers whose `async_run` completed with an error.
  int errors() const noexcept { return errors_; }

  /// Seconds since the start of the simulation.
  static double seconds(simulated_network::time_point t) {
    return std::chrono::duration<double>(t.time_since_epoch()).count();
  }

 private:
  simulated_network& net_;
  std::vector<std::unique_ptr<simulated_transport>> server_nets_;
  std::vector<std::unique_ptr<server_type>> servers_;
  std::vector<std::string> endpoints_;
  std::vector<std::unique_ptr<simulated_transport>> worker_nets_;
  std::vector<std::unique_ptr<worker_type>> workers_;
  std::vector<double> done_;
  int errors_ = 0;
};

}  // namespace asyncps::bench
