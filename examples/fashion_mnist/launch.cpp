// fashion_mnist — launched runs: the role, index and counts from the launcher's environment
// (asyncps/launch.hpp), and the rendezvous (asyncps/rendezvous.hpp) where servers publish their
// addresses and workers look them up. docs/deploy.md shows each launcher's command line.
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/signal_set.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "asyncps/launch.hpp"
#include "asyncps/rendezvous.hpp"
#include "asyncps/transport/tcp.hpp"
#include "config.hpp"
#include "trainer.hpp"

namespace fashion {

namespace {

int fail(const std::string& line) {
  std::cerr << "fashion_mnist: " << line << '\n';
  return 2;
}

}  // namespace

int apply_launcher(config& c, bool role_given, bool servers_given) {
  if (role_given || c.launcher == "none") return 0;
  const bool flag_given = !c.rendezvous.empty();  // --rendezvous overrides the launcher's
  std::string why;
  const auto env = asyncps::read_launch_environment(why);
  if (!env) return fail("launcher environment: " + why);
  if (env.value().source == asyncps::launcher::none) return 0;  // role all, as before
  const auto& e = env.value();
  const bool dmlc = e.source == asyncps::launcher::dmlc;
  const auto plan = asyncps::plan_launch(
      e, dmlc && !servers_given ? std::nullopt : std::optional<std::uint32_t>(c.servers), why);
  if (!plan) return fail(std::string(asyncps::to_string(e.source)) + ": " + why);
  const auto& p = plan.value();
  c.servers = p.num_servers;
  c.workers = p.num_workers;
  c.runs_rendezvous = p.runs_rendezvous;
  c.assign_index = !p.index.has_value();
  c.launched_by = std::string(asyncps::to_string(e.source));
  switch (p.role) {
    case asyncps::node_role::server:
      c.role = "server";
      c.shard = p.index.value_or(0);
      break;
    case asyncps::node_role::worker:
      c.role = "worker";
      c.worker_id = p.index.value_or(0);
      break;
    default: c.role = "scheduler"; break;
  }
  if (!flag_given) {
    const bool v6 = p.rendezvous_host.find(':') != std::string::npos;
    c.rendezvous = (v6 ? "[" + p.rendezvous_host + "]" : p.rendezvous_host) + ":" +
                   std::to_string(p.rendezvous_port);
  }
  // Each process says who it is, first thing.
  std::cout << "fashion_mnist: " << asyncps::to_string(e.source);
  if (e.rank) std::cout << " rank " << *e.rank << " of " << *e.world_size;
  std::cout << ": " << c.role;
  if (p.index) std::cout << ' ' << *p.index;
  if (c.role == "server") std::cout << " of " << c.servers << " servers";
  if (c.role == "worker") std::cout << " of " << c.workers << " workers";
  std::cout << "; rendezvous " << c.rendezvous << " ("
            << (flag_given ? std::string("--rendezvous") : e.rendezvous_source)
            << (c.runs_rendezvous ? "; served here" : "") << ")" << std::endl;
  return 0;
}

namespace {

// The rendezvous this process serves (rank 0, or DMLC's scheduler), on a thread of its own so
// that it answers while this process blocks in its own announce or lookup.
struct served_rendezvous {
  asio::io_context io{1};
  std::unique_ptr<asyncps::tcp_transport> transport;
  std::unique_ptr<asyncps::rendezvous> service;
  std::thread thread;
};
std::unique_ptr<served_rendezvous> served;

// "host:port" (a name, or an IPv4/IPv6 literal) -> an endpoint, resolving names (MASTER_ADDR or
// a Slurm node list give host names).
std::optional<asio::ip::tcp::endpoint> resolve(const std::string& text, std::string& why) {
  if (auto ep = asyncps::parse_tcp_endpoint(text)) return ep.value();
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    why = "'" + text + "' is not host:port";
    return std::nullopt;
  }
  asio::io_context io;
  asio::ip::tcp::resolver resolver(io);
  std::error_code ec;
  const auto results = resolver.resolve(text.substr(0, colon), text.substr(colon + 1), ec);
  if (ec || results.empty()) {
    why = "cannot resolve '" + text + "': " + (ec ? ec.message() : std::string("no address"));
    return std::nullopt;
  }
  return results.begin()->endpoint();
}

asyncps::log_function log_to_stderr() {
  return [](std::string_view line) { std::cerr << line << '\n'; };
}

// Runs `op` (an awaitable of a tuple) to completion on a fresh io_context and transport.
template <class Make>
auto run_blocking(const config& c, Make make) {
  asio::io_context io(1);
  asyncps::tcp_transport t(io.get_executor(), tcp_opts(c));
  using result_type = typename decltype(make(t))::value_type;
  std::optional<result_type> out;
  asio::co_spawn(
      io, [&]() -> asio::awaitable<void> { out.emplace(co_await make(t)); }, asio::detached);
  io.run();
  return std::move(out).value();
}

// Starts serving the rendezvous at `at` (its port; on every interface, or on loopback when
// `at` is a loopback address). Returns false after printing why.
bool start_rendezvous(const config& c, const asio::ip::tcp::endpoint& at) {
  auto r = std::make_unique<served_rendezvous>();
  r->transport = std::make_unique<asyncps::tcp_transport>(r->io.get_executor(), tcp_opts(c));
  const asio::ip::tcp::endpoint listen_at(
      at.address().is_loopback() ? at.address() : asio::ip::address(asio::ip::address_v4::any()),
      at.port());
  auto acc = r->transport->listen(listen_at);
  if (!acc) {
    std::cerr << "fashion_mnist: the rendezvous cannot listen on " << listen_at << ": "
              << acc.error().message() << " (another job on this port? set --rendezvous or "
              << "ASYNCPS_RENDEZVOUS)\n";
    return false;
  }
  asyncps::rendezvous_options o;
  o.num_servers = c.servers;
  o.num_workers = c.workers;
  o.log = log_to_stderr();
  r->service = std::make_unique<asyncps::rendezvous>(*r->transport, std::move(o));
  asio::co_spawn(
      r->io,
      [svc = r->service.get(), a = std::move(acc).value()]() mutable -> asio::awaitable<void> {
        if (auto ec = co_await svc->async_serve(std::move(a)))
          std::cerr << "fashion_mnist: rendezvous: " << ec.message() << '\n';
      },
      asio::detached);
  std::cerr << "fashion_mnist: serving the rendezvous on " << listen_at << " for " << c.servers
            << " servers and " << c.workers << " workers\n";
  served = std::move(r);
  return true;
}

}  // namespace

int join_rendezvous(config& c) {
  std::string why;
  const auto root = resolve(c.rendezvous, why);
  if (!root) return fail("--rendezvous: " + why);
  if (c.runs_rendezvous) {
    if (!start_rendezvous(c, *root)) return 2;
    served->thread = std::thread([r = served.get()] { r->io.run(); });
  }
  const auto timeout = std::chrono::seconds(120);
  if (c.role == "worker") {
    const auto id = c.assign_index ? std::nullopt : std::optional<std::uint32_t>(c.worker_id);
    auto [ec, dir] = run_blocking(c, [&](asyncps::tcp_transport& t) {
      return asyncps::async_lookup_servers(t, *root, id, timeout, log_to_stderr());
    });
    if (ec) {
      stop_rendezvous();
      return fail("looking up the servers at the rendezvous " + c.rendezvous + ": " + ec.message());
    }
    if (dir.servers.size() != c.servers) {
      stop_rendezvous();
      return fail("the rendezvous lists " + std::to_string(dir.servers.size()) +
                  " servers, this worker expects " + std::to_string(c.servers));
    }
    c.connect = std::move(dir.servers);
    if (c.assign_index) {
      c.worker_id = dir.worker_id;
      std::cout << "fashion_mnist: worker id " << c.worker_id << " from the rendezvous"
                << std::endl;
    }
    if (c.worker_id >= c.workers) {
      stop_rendezvous();
      return fail("worker id " + std::to_string(c.worker_id) + " is not below --workers " +
                  std::to_string(c.workers));
    }
    // Launched, every process sees the same flags: worker 0 alone reports progress and
    // writes the metrics file.
    if (!c.launched_by.empty() && c.worker_id != 0) {
      c.quiet = true;
      c.metrics = "/dev/null";
    }
    return 0;
  }
  if (!c.launched_by.empty()) c.metrics = "/dev/null";  // a server writes no metrics
  // A server: listen on every interface unless the job meets on loopback, and publish the
  // port (the rendezvous records the address it sees the announce come from) once listening.
  if (c.listen == "127.0.0.1:0" && !root->address().is_loopback()) c.listen = "0.0.0.0:0";
  c.on_listening = [&c, at = *root, timeout](std::uint16_t port) -> std::optional<std::uint32_t> {
    const auto shard = c.assign_index ? std::nullopt : std::optional<std::uint32_t>(c.shard);
    auto [ec, assigned] = run_blocking(c, [&](asyncps::tcp_transport& t) {
      return asyncps::async_announce_server(t, at, shard, port, timeout, std::string{},
                                            log_to_stderr());
    });
    if (ec) {
      std::cerr << "fashion_mnist: announcing this server at the rendezvous " << c.rendezvous
                << ": " << ec.message() << '\n';
      return std::nullopt;
    }
    c.shard = assigned.shard;
    return assigned.shard;
  };
  return 0;
}

void stop_rendezvous() {
  if (!served) return;
  asio::post(served->io, [r = served.get()] { r->service->stop(); });
  if (served->thread.joinable()) served->thread.join();
  served.reset();
}

int run_scheduler(config& c) {
  std::string why;
  const auto root = resolve(c.rendezvous, why);
  if (!root) return fail("--rendezvous: " + why);
  if (!start_rendezvous(c, *root)) return 2;
  asio::signal_set signals(served->io, SIGINT, SIGTERM);
  signals.async_wait([r = served.get()](const std::error_code& ec, int signal) {
    if (!ec) {
      std::cerr << "fashion_mnist: scheduler: signal " << signal << ", stopping the rendezvous\n";
      r->service->stop();
    }
  });
  served->io.run();
  served.reset();
  return 0;
}

}  // namespace fashion
