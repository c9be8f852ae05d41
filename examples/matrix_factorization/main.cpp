// mf_trainer — train matrix factorization (mf.hpp) on a synthetic Netflix-like rating matrix
// with asyncps parameter servers and workers talking over loopback TCP, in one process.
//
//   mf_trainer                                        # 2000 x 2000, rank 10, 120k ratings;
//                                                     # 2 servers, 4 workers, SSP(3), 10 epochs
//   mf_trainer --consistency bsp --workers 8 --servers 4
//   mf_trainer --users 500 --items 500 --rank 5 --ratings 20000 --clocks 300 --metrics mf.jsonl
//
// Every worker trains `mf::mf_model` on its contiguous shard of the training ratings; the model
// is a `sparse_gradient_source` and a `sparse_read_source`, so each clock a worker pulls only the
// user and item rows its next minibatch reads (keyed pulls) and pushes only the rows its gradient
// touched (keyed pushes). Progress: worker 0 asks for an evaluation every --eval-every clocks;
// a thread of its own reads the servers' model as a reader (`asyncps::async_read_model`, which
// holds no clock back) and prints its train and test RMSE. The last line is the test RMSE of the
// servers' final model.
//
// The consistency model is a compile-time policy: the servers are instantiated lazy (BSP, SSP,
// ASP workers) or eager (ESSP), and the workers' SSP/ESSP bound is a run-time value
// (`consistency::ssp<>`/`essp<>`; BSP is SSP with bound 0), as in the Fashion-MNIST trainer.
// Exit status: 0 trained, 1 a worker failed (e.g. diverged: the servers refuse non-finite
// pushes), 2 bad flags.
#include <CLI/CLI.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "../common/model_reader.hpp"
#include "asyncps/asyncps.hpp"
#include "mf.hpp"

namespace {

namespace mf = asyncps::examples::mf;
using clock_type = std::chrono::steady_clock;
using endpoint = asyncps::tcp_transport::endpoint_type;

/// The command line (`main` documents every flag).
struct config {
  // Data (mf::synthetic_options), split into train and test.
  std::uint32_t users = 2000;
  std::uint32_t items = 2000;
  std::uint32_t rank = 10;  ///< of the synthetic truth and of the model
  std::size_t ratings = 120000;
  float noise = 0.1f;
  double test_fraction = 0.1;
  std::uint64_t seed = 1;  ///< data, split, server initial values, minibatch order
  // Cluster.
  std::uint32_t servers = 2;
  std::uint32_t workers = 4;
  std::string consistency = "ssp";
  int staleness = 3;
  // Training.
  float lr = 0;                  ///< server SGD learning rate; 0: `default_lr_per_rating` x batch
  float l2 = 0.0001f;            ///< mf_model's lambda
  double minibatch = 0.01;       ///< fraction of a worker's shard per clock
  std::uint64_t clocks = 0;      ///< clocks per worker; 0: from `epochs`
  double epochs = 10;            ///< passes over a worker's shard (when `clocks` is 0)
  std::uint64_t eval_every = 0;  ///< clocks of worker 0 between evaluations; 0: clocks / 10
  std::string metrics;           ///< JSON-lines file; empty: none
  unsigned compute_threads = 2;
};

/// The default learning rate per rating of the minibatch: lr = 0.06 x batch, so that each
/// rating's step 2 lr / batch is 0.12 whatever the minibatch size. The best BSP rate of
/// docs/results/consistency.md's grid (8 at 135 ratings) is 0.059 x 135; on this trainer's
/// default matrix (270 ratings) lr 16.2 beat 8 and 24, and 32 diverged
/// (docs/results/matrix_factorization.md).
constexpr float default_lr_per_rating = 0.06f;

/// The data of a run: train/test ratings and each worker's shard of the training set.
struct dataset {
  mf::ratings train;
  mf::ratings test;
  std::vector<mf::ratings> shards;
};

/// Train and test RMSE of one model, in rating units.
struct rmse_pair {
  double train = 0;
  double test = 0;
};

/// Options of every TCP transport of this process: a random shared secret for this run (all
/// nodes are in this process), so that no unauthenticated peer can join the loopback servers.
asyncps::tcp_options tcp_opts(const asyncps::shared_secret& secret) {
  asyncps::tcp_options o;
  o.secret = secret;
  return o;
}

/// RMSE of the model `params` (laid out as `layout`) on the training and test ratings.
rmse_pair evaluate(std::span<const asyncps::table_spec> layout, const std::vector<float>& params,
                   const dataset& d) {
  const asyncps::parameter_view view(layout, params.data());
  return {mf::rmse(view, d.train), mf::rmse(view, d.test)};
}

/// Reads the servers' model as a reader (`asyncps::examples::read_servers_model`) and
/// evaluates it, either now on the calling thread (`read_now`) or on a thread of its own
/// (`request`), so that worker 0 never waits for an evaluation. One background evaluation at a
/// time: a request made while one runs is refused.
class evaluator {
 public:
  /// What a background evaluation was asked at, by worker 0.
  struct request_info {
    asyncps::clock_value clock = 0;  ///< clocks worker 0 has completed
    double epoch = 0;                ///< passes over worker 0's shard
    double time_s = 0;               ///< seconds since the servers started
    double staleness_mean = 0;       ///< worker 0's observed staleness so far (clocks)
    int staleness_max = 0;           ///< and its maximum
  };
  /// Called on the evaluator's thread with the request and the RMSEs, or the reason the
  /// servers' model could not be read.
  using callback =
      std::function<void(const request_info&, const std::optional<rmse_pair>&, const std::string&)>;

  evaluator(std::vector<endpoint> servers, std::vector<asyncps::table_spec> layout,
            asyncps::tcp_options options, const dataset& data, callback done)
      : servers_(std::move(servers)), layout_(std::move(layout)), options_(std::move(options)),
        data_(data), done_(std::move(done)), params_(asyncps::layout_size(layout_)) {}

  /// Reads and evaluates the servers' model on the calling thread, while no background
  /// evaluation runs (before the first `request`, or after `stop`). Returns the RMSEs, or
  /// nothing with `why` set.
  std::optional<rmse_pair> read_now(std::string& why) {
    why = read(params_);
    if (!why.empty()) return std::nullopt;
    return evaluate(layout_, params_, data_);
  }

  /// Starts a background evaluation; false (and nothing happens) when one is running or the
  /// evaluator is stopping.
  bool request(const request_info& r) {
    return jobs_.try_start([this, r] {
      const std::string why = read(params_);
      std::optional<rmse_pair> e;
      if (why.empty()) e = evaluate(layout_, params_, data_);
      done_(r, e, why);
    });
  }

  /// Finishes the evaluation in progress (if any) and joins the thread. Idempotent.
  void stop() { jobs_.stop(); }

 private:
  std::string read(std::vector<float>& out) {
    return asyncps::examples::read_servers_model(servers_, layout_, out, options_,
                                                 std::chrono::seconds(5));
  }

  std::vector<endpoint> servers_;
  std::vector<asyncps::table_spec> layout_;
  asyncps::tcp_options options_;
  const dataset& data_;
  callback done_;
  std::vector<float> params_;                  // the servers' model, as read
  asyncps::examples::single_job_thread jobs_;  // last: stopped before the members above go
};

/// The server policy for workers of `Consistency`: a server only uses the policy's `eager`
/// flag (the staleness bound travels in each pull), so one lazy and one eager server type
/// serve every worker type. Run-time bounds (`ssp<>`, `essp<>`), as the Fashion-MNIST
/// trainer's: a compile-time bound of 0 would also bound every hello's clock (a worker far
/// ahead under ASP could not rejoin a restarted server).
template <class Consistency>
using server_policy = std::conditional_t<Consistency::eager, asyncps::consistency::essp<>,
                                         asyncps::consistency::ssp<>>;

/// Generates the synthetic matrix, splits off the test set and shards the training set.
/// Throws `std::invalid_argument` (from mf.hpp) when the options are out of range, and
/// `std::invalid_argument` when a worker's shard would be empty.
dataset make_dataset(const config& c) {
  mf::synthetic_options o;
  o.users = c.users;
  o.items = c.items;
  o.rank = c.rank;
  o.count = c.ratings;
  o.noise = c.noise;
  o.seed = c.seed;
  auto split = mf::split(mf::make_synthetic(o), c.test_fraction, c.seed);
  dataset d{std::move(split.train), std::move(split.test), {}};
  if (d.train.size() < c.workers || d.test.size() == 0) {
    throw std::invalid_argument("--ratings " + std::to_string(c.ratings) + " leaves " +
                                std::to_string(d.train.size()) + " training and " +
                                std::to_string(d.test.size()) + " test ratings; need at least " +
                                std::to_string(c.workers) + " (one per worker) and 1");
  }
  for (std::uint32_t w = 0; w < c.workers; ++w)
    d.shards.push_back(mf::take_shard(d.train, w, c.workers));
  return d;
}

/// Trains with worker policy `Consistency` (`asp`, `ssp<>` or `essp<>`). Returns the exit
/// status.
template <class Consistency>
int run(const config& c, const dataset& data) {
  using server_t = asyncps::server<server_policy<Consistency>>;
  using worker_t = asyncps::worker<mf::mf_model, Consistency>;

  auto secret = asyncps::shared_secret::random();
  if (!secret) {
    std::cerr << "mf_trainer: cannot make a random secret: " << secret.error().message() << '\n';
    return 1;
  }
  const asyncps::tcp_options topts = tcp_opts(secret.value());

  // One model per worker; the smallest shard sets the minibatch size (shards differ by one).
  std::size_t smallest = data.shards.front().size();
  for (const auto& s : data.shards) smallest = std::min(smallest, s.size());
  const auto batch = static_cast<std::uint32_t>(
      std::max(1.0, std::round(c.minibatch * static_cast<double>(smallest))));
  std::vector<std::unique_ptr<mf::mf_model>> models;
  for (std::uint32_t w = 0; w < c.workers; ++w)
    models.push_back(
        std::make_unique<mf::mf_model>(data.shards[w], c.rank, batch, c.l2, c.seed * 1000 + w));
  const std::vector<asyncps::table_spec> layout(models[0]->tables().begin(),
                                                models[0]->tables().end());
  const float lr = c.lr > 0 ? c.lr : default_lr_per_rating * static_cast<float>(batch);
  const std::uint64_t clocks =
      c.clocks != 0
          ? c.clocks
          : std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::llround(
                                           c.epochs * static_cast<double>(smallest) / batch)));
  const std::uint64_t eval_every =
      c.eval_every != 0 ? c.eval_every : std::max<std::uint64_t>(1, clocks / 10);

  std::ofstream metrics;
  if (!c.metrics.empty()) {
    metrics.open(c.metrics);
    if (!metrics) {
      std::cerr << "mf_trainer: --metrics: cannot write " << c.metrics << '\n';
      return 2;
    }
  }
  std::mutex out_mutex;  // stdout and the metrics file (worker 0 and the evaluator write)
  const auto start = clock_type::now();
  const auto elapsed = [start] {
    return std::chrono::duration<double>(clock_type::now() - start).count();
  };
  const auto record = [&](const nlohmann::json& j) {
    if (metrics.is_open()) metrics << j.dump() << '\n' << std::flush;
  };

  std::cout << "mf_trainer: " << c.users << " users x " << c.items << " items, rank " << c.rank
            << ", " << data.train.size() << " train / " << data.test.size() << " test ratings; "
            << c.consistency;
  if (c.consistency == "ssp" || c.consistency == "essp") std::cout << "(" << c.staleness << ")";
  std::cout << ", " << c.servers << " servers, " << c.workers << " workers, minibatch " << batch
            << " (" << c.minibatch * 100 << "% of " << smallest << "), lr " << lr << ", l2 " << c.l2
            << ", " << clocks << " clocks per worker" << std::endl;

  // The servers, each on a strand of a 2-thread io_context, on loopback ports the kernel picks.
  asio::io_context io(2);
  auto work = asio::make_work_guard(io);
  asio::thread_pool compute(c.compute_threads);
  std::vector<std::unique_ptr<asyncps::tcp_transport>> server_transports;
  std::vector<std::unique_ptr<server_t>> servers;
  std::vector<endpoint> endpoints;
  const asyncps::optimizer::sgd sgd{lr};
  for (std::uint32_t s = 0; s < c.servers; ++s) {
    auto& t = server_transports.emplace_back(
        std::make_unique<asyncps::tcp_transport>(asio::make_strand(io), topts));
    auto acc = t->listen(asyncps::parse_tcp_endpoint("127.0.0.1:0").value());
    if (!acc) {
      std::cerr << "mf_trainer: cannot listen on loopback: " << acc.error().message() << '\n';
      return 1;
    }
    endpoints.push_back(acc.value().local_endpoint());
    asyncps::server_options so;
    so.shard = s;
    so.num_shards = c.servers;
    so.num_workers = c.workers;
    so.seed = c.seed;
    auto& srv = servers.emplace_back(std::make_unique<server_t>(*t, *models[0], so, sgd));
    asio::co_spawn(
        t->get_executor(),
        [p = srv.get(), a = std::move(acc).value()]() mutable -> asio::awaitable<void> {
          if (auto ec = co_await p->async_serve(std::move(a)))
            std::cerr << "server " << p->options().shard << ": " << ec.message() << '\n';
        },
        asio::detached);
  }
  std::vector<std::thread> io_threads;
  for (int i = 0; i < 2; ++i) io_threads.emplace_back([&io] { io.run(); });
  const auto stop_servers = [&] {
    for (std::size_t k = 0; k < servers.size(); ++k)
      asio::post(server_transports[k]->get_executor(), [p = servers[k].get()] { p->stop(); });
  };
  const auto shut_down = [&] {
    stop_servers();
    work.reset();
    for (auto& t : io_threads) t.join();
    compute.join();
  };

  const auto epoch_of = [&](asyncps::clock_value clock) {
    return static_cast<double>(clock) * batch / static_cast<double>(smallest);
  };
  const auto print_eval = [&](const evaluator::request_info& r, const std::optional<rmse_pair>& e,
                              const std::string& why) {
    std::lock_guard lock(out_mutex);
    char line[256];
    if (e) {
      std::snprintf(line, sizeof line,
                    "clock %6lld  epoch %6.2f  %7.2f s  train rmse %.4f  test rmse %.4f  "
                    "staleness mean %.2f max %d",
                    static_cast<long long>(r.clock), r.epoch, r.time_s, e->train, e->test,
                    r.staleness_mean, r.staleness_max);
      std::cout << line << std::endl;
      record({{"clock", r.clock},
              {"epoch", r.epoch},
              {"time_s", r.time_s},
              {"train_rmse", e->train},
              {"test_rmse", e->test},
              {"staleness_mean", r.staleness_mean},
              {"staleness_max", r.staleness_max}});
    } else {
      std::cout << "clock " << r.clock << ": the servers' model was not read: " << why << std::endl;
    }
  };
  evaluator ev(endpoints, layout, topts, data, print_eval);

  // The initial model (the servers' random factors), read the same way.
  std::string why;
  const auto initial = ev.read_now(why);
  if (!initial) {
    std::cerr << "mf_trainer: cannot read the servers' initial model: " << why << '\n';
    ev.stop();
    shut_down();
    return 1;
  }
  print_eval({.clock = 0, .epoch = 0, .time_s = elapsed()}, initial, "");

  // The workers.
  std::vector<std::unique_ptr<asyncps::tcp_transport>> worker_transports;
  std::vector<std::unique_ptr<worker_t>> workers;
  std::atomic<int> failures{0};
  std::mutex done_mutex;
  std::condition_variable done_cv;
  std::uint32_t finished = 0;
  std::atomic<std::uint64_t> skipped{0};  // evaluations refused: the previous one still ran
  for (std::uint32_t w = 0; w < c.workers; ++w) {
    auto& t = worker_transports.emplace_back(
        std::make_unique<asyncps::tcp_transport>(asio::make_strand(io), topts));
    typename worker_t::options_type o;
    o.id = w;
    o.servers = endpoints;
    if (w == 0) {
      // r.clock is the clock just completed (0 first): r.clock + 1 clocks are done.
      o.on_clock = [&](const asyncps::clock_report& r) {
        const asyncps::clock_value done = r.clock + 1;
        if (done % static_cast<asyncps::clock_value>(eval_every) != 0) return;
        const auto& st = workers[0]->staleness();
        if (!ev.request({.clock = done,
                         .epoch = epoch_of(done),
                         .time_s = elapsed(),
                         .staleness_mean = st.mean(),
                         .staleness_max = st.max()}))
          ++skipped;
      };
    }
    workers.push_back(std::make_unique<worker_t>(*t, *models[w], o, compute.get_executor()));
    if constexpr (!std::is_same_v<Consistency, asyncps::consistency::asp>)
      workers.back()->consistency().staleness = c.consistency == "bsp" ? 0 : c.staleness;
  }
  for (std::size_t i = 0; i < workers.size(); ++i) {
    asio::co_spawn(
        worker_transports[i]->get_executor(),
        [&, p = workers[i].get()]() -> asio::awaitable<void> {
          if (auto ec = co_await p->async_run(clocks)) {
            std::lock_guard lock(out_mutex);
            std::cerr << "worker " << p->options().id << ": " << ec.message() << '\n';
            if (ec == asyncps::errc::non_finite_value || ec == asyncps::errc::non_finite_update)
              std::cerr << "mf_trainer: the factors diverged (non-finite gradient or update); "
                           "try a smaller --lr\n";
            // The first failure ends the run: the servers stop, so the other workers end
            // (server lost) instead of waiting for this one's clock until their wait_timeout.
            if (failures++ == 0) stop_servers();
          }
          std::lock_guard lock(done_mutex);
          ++finished;
          done_cv.notify_all();
        },
        asio::detached);
  }
  {
    std::unique_lock lock(done_mutex);
    done_cv.wait(lock, [&] { return finished == c.workers; });
  }
  const double train_s = elapsed();
  ev.stop();  // before the servers stop: an evaluation in progress still reads them
  shut_down();

  // The servers' final model, read in place (every push is applied: the workers are done).
  std::vector<float> final_params(asyncps::layout_size(layout));
  for (const auto& s : servers) s->copy_values_into(final_params);
  const rmse_pair fin = evaluate(layout, final_params, data);

  asyncps::staleness_histogram st;
  asyncps::worker_stats sum;
  for (const auto& w : workers) {
    st += w->staleness();
    const auto& s = w->stats();
    sum.clocks += s.clocks;
    sum.pulls += s.pulls;
    sum.sparse_pulls += s.sparse_pulls;
    sum.bytes_in += s.bytes_in;
    sum.bytes_out += s.bytes_out;
  }
  asyncps::clock_value reached = static_cast<asyncps::clock_value>(clocks);
  for (const auto& w : workers) reached = std::min(reached, w->clock());
  const bool failed = failures != 0;
  record({{"final", true},
          {"failed", failed},
          {"clock", reached},
          {"clocks_planned", clocks},
          {"time_s", train_s},
          {"lr", lr},
          {"minibatch", batch},
          {"initial_train_rmse", initial->train},
          {"initial_test_rmse", initial->test},
          {"train_rmse", fin.train},
          {"test_rmse", fin.test},
          {"pulls", sum.pulls},
          {"keyed_pulls", sum.sparse_pulls},
          {"bytes_in", sum.bytes_in},
          {"bytes_out", sum.bytes_out},
          {"evaluations_skipped", skipped.load()}});
  std::printf("observed staleness (clocks:reads): %s\n", st.to_string().c_str());
  std::printf("traffic: %llu gradients, %llu pulls (%llu keyed), %.1f MB received and %.1f MB "
              "sent by the workers\n",
              static_cast<unsigned long long>(sum.clocks),
              static_cast<unsigned long long>(sum.pulls),
              static_cast<unsigned long long>(sum.sparse_pulls),
              static_cast<double>(sum.bytes_in) / 1e6, static_cast<double>(sum.bytes_out) / 1e6);
  if (failed) {
    std::cerr << "mf_trainer: the run failed: " << failures.load() << " of " << c.workers
              << " workers stopped early; every worker reached clock " << reached << " of "
              << clocks << '\n';
  }
  std::printf("final test rmse %.4f (train %.4f; initial test %.4f) after %.1f s, %lld clocks "
              "per worker%s\n",
              fin.test, fin.train, initial->test, train_s, static_cast<long long>(reached),
              failed ? " (FAILED)" : "");
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  CLI::App app{"Train matrix factorization on a synthetic rating matrix with asyncps parameter "
               "servers and workers over loopback TCP (one process)"};
  app.option_defaults()->always_capture_default();  // --help shows each default
  app.add_option("--users", c.users, "rows of the rating matrix")->check(CLI::Range(1u, 10000000u));
  app.add_option("--items", c.items, "columns of the rating matrix")
      ->check(CLI::Range(1u, 10000000u));
  app.add_option("--rank", c.rank, "rank of the synthetic truth and of the factors")
      ->check(CLI::Range(1u, 1024u));
  app.add_option("--ratings", c.ratings,
                 "observed (user, item) entries, distinct, <= users x items; --test-fraction of "
                 "them are held out")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 32));
  app.add_option("--noise", c.noise, "standard deviation of the Gaussian rating noise")
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--test-fraction", c.test_fraction, "fraction of the ratings held out")
      ->check(CLI::Range(0.001, 0.9));
  app.add_option("--seed", c.seed,
                 "seeds the data, the split, the servers' initial factors and the minibatches");
  app.add_option("--servers", c.servers, "server shards (<= users and <= items)")
      ->check(CLI::Range(1u, 64u));
  app.add_option("--workers", c.workers, "workers, each training on its shard of the ratings")
      ->check(CLI::Range(1u, 256u));
  app.add_option("--consistency", c.consistency,
                 "bsp, ssp (bound --staleness), essp (eager SSP, bound --staleness) or asp")
      ->check(CLI::IsMember({"bsp", "ssp", "essp", "asp"}));
  app.add_option("--staleness", c.staleness, "SSP/ESSP bound s in clocks")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--lr", c.lr,
                 "the servers' SGD learning rate; the gradient is a mean over the minibatch, so "
                 "a rating's step is 2 lr / minibatch size (default: 0.06 x the minibatch size, a "
                 "step of 0.12 per rating)")
      ->check(CLI::PositiveNumber)
      ->default_str("");
  app.add_option("--l2", c.l2, "L2 coefficient lambda on the rows a minibatch touches")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--minibatch", c.minibatch,
                 "fraction of a worker's ratings per clock (0.01: 1%, as in Dai et al. 2015)")
      ->check(CLI::Range(1e-6, 1.0));
  auto* clocks = app.add_option("--clocks", c.clocks, "clocks per worker (default: from --epochs)")
                     ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40))
                     ->default_str("");
  app.add_option("--epochs", c.epochs, "passes over each worker's shard")
      ->check(CLI::Range(1e-3, 1e6))
      ->excludes(clocks);
  app.add_option("--eval-every", c.eval_every,
                 "clocks of worker 0 between evaluations of the servers' model (default: a "
                 "tenth of the run)")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40))
      ->default_str("");
  app.add_option("--metrics", c.metrics,
                 "JSON-lines file: one line per evaluation and a final line (default: none)");
  app.add_option("--compute-threads", c.compute_threads, "gradient threads")
      ->check(CLI::Range(1u, 256u));

  // A bad flag: one line naming it, exit status 2. --help: the usage, exit status 0.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "mf_trainer: " << e.what() << " (see --help)\n";
    return 2;
  }
  const char* bad = nullptr;
  if (c.ratings > std::uint64_t{c.users} * std::uint64_t{c.items})
    bad = "--ratings must be <= --users x --items";
  else if (c.servers > std::min(c.users, c.items))
    bad = "--servers must be <= --users and <= --items (every shard holds rows of both tables)";
  else if (app.count("--staleness") > 0 && c.consistency != "ssp" && c.consistency != "essp")
    bad = "--staleness needs --consistency ssp or essp";
  if (bad != nullptr) {
    std::cerr << "mf_trainer: " << bad << '\n';
    return 2;
  }

  dataset data;
  try {
    data = make_dataset(c);
  } catch (const std::invalid_argument& e) {
    std::cerr << "mf_trainer: " << e.what() << '\n';
    return 2;
  }
  try {
    using namespace asyncps::consistency;
    if (c.consistency == "asp") return run<asp>(c, data);
    if (c.consistency == "essp") return run<essp<>>(c, data);
    return run<ssp<>>(c, data);  // bsp: ssp with bound 0
  } catch (const std::exception& e) {
    std::cerr << "mf_trainer: " << e.what() << '\n';
    return 1;
  }
}
