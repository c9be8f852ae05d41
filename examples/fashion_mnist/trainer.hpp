// fashion_mnist — the trainer's building blocks: the model wrapper, progress and metrics, and
// `train<Recovery, Optimizers...>`, which maps the command line's consistency and optimizer
// choices onto compile-time instantiations of basic_server and basic_worker.
//
// Build time on 2 cores shapes this file: the staleness bound is a run-time value
// (`ssp<>`/`essp<>`), servers are instantiated per (lazy/eager/VAP, optimizer) only, the
// models' Eigen kernels live in any_model.cpp, and each recovery policy's instantiations live
// in their own translation unit (train_*.cpp), so they compile in parallel.
#pragma once

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unistd.h>
#include <vector>

#include "../common/model_reader.hpp"
#include "any_model.hpp"
#include "asyncps/asyncps.hpp"
#include "asyncps/recovery/replica_log.hpp"
#include "config.hpp"
#include "dataset.hpp"
#include "serve_until_done.hpp"

namespace fashion {

/// Options of every TCP transport of this process: the run's shared secret (main.cpp loads it
/// from --secret-file or $ASYNCPS_SECRET_FILE, or makes a random one for --role all) and the
/// TLS files (--tls-cert, --tls-key, --tls-ca; none: no TLS).
inline asyncps::tcp_options tcp_opts(const config& c) {
  asyncps::tcp_options o;
  o.secret = c.secret;
  o.tls = c.tls;
  return o;
}

/// The recovery policy's server part, configured from the command line.
template <class Recovery>
typename Recovery::server_part make_server_part(const config& c, std::uint32_t shard) {
  if constexpr (std::is_same_v<Recovery, asyncps::recovery::checkpoint>) {
    asyncps::recovery::checkpoint_options o;
    o.directory = c.checkpoint_dir;
    o.every_clocks = c.checkpoint_every;
    o.every_seconds = c.checkpoint_seconds;
    if (c.checkpoint_every == 0 && c.checkpoint_seconds <= 0)
      o.max_overhead = c.checkpoint_overhead;
    o.log = [shard](std::string_view line) {
      std::cerr << "server " << shard << ": " << line << '\n';
    };
    return typename Recovery::server_part(std::move(o));
  } else if constexpr (std::is_same_v<Recovery, asyncps::recovery::stateless>) {
    typename Recovery::server_part p;
    using asyncps::recovery::merge_rule;
    p.options.rule = c.merge == "sum"               ? merge_rule::sum
                     : c.merge == "mean"            ? merge_rule::mean
                     : c.merge == "staleness-aware" ? merge_rule::staleness_aware
                                                    : merge_rule::lr_scaled;
    return p;
  } else if constexpr (asyncps::recovery::is_chain_replication_v<Recovery>) {
    (void)shard;
    typename Recovery::server_part p;
    p.options.replicate_every = c.replicate_every;
    return p;
  } else if constexpr (std::is_same_v<Recovery, asyncps::recovery::replica_log>) {
    (void)shard;
    typename Recovery::server_part p;
    p.options.replica_interval = static_cast<asyncps::clock_value>(c.replica_interval);
    return p;
  } else {
    (void)c;
    (void)shard;
    return {};
  }
}

/// The recovery policy's worker part, configured from the command line.
template <class Recovery>
typename Recovery::worker_part make_worker_part(const config& c) {
  const auto timeout =
      std::chrono::milliseconds(static_cast<long long>(c.reconnect_timeout * 1000));
  if constexpr (std::is_same_v<Recovery, asyncps::recovery::checkpoint>) {
    return typename Recovery::worker_part(timeout);
  } else if constexpr (std::is_same_v<Recovery, asyncps::recovery::stateless> ||
                       std::is_same_v<Recovery, asyncps::recovery::replica_log> ||
                       asyncps::recovery::is_chain_replication_v<Recovery>) {
    typename Recovery::worker_part p;
    p.options.reconnect_timeout = timeout;
    return p;
  } else {
    (void)timeout;
    return {};
  }
}

// Evaluates on a thread of its own, so that worker 0 does not wait for it: the servers' model,
// read as a reader (asyncps::examples::read_servers_model, with the run's secret and TLS),
// and/or a copy of worker 0's view. One evaluation at a time: a request made while one runs is
// refused (the caller then evaluates worker 0's view itself).
class evaluator {
 public:
  // What one evaluation produced: the servers' model's (when read) and worker 0's view's
  // (when asked for, or when the servers were not read: `servers_error` says why).
  struct result {
    std::optional<evaluation> servers;
    std::optional<evaluation> worker;
    std::string servers_error;
  };

  evaluator(std::vector<asyncps::tcp_transport::endpoint_type> servers,
            std::vector<asyncps::table_spec> layout, asyncps::tcp_options options,
            const any_model& model, const fashion::dataset& test)
      : servers_(std::move(servers)), layout_(std::move(layout)), options_(std::move(options)),
        model_(model), test_(test), params_(asyncps::layout_size(layout_)) {}

  // Starts an evaluation of the servers' model (each shard once its server clock reached
  // `min_clock`) and, when `both`, of `worker_view` (worker 0's parameters, copied by the
  // caller); `done(result)` runs on the evaluator's thread. False when one is running.
  bool start(std::vector<float> worker_view, bool both, asyncps::clock_value min_clock,
             std::function<void(const result&)> done) {
    return jobs_.try_start(
        [this, view = std::move(worker_view), both, min_clock, done = std::move(done)] {
          result r;
          r.servers_error = read_servers(min_clock);
          if (r.servers_error.empty())
            r.servers = model_.evaluate(asyncps::parameter_view(layout_, params_.data()), test_);
          if (both || !r.servers)
            r.worker = model_.evaluate(asyncps::parameter_view(layout_, view.data()), test_);
          done(r);
        });
  }
  // Reads the servers' model now, on the calling thread (after `stop`), into `out`. Returns
  // the error, empty on success.
  std::string read_now(std::vector<float>& out, asyncps::clock_value min_clock) {
    std::string error = read_servers(min_clock);
    if (error.empty()) out = params_;
    return error;
  }
  // Lets a started evaluation finish, then joins the evaluator's thread.
  void stop() { jobs_.stop(); }

 private:
  std::string read_servers(asyncps::clock_value min_clock) {
    return asyncps::examples::read_servers_model(servers_, layout_, params_, options_,
                                                 std::chrono::seconds(2), min_clock);
  }

  std::vector<asyncps::tcp_transport::endpoint_type> servers_;
  std::vector<asyncps::table_spec> layout_;
  asyncps::tcp_options options_;
  const any_model& model_;
  const fashion::dataset& test_;
  std::vector<float> params_;                  // the servers' model, as read
  asyncps::examples::single_job_thread jobs_;  // last: stopped before the members above go
};

// Progress and metrics shared by the workers of this process.
struct monitor {
  monitor(const config& c, const fashion::dataset& t) : cfg(c), test(t), metrics(c.metrics) {}
  ~monitor() { stop_reader(); }
  // --eval servers|both: evaluations read the servers' model through `reader` (set once the
  // servers' addresses are known; stop it with stop_reader before the model it uses goes).
  std::unique_ptr<evaluator> reader;
  void stop_reader() {
    if (reader) reader->stop();
  }
  const config& cfg;
  const fashion::dataset& test;
  std::ofstream metrics;
  clock_type::time_point start = clock_type::now();
  std::mutex mutex;
  std::atomic<std::uint64_t> samples{0};
  double last_print = -1;
  double next_eval = 0;
  double last_accuracy = -1;
  float loss_ema = -1;
  float start_loss = -1;  // worker 0's first training loss
  // Worker 0's last `recent.size()` training losses (a ring) and their count: the divergence
  // test reads their mean, which, unlike `loss_ema`, holds nothing of the start after an
  // epoch even when an epoch is few clocks (many workers).
  std::array<float, 16> recent{};
  std::uint64_t recent_count = 0;
  // Set once worker 0's training loss turns non-finite, or its recent mean rises past twice
  // its start (or twice chance level), or is still near chance level after an epoch: every worker
  // then ends at its next clock, and the run ends with an error naming the settings (`diverged_at`:
  // the epoch, `diverged_loss`).
  std::atomic<bool> diverged{false};
  double diverged_at = 0;
  float diverged_loss = 0;
  bool tty = isatty(STDOUT_FILENO) != 0;
  bool started = false;

  double elapsed() const {
    return std::chrono::duration<double>(clock_type::now() - start).count();
  }

  // Called by worker 0 after each clock (on its executor).
  void on_clock(const asyncps::clock_report& r, const any_model& m,
                const asyncps::staleness_histogram& st) {
    std::lock_guard lock(mutex);
    if (!started) {
      started = true;
      if (cfg.on_first_clock) cfg.on_first_clock();
    }
    loss_ema = loss_ema < 0 ? r.loss : 0.98f * loss_ema + 0.02f * r.loss;
    const double epoch = m.epoch();
    const double t = elapsed();
    if (start_loss < 0 && std::isfinite(r.loss)) start_loss = r.loss;
    recent[recent_count++ % recent.size()] = r.loss;
    const std::size_t n = std::min<std::uint64_t>(recent_count, recent.size());
    float recent_mean = 0;
    for (std::size_t k = 0; k < n; ++k) recent_mean += recent[k] / static_cast<float>(n);
    // Chance level: the cross-entropy of a uniform guess over the 10 classes is ln 10; a run
    // that learns is well below it after one epoch.
    const float chance = 0.9f * std::log(10.0f);
    // Relative to chance as well as to the start: a worker that joins a trained model (a
    // late or restarted elastic worker) starts low, and its loss moves around that.
    if (!diverged && (!std::isfinite(r.loss) || recent_mean > 2 * std::max(start_loss, chance) ||
                      (epoch >= 1 && recent_mean >= chance))) {
      diverged_at = epoch;
      diverged_loss = std::isfinite(r.loss) ? recent_mean : r.loss;
      diverged = true;
    }
    if (epoch >= next_eval) {
      next_eval += cfg.eval_every;
      // --eval servers (or both): the evaluator thread reads and evaluates the servers' model
      // (test_accuracy, eval_source "servers") and, for both, worker 0's view beside it
      // (worker_test_accuracy); when the servers do not answer, worker 0's view stands in
      // (eval_source "worker", and why). --eval worker, or the evaluator busy: worker 0's
      // view (its cache at the start of this clock), evaluated here.
      nlohmann::json rec{
          {"time_s", t}, {"clock", r.clock}, {"epoch", epoch}, {"train_loss", loss_ema}};
      const auto write = [this](nlohmann::json& j, const evaluation& e, const char* source) {
        j["test_accuracy"] = e.accuracy;
        j["test_loss"] = e.loss;
        j["eval_source"] = source;
        last_accuracy = e.accuracy;
        metrics << j.dump() << '\n';
        metrics.flush();
      };
      bool started = false;
      if (reader) {
        std::vector<float> view;  // worker 0's parameters now (the evaluator reads them later)
        view.reserve(asyncps::layout_size(r.params.tables()));
        for (std::size_t k = 0; k < r.params.tables().size(); ++k) {
          const auto sp = r.params.span(static_cast<asyncps::table_id>(k));
          view.insert(view.end(), sp.begin(), sp.end());
        }
        // Past the first clocks every shard's server clock is >= 1: a shard at clock 0 then
        // is a server restarted without state that no worker has rejoined yet (stateless,
        // replica-log), whose fresh values are not the model; the read waits for it.
        const asyncps::clock_value min_clock =
            r.clock > static_cast<asyncps::clock_value>(cfg.staleness) + 1 ? 1 : 0;
        started = reader->start(std::move(view), cfg.eval == "both", min_clock,
                                [this, rec, write](const evaluator::result& res) mutable {
                                  std::lock_guard lock(mutex);
                                  rec["eval_s"] = elapsed() - rec["time_s"].get<double>();
                                  if (res.worker) {
                                    rec["worker_test_accuracy"] = res.worker->accuracy;
                                    rec["worker_test_loss"] = res.worker->loss;
                                  }
                                  if (!res.servers) rec["servers_unreadable"] = res.servers_error;
                                  write(rec, res.servers ? *res.servers : *res.worker,
                                        res.servers ? "servers" : "worker");
                                });
        if (!started) rec["servers_unreadable"] = "an earlier evaluation is still running";
      }
      if (!started) {
        const auto e = m.evaluate(r.params, test);
        write(rec, e, "worker");
      }
    }
    if (!cfg.quiet && (t - last_print >= 1.0 || last_print < 0)) {
      last_print = t;
      char line[256];
      std::snprintf(line, sizeof line,
                    "epoch %5.2f  clock %6lld  %8.0f samples/s  loss %.4f  staleness mean %.2f "
                    "max %d  test acc %s",
                    epoch, static_cast<long long>(r.clock),
                    static_cast<double>(samples.load()) / (t > 0 ? t : 1), loss_ema, st.mean(),
                    st.max(),
                    last_accuracy < 0 ? "-" : std::to_string(last_accuracy).substr(0, 6).c_str());
      std::cout << (tty ? "\r" : "") << line << (tty ? "" : "\n") << std::flush;
    }
  }
};

// A server only uses its policy's `eager` and value-bounded flags (the staleness bound travels
// in each pull as the minimum clock wanted, VAP's bound is the worker's), so the example
// instantiates one server per (eager / VAP / lazy, optimizer) rather than one per staleness
// value: this keeps its build time reasonable on 2 cores.
template <class Consistency>
using server_policy =
    std::conditional_t<asyncps::is_value_bounded_v<Consistency>, asyncps::consistency::vap,
                       std::conditional_t<Consistency::eager, asyncps::consistency::essp<0>,
                                          asyncps::consistency::bsp>>;
/// Whether `Consistency` takes its staleness bound at run time (`ssp<>`, `essp<>`).
template <class Consistency>
inline constexpr bool run_time_bound = std::is_same_v<Consistency, asyncps::consistency::ssp<>> ||
                                       std::is_same_v<Consistency, asyncps::consistency::essp<>>;
template <class Consistency, class Optimizer, class Recovery>
using server_type =
    asyncps::basic_server<asyncps::tcp_transport, server_policy<Consistency>, Recovery, Optimizer>;
template <class Consistency, class Recovery>
using worker_type = asyncps::basic_worker<any_model, asyncps::tcp_transport, Consistency, Recovery>;

inline asyncps::server_options server_opts(const config& c, std::uint32_t shard,
                                           std::span<const asyncps::table_spec> layout) {
  asyncps::server_options o;
  o.shard = shard;
  o.num_shards = c.servers;
  o.num_workers = c.workers;
  o.tables.assign(layout.begin(), layout.end());
  o.seed = c.seed;
  if (c.elastic) {  // --workers is a capacity; members join and leave
    o.elastic = asyncps::membership_options{
        .start_members = c.min_workers != 0 ? c.min_workers : c.workers,
        .grace = std::chrono::milliseconds(static_cast<long long>(c.grace * 1000))};
  }
  return o;
}

/// What the `recovery::replica_log` shards did: their rebuilds, summed over servers (or over
/// the incarnations of a restarted server process), and the pushes their final states hold.
struct replica_log_totals {
  std::uint64_t rebuilds = 0;        ///< replica_log_stats::recoveries
  std::uint64_t replayed = 0;        ///< logged entries applied by the rebuilds
  std::uint64_t missing = 0;         ///< replica_log_stats::missing_positions
  std::uint64_t incomplete = 0;      ///< replica_log_stats::incomplete_recoveries
  std::uint64_t skipped_clocks = 0;  ///< replica_log_stats::skipped_clocks
  double max_seconds = 0;            ///< the longest rebuild (first hello to serving again)
  bool known = false;                ///< false: the servers are processes that did not report
  /// Per shard that reported its end: pushes applied per (worker, table), `shard_state::applied`
  /// (`applied[w * tables + t]`).
  std::map<std::uint32_t, std::vector<std::uint64_t>> applied;

  /// Adds the rebuild counters of one server part.
  void add(const asyncps::recovery::replica_log_stats& s) {
    rebuilds += s.recoveries;
    replayed += s.replayed;
    missing += s.missing_positions;
    incomplete += s.incomplete_recoveries;
    skipped_clocks += s.skipped_clocks;
    max_seconds = std::max(max_seconds, s.last_recovery_seconds);
    known = true;
  }
};

/// replica-log, --role server --server-report FILE: appends one JSON line to FILE for each
/// rebuild of `server` (from the part's `on_rebuilt`, as it ends: a process killed with
/// SIGKILL cannot report at its end), and one when it stops serving with the pushes its state
/// holds per (worker, table) (role all with --kill-at reads them, `read_replica_log_reports`).
/// On the server's executor.
template <class Server>
class replica_log_reporter {
 public:
  explicit replica_log_reporter(std::string path) : path_(std::move(path)) {}
  replica_log_reporter(const replica_log_reporter&) = delete;
  replica_log_reporter& operator=(const replica_log_reporter&) = delete;

  /// The server to report on (set once it is constructed).
  void attach(const Server& s) { server_ = &s; }
  /// For the server part's `on_rebuilt`: reports the rebuild that just ended.
  std::function<void()> rebuilt() {
    return [this] { report_rebuild(); };
  }
  /// A tick for `serve_until_done`: reports the end.
  std::function<void(bool)> tick() {
    return [this](bool ended) {
      if (ended) report_end();
    };
  }

 private:
  // Appends the counters the rebuilds since the last report added (a server process rebuilds
  // at most once, at its start).
  void report_rebuild() {
    if (server_ == nullptr) return;
    const auto& st = server_->recovery().stats();
    if (st.recoveries == last_.recoveries) return;
    append({{"shard", server_->options().shard},
            {"pid", ::getpid()},
            {"recoveries", st.recoveries - last_.recoveries},
            {"replayed", st.replayed - last_.replayed},
            {"missing_positions", st.missing_positions - last_.missing_positions},
            {"incomplete_recoveries", st.incomplete_recoveries - last_.incomplete_recoveries},
            {"skipped_clocks", st.skipped_clocks - last_.skipped_clocks},
            {"seconds", st.last_recovery_seconds},
            {"position", st.position},
            {"stable", st.stable}});
    last_ = st;
  }
  void report_end() {
    if (server_ == nullptr) return;
    asyncps::shard_state state;
    server_->save_state(state);
    append({{"end", true},
            {"shard", server_->options().shard},
            {"pid", ::getpid()},
            {"tables", state.tables.size()},
            {"applied", state.applied}});
  }
  void append(const nlohmann::json& j) {
    std::ofstream out(path_, std::ios::app);
    out << j.dump() << std::endl;
    if (!out)
      std::fprintf(stderr, "server %u: --server-report: cannot write %s\n",
                   static_cast<unsigned>(server_->options().shard), path_.c_str());
  }

  std::string path_;
  const Server* server_ = nullptr;
  asyncps::recovery::replica_log_stats last_{};
};

/// Reads the reports the server processes appended to `path` (`replica_log_reporter`): sums
/// the rebuilds, and takes each shard's end record. Waits up to `wait` for an end record of
/// each of `shards` shards (a server process reports its end once its workers are gone).
inline replica_log_totals read_replica_log_reports(const std::string& path, std::uint32_t shards,
                                                   std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    replica_log_totals t;
    t.known = true;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        std::cerr << "fashion_mnist: " << path << ": not a server report: " << line << '\n';
        continue;
      }
      if (j.value("end", false)) {
        t.applied[j.value("shard", 0u)] = j.value("applied", std::vector<std::uint64_t>{});
        continue;
      }
      t.rebuilds += j.value("recoveries", std::uint64_t{0});
      t.replayed += j.value("replayed", std::uint64_t{0});
      t.missing += j.value("missing_positions", std::uint64_t{0});
      t.incomplete += j.value("incomplete_recoveries", std::uint64_t{0});
      t.skipped_clocks += j.value("skipped_clocks", std::uint64_t{0});
      t.max_seconds = std::max(t.max_seconds, j.value("seconds", 0.0));
    }
    if (t.applied.size() >= shards || std::chrono::steady_clock::now() >= deadline) return t;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

using transports = std::vector<std::unique_ptr<asyncps::tcp_transport>>;

// Chain replication, everything in this process: `replicas` servers per shard on free
// loopback ports and a chain master; they serve until the workers are done.
template <class Server, class Optimizer>
bool start_chain(const config& c, Optimizer opt, const std::vector<asyncps::table_spec>& layout,
                 asio::io_context& io, transports& ts,
                 std::vector<std::unique_ptr<Server>>& servers,
                 std::vector<asyncps::tcp_transport::endpoint_type>& heads,
                 std::vector<std::vector<asyncps::tcp_transport::endpoint_type>>& others,
                 std::unique_ptr<asyncps::tcp_transport>& mt,
                 std::unique_ptr<asyncps::basic_chain_master<asyncps::tcp_transport>>& master) {
  const auto loopback = asyncps::parse_tcp_endpoint("127.0.0.1:0").value();
  mt = std::make_unique<asyncps::tcp_transport>(asio::make_strand(io), tcp_opts(c));
  auto macc = mt->listen(loopback);
  if (!macc) {
    std::cerr << "fashion_mnist: chain master cannot listen: " << macc.error().message() << '\n';
    return false;
  }
  const auto master_ep = macc.value().local_endpoint();
  asyncps::chain_master_options mo;
  mo.num_shards = c.servers;
  mo.members = c.replicas;
  mo.log = [](std::string_view line) { std::cerr << line << '\n'; };
  master = std::make_unique<asyncps::basic_chain_master<asyncps::tcp_transport>>(*mt, mo);
  asio::co_spawn(
      mt->get_executor(),
      [m = master.get(), a = std::move(macc).value()]() mutable -> asio::awaitable<void> {
        (void)co_await m->async_serve(std::move(a));
      },
      asio::detached);
  for (std::uint32_t s = 0; s < c.servers; ++s) {
    std::vector<asyncps::tcp_transport::endpoint_type> eps;
    std::vector<asyncps::tcp_transport::acceptor> accs;
    for (std::uint32_t m = 0; m < c.replicas; ++m) {
      auto& t = ts.emplace_back(
          std::make_unique<asyncps::tcp_transport>(asio::make_strand(io), tcp_opts(c)));
      auto acc = t->listen(loopback);
      if (!acc) {
        std::cerr << "fashion_mnist: cannot listen: " << acc.error().message() << '\n';
        return false;
      }
      eps.push_back(acc.value().local_endpoint());
      accs.push_back(std::move(acc).value());
    }
    for (std::uint32_t m = 0; m < c.replicas; ++m) {
      auto& t = *ts[ts.size() - c.replicas + m];
      auto& srv = servers.emplace_back(
          std::make_unique<Server>(t, server_opts(c, s, layout), opt,
                                   make_server_part<typename Server::recovery_type>(c, s)));
      srv->recovery().set_chain(master_ep, eps, m);
      asio::co_spawn(
          t.get_executor(),
          [p = srv.get(), a = std::move(accs[m])]() mutable -> asio::awaitable<void> {
            if (auto ec = co_await p->async_serve(std::move(a)))
              std::cerr << "server " << p->options().shard << ": " << ec.message() << '\n';
          },
          asio::detached);
    }
    heads.push_back(eps[0]);
    others.emplace_back(eps.begin() + 1, eps.end());
  }
  return true;
}

// Chain replication, --role server: one member of one shard's chain, serving until killed.
template <class Server, class Optimizer>
bool start_chain_server(const config& c, Optimizer opt,
                        const std::vector<asyncps::table_spec>& layout, asio::io_context& io,
                        transports& ts, std::vector<std::unique_ptr<Server>>& servers) {
  std::vector<asyncps::tcp_transport::endpoint_type> eps;
  for (const auto& text : c.chain) {
    auto ep = asyncps::parse_tcp_endpoint(text);
    if (!ep) {
      std::cerr << "fashion_mnist: --chain: expected host:port, got '" << text << "'\n";
      return false;
    }
    eps.push_back(ep.value());
  }
  auto master_ep = asyncps::parse_tcp_endpoint(c.master);
  auto listen_ep = asyncps::parse_tcp_endpoint(c.listen);
  if (!master_ep || !listen_ep || c.member >= eps.size()) {
    std::cerr << "fashion_mnist: --role server with chain replication needs --master host:port, "
                 "--chain host:port,... (every server of the shard) and --member < their count\n";
    return false;
  }
  auto& t =
      ts.emplace_back(std::make_unique<asyncps::tcp_transport>(asio::make_strand(io), tcp_opts(c)));
  auto acc = t->listen(listen_ep.value());
  if (!acc) {
    std::cerr << "fashion_mnist: cannot listen on " << c.listen << ": " << acc.error().message()
              << '\n';
    return false;
  }
  auto& srv = servers.emplace_back(
      std::make_unique<Server>(*t, server_opts(c, c.shard, layout), opt,
                               make_server_part<typename Server::recovery_type>(c, c.shard)));
  srv->recovery().set_chain(master_ep.value(), eps, c.member);
  const auto bound = acc.value().local_endpoint();
  asio::co_spawn(
      t->get_executor(),
      [p = srv.get(), a = std::move(acc).value()]() mutable -> asio::awaitable<void> {
        if (auto ec = co_await p->async_serve(std::move(a)))
          std::cerr << "server " << p->options().shard << ": " << ec.message() << '\n';
      },
      asio::detached);
  std::cout << "server " << c.shard << "." << c.member << " of " << c.servers << " listening on "
            << bound << std::endl;
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

  // Servers of this process.
  constexpr bool chain = asyncps::recovery::is_chain_replication_v<Recovery>;
  constexpr bool strict_chain = [] {  // workers count acknowledged pushes lost
    if constexpr (chain)
      return Recovery::mode == asyncps::recovery::chain_mode::strict;
    else
      return false;
  }();
  std::vector<std::unique_ptr<asyncps::tcp_transport>> server_transports;
  std::unique_ptr<replica_log_reporter<server_t>> reporter;  // replica-log, --role server
  std::vector<std::unique_ptr<server_t>> servers;
  std::vector<asyncps::tcp_transport::endpoint_type> endpoints;
  std::vector<std::vector<asyncps::tcp_transport::endpoint_type>> replicas;
  std::unique_ptr<asyncps::tcp_transport> master_transport;
  std::unique_ptr<asyncps::basic_chain_master<asyncps::tcp_transport>> master;
  if constexpr (chain) {
    if (c.role == "all" && !c.external_servers) {
      if (!start_chain<server_t>(c, opt, layout, io, server_transports, servers, endpoints,
                                 replicas, master_transport, master))
        return 2;
    } else if (c.role == "server") {
      if (!start_chain_server<server_t>(c, opt, layout, io, server_transports, servers)) return 2;
    }
  }
  if (!chain && ((c.role == "all" && !c.external_servers) || c.role == "server")) {
    const std::uint32_t first = c.role == "all" ? 0 : c.shard;
    const std::uint32_t last = c.role == "all" ? c.servers : c.shard + 1;
    for (std::uint32_t k = first; k < last; ++k) {
      std::uint32_t s = k;  // the shard (the rendezvous may assign another)
      auto ep = asyncps::parse_tcp_endpoint(c.role == "all" ? "127.0.0.1:0" : c.listen);
      if (!ep) {
        std::cerr << "fashion_mnist: --listen: expected host:port, got '" << c.listen << "'\n";
        return 2;
      }
      auto& t = server_transports.emplace_back(
          std::make_unique<asyncps::tcp_transport>(asio::make_strand(io), tcp_opts(c)));
      auto acc = t->listen(ep.value());
      if (!acc) {
        std::cerr << "fashion_mnist: cannot listen on " << c.listen << ": " << acc.error().message()
                  << '\n';
        return 2;
      }
      endpoints.push_back(acc.value().local_endpoint());
      if (c.role == "server" && c.on_listening) {  // publish the address at the rendezvous
        const auto shard = c.on_listening(endpoints.back().port());
        if (!shard) return 2;
        s = *shard;
      }
      auto so = server_opts(c, s, layout);
      std::function<void(bool)> tick;
      if constexpr (std::is_same_v<Recovery, asyncps::recovery::replica_log>) {
        if (c.role == "server" && !c.server_report.empty()) {
          reporter = std::make_unique<replica_log_reporter<server_t>>(c.server_report);
          tick = reporter->tick();
        }
      }
      auto part = make_server_part<Recovery>(c, s);
      if constexpr (std::is_same_v<Recovery, asyncps::recovery::replica_log>) {
        if (reporter) part.on_rebuilt = reporter->rebuilt();
      }
      auto& srv = servers.emplace_back(std::make_unique<server_t>(*t, so, opt, std::move(part)));
      if (reporter) reporter->attach(*srv);
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
  }
  if (c.role == "worker" || c.external_servers) {
    // Under chain replication --connect lists every server of every shard, shard-major.
    const std::uint32_t per_shard = chain ? c.replicas : 1;
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
  std::atomic<int> shards_lost{0};  // workers that ended with errc::shard_lost
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
      // Elastic: a worker that joins late, or rejoins after a restart, trains to the job's
      // end clock, not a full run from where it joined.
      if (c.elastic) o.end_clock = static_cast<asyncps::clock_value>(clocks);
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
          make_worker_part<Recovery>(c)));
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
              if (ec == asyncps::errc::shard_lost) ++shards_lost;
            }
            // Chain servers in this process serve until every worker is done.
            if (++finished == workers.size()) {
              if (master)  // first, so it does not report the servers' exits as failures
                asio::post(master_transport->get_executor(), [m = master.get()] { m->stop(); });
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
  if constexpr (chain) {
    // One server per shard: the head (it has every acknowledged push).
    std::vector<std::unique_ptr<server_t>> heads;
    for (auto& s : servers)
      if (s->recovery().is_head()) heads.push_back(std::move(s));
    servers = std::move(heads);
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
    if (strict_chain) std::cerr << " (" << acked << " of them acknowledged)";
    std::cerr << '\n';
  }
  std::printf("observed staleness (clocks:reads): %s\n", st.to_string().c_str());
  if constexpr (!std::is_same_v<Recovery, asyncps::recovery::none>) {
    asyncps::worker_stats ws;
    asyncps::recovery::stateless_worker_stats rs_sum;  // zero under other policies
    for (auto& w : workers) {
      const auto& s = w->stats();
      ws.reconnects += s.reconnects;
      ws.lost_pushes += s.lost_pushes;
      ws.lost_acknowledged += s.lost_acknowledged;
      if constexpr (requires { w->recovery().stats().local_clocks; }) {  // stateless
        const auto& rs = w->recovery().stats();
        rs_sum.local_clocks += rs.local_clocks;
        rs_sum.backlogs_sent += rs.backlogs_sent;
        rs_sum.replicas_sent += rs.replicas_sent;
      }
      ws.clocks += s.clocks;
      ws.wait_seconds += s.wait_seconds;
      ws.compute_seconds += s.compute_seconds;
    }
    const double busy = 100.0 * ws.compute_seconds /
                        (secs * static_cast<double>(workers.empty() ? 1 : workers.size()));
    nlohmann::json summary{{"summary", true},
                           {"time_s", secs},
                           {"gradients", ws.clocks},
                           {"reconnects", ws.reconnects},
                           {"lost_pushes", ws.lost_pushes},
                           {"lost_acknowledged", ws.lost_acknowledged},
                           {"shard_lost", shards_lost.load() != 0},
                           {"local_clocks", rs_sum.local_clocks},
                           {"compute_s", ws.compute_seconds},
                           {"wait_s", ws.wait_seconds},
                           {"workers", workers.size()}};
    if constexpr (std::is_same_v<Recovery, asyncps::recovery::replica_log>) {
      // The rebuilds are counted by the servers: read them here when they run in this
      // process, else from the reports of the server processes (role all with --kill-at).
      replica_log_totals rb;
      if (!servers.empty()) {
        for (auto& s : servers) {
          rb.add(s->recovery().stats());
          asyncps::shard_state state;
          s->save_state(state);
          rb.applied[s->options().shard] = state.applied;
        }
      } else if (!c.server_report.empty()) {
        rb = read_replica_log_reports(c.server_report, c.servers, std::chrono::seconds(10));
      }
      // Pushes lost or applied twice, from the final shard states (replica-log resends what a
      // rebuilt shard lacks, so worker_stats::lost_pushes counts nothing under it). Both models
      // are dense: each clock of worker w pushes once to every (shard, table), so a final state
      // holds as many pushes of w per table as w completed clocks. Needs every shard's final
      // state and every worker in this process.
      std::uint64_t lost = 0, twice = 0;
      const bool counted = rb.applied.size() == c.servers && workers.size() == c.workers;
      for (const auto& [shard, applied] : rb.applied) {
        if (!counted) break;
        const std::size_t tables = applied.size() / c.workers;
        for (std::size_t i = 0; i < applied.size(); ++i) {
          const std::uint64_t pushed = workers[i / tables]->stats().clocks;
          lost += pushed > applied[i] ? pushed - applied[i] : 0;
          twice += applied[i] > pushed ? applied[i] - pushed : 0;
          if (pushed != applied[i])
            std::fprintf(stderr, "shard %u, worker %zu, table %zu: %llu pushes, %llu applied\n",
                         static_cast<unsigned>(shard), i / tables, i % tables,
                         static_cast<unsigned long long>(pushed),
                         static_cast<unsigned long long>(applied[i]));
        }
      }
      asyncps::recovery::replica_log_worker_stats wl;  // max_* fields: the most of one worker
      for (auto& w : workers) {
        const auto& rs = w->recovery().stats();
        wl.max_log_bytes = std::max(wl.max_log_bytes, rs.max_log_bytes);
        wl.max_replica_bytes = std::max(wl.max_replica_bytes, rs.max_replica_bytes);
        wl.replicas_stored += rs.replicas_stored;
        wl.replayed += rs.replayed;
        wl.orders += rs.orders;
      }
      const auto u = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
      const std::string name(Recovery::name);
      if (rb.known)
        std::printf("recovery %s: %llu rebuilds, %llu entries replayed, %llu positions missing, "
                    "%llu incomplete, ",
                    name.c_str(), u(rb.rebuilds), u(rb.replayed), u(rb.missing), u(rb.incomplete));
      else
        std::printf("recovery %s: rebuilds counted by the server processes (--server-report), ",
                    name.c_str());
      std::printf("%llu bytes max log per worker, %llu bytes max replica per worker, %llu replicas "
                  "stored, %llu reconnects, ",
                  u(wl.max_log_bytes), u(wl.max_replica_bytes), u(wl.replicas_stored),
                  u(ws.reconnects));
      if (counted)
        std::printf("%llu pushes lost, %llu applied twice", u(lost), u(twice));
      else
        std::printf("pushes lost not counted (no final state of every shard here)");
      std::printf("; %llu gradients, workers busy %.0f%%\n", u(ws.clocks), busy);
      if (rb.known) {
        summary["rebuilds"] = rb.rebuilds;
        summary["replayed"] = rb.replayed;
        summary["missing_positions"] = rb.missing;
        summary["incomplete_rebuilds"] = rb.incomplete;
        summary["skipped_clocks"] = rb.skipped_clocks;
        summary["max_rebuild_s"] = rb.max_seconds;
      }
      if (counted) {
        summary["lost_pushes"] = lost;
        summary["pushes_applied_twice"] = twice;
      } else {
        summary.erase("lost_pushes");
      }
      summary["max_log_bytes"] = wl.max_log_bytes;
      summary["max_replica_bytes"] = wl.max_replica_bytes;
      summary["replicas_stored"] = wl.replicas_stored;
      summary["entries_resent"] = wl.replayed;
      summary["orders"] = wl.orders;
    } else {
      // Pushes lost: what the workers counted (worker_stats::lost_pushes). Strict chain
      // replication resends instead of counting, so its figure is nonzero only when a shard
      // was lost (errc::shard_lost); the workers then also count how many of those pushes had
      // been acknowledged.
      const std::string acked = strict_chain
                                    ? " (" + std::to_string(ws.lost_acknowledged) + " acknowledged)"
                                    : std::string();
      std::printf("recovery %s: %llu reconnects, %llu pushes lost%s, %llu shard-clocks trained "
                  "locally, %llu backlogs and %llu replicas sent; %llu gradients, workers busy "
                  "%.0f%%\n",
                  std::string(Recovery::name).c_str(),
                  static_cast<unsigned long long>(ws.reconnects),
                  static_cast<unsigned long long>(ws.lost_pushes), acked.c_str(),
                  static_cast<unsigned long long>(rs_sum.local_clocks),
                  static_cast<unsigned long long>(rs_sum.backlogs_sent),
                  static_cast<unsigned long long>(rs_sum.replicas_sent),
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
