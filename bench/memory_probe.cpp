// asyncps_memory_probe: the server-wide memory budgets under two probes (docs/security.md,
// Resource budget). Prints the peak RSS and the counters. Usage:
//   asyncps_memory_probe replies BUDGET_MIB [K] [N]
//     K clients say hello as workers, ask for the whole 64 MiB shard N times each and never
//     read (BUDGET_MIB: server_options::max_total_queued_bytes, 0 = unlimited).
//   asyncps_memory_probe frames BUDGET_MIB [K]
//     K connections each announce a 64 MiB push, send half of it and stall (BUDGET_MIB:
//     tcp_options::max_receive_bytes, 0 = unlimited).
#include <sys/resource.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/tcp.hpp"

using namespace asyncps;
using namespace std::chrono_literals;

namespace {

long peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}

// Listens on a free loopback port and serves `s` there (until `s.stop()`); returns the port.
template <class Server>
asio::ip::tcp::endpoint serve_on_loopback(asio::io_context& io, tcp_transport& st, Server& s) {
  auto acc = st.listen(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  if (!acc) std::abort();
  const auto ep = acc.value().local_endpoint();
  asio::co_spawn(
      io,
      [&s, a = std::move(acc).value()]() mutable -> asio::awaitable<void> {
        (void)co_await s.async_serve(std::move(a));
      },
      asio::detached);
  return ep;
}

int probe_replies(std::uint64_t budget_mib, std::uint32_t k, int n) {
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
  const auto ep = serve_on_loopback(io, st, s);
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

int probe_frames(std::uint64_t budget_mib, std::uint32_t k) {
  constexpr std::size_t frame = std::size_t{64} << 20;
  asio::io_context io(1);
  tcp_options to;
  to.max_receive_bytes = budget_mib << 20;  // 0: unlimited
  tcp_transport st(io.get_executor(), to);
  server_options so;
  so.num_workers = k;
  so.tables = {table_spec{0, 1u << 16, 256, 0.0f}};  // 64 MiB: a push of it all is 64 MiB
  so.hello_timeout = 0ms;  // the probe measures the budget, not the deadline
  so.log = [](std::string_view) {};
  server<consistency::asp> s(st, so, optimizer::sgd{1.0f});
  const auto ep = serve_on_loopback(io, st, s);
  // One header announcing a 64 MiB push, then half of its payload (one shared source buffer).
  frame_header h;
  h.type = message_type::push;
  h.flags = frame_flags::range;
  h.row_count = 1u << 16;
  h.width = 256;
  h.payload_bytes = frame;
  std::array<std::byte, header_size> header{};
  encode_header(h, header, {}, false);
  std::vector<std::byte> half(frame / 2, std::byte{1});
  std::vector<asio::ip::tcp::socket> socks;
  socks.reserve(k);  // async_write holds a reference to its socket: no reallocation
  const long before = peak_rss_mib();
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        for (std::uint32_t i = 0; i < k; ++i) {
          socks.emplace_back(io);
          auto [ec] = co_await socks.back().async_connect(ep, detail::use_tuple);
          if (ec) std::abort();
          const std::array<asio::const_buffer, 2> bufs{asio::buffer(header), asio::buffer(half)};
          asio::async_write(socks.back(), bufs, [](std::error_code, std::size_t) {});
        }
        asio::steady_timer t(io);
        t.expires_after(2s);
        co_await t.async_wait(detail::use_tuple);
        std::printf("max_receive_bytes %llu MiB, %u connections x half of a %zu MiB frame: peak "
                    "RSS %ld MiB (before the connections: %ld MiB); receive pool %zu MiB lent, "
                    "%zu MiB cached, %llu frames waited\n",
                    static_cast<unsigned long long>(budget_mib), k, frame >> 20, peak_rss_mib(),
                    before, st.receive_pool().lent_bytes() >> 20,
                    st.receive_pool().cached_bytes() >> 20,
                    static_cast<unsigned long long>(st.receive_waits()));
        for (auto& c : socks) c.close();
        s.stop();
      },
      asio::detached);
  io.run();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const std::uint64_t budget_mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 0;
  if (mode == "replies")
    return probe_replies(budget_mib, argc > 3 ? static_cast<std::uint32_t>(std::atoi(argv[3])) : 8,
                         argc > 4 ? std::atoi(argv[4]) : 2);
  if (mode == "frames")
    return probe_frames(budget_mib, argc > 3 ? static_cast<std::uint32_t>(std::atoi(argv[3])) : 16);
  std::fprintf(stderr, "usage: asyncps_memory_probe replies BUDGET_MIB [K] [N]\n"
                       "       asyncps_memory_probe frames BUDGET_MIB [K]\n");
  return 2;
}
