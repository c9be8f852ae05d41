// asyncps_memory_probe: the server-wide queue budget under a probe (docs/security.md, Resource
// budget). K clients say hello as workers, ask for the whole 64 MiB shard N times each and never
// read. Prints the peak RSS and the counters. Usage: asyncps_memory_probe BUDGET_MIB [K] [N]
// (BUDGET_MIB: server_options::max_total_queued_bytes in MiB, 0 = unlimited).
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/tcp.hpp"

using namespace asyncps;
using namespace std::chrono_literals;

static long peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}

int main(int argc, char** argv) {
  const std::uint64_t budget_mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 0;
  const std::uint32_t k = argc > 2 ? static_cast<std::uint32_t>(std::atoi(argv[2])) : 8;
  const int n = argc > 3 ? std::atoi(argv[3]) : 2;
  const std::uint32_t rows = 1u << 16, width = 256;  // 64 MiB shard, 64 MiB per full reply
  asio::io_context io(1);
  tcp_transport st(io.get_executor());
  std::vector<std::string> log;
  server_options so;
  so.num_workers = k;
  so.tables = {table_spec{0, rows, width, 0.0f}};
  so.max_total_queued_bytes = budget_mib == 0 ? ~std::uint64_t{0} : budget_mib << 20;
  so.send_timeout = 0ms;  // the probe measures the budget, not the deadline
  so.log = [&](std::string_view l) { log.emplace_back(l); };
  server<consistency::asp> s(st, so, optimizer::sgd{1.0f});
  auto acc = st.listen(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const auto ep = acc.value().local_endpoint();
  asio::co_spawn(
      io, [&]() -> asio::awaitable<void> { (void)co_await s.async_serve(std::move(acc).value()); },
      asio::detached);
  std::vector<std::unique_ptr<tcp_transport>> ts;
  std::vector<tcp_transport::connection> conns(k);
  const long before = peak_rss_mib();
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        for (std::uint32_t w = 0; w < k; ++w) {
          ts.push_back(std::make_unique<tcp_transport>(io.get_executor()));
          auto [ec, c] = co_await ts.back()->async_connect(ep);
          if (ec) std::abort();
          c.socket().set_option(asio::socket_base::receive_buffer_size(4096));
          auto hello = protocol::encode(
              protocol::hello{.worker = w,
                              .clock = 0,
                              .fingerprint = policy_fingerprint<consistency::asp, recovery::none>(),
                              .layout = {{rows, width}}},
              [&](std::size_t b) { return ts.back()->allocate(b); });
          (void)co_await c.async_send(std::move(hello));
          for (int i = 0; i < n; ++i) {
            message pull;
            pull.header.type = message_type::pull;
            pull.header.flags = frame_flags::range;
            pull.header.sender = w;
            pull.header.row_count = rows;
            (void)co_await c.async_send(std::move(pull));
          }
          conns[w] = std::move(c);
        }
        asio::steady_timer t(io);
        t.expires_after(1s);
        co_await t.async_wait(detail::use_tuple);
        std::printf("budget %llu MiB, %u clients x %d replies of %u MiB: peak RSS %ld MiB "
                    "(before the clients: %ld MiB); connections open %zu, over_budget_closes "
                    "%llu, bytes_out %llu MiB\n",
                    static_cast<unsigned long long>(budget_mib), k, n, rows * width * 4 >> 20,
                    peak_rss_mib(), before, s.connections(),
                    static_cast<unsigned long long>(s.stats().over_budget_closes),
                    static_cast<unsigned long long>(s.stats().bytes_out >> 20));
        for (auto& c : conns) c.close();
        s.stop();
      },
      asio::detached);
  io.run();
  if (!log.empty()) std::printf("first log line: %s\n", log.front().c_str());
  return 0;
}
