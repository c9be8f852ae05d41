// asyncps_remote_bench — push/pull throughput and clock time between two processes (and so
// between two hosts, or two network namespaces: bench/netns_bench.sh, docs/multi-host.md): a
// real basic_server in one, a real basic_worker (model `fixed_gradient`) in the other, over
// plain TCP.
//
//   head -c 32 /dev/urandom > secret; chmod 600 secret
//   asyncps_remote_bench --serve 10.77.0.10:7000 --rows 256 --secret-file secret   # server
//   asyncps_remote_bench --connect 10.77.0.10:7000 --rows 256 --window 1 --clocks 2000
//                        --secret-file secret                                     # worker
//
// The server holds one `rows x 1024` float table (rows x 4 KiB) for one worker; it serves one
// worker session and exits when the worker has left (one server process per measurement). The
// worker runs `clocks` clocks at SSP staleness `window - 1` (window 1 = BSP: push, then pull
// the next clock's rows, one round trip per clock; window W: up to W - 1 clocks in flight), as
// asyncps_bench's worker rows do (bench/worker_path.hpp) but across processes. Per clock the
// worker pushes the whole table and pulls it back when its policy asks.
//
// Printed by the worker, one line: payload MB/s (pushes + rows, both directions; median of
// --reps repetitions after a 10 % warm-up), the median and p99 clock time, and the 1-minute
// load average. Both sides must be given the same --rows, and the same --secret-file (the
// transport refuses to listen on a non-loopback address without one; the secret's handshake
// runs once per connection, frames carry no MAC). No TLS. Exit status 0 on success, 1 when the
// worker fails, 2 on a bad flag or secret file.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/secret.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/tcp.hpp"
#include "asyncps/worker.hpp"

#include "fixed_gradient.hpp"
#include "report.hpp"

namespace {

using namespace asyncps;
using policy = consistency::ssp<>;
using server_t = basic_server<tcp_transport, policy>;
using worker_t = basic_worker<bench::fixed_gradient, tcp_transport, policy>;
constexpr std::uint32_t width = 1024;

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "asyncps_remote_bench: %s\nusage: asyncps_remote_bench --serve HOST:PORT --rows R "
               "[--secret-file F]\n       asyncps_remote_bench --connect HOST:PORT --rows R "
               "[--window W] [--clocks N] [--reps K] [--secret-file F]\n",
               why.c_str());
  std::exit(2);
}

int serve(tcp_transport::endpoint_type ep, std::uint32_t rows, const tcp_options& to) {
  asio::io_context ctx{1};
  tcp_transport net(ctx.get_executor(), to);
  server_options so;
  so.num_workers = 1;
  so.tables = {table_spec{0, rows, width, 0.0f}};
  so.log = [](std::string_view m) {
    std::fprintf(stderr, "server: %.*s\n", static_cast<int>(m.size()), m.data());
  };
  server_t server(net, so);
  auto acceptor = net.listen(ep);
  if (!acceptor) {
    std::fprintf(stderr, "asyncps_remote_bench: cannot listen: %s\n",
                 acceptor.error().message().c_str());
    return 1;
  }
  const auto local = acceptor.value().local_endpoint();
  std::printf("remote_bench server listening on %s:%u, table %u x %u floats\n",
              local.address().to_string().c_str(), local.port(), rows, width);
  std::fflush(stdout);
  // Serves one worker session: stops once a worker came and left.
  asio::steady_timer poll(ctx);
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        for (;;) {
          poll.expires_after(std::chrono::milliseconds(20));
          co_await poll.async_wait(detail::use_tuple);
          if (server.workers_seen() >= 1 && server.workers_connected() == 0) {
            server.stop();
            co_return;
          }
        }
      },
      asio::detached);
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        if (auto ec = co_await server.async_serve(std::move(acceptor).value()))
          std::fprintf(stderr, "server: %s\n", ec.message().c_str());
        poll.cancel();
      },
      asio::detached);
  ctx.run();
  return 0;
}

int work(tcp_transport::endpoint_type ep, std::uint32_t rows, unsigned window, std::uint64_t clocks,
         unsigned reps, const tcp_options& to) {
  asio::io_context ctx{1};
  tcp_transport net(ctx.get_executor(), to);
  const table_spec spec{0, rows, width, 0.0f};
  std::vector<float> gradient(std::size_t{rows} * width, 1e-6f);
  bench::fixed_gradient model;
  model.spec[0] = spec;
  model.gradient = gradient;
  struct sample {
    double t = 0;
    std::uint64_t bytes = 0;
  };
  std::vector<sample> log;
  log.reserve(clocks);
  const worker_t* self = nullptr;
  worker_t::options_type wo;
  wo.servers = {ep};
  wo.check_gradients = false;
  wo.connect_timeout = std::chrono::seconds(10);
  wo.log = [](std::string_view m) {
    std::fprintf(stderr, "worker: %.*s\n", static_cast<int>(m.size()), m.data());
  };
  wo.on_clock = [&](const clock_report&) {
    const worker_stats& s = self->stats();
    log.push_back(
        {std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(),
         s.bytes_out + s.bytes_in});
  };
  worker_t worker(net, model, std::move(wo));
  self = &worker;
  worker.consistency().staleness = static_cast<clock_value>(window) - 1;
  std::error_code ec;
  asio::co_spawn(
      ctx, [&]() -> asio::awaitable<void> { ec = co_await worker.async_run(clocks); },
      asio::detached);
  ctx.run();
  if (ec) {
    std::fprintf(stderr, "asyncps_remote_bench: worker: %s\n", ec.message().c_str());
    return 1;
  }
  if (log.size() != clocks) {
    std::fprintf(stderr, "asyncps_remote_bench: %zu clocks of %llu\n", log.size(),
                 static_cast<unsigned long long>(clocks));
    return 1;
  }
  const std::size_t warm = std::max<std::size_t>(2, clocks / 10);
  const std::size_t per_rep = (clocks - warm) / reps;
  std::vector<double> mbps, all_us;
  for (unsigned k = 0; k < reps && per_rep > 0; ++k) {
    const std::size_t a = warm + k * per_rep - 1;
    const std::size_t b = a + per_rep;
    const double dt = log[b].t - log[a].t;
    mbps.push_back(dt > 0 ? static_cast<double>(log[b].bytes - log[a].bytes) / dt / 1e6 : 0.0);
    for (std::size_t i = a + 1; i <= b; ++i) all_us.push_back((log[i].t - log[i - 1].t) * 1e6);
  }
  std::sort(mbps.begin(), mbps.end());
  std::printf("remote_bench: table %s, window %u, %llu clocks: %.1f MB/s (reps %.1f..%.1f), "
              "clock median %.0f us, p99 %.0f us; load average %.2f\n",
              bench::size_text(std::size_t{rows} * width * sizeof(float)).c_str(), window,
              static_cast<unsigned long long>(clocks), bench::median(mbps), mbps.front(),
              mbps.back(), bench::median(all_us), bench::quantile(all_us, 0.99),
              bench::load_average());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string serve_at, connect_to, secret_file;
  std::uint32_t rows = 256;
  unsigned window = 1, reps = 5;
  std::uint64_t clocks = 1000;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value of " + std::string(a));
      return argv[++i];
    };
    const auto number = [&](unsigned long long lo, unsigned long long hi) {
      const std::string v = value();
      char* end = nullptr;
      const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < lo || n > hi)
        usage(std::string(a) + ": " + v + " is not a number in [" + std::to_string(lo) + ", " +
              std::to_string(hi) + "]");
      return n;
    };
    if (a == "--serve") {
      serve_at = value();
    } else if (a == "--connect") {
      connect_to = value();
    } else if (a == "--secret-file") {
      secret_file = value();
    } else if (a == "--rows") {
      rows = static_cast<std::uint32_t>(number(1, 1u << 20));
    } else if (a == "--window") {
      window = static_cast<unsigned>(number(1, 1000));
    } else if (a == "--clocks") {
      clocks = number(20, 100000000);
    } else if (a == "--reps") {
      reps = static_cast<unsigned>(number(1, 100));
    } else {
      usage("unknown argument " + std::string(a));
    }
  }
  if (serve_at.empty() == connect_to.empty()) usage("give one of --serve and --connect");
  auto ep = parse_tcp_endpoint(serve_at.empty() ? connect_to : serve_at);
  if (!ep) usage("not HOST:PORT: " + (serve_at.empty() ? connect_to : serve_at));
  tcp_options to;
  if (!secret_file.empty()) {
    auto s = load_secret_file(secret_file);
    if (!s) usage("--secret-file " + secret_file + ": " + s.error().message());
    to.secret = std::move(s).value();
  }
  return serve_at.empty() ? work(ep.value(), rows, window, clocks, reps, to)
                          : serve(ep.value(), rows, to);
}
