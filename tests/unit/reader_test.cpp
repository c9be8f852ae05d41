// Readers (asyncps/reader.hpp, `protocol::reader_id`): `async_read_model` returns exactly the
// parameters the server shards hold, while workers train and without holding their clock; a
// reader may only pull; every failure names the server and what failed.
#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <doctest/doctest.h>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/reader.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/in_process.hpp"
#include "asyncps/transport/tcp.hpp"
#include "asyncps/worker.hpp"
#include "counter_model.hpp"
#include "listen_and_serve.hpp"
#include "log_lines.hpp"
#include "run_coro.hpp"

using namespace asyncps;
using namespace std::chrono_literals;

namespace {

using lines = test::log_lines;
using test::any_line_has;
using test::joined;

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](float x, float y) {
           return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
         });
}

constexpr std::uint32_t workers = 4;
constexpr std::uint32_t width = 4;
const std::array<table_spec, 1> layout{table_spec{0, workers, width, 0.0f}};

server_options shard_options(std::uint32_t shard, lines& log) {
  server_options so;
  so.num_workers = workers;
  so.shard = shard;
  so.num_shards = 2;
  so.tables.assign(layout.begin(), layout.end());
  so.log = [&log](std::string_view l) { log.emplace_back(l); };
  return so;
}

using in_process_server = basic_server<in_process_transport, consistency::bsp>;

// The two shards' values of table 0, concatenated in row order (the model `async_read_model`
// returns).
std::vector<float> servers_model(in_process_server& s0, in_process_server& s1) {
  std::vector<float> m;
  for (auto* s : {&s0, &s1}) {
    const auto v = s->values(0);
    m.insert(m.end(), v.begin(), v.end());
  }
  return m;
}

// Two in-process BSP shards ("shard0", "shard1") of the counter model's table, serving until
// the fixture is destroyed.
struct two_shards {
  asio::io_context io{1};
  in_process_network net;
  lines log;
  in_process_transport t0{io.get_executor(), net};
  in_process_transport t1{io.get_executor(), net};
  in_process_server s0{t0, shard_options(0, log), optimizer::sgd{1.0f}};
  in_process_server s1{t1, shard_options(1, log), optimizer::sgd{1.0f}};
  std::vector<std::string> names{"shard0", "shard1"};

  two_shards() {
    asio::co_spawn(t0.get_executor(), test::listen_and_serve(t0, "shard0", s0), asio::detached);
    asio::co_spawn(t1.get_executor(), test::listen_and_serve(t1, "shard1", s1), asio::detached);
  }
  void stop() {
    s0.stop();
    s1.stop();
  }
};

}  // namespace

TEST_CASE("reader: async_read_model reads the shards' values while BSP workers train, without "
          "holding their clock") {
  two_shards c;
  using worker_t = basic_worker<test::counter_model, in_process_transport, consistency::bsp>;
  std::vector<std::unique_ptr<in_process_transport>> ts;
  std::vector<test::counter_model> models;
  std::vector<std::unique_ptr<worker_t>> ws;
  for (std::uint32_t w = 0; w < workers; ++w) models.emplace_back(w, workers, 0, width);
  for (std::uint32_t w = 0; w < workers; ++w) {
    worker_options<std::string> o;
    o.id = w;
    o.servers = c.names;
    o.wait_timeout = 10s;
    ts.push_back(std::make_unique<in_process_transport>(c.io.get_executor(), c.net));
    ws.push_back(std::make_unique<worker_t>(*ts.back(), models[w], o));
  }
  constexpr std::uint64_t clocks = 100;
  std::size_t done = 0;
  std::vector<std::error_code> errors(workers);
  for (std::uint32_t w = 0; w < workers; ++w)
    asio::co_spawn(
        c.io,
        [&, w]() -> asio::awaitable<void> {
          errors[w] = co_await ws[w]->async_run(clocks);
          ++done;
        },
        asio::detached);

  in_process_transport rt(c.io.get_executor(), c.net);
  std::vector<float> model(layout_size(layout));
  int reads_during = 0;
  lines reader_log;
  const log_function rlog = [&](std::string_view l) { reader_log.emplace_back(l); };
  test::run_coro(c.io, [&]() -> asio::awaitable<void> {
    asio::steady_timer pause(c.io);
    while (done < workers) {  // reads while the workers train: each read completes
      const auto ec =
          co_await async_read_model(rt, std::span<const std::string>(c.names),
                                    std::span<const table_spec>(layout), model, 2s, rlog);
      REQUIRE_MESSAGE(!ec, ec.message() << "\n" << joined(reader_log));
      ++reads_during;
      // Every row counts its worker's pushes: between 0 and `clocks`.
      CHECK(std::all_of(model.begin(), model.end(),
                        [](float v) { return v >= 0.0f && v <= float{clocks}; }));
      pause.expires_after(200us);
      co_await pause.async_wait(detail::use_tuple);
    }
    // Every worker done, the shards still serving: the model read is the shards' values,
    // bit for bit (row w = worker w's `clocks` pushes).
    const auto ec = co_await async_read_model(rt, std::span<const std::string>(c.names),
                                              std::span<const table_spec>(layout), model, 2s, rlog);
    REQUIRE(!ec);
    c.stop();
  });
  for (const auto& e : errors) CHECK_MESSAGE(!e, e.message());
  CHECK(same_bits(model, servers_model(c.s0, c.s1)));
  CHECK(std::all_of(model.begin(), model.end(), [](float v) { return v == float{clocks}; }));
  CHECK(reads_during >= 1);
  // The readers held no clock back and were never counted as workers.
  CHECK(c.s0.clock() == static_cast<clock_value>(clocks));
  CHECK(c.s1.clock() == static_cast<clock_value>(clocks));
  for (auto* s : {&c.s0, &c.s1}) {
    CHECK(s->stats().readers == static_cast<std::uint64_t>(reads_during + 1));
    CHECK(s->stats().reader_pulls == static_cast<std::uint64_t>(reads_during + 1));
    CHECK(s->stats().rejected == 0);
  }
  CHECK(reader_log.empty());
}

TEST_CASE("reader: with min_clock each shard is read once its server clock has reached it, "
          "else the read times out naming the clock") {
  two_shards c;
  using worker_t = basic_worker<test::counter_model, in_process_transport, consistency::bsp>;
  std::vector<std::unique_ptr<in_process_transport>> ts;
  std::vector<test::counter_model> models;
  std::vector<std::unique_ptr<worker_t>> ws;
  for (std::uint32_t w = 0; w < workers; ++w) models.emplace_back(w, workers, 0, width);
  for (std::uint32_t w = 0; w < workers; ++w) {
    worker_options<std::string> o;
    o.id = w;
    o.servers = c.names;
    o.wait_timeout = 10s;
    ts.push_back(std::make_unique<in_process_transport>(c.io.get_executor(), c.net));
    ws.push_back(std::make_unique<worker_t>(*ts.back(), models[w], o));
  }
  constexpr std::uint64_t clocks = 50;
  std::size_t done = 0;
  std::vector<std::error_code> errors(workers);
  in_process_transport rt(c.io.get_executor(), c.net);
  std::vector<float> model(layout_size(layout), -1.0f);
  std::vector<float> early(layout_size(layout), -1.0f);
  std::error_code read_ec, early_ec;
  bool read_done = false;
  lines reader_log, early_log;
  test::run_coro(c.io, [&]() -> asio::awaitable<void> {
    // Asked before any worker has started: it waits (polling) for server clock `clocks`.
    asio::co_spawn(
        c.io,
        [&]() -> asio::awaitable<void> {
          read_ec = co_await async_read_model(
              rt, std::span<const std::string>(c.names), std::span<const table_spec>(layout), model,
              20s, [&](std::string_view l) { reader_log.emplace_back(l); }, clocks);
          read_done = true;
        },
        asio::detached);
    for (std::uint32_t w = 0; w < workers; ++w)
      asio::co_spawn(
          c.io,
          [&, w]() -> asio::awaitable<void> {
            errors[w] = co_await ws[w]->async_run(clocks);
            ++done;
          },
          asio::detached);
    asio::steady_timer pause(c.io);
    while (done < workers || !read_done) {
      pause.expires_after(1ms);
      co_await pause.async_wait(detail::use_tuple);
    }
    // A clock the shards never reach: the read gives up at its deadline.
    early_ec = co_await async_read_model(
        rt, std::span<const std::string>(c.names), std::span<const table_spec>(layout), early,
        200ms, [&](std::string_view l) { early_log.emplace_back(l); }, clocks + 1);
    c.stop();
  });
  for (const auto& e : errors) CHECK_MESSAGE(!e, e.message());
  CHECK_MESSAGE(!read_ec, read_ec.message() << "\n" << joined(reader_log));
  // Read at server clock `clocks` on each shard: every row holds all `clocks` pushes.
  CHECK(std::all_of(model.begin(), model.end(), [](float v) { return v == float{clocks}; }));
  CHECK(same_bits(model, servers_model(c.s0, c.s1)));
  CHECK(early_ec == errc::timeout);
  INFO(joined(early_log));
  CHECK(any_line_has(early_log, "server 0 at shard0: its server clock 50 did not reach "
                                "min_clock 51 within 200 ms"));
  // The shards were asked more than once while below min_clock; one pull per table per read.
  CHECK(c.s0.stats().readers > 1);
  CHECK(c.s0.stats().reader_pulls == 1);
}

TEST_CASE("reader: a reader's pull is answered at once, whatever clock it names; its push is "
          "refused and changes nothing") {
  two_shards c;
  in_process_transport rt(c.io.get_executor(), c.net);
  test::run_coro(c.io, [&]() -> asio::awaitable<void> {
    auto [cec, conn] = co_await rt.async_connect("shard0");
    REQUIRE(!cec);
    protocol::hello h;
    h.worker = protocol::reader_id;
    h.fingerprint = 12345;  // not checked for a reader
    h.layout = {{workers, width}};
    const auto hec = co_await conn.async_send(
        protocol::encode(h, [&](std::size_t n) { return rt.allocate(n); }));
    REQUIRE(!hec);
    auto [wec, wm] = co_await conn.async_receive();
    REQUIRE(!wec);
    REQUIRE(wm.header.type == message_type::welcome);

    message pull;
    pull.header.type = message_type::pull;
    pull.header.flags = frame_flags::range;
    pull.header.sender = protocol::reader_id;
    pull.header.clock = 1000;  // a worker's pull would wait for server clock 1000
    pull.header.first_row = 0;
    pull.header.row_count = 2;
    pull.header.width = width;
    const auto pec = co_await conn.async_send(std::move(pull));
    REQUIRE(!pec);
    auto [rec, rows] = co_await conn.async_receive();
    REQUIRE(!rec);
    CHECK(rows.header.type == message_type::rows);
    CHECK(rows.header.clock == 0);
    CHECK(rows.payload.size() == 2 * width * sizeof(float));

    std::vector<float> g(2 * width, -1.0f);
    message push;
    push.header.type = message_type::push;
    push.header.flags = frame_flags::range;
    push.header.sender = protocol::reader_id;
    push.header.first_row = 0;
    push.header.row_count = 2;
    push.header.width = width;
    push.payload = rt.allocate(g.size() * sizeof(float));
    std::memcpy(push.payload.data(), g.data(), g.size() * sizeof(float));
    const auto sec = co_await conn.async_send(std::move(push));
    REQUIRE(!sec);
    auto [eec, em] = co_await conn.async_receive();
    REQUIRE(!eec);
    REQUIRE(em.header.type == message_type::error);
    protocol::error e;
    std::string why;
    REQUIRE(!protocol::decode(em, e, why));
    CHECK(e.code == errc::unexpected_message);
    CHECK(e.reason.find("from a reader, which may only pull") != std::string::npos);
    c.stop();
  });
  const auto v = c.s0.values(0);
  CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; }));
  CHECK(c.s0.stats().pushes == 0);
  CHECK(c.s0.stats().reader_pulls == 1);
  CHECK(c.s0.stats().rejected == 1);
  INFO(joined(c.log));
  CHECK(any_line_has(c.log, "reader"));
}

TEST_CASE("reader: each failure names the server and what failed") {
  two_shards c;
  in_process_transport rt(c.io.get_executor(), c.net);
  lines rlog;
  const log_function log = [&](std::string_view l) { rlog.emplace_back(l); };
  std::vector<float> model(layout_size(layout));
  test::run_coro(c.io, [&]() -> asio::awaitable<void> {
    const std::span<const table_spec> good(layout);

    // `out` of the wrong size: nothing is sent.
    std::vector<float> small(3);
    auto ec = co_await async_read_model(rt, std::span<const std::string>(c.names), good,
                                        std::span<float>(small), 1s, log);
    CHECK(ec == errc::invalid_argument);
    CHECK(any_line_has(rlog, "invalid argument (2 servers, 3 floats for a layout of 16"));

    // Another layout: the server's layout_mismatch, with its reason.
    const std::array<table_spec, 1> other{table_spec{0, workers + 1, width, 0.0f}};
    std::vector<float> other_out(layout_size(other));
    rlog.clear();
    ec = co_await async_read_model(rt, std::span<const std::string>(c.names),
                                   std::span<const table_spec>(other), std::span<float>(other_out),
                                   1s, log);
    CHECK(ec == errc::layout_mismatch);
    INFO(joined(rlog));
    CHECK(any_line_has(rlog, "read model: server 0 at shard0: refused: "));

    // The servers listed in the wrong order.
    const std::vector<std::string> swapped{"shard1", "shard0"};
    rlog.clear();
    ec = co_await async_read_model(rt, std::span<const std::string>(swapped), good,
                                   std::span<float>(model), 1s, log);
    CHECK(ec == errc::unexpected_message);
    CHECK(any_line_has(rlog, "it serves shard 1 of 2, expected shard 0 of 2"));

    // Nobody listening there.
    const std::vector<std::string> nowhere{"shard0", "nowhere"};
    rlog.clear();
    ec = co_await async_read_model(rt, std::span<const std::string>(nowhere), good,
                                   std::span<float>(model), 1s, log);
    CHECK(ec);
    CHECK(any_line_has(rlog, "server 1 at nowhere: connect: "));
    c.stop();
  });
  CHECK(c.s0.stats().pushes == 0);
}

TEST_CASE("reader: over TCP a reader proves the shared secret like any peer") {
  asio::io_context io(1);
  std::array<std::byte, 32> key{};
  key.fill(std::byte{0x3c});
  tcp_options secured;
  secured.secret = shared_secret(key);
  tcp_transport st(io.get_executor(), secured);
  lines slog;
  server_options so;
  so.num_workers = 1;
  so.tables = {table_spec{0, 3, 5, 0.5f}};  // random initial values
  so.log = [&](std::string_view l) { slog.emplace_back(l); };
  server<consistency::bsp> s(st, so, optimizer::sgd{1.0f});
  auto acc = st.listen(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  REQUIRE(acc.has_value());
  const std::vector<asio::ip::tcp::endpoint> eps{acc.value().local_endpoint()};
  asio::co_spawn(
      io, [&]() -> asio::awaitable<void> { (void)co_await s.async_serve(std::move(acc).value()); },
      asio::detached);
  const std::array<table_spec, 1> l{so.tables[0]};
  std::vector<float> model(layout_size(l));
  std::vector<float> untouched(layout_size(l), 7.0f);
  std::error_code with_secret;
  std::error_code without_secret;
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    tcp_transport rt(io.get_executor(), secured);
    with_secret = co_await async_read_model(rt, std::span<const asio::ip::tcp::endpoint>(eps),
                                            std::span<const table_spec>(l), model, 5s,
                                            [](std::string_view) {});
    tcp_transport open(io.get_executor());
    without_secret = co_await async_read_model(open, std::span<const asio::ip::tcp::endpoint>(eps),
                                               std::span<const table_spec>(l), untouched, 5s,
                                               [](std::string_view) {});
    s.stop();
  });
  CHECK_MESSAGE(!with_secret, with_secret.message());
  CHECK(same_bits(model, s.values(0)));
  CHECK(std::any_of(model.begin(), model.end(), [](float v) { return v != 0.0f; }));
  CHECK(without_secret);
  CHECK(std::all_of(untouched.begin(), untouched.end(), [](float v) { return v == 7.0f; }));
  CHECK(s.stats().readers == 1);
  CHECK(s.stats().rejected >= 1);
}

namespace {

// A recovery policy whose server part says it is rebuilding its state while `*rebuilding`
// (the `recovering()` hook of recovery::stateless and recovery::replica_log).
struct rebuilding_recovery {
  static constexpr std::string_view name = "rebuilding-test";
  struct server_part {
    const bool* rebuilding = nullptr;
    bool recovering() const noexcept { return rebuilding != nullptr && *rebuilding; }
  };
  using worker_part = recovery::none::worker_part;
};
static_assert(recovery_policy<rebuilding_recovery>);

}  // namespace

TEST_CASE("reader: a shard rebuilding its state refuses a reader's pull with errc::recovering; "
          "async_read_model asks again until the rebuild is done or its deadline passes") {
  asio::io_context io{1};
  in_process_network net;
  lines log;
  bool rebuilding = true;
  in_process_transport st{io.get_executor(), net};
  server_options so = shard_options(0, log);
  so.num_shards = 1;
  basic_server<in_process_transport, consistency::bsp, rebuilding_recovery> s(
      st, so, optimizer::sgd{1.0f}, rebuilding_recovery::server_part{&rebuilding});
  asio::co_spawn(st.get_executor(), test::listen_and_serve(st, "shard0", s), asio::detached);
  in_process_transport rt(io.get_executor(), net);
  const std::vector<std::string> names{"shard0"};
  std::vector<float> out(layout_size(layout), -1.0f);
  lines reader_log;
  const auto rlog = [&](std::string_view l) { reader_log.emplace_back(l); };
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    // Still rebuilding at the deadline: a timeout that says why.
    const auto ec = co_await async_read_model(rt, std::span<const std::string>(names), layout,
                                              std::span<float>(out), 200ms, rlog);
    CHECK(ec == errc::timeout);
    CHECK(any_line_has(reader_log, "still rebuilding its state after a restart"));
    CHECK(s.stats().reader_pulls == 0);  // every pull was refused, none answered
    // The rebuild ends while a read waits: it then reads the shard.
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          asio::steady_timer done(io);
          done.expires_after(120ms);
          co_await done.async_wait(detail::use_tuple);
          rebuilding = false;
        },
        asio::detached);
    const auto ec2 = co_await async_read_model(rt, std::span<const std::string>(names), layout,
                                               std::span<float>(out), 5s, rlog);
    CHECK_MESSAGE(!ec2, joined(reader_log));
    CHECK(s.stats().reader_pulls == 1);
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 0.0f; }));
    s.stop();
  });
  INFO(joined(log));
  CHECK(std::error_code(errc::recovering) == condition::transient);
  CHECK(any_line_has(log, "rebuilds its state after a restart"));
}
