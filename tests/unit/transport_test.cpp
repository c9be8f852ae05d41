// Transport conformance (the same suite for TCP and in-process) and the server's handling of
// malformed, truncated, oversized and wrong-version frames over real TCP.
#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>
#include <doctest/doctest.h>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/detail/accept_retry.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/auth.hpp"
#include "asyncps/detail/log_limiter.hpp"
#include "asyncps/recovery/chain/master.hpp"
#include "asyncps/secret.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/in_process.hpp"
#include "asyncps/transport/tcp.hpp"
#include "asyncps/worker.hpp"
#include "bench/delay_proxy.hpp"
#include "counter_model.hpp"
#include "descriptor_flood.hpp"
#include "examples/fashion_mnist/serve_until_done.hpp"
#include "run_coro.hpp"
#include "test_pki.hpp"

using namespace asyncps;

namespace {

struct tcp_fixture {
  using transport_type = tcp_transport;
  asio::io_context io;
  tcp_transport a{io.get_executor()};
  tcp_transport b{io.get_executor(), tcp_options{.limits = {.max_frame_bytes = 1 << 20}}};
  asio::ip::tcp::endpoint listen_at{asio::ip::make_address("127.0.0.1"), 0};
  asio::ip::tcp::endpoint target(tcp_transport::acceptor& acc) { return acc.local_endpoint(); }
  asio::ip::tcp::endpoint nowhere() {
    // A port nobody listens on: bind, read the port, close.
    asio::ip::tcp::acceptor tmp(io, listen_at);
    auto ep = tmp.local_endpoint();
    tmp.close();
    return ep;
  }
  static constexpr bool moves_buffers = false;
};

struct in_process_fixture {
  using transport_type = in_process_transport;
  asio::io_context io;
  in_process_network net;
  in_process_transport a{io.get_executor(), net};
  in_process_transport b{io.get_executor(), net, wire_limits{.max_frame_bytes = 1 << 20}};
  std::string listen_at = "server";
  std::string target(in_process_transport::acceptor&) { return listen_at; }
  std::string nowhere() { return "nobody"; }
  static constexpr bool moves_buffers = true;
};

template <class T>
message make_message(T& t, std::uint64_t seq, std::size_t floats) {
  message m;
  m.header.type = message_type::push;
  m.header.flags = frame_flags::range;
  m.header.sender = 7;
  m.header.table = 2;
  m.header.clock = 11;
  m.header.seq = seq;
  m.header.row_count = static_cast<std::uint32_t>(floats);
  m.header.width = 1;
  m.payload = t.allocate(floats * sizeof(float));
  for (std::size_t i = 0; i < floats; ++i)
    m.payload.floats()[i] = static_cast<float>(seq * 1000 + i);
  return m;
}

}  // namespace

TEST_CASE_TEMPLATE("transport conformance", F, tcp_fixture, in_process_fixture) {
  F f;
  auto acc = f.b.listen(f.listen_at);
  REQUIRE(acc.has_value());
  const auto ep = f.target(acc.value());

  SUBCASE("messages arrive whole, in order, with their header fields") {
    test::run_coro(f.io, [&]() -> asio::awaitable<void> {
      auto [ec, client] = co_await f.a.async_connect(ep);
      REQUIRE(!ec);
      auto [ec2, server] = co_await acc.value().async_accept();
      REQUIRE(!ec2);
      const void* sent_data = nullptr;
      for (std::uint64_t i = 0; i < 50; ++i) {
        auto m = make_message(f.a, i, i * 37 % 1000);
        if (i == 3) sent_data = m.payload.data();
        CHECK(!(co_await client.async_send(std::move(m))));
      }
      for (std::uint64_t i = 0; i < 50; ++i) {
        auto [rec, m] = co_await server.async_receive();
        REQUIRE(!rec);
        CHECK(m.header.type == message_type::push);
        CHECK(m.header.seq == i);
        CHECK(m.header.sender == 7);
        CHECK(m.header.table == 2);
        CHECK(m.header.clock == 11);
        CHECK(m.header.payload_bytes == i * 37 % 1000 * 4);
        CHECK(m.payload.size() == m.header.payload_bytes);
        bool same = true;
        for (std::size_t k = 0; k < m.payload.floats().size(); ++k)
          same = same && m.payload.floats()[k] == static_cast<float>(i * 1000 + k);
        CHECK(same);
        if (i == 3 && F::moves_buffers) CHECK(m.payload.data() == sent_data);  // zero-copy
      }
    });
  }

  SUBCASE("small and large frames back to back arrive whole (TCP: across its read-ahead)") {
    // Sizes around TCP's 16 KiB read-ahead: frames wholly inside one read, a header split
    // across two, a payload partly read ahead and read in place for the rest, empty ones.
    const std::size_t floats[] = {0,     3,    4080, 4081, 100'000, 1, 0,   4096,
                                  40000, 2000, 2000, 2000, 2000,    5, 300, 250'000};
    test::run_coro(f.io, [&]() -> asio::awaitable<void> {
      auto [ec, client] = co_await f.a.async_connect(ep);
      REQUIRE(!ec);
      auto [ec2, server] = co_await acc.value().async_accept();
      REQUIRE(!ec2);
      auto& srv = server;  // clang 14 cannot capture a structured binding in a lambda
      int good = 0;
      auto reader = [&]() -> asio::awaitable<void> {
        for (std::uint64_t i = 0; i < std::size(floats); ++i) {
          auto [rec, m] = co_await srv.async_receive();
          if (rec || m.header.seq != i || m.payload.size() != floats[i] * 4) break;
          bool same = true;
          for (std::size_t k = 0; k < m.payload.floats().size(); ++k)
            same = same && m.payload.floats()[k] == static_cast<float>(i * 1000 + k);
          good += same ? 1 : 0;
        }
      };
      asio::co_spawn(f.io, reader(), asio::detached);
      for (std::uint64_t i = 0; i < std::size(floats); ++i)
        CHECK(!(co_await client.async_send(make_message(f.a, i, floats[i]))));
      asio::steady_timer t(f.io);
      for (int k = 0; k < 400 && good < static_cast<int>(std::size(floats)); ++k) {
        t.expires_after(std::chrono::milliseconds(5));
        co_await t.async_wait(detail::use_tuple);
      }
      CHECK(good == static_cast<int>(std::size(floats)));
    });
  }

  SUBCASE("both directions at once") {
    test::run_coro(f.io, [&]() -> asio::awaitable<void> {
      auto [ec, client] = co_await f.a.async_connect(ep);
      REQUIRE(!ec);
      auto [ec2, server] = co_await acc.value().async_accept();
      REQUIRE(!ec2);
      int received = 0;
      auto reader = [&](auto& conn) -> asio::awaitable<void> {
        for (int i = 0; i < 20; ++i) {
          auto [rec, m] = co_await conn.async_receive();
          if (!rec && m.header.seq == static_cast<std::uint64_t>(i)) ++received;
        }
      };
      asio::co_spawn(f.io, reader(server), asio::detached);
      asio::co_spawn(f.io, reader(client), asio::detached);
      for (std::uint64_t i = 0; i < 20; ++i) {
        CHECK(!(co_await client.async_send(make_message(f.a, i, 5000))));
        CHECK(!(co_await server.async_send(make_message(f.b, i, 5000))));
      }
      asio::steady_timer t(f.io);
      for (int k = 0; k < 200 && received < 40; ++k) {
        t.expires_after(std::chrono::milliseconds(5));
        co_await t.async_wait(detail::use_tuple);
      }
      CHECK(received == 40);
    });
  }

  SUBCASE("close: the peer gets connection_closed after what was sent") {
    test::run_coro(f.io, [&]() -> asio::awaitable<void> {
      auto [ec, client] = co_await f.a.async_connect(ep);
      REQUIRE(!ec);
      auto [ec2, server] = co_await acc.value().async_accept();
      REQUIRE(!ec2);
      CHECK(!(co_await client.async_send(make_message(f.a, 1, 10))));
      client.close();
      CHECK(!client.is_open());
      auto [r1, m1] = co_await server.async_receive();
      CHECK(!r1);
      CHECK(m1.header.seq == 1);
      auto [r2, m2] = co_await server.async_receive();
      CHECK(r2 == errc::connection_closed);
      CHECK(r2 == condition::transient);
    });
  }

  SUBCASE("connecting to nobody fails") {
    test::run_coro(f.io, [&]() -> asio::awaitable<void> {
      auto [ec, c] = co_await f.a.async_connect(f.nowhere());
      CHECK(ec);
      CHECK(!c.is_open());
    });
  }

  SUBCASE("a frame over the receiver's limit is rejected naming the field") {
    test::run_coro(f.io, [&]() -> asio::awaitable<void> {
      auto [ec, client] = co_await f.a.async_connect(ep);
      REQUIRE(!ec);
      auto [ec2, server] = co_await acc.value().async_accept();
      REQUIRE(!ec2);
      (void)co_await client.async_send(make_message(f.a, 1, (1 << 20) / 4 + 1));
      auto [r, m] = co_await server.async_receive();
      CHECK(r == errc::frame_too_large);
      server.close();
      CHECK(!server.is_open());
    });
  }

  SUBCASE("listening twice on one address fails") {
    if constexpr (F::moves_buffers) {
      auto again = f.b.listen(f.listen_at);
      CHECK(again.has_error());
    }
  }
}

// ---------------------------------------------------------------------------------------------
// A real server over TCP receiving hostile bytes from raw sockets.

namespace {

using test_server = basic_server<tcp_transport, consistency::ssp<1>>;
using test_server_in_process = basic_server<in_process_transport, consistency::ssp<1>>;

// Listens on a free loopback port of `t` and runs `node.async_serve` (a server or a chain
// master) on `io`; returns the port's address.
template <class Node>
asio::ip::tcp::endpoint serve_on_loopback(asio::io_context& io, tcp_transport& t, Node& node) {
  auto acc = t.listen({asio::ip::make_address("127.0.0.1"), 0});
  REQUIRE(acc.has_value());
  const auto ep = acc.value().local_endpoint();
  asio::co_spawn(io, node.async_serve(std::move(acc).value()), asio::detached);
  return ep;
}

struct raw_result {
  bool closed_by_server = false;
  std::string error_reason;  // payload of an error frame, if one came
};

std::array<std::byte, header_size> encode(frame_header h, std::span<const std::byte> payload,
                                          bool checksum = true) {
  std::array<std::byte, header_size> out{};
  encode_header(h, out, payload, checksum);
  return out;
}

// Connects a raw socket (from loopback address `from` when given: each 127.0.0.0/8 address is
// its own peer host for the servers' rate-limited refusal log), writes `bytes`, optionally
// half-closes, and reads until EOF.
asio::awaitable<raw_result> raw_exchange(asio::ip::tcp::endpoint ep, std::vector<std::byte> bytes,
                                         bool half_close,
                                         std::optional<asio::ip::address> from = std::nullopt) {
  auto ex = co_await asio::this_coro::executor;
  asio::ip::tcp::socket s(ex);
  raw_result r;
  if (from) {
    s.open(asio::ip::tcp::v4());
    s.bind({*from, 0});
  }
  auto [ec] = co_await s.async_connect(ep, detail::use_tuple);
  REQUIRE(!ec);
  auto [wec, n] = co_await asio::async_write(s, asio::buffer(bytes), detail::use_tuple);
  (void)n;
  (void)wec;
  if (half_close) s.shutdown(asio::ip::tcp::socket::shutdown_send);
  for (;;) {
    std::array<std::byte, header_size> hb{};
    auto [rec, rn] = co_await asio::async_read(s, asio::buffer(hb), detail::use_tuple);
    (void)rn;
    if (rec) {
      r.closed_by_server = (rec == asio::error::eof || rec == asio::error::connection_reset);
      break;
    }
    const auto h = decode_header(hb);
    std::string payload(h.payload_bytes, '\0');
    auto [pec, pn] = co_await asio::async_read(s, asio::buffer(payload), detail::use_tuple);
    (void)pn;
    if (pec) break;
    if (h.type == message_type::error) r.error_reason = payload;
  }
  co_return r;
}

std::vector<std::byte> hello_frame(std::uint32_t worker, std::uint32_t rows, std::uint32_t width,
                                   clock_value clock = 0) {
  buffer_pool pool;
  message m = protocol::encode(
      protocol::hello{.worker = worker,
                      .clock = clock,
                      .fingerprint = policy_fingerprint<consistency::ssp<1>, recovery::none>(),
                      .layout = {{rows, width}}},  // test_server's policy
      [&](std::size_t n) { return pool.allocate(n); });
  frame_header h = m.header;
  h.payload_bytes = m.payload.size();
  auto pl = m.payload.bytes();
  auto hdr = encode(h, pl);
  std::vector<std::byte> out(header_size + pl.size());
  std::memcpy(out.data(), hdr.data(), header_size);
  std::memcpy(out.data() + header_size, pl.data(), pl.size());
  return out;
}

std::vector<std::byte> push_frame(std::uint32_t worker, std::uint32_t table, std::uint64_t first,
                                  std::uint32_t rows, std::uint32_t width, float value,
                                  bool corrupt_after_checksum = false) {
  frame_header h;
  h.type = message_type::push;
  h.flags = frame_flags::range;
  h.sender = worker;
  h.table = table;
  h.first_row = first;
  h.row_count = rows;
  h.width = width;
  std::vector<float> vals(std::size_t{rows} * width, value);
  h.payload_bytes = vals.size() * 4;
  auto pl = std::as_bytes(std::span(vals));
  auto hdr = encode(h, pl);
  std::vector<std::byte> out(header_size + pl.size());
  std::memcpy(out.data(), hdr.data(), header_size);
  std::memcpy(out.data() + header_size, pl.data(), pl.size());
  if (corrupt_after_checksum && !vals.empty()) out.back() ^= std::byte{0x40};
  return out;
}

// Hello as worker `id` with a one-table layout `rows x width`; expects the welcome.
template <class T, class C>
asio::awaitable<void> handshake(T& transport, C& conn, std::uint32_t id, std::uint32_t rows,
                                std::uint32_t width) {
  message hello = protocol::encode(
      protocol::hello{.worker = id,
                      .clock = 0,
                      .fingerprint = policy_fingerprint<consistency::ssp<1>, recovery::none>(),
                      .layout = {{rows, width}}},
      [&](std::size_t n) { return transport.allocate(n); });
  REQUIRE(!(co_await conn.async_send(std::move(hello))));
  auto [ec, welcome] = co_await conn.async_receive();
  REQUIRE(!ec);
  REQUIRE(welcome.header.type == message_type::welcome);
}

// A sparse pull of `keys` by `worker` at clock 0.
std::vector<std::byte> keyed_pull_frame(std::uint32_t worker, const std::vector<row_id>& keys) {
  frame_header h;
  h.type = message_type::pull;
  h.sender = worker;
  h.row_count = static_cast<std::uint32_t>(keys.size());
  std::vector<std::byte> pl(key_bytes(h.row_count));
  std::memcpy(pl.data(), keys.data(), keys.size() * sizeof(row_id));
  h.payload_bytes = pl.size();
  auto hdr = encode(h, pl);
  std::vector<std::byte> out(header_size + pl.size());
  std::memcpy(out.data(), hdr.data(), header_size);
  std::memcpy(out.data() + header_size, pl.data(), pl.size());
  return out;
}

template <class... V>
std::vector<std::byte> concat(const V&... parts) {
  std::vector<std::byte> out((parts.size() + ...));
  std::size_t off = 0;
  ((std::memcpy(out.data() + off, parts.data(), parts.size()), off += parts.size()), ...);
  return out;
}

}  // namespace

TEST_CASE("tcp: frames trickled in pieces or packed into one write are read whole") {
  asio::io_context io;
  tcp_transport t(io.get_executor());
  auto acc = t.listen({asio::ip::address_v4::loopback(), 0});
  REQUIRE(acc.has_value());
  const auto frame = [](std::uint64_t seq, std::size_t floats) {
    frame_header h;
    h.type = message_type::push;
    h.flags = frame_flags::range;
    h.seq = seq;
    h.row_count = static_cast<std::uint32_t>(floats);
    h.width = 1;
    std::vector<std::byte> pl(floats * sizeof(float));
    for (std::size_t k = 0; k < floats; ++k) {
      const auto v = static_cast<float>(seq * 1000 + k);
      std::memcpy(pl.data() + k * sizeof(float), &v, sizeof v);
    }
    h.payload_bytes = pl.size();
    const auto hdr = encode(h, pl);
    std::vector<std::byte> out(header_size + pl.size());
    std::memcpy(out.data(), hdr.data(), header_size);
    std::memcpy(out.data() + header_size, pl.data(), pl.size());
    return out;
  };
  // Frame 0 in four pieces (the header split), then frames 1-3 (small, large, small) in
  // one write, then frame 4 whose header ends exactly where a write ends.
  const auto f0 = frame(0, 100), f1 = frame(1, 7), f2 = frame(2, 10'000), f3 = frame(3, 2);
  const auto f4 = frame(4, 50);
  const std::vector<std::vector<std::byte>> writes = {
      {f0.begin(), f0.begin() + 10},
      {f0.begin() + 10, f0.begin() + header_size + 5},
      {f0.begin() + header_size + 5, f0.begin() + header_size + 200},
      {f0.begin() + header_size + 200, f0.end()},
      concat(f1, f2, f3),
      {f4.begin(), f4.begin() + header_size},
      {f4.begin() + header_size, f4.end()}};
  const std::size_t sizes[] = {100, 7, 10'000, 2, 50};
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    asio::ip::tcp::socket raw(io);
    auto [cec] = co_await raw.async_connect(acc.value().local_endpoint(), detail::use_tuple);
    REQUIRE(!cec);
    auto [aec, conn] = co_await acc.value().async_accept();
    REQUIRE(!aec);
    auto& accepted = conn;  // clang 14 cannot capture a structured binding in a lambda
    int good = 0;
    auto reader = [&]() -> asio::awaitable<void> {
      for (std::uint64_t i = 0; i < 5; ++i) {
        auto [rec, m] = co_await accepted.async_receive();
        if (rec || m.header.seq != i || m.payload.size() != sizes[i] * 4) break;
        bool same = true;
        for (std::size_t k = 0; k < sizes[i]; ++k)
          same = same && m.payload.floats()[k] == static_cast<float>(i * 1000 + k);
        good += same ? 1 : 0;
      }
    };
    asio::co_spawn(io, reader(), asio::detached);
    asio::steady_timer pause(io);
    for (const auto& w : writes) {
      auto [wec, n] = co_await asio::async_write(raw, asio::buffer(w), detail::use_tuple);
      REQUIRE(!wec);
      (void)n;
      pause.expires_after(std::chrono::milliseconds(5));
      co_await pause.async_wait(detail::use_tuple);
    }
    for (int k = 0; k < 200 && good < 5; ++k) {
      pause.expires_after(std::chrono::milliseconds(5));
      co_await pause.async_wait(detail::use_tuple);
    }
    CHECK(good == 5);
  });
}

TEST_CASE("server rejects hostile frames over TCP, keeps serving, parameters unchanged") {
  asio::io_context io;
  tcp_transport st(io.get_executor(),
                   tcp_options{.limits = {.max_frame_bytes = 1 << 16, .max_rows = 64}});
  std::vector<std::string> logs;
  server_options so;
  so.num_workers = 4;
  so.tables = {table_spec{0, 8, 4, 0.0f}};
  so.log = [&](std::string_view line) { logs.emplace_back(line); };
  test_server server(st, so, optimizer::sgd{1.0f});
  const auto ep = serve_on_loopback(io, st, server);

  tcp_transport wt(io.get_executor());
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    // A well-behaved worker 0 stays connected through everything.
    auto [ec, connected] = co_await wt.async_connect(ep);
    REQUIRE(!ec);
    auto& good = connected;  // clang 14 cannot capture a structured binding in a lambda
    co_await handshake(wt, good, 0, 8, 4);
    auto good_push = [&](float v) -> asio::awaitable<void> {
      message m;
      m.header.type = message_type::push;
      m.header.flags = frame_flags::range | frame_flags::want_ack;
      m.header.sender = 0;
      m.header.row_count = 8;
      m.header.width = 4;
      m.payload = wt.allocate(8 * 4 * 4);
      for (auto& x : m.payload.floats()) x = v;
      REQUIRE(!(co_await good.async_send(std::move(m))));
      auto [aec, ack] = co_await good.async_receive();
      REQUIRE(!aec);
      CHECK(ack.header.type == message_type::ack);
    };
    co_await good_push(-1.0f);  // sgd lr 1: every value becomes 1

    struct hostile {
      const char* name;
      std::vector<std::byte> bytes;
      const char* expected_in_log;
      bool half_close = false;
    };
    frame_header bad;
    bad.type = message_type::push;
    auto raw_header = [&](auto mutate) {
      frame_header h;
      h.type = message_type::heartbeat;
      mutate(h);
      auto e = encode(h, {});
      return std::vector<std::byte>(e.begin(), e.end());
    };
    std::vector<hostile> cases;
    cases.push_back(
        {"bad magic", raw_header([](frame_header& h) { h.magic = 0x12345678; }), "'magic'"});
    cases.push_back({"wrong version", raw_header([](frame_header& h) {
                       h.version = static_cast<std::uint16_t>(wire_version + 1);
                     }),
                     "'version'"});
    cases.push_back({"a wire version 2 peer (hello without incarnation)",
                     raw_header([](frame_header& h) { h.version = 2; }), "'version'"});
    cases.push_back({"unknown type",
                     raw_header([](frame_header& h) { h.type = static_cast<message_type>(77); }),
                     "'type'"});
    cases.push_back({"oversized", raw_header([](frame_header& h) {
                       h.type = message_type::error;
                       h.payload_bytes = std::uint64_t{1} << 40;
                     }),
                     "'payload_bytes' exceeds"});
    cases.push_back({"too many rows", concat(hello_frame(1, 8, 4), raw_header([](frame_header& h) {
                                               h.type = message_type::pull;
                                               h.flags = frame_flags::range;
                                               h.row_count = 65;
                                             })),
                     "'row_count'"});
    {
      auto whole = concat(hello_frame(1, 8, 4), push_frame(1, 0, 0, 8, 4, 5.0f));
      whole.resize(whole.size() - 50);
      cases.push_back({"truncated", whole, "truncated", true});
    }
    cases.push_back({"bad checksum",
                     concat(hello_frame(1, 8, 4), push_frame(1, 0, 0, 8, 4, 5.0f, true)),
                     "'checksum'"});
    cases.push_back(
        {"bad table", concat(hello_frame(1, 8, 4), push_frame(1, 3, 0, 8, 4, 5.0f)), "'table'"});
    cases.push_back({"bad row range", concat(hello_frame(1, 8, 4), push_frame(1, 0, 6, 4, 4, 5.0f)),
                     "first row 6, 4 rows"});
    cases.push_back(
        {"row range that wraps around",
         concat(hello_frame(1, 8, 4),
                push_frame(1, 0, std::numeric_limits<std::uint64_t>::max(), 2, 4, 5.0f)),
         "first row 18446744073709551615, 2 rows"});
    {
      auto f = push_frame(1, 0, 0, 8, 4, 5.0f);
      frame_header h =
          decode_header(std::span<const std::byte, header_size>(f.data(), header_size));
      h.clock = 5;
      std::vector<float> vals(32, 5.0f);
      auto hdr = encode(h, std::as_bytes(std::span(vals)));
      std::memcpy(f.data(), hdr.data(), header_size);
      cases.push_back(
          {"clock out of sequence", concat(hello_frame(1, 8, 4), f), "worker is at clock"});
    }
    {
      auto f = push_frame(1, 0, 0, 8, 4, 5.0f);
      frame_header h =
          decode_header(std::span<const std::byte, header_size>(f.data(), header_size));
      h.clock = std::numeric_limits<std::int64_t>::max();
      std::vector<float> vals(32, 5.0f);
      auto hdr = encode(h, std::as_bytes(std::span(vals)));
      std::memcpy(f.data(), hdr.data(), header_size);
      cases.push_back({"push clock INT64_MAX", concat(hello_frame(1, 8, 4), f), "maximum clock"});
    }
    cases.push_back(
        {"bad width", concat(hello_frame(1, 8, 4), push_frame(1, 0, 0, 8, 3, 5.0f)), "'width'"});
    cases.push_back({"non-finite gradient",
                     concat(hello_frame(1, 8, 4),
                            push_frame(1, 0, 0, 8, 4, std::numeric_limits<float>::quiet_NaN())),
                     "NaN"});
    cases.push_back({"push before hello", push_frame(1, 0, 0, 8, 4, 5.0f), "expected hello"});
    // Absurd hello clocks are refused; worker 0 keeps its place (checked below).
    cases.push_back({"hello clock 10^12", hello_frame(1, 8, 4, 1'000'000'000'000),
                     "says hello at clock 1000000000000"});
    cases.push_back({"hello clock INT64_MAX",
                     hello_frame(1, 8, 4, std::numeric_limits<clock_value>::max()),
                     "says hello at clock 9223372036854775807"});
    cases.push_back({"hello clock INT64_MIN",
                     hello_frame(1, 8, 4, std::numeric_limits<clock_value>::min()),
                     "says hello at clock -9223372036854775808"});
    cases.push_back({"a refusal names the peer's address", push_frame(1, 0, 0, 8, 4, 5.0f),
                     "of unidentified peer 127.0.0."});
    cases.push_back({"a sparse pull of one key repeated (amplification)",
                     concat(hello_frame(1, 8, 4), keyed_pull_frame(1, std::vector<row_id>(64, 3))),
                     "not strictly increasing"});
    cases.push_back({"worker id out of range", hello_frame(9, 8, 4), "'sender'"});
    cases.push_back({"layout mismatch", hello_frame(1, 8, 5), "layouts differ"});
    cases.push_back({"spoofed sender",
                     concat(hello_frame(1, 8, 4), push_frame(2, 0, 0, 8, 4, 5.0f)), "'sender'"});

    // Each case from its own loopback address: refusals are logged at most 5 per peer host in
    // 10 s (detail::log_limiter), and every case's line is checked.
    int host = 10;
    for (auto& c : cases) {
      INFO("case: " << std::string(c.name));
      const auto before = logs.size();
      const auto r = co_await raw_exchange(
          ep, c.bytes, c.half_close, asio::ip::make_address("127.0.0." + std::to_string(host++)));
      CHECK(r.closed_by_server);
      bool logged = false;
      for (std::size_t i = before; i < logs.size(); ++i)
        logged = logged || logs[i].find(c.expected_in_log) != std::string::npos;
      CHECK_MESSAGE(logged, "no log line containing '" << c.expected_in_log << "'");
      if (!c.half_close) CHECK(!r.error_reason.empty());  // the peer is told why
      // Parameters untouched by the hostile connection.
      bool unchanged = true;
      for (float v : server.values(0)) unchanged = unchanged && v == 1.0f;
      CHECK(unchanged);
    }
    // The good worker is still served.
    co_await good_push(-1.0f);
    bool two = true;
    for (float v : server.values(0)) two = two && v == 2.0f;
    CHECK(two);
    CHECK(server.stats().rejected >= cases.size() - 1);
    good.close();
    server.stop();
  });
}

TEST_CASE("server applies sparse pushes and answers sparse pulls (row sets)") {
  asio::io_context io;
  in_process_network net;
  in_process_transport st(io.get_executor(), net), wt(io.get_executor(), net);
  server_options so;
  so.num_workers = 1;
  so.shard = 1;
  so.num_shards = 2;
  so.tables = {table_spec{0, 100, 3, 0.0f}};  // shard 1 owns rows [50, 100)
  test_server_in_process server(st, so, optimizer::sgd{1.0f});
  auto acc = st.listen("s");
  REQUIRE(acc.has_value());
  asio::co_spawn(io, server.async_serve(std::move(acc).value()), asio::detached);
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    auto [ec, c] = co_await wt.async_connect("s");
    REQUIRE(!ec);
    co_await handshake(wt, c, 0, 100, 3);
    // Push gradient -k on rows {51, 60, 97} (keys strictly increasing, as workers send them):
    // sgd lr 1 makes those rows hold +k.
    const std::array<std::uint32_t, 3> keys{51, 60, 97};
    message push;
    push.header.type = message_type::push;
    push.header.flags = frame_flags::end_of_clock;
    push.header.row_count = 3;
    push.header.width = 3;
    push.payload = wt.allocate(key_bytes(3) + 3 * 3 * 4);
    std::memcpy(push.payload.data(), keys.data(), sizeof keys);
    auto* vals = reinterpret_cast<float*>(push.payload.data() + key_bytes(3));
    for (int r = 0; r < 3; ++r)
      for (int j = 0; j < 3; ++j)
        vals[r * 3 + j] = -static_cast<float>(keys[static_cast<std::size_t>(r)]);
    REQUIRE(!(co_await c.async_send(std::move(push))));
    // Pull rows {50, 60, 97} (needs server clock >= 1: our push ended clock 0).
    const std::array<std::uint32_t, 3> want{50, 60, 97};
    message pull;
    pull.header.type = message_type::pull;
    pull.header.clock = 1;
    pull.header.row_count = 3;
    pull.payload = wt.allocate(key_bytes(3));
    std::memcpy(pull.payload.data(), want.data(), sizeof want);
    REQUIRE(!(co_await c.async_send(std::move(pull))));
    auto [rec, rows] = co_await c.async_receive();
    REQUIRE(!rec);
    REQUIRE(rows.header.type == message_type::rows);
    CHECK(rows.header.clock == 1);
    CHECK(rows.header.seq == 1);  // one of our pushes to this table is reflected
    const auto k = payload_keys(rows);
    const auto v = payload_floats(rows);
    REQUIRE(k.size() == 3);
    REQUIRE(v.size() == 9);
    CHECK(k[0] == 50);
    CHECK(v[0] == 0.0f);
    CHECK(k[1] == 60);
    CHECK(v[3] == 60.0f);
    CHECK(k[2] == 97);
    CHECK(v[8] == 97.0f);
    // A key outside the shard is rejected.
    message bad;
    bad.header.type = message_type::pull;
    bad.header.row_count = 1;
    bad.payload = wt.allocate(key_bytes(1));
    const std::uint32_t outside = 10;
    std::memcpy(bad.payload.data(), &outside, 4);
    REQUIRE(!(co_await c.async_send(std::move(bad))));
    auto [eec, err] = co_await c.async_receive();
    CHECK(!eec);
    CHECK(err.header.type == message_type::error);
    c.close();
    server.stop();
  });
}

namespace {

// Serves `acc` with `server` on `io` while `client()` runs beside it, then stops the server and
// requires `async_serve` to complete, with success: it waits for every session to end, so a
// session whose write loop never finishes keeps the test coroutine from finishing (run_coro's
// limit fails the test).
template <class Server, class Acceptor, class F>
void serve_while(asio::io_context& io, Server& server, Acceptor acc, F client) {
  std::error_code served = make_error_code(errc::timeout);
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          co_await client();
          server.stop();
        },
        [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
    served = co_await server.async_serve(std::move(acc));
  });
  CHECK(!served);
}

// `n` range pulls of all 8 rows at no_clock: each is answered at once.
template <class C>
asio::awaitable<bool> send_pulls(C& c, int n) {
  for (int i = 0; i < n; ++i) {
    message pull;
    pull.header.type = message_type::pull;
    pull.header.flags = frame_flags::range;
    pull.header.row_count = 8;
    pull.header.clock = no_clock;
    if (co_await c.async_send(std::move(pull))) co_return false;
  }
  co_return true;
}

}  // namespace

// The server closes the connection (its queue budget) while its write loop waits for room in
// the full channel to the worker. That send must end too: before, an in-process close left it
// waiting forever (Asio's channel close does not complete waiting sends), so the session and
// `async_serve` never finished.
TEST_CASE("a peer that does not read its replies is disconnected, not buffered forever") {
  asio::io_context io;
  in_process_network net(4);  // small channels: the server's writer blocks quickly
  in_process_transport st(io.get_executor(), net), wt(io.get_executor(), net);
  std::vector<std::string> logs;
  server_options so;
  so.num_workers = 1;
  so.tables = {table_spec{0, 8, 4, 0.0f}};
  so.max_queued_messages = 16;
  so.log = [&](std::string_view line) { logs.emplace_back(line); };
  test_server_in_process server(st, so, optimizer::sgd{1.0f});
  auto acc = st.listen("s");
  REQUIRE(acc.has_value());
  serve_while(io, server, std::move(acc).value(), [&]() -> asio::awaitable<void> {
    auto [ec, c] = co_await wt.async_connect("s");
    REQUIRE(!ec);
    co_await handshake(wt, c, 0, 8, 4);
    const bool all_sent = co_await send_pulls(c, 200);
    CHECK(!all_sent);  // the server closed the connection
    bool logged = false;
    for (const auto& l : logs) logged = logged || l.find("does not read") != std::string::npos;
    CHECK(logged);
  });
  CHECK(server.connections() == 0);
}

// The worker closes while the server's write loop waits for room in the full channel to it
// (under the queue budget): the worker's close must end that send, else the session never
// ends and neither does `async_serve`.
TEST_CASE("a worker that closes while the server's write waits for room ends its session") {
  asio::io_context io;
  in_process_network net(4);
  in_process_transport st(io.get_executor(), net), wt(io.get_executor(), net);
  server_options so;
  so.num_workers = 1;
  so.tables = {table_spec{0, 8, 4, 0.0f}};
  test_server_in_process server(st, so, optimizer::sgd{1.0f});
  auto acc = st.listen("s");
  REQUIRE(acc.has_value());
  serve_while(io, server, std::move(acc).value(), [&]() -> asio::awaitable<void> {
    auto [ec, c] = co_await wt.async_connect("s");
    REQUIRE(!ec);
    co_await handshake(wt, c, 0, 8, 4);
    // 20 answered pulls: 4 replies fill the channel, the server's writer waits with the rest.
    CHECK(co_await send_pulls(c, 20));
    for (int i = 0; i < 8; ++i) co_await asio::post(io, asio::use_awaitable);
    CHECK(server.connections() == 1);
    c.close();
  });
  CHECK(server.connections() == 0);
}

// An in-process send that waits for room (the peer does not read) completes with
// connection_closed when the peer closes, when its own side closes, and when the listener
// closes before accepting the connection. Asio's channel close alone leaves such a send
// waiting forever.
TEST_CASE("in-process: a send waiting for room ends when either side or the listener closes") {
  asio::io_context io;
  in_process_network net(2);
  in_process_transport t(io.get_executor(), net);
  auto listening = t.listen("s");
  REQUIRE(listening.has_value());
  auto acc = std::move(listening).value();
  enum class closer { peer, self, listener };
  for (closer who : {closer::peer, closer::self, closer::listener}) {
    CAPTURE(static_cast<int>(who));
    in_process_transport::connection c, accepted;
    std::optional<std::error_code> third;
    test::run_coro(io, [&]() -> asio::awaitable<void> {
      auto [ec, conn] = co_await t.async_connect("s");
      REQUIRE(!ec);
      c = std::move(conn);
      if (who != closer::listener) {
        auto [aec, a] = co_await acc.async_accept();
        REQUIRE(!aec);
        accepted = std::move(a);
      }
      REQUIRE(!(co_await c.async_send(make_message(t, 1, 4))));
      REQUIRE(!(co_await c.async_send(make_message(t, 2, 4))));  // the channel is full
      asio::co_spawn(
          io,
          [&]() -> asio::awaitable<void> { third = co_await c.async_send(make_message(t, 3, 4)); },
          asio::detached);
      for (int i = 0; i < 8; ++i) co_await asio::post(io, asio::use_awaitable);
      REQUIRE(!third.has_value());  // waits for room
      switch (who) {
        case closer::peer: accepted.close(); break;
        case closer::self: c.close(); break;
        case closer::listener: acc.close(); break;
      }
      for (int i = 0; i < 8 && !third; ++i) co_await asio::post(io, asio::use_awaitable);
      REQUIRE(third.has_value());
      CHECK(*third == errc::connection_closed);
      CHECK(co_await c.async_send(make_message(t, 4, 4)) == errc::connection_closed);
    });
  }
}

// A worker's io_context may be destroyed before the server is done with that worker's
// connection (a worker thread exits first): the pipe's channels belong to the network, so the
// server can still read what was queued, see the close, write and close its end. Before the
// channels lived on the network, they were created on the connector's executor, and closing
// the server's end read the freed channel service (ASan: heap-use-after-free). The same for a
// listener whose transport's io_context is gone.
TEST_CASE("in-process connections and acceptors outlive the io_context that made them") {
  in_process_network net;
  asio::io_context server_io;
  in_process_transport st(server_io.get_executor(), net);
  auto listening = st.listen("server");
  REQUIRE(listening.has_value());
  auto acc = std::move(listening).value();
  in_process_transport::connection server_end;
  {
    auto worker_io = std::make_unique<asio::io_context>();
    in_process_transport wt(worker_io->get_executor(), net);
    in_process_transport::connection worker_end;
    test::run_coro(*worker_io, [&]() -> asio::awaitable<void> {
      auto [ec, c] = co_await wt.async_connect("server");
      REQUIRE(!ec);
      worker_end = std::move(c);
      REQUIRE(!(co_await worker_end.async_send(make_message(wt, 1, 4))));
    });
    test::run_coro(server_io, [&]() -> asio::awaitable<void> {
      auto [ec, c] = co_await acc.async_accept();
      REQUIRE(!ec);
      server_end = std::move(c);
    });
    // The server's end: its reads go on after the worker's context is gone.
    worker_end.close();
    worker_io.reset();
  }
  test::run_coro(server_io, [&]() -> asio::awaitable<void> {
    auto [ec, m] = co_await server_end.async_receive();
    REQUIRE(!ec);
    CHECK(m.header.seq == 1);
    CHECK(m.payload.size() == 4 * sizeof(float));
    auto [cec, none] = co_await server_end.async_receive();  // the worker's close
    CHECK(cec == errc::connection_closed);
    CHECK(!server_end.is_open());
    CHECK(co_await server_end.async_send(make_message(st, 2, 4)) == errc::connection_closed);
  });
  server_end.close();

  // A listener made on a context that is gone still queues connections and closes.
  auto listener_io = std::make_unique<asio::io_context>();
  in_process_transport lt(listener_io->get_executor(), net);
  auto late = lt.listen("late");
  REQUIRE(late.has_value());
  auto lacc = std::move(late).value();
  listener_io.reset();
  in_process_transport::connection queued;
  test::run_coro(server_io, [&]() -> asio::awaitable<void> {
    auto [ec, c] = co_await st.async_connect("late");
    REQUIRE(!ec);  // queued, never accepted
    queued = std::move(c);
  });
  lacc.close();
  test::run_coro(server_io, [&]() -> asio::awaitable<void> {
    CHECK(co_await queued.async_send(make_message(st, 3, 4)) == errc::connection_closed);
    auto [ec, c] = co_await st.async_connect("late");
    CHECK(ec == std::errc::connection_refused);
  });
}

// Issue 15, finding 4, and issue 32: with descriptors exhausted, accept fails with EMFILE in
// Asio's own "asio.system" category. A service must log it (rate-limited), keep serving, and
// accept again with backoff once descriptors are free (the shard server used to end its
// async_serve, and so did the trainer's server process; the chain master and the rendezvous
// did until issue 32). Run in a forked child with a lowered RLIMIT_NOFILE
// (tests/support/descriptor_flood.hpp); the child's exit status says what went wrong.

// A frame's bytes as they go on the wire.
std::vector<std::byte> frame_bytes(const message& m) {
  frame_header h = m.header;
  h.payload_bytes = m.payload.size();
  auto pl = m.payload.bytes();
  auto hdr = encode(h, pl);
  std::vector<std::byte> out(header_size + pl.size());
  std::memcpy(out.data(), hdr.data(), header_size);
  std::memcpy(out.data() + header_size, pl.data(), pl.size());
  return out;
}

// Reads one frame from `s`: its header (type none on a read error).
asio::awaitable<std::optional<frame_header>> read_frame(asio::ip::tcp::socket& s) {
  std::array<std::byte, header_size> hb{};
  auto [rec, rn] = co_await asio::async_read(s, asio::buffer(hb), detail::use_tuple);
  (void)rn;
  if (rec) co_return std::nullopt;
  const auto h = decode_header(hb);
  std::vector<std::byte> payload(h.payload_bytes);
  auto [pec, pn] = co_await asio::async_read(s, asio::buffer(payload), detail::use_tuple);
  (void)pn;
  if (pec) co_return std::nullopt;
  co_return h;
}

std::string flood_message(int status) {
  return "child status " + std::to_string(status) +
         " (14: async_serve ended on the accept error; 15: no failed accept logged; 16: the "
         "request afterwards was not served; 17: failed accepts not rate-limited)";
}

TEST_CASE("server: a descriptor flood (EMFILE) is retried with backoff and logged rate-limited; "
          "a worker's hello and push are served afterwards") {
  if (test::address_sanitized) {
    MESSAGE("skipped under AddressSanitizer (tests/support/descriptor_flood.hpp)");
    return;
  }
  const int status = test::run_with_descriptor_limit(256, [] {
    asio::io_context io;
    tcp_transport st(io.get_executor());
    std::vector<std::string> logs;
    server_options so;
    so.num_workers = 1;
    so.tables = {table_spec{0, 8, 4, 0.0f}};
    so.watchdog_interval = std::chrono::milliseconds(0);
    so.log = [&](std::string_view line) { logs.emplace_back(line); };
    test_server server(st, so, optimizer::sgd{1.0f});
    return test::flood_service(
        io, st, server, logs, [&](asio::ip::tcp::endpoint ep) -> asio::awaitable<bool> {
          asio::ip::tcp::socket c(io);
          auto [cec] = co_await c.async_connect(ep, detail::use_tuple);
          if (cec) co_return false;
          const auto hello = hello_frame(0, 8, 4);
          auto [hec, hn] = co_await asio::async_write(c, asio::buffer(hello), detail::use_tuple);
          (void)hn;
          const auto welcome = co_await read_frame(c);
          if (hec || !welcome || welcome->type != message_type::welcome) co_return false;
          const auto push = push_frame(0, 0, 0, 8, 4, 5.0f);
          auto [pec, pn] = co_await asio::async_write(c, asio::buffer(push), detail::use_tuple);
          (void)pn;
          asio::steady_timer t(io);
          for (int i = 0; i < 300 && !pec && server.stats().pushes == 0; ++i) {
            t.expires_after(std::chrono::milliseconds(10));
            co_await t.async_wait(detail::use_tuple);
          }
          co_return server.stats().pushes == 1;
        });
  });
  CHECK_MESSAGE(status == 0, flood_message(status));
}

TEST_CASE("chain master: a descriptor flood (EMFILE) is retried with backoff and logged "
          "rate-limited; a member registers afterwards") {
  if (test::address_sanitized) {
    MESSAGE("skipped under AddressSanitizer (tests/support/descriptor_flood.hpp)");
    return;
  }
  const int status = test::run_with_descriptor_limit(256, [] {
    asio::io_context io;
    tcp_transport mt(io.get_executor());
    std::vector<std::string> logs;
    chain_master_options mo;
    mo.num_shards = 1;
    mo.members = 1;
    mo.log = [&](std::string_view line) { logs.emplace_back(line); };
    basic_chain_master<tcp_transport> master(mt, mo);
    return test::flood_service(
        io, mt, master, logs, [&](asio::ip::tcp::endpoint ep) -> asio::awaitable<bool> {
          asio::ip::tcp::socket c(io);
          auto [cec] = co_await c.async_connect(ep, detail::use_tuple);
          if (cec) co_return false;
          const auto hello =
              frame_bytes(protocol::encode(protocol::chain_hello{.shard = 0, .member = 0},
                                           [&](std::size_t n) { return mt.allocate(n); }));
          auto [hec, hn] = co_await asio::async_write(c, asio::buffer(hello), detail::use_tuple);
          (void)hn;
          const auto config = co_await read_frame(c);
          co_return !hec && config && config->type == protocol::chain_config_type &&
              master.chain(0) == std::vector<std::uint32_t>{0};
        });
  });
  CHECK_MESSAGE(status == 0, flood_message(status));
}

TEST_CASE("delay proxy: a descriptor flood (EMFILE) is retried with backoff and logged "
          "rate-limited; a connection is forwarded afterwards") {
  // bench/delay_proxy's accept loop ended on its first accept error: under a descriptor
  // flood the proxy stopped forwarding for good.
  if (test::address_sanitized) {
    MESSAGE("skipped under AddressSanitizer (tests/support/descriptor_flood.hpp)");
    return;
  }
  const int status = test::run_with_descriptor_limit(256, [] {
    using asio::ip::tcp;
    asio::io_context io;
    const tcp::endpoint loopback(asio::ip::make_address("127.0.0.1"), 0);
    tcp::acceptor echo_acc(io, loopback);
    tcp::acceptor proxy_acc(io, loopback);
    std::vector<std::string> logs;
    bench::delay_proxy_options o;
    o.log = [&](const std::string& line) { logs.push_back(line); };
    bench::delay_proxy proxy(echo_acc.local_endpoint(), o);
    // The upstream: echoes every connection's bytes back.
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          for (;;) {
            auto [ec, sock] = co_await echo_acc.async_accept(detail::use_tuple);
            if (ec) co_return;
            asio::co_spawn(
                io,
                [s = std::move(sock)]() mutable -> asio::awaitable<void> {
                  std::array<char, 64> buf{};
                  for (;;) {
                    auto [rec, n] =
                        co_await s.async_read_some(asio::buffer(buf), detail::use_tuple);
                    if (rec) co_return;
                    auto [wec, m] =
                        co_await asio::async_write(s, asio::buffer(buf, n), detail::use_tuple);
                    if (wec || m != n) co_return;
                  }
                },
                asio::detached);
          }
        },
        asio::detached);
    bool serve_ended = false;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          co_await proxy.run(proxy_acc);
          serve_ended = true;
        },
        asio::detached);
    int status = test::flood_probe_failed;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          status = co_await test::flood_then_probe(
              proxy_acc.local_endpoint(), logs, serve_ended, [&]() -> asio::awaitable<bool> {
                tcp::socket c(io);
                auto [cec] =
                    co_await c.async_connect(proxy_acc.local_endpoint(), detail::use_tuple);
                if (cec) co_return false;
                const std::string ping = "ping";
                auto [wec, wn] =
                    co_await asio::async_write(c, asio::buffer(ping), detail::use_tuple);
                std::array<char, 4> back{};
                auto [rec, rn] =
                    co_await asio::async_read(c, asio::buffer(back), detail::use_tuple);
                co_return !wec && !rec && wn == 4 && rn == 4 &&
                    std::string(back.data(), 4) == ping && proxy.stats().failed_accepts > 0;
              });
          proxy_acc.close();
          echo_acc.close();
        },
        asio::detached);
    io.run_for(std::chrono::seconds(20));
    return status;
  });
  CHECK_MESSAGE(status == 0, flood_message(status));
}

TEST_CASE("log_limiter: lines per window, the suppressed count, the eviction bound") {
  using clock = std::chrono::steady_clock;
  using namespace std::chrono_literals;
  detail::log_limiter<clock::time_point> lim({.lines = 3, .window = 1000ms, .max_peers = 4});
  std::vector<std::string> out;
  const auto sink = [&](const std::string& l) { out.push_back(l); };
  const auto t0 = clock::time_point{} + 1h;
  const auto refused = detail::log_kind::refused_connection;

  SUBCASE("a few lines per window, then one count") {
    int allowed = 0;
    for (int i = 0; i < 10; ++i) allowed += lim.admit(refused, "10.0.0.7", t0 + i * 10ms, sink);
    CHECK(allowed == 3);
    CHECK(lim.suppressed() == 7);
    CHECK(out.empty());  // the window has not ended
    // Another host and another kind have their own counts.
    CHECK(lim.admit(refused, "10.0.0.8", t0 + 100ms, sink));
    CHECK(lim.admit(detail::log_kind::failed_accept, "10.0.0.7", t0 + 100ms, sink));
    // The window has ended: the next line of that host is written, after the count.
    CHECK(lim.admit(refused, "10.0.0.7", t0 + 1500ms, sink));
    REQUIRE(out.size() == 1);
    CHECK(out[0] == "7 more refused connections from 10.0.0.7 suppressed in the last 1.5 s");
    // flush() reports a window that ended with nothing after it.
    for (int i = 0; i < 5; ++i) (void)lim.admit(refused, "10.0.0.7", t0 + 1600ms, sink);
    lim.flush(t0 + 2000ms, sink);  // not yet over
    CHECK(out.size() == 1);
    lim.flush(t0 + 2600ms, sink);
    REQUIRE(out.size() == 2);
    CHECK(out[1] == "3 more refused connections from 10.0.0.7 suppressed in the last 1.1 s");
    CHECK(lim.suppressed() == 10);
  }
  SUBCASE("no peer: one count for all; flush_all reports what is pending") {
    for (int i = 0; i < 5; ++i) (void)lim.admit(detail::log_kind::failed_accept, "", t0, sink);
    lim.flush_all(t0 + 250ms, sink);
    REQUIRE(out.size() == 1);
    CHECK(out[0] == "2 more failed accepts suppressed in the last 0.3 s");
    CHECK(lim.tracked() == 0);
  }
  SUBCASE("at most max_peers pairs; the least recently seen is evicted with its count") {
    for (int i = 0; i < 5; ++i) (void)lim.admit(refused, "10.0.0.1", t0, sink);  // 2 held back
    for (int p = 2; p <= 100; ++p) {
      CHECK(lim.admit(refused, "10.0.0." + std::to_string(p), t0 + p * 1ms, sink));
      CHECK(lim.tracked() <= 4);
    }
    CHECK(lim.tracked() == 4);
    REQUIRE(out.size() == 1);  // only the evicted pair that held lines back
    CHECK(out[0] == "2 more refused connections from 10.0.0.1 suppressed in the last 0.1 s");
  }
}

TEST_CASE("accept_backoff: transient accept errors; the pause doubles from 1 ms to 1 s") {
  const auto asio_code = [](int e) {
    return std::error_code(e, asio::error::get_system_category());
  };
  for (int e : {EMFILE, ENFILE, ENOBUFS, ENOMEM, ECONNABORTED, EINTR, EAGAIN, EPROTO, ENETDOWN})
    CHECK(detail::accept_backoff::transient(asio_code(e)));
  CHECK(detail::accept_backoff::transient(std::error_code(EMFILE, std::system_category())));
  CHECK_FALSE(detail::accept_backoff::transient(asio_code(EBADF)));
  CHECK_FALSE(detail::accept_backoff::transient(asio_code(EINVAL)));
  CHECK_FALSE(detail::accept_backoff::transient(make_error_code(errc::stopped)));
  detail::accept_backoff b;
  std::vector<long long> pauses;
  for (int i = 0; i < 12; ++i) pauses.push_back(b.failed().count());
  CHECK(pauses == std::vector<long long>{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 1000});
  b.succeeded();
  CHECK(b.failed().count() == 1);
  CHECK(b.failures() == 13);
  CHECK(detail::host_of("10.0.0.7:51234") == "10.0.0.7");
  CHECK(detail::host_of("[::1]:51234") == "::1");
  CHECK(detail::host_of("fe80::1") == "fe80::1");
  CHECK(detail::host_of("") == "");
}

// A real Asio error (category "asio.system", not std::system_category) is classified.
TEST_CASE("condition::transient matches real Asio socket errors") {
  tcp_fixture f;
  const auto ep = f.nowhere();
  asio::ip::tcp::socket s(f.io);
  std::error_code ec;
  s.connect(ep, ec);
  REQUIRE(ec);
  CHECK(std::string(ec.category().name()) == "asio.system");
  CHECK(ec == condition::transient);  // connection refused
  CHECK(std::error_code(EMFILE, ec.category()) != condition::transient);
  CHECK(std::error_code(ECONNRESET, ec.category()) == condition::transient);
}

// Issue 15, finding 5: two bare TCP connect/close (a port scan) used to end a trainer's
// `--role server`: it counted every connection as a worker that came and left. Issue 32: so did
// a hello and a bye as every id before training. It now waits for the expected workers to have
// trained (a push or clock message taken) and left.
TEST_CASE("trainer's serve_until_done: bare connections and hello+bye are no workers; it ends "
          "when the workers that trained have left") {
  asio::io_context io;
  tcp_transport st(io.get_executor());
  server_options so;
  so.num_workers = 1;
  so.tables = {table_spec{0, 8, 4, 0.0f}};
  so.watchdog_interval = std::chrono::milliseconds(0);
  so.log = [](std::string_view) {};
  test_server server(st, so, optimizer::sgd{1.0f});
  auto acc = st.listen({asio::ip::make_address("127.0.0.1"), 0});
  REQUIRE(acc.has_value());
  const auto ep = acc.value().local_endpoint();
  bool done = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        co_await fashion::serve_until_done(server, std::move(acc).value(), 1);
        done = true;
      },
      asio::detached);
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    asio::steady_timer t(io);
    for (int i = 0; i < 2; ++i) {  // the port scan
      asio::ip::tcp::socket s(io);
      auto [ec] = co_await s.async_connect(ep, detail::use_tuple);
      REQUIRE(!ec);
      s.close();
    }
    // Several of serve_until_done's 50 ms polls after both connections are gone.
    for (int i = 0; i < 40 && (server.stats().connections < 2 || server.connections() > 0); ++i) {
      t.expires_after(std::chrono::milliseconds(10));
      co_await t.async_wait(detail::use_tuple);
    }
    REQUIRE(server.stats().connections == 2);
    t.expires_after(std::chrono::milliseconds(200));
    co_await t.async_wait(detail::use_tuple);
    CHECK(!done);  // still serving: no worker has come yet
    CHECK(server.workers_seen() == 0);
    {
      // An insider says hello as worker 0 and bye, without training: still no worker.
      tcp_transport it(io.get_executor());
      auto [iec, ic] = co_await it.async_connect(ep);
      REQUIRE(!iec);
      co_await handshake(it, ic, 0, 8, 4);
      message bye;
      bye.header.type = message_type::bye;
      REQUIRE(!(co_await ic.async_send(std::move(bye))));
      auto [eof, none] = co_await ic.async_receive();
      CHECK(eof);  // closed by the server after the bye
      for (int i = 0; i < 40 && server.workers_connected() > 0; ++i) {
        t.expires_after(std::chrono::milliseconds(10));
        co_await t.async_wait(detail::use_tuple);
      }
      t.expires_after(std::chrono::milliseconds(200));  // several 50 ms polls
      co_await t.async_wait(detail::use_tuple);
      CHECK(!done);
      CHECK(server.workers_seen() == 1);
      CHECK(server.workers_trained() == 0);
    }
    // The real worker comes, trains a clock and leaves: now it ends.
    tcp_transport wt(io.get_executor());
    auto [ec, c] = co_await wt.async_connect(ep);
    REQUIRE(!ec);
    auto& conn = c;
    co_await handshake(wt, conn, 0, 8, 4);
    CHECK(server.workers_connected() == 1);
    message tick;
    tick.header.type = message_type::clock;
    tick.header.sender = 0;
    tick.header.clock = 0;
    tick.header.seq = 1;
    REQUIRE(!(co_await conn.async_send(std::move(tick))));
    for (int i = 0; i < 100 && server.workers_trained() == 0; ++i) {
      t.expires_after(std::chrono::milliseconds(10));
      co_await t.async_wait(detail::use_tuple);
    }
    CHECK(server.workers_trained() == 1);
    conn.close();
    for (int i = 0; i < 300 && !done; ++i) {
      t.expires_after(std::chrono::milliseconds(10));
      co_await t.async_wait(detail::use_tuple);
    }
    CHECK(done);
    CHECK(server.workers_seen() == 1);
  });
}

// Authentication (docs/security.md): the shared-secret handshake of the TCP transport.

namespace {

shared_secret secret_of(char fill) {
  std::array<std::byte, 32> b{};
  b.fill(static_cast<std::byte>(fill));
  return shared_secret(b);
}

bool any_line(const std::vector<std::string>& logs, std::size_t from, std::string_view what) {
  for (std::size_t i = from; i < logs.size(); ++i)
    if (logs[i].find(what) != std::string::npos) return true;
  return false;
}

// A push of `value` to all 8x4 rows of table 0 as worker `id`, acked.
template <class T, class C>
asio::awaitable<void> acked_push(T& t, C& conn, std::uint32_t id, float value) {
  message m;
  m.header.type = message_type::push;
  m.header.flags = frame_flags::range | frame_flags::want_ack;
  m.header.sender = id;
  m.header.row_count = 8;
  m.header.width = 4;
  m.payload = t.allocate(8 * 4 * 4);
  for (auto& x : m.payload.floats()) x = value;
  REQUIRE(!(co_await conn.async_send(std::move(m))));
  auto [ec, ack] = co_await conn.async_receive();
  REQUIRE(!ec);
  CHECK(ack.header.type == message_type::ack);
}

}  // namespace

TEST_CASE("auth handshake messages: a wrong secret, a frame or a refusal never verify") {
  namespace a = detail::auth;
  const auto key = secret_of('k');
  const auto other = secret_of('o');
  a::nonce ns{}, nc{}, got{};
  REQUIRE(a::make_nonce(ns));
  REQUIRE(a::make_nonce(nc));
  a::nonce ns_seen{};
  REQUIRE(!a::parse_challenge(a::encode_challenge(ns), ns_seen));
  CHECK(ns_seen == ns);
  CHECK(!a::check_response(key, ns, a::encode_response(key, ns, nc), got));
  CHECK(got == nc);
  CHECK(a::check_response(key, ns, a::encode_response(other, ns, nc), got) ==
        errc::authentication_failed);
  a::nonce ns2 = ns;
  ns2[0] ^= std::byte{1};  // a response recorded for another challenge
  CHECK(a::check_response(key, ns2, a::encode_response(key, ns, nc), got) ==
        errc::authentication_failed);
  CHECK(!a::check_verdict(key, ns, nc, a::encode_verdict(key, ns, nc, true)));
  CHECK(a::check_verdict(key, ns, nc, a::encode_verdict(other, ns, nc, true)) ==
        errc::authentication_failed);
  CHECK(a::check_verdict(key, ns, nc, a::encode_verdict(key, ns, nc, false)) ==
        errc::authentication_failed);
  // A connector's proof replayed as the listener's (the labels differ).
  a::verdict_msg reflected{};
  a::encode_prefix(reflected.data(), a::kind::accept);
  const auto cp = a::proof(key, a::connector_label, nc, ns);
  std::copy(cp.begin(), cp.end(), reflected.begin() + a::prefix_bytes);
  CHECK(a::check_verdict(key, ns, nc, reflected) == errc::authentication_failed);
  // A frame where a handshake message was expected: the peer runs without a secret.
  a::response_msg framed{};
  const auto h = encode(frame_header{}, {});
  std::copy(h.begin(), h.end(), framed.begin());
  CHECK(a::check_response(key, ns, framed, got) == errc::authentication_required);
}

TEST_CASE("load_secret_file: refuses missing, group-readable, short and non-regular files") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("asyncps-secret-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "secret";
  auto write = [&](std::string_view bytes, std::filesystem::perms mode) {
    std::filesystem::remove(file);
    std::ofstream(file, std::ios::binary) << bytes;
    std::filesystem::permissions(file, mode);
  };
  using std::filesystem::perms;
  const std::string good(32, 'x');

  auto missing = load_secret_file(dir / "nothing");
  REQUIRE(!missing);
  CHECK(missing.error() == std::errc::no_such_file_or_directory);
  write(good, perms::owner_read | perms::owner_write | perms::group_read);
  auto readable = load_secret_file(file);
  REQUIRE(!readable);
  CHECK(readable.error() == errc::insecure_secret_file);
  CHECK(readable.error().message().find("chmod 600") != std::string::npos);
  write("short", perms::owner_read | perms::owner_write);
  auto short_secret = load_secret_file(file);
  REQUIRE(!short_secret);
  CHECK(short_secret.error() == errc::weak_secret);
  write("", perms::owner_read);
  CHECK(load_secret_file(file).error() == errc::weak_secret);
  std::filesystem::permissions(dir, perms::owner_all);
  CHECK(load_secret_file(dir).error() == errc::bad_file);
  write(good, perms::owner_read | perms::owner_write);
  auto ok = load_secret_file(file);
  REQUIRE(ok.has_value());
  CHECK(ok.value().bytes().size() == 32);
  CHECK(std::memcmp(ok.value().bytes().data(), good.data(), 32) == 0);
  std::filesystem::remove_all(dir);

  // Secure default: no secret, no listening beyond loopback.
  asio::io_context io;
  tcp_transport open_t(io.get_executor());
  auto any = open_t.listen({asio::ip::make_address("0.0.0.0"), 0});
  REQUIRE(!any);
  CHECK(any.error() == errc::authentication_required);
  CHECK(open_t.listen({asio::ip::make_address("127.0.0.1"), 0}).has_value());
  tcp_transport trusting(io.get_executor(), tcp_options{.allow_unauthenticated = true});
  CHECK(trusting.listen({asio::ip::make_address("0.0.0.0"), 0}).has_value());
  std::array<std::byte, 8> eight{};
  tcp_transport weak(io.get_executor(), tcp_options{.secret = shared_secret(eight)});
  CHECK(weak.listen({asio::ip::make_address("127.0.0.1"), 0}).error() == errc::weak_secret);
}

TEST_CASE(
    "auth: only holders of the secret push, others are refused and logged with their address") {
  asio::io_context io;
  tcp_options secured;
  secured.secret = secret_of('s');
  secured.auth_timeout = std::chrono::milliseconds(300);
  tcp_transport st(io.get_executor(), secured);
  std::vector<std::string> logs;
  server_options so;
  so.num_workers = 4;
  so.tables = {table_spec{0, 8, 4, 0.0f}};
  so.log = [&](std::string_view line) { logs.emplace_back(line); };
  test_server server(st, so, optimizer::sgd{1.0f});
  const auto ep = serve_on_loopback(io, st, server);
  auto all_equal = [&](float want) {
    bool same = true;
    for (float v : server.values(0)) same = same && v == want;
    return same;
  };

  tcp_transport good_t(io.get_executor(), secured);
  tcp_options wrong;
  wrong.secret = secret_of('w');
  tcp_transport wrong_t(io.get_executor(), wrong);
  tcp_transport none_t(io.get_executor());
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    auto [ec, connected] = co_await good_t.async_connect(ep);
    REQUIRE(!ec);
    auto& good = connected;
    co_await handshake(good_t, good, 0, 8, 4);
    co_await acked_push(good_t, good, 0, -1.0f);  // sgd lr 1: every value becomes 1
    CHECK(all_equal(1.0f));

    // Finding 1: hello as worker 1 and one finite push, from a raw socket without the secret.
    auto before = logs.size();
    const auto r = co_await raw_exchange(
        ep, concat(hello_frame(1, 8, 4), push_frame(1, 0, 0, 8, 4, -1000.0f)), false);
    CHECK(r.closed_by_server);
    CHECK(all_equal(1.0f));
    CHECK(any_line(logs, before, "refused an unauthenticated connection (from 127.0.0.1:"));

    // The same through a transport with a wrong secret: refused at connect.
    before = logs.size();
    auto [wec, wc] = co_await wrong_t.async_connect(ep);
    CHECK(wec == errc::authentication_failed);
    CHECK(!wc.is_open());
    CHECK(any_line(logs, before, "authentication failed"));
    CHECK(any_line(logs, before, "(from 127.0.0.1:"));

    // A transport without a secret connects (plain TCP) but its hello is answered by the
    // server's challenge and a refusal: it is told that authentication is required.
    auto [nec, nc] = co_await none_t.async_connect(ep);
    REQUIRE(!nec);
    auto& plain = nc;
    message hello = protocol::encode(
        protocol::hello{.worker = 2,
                        .clock = 0,
                        .fingerprint = policy_fingerprint<consistency::ssp<1>, recovery::none>(),
                        .layout = {{8, 4}}},
        [&](std::size_t n) { return none_t.allocate(n); });
    (void)co_await plain.async_send(std::move(hello));
    auto [rec, reply] = co_await plain.async_receive();
    CHECK(rec == errc::authentication_required);
    plain.close();
    CHECK(all_equal(1.0f));

    // The authenticated worker is still served.
    co_await acked_push(good_t, good, 0, -1.0f);
    CHECK(all_equal(2.0f));
    CHECK(server.stats().rejected >= 3);
    good.close();
    server.stop();
  });
}

TEST_CASE("auth: a client refuses a listener that lacks the secret or fakes its proof") {
  asio::io_context io;
  tcp_options secured;
  secured.secret = secret_of('s');
  secured.auth_timeout = std::chrono::milliseconds(200);
  tcp_transport client(io.get_executor(), secured);
  asio::ip::tcp::acceptor fake(io, {asio::ip::make_address("127.0.0.1"), 0});
  const auto ep = fake.local_endpoint();
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    // A fake server: sends a challenge, reads the response, accepts with a proof made with
    // another secret. A worker must not send it pushes nor take rows from it.
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          auto [aec, sock] = co_await fake.async_accept(detail::use_tuple);
          REQUIRE(!aec);
          detail::auth::nonce ns{}, nc{};
          REQUIRE(detail::auth::make_nonce(ns));
          const auto ch = detail::auth::encode_challenge(ns);
          (void)co_await asio::async_write(sock, asio::buffer(ch), detail::use_tuple);
          detail::auth::response_msg resp{};
          (void)co_await asio::async_read(sock, asio::buffer(resp), detail::use_tuple);
          std::copy(resp.begin() + detail::auth::prefix_bytes,
                    resp.begin() + detail::auth::prefix_bytes + detail::auth::nonce_bytes,
                    nc.begin());
          const auto v = detail::auth::encode_verdict(secret_of('f'), ns, nc, true);
          (void)co_await asio::async_write(sock, asio::buffer(v), detail::use_tuple);
          std::array<std::byte, 1> more{};
          (void)co_await asio::async_read(sock, asio::buffer(more), detail::use_tuple);
        },
        asio::detached);
    auto [ec, c] = co_await client.async_connect(ep);
    CHECK(ec == errc::authentication_failed);
    CHECK(!c.is_open());

    // A listener that accepts and never speaks (a server without a secret): timeout.
    asio::ip::tcp::socket silent(io);
    fake.async_accept(silent, [](std::error_code) {});
    auto [tec, tc] = co_await client.async_connect(ep);
    CHECK(tec == errc::timeout);
    CHECK(!tc.is_open());
  });
}

TEST_CASE("auth: before authenticating, a peer costs a fixed handshake read and no buffer") {
  // Finding 8: frames announcing 64 MiB before authentication allocate nothing; idle
  // connections are closed after auth_timeout.
  asio::io_context io;
  tcp_options secured;
  secured.secret = secret_of('s');
  secured.auth_timeout = std::chrono::milliseconds(200);
  tcp_transport st(io.get_executor(), secured);
  std::vector<std::string> logs;
  server_options so;
  so.num_workers = 2;
  so.tables = {table_spec{0, 8, 4, 0.0f}};
  so.log = [&](std::string_view line) { logs.emplace_back(line); };
  test_server server(st, so, optimizer::sgd{1.0f});
  const auto ep = serve_on_loopback(io, st, server);
  const auto pool_before = st.pool().stats();
  const auto receive_before = st.receive_pool().stats();
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    frame_header big;
    big.type = message_type::push;
    big.flags = frame_flags::range;
    big.row_count = 1;
    big.width = 16u << 20;  // 64 MiB of floats
    big.payload_bytes = std::uint64_t{64} << 20;
    const auto hdr = encode(big, {}, false);
    const std::vector<std::byte> bytes(hdr.begin(), hdr.end());
    int closed = 0;
    for (int i = 0; i < 16; ++i)
      closed += (co_await raw_exchange(ep, bytes, false)).closed_by_server;
    CHECK(closed == 16);
    // Idle: connects and sends nothing (from another loopback address: the 16 refusals above
    // used up 127.0.0.1's log lines, detail::log_limiter).
    const auto before = logs.size();
    const auto idle = co_await raw_exchange(ep, {}, false, asio::ip::make_address("127.0.0.2"));
    CHECK(idle.closed_by_server);
    CHECK(any_line(logs, before, "timed out"));
    server.stop();
  });
  const auto pool_after = st.pool().stats();
  CHECK(pool_after.fresh_blocks == pool_before.fresh_blocks);
  CHECK(pool_after.reused_blocks == pool_before.reused_blocks);
  // Accepted connections receive into their own pool: nothing was allocated there either.
  CHECK(receive_before.fresh_blocks == 0);
  CHECK(st.receive_pool().stats().fresh_blocks == 0);
  CHECK(st.receive_pool().stats().reused_blocks == 0);
  CHECK(server.stats().rejected >= 17);
}

TEST_CASE("auth: an unauthenticated chain_hello never reaches the chain master") {
  // Finding 2: a fake registration would evict real members; it must not get through.
  asio::io_context io;
  tcp_options secured;
  secured.secret = secret_of('s');
  secured.auth_timeout = std::chrono::milliseconds(300);
  tcp_transport mt(io.get_executor(), secured);
  std::vector<std::string> logs;
  chain_master_options mo;
  mo.num_shards = 1;
  mo.members = 1;
  mo.heartbeat_timeout = std::chrono::seconds(10);
  mo.log = [&](std::string_view line) { logs.emplace_back(line); };
  basic_chain_master<tcp_transport> master(mt, mo);
  const auto ep = serve_on_loopback(io, mt, master);
  tcp_transport member_t(io.get_executor(), secured);
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    buffer_pool pool;
    message hello = protocol::encode(protocol::chain_hello{.shard = 0, .member = 7},
                                     [&](std::size_t n) { return pool.allocate(n); });
    frame_header h = hello.header;
    h.payload_bytes = hello.payload.size();
    const auto hdr = encode(h, hello.payload.bytes());
    std::vector<std::byte> raw(hdr.begin(), hdr.end());
    raw.insert(raw.end(), hello.payload.bytes().begin(), hello.payload.bytes().end());
    const auto r = co_await raw_exchange(ep, raw, false);
    CHECK(r.closed_by_server);
    CHECK(master.stats().registrations == 0);
    CHECK(!master.started());
    CHECK(any_line(logs, 0, "refused an unauthenticated connection (from 127.0.0.1:"));

    // A member holding the secret registers and gets its configuration.
    auto [ec, c] = co_await member_t.async_connect(ep);
    REQUIRE(!ec);
    auto& member = c;
    message real = protocol::encode(protocol::chain_hello{.shard = 0, .member = 0},
                                    [&](std::size_t n) { return member_t.allocate(n); });
    REQUIRE(!(co_await member.async_send(std::move(real))));
    auto [cec, config] = co_await member.async_receive();
    REQUIRE(!cec);
    CHECK(config.header.type == protocol::chain_config_type);
    CHECK(master.stats().registrations == 1);
    CHECK(master.chain(0) == std::vector<std::uint32_t>{0});
    member.close();
    master.stop();
  });
}

TEST_CASE("chain master: a connection that never registers is closed after register_timeout") {
  // Authenticated or on loopback, a peer that sends nothing must not hold a session forever.
  asio::io_context io;
  tcp_transport mt(io.get_executor());
  std::vector<std::string> logs;
  chain_master_options mo;
  mo.num_shards = 1;
  mo.members = 1;
  mo.heartbeat_timeout = std::chrono::milliseconds(100);
  mo.register_timeout = std::chrono::milliseconds(300);
  mo.log = [&](std::string_view line) { logs.emplace_back(line); };
  basic_chain_master<tcp_transport> master(mt, mo);
  const auto ep = serve_on_loopback(io, mt, master);
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    const auto start = std::chrono::steady_clock::now();
    const auto idle = co_await raw_exchange(ep, {}, false);  // connects, sends nothing
    const auto waited = std::chrono::steady_clock::now() - start;
    CHECK(idle.closed_by_server);
    CHECK(waited >= std::chrono::milliseconds(300));
    CHECK(master.stats().refused == 1);
    CHECK(any_line(logs, 0, "no chain_hello within 300 ms (register_timeout)"));
    CHECK(any_line(logs, 0, "(from 127.0.0.1:"));
    CHECK(master.stats().registrations == 0);
    master.stop();
  });
}

// ---------------------------------------------------------------------------------------------
// TLS (docs/security.md, "TLS"): mutual TLS on the TCP transport, before the secret's handshake.
// Certificates come from a throwaway CA made in the test (tests/support/test_pki.hpp).

namespace {

tcp_options tls_opts(const tls_options& tls, shared_secret secret = {}) {
  tcp_options o;
  o.tls = tls;
  o.secret = std::move(secret);
  o.auth_timeout = std::chrono::milliseconds(2000);
  return o;
}

// Waits (on the calling coroutine's executor) until `done()` or about `ms` milliseconds.
template <class Pred>
asio::awaitable<void> wait_for(Pred done, int ms = 3000) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  for (int i = 0; i < ms / 5 && !done(); ++i) {
    t.expires_after(std::chrono::milliseconds(5));
    co_await t.async_wait(detail::use_tuple);
  }
}

// A TCP relay between one client and `target` that records the client's bytes and can flip
// one of them (an on-path attacker). Runs on the executor of the coroutine that awaits run().
struct relay {
  explicit relay(asio::io_context& io, asio::ip::tcp::endpoint to)
      : acceptor(io, {asio::ip::make_address("127.0.0.1"), 0}), target(to), down(io), up(io) {}
  asio::ip::tcp::endpoint endpoint() const { return acceptor.local_endpoint(); }

  asio::awaitable<void> run() {
    auto [aec] = co_await acceptor.async_accept(down, detail::use_tuple);
    if (aec) co_return;
    auto [cec] = co_await up.async_connect(target, detail::use_tuple);
    if (cec) co_return;
    asio::co_spawn(co_await asio::this_coro::executor, pump(up, down, false), asio::detached);
    co_await pump(down, up, true);
  }
  asio::awaitable<void> pump(asio::ip::tcp::socket& from, asio::ip::tcp::socket& to,
                             bool from_client) {
    std::vector<std::byte> buf(16384);
    for (;;) {
      auto [ec, n] = co_await from.async_read_some(asio::buffer(buf), detail::use_tuple);
      std::error_code ignored;
      if (ec) {
        to.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
        co_return;
      }
      if (from_client) {
        if (flip_at >= client_bytes.size() && flip_at < client_bytes.size() + n)
          buf[flip_at - client_bytes.size()] ^= std::byte{0x01};
        client_bytes.insert(client_bytes.end(), buf.begin(), buf.begin() + n);
      }
      auto [wec, wn] =
          co_await asio::async_write(to, asio::buffer(buf.data(), n), detail::use_tuple);
      (void)wn;
      if (wec) {
        from.close(ignored);
        co_return;
      }
    }
  }
  bool client_sent(std::span<const std::byte> needle) const {
    return std::search(client_bytes.begin(), client_bytes.end(), needle.begin(), needle.end()) !=
           client_bytes.end();
  }

  asio::ip::tcp::acceptor acceptor;
  asio::ip::tcp::endpoint target;
  asio::ip::tcp::socket down, up;
  std::vector<std::byte> client_bytes;
  std::size_t flip_at = static_cast<std::size_t>(-1);
};

// Accepts one connection on `acc` and echoes every message back until the peer goes; `last`
// gets the receive error that ended it, `done` is set at the end.
asio::awaitable<void> echo_one(tcp_transport::acceptor& acc, std::error_code& last, bool& done) {
  auto [aec, conn] = co_await acc.async_accept();
  REQUIRE(!aec);
  for (;;) {
    auto [ec, m] = co_await conn.async_receive();
    if (ec) {
      last = ec;
      break;
    }
    if (co_await conn.async_send(std::move(m))) break;
  }
  done = true;
}

}  // namespace

TEST_CASE("tls: frames cross intact both ways, encrypted; the peer's close is connection_closed") {
  asio::io_context io;
  test::test_pki pki("frames");
  tcp_transport a(io.get_executor(), tls_opts(pki.issue("node-a")));
  tcp_transport b(io.get_executor(), tls_opts(pki.issue("node-b")));
  REQUIRE(a.uses_tls());
  REQUIRE(b.uses_tls());
  auto acc = b.listen({asio::ip::make_address("127.0.0.1"), 0});
  REQUIRE(acc.has_value());
  relay tap(io, acc.value().local_endpoint());  // records what crosses the wire
  std::error_code last;
  bool done = false;
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    asio::co_spawn(io, echo_one(acc.value(), last, done), asio::detached);
    asio::co_spawn(io, tap.run(), asio::detached);
    auto [ec, client] = co_await a.async_connect(tap.endpoint());
    REQUIRE(!ec);
    CHECK(client.uses_tls());
    // 0 B to 1.2 MB: frames of one TLS record and of many (records hold 16 KiB at most).
    const std::size_t sizes[] = {0, 1, 1000, 5000, 300000};
    std::uint64_t seq = 0;
    for (std::size_t floats : sizes) {
      CHECK(!(co_await client.async_send(make_message(a, seq, floats))));
      auto [rec, m] = co_await client.async_receive();
      REQUIRE(!rec);
      CHECK(m.header.type == message_type::push);
      CHECK(m.header.seq == seq);
      CHECK(m.header.sender == 7);
      CHECK(m.header.clock == 11);
      CHECK(m.payload.size() == floats * 4);
      bool same = true;
      for (std::size_t k = 0; k < m.payload.floats().size(); ++k)
        same = same && m.payload.floats()[k] == static_cast<float>(seq * 1000 + k);
      CHECK(same);
      ++seq;
    }
    client.close();
    co_await wait_for([&] { return done; });
  });
  CHECK(done);
  CHECK(last == errc::connection_closed);  // no close_notify: the TCP end reads as a close
  // Nothing of the frames is readable on the wire: no frame magic "APS1", no float pattern.
  REQUIRE(tap.client_bytes.size() > 1200000);
  const std::array<std::byte, 4> frame_magic{std::byte{'A'}, std::byte{'P'}, std::byte{'S'},
                                             std::byte{'1'}};
  CHECK(!tap.client_sent(frame_magic));
  const float pattern[] = {4000.0f + 100, 4000.0f + 101, 4000.0f + 102};
  CHECK(!tap.client_sent(std::as_bytes(std::span(pattern))));
}

TEST_CASE("tls: without TLS the same relay sees the frames (the wire check above is real)") {
  asio::io_context io;
  tcp_transport a(io.get_executor()), b(io.get_executor());
  auto acc = b.listen({asio::ip::make_address("127.0.0.1"), 0});
  REQUIRE(acc.has_value());
  relay tap(io, acc.value().local_endpoint());
  std::error_code last;
  bool done = false;
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    asio::co_spawn(io, echo_one(acc.value(), last, done), asio::detached);
    asio::co_spawn(io, tap.run(), asio::detached);
    auto [ec, client] = co_await a.async_connect(tap.endpoint());
    REQUIRE(!ec);
    CHECK(!client.uses_tls());
    CHECK(!(co_await client.async_send(make_message(a, 4, 300))));
    auto [rec, m] = co_await client.async_receive();
    CHECK(!rec);
    client.close();
    co_await wait_for([&] { return done; });
  });
  const std::array<std::byte, 4> frame_magic{std::byte{'A'}, std::byte{'P'}, std::byte{'S'},
                                             std::byte{'1'}};
  CHECK(tap.client_sent(frame_magic));
  const float pattern[] = {4000.0f + 100, 4000.0f + 101, 4000.0f + 102};
  CHECK(tap.client_sent(std::as_bytes(std::span(pattern))));
}

TEST_CASE("tls: a byte changed on the wire is detected, the frame is never delivered") {
  asio::io_context io;
  test::test_pki pki("tamper");
  tcp_transport a(io.get_executor(), tls_opts(pki.issue("node-a")));
  tcp_transport b(io.get_executor(), tls_opts(pki.issue("node-b")));
  auto acc = b.listen({asio::ip::make_address("127.0.0.1"), 0});
  REQUIRE(acc.has_value());
  relay tap(io, acc.value().local_endpoint());
  tap.flip_at = 60000;  // inside the 1.2 MB frame, long after the handshake
  std::error_code last;
  bool done = false;
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    asio::co_spawn(io, echo_one(acc.value(), last, done), asio::detached);
    asio::co_spawn(io, tap.run(), asio::detached);
    auto [ec, client] = co_await a.async_connect(tap.endpoint());
    REQUIRE(!ec);
    (void)co_await client.async_send(make_message(a, 1, 300000));
    auto [rec, m] = co_await client.async_receive();
    CHECK(rec);  // the listener closed instead of echoing
    co_await wait_for([&] { return done; });
  });
  CHECK(done);
  INFO(last.message());
  CHECK(last == condition::protocol_violation);
  CHECK(std::string_view(last.category().name()) == "asio.ssl");
}

TEST_CASE("tls: with a secret too, the secret's handshake runs inside TLS") {
  asio::io_context io;
  test::test_pki pki("secret");
  tcp_transport st(io.get_executor(), tls_opts(pki.issue("server"), secret_of('s')));
  std::vector<std::string> logs;
  server_options so;
  so.num_workers = 2;
  so.tables = {table_spec{0, 8, 4, 0.0f}};
  so.log = [&](std::string_view line) { logs.emplace_back(line); };
  test_server server(st, so, optimizer::sgd{1.0f});
  const auto ep = serve_on_loopback(io, st, server);
  tcp_transport good_t(io.get_executor(), tls_opts(pki.issue("worker-0"), secret_of('s')));
  tcp_transport wrong_t(io.get_executor(), tls_opts(pki.issue("worker-1"), secret_of('w')));
  tcp_transport no_tls_t(io.get_executor(), [] {
    tcp_options o;
    o.secret = secret_of('s');
    o.auth_timeout = std::chrono::milliseconds(300);
    return o;
  }());
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    auto [ec, good] = co_await good_t.async_connect(ep);
    REQUIRE(!ec);
    co_await handshake(good_t, good, 0, 8, 4);
    co_await acked_push(good_t, good, 0, -1.0f);
    // A valid certificate but the wrong secret: TLS passes, the secret's handshake refuses.
    auto before = logs.size();
    auto [wec, wc] = co_await wrong_t.async_connect(ep);
    CHECK(wec == errc::authentication_failed);
    CHECK(!wc.is_open());
    co_await wait_for([&] { return any_line(logs, before, "authentication failed"); });
    CHECK(any_line(logs, before, "refused an unauthenticated connection (from 127.0.0.1:"));
    // The secret without TLS: the listener waits for a TLS hello, the client for a challenge.
    auto [nec, nc] = co_await no_tls_t.async_connect(ep);
    CHECK(nec);
    CHECK(!nc.is_open());
    co_await acked_push(good_t, good, 0, -1.0f);
    bool twice = true;
    for (float v : server.values(0)) twice = twice && v == 2.0f;
    CHECK(twice);
    good.close();
    server.stop();
  });
}

TEST_CASE("tls: a client without TLS is refused with a named error; the listener serves others") {
  asio::io_context io;
  test::test_pki pki("plain");
  tcp_transport st(io.get_executor(), tls_opts(pki.issue("server")));
  std::vector<std::string> logs;
  server_options so;
  so.num_workers = 4;
  so.tables = {table_spec{0, 8, 4, 0.0f}};
  so.log = [&](std::string_view line) { logs.emplace_back(line); };
  test_server server(st, so, optimizer::sgd{1.0f});
  const auto ep = serve_on_loopback(io, st, server);
  tcp_transport plain_t(io.get_executor());
  tcp_transport good_t(io.get_executor(), tls_opts(pki.issue("worker")));
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    auto [ec, plain] = co_await plain_t.async_connect(ep);  // plain TCP: nothing to check yet
    REQUIRE(!ec);
    message hello = protocol::encode(
        protocol::hello{.worker = 1,
                        .clock = 0,
                        .fingerprint = policy_fingerprint<consistency::ssp<1>, recovery::none>(),
                        .layout = {{8, 4}}},
        [&](std::size_t n) { return plain_t.allocate(n); });
    (void)co_await plain.async_send(std::move(hello));
    auto [rec, reply] = co_await plain.async_receive();
    const std::string why = rec.message();  // clang 14: INFO cannot capture a binding
    INFO(why);
    CHECK(rec == errc::authentication_required);
    CHECK(why.find("TLS") != std::string::npos);
    co_await wait_for([&] { return any_line(logs, 0, "TLS handshake failed"); });
    CHECK(any_line(logs, 0, "refused an unauthenticated connection (from 127.0.0.1:"));
    CHECK(any_line(logs, 0, "(TLS: the peer does not speak TLS)"));
    CHECK(server.workers_seen() == 0);

    auto [gec, good] = co_await good_t.async_connect(ep);
    REQUIRE(!gec);
    co_await handshake(good_t, good, 0, 8, 4);
    co_await acked_push(good_t, good, 0, -1.0f);
    CHECK(server.values(0)[0] == 1.0f);
    CHECK(server.stats().rejected >= 1);
    good.close();
    server.stop();
  });

  // The other way round: a TLS client and a listener without TLS.
  tcp_transport plain_listener(io.get_executor());
  auto pacc = plain_listener.listen({asio::ip::make_address("127.0.0.1"), 0});
  REQUIRE(pacc.has_value());
  std::error_code last;
  bool done = false;
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    asio::co_spawn(io, echo_one(pacc.value(), last, done), asio::detached);
    auto [ec, c] = co_await good_t.async_connect(pacc.value().local_endpoint());
    // This listener hangs up without a word (a real server first sends an error frame, which
    // OpenSSL refuses: tls_handshake_failed). A silent hang-up may be a listener that died
    // mid-handshake, so it is connection_closed: not final, a worker retries.
    CHECK(ec == errc::connection_closed);
    CHECK(!is_final_connect_error(ec));
    CHECK(!c.is_open());
    co_await wait_for([&] { return done; });
  });
  CHECK(last == errc::authentication_required);  // the listener saw a TLS record, not a frame
}

TEST_CASE("tls: certificates of another CA are refused, both ways") {
  asio::io_context io;
  test::test_pki pki("cluster");
  test::test_pki rogue_pki("rogue");
  tcp_transport st(io.get_executor(), tls_opts(pki.issue("server")));
  std::vector<std::string> logs;
  server_options so;
  so.num_workers = 4;
  so.tables = {table_spec{0, 8, 4, 0.0f}};
  so.log = [&](std::string_view line) { logs.emplace_back(line); };
  test_server server(st, so, optimizer::sgd{1.0f});
  const auto ep = serve_on_loopback(io, st, server);
  // A client whose certificate the rogue CA signed (it trusts the cluster's CA itself).
  tls_options rogue = rogue_pki.issue("intruder");
  rogue.ca_file = pki.ca_file().string();
  tcp_transport rogue_t(io.get_executor(), tls_opts(rogue));
  // A client that trusts only the rogue CA: it refuses the real server.
  tcp_transport doubting_t(io.get_executor(), tls_opts(rogue_pki.issue("doubter")));
  tcp_transport good_t(io.get_executor(), tls_opts(pki.issue("worker")));
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    auto [rec, rc] = co_await rogue_t.async_connect(ep);
    CHECK(rec == errc::tls_handshake_failed);
    CHECK(!rc.is_open());
    CHECK(!rc.tls_failure().empty());  // OpenSSL's alert, e.g. "tlsv1 alert unknown ca"
    co_await wait_for([&] { return any_line(logs, 0, "certificate verify failed"); });
    CHECK(any_line(logs, 0, "refused an unauthenticated connection (from 127.0.0.1:"));
    CHECK(any_line(logs, 0, "TLS handshake failed"));

    auto [dec, dc] = co_await doubting_t.async_connect(ep);
    CHECK(dec == errc::tls_handshake_failed);
    CHECK(dc.tls_failure() == "certificate verify failed");

    auto [gec, good] = co_await good_t.async_connect(ep);
    REQUIRE(!gec);
    co_await handshake(good_t, good, 0, 8, 4);
    co_await acked_push(good_t, good, 0, -1.0f);
    CHECK(server.values(0)[0] == 1.0f);
    CHECK(server.workers_seen() == 1);
    good.close();
    server.stop();
  });
}

TEST_CASE("tls: missing, garbled or mismatched files fail listen and connect, naming the file") {
  asio::io_context io;
  test::test_pki pki("files");
  const tls_options a = pki.issue("node-a");
  const tls_options b = pki.issue("node-b");
  const auto garbled = (pki.dir() / "garbled.pem").string();
  std::ofstream(garbled) << "-----BEGIN CERTIFICATE-----\nnot base64 at all\n";
  const asio::ip::tcp::endpoint lo{asio::ip::make_address("127.0.0.1"), 0};

  struct bad_case {
    const char* what;
    tls_options tls;
    std::string expect;  // in tls_setup_error()
  };
  std::vector<bad_case> cases;
  tls_options t = a;
  t.certificate_file = (pki.dir() / "missing.pem").string();
  cases.push_back({"missing certificate", t, "certificate file '" + t.certificate_file + "'"});
  t = a;
  t.certificate_file = garbled;
  cases.push_back({"garbled certificate", t, "certificate file '" + garbled + "'"});
  t = a;
  t.private_key_file = (pki.dir() / "missing.key").string();
  cases.push_back({"missing key", t, "private key file '" + t.private_key_file + "'"});
  t = a;
  t.private_key_file = b.private_key_file;  // node-b's key with node-a's certificate
  cases.push_back({"mismatched key", t, "private key file '" + b.private_key_file + "'"});
  t = a;
  t.ca_file = garbled;
  cases.push_back({"garbled CA", t, "CA file '" + garbled + "'"});
  t = a;
  t.ca_file.clear();
  cases.push_back({"no CA", t, "needs a CA file"});
  t = a;
  t.certificate_file.clear();
  cases.push_back({"no certificate", t, "needs a certificate file"});

  for (const auto& c : cases) {
    INFO(c.what);
    tcp_transport bad(io.get_executor(), tls_opts(c.tls));
    CHECK(!bad.uses_tls());
    INFO(bad.tls_setup_error());
    CHECK(bad.tls_setup_error().find(c.expect) != std::string::npos);
    auto l = bad.listen(lo);
    REQUIRE(!l);
    CHECK(l.error() == errc::tls_setup_failed);
    CHECK(l.error() == condition::fatal);
    std::string why;
    CHECK(make_tls_context(c.tls, why).error() == errc::tls_setup_failed);
    CHECK(why == bad.tls_setup_error());
    test::run_coro(io, [&]() -> asio::awaitable<void> {
      auto [ec, conn] = co_await bad.async_connect(lo);
      CHECK(ec == errc::tls_setup_failed);
      CHECK(!conn.is_open());
    });
  }
  tcp_transport missing(io.get_executor(), tls_opts(cases[0].tls));
  CHECK(missing.tls_setup_error().find("No such file or directory") != std::string::npos);

  // Good files: TLS that verifies peers authenticates them, so listening beyond loopback is
  // allowed without a secret; without verification it is not.
  tcp_transport good(io.get_executor(), tls_opts(a));
  CHECK(good.tls_setup_error().empty());
  CHECK(good.listen({asio::ip::make_address("0.0.0.0"), 0}).has_value());
  tls_options unverified = a;
  unverified.verify_peer = false;
  tcp_transport lax(io.get_executor(), tls_opts(unverified));
  REQUIRE(lax.uses_tls());
  CHECK(lax.listen({asio::ip::make_address("0.0.0.0"), 0}).error() ==
        errc::authentication_required);
}

TEST_CASE("tls: a server and two workers train over TLS, every push counted exactly") {
  asio::io_context io(1);
  test::test_pki pki("training");
  tcp_transport st(io.get_executor(), tls_opts(pki.issue("server")));
  server_options so;
  so.num_workers = 2;
  so.tables = {table_spec{0, 2, 4, 0.0f}};
  so.log = [](std::string_view) {};
  test_server server(st, so, optimizer::sgd{1.0f});
  const auto ep = serve_on_loopback(io, st, server);
  using worker_t = basic_worker<test::counter_model, tcp_transport, consistency::ssp<1>>;
  std::vector<std::unique_ptr<tcp_transport>> ts;
  std::vector<test::counter_model> models;
  std::vector<std::unique_ptr<worker_t>> ws;
  for (std::uint32_t id = 0; id < 2; ++id) {
    ts.push_back(std::make_unique<tcp_transport>(
        io.get_executor(), tls_opts(pki.issue("worker-" + std::to_string(id)))));
    models.emplace_back(id, 2, 1);
  }
  for (std::uint32_t id = 0; id < 2; ++id) {
    worker_options<asio::ip::tcp::endpoint> o;
    o.id = id;
    o.servers = {ep};
    o.wait_timeout = std::chrono::seconds(10);
    o.log = [](std::string_view) {};
    ws.push_back(std::make_unique<worker_t>(*ts[id], models[id], o));
  }
  std::error_code errors[2];
  int done = 0;
  for (std::size_t i = 0; i < 2; ++i) {
    asio::co_spawn(
        io,
        [&, i]() -> asio::awaitable<void> {
          errors[i] = co_await ws[i]->async_run(30);
          if (++done == 2) server.stop();
        },
        asio::detached);
  }
  io.run_for(std::chrono::seconds(60));
  REQUIRE(done == 2);
  CHECK(!errors[0]);
  CHECK(!errors[1]);
  const auto v = server.values(0);
  bool exact = true;
  for (std::size_t i = 0; i < v.size(); ++i) exact = exact && v[i] == 30.0f;  // 30 pushes each
  CHECK(exact);
  CHECK(models[0].bound_violations + models[1].bound_violations == 0);
  CHECK(models[0].own_write_violations + models[1].own_write_violations == 0);
}

TEST_CASE("auth: a worker refused for its secret gives up at once instead of retrying") {
  // A wrong secret fails the same way on every retry: the worker must not hammer the server
  // for `connect_timeout` (each try costs the server a handshake and a log line).
  asio::io_context io(1);
  tcp_options secured;
  secured.secret = secret_of('s');
  tcp_transport st(io.get_executor(), secured);
  server_options so;
  so.num_workers = 1;
  so.tables = {table_spec{0, 2, 4, 0.0f}};
  so.log = [](std::string_view) {};
  test_server server(st, so, optimizer::sgd{1.0f});
  const auto ep = serve_on_loopback(io, st, server);
  tcp_options wrong;
  wrong.secret = secret_of('w');
  tcp_transport wt(io.get_executor(), wrong);
  test::counter_model model(0, 2, 1);
  worker_options<asio::ip::tcp::endpoint> o;
  o.id = 0;
  o.servers = {ep};
  o.connect_timeout = std::chrono::seconds(3);  // retrying would try about 8 times in it
  std::vector<std::string> logs;
  o.log = [&](std::string_view line) { logs.emplace_back(line); };
  basic_worker<test::counter_model, tcp_transport, consistency::ssp<1>> w(wt, model, o);
  std::error_code result;
  bool done = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        result = co_await w.async_run(5);
        done = true;
        server.stop();
      },
      asio::detached);
  io.run_for(std::chrono::seconds(30));
  REQUIRE(done);
  CHECK(result == errc::authentication_failed);
  CHECK(server.stats().rejected == 1);  // one try, refused once
  CHECK(any_line(logs, 0, "cannot connect to"));
  CHECK(!any_line(logs, 0, "retrying"));
  CHECK(is_final_connect_error(make_error_code(errc::tls_handshake_failed)));
  CHECK(!is_final_connect_error(make_error_code(errc::connection_closed)));
  CHECK(!is_final_connect_error(make_error_code(errc::timeout)));
}

TEST_CASE("tcp: frames on accepted connections wait for max_receive_bytes, then arrive whole") {
  // Many peers sending big frames together cannot make a listener hold more than its budget:
  // the second 1 MiB frame waits, unread, until the first one is freed.
  asio::io_context io;
  const tcp_options bounded{.limits = {.max_frame_bytes = 1 << 20},
                            .max_receive_bytes = std::uint64_t{1} << 20};
  tcp_transport client_side(io.get_executor(), bounded);
  tcp_transport listener(io.get_executor(),
                         tcp_options{.limits = {.max_frame_bytes = 1 << 20},
                                     .max_receive_bytes = std::uint64_t{1} << 20});
  auto acc = listener.listen({asio::ip::make_address("127.0.0.1"), 0});
  REQUIRE(acc.has_value());
  const auto ep = acc.value().local_endpoint();
  constexpr std::size_t floats = (1 << 20) / 4;  // exactly the budget
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    auto [e1, c1] = co_await client_side.async_connect(ep);
    REQUIRE(!e1);
    auto [a1, s1] = co_await acc.value().async_accept();
    REQUIRE(!a1);
    auto [e2, c2] = co_await client_side.async_connect(ep);
    REQUIRE(!e2);
    auto [a2, accepted2] = co_await acc.value().async_accept();
    REQUIRE(!a2);
    auto& s2 = accepted2;  // a reference, so that the lambda below may capture it (clang 14)
    CHECK(!(co_await c1.async_send(make_message(client_side, 1, floats))));
    auto [r1, m1] = co_await s1.async_receive();
    REQUIRE(!r1);
    CHECK(listener.receive_pool().lent_bytes() == std::size_t{1} << 20);
    // A second big frame on another connection: it must wait while m1 is held.
    CHECK(!(co_await c2.async_send(make_message(client_side, 2, floats))));
    bool second = false;
    message m2;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          auto [r2, m] = co_await s2.async_receive();
          CHECK(!r2);
          m2 = std::move(m);
          second = true;
        },
        asio::detached);
    // Small frames neither wait nor count: a 1 KiB frame on the first connection arrives.
    CHECK(!(co_await c1.async_send(make_message(client_side, 3, 256))));
    auto [r3, m3] = co_await s1.async_receive();
    CHECK(!r3);
    CHECK(m3.header.seq == 3);
    asio::steady_timer t(io);
    t.expires_after(std::chrono::milliseconds(100));
    co_await t.async_wait(detail::use_tuple);
    CHECK_FALSE(second);
    CHECK(listener.receive_waits() == 1);
    CHECK(listener.receive_pool().lent_bytes() + listener.receive_pool().cached_bytes() <=
          std::size_t{1} << 20);
    m1 = message{};  // frees the first frame's buffer
    for (int k = 0; k < 200 && !second; ++k) {
      t.expires_after(std::chrono::milliseconds(5));
      co_await t.async_wait(detail::use_tuple);
    }
    REQUIRE(second);
    CHECK(m2.header.seq == 2);
    REQUIRE(m2.payload.floats().size() == floats);
    CHECK(m2.payload.floats()[floats - 1] == static_cast<float>(2 * 1000 + floats - 1));
    // Connections a node made are not bounded: two 1 MiB frames held at once never wait.
    CHECK(!(co_await s1.async_send(make_message(listener, 4, floats))));
    CHECK(!(co_await s1.async_send(make_message(listener, 5, floats))));
    auto [r4, m4] = co_await c1.async_receive();
    auto [r5, m5] = co_await c1.async_receive();
    CHECK(!r4);
    CHECK(!r5);
    CHECK(m5.header.seq == 5);
    CHECK(client_side.receive_waits() == 0);
  });
}

TEST_CASE("tcp: socket buffer sizes are set on both ends; sizes above the maximum are refused; "
          "receive_wakeup_bytes reads large frames whole") {
  asio::io_context io;
  // The defaults leave the sizes to the kernel (docs/performance.md, "Socket buffers").
  CHECK(tcp_options{}.send_buffer_bytes == 0);
  CHECK(tcp_options{}.receive_buffer_bytes == 0);
  CHECK(tcp_options{}.receive_wakeup_bytes == 0);
  // 128 KiB is below every Linux default of net.core.wmem_max / rmem_max (208 KiB), so the
  // kernel keeps it (and doubles it for its bookkeeping).
  constexpr std::size_t snd = std::size_t{128} << 10;
  constexpr std::size_t rcv = std::size_t{96} << 10;
  tcp_options sized;
  sized.send_buffer_bytes = snd;
  sized.receive_buffer_bytes = rcv;
  // More than half the receive buffer: the kernel caps SO_RCVLOWAT there, and the frame must
  // still arrive (no reader waits for bytes that cannot be buffered).
  sized.receive_wakeup_bytes = std::size_t{256} << 10;
  tcp_transport listener(io.get_executor(), sized);
  tcp_transport connector(io.get_executor(), sized);
  auto acc = listener.listen({asio::ip::make_address("127.0.0.1"), 0});
  REQUIRE(acc.has_value());
  const auto ep = acc.value().local_endpoint();
  const auto sizes_of = [](tcp_transport::connection& c) {
    asio::socket_base::send_buffer_size s;
    asio::socket_base::receive_buffer_size r;
    std::error_code ec1, ec2;
    c.socket().get_option(s, ec1);
    c.socket().get_option(r, ec2);
    CHECK(!ec1);
    CHECK(!ec2);
    return std::pair{static_cast<std::size_t>(s.value()), static_cast<std::size_t>(r.value())};
  };
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    auto [ce, c] = co_await connector.async_connect(ep);
    REQUIRE(!ce);
    auto [ae, a] = co_await acc.value().async_accept();
    REQUIRE(!ae);
    for (auto* conn : {&c, &a}) {
      const auto [s, r] = sizes_of(*conn);
      CHECK(s >= snd);
      CHECK(r >= rcv);
      // Set, not autotuned: Linux reports twice the value asked for.
      CHECK(s <= 2 * snd);
      CHECK(r <= 2 * rcv);
    }
    // A frame larger than both buffers still crosses whole (sent while it is read: neither
    // buffer holds it).
    auto& sender = c;  // a reference, so that the lambda below may capture it (clang 14)
    bool sent = false;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          CHECK(!(
              co_await sender.async_send(make_message(connector, 1, (std::size_t{1} << 20) / 4))));
          sent = true;
        },
        asio::detached);
    auto [re, m] = co_await a.async_receive();
    REQUIRE(!re);
    asio::steady_timer t(io);  // the send's completion may run after the receive's
    for (int k = 0; k < 1000 && !sent; ++k) {
      t.expires_after(std::chrono::milliseconds(1));
      co_await t.async_wait(detail::use_tuple);
    }
    CHECK(sent);
    CHECK(m.payload.floats()[(1 << 18) - 1] == static_cast<float>(1000 + (1 << 18) - 1));
    // SO_RCVLOWAT is back to 1 after a large payload: small frames are read as they come.
    asio::socket_base::receive_low_watermark lowat;
    a.socket().get_option(lowat);
    CHECK(lowat.value() == 1);
    CHECK(!(co_await a.async_send(make_message(listener, 2, 16))));
    auto [se, small] = co_await c.async_receive();
    REQUIRE(!se);
    CHECK(small.header.seq == 2);
    // Payloads of every remainder past a wake-up step (not a multiple of it) arrive whole.
    tcp_options stepped;
    stepped.receive_wakeup_bytes = std::size_t{64} << 10;
    tcp_transport stepped_listener(io.get_executor(), stepped);
    auto acc2 = stepped_listener.listen({asio::ip::make_address("127.0.0.1"), 0});
    REQUIRE(acc2.has_value());
    auto [ce2, c2] = co_await connector.async_connect(acc2.value().local_endpoint());
    REQUIRE(!ce2);
    auto [ae2, a2] = co_await acc2.value().async_accept();
    REQUIRE(!ae2);
    auto& sender2 = c2;
    std::size_t arrived = 0;
    bool sent2 = false;
    const std::array<std::size_t, 4> floats{(std::size_t{1} << 20) / 4 + 3, 70000, 16384 + 1,
                                            (std::size_t{3} << 20) / 4};
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          for (std::size_t k = 0; k < floats.size(); ++k)
            CHECK(!(co_await sender2.async_send(make_message(connector, 10 + k, floats[k]))));
          sent2 = true;
        },
        asio::detached);
    for (std::size_t k = 0; k < floats.size(); ++k) {
      auto [e, f] = co_await a2.async_receive();
      REQUIRE(!e);
      CHECK(f.header.seq == 10 + k);
      REQUIRE(f.payload.floats().size() == floats[k]);
      CHECK(f.payload.floats()[floats[k] - 1] ==
            static_cast<float>((10 + k) * 1000 + floats[k] - 1));
      ++arrived;
    }
    CHECK(arrived == floats.size());
    for (int k = 0; k < 1000 && !sent2; ++k) {
      t.expires_after(std::chrono::milliseconds(1));
      co_await t.async_wait(detail::use_tuple);
    }
    CHECK(sent2);
    a2.socket().get_option(lowat);
    CHECK(lowat.value() == 1);
  });

  // Above the documented maximum: refused by listen and by async_connect, before any socket.
  for (int which = 0; which < 3; ++which) {
    tcp_options bad;
    (which == 0   ? bad.send_buffer_bytes
     : which == 1 ? bad.receive_buffer_bytes
                  : bad.receive_wakeup_bytes) = tcp_options::max_socket_buffer_bytes + 1;
    tcp_transport t(io.get_executor(), bad);
    auto l = t.listen({asio::ip::make_address("127.0.0.1"), 0});
    REQUIRE_FALSE(l.has_value());
    CHECK(l.error() == make_error_code(errc::invalid_argument));
    test::run_coro(io, [&]() -> asio::awaitable<void> {
      auto [e, c] = co_await t.async_connect(ep);
      CHECK(e == make_error_code(errc::invalid_argument));
      CHECK_FALSE(c.is_open());
    });
  }
  // The maximum itself is accepted (the kernel caps it at net.core.wmem_max / rmem_max).
  tcp_options largest;
  largest.send_buffer_bytes = tcp_options::max_socket_buffer_bytes;
  largest.receive_buffer_bytes = tcp_options::max_socket_buffer_bytes;
  tcp_transport big(io.get_executor(), largest);
  CHECK(big.listen({asio::ip::make_address("127.0.0.1"), 0}).has_value());
}

TEST_CASE("tcp: checksum_payloads off checks the header only; state transfers stay checked") {
  asio::io_context io;
  CHECK_FALSE(tcp_options{}.checksum_payloads);  // the default (docs/performance.md, Checksum)
  tcp_transport sender(io.get_executor(), tcp_options{.checksum_payloads = false});
  tcp_transport listener(io.get_executor(), tcp_options{.checksum_payloads = true});
  auto acc = listener.listen({asio::ip::make_address("127.0.0.1"), 0});
  REQUIRE(acc.has_value());
  const auto ep = acc.value().local_endpoint();
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    auto [ec, c] = co_await sender.async_connect(ep);
    REQUIRE(!ec);
    auto [aec, s] = co_await acc.value().async_accept();
    REQUIRE(!aec);
    CHECK(!(co_await c.async_send(make_message(sender, 1, 1000))));
    auto [r1, m1] = co_await s.async_receive();
    REQUIRE(!r1);
    CHECK(m1.header.has(frame_flags::payload_unchecked));
    CHECK(m1.payload.floats()[999] == 1999.0f);
    // A policy's message (here a state transfer) is checksummed whole whatever the option says.
    message st;
    st.header.type = policy_message(2);
    st.payload = sender.allocate(64);
    std::memset(st.payload.data(), 7, 64);
    CHECK(!(co_await c.async_send(std::move(st))));
    auto [r2, m2] = co_await s.async_receive();
    REQUIRE(!r2);
    CHECK(m2.header.type == policy_message(2));
    CHECK_FALSE(m2.header.has(frame_flags::payload_unchecked));
    // So is an ack carrying the policy's bytes (replica_log's apply-first order; version 7):
    // sent with payload_unchecked, the receiver would refuse it (bad_flags).
    message oa;
    oa.header.type = message_type::ack;
    oa.header.flags = frame_flags::policy;
    oa.header.seq = 5;
    oa.payload = sender.allocate(24);
    std::memset(oa.payload.data(), 3, 24);
    CHECK(!(co_await c.async_send(std::move(oa))));
    auto [r4, m4] = co_await s.async_receive();
    REQUIRE(!r4);
    CHECK(m4.header.type == message_type::ack);
    CHECK(m4.header.seq == 5);
    CHECK(m4.payload.size() == 24);
    CHECK_FALSE(m4.header.has(frame_flags::payload_unchecked));
    // The listener's own replies are checksummed whole (its option is on).
    CHECK(!(co_await s.async_send(make_message(listener, 3, 10))));
    auto [r3, m3] = co_await c.async_receive();
    REQUIRE(!r3);
    CHECK_FALSE(m3.header.has(frame_flags::payload_unchecked));
  });

  // On the wire: with payload_unchecked, a changed header byte is refused before any payload
  // buffer is taken; a changed payload byte is not seen (TCP's and the link's checks remain).
  const auto raw_frame = [](bool unchecked, bool spoil_header, bool spoil_payload) {
    frame_header h;
    h.type = message_type::push;
    h.flags = static_cast<std::uint8_t>(frame_flags::range |
                                        (unchecked ? frame_flags::payload_unchecked : 0));
    h.row_count = 1024;  // 4 KiB
    h.width = 1;
    h.payload_bytes = 4096;
    std::vector<std::byte> payload(4096, std::byte{1});
    std::array<std::byte, header_size> hdr{};
    encode_header(h, hdr, unchecked ? std::span<const std::byte>{} : payload, true);
    if (spoil_header) hdr[24] ^= std::byte{1};  // seq
    if (spoil_payload) payload[100] ^= std::byte{1};
    std::vector<std::byte> out(hdr.begin(), hdr.end());
    out.insert(out.end(), payload.begin(), payload.end());
    return out;
  };
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    struct outcome {
      std::error_code ec;
      std::uint64_t pool_blocks;
    };
    const auto send_raw = [&](std::vector<std::byte> bytes) -> asio::awaitable<outcome> {
      asio::ip::tcp::socket raw(io);
      auto [cec] = co_await raw.async_connect(ep, detail::use_tuple);
      REQUIRE(!cec);
      auto [aec, s] = co_await acc.value().async_accept();
      REQUIRE(!aec);
      const auto before = listener.pool().stats();
      auto [wec, n] = co_await asio::async_write(raw, asio::buffer(bytes), detail::use_tuple);
      (void)n;
      REQUIRE(!wec);
      auto [rec, m] = co_await s.async_receive();
      const auto after = listener.pool().stats();
      co_return outcome{rec, (after.fresh_blocks + after.reused_blocks) -
                                 (before.fresh_blocks + before.reused_blocks)};
    };
    const auto header_spoiled = co_await send_raw(raw_frame(true, true, false));
    CHECK(header_spoiled.ec == errc::bad_checksum);
    CHECK(header_spoiled.pool_blocks == 0);  // refused before the payload was read
    CHECK(!(co_await send_raw(raw_frame(true, false, true))).ec);
    CHECK((co_await send_raw(raw_frame(false, false, true))).ec == errc::bad_checksum);
    CHECK((co_await send_raw(raw_frame(false, true, false))).ec == errc::bad_checksum);
    CHECK(!(co_await send_raw(raw_frame(false, false, false))).ec);
  });
}

TEST_CASE("tcp server: pooled receive buffers go back to the heap every pool_trim_interval") {
  // Issue 32: after a burst (an attack's frames, a one-off large push) a server's pools kept
  // what they had held until the process ended. The trimmer gives it back within two
  // intervals; with the interval 0 the 4 MiB frame's block stays cached.
  for (const bool trim : {true, false}) {
    CAPTURE(trim);
    asio::io_context io;
    tcp_transport st(io.get_executor());
    server_options so;
    so.num_workers = 2;
    so.tables = {table_spec{0, 1024, 1024, 0.0f}};  // 4 MiB
    so.log = [](std::string_view) {};
    so.pool_trim_interval = std::chrono::milliseconds(trim ? 20 : 0);
    test_server server(st, so, optimizer::sgd{1.0f});
    const auto ep = serve_on_loopback(io, st, server);
    test::run_coro(io, [&]() -> asio::awaitable<void> {
      // Worker 0's hello and one push of the whole table, then its end of the connection.
      const auto r = co_await raw_exchange(
          ep, concat(hello_frame(0, 1024, 1024), push_frame(0, 0, 0, 1024, 1024, 1.0f)), true);
      CHECK(r.closed_by_server);
      CHECK(server.stats().pushes == 1);
      asio::steady_timer t(io);
      t.expires_after(std::chrono::milliseconds(150));  // 7 intervals
      co_await t.async_wait(detail::use_tuple);
      if (trim) {
        CHECK(st.receive_pool().cached_bytes() == 0);
        CHECK(st.receive_pool().stats().returned_bytes >= std::size_t{4} << 20);
      } else {
        CHECK(st.receive_pool().cached_bytes() >= std::size_t{4} << 20);
        CHECK(st.receive_pool().stats().trims == 0);
      }
      server.stop();
    });
  }
}
