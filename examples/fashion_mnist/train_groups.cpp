// fashion_mnist — group servers against stragglers (--groups G >= 2; asyncps/group.hpp,
// docs/concepts/groups.md): everything in this process over loopback TCP (--role all), or
// each part a process of its own (--role server: a central shard; --role group-server --group
// g: group g's server; --role worker: a worker of its group; docs/deploy.md).
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

#include <asio/this_coro.hpp>

#include <numeric>
#include <sstream>

#include "asyncps/group.hpp"

namespace fashion {
namespace {

using endpoint = asyncps::tcp_transport::endpoint_type;
using central_server = asyncps::basic_server<asyncps::tcp_transport, asyncps::consistency::asp,
                                             asyncps::recovery::none, asyncps::optimizer::sgd>;
using group_worker = asyncps::basic_worker<any_model, asyncps::tcp_transport,
                                           asyncps::consistency::bsp, asyncps::recovery::none>;

/// "127.0.0.1:7000".
std::string endpoint_text(const endpoint& ep) {
  std::ostringstream out;
  out << ep;
  return out.str();
}

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

/// `group_tier` for one optimizer type: runs the servers of the groups in `hosted` (each
/// listening on `listen`; port 0: a free port), each on its own strand of `io`, calling
/// `done(g, ec)` there when group `g`'s run ends.
template <class Optimizer>
class group_tier_of final : public group_tier {
 public:
  using group_server = asyncps::basic_group_server<asyncps::tcp_transport, Optimizer>;

  /// Throws `std::runtime_error` when a port cannot be opened, `std::invalid_argument` on
  /// inconsistent options (see `basic_group_server`).
  group_tier_of(const config& c, Optimizer opt, const asyncps::group_plan& plan,
                std::span<const asyncps::table_spec> layout, std::vector<endpoint> central,
                std::uint64_t clocks, asio::io_context& io,
                std::function<void(std::uint32_t, std::error_code)> done,
                const std::vector<std::uint32_t>& hosted, const endpoint& listen)
      : opt_(opt), done_(std::move(done)), transports_(plan.groups), addresses_(plan.groups),
        groups_(plan.groups) {
    for (const std::uint32_t g : hosted) {
      auto& t = transports_[g] =
          std::make_unique<asyncps::tcp_transport>(asio::make_strand(io), tcp_opts(c));
      auto acc = t->listen(listen);
      if (!acc)
        throw std::runtime_error("group server cannot listen on " + endpoint_text(listen) + ": " +
                                 acc.error().message());
      addresses_[g] = acc.value().local_endpoint();
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
      auto& srv = groups_[g] = std::make_unique<group_server>(*t, go, lo, gl, opt);
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

/// Calls `f` with the optimizer --optimizer names (the same choices as `with_optimizer`) and
/// returns its result.
template <class F>
auto with_group_optimizer(const config& c, F&& f) {
  namespace opt = asyncps::optimizer;
  if (c.optimizer == "momentum") return f(opt::momentum{c.lr, 0.9f});
  if (c.optimizer == "adagrad") return f(opt::adagrad{c.lr});
  if (c.optimizer == "adam") return f(opt::adam{c.lr});
  return f(opt::sgd{c.lr});
}

/// The group servers with the optimizer --optimizer names. Arguments as for `group_tier_of`.
std::unique_ptr<group_tier>
make_group_tier(const config& c, const asyncps::group_plan& plan,
                std::span<const asyncps::table_spec> layout, std::vector<endpoint> central,
                std::uint64_t clocks, asio::io_context& io,
                std::function<void(std::uint32_t, std::error_code)> done,
                const std::vector<std::uint32_t>& hosted, const endpoint& listen) {
  return with_group_optimizer(c, [&](auto o) -> std::unique_ptr<group_tier> {
    return std::make_unique<group_tier_of<decltype(o)>>(
        c, o, plan, layout, std::move(central), clocks, io, std::move(done), hosted, listen);
  });
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

// ---- Group servers as separate processes ------------------------------------------------

/// How long a central server keeps serving, after every group server has come and gone, for a
/// reader of the final model (worker 0's process) before it stops without one.
constexpr std::chrono::seconds central_linger{60};
/// How long worker 0's process waits, after its own run, for every group's last push to reach
/// the central servers (a straggler's group may end long after its own).
constexpr std::chrono::hours final_read_timeout{1};

/// Parses `texts` (host:port) into `out`; false after printing which is bad.
bool parse_endpoints(const std::vector<std::string>& texts, const char* flag,
                     std::vector<endpoint>& out) {
  for (const auto& text : texts) {
    auto ep = asyncps::parse_tcp_endpoint(text);
    if (!ep) {
      std::cerr << "fashion_mnist: " << flag << ": expected host:port, got '" << text << "'\n";
      return false;
    }
    out.push_back(ep.value());
  }
  return true;
}

/// The clocks each worker runs: --epochs passes over its part of the `examples` training
/// examples (the same figure in every process of the run).
std::uint64_t worker_clocks(const config& c, std::size_t examples) {
  return static_cast<std::uint64_t>(c.epochs * static_cast<double>(examples / c.workers) /
                                    static_cast<double>(c.batch));
}

/// The central pushes each group makes: one per --push-every group clocks, the last after the
/// group's last clock (`group_link::pushes`); the central servers' final clock.
std::uint64_t central_pushes(const config& c, std::uint64_t clocks) {
  return (clocks + c.push_every - 1) / c.push_every;
}

/// The number of training examples, from the images file's header (a group server loads no
/// data); nothing after printing why.
std::optional<std::size_t> training_examples(const config& c) {
  const std::filesystem::path file = std::filesystem::path(c.data) / "train-images-idx3-ubyte.gz";
  detail::gz_reader in(file);
  auto header = detail::read_header(in, file, 4, 2051);
  if (!header) {
    std::cerr << "fashion_mnist: " << header.error().message << '\n';
    return std::nullopt;
  }
  return header.value()[1];
}

/// Serves central shard `s` until every one of `groups` group servers has connected and left
/// and then a reader has read the final model: a reader session greeted after the server
/// clock reached its last value (`*readers_at_clock`, the readers greeted until then, kept by
/// the server's `on_clock`) that has ended. Stops without one after `central_linger`. `rc`
/// becomes 1 when serving fails.
asio::awaitable<void> serve_central(central_server& s, asyncps::tcp_transport::acceptor acceptor,
                                    std::uint32_t groups, const std::uint64_t* readers_at_clock,
                                    int& rc) {
  auto ex = co_await asio::this_coro::executor;
  asio::steady_timer poll(ex);
  asio::co_spawn(
      ex,
      [&s, &poll, groups, readers_at_clock]() -> asio::awaitable<void> {
        std::optional<clock_type::time_point> groups_left;
        const auto shard = s.options().shard;
        for (;;) {
          poll.expires_after(std::chrono::milliseconds(50));
          auto [ec] = co_await poll.async_wait(asyncps::detail::use_tuple);
          if (ec) co_return;  // serving ended
          if (!groups_left && s.workers_seen() >= groups && s.workers_connected() == 0) {
            groups_left = clock_type::now();
            std::cerr << "server " << shard << ": all " << groups
                      << " group servers have connected and left (server clock " << s.clock()
                      << "); serving the final model to a reader\n";
          }
          if (!groups_left) continue;
          if (s.stats().readers > *readers_at_clock && s.connections() == 0) {
            std::cerr << "server " << shard << ": a reader read the final model; stopping\n";
            s.stop();
            co_return;
          }
          if (clock_type::now() - *groups_left > central_linger) {
            std::cerr << "server " << shard << ": no reader read the final model within "
                      << central_linger.count() << " s; stopping\n";
            s.stop();
            co_return;
          }
        }
      },
      asio::detached);
  if (auto ec = co_await s.async_serve(std::move(acceptor))) {
    std::cerr << "server " << s.options().shard << ": " << ec.message() << '\n';
    rc = 1;
  }
  poll.cancel();
}

/// --role server --groups G: central shard --shard of --servers (ASP, SGD with learning rate
/// 1, the central layout), the G group servers its workers.
int run_central_server(const config& c) {
  fashion::dataset train, test;
  std::vector<asyncps::table_spec> layout;
  if (!load_data(c, train, test, layout)) return 2;  // the layout only: a server loads no data
  std::vector<endpoint> at;
  if (!parse_endpoints({c.listen}, "--listen", at)) return 2;
  asio::io_context io(1);
  asyncps::tcp_transport t(io.get_executor(), tcp_opts(c));
  auto acc = t.listen(at[0]);
  if (!acc) {
    std::cerr << "fashion_mnist: cannot listen on " << c.listen << ": " << acc.error().message()
              << '\n';
    return 2;
  }
  asyncps::server_options o;
  o.shard = c.shard;
  o.num_shards = c.servers;
  o.num_workers = c.groups;
  o.tables = asyncps::central_layout(layout, c.groups);
  o.seed = c.seed;
  // Readers greeted until the server clock last advanced: after the last group's last push,
  // a reader greeted later reads the final model.
  std::uint64_t readers_at_clock = 0;
  const central_server* self = nullptr;
  o.on_clock = [&](asyncps::clock_value) { readers_at_clock = self->stats().readers; };
  central_server s(t, o, asyncps::optimizer::sgd{1.0f});
  self = &s;
  std::cout << "server " << c.shard << " of " << c.servers << " listening on "
            << acc.value().local_endpoint() << " (central: asp, sgd lr 1, " << c.groups
            << " group servers)" << std::endl;
  int rc = 0;
  asio::co_spawn(io, serve_central(s, std::move(acc).value(), c.groups, &readers_at_clock, rc),
                 asio::detached);
  io.run();
  return rc;
}

/// --role group-server --group g: group g's server (BSP for its workers, the trainer's
/// optimizer), pushing to the --central shards (ASP); ends after its last central push.
int run_group_server(const config& c) {
  // The model's layout (no data), and the clocks from the training file's header.
  config layout_only = c;
  layout_only.role = "server";
  fashion::dataset train, test;
  std::vector<asyncps::table_spec> layout;
  if (!load_data(layout_only, train, test, layout)) return 2;
  const auto examples = training_examples(c);
  if (!examples) return 2;
  std::vector<endpoint> central, at;
  if (!parse_endpoints(c.central, "--central", central) ||
      !parse_endpoints({c.listen}, "--listen", at))
    return 2;
  const asyncps::group_plan plan = make_plan(c);
  const auto g = static_cast<std::uint32_t>(c.group);
  const auto clocks = worker_clocks(c, *examples);
  if (clocks == 0) {
    std::cerr << "fashion_mnist: --epochs " << c.epochs << " gives each worker no clock\n";
    return 2;
  }

  asio::io_context io(1);
  const auto start = clock_type::now();
  std::error_code result;
  double done_at = 0;
  std::unique_ptr<group_tier> tier;
  try {
    tier = make_group_tier(
        c, plan, layout, central, clocks, io,
        [&](std::uint32_t, std::error_code ec) {
          done_at = std::chrono::duration<double>(clock_type::now() - start).count();
          result = ec;
        },
        {g}, at[0]);
  } catch (const std::runtime_error& e) {
    std::cerr << "fashion_mnist: " << e.what() << '\n';
    return 2;
  }
  const auto members = plan.members(g);
  std::cout << "group server " << g << " of " << c.groups << " listening on " << tier->address(g)
            << " (workers " << member_list(members) << " by " << c.group_by
            << ", bsp; pushes every " << c.push_every << " of " << clocks << " group clocks to "
            << central.size() << " central servers, asp)" << std::endl;
  io.run();

  const auto r = tier->report(g);
  if (result) std::cerr << "group server " << g << ": " << result.message() << '\n';
  std::printf("group %u %s: %lld group clocks, finished at %.1f s; %llu central pushes, push "
              "staleness mean %.2f max %d\n",
              g, member_list(members).c_str(), static_cast<long long>(r.clock), done_at,
              static_cast<unsigned long long>(r.pushes), r.push_staleness.mean(),
              r.push_staleness.max());
  std::ofstream metrics(c.metrics);
  metrics << nlohmann::json{{"summary", true},
                            {"group", g},
                            {"workers", members},
                            {"group_clocks", r.clock},
                            {"finished_s", done_at},
                            {"pushes", r.pushes},
                            {"push_staleness_mean", r.push_staleness.mean()},
                            {"push_staleness_max", r.push_staleness.max()},
                            {"failed", static_cast<bool>(result)}}
                 .dump()
          << '\n';
  return result ? 1 : 0;
}

/// --role worker --groups G: worker --worker-id, BSP on its group's server (--connect). With
/// --central (worker 0 must have it) it then waits until every group's last push has reached
/// the central shards, reads their model and reports its accuracy.
int run_group_worker(const config& c) {
  fashion::dataset train, test;
  std::vector<asyncps::table_spec> layout;
  if (!load_data(c, train, test, layout)) return 2;
  const asyncps::group_plan plan = make_plan(c);
  const std::uint32_t w = c.worker_id;
  const std::uint32_t g = plan.group_of[w];
  if (c.group >= 0 && static_cast<std::uint32_t>(c.group) != g) {
    std::cerr << "fashion_mnist: --group " << c.group << ": worker " << w << " trains in group "
              << g << " (--group-by " << c.group_by << " puts workers "
              << member_list(plan.members(g)) << " there)\n";
    return 2;
  }
  std::vector<endpoint> group_server, central;
  if (!parse_endpoints(c.connect, "--connect", group_server) ||
      !parse_endpoints(c.central, "--central", central))
    return 2;
  const auto clocks = worker_clocks(c, train.file_size());
  if (clocks == 0) {
    std::cerr << "fashion_mnist: --epochs " << c.epochs << " gives each worker no clock\n";
    return 2;
  }

  asio::io_context io(1);
  asio::thread_pool compute(c.compute_threads != 0 ? c.compute_threads : 2);
  asio::thread_pool slow_compute(1);  // the straggler's own thread (--slow-worker)
  monitor mon(c, test);
  if (!mon.metrics) {
    std::cerr << "fashion_mnist: --metrics: cannot write " << c.metrics << '\n';
    return 2;
  }
  asyncps::tcp_transport t(io.get_executor(), tcp_opts(c));
  any_model model(c, train, w, c.workers);
  std::unique_ptr<group_worker> worker;
  group_worker::options_type o;
  o.id = plan.local_id(w);
  o.servers = group_server;
  o.local_step = with_group_optimizer(c, [](auto opt) { return opt.local_step(); });
  o.connect_timeout = std::chrono::seconds(30);
  o.on_clock = [&](const asyncps::clock_report& r) {
    mon.samples += std::uint64_t{c.batch} * c.workers;  // assumes every worker's speed
    mon.on_clock(r, model, worker->staleness());
  };
  worker = std::make_unique<group_worker>(
      t, model, o, any_model::is_slow(c, w) ? slow_compute.get_executor() : compute.get_executor());
  std::cout << "fashion_mnist: " << c.model << ", worker " << w << " of " << c.workers
            << " in group " << g << " of " << c.groups << " " << member_list(plan.members(g))
            << " (id " << o.id << " on its group server " << group_server[0] << ", bsp)";
  if (any_model::is_slow(c, w)) std::cout << ", slowed x" << c.slow_factor;
  std::cout << ", " << c.epochs << " epochs (" << clocks << " clocks of " << c.batch
            << "), role worker" << std::endl;
  std::error_code ec;
  asio::co_spawn(
      io, [&]() -> asio::awaitable<void> { ec = co_await worker->async_run(clocks); },
      asio::detached);
  io.run();
  compute.join();
  slow_compute.join();
  if (mon.tty && !c.quiet) std::cout << '\n';
  const auto& st = worker->stats();
  std::printf("worker %u (group %u): %llu of %llu clocks, %.2f s computing, %.2f s waiting\n", w, g,
              static_cast<unsigned long long>(st.clocks), static_cast<unsigned long long>(clocks),
              st.compute_seconds, st.wait_seconds);
  if (ec) {
    std::cerr << "worker " << w << ": " << ec.message() << '\n';
    return 1;
  }
  if (central.empty()) return 0;

  // The final model: the central shards' once each has every group's last push (its server
  // clock reached the pushes each group makes), read as a reader.
  const auto central_tables = asyncps::central_layout(layout, c.groups);
  const auto pushes = central_pushes(c, clocks);
  std::cout << "worker " << w << ": waiting for every group's " << pushes
            << " central pushes to reach the central servers" << std::endl;
  std::vector<float> params(asyncps::layout_size(central_tables));
  if (const std::string why = asyncps::examples::read_servers_model(
          central, central_tables, params, tcp_opts(c),
          std::chrono::duration_cast<std::chrono::milliseconds>(final_read_timeout),
          static_cast<asyncps::clock_value>(pushes));
      !why.empty()) {
    std::cerr << "fashion_mnist: the central model was not read: " << why << '\n';
    return 1;
  }
  const std::size_t counter_at = asyncps::layout_size(layout);  // the counter table follows
  const asyncps::parameter_view final_view(layout, params.data());
  const auto e = model.evaluate(final_view, test);
  const double secs = mon.elapsed();
  std::printf("central push counters by group:");
  for (std::uint32_t k = 0; k < c.groups; ++k)
    std::printf(" %.0f", static_cast<double>(params[counter_at + k]));
  std::printf("\n");
  mon.metrics << nlohmann::json{{"time_s", secs},      {"clock", clocks},
                                {"final", true},       {"test_accuracy", e.accuracy},
                                {"test_loss", e.loss}, {"eval_source", "central servers"}}
                     .dump()
              << '\n';
  std::printf("final test accuracy %.4f (loss %.4f) of the central model after %.1f s; metrics "
              "in %s\n",
              e.accuracy, e.loss, secs, c.metrics.c_str());
  return 0;
}

}  // namespace

int train_groups(const config& c) {
  if (c.role == "server") return run_central_server(c);
  if (c.role == "group-server") return run_group_server(c);
  if (c.role == "worker") return run_group_worker(c);
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
  std::vector<std::uint32_t> all_groups(c.groups);
  std::iota(all_groups.begin(), all_groups.end(), 0u);
  tier = make_group_tier(
      c, plan, layout, central_eps, clocks, io,
      [&](std::uint32_t g, std::error_code ec) {
        group_done_at[g] = mon.elapsed();
        if (ec) std::cerr << "\ngroup server " << g << ": " << ec.message() << '\n';
        one_done(static_cast<bool>(ec));
      },
      all_groups, loopback);

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
  const bool failed = failures != 0;
  mon.metrics << nlohmann::json{{"time_s", secs},
                                {"clock", clocks},
                                {"final", true},
                                {"failed", failed},
                                {"test_accuracy", e.accuracy},
                                {"test_loss", e.loss}}
                     .dump()
              << '\n';
  if (failed) {  // what the central model reached, but not a final result of the run
    std::fprintf(stderr,
                 "fashion_mnist: the run failed: %d of %u workers and group servers "
                 "stopped early\n",
                 failures.load(), static_cast<unsigned>(runs));
    std::printf("test accuracy when the run failed %.4f (loss %.4f) of the central model after "
                "%.1f s; metrics in %s\n",
                e.accuracy, e.loss, secs, c.metrics.c_str());
    return 1;
  }
  std::printf("final test accuracy %.4f (loss %.4f) of the central model after %.1f s; metrics "
              "in %s\n",
              e.accuracy, e.loss, secs, c.metrics.c_str());
  return 0;
}

}  // namespace fashion
