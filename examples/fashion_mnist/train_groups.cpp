// fashion_mnist — group servers against stragglers (--groups G >= 2; asyncps/group.hpp,
// docs/concepts/groups.md), everything in this process over loopback TCP.
//
//   workers --BSP--> G group servers (basic_group_server, the trainer's optimizer and lr)
//           --ASP--> --servers central shards (basic_server<asp>, SGD with learning rate 1,
//                    central_layout(model, G): the model's tables plus one push counter per group)
//
// Each group trains synchronously on its group server; every --push-every group clocks the
// group server pushes its progress to the central servers and goes on from the central model
// plus that progress. A straggler (--slow-worker) then holds back only its own group. The final
// accuracy is the central model's.
//
// Only the group servers depend on the optimizer; they sit behind `group_tier` so this file
// instantiates them once per optimizer and everything else once.
#include "trainer.hpp"

#include "asyncps/group.hpp"

namespace fashion {
namespace {

using endpoint = asyncps::tcp_transport::endpoint_type;
using central_server = asyncps::basic_server<asyncps::tcp_transport, asyncps::consistency::asp,
                                             asyncps::recovery::none, asyncps::optimizer::sgd>;
using group_worker = asyncps::basic_worker<any_model, asyncps::tcp_transport,
                                           asyncps::consistency::bsp, asyncps::recovery::none>;

/// What one group server did, read after the run.
struct group_report {
  std::uint64_t pushes = 0;                     ///< central pushes made
  asyncps::clock_value clock = 0;               ///< the group server's final clock
  asyncps::staleness_histogram push_staleness;  ///< other groups' pushes each push did not see
};

/// The G group servers, whatever the optimizer (the only part of a group run that depends on
/// it). Construct with `make_group_tier`; every member on the thread that runs the io_context
/// once it has stopped, or before it runs.
class group_tier {
 public:
  virtual ~group_tier() = default;
  /// Where group `g`'s workers connect.
  virtual endpoint address(std::uint32_t g) const = 0;
  /// The learning rate workers apply to their own cache (read-my-writes).
  virtual float local_step() const = 0;
  /// Group `g`'s counters. Precondition: its run has completed.
  virtual group_report report(std::uint32_t g) = 0;
  /// Stops group `g`'s server (a worker of the group failed): its run then pushes what the
  /// group has done and ends. Thread safety: any thread.
  virtual void stop(std::uint32_t g) = 0;
};

/// `group_tier` for one optimizer type: listens on free loopback ports and runs each group
/// server on its own strand of `io`, calling `done(g, ec)` there when group `g`'s run ends.
template <class Optimizer>
class group_tier_of final : public group_tier {
 public:
  using group_server = asyncps::basic_group_server<asyncps::tcp_transport, Optimizer>;

  /// Throws `std::runtime_error` when a port cannot be opened, `std::invalid_argument` on
  /// inconsistent options (see `basic_group_server`).
  group_tier_of(const config& c, Optimizer opt, const asyncps::group_plan& plan,
                std::span<const asyncps::table_spec> layout, std::vector<endpoint> central,
                std::uint64_t clocks, asio::io_context& io,
                std::function<void(std::uint32_t, std::error_code)> done)
      : opt_(opt), done_(std::move(done)) {
    const auto loopback = asyncps::parse_tcp_endpoint("127.0.0.1:0").value();
    for (std::uint32_t g = 0; g < plan.groups; ++g) {
      auto& t = transports_.emplace_back(
          std::make_unique<asyncps::tcp_transport>(asio::make_strand(io), tcp_opts(c)));
      auto acc = t->listen(loopback);
      if (!acc) throw std::runtime_error("group server cannot listen: " + acc.error().message());
      addresses_.push_back(acc.value().local_endpoint());
      asyncps::server_options go;
      go.num_workers = static_cast<std::uint32_t>(plan.members(g).size());
      go.tables.assign(layout.begin(), layout.end());
      go.seed = c.seed;  // the central servers' seed: both start from the same model
      asyncps::worker_options<endpoint> lo;
      lo.servers = central;
      lo.connect_timeout = std::chrono::seconds(30);
      asyncps::group_options gl;
      gl.group = g;
      gl.groups = plan.groups;
      gl.push_every = c.push_every;
      gl.group_clocks = clocks;
      gl.scale_by_staleness = c.scale_staleness;
      auto& srv = groups_.emplace_back(std::make_unique<group_server>(*t, go, lo, gl, opt));
      asio::co_spawn(
          t->get_executor(),
          [this, g, p = srv.get(), a = std::move(acc).value()]() mutable -> asio::awaitable<void> {
            const std::error_code ec = co_await p->async_run(std::move(a));
            done_(g, ec);
          },
          asio::detached);
    }
  }

  endpoint address(std::uint32_t g) const override { return addresses_[g]; }
  float local_step() const override { return opt_.local_step(); }
  group_report report(std::uint32_t g) override {
    auto& p = *groups_[g];
    return {p.link_model().pushed(), p.group_server().clock(), p.link_model().staleness()};
  }
  void stop(std::uint32_t g) override {
    asio::post(transports_[g]->get_executor(),
               [p = groups_[g].get()] { p->group_server().stop(); });
  }

 private:
  Optimizer opt_;
  std::function<void(std::uint32_t, std::error_code)> done_;
  std::vector<std::unique_ptr<asyncps::tcp_transport>> transports_;
  std::vector<endpoint> addresses_;
  std::vector<std::unique_ptr<group_server>> groups_;
};

/// The group servers with the optimizer --optimizer names (the same choices as
/// `with_optimizer`). Arguments as for `group_tier_of`.
std::unique_ptr<group_tier>
make_group_tier(const config& c, const asyncps::group_plan& plan,
                std::span<const asyncps::table_spec> layout, std::vector<endpoint> central,
                std::uint64_t clocks, asio::io_context& io,
                std::function<void(std::uint32_t, std::error_code)> done) {
  namespace opt = asyncps::optimizer;
  const auto make = [&](auto o) -> std::unique_ptr<group_tier> {
    return std::make_unique<group_tier_of<decltype(o)>>(c, o, plan, layout, std::move(central),
                                                        clocks, io, std::move(done));
  };
  if (c.optimizer == "momentum") return make(opt::momentum{c.lr, 0.9f});
  if (c.optimizer == "adagrad") return make(opt::adagrad{c.lr});
  if (c.optimizer == "adam") return make(opt::adam{c.lr});
  return make(opt::sgd{c.lr});
}

/// Which group each worker trains in: by id, or by speed, the speeds being the slowdown factors
/// known up front (--slow-factor for --slow-worker, 1 for the others), so the straggler shares
/// the last group with the slowest of the rest.
asyncps::group_plan make_plan(const config& c) {
  if (c.group_by == "id") return asyncps::groups_by_id(c.workers, c.groups);
  std::vector<double> seconds_per_clock(c.workers, 1.0);
  if (c.slow_factor > 1) seconds_per_clock[c.slow_worker] = c.slow_factor;
  return asyncps::groups_by_speed(seconds_per_clock, c.groups);
}

/// "{2,3}": the members of a group.
std::string member_list(const std::vector<std::uint32_t>& ws) {
  // Appends piece by piece: `"," + std::to_string(..)` trips g++ 12's false -Wrestrict at -O3.
  std::string s = "{";
  for (std::size_t i = 0; i < ws.size(); ++i) {
    if (i != 0) s += ',';
    s += std::to_string(ws[i]);
  }
  s += '}';
  return s;
}

}  // namespace

int train_groups(const config& c) {
  fashion::dataset train, test;
  std::vector<asyncps::table_spec> layout;
  if (!load_data(c, train, test, layout)) return 2;
  const asyncps::group_plan plan = make_plan(c);
  const auto central_tables = asyncps::central_layout(layout, c.groups);
  const auto counter_table = static_cast<asyncps::table_id>(layout.size());

  asio::io_context io(2);
  asio::thread_pool compute(c.compute_threads != 0 ? c.compute_threads : 2);
  asio::thread_pool slow_compute(1);  // the straggler's own thread (--slow-worker)
  monitor mon(c, test);
  if (!mon.metrics) {
    std::cerr << "fashion_mnist: --metrics: cannot write " << c.metrics << '\n';
    return 2;
  }
  const auto loopback = asyncps::parse_tcp_endpoint("127.0.0.1:0").value();

  // Central servers: ASP, SGD with learning rate 1 (a push is a group's progress, already
  // scaled by the group's optimizer), serving until every group server has come and gone.
  std::vector<std::unique_ptr<asyncps::tcp_transport>> central_transports;
  std::vector<std::unique_ptr<central_server>> central;
  std::vector<endpoint> central_eps;
  for (std::uint32_t s = 0; s < c.servers; ++s) {
    auto& t = central_transports.emplace_back(
        std::make_unique<asyncps::tcp_transport>(asio::make_strand(io), tcp_opts(c)));
    auto acc = t->listen(loopback);
    if (!acc) {
      std::cerr << "fashion_mnist: cannot listen: " << acc.error().message() << '\n';
      return 2;
    }
    central_eps.push_back(acc.value().local_endpoint());
    asyncps::server_options o;
    o.shard = s;
    o.num_shards = c.servers;
    o.num_workers = c.groups;
    o.tables = central_tables;
    o.seed = c.seed;
    auto& srv = central.emplace_back(
        std::make_unique<central_server>(*t, o, asyncps::optimizer::sgd{1.0f}));
    asio::co_spawn(t->get_executor(), serve_until_done(*srv, std::move(acc).value(), c.groups),
                   asio::detached);
  }

  // Completion: group runs and worker runs. If any failed, the central servers may never see
  // every group come and go, so they are stopped once everything else has ended.
  const std::size_t runs = std::size_t{c.workers} + c.groups;
  std::atomic<std::size_t> finished{0};
  std::atomic<int> failures{0};
  std::vector<double> group_done_at(c.groups, 0);
  std::unique_ptr<group_tier> tier;
  const auto one_done = [&](bool failed) {
    if (failed) ++failures;
    if (++finished == runs && failures > 0)
      for (std::size_t k = 0; k < central.size(); ++k)
        asio::post(central_transports[k]->get_executor(), [s = central[k].get()] { s->stop(); });
  };

  const auto shard_size = train.size() / c.workers;
  const auto clocks = static_cast<std::uint64_t>(c.epochs * static_cast<double>(shard_size) /
                                                 static_cast<double>(c.batch));
  tier = make_group_tier(c, plan, layout, central_eps, clocks, io,
                         [&](std::uint32_t g, std::error_code ec) {
                           group_done_at[g] = mon.elapsed();
                           if (ec)
                             std::cerr << "\ngroup server " << g << ": " << ec.message() << '\n';
                           one_done(static_cast<bool>(ec));
                         });

  // Workers: BSP on their group's server, with their id within the group.
  std::vector<std::unique_ptr<asyncps::tcp_transport>> worker_transports;
  std::vector<std::unique_ptr<any_model>> models;
  std::vector<std::unique_ptr<group_worker>> workers;
  for (std::uint32_t w = 0; w < c.workers; ++w) {
    auto& t = worker_transports.emplace_back(
        std::make_unique<asyncps::tcp_transport>(asio::make_strand(io), tcp_opts(c)));
    auto& m = models.emplace_back(std::make_unique<any_model>(c, train, w, c.workers));
    group_worker::options_type o;
    o.id = plan.local_id(w);
    o.servers = {tier->address(plan.group_of[w])};
    o.local_step = tier->local_step();  // read-my-writes (exact for SGD)
    o.connect_timeout = std::chrono::seconds(30);
    o.on_clock = [&, w, model = m.get()](const asyncps::clock_report& r) {
      mon.samples += c.batch;
      if (w == 0) mon.on_clock(r, *model, workers[0]->staleness());
    };
    workers.push_back(std::make_unique<group_worker>(
        *t, *m, o,
        any_model::is_slow(c, w) ? slow_compute.get_executor() : compute.get_executor()));
  }
  for (std::uint32_t w = 0; w < c.workers; ++w)
    asio::co_spawn(
        worker_transports[w]->get_executor(),
        [&, w]() -> asio::awaitable<void> {
          const std::error_code ec = co_await workers[w]->async_run(clocks);
          if (ec) {
            std::cerr << "\nworker " << w << ": " << ec.message() << '\n';
            tier->stop(plan.group_of[w]);  // its group can no longer complete a BSP clock
          }
          one_done(static_cast<bool>(ec));
        },
        asio::detached);

  std::cout << "fashion_mnist: " << c.model << ", " << c.groups << " groups by " << c.group_by
            << " (bsp inside, asp to " << c.servers << " central servers, push every "
            << c.push_every << " group clocks" << (c.scale_staleness ? ", 1/staleness scaling" : "")
            << "):";
  for (std::uint32_t g = 0; g < c.groups; ++g) std::cout << ' ' << member_list(plan.members(g));
  if (c.slow_factor > 1) std::cout << ", worker " << c.slow_worker << " slowed x" << c.slow_factor;
  std::cout << ", " << c.workers << " workers, " << c.epochs << " epochs (" << clocks
            << " clocks of " << c.batch << " per worker), role all" << std::endl;

  std::thread second([&] { io.run(); });
  io.run();
  second.join();
  compute.join();
  slow_compute.join();
  if (mon.tty && !c.quiet) std::cout << '\n';

  // Final model: the central servers' values of the model's tables; the counter table says
  // how many pushes each group made.
  std::vector<float> final_params(asyncps::layout_size(layout));
  std::vector<float> counters(c.groups, 0.0f);
  std::size_t off = 0;
  for (asyncps::table_id t = 0; t <= layout.size(); ++t) {
    for (auto& s : central) {
      const auto v = s->values(t);
      if (t == counter_table) {
        std::copy(v.begin(), v.end(), counters.begin() + s->range(t).begin);
      } else {
        std::copy(v.begin(), v.end(),
                  final_params.begin() +
                      static_cast<std::ptrdiff_t>(off + std::size_t{s->range(t).begin} *
                                                            layout[t].width));
      }
    }
    if (t < layout.size()) off += layout[t].size();
  }
  const asyncps::parameter_view final_view(layout, final_params.data());
  const auto e = models.front()->evaluate(final_view, test);
  const double secs = mon.elapsed();

  // Each worker's measured speed: seconds per gradient, the --slow-factor sleep included.
  std::vector<double> speed;
  std::printf("seconds per clock computing, by worker:");
  for (auto& w : workers) {
    const auto& st = w->stats();
    speed.push_back(st.compute_seconds /
                    static_cast<double>(std::max<std::uint64_t>(1, st.clocks)));
    std::printf(" %.6f", speed.back());
  }
  std::printf("\n");
  nlohmann::json groups_json = nlohmann::json::array();
  for (std::uint32_t g = 0; g < c.groups; ++g) {
    const auto r = tier->report(g);
    const auto members = plan.members(g);
    double wait_s = 0, compute_s = 0;
    for (auto w : members) {
      wait_s += workers[w]->stats().wait_seconds;
      compute_s += workers[w]->stats().compute_seconds;
    }
    const double n = static_cast<double>(members.size());
    std::printf("group %u %s: %lld group clocks, finished at %.1f s; %llu central pushes (counter "
                "%.0f), push staleness mean %.2f max %d; per worker %.2f s computing, %.2f s "
                "waiting\n",
                g, member_list(members).c_str(), static_cast<long long>(r.clock), group_done_at[g],
                static_cast<unsigned long long>(r.pushes), static_cast<double>(counters[g]),
                r.push_staleness.mean(), r.push_staleness.max(), compute_s / n, wait_s / n);
    groups_json.push_back({{"group", g},
                           {"workers", members},
                           {"group_clocks", r.clock},
                           {"finished_s", group_done_at[g]},
                           {"pushes", r.pushes},
                           {"central_counter", counters[g]},
                           {"push_staleness_mean", r.push_staleness.mean()},
                           {"push_staleness_max", r.push_staleness.max()},
                           {"compute_s", compute_s},
                           {"wait_s", wait_s}});
  }
  mon.metrics << nlohmann::json{{"summary", true},
                                {"time_s", secs},
                                {"groups", c.groups},
                                {"group_by", c.group_by},
                                {"push_every", c.push_every},
                                {"scale_staleness", c.scale_staleness},
                                {"seconds_per_clock", speed},
                                {"group", groups_json}}
                     .dump()
              << '\n';
  mon.metrics << nlohmann::json{{"time_s", secs},
                                {"clock", clocks},
                                {"final", true},
                                {"test_accuracy", e.accuracy},
                                {"test_loss", e.loss}}
                     .dump()
              << '\n';
  std::printf("final test accuracy %.4f (loss %.4f) of the central model after %.1f s; metrics "
              "in %s\n",
              e.accuracy, e.loss, secs, c.metrics.c_str());
  return failures == 0 ? 0 : 1;
}

}  // namespace fashion
