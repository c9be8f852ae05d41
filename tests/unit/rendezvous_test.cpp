// The rendezvous (asyncps/rendezvous.hpp): its four messages (bounds, refusals), and the
// service with its clients over the in-process transport and real TCP on loopback: servers
// announce (by index and "any"), lookups wait for the last shard and are then answered at
// once, re-announces replace addresses, worker ids are assigned in order, timeouts, malformed
// or oversized requests and unauthenticated peers are refused while others are served.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <doctest/doctest.h>

#include "asyncps/buffer.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/rendezvous.hpp"
#include "asyncps/secret.hpp"
#include "asyncps/transport/in_process.hpp"
#include "asyncps/transport/tcp.hpp"
#include "asyncps/wire.hpp"
#include "descriptor_flood.hpp"
#include "run_coro.hpp"

using namespace asyncps;
using namespace std::chrono_literals;

namespace {

using lines = std::vector<std::string>;

bool any_line(const lines& ls, std::string_view what) {
  for (const auto& l : ls)
    if (l.find(what) != std::string::npos) return true;
  return false;
}

std::string joined(const lines& ls) {
  std::string out;
  for (const auto& l : ls) out += l + "\n";
  return out;
}

// Waits until `done()`, polling every 2 ms, for at most about `ms` milliseconds.
template <class Pred>
asio::awaitable<void> wait_until(Pred done, int ms = 5000) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  for (int i = 0; i < ms / 2 && !done(); ++i) {
    t.expires_after(2ms);
    co_await t.async_wait(detail::use_tuple);
  }
}

shared_secret secret_of(char fill) {
  std::array<std::byte, 32> b{};
  b.fill(static_cast<std::byte>(fill));
  return shared_secret(b);
}

buffer_pool& test_pool() {
  static buffer_pool pool;
  return pool;
}
buffer alloc(std::size_t n) { return test_pool().allocate(n); }

// A received frame as the transport would hand it over (payload_bytes set).
message framed(message m) {
  m.header.payload_bytes = m.payload.size();
  return m;
}

// An announce whose host-length field and payload are written by hand.
message raw_announce(std::uint32_t shard, std::uint16_t port, std::uint16_t host_len,
                     std::string_view host_bytes) {
  message m;
  m.header.type = message_type::announce;
  m.header.sender = shard;
  m.payload = alloc(4 + host_bytes.size());
  detail::store_le(m.payload.data(), port);
  detail::store_le(m.payload.data() + 2, host_len);
  if (!host_bytes.empty()) std::memcpy(m.payload.data() + 4, host_bytes.data(), host_bytes.size());
  return framed(std::move(m));
}

// The two environments every service test runs in. `announce_host` is what a server
// announces as its host ("": let the rendezvous use the peer address), `published` what the
// directory then lists for it.
struct tcp_env {
  using transport_type = tcp_transport;
  static constexpr bool knows_peer = true;
  explicit tcp_env(tcp_options server_opts = {}, tcp_options client_opts = {})
      : rv_t(io.get_executor(), std::move(server_opts)),
        client_t(io.get_executor(), std::move(client_opts)) {}
  asio::io_context io;
  tcp_transport rv_t;
  tcp_transport client_t;
  asio::ip::tcp::endpoint root{};
  std::string announce_host = "";
  std::string published = "127.0.0.1";

  template <class Rv>
  void start(Rv& rv) {
    auto acc = rv_t.listen({asio::ip::make_address("127.0.0.1"), 0});
    REQUIRE(acc.has_value());
    root = acc.value().local_endpoint();
    asio::co_spawn(io, rv.async_serve(std::move(acc).value()), asio::detached);
  }
  asio::ip::tcp::endpoint nowhere() {
    asio::ip::tcp::acceptor tmp(io, {asio::ip::make_address("127.0.0.1"), 0});
    auto ep = tmp.local_endpoint();
    tmp.close();
    return ep;
  }
};

struct in_process_env {
  using transport_type = in_process_transport;
  static constexpr bool knows_peer = false;
  asio::io_context io;
  in_process_network net;
  in_process_transport rv_t{io.get_executor(), net};
  in_process_transport client_t{io.get_executor(), net};
  std::string root = "rendezvous";
  std::string announce_host = "node-a";
  std::string published = "node-a";

  template <class Rv>
  void start(Rv& rv) {
    auto acc = rv_t.listen(root);
    REQUIRE(acc.has_value());
    asio::co_spawn(io, rv.async_serve(std::move(acc).value()), asio::detached);
  }
  std::string nowhere() { return "nobody"; }
};

rendezvous_options options(std::uint32_t servers, std::uint32_t workers, lines& log) {
  rendezvous_options o;
  o.num_servers = servers;
  o.num_workers = workers;
  o.log = [&log](std::string_view l) { log.emplace_back(l); };
  return o;
}

log_function to(lines& log) {
  return [&log](std::string_view l) { log.emplace_back(l); };
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The messages

TEST_CASE("rendezvous messages: round trips, header bounds and refusals naming the field") {
  SUBCASE("announce") {
    message m = framed(protocol::encode(
        protocol::announce{.shard = 3, .port = 7001, .host = "fe80::1%eth0"}, alloc));
    CHECK(m.header.type == message_type::announce);
    CHECK(m.header.sender == 3);
    CHECK(!validate_header(m.header, wire_limits{}));
    protocol::announce a;
    std::string why;
    REQUIRE(!protocol::decode(m, a, why));
    CHECK(a.shard == 3);
    CHECK(a.port == 7001);
    CHECK(a.host == "fe80::1%eth0");

    // No host: the rendezvous uses the peer address.
    m = framed(protocol::encode(protocol::announce{.port = 9}, alloc));
    CHECK(m.payload.size() == announce_min_bytes);
    REQUIRE(!protocol::decode(m, a, why));
    CHECK(a.shard == protocol::any_id);
    CHECK(a.host.empty());

    // A host over 255 bytes: the header is refused before the payload is read.
    m = raw_announce(0, 7000, 256, std::string(256, 'a'));
    CHECK(validate_header(m.header, wire_limits{}) == errc::frame_too_large);
    m = raw_announce(0, 7000, 255, std::string(255, 'a'));
    CHECK(!validate_header(m.header, wire_limits{}));
    CHECK(!protocol::decode(m, a, why));
    message shorter;
    shorter.header.type = message_type::announce;
    shorter.header.payload_bytes = 3;
    CHECK(validate_header(shorter.header, wire_limits{}) == errc::payload_size_mismatch);

    // Payload decoding: length disagreeing with the bytes, port 0, characters outside hosts.
    why.clear();
    CHECK(protocol::decode(raw_announce(0, 7000, 10, "abcde"), a, why) == errc::unexpected_message);
    CHECK(why.find("10-byte host has 9 payload bytes") != std::string::npos);
    why.clear();
    CHECK(protocol::decode(raw_announce(0, 0, 4, "host"), a, why) == errc::unexpected_message);
    CHECK(why.find("port 0") != std::string::npos);
    for (std::string_view bad : {"two words", "a/b", "[::1]", "x\n", "a\\b", "caf\xc3\xa9"}) {
      why.clear();
      CHECK(protocol::decode(raw_announce(0, 7000, static_cast<std::uint16_t>(bad.size()), bad), a,
                             why) == errc::unexpected_message);
      CHECK(why.find("not a host name or address") != std::string::npos);
    }
  }

  SUBCASE("assigned and lookup") {
    message m = framed(protocol::encode(
        protocol::assigned{.shard = 1, .num_servers = 2, .num_workers = 5}, alloc));
    CHECK(!validate_header(m.header, wire_limits{}));
    protocol::assigned a;
    std::string why;
    REQUIRE(!protocol::decode(m, a, why));
    CHECK((a.shard == 1 && a.num_servers == 2 && a.num_workers == 5));
    m = framed(protocol::encode(protocol::assigned{.shard = 2, .num_servers = 2}, alloc));
    CHECK(protocol::decode(m, a, why) == errc::unexpected_message);
    m.header.payload_bytes = 16;
    CHECK(validate_header(m.header, wire_limits{}) == errc::payload_size_mismatch);

    m = framed(protocol::encode(protocol::lookup{.worker = 4}, alloc));
    CHECK(m.header.sender == 4);
    CHECK(!validate_header(m.header, wire_limits{}));
    protocol::lookup l;
    REQUIRE(!protocol::decode(m, l, why));
    CHECK(l.worker == 4);
    m.header.payload_bytes = 4;
    CHECK(validate_header(m.header, wire_limits{}) == errc::payload_size_mismatch);
  }

  SUBCASE("directory") {
    protocol::directory d{.worker = 1,
                          .num_workers = 3,
                          .servers = {{"10.0.0.7", 7000}, {"::1", 7001}, {"node-b", 65535}}};
    message m = framed(protocol::encode(d, alloc));
    CHECK(!validate_header(m.header, wire_limits{}));
    protocol::directory back;
    std::string why;
    REQUIRE(!protocol::decode(m, back, why));
    CHECK(back.worker == 1);
    CHECK(back.num_workers == 3);
    CHECK(back.servers == d.servers);

    // Every cut of the payload is refused (never read past the end).
    for (std::size_t cut = 0; cut < m.payload.size(); ++cut) {
      message part;
      part.header = m.header;
      part.payload = alloc(cut);
      std::memcpy(part.payload.data(), m.payload.data(), cut);
      part.header.payload_bytes = cut;
      why.clear();
      CHECK(protocol::decode(part, back, why) == errc::unexpected_message);
      CHECK(!why.empty());
    }
    // Trailing bytes.
    {
      message longer;
      longer.header = m.header;
      longer.payload = alloc(m.payload.size() + 1);
      std::memcpy(longer.payload.data(), m.payload.data(), m.payload.size());
      longer.payload.data()[m.payload.size()] = std::byte{'x'};
      why.clear();
      CHECK(protocol::decode(framed(std::move(longer)), back, why) == errc::unexpected_message);
      CHECK(why.find("trailing") != std::string::npos);
    }
    // A count above 4096, or one the payload cannot hold, is refused before anything is
    // allocated for it.
    for (std::uint32_t n : {4097u, 0xffffffffu, 100u, 0u}) {
      message bad = framed(protocol::encode(d, alloc));
      detail::store_le(bad.payload.data() + 8, n);
      why.clear();
      CHECK(protocol::decode(bad, back, why) == errc::unexpected_message);
      CHECK(why.find("shards") != std::string::npos);
    }
    // A worker id outside a known count, port 0, a bad host.
    {
      message bad = framed(protocol::encode(
          protocol::directory{.worker = 3, .num_workers = 3, .servers = {{"a", 1}}}, alloc));
      CHECK(protocol::decode(bad, back, why) == errc::unexpected_message);
      bad = framed(protocol::encode(protocol::directory{.servers = {{"a", 0}}}, alloc));
      CHECK(protocol::decode(bad, back, why) == errc::unexpected_message);
      bad = framed(protocol::encode(protocol::directory{.servers = {{"a", 1}}}, alloc));
      bad.payload.data()[15] = std::byte{' '};
      CHECK(protocol::decode(bad, back, why) == errc::unexpected_message);
    }
    // The header bound: 4096 entries of 255-byte hosts.
    message big;
    big.header.type = message_type::directory;
    big.header.payload_bytes = directory_max_bytes;
    CHECK(!validate_header(big.header, wire_limits{}));
    big.header.payload_bytes = directory_max_bytes + 1;
    CHECK(validate_header(big.header, wire_limits{}) == errc::frame_too_large);
  }

  SUBCASE("addresses as the directory lists them") {
    CHECK(host_port_string("10.0.0.7", 7000) == "10.0.0.7:7000");
    CHECK(host_port_string("node-b", 1) == "node-b:1");
    CHECK(host_port_string("::1", 7000) == "[::1]:7000");
    CHECK(host_port_string("fe80::1%eth0", 80) == "[fe80::1%eth0]:80");
    auto ep = parse_tcp_endpoint(host_port_string("::1", 7000));
    REQUIRE(ep.has_value());
    CHECK(ep.value().address().is_v6());
    CHECK(ep.value().port() == 7000);
    CHECK(std::error_code(errc::rendezvous_refused) == condition::fatal);
    CHECK(errc_from_wire(static_cast<std::uint64_t>(errc::rendezvous_refused)) ==
          errc::rendezvous_refused);
  }
}

// ---------------------------------------------------------------------------------------------
// The service and its clients

TEST_CASE_TEMPLATE("rendezvous: lookups wait for the last shard, then the directory is answered "
                   "at once, in shard order",
                   Env, tcp_env, in_process_env) {
  Env env;
  using T = typename Env::transport_type;
  lines rv_log, client_log;
  basic_rendezvous<T> rv(env.rv_t, options(2, 3, rv_log));
  env.start(rv);
  test::run_coro(env.io, [&]() -> asio::awaitable<void> {
    // A worker looks up before any server announced: its reply waits.
    std::optional<std::tuple<std::error_code, rendezvous_directory>> early;
    asio::co_spawn(
        env.io,
        [&]() -> asio::awaitable<void> {
          early = co_await async_lookup_servers(env.client_t, env.root, std::nullopt, 10s,
                                                to(client_log));
        },
        asio::detached);
    co_await wait_until([&] { return rv.waiting_lookups() == 1; });
    REQUIRE(rv.waiting_lookups() == 1);

    // Shard 1 announces by index (port 7001); the lookup still waits.
    auto [ec1, a1] = co_await async_announce_server(env.client_t, env.root, 1u, 7001, 5s,
                                                    env.announce_host, to(client_log));
    const std::string why1 = ec1.message() + "\n" + joined(client_log) + joined(rv_log);
    REQUIRE_MESSAGE(!ec1, why1);
    CHECK(a1.shard == 1);
    CHECK(a1.num_servers == 2);
    CHECK(a1.num_workers == 3);
    CHECK(!rv.complete());
    CHECK(!early.has_value());
    CHECK(rv.waiting_lookups() == 1);
    CHECK(any_line(rv_log, "waits for shards 0, 1 (0 of 2 shards announced)"));

    // Another server announces "any": it gets the lowest free shard, 0; the lookup completes.
    auto [ec0, a0] =
        co_await async_announce_server(env.client_t, env.root, std::nullopt, 7000, 5s,
                                       env.announce_host == "" ? "" : "node-b", to(client_log));
    const std::string why0 = ec0.message() + "\n" + joined(client_log);
    REQUIRE_MESSAGE(!ec0, why0);
    CHECK(a0.shard == 0);
    CHECK(rv.complete());
    const std::string addr0 = (env.announce_host == "" ? env.published : "node-b") + ":7000";
    const std::string addr1 = env.published + ":7001";
    CHECK(rv.servers() == std::vector<std::string>{addr0, addr1});
    co_await wait_until([&] { return early.has_value(); });
    REQUIRE(early.has_value());
    auto& [eec, edir] = *early;
    CHECK(!eec);
    CHECK(edir.servers == std::vector<std::string>{addr0, addr1});
    CHECK(edir.worker_id == 0);
    CHECK(edir.num_workers == 3);

    // Later lookups are answered at once: the next free id, then an id claimed explicitly.
    auto [lec, dir] =
        co_await async_lookup_servers(env.client_t, env.root, std::nullopt, 5s, to(client_log));
    CHECK(!lec);
    CHECK(dir.servers == std::vector<std::string>{addr0, addr1});
    CHECK(dir.worker_id == 1);
    auto [xec, xdir] =
        co_await async_lookup_servers(env.client_t, env.root, 2u, 5s, to(client_log));
    CHECK(!xec);
    CHECK(xdir.worker_id == 2);
    CHECK(xdir.servers.size() == 2);
    CHECK(rv.stats().announces == 2);
    CHECK(rv.stats().lookups == 3);
    CHECK(rv.stats().refused == 0);
    CHECK(rv.waiting_lookups() == 0);
    rv.stop();
  });
}

TEST_CASE_TEMPLATE("rendezvous: a re-announce replaces the shard's address; later lookups see it",
                   Env, tcp_env, in_process_env) {
  Env env;
  using T = typename Env::transport_type;
  lines rv_log, client_log;
  basic_rendezvous<T> rv(env.rv_t, options(2, 0, rv_log));
  env.start(rv);
  test::run_coro(env.io, [&]() -> asio::awaitable<void> {
    for (std::uint32_t s : {0u, 1u}) {
      auto [ec, a] = co_await async_announce_server(env.client_t, env.root, s,
                                                    static_cast<std::uint16_t>(7000 + s), 5s,
                                                    env.announce_host, to(client_log));
      REQUIRE(!ec);
      CHECK(a.shard == s);
      CHECK(a.num_workers == 0);
    }
    auto [ec1, before] =
        co_await async_lookup_servers(env.client_t, env.root, rendezvous_no_worker_id, 5s);
    REQUIRE(!ec1);
    CHECK(before.servers[1] == env.published + ":7001");
    CHECK(before.worker_id == rendezvous_no_worker_id);

    // Server 1 restarts on another port (and, in-process, another host).
    const std::string new_host = env.announce_host == "" ? "" : "node-c";
    auto [ec2, a2] = co_await async_announce_server(env.client_t, env.root, 1u, 7101, 5s, new_host);
    REQUIRE(!ec2);
    CHECK(a2.shard == 1);
    const std::string moved = (new_host == "" ? env.published : new_host) + ":7101";
    auto [ec3, after] =
        co_await async_lookup_servers(env.client_t, env.root, rendezvous_no_worker_id, 5s);
    REQUIRE(!ec3);
    CHECK(after.servers == std::vector<std::string>{env.published + ":7000", moved});
    CHECK(rv.stats().replaced == 1);
    CHECK(any_line(rv_log, "shard 1 moved from " + env.published + ":7001 to " + moved));

    // Restarted at the same address with "any": it gets its shard back, nothing is replaced.
    auto [ec4, a4] =
        co_await async_announce_server(env.client_t, env.root, std::nullopt, 7101, 5s, new_host);
    REQUIRE(!ec4);
    CHECK(a4.shard == 1);
    CHECK(rv.stats().replaced == 1);
    // "any" when every shard is taken by another address is refused, and says why.
    auto [ec5, a5] =
        co_await async_announce_server(env.client_t, env.root, std::nullopt, 7999, 5s,
                                       env.announce_host == "" ? "" : "node-z", to(client_log));
    CHECK(ec5 == errc::rendezvous_refused);
    CHECK(any_line(client_log, "all 2 shards are announced"));
    rv.stop();
  });
}

TEST_CASE("rendezvous: worker ids are assigned in arrival order, claimed ids are recorded, and "
          "ids outside num_workers are refused") {
  in_process_env env;
  lines rv_log, client_log;
  basic_rendezvous<in_process_transport> rv(env.rv_t, options(1, 4, rv_log));
  env.start(rv);
  test::run_coro(env.io, [&]() -> asio::awaitable<void> {
    // Three lookups for any id arrive before the server announces; one claims id 1.
    std::vector<std::uint32_t> order;  // ids, in the order the replies arrive
    std::vector<std::error_code> errors;
    auto look = [&](std::optional<std::uint32_t> id) {
      asio::co_spawn(
          env.io,
          [&, id]() -> asio::awaitable<void> {
            auto r = co_await async_lookup_servers(env.client_t, env.root, id, 10s, to(client_log));
            errors.push_back(std::get<0>(r));
            order.push_back(std::get<1>(r).worker_id);
          },
          asio::detached);
    };
    look(std::nullopt);
    co_await wait_until([&] { return rv.waiting_lookups() == 1; });
    look(1u);
    co_await wait_until([&] { return rv.waiting_lookups() == 2; });
    look(std::nullopt);
    co_await wait_until([&] { return rv.waiting_lookups() == 3; });
    REQUIRE(rv.waiting_lookups() == 3);
    auto [aec, a] =
        co_await async_announce_server(env.client_t, env.root, std::nullopt, 1, 5s, "s0");
    REQUIRE(!aec);
    co_await wait_until([&] { return order.size() == 3; });
    REQUIRE(order.size() == 3);
    CHECK(errors == std::vector<std::error_code>(3));
    CHECK(order == std::vector<std::uint32_t>{0, 1, 2});  // 1 was claimed: the next any gets 2

    // Any: 3, the last id; then none is left.
    auto [ec3, d3] = co_await async_lookup_servers(env.client_t, env.root, std::nullopt, 5s);
    CHECK(!ec3);
    CHECK(d3.worker_id == 3);
    auto [ec4, d4] =
        co_await async_lookup_servers(env.client_t, env.root, std::nullopt, 5s, to(client_log));
    CHECK(ec4 == errc::rendezvous_refused);
    CHECK(any_line(client_log, "all 4 worker ids are taken"));
    // A claimed id may be claimed again (a restarted worker); one outside [0, 4) may not.
    auto [ec5, d5] = co_await async_lookup_servers(env.client_t, env.root, 0u, 5s);
    CHECK(!ec5);
    CHECK(d5.worker_id == 0);
    auto [ec6, d6] = co_await async_lookup_servers(env.client_t, env.root, 4u, 5s, to(client_log));
    CHECK(ec6 == errc::rendezvous_refused);
    CHECK(any_line(client_log, "a lookup as worker 4 outside [0, 4) (num_workers 4)"));
    CHECK(any_line(rv_log, "refusing a request: a lookup as worker 4"));
    CHECK(rv.stats().refused == 2);
    CHECK(rv.stats().lookups == 5);
    rv.stop();
  });
}

TEST_CASE_TEMPLATE("rendezvous: a lookup times out when a shard never announces; an unreachable "
                   "rendezvous is named",
                   Env, tcp_env, in_process_env) {
  Env env;
  using T = typename Env::transport_type;
  lines rv_log, client_log;
  basic_rendezvous<T> rv(env.rv_t, options(2, 0, rv_log));
  env.start(rv);
  test::run_coro(env.io, [&]() -> asio::awaitable<void> {
    auto [aec, a] =
        co_await async_announce_server(env.client_t, env.root, 0u, 7000, 5s, env.announce_host);
    REQUIRE(!aec);
    auto [ec, dir] =
        co_await async_lookup_servers(env.client_t, env.root, std::nullopt, 200ms, to(client_log));
    CHECK(ec == errc::timeout);
    CHECK(dir.servers.empty());
    CHECK(any_line(client_log, "no reply to the lookup from the rendezvous at "));
    CHECK(any_line(client_log, "within 200 ms (it answers once every shard has announced)"));
    // The rendezvous forgets the lookup whose client left; it keeps serving.
    co_await wait_until([&] { return rv.waiting_lookups() == 0; });
    CHECK(rv.waiting_lookups() == 0);
    CHECK(rv.stats().lookups == 0);

    // Nobody listens: the connect is retried until the timeout, and the error names why.
    client_log.clear();
    auto [uec, udir] = co_await async_lookup_servers(env.client_t, env.nowhere(), std::nullopt,
                                                     150ms, to(client_log));
    CHECK(detail::posix_errc(uec) == std::errc::connection_refused);
    CHECK(uec == condition::transient);
    CHECK(any_line(client_log, "cannot reach the rendezvous at "));
    CHECK(any_line(client_log, "retrying for 150 ms"));

    // Invalid arguments are refused before anything is sent.
    auto [iec, ia] = co_await async_announce_server(env.client_t, env.root, std::nullopt, 0, 1s, "",
                                                    to(client_log));
    CHECK(iec == errc::invalid_argument);
    auto [hec, ha] = co_await async_announce_server(env.client_t, env.root, std::nullopt, 1, 1s,
                                                    "a host", to(client_log));
    CHECK(hec == errc::invalid_argument);
    auto [tec, td] =
        co_await async_lookup_servers(env.client_t, env.root, std::nullopt, 0ms, to(client_log));
    CHECK(tec == errc::invalid_argument);
    CHECK(rv.stats().announces == 1);
    rv.stop();
  });
}

TEST_CASE("rendezvous: the client retries until a rendezvous that starts late is there") {
  tcp_env env;
  lines rv_log, client_log;
  rendezvous rv(env.rv_t, options(1, 0, rv_log));
  const auto root = env.nowhere();  // free now; the rendezvous listens there later
  env.root = root;
  test::run_coro(env.io, [&]() -> asio::awaitable<void> {
    std::optional<std::tuple<std::error_code, rendezvous_directory>> result;
    asio::co_spawn(
        env.io,
        [&]() -> asio::awaitable<void> {
          result =
              co_await async_lookup_servers(env.client_t, root, std::nullopt, 20s, to(client_log));
        },
        asio::detached);
    co_await wait_until([&] { return any_line(client_log, "retrying for 20000 ms"); });
    REQUIRE(any_line(client_log, "retrying for 20000 ms"));
    auto acc = env.rv_t.listen(root);
    REQUIRE(acc.has_value());
    asio::co_spawn(env.io, rv.async_serve(std::move(acc).value()), asio::detached);
    auto [aec, a] = co_await async_announce_server(env.client_t, root, std::nullopt, 7000, 5s);
    REQUIRE(!aec);
    co_await wait_until([&] { return result.has_value(); }, 15000);
    REQUIRE(result.has_value());
    CHECK(!std::get<0>(*result));
    CHECK(std::get<1>(*result).servers == std::vector<std::string>{"127.0.0.1:7000"});
    rv.stop();
  });
}

TEST_CASE_TEMPLATE("rendezvous: malformed, oversized or invalid requests get an error frame and "
                   "a close; other clients are still served",
                   Env, tcp_env, in_process_env) {
  Env env;
  using T = typename Env::transport_type;
  lines rv_log, client_log;
  basic_rendezvous<T> rv(env.rv_t, options(2, 0, rv_log));
  env.start(rv);
  // Sends `m` on a fresh connection; returns the error frame's code and reason, and whether
  // the connection was closed after it.
  struct refusal {
    std::optional<errc> code;
    std::string reason;
    bool closed = false;
  };
  auto send_raw = [&](message m) -> asio::awaitable<refusal> {
    refusal r;
    auto [cec, c] = co_await env.client_t.async_connect(env.root);
    REQUIRE(!cec);
    auto conn = std::move(c);
    REQUIRE(!(co_await conn.async_send(std::move(m))));
    auto [rec, reply] = co_await conn.async_receive();
    const std::string receive_error = rec.message();
    REQUIRE_MESSAGE(!rec, receive_error);
    REQUIRE(reply.header.type == message_type::error);
    protocol::error e;
    std::string why;
    REQUIRE(!protocol::decode(reply, e, why));
    r.code = e.code;
    r.reason = std::string(e.reason);
    auto [next, ignored] = co_await conn.async_receive();
    r.closed = next == errc::connection_closed;
    conn.close();
    co_return r;
  };
  test::run_coro(env.io, [&]() -> asio::awaitable<void> {
    // A waiting lookup of a well-behaved worker, through all the refusals below.
    std::optional<std::tuple<std::error_code, rendezvous_directory>> waiting;
    asio::co_spawn(
        env.io,
        [&]() -> asio::awaitable<void> {
          waiting = co_await async_lookup_servers(env.client_t, env.root, std::nullopt, 20s,
                                                  to(client_log));
        },
        asio::detached);
    co_await wait_until([&] { return rv.waiting_lookups() == 1; });
    REQUIRE(rv.waiting_lookups() == 1);

    // Oversized: a 1000-byte host. The transport refuses the header; the reply names it.
    auto r = co_await send_raw(raw_announce(0, 7000, 1000, std::string(1000, 'a')));
    CHECK(r.code == errc::frame_too_large);
    CHECK(r.reason.find("malformed frame") != std::string::npos);
    CHECK(r.closed);
    // Malformed: the host length disagrees with the payload.
    r = co_await send_raw(raw_announce(0, 7000, 10, "abcde"));
    CHECK(r.code == errc::unexpected_message);
    CHECK(r.reason.find("malformed announce (announce of a 10-byte host has 9 payload bytes") !=
          std::string::npos);
    CHECK(r.closed);
    // A host that is no host.
    r = co_await send_raw(raw_announce(0, 7000, 6, "a b;rm"));
    CHECK(r.code == errc::unexpected_message);
    CHECK(r.reason.find("not a host name or address") != std::string::npos);
    // A message a rendezvous does not take.
    message push;
    push.header.type = message_type::clock;
    r = co_await send_raw(framed(std::move(push)));
    CHECK(r.code == errc::unexpected_message);
    CHECK(r.reason.find("unexpected message type 6") != std::string::npos);
    // Valid on the wire, but not for this job: shard 7 of 2.
    auto [sec, sa] = co_await async_announce_server(env.client_t, env.root, 7u, 7000, 5s, "node-a",
                                                    to(client_log));
    CHECK(sec == errc::rendezvous_refused);
    CHECK(any_line(client_log, "an announce of shard 7 outside [0, 2) (num_servers 2)"));
    if constexpr (!Env::knows_peer) {
      // No host, and the transport cannot tell the peer's address.
      auto [nec, na] =
          co_await async_announce_server(env.client_t, env.root, 0u, 7000, 5s, "", to(client_log));
      CHECK(nec == errc::rendezvous_refused);
      CHECK(any_line(client_log, "knows no address of the peer"));
    }
    CHECK(rv.stats().announces == 0);
    CHECK(rv.stats().refused == (Env::knows_peer ? 5u : 6u));
    CHECK(any_line(rv_log, "refusing a request"));
    CHECK(!waiting.has_value());
    CHECK(rv.waiting_lookups() == 1);

    // The well-behaved servers announce; the waiting worker gets the directory.
    for (std::uint32_t s : {0u, 1u}) {
      auto [ec, a] = co_await async_announce_server(
          env.client_t, env.root, s, static_cast<std::uint16_t>(7000 + s), 5s, env.announce_host);
      REQUIRE(!ec);
    }
    co_await wait_until([&] { return waiting.has_value(); });
    REQUIRE(waiting.has_value());
    CHECK(!std::get<0>(*waiting));
    CHECK(std::get<1>(*waiting).servers ==
          std::vector<std::string>{env.published + ":7000", env.published + ":7001"});
    CHECK(std::get<1>(*waiting).worker_id == 0);
    rv.stop();
  });
}

TEST_CASE("rendezvous: a peer without the shared secret is refused; holders of it are served") {
  tcp_options secured;
  secured.secret = secret_of('s');
  secured.auth_timeout = 2000ms;
  tcp_env env(secured, secured);
  tcp_options wrong;
  wrong.secret = secret_of('w');
  wrong.auth_timeout = 2000ms;
  tcp_transport wrong_t(env.io.get_executor(), wrong);
  lines rv_log, client_log;
  rendezvous rv(env.rv_t, options(1, 0, rv_log));
  env.start(rv);
  test::run_coro(env.io, [&]() -> asio::awaitable<void> {
    // The wrong secret: refused at connect, at once (no retry can fix it), never a request.
    auto [wec, wa] = co_await async_announce_server(wrong_t, env.root, 0u, 6666, 10s, "10.6.6.6",
                                                    to(client_log));
    CHECK(wec == errc::authentication_failed);
    CHECK(any_line(client_log, "failed: authentication failed"));
    co_await wait_until([&] { return rv.stats().refused == 1; });
    CHECK(rv.stats().refused == 1);
    CHECK(any_line(rv_log, "refused an unauthenticated connection (from 127.0.0.1:"));
    CHECK(rv.stats().announces == 0);

    auto [ec, a] = co_await async_announce_server(env.client_t, env.root, std::nullopt, 7000, 5s);
    REQUIRE(!ec);
    auto [lec, dir] = co_await async_lookup_servers(env.client_t, env.root, std::nullopt, 5s);
    REQUIRE(!lec);
    CHECK(dir.servers == std::vector<std::string>{"127.0.0.1:7000"});
    auto [wlec, wdir] =
        co_await async_lookup_servers(wrong_t, env.root, std::nullopt, 5s, to(client_log));
    CHECK(wlec == errc::authentication_failed);
    CHECK(wdir.servers.empty());
    rv.stop();
  });
}

// Issue 32: 2,000 wrong-secret handshakes used to add one log line each. A few lines per host
// in each window; the rest is one count, written when the window ends (here: at stop).
TEST_CASE("rendezvous: refusals of one host are logged rate-limited, the rest counted") {
  tcp_options secured;
  secured.secret = secret_of('s');
  tcp_env env(secured, secured);
  tcp_options wrong;
  wrong.secret = secret_of('w');
  tcp_transport wrong_t(env.io.get_executor(), wrong);
  lines rv_log;
  rendezvous rv(env.rv_t, options(1, 0, rv_log));
  env.start(rv);
  const auto refusal_lines = [&] {
    return std::count_if(rv_log.begin(), rv_log.end(), [](const std::string& l) {
      return l.find("refused an unauthenticated connection") != std::string::npos;
    });
  };
  test::run_coro(env.io, [&]() -> asio::awaitable<void> {
    for (int i = 0; i < 12; ++i) {
      auto [wec, wa] = co_await async_announce_server(wrong_t, env.root, 0u, 6666, 10s, "10.6.6.6",
                                                      [](std::string_view) {});
      CHECK(wec == errc::authentication_failed);
    }
    co_await wait_until([&] { return rv.stats().refused == 12; });
    CHECK(rv.stats().refused == 12);
    CHECK(refusal_lines() == 5);
    // The service still answers holders of the secret.
    auto [ec, a] = co_await async_announce_server(env.client_t, env.root, std::nullopt, 7000, 5s);
    CHECK(!ec);
    rv.stop();
  });
  CHECK(refusal_lines() == 5);
  CHECK_MESSAGE(
      any_line(rv_log, "7 more refused connections from 127.0.0.1 suppressed in the last"),
      joined(rv_log));
}

// Issue 32: the rendezvous's accept loop (detail::serve_sessions) ended at the first failed
// accept: under a descriptor flood it logged "Too many open files", closed its listener and
// stayed alive, serving nobody. It now pauses (backoff), logs rate-limited and accepts again.
TEST_CASE("rendezvous: a descriptor flood (EMFILE) is retried with backoff and logged "
          "rate-limited; an announce and a lookup are served afterwards") {
  if (test::address_sanitized) {
    MESSAGE("skipped under AddressSanitizer (tests/support/descriptor_flood.hpp)");
    return;
  }
  const int status = test::run_with_descriptor_limit(256, [] {
    asio::io_context io;
    tcp_transport rv_t(io.get_executor());
    tcp_transport client_t(io.get_executor());
    lines logs;
    rendezvous rv(rv_t, options(1, 0, logs));
    return test::flood_service(
        io, rv_t, rv, logs, [&](asio::ip::tcp::endpoint ep) -> asio::awaitable<bool> {
          auto [aec, a] = co_await async_announce_server(client_t, ep, 0u, 7000, 5s);
          auto [lec, dir] = co_await async_lookup_servers(client_t, ep, std::nullopt, 5s);
          co_return !aec && !lec && dir.servers == std::vector<std::string>{"127.0.0.1:7000"};
        });
  });
  CHECK_MESSAGE(status == 0, "child status " << status
                                             << " (14: async_serve ended on the accept error; "
                                                "15: no failed accept logged; 16: the lookup "
                                                "afterwards failed; 17: not rate-limited)");
}

TEST_CASE("rendezvous: a connection that sends no request is closed after register_timeout") {
  tcp_env env;
  lines rv_log;
  auto opts = options(1, 0, rv_log);
  opts.register_timeout = 200ms;
  rendezvous rv(env.rv_t, opts);
  env.start(rv);
  test::run_coro(env.io, [&]() -> asio::awaitable<void> {
    auto [cec, c] = co_await env.client_t.async_connect(env.root);
    REQUIRE(!cec);
    auto conn = std::move(c);
    auto [rec, m] = co_await conn.async_receive();  // ends when the rendezvous closes it
    CHECK(rec == errc::connection_closed);
    CHECK(rv.stats().refused == 1);
    CHECK(any_line(rv_log, "no request within 200 ms (register_timeout)"));
    CHECK(any_line(rv_log, "(from 127.0.0.1:"));
    rv.stop();
  });
}

TEST_CASE("rendezvous: over IPv6 the published address is bracketed") {
  asio::io_context probe;
  asio::ip::tcp::acceptor test(probe);
  std::error_code ec;
  test.open(asio::ip::tcp::v6(), ec);
  if (!ec) test.bind({asio::ip::make_address("::1"), 0}, ec);
  if (ec) {
    MESSAGE("no IPv6 loopback here (" << ec.message() << "); skipped");
    return;
  }
  test.close();
  tcp_env env;
  lines rv_log;
  rendezvous rv(env.rv_t, options(1, 0, rv_log));
  auto acc = env.rv_t.listen({asio::ip::make_address("::1"), 0});
  REQUIRE(acc.has_value());
  env.root = acc.value().local_endpoint();
  asio::co_spawn(env.io, rv.async_serve(std::move(acc).value()), asio::detached);
  test::run_coro(env.io, [&]() -> asio::awaitable<void> {
    auto [aec, a] = co_await async_announce_server(env.client_t, env.root, std::nullopt, 7000, 5s);
    REQUIRE(!aec);
    auto [lec, dir] = co_await async_lookup_servers(env.client_t, env.root, std::nullopt, 5s);
    REQUIRE(!lec);
    CHECK(dir.servers == std::vector<std::string>{"[::1]:7000"});
    auto back = parse_tcp_endpoint(dir.servers[0]);
    REQUIRE(back.has_value());
    CHECK(back.value().address() == asio::ip::make_address("::1"));
    rv.stop();
  });
}
