// asyncps_delay_proxy — adds a fixed one-way delay to TCP connections (this kernel has no
// netem; docs/multi-host.md). See delay_proxy.hpp for what it does and its granularity.
//
//   asyncps_delay_proxy --listen 127.0.0.1:7100 --upstream 10.77.0.10:7000 --delay-us 250
//   asyncps_delay_proxy --self-test --delay-us 2000
//
// --listen HOST:PORT     where clients connect (port 0: the kernel picks; the line
//                        "delay proxy listening on HOST:PORT" names it)
// --upstream HOST:PORT   where each connection is forwarded
// --delay-us N           one-way delay per direction, microseconds (default 0)
// --chunk-bytes N        the most bytes per read (default 65536)
// --max-buffered N       the most bytes in flight per direction and connection (default 8 MiB)
// --self-test            runs an echo server, the proxy and a client on loopback in this
//                        process: 200 round trips of 64 bytes, each must take >= 2 x delay, and
//                        8 MiB echoed through a 256 KiB buffer must come back intact, with no
//                        direction ever holding more than 256 KiB (and, with a delay, the
//                        reader stopped by the bound at least once). Exit status 0 when all
//                        hold. Wall time is only checked from below.
#include "delay_proxy.hpp"

#include <sys/prctl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <asio/io_context.hpp>
#include <asio/ip/address.hpp>
#include <asio/signal_set.hpp>

namespace {

using asyncps::bench::delay_proxy;
using asyncps::bench::delay_proxy_options;
using tcp = asio::ip::tcp;

std::optional<tcp::endpoint> parse_endpoint(const std::string& s) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos) return std::nullopt;
  std::error_code ec;
  const auto addr = asio::ip::make_address(s.substr(0, colon), ec);
  if (ec) return std::nullopt;
  char* end = nullptr;
  const unsigned long port = std::strtoul(s.c_str() + colon + 1, &end, 10);
  if (end == s.c_str() + colon + 1 || *end != '\0' || port > 65535) return std::nullopt;
  return tcp::endpoint(addr, static_cast<unsigned short>(port));
}

// An echo server: writes back what it reads, until EOF.
asio::awaitable<void> echo(tcp::socket s) {
  std::vector<char> buf(64 * 1024);
  for (;;) {
    auto [ec, n] = co_await s.async_read_some(asio::buffer(buf),
                                              asio::experimental::as_tuple(asio::use_awaitable));
    if (ec) break;
    auto [wec, m] = co_await asio::async_write(s, asio::buffer(buf.data(), n),
                                               asio::experimental::as_tuple(asio::use_awaitable));
    (void)m;
    if (wec) break;
  }
}

asio::awaitable<void> echo_server(tcp::acceptor& a) {
  for (;;) {
    auto [ec, s] = co_await a.async_accept(asio::experimental::as_tuple(asio::use_awaitable));
    if (ec) co_return;
    asio::co_spawn(a.get_executor(), echo(std::move(s)), asio::detached);
  }
}

struct self_test_result {
  std::vector<double> rtt_us;
  bool bulk_ok = false;
  std::string error;
};

// The client of --self-test: round trips, then a bulk echo with a concurrent reader.
asio::awaitable<void> self_test_client(tcp::endpoint proxy, self_test_result& r) {
  auto ex = co_await asio::this_coro::executor;
  tcp::socket s(ex);
  auto [ec] = co_await s.async_connect(proxy, asio::experimental::as_tuple(asio::use_awaitable));
  if (ec) {
    r.error = "connect to the proxy: " + ec.message();
    co_return;
  }
  s.set_option(tcp::no_delay(true));
  char msg[64];
  std::memset(msg, 'x', sizeof msg);
  char back[64];
  for (int i = 0; i < 200; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto [wec, wn] = co_await asio::async_write(s, asio::buffer(msg),
                                                asio::experimental::as_tuple(asio::use_awaitable));
    auto [rec, rn] = co_await asio::async_read(s, asio::buffer(back),
                                               asio::experimental::as_tuple(asio::use_awaitable));
    if (wec || rec || wn != sizeof msg || rn != sizeof back) {
      r.error = "round trip " + std::to_string(i) + ": " + (wec ? wec : rec).message();
      co_return;
    }
    r.rtt_us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  // Bulk: 8 MiB of a pattern, written by one coroutine while this one reads it back.
  constexpr std::size_t total = 8u << 20;
  std::vector<char> out(total);
  for (std::size_t i = 0; i < total; ++i) out[i] = static_cast<char>((i * 2654435761u) >> 13);
  bool write_failed = false;
  asio::co_spawn(
      ex,
      [&]() -> asio::awaitable<void> {
        auto [e, n] = co_await asio::async_write(s, asio::buffer(out),
                                                 asio::experimental::as_tuple(asio::use_awaitable));
        write_failed = e || n != total;
      },
      asio::detached);
  std::vector<char> in(total);
  auto [bec, bn] = co_await asio::async_read(s, asio::buffer(in),
                                             asio::experimental::as_tuple(asio::use_awaitable));
  if (bec || bn != total || write_failed) {
    r.error = "bulk echo: " + (bec ? bec.message() : std::string("short"));
    co_return;
  }
  r.bulk_ok = in == out;
  if (!r.bulk_ok) r.error = "bulk echo: the bytes came back changed";
}

int self_test(delay_proxy_options o) {
  asio::io_context ctx{1};
  const tcp::endpoint loopback(asio::ip::address_v4::loopback(), 0);
  tcp::acceptor echo_acc(ctx, loopback);
  tcp::acceptor proxy_acc(ctx, loopback);
  o.max_buffered = 256 * 1024;  // the bulk echo must pass a small bound
  delay_proxy proxy(echo_acc.local_endpoint(), o);
  asio::co_spawn(ctx, echo_server(echo_acc), asio::detached);
  asio::co_spawn(ctx, proxy.run(proxy_acc), asio::detached);
  self_test_result r;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        co_await self_test_client(proxy_acc.local_endpoint(), r);
        echo_acc.close();
        proxy_acc.close();
      },
      asio::detached);
  ctx.run_for(std::chrono::seconds(120));
  if (!r.error.empty()) {
    std::fprintf(stderr, "delay proxy self-test: %s\n", r.error.c_str());
    return 1;
  }
  std::sort(r.rtt_us.begin(), r.rtt_us.end());
  const auto& st = proxy.stats();
  const double floor_us = 2.0 * static_cast<double>(o.delay.count());
  std::printf("delay proxy self-test: one-way delay %lld us; 200 round trips: min %.0f us, "
              "median %.0f us, max %.0f us (floor 2 x delay = %.0f us); 8 MiB echoed intact "
              "through a %zu KiB bound (peak %zu KiB held, %llu reader stalls)\n",
              static_cast<long long>(o.delay.count()), r.rtt_us.front(),
              r.rtt_us[r.rtt_us.size() / 2], r.rtt_us.back(), floor_us, o.max_buffered / 1024,
              st.peak_buffered / 1024, static_cast<unsigned long long>(st.full_waits));
  if (r.rtt_us.front() < floor_us) {
    std::fprintf(stderr, "delay proxy self-test: a round trip took %.0f us < 2 x delay\n",
                 r.rtt_us.front());
    return 1;
  }
  if (st.peak_buffered > o.max_buffered || (o.delay.count() > 0 && st.full_waits == 0)) {
    std::fprintf(stderr, "delay proxy self-test: the buffering bound did not hold\n");
    return 1;
  }
  return r.bulk_ok ? 0 : 1;
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "asyncps_delay_proxy: %s\nusage: asyncps_delay_proxy --listen HOST:PORT --upstream "
               "HOST:PORT [--delay-us N] [--chunk-bytes N] [--max-buffered N]\n"
               "       asyncps_delay_proxy --self-test [--delay-us N]\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  // Timers fire as close to their deadline as the scheduler allows (default slack: 50 us).
  ::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  delay_proxy_options o;
  std::optional<tcp::endpoint> listen, upstream;
  bool test = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value of " + std::string(a)).c_str());
      return argv[++i];
    };
    const auto number = [&]() -> unsigned long long {
      const std::string v = value();
      char* end = nullptr;
      const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0') usage((std::string(a) + ": not a number: " + v).c_str());
      return n;
    };
    if (a == "--listen") {
      if (!(listen = parse_endpoint(value()))) usage("--listen: not HOST:PORT");
    } else if (a == "--upstream") {
      if (!(upstream = parse_endpoint(value()))) usage("--upstream: not HOST:PORT");
    } else if (a == "--delay-us") {
      o.delay = std::chrono::microseconds(number());
    } else if (a == "--chunk-bytes") {
      o.chunk_bytes = number();
      if (o.chunk_bytes == 0) usage("--chunk-bytes must be > 0");
    } else if (a == "--max-buffered") {
      o.max_buffered = number();
    } else if (a == "--self-test") {
      test = true;
    } else {
      usage(("unknown argument " + std::string(a)).c_str());
    }
  }
  try {
    if (test) return self_test(o);
    if (!listen || !upstream) usage("--listen and --upstream are required");
    asio::io_context ctx{1};
    tcp::acceptor acc(ctx, *listen);
    const auto ep = acc.local_endpoint();
    std::printf("delay proxy listening on %s:%u -> %s:%u, one-way delay %lld us\n",
                ep.address().to_string().c_str(), ep.port(),
                upstream->address().to_string().c_str(), upstream->port(),
                static_cast<long long>(o.delay.count()));
    std::fflush(stdout);
    delay_proxy proxy(*upstream, o);
    asio::signal_set stop(ctx, SIGINT, SIGTERM);
    stop.async_wait([&](const std::error_code&, int) {
      acc.close();
      ctx.stop();
    });
    asio::co_spawn(ctx, proxy.run(acc), asio::detached);
    ctx.run();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "asyncps_delay_proxy: %s\n", e.what());
    return 1;
  }
}
