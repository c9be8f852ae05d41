// The front door: what a user sees when something is wrong before or around training. Every
// refusal reaches `async_run` as its own code, messages name their cause with values (layouts,
// endpoints, the worker that holds a clock back), debug checks catch unwritten gradients, the
// worker learns its read-my-writes step from the server, and the defaulted aliases work.
#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <doctest/doctest.h>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/detail/endian.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery/none.hpp"
#include "asyncps/run_loop.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/in_process.hpp"
#include "asyncps/transport/tcp.hpp"
#include "asyncps/worker.hpp"
#include "counter_model.hpp"
#include "listen_and_serve.hpp"
#include "log_lines.hpp"
#include "run_coro.hpp"

using namespace asyncps;

namespace {

using lines = test::log_lines;
using test::any_line_has;
using test::joined;

// The counter model with a hook that may spoil its gradient (unwritten values, NaN).
struct spoiling_model : test::counter_model {
  using test::counter_model::counter_model;
  float compute_gradient(const parameter_view& p, gradient_view& g) {
    const float loss = test::counter_model::compute_gradient(p, g);
    if (spoil) spoil(clock - 1, g);
    return loss;
  }
  std::function<void(std::int64_t, gradient_view&)> spoil{};
};

template <class Model>
struct worker_spec {
  Model model;
  worker_options<std::string> opts;
};

struct run_result {
  std::vector<std::error_code> errors;  // per worker, in spawn order
  lines server_log;
  lines worker_log;
  std::vector<float> server_values;  // table 0 after the run
  std::vector<std::vector<float>> caches;
  std::vector<test::counter_model> models;
};

// Runs one in-process server (policy `ServerPolicy`, SGD with learning rate `lr`) and the
// given workers (policy `WorkerPolicy`), each for `clocks` clocks; stops the server when every
// worker is done. Everything runs on one thread, compute inline. `late` workers are started
// when `start_late` is called from a hook (see the duplicate-id test).
template <class ServerPolicy, class WorkerPolicy, class Model>
run_result run_in_process(server_options so, std::vector<worker_spec<Model>> specs,
                          std::uint64_t clocks, float lr = 1.0f) {
  asio::io_context io(1);
  in_process_network net;
  run_result r;
  so.log = [&](std::string_view l) { r.server_log.emplace_back(l); };
  in_process_transport st(io.get_executor(), net);
  basic_server<in_process_transport, ServerPolicy> server(st, so, optimizer::sgd{lr});
  asio::co_spawn(st.get_executor(), test::listen_and_serve(st, "shard0", server), asio::detached);
  using worker_t = basic_worker<Model, in_process_transport, WorkerPolicy>;
  std::vector<std::unique_ptr<in_process_transport>> ts;
  std::vector<std::unique_ptr<worker_t>> ws;
  r.errors.assign(specs.size(), std::error_code{});
  std::size_t done = 0;
  for (auto& sp : specs) {
    if (sp.opts.servers.empty()) sp.opts.servers = {"shard0"};
    sp.opts.log = [&](std::string_view l) { r.worker_log.emplace_back(l); };
    ts.push_back(std::make_unique<in_process_transport>(io.get_executor(), net));
    ws.push_back(std::make_unique<worker_t>(*ts.back(), sp.model, sp.opts));
  }
  for (std::size_t i = 0; i < ws.size(); ++i) {
    asio::co_spawn(
        io,
        [&, i]() -> asio::awaitable<void> {
          r.errors[i] = co_await ws[i]->async_run(clocks);
          if (++done == ws.size()) server.stop();
        },
        asio::detached);
  }
  io.run();
  const auto v = server.values(0);
  r.server_values.assign(v.begin(), v.end());
  for (std::size_t i = 0; i < ws.size(); ++i) {
    const auto c = ws[i]->cache().table(0);
    r.caches.emplace_back(c.data(), c.data() + c.size());
    r.models.push_back(specs[i].model);
  }
  return r;
}

server_options one_table(std::uint32_t workers, std::uint32_t width = 4) {
  server_options so;
  so.num_workers = workers;
  so.tables = {table_spec{0, workers, width, 0.0f}};
  return so;
}

template <class Model = test::counter_model>
worker_spec<Model> spec(std::uint32_t id, std::uint32_t workers, std::uint32_t width = 4) {
  worker_spec<Model> s{Model(id, workers, -1, width), {}};
  s.opts.id = id;
  s.opts.wait_timeout = std::chrono::seconds(10);
  s.opts.connect_timeout = std::chrono::milliseconds(500);
  return s;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
  return true;
}

}  // namespace

TEST_CASE("front door: a wrong worker id reaches async_run as bad_sender") {
  std::vector<worker_spec<test::counter_model>> ws;
  ws.push_back(spec(0, 1));
  ws.back().opts.id = 5;  // the server has num_workers = 1
  const auto r = run_in_process<consistency::bsp, consistency::bsp>(one_table(1), std::move(ws), 3);
  CHECK(r.errors[0] == errc::bad_sender);
  CHECK(any_line_has(r.worker_log, "got 5, num_workers 1"));  // the server's reason, verbatim
}

TEST_CASE("front door: a policy mismatch reaches async_run as policy_mismatch") {
  std::vector<worker_spec<test::counter_model>> ws;
  ws.push_back(spec(0, 1));
  const auto r =
      run_in_process<consistency::bsp, consistency::essp<2>>(one_table(1), std::move(ws), 3);
  CHECK(r.errors[0] == errc::policy_mismatch);
  CHECK(any_line_has(r.worker_log, "lazy consistency"));
}

TEST_CASE("front door: a layout mismatch names the table and both sides' rows x width") {
  std::vector<worker_spec<test::counter_model>> ws;
  ws.push_back(spec(0, 1, 4));
  const auto r =
      run_in_process<consistency::bsp, consistency::bsp>(one_table(1, 8), std::move(ws), 3);
  CHECK(r.errors[0] == errc::layout_mismatch);
  INFO(joined(r.worker_log));
  CHECK(any_line_has(r.worker_log, "table 0: worker 1 x 4, server 1 x 8"));
  CHECK(any_line_has(r.server_log, "table 0: worker 1 x 4, server 1 x 8"));
}

TEST_CASE("front door: a layout with another table count names the counts") {
  const std::array<table_spec, 2> two{table_spec{0, 1, 4, 0.0f}, table_spec{1, 3, 2, 0.0f}};
  const std::array<table_spec, 1> one{table_spec{0, 1, 4, 0.0f}};
  const std::string d = detail::layout_difference(one, "worker", two, "server");
  CHECK(d == "worker has 1 table, server has 2 tables; table 1: worker none, server 3 x 2");
  CHECK(detail::layout_difference(two, "a", two, "b").empty());
}

TEST_CASE("front door: a second worker of the same incarnation with a connected id takes it "
          "over; the first ends with duplicate_worker") {
  // Worker 0 runs; after its first clock a second worker claiming id 0 with the same
  // incarnation connects (the same process, whose old connection the server still holds) and
  // takes the id over, and the real worker 1 starts. The first is told why and stops (taking
  // the id back would only start a tug of war); the second and worker 1 train to the end. (A
  // hello of another incarnation while the holder lives is refused with worker_id_in_use:
  // tests/unit/insider_test.cpp.)
  asio::io_context io(1);
  in_process_network net;
  lines wlog;
  lines slog;
  server_options so = one_table(2);
  so.log = [&](std::string_view l) { slog.emplace_back(l); };
  in_process_transport st(io.get_executor(), net);
  basic_server<in_process_transport, consistency::bsp> server(st, so, optimizer::sgd{1.0f});
  asio::co_spawn(io, test::listen_and_serve(st, "shard0", server), asio::detached);
  using worker_t = basic_worker<test::counter_model, in_process_transport, consistency::bsp>;
  std::array<test::counter_model, 3> models{
      test::counter_model(0, 2, 0), test::counter_model(0, 2, 0), test::counter_model(1, 2, 0)};
  std::array<std::unique_ptr<in_process_transport>, 3> ts;
  std::array<std::unique_ptr<worker_t>, 3> ws;
  std::array<std::error_code, 3> errors;
  int done = 0;
  std::function<void(int)> run;
  run = [&](int i) {
    asio::co_spawn(
        io,
        [&, i]() -> asio::awaitable<void> {
          errors[i] = co_await ws[i]->async_run(4);
          if (i != 0 && ++done == 2) server.stop();
        },
        asio::detached);
  };
  for (int i = 0; i < 3; ++i) {
    worker_t::options_type o;
    o.id = i == 2 ? 1 : 0;
    if (i < 2) o.incarnation = 42;
    o.servers = {"shard0"};
    o.wait_timeout = std::chrono::seconds(10);
    o.log = [&](std::string_view l) { wlog.emplace_back(l); };
    if (i == 0)
      o.on_clock = [&](const clock_report& c) {
        if (c.clock == 0) {
          run(1);
          run(2);
        }
      };
    ts[i] = std::make_unique<in_process_transport>(io.get_executor(), net);
    ws[i] = std::make_unique<worker_t>(*ts[i], models[i], o);
  }
  run(0);
  io.run();
  CHECK(errors[0] == errc::duplicate_worker);
  CHECK(!errors[1]);
  CHECK(!errors[2]);
  CHECK(server.stats().takeovers == 1);
  // Row w counts the pushes applied for id w: each of both id-0 workers' pushes, once.
  CHECK(server.values(0)[0] == static_cast<float>(models[0].clock + models[1].clock));
  CHECK(server.values(0)[4] == static_cast<float>(models[2].clock));
  CHECK(any_line_has(wlog, "worker id taken over by a newer connection (this one was silent, or "
                           "the same worker process reconnected) (worker 0"));
  CHECK(any_line_has(slog, "worker 0 on a new connection takes over its id from its old "
                           "connection (the same incarnation: its old connection is stale)"));
}

TEST_CASE("front door: a NaN push refused mid-run reaches async_run as non_finite_value") {
  std::vector<worker_spec<spoiling_model>> ws;
  ws.push_back(spec<spoiling_model>(0, 1));
  ws.back().opts.check_gradients = false;  // let the NaN reach the server
  ws.back().model.spoil = [](std::int64_t c, gradient_view& g) {
    if (c == 2) g.table(0)(0, 1) = std::nanf("");
  };
  const auto r = run_in_process<consistency::bsp, consistency::bsp>(one_table(1), std::move(ws), 6);
  CHECK(r.errors[0] == errc::non_finite_value);
  CHECK(any_line_has(r.server_log, "NaN"));
}

TEST_CASE("front door: a refusal code outside the errc range is not trusted") {
  CHECK(errc_from_wire(0) == std::nullopt);
  CHECK(errc_from_wire(static_cast<std::uint64_t>(last_errc) + 1) == std::nullopt);
  CHECK(errc_from_wire(~std::uint64_t{0}) == std::nullopt);
  CHECK(errc_from_wire(static_cast<std::uint64_t>(errc::duplicate_worker)) ==
        errc::duplicate_worker);
  CHECK(errc_from_wire(static_cast<std::uint64_t>(last_errc)) == last_errc);
  // Retired values (chain replication's codes before they moved to its own category) are
  // never read back as whatever might later take their place.
  for (std::uint64_t retired : {26u, 35u, 45u}) CHECK(errc_from_wire(retired) == std::nullopt);
  CHECK(errc_from_wire(25) == errc::policy_mismatch);
  CHECK(errc_from_wire(27) == errc::bad_gradient);
}

TEST_CASE("front door: an error frame's code is an errc, a policy's own code, or none") {
  buffer_pool pool;
  const auto alloc = [&](std::size_t n) { return pool.allocate(n); };
  const auto round_trip = [&](std::uint32_t wire_code) {
    message m = protocol::encode(protocol::error{.sender = 3, .reason = "why"}, alloc);
    detail::store_le(m.payload.data(), wire_code);  // what an untrusted peer may send
    protocol::error e;
    std::string detail;
    REQUIRE(!protocol::decode(m, e, detail));
    CHECK(e.reason == "why");
    return e;
  };
  auto e = round_trip(static_cast<std::uint32_t>(errc::bad_clock));
  CHECK(e.code == errc::bad_clock);
  CHECK(e.policy_code == 0);
  e = round_trip(policy_error_base + 1);  // the policy's code 1
  CHECK(!e.code);
  CHECK(e.policy_code == 1);
  e = round_trip(policy_error_base + max_policy_error);
  CHECK(e.policy_code == max_policy_error);
  for (std::uint32_t none :
       {0u, 26u, policy_error_base, policy_error_base + max_policy_error + 1, ~std::uint32_t{0}}) {
    CAPTURE(none);
    e = round_trip(none);
    CHECK(!e.code);
    CHECK(e.policy_code == 0);
  }
  // Encoding: a policy code takes precedence over an errc, and is offset by the base.
  message m = protocol::encode(
      protocol::error{.sender = 0, .code = errc::timeout, .policy_code = 7, .reason = ""}, alloc);
  CHECK(detail::load_le<std::uint32_t>(m.payload.data()) == policy_error_base + 7);
  // A policy without codes of its own (recovery::none) reads none back, and sends none.
  CHECK(detail::policy_error_from_wire<recovery::none>(1) == std::nullopt);
  CHECK(detail::policy_error_to_wire<recovery::none>(errc::timeout) == 0);
}

// A BSP worker over the in-process transport whose only server, "nowhere", never listens.
struct unreachable_worker {
  using worker_t = basic_worker<test::counter_model, in_process_transport, consistency::bsp>;
  asio::io_context io{1};
  in_process_network net;
  in_process_transport t{io.get_executor(), net};
  test::counter_model m{0, 1, 0};
  lines log;
  std::function<void()> on_log;  // called after each line is logged
  worker_t w;
  std::optional<std::error_code> ec;  // async_run's, once it completed

  explicit unreachable_worker(std::chrono::milliseconds connect_timeout)
      : w(t, m, options(connect_timeout)) {
    asio::co_spawn(
        io, [this]() -> asio::awaitable<void> { ec = co_await w.async_run(1); }, asio::detached);
  }
  worker_options<std::string> options(std::chrono::milliseconds connect_timeout) {
    worker_options<std::string> o;
    o.servers = {"nowhere"};
    o.connect_timeout = connect_timeout;
    o.log = [this](std::string_view l) {
      log.emplace_back(l);
      if (on_log) on_log();
    };
    return o;
  }
};

TEST_CASE("front door: a connect failure names the endpoint and is logged at once") {
  unreachable_worker u(std::chrono::milliseconds(200));
  u.io.run();
  REQUIRE(u.ec.has_value());
  CHECK(*u.ec);
  INFO(joined(u.log));
  REQUIRE(u.log.size() >= 2);
  CHECK(u.log.front().find("cannot connect to server 0 at nowhere") != std::string::npos);
  CHECK(u.log.front().find("retrying for 200 ms") != std::string::npos);
  CHECK(u.log.back().find("cannot connect to server 0 at nowhere: ") != std::string::npos);
}

TEST_CASE("front door: stop() ends a worker still connecting, with errc::stopped") {
  unreachable_worker u(std::chrono::hours(1));  // without stop(), the run ends only then
  // The first refusal is logged at once; stop the worker from its executor.
  u.on_log = [&] {
    if (u.log.size() == 1) asio::post(u.io, [&] { u.w.stop(); });
  };
  u.io.run_for(std::chrono::seconds(60));  // a bound for a broken stop(), not a timing check
  INFO(joined(u.log));
  REQUIRE(u.ec.has_value());
  CHECK(*u.ec == errc::stopped);
  CHECK(u.w.stats().clocks == 0);
  // It ended because it was told to, not at connect_timeout (that ending logs this line).
  CHECK(!any_line_has(u.log, "cannot connect to server 0 at nowhere: "));
  CHECK(u.log.size() == 1);
}

TEST_CASE("front door: stop() ends a worker waiting in its clock loop; it says bye") {
  asio::io_context io(1);
  in_process_network net;
  in_process_transport st(io.get_executor(), net), wt(io.get_executor(), net);
  // BSP, elastic membership (so a bye is seen), the clock waiting for 2 members: worker 1
  // never comes.
  server_options so = one_table(2);
  so.elastic = membership_options{.start_members = 2};
  lines server_log;
  so.log = [&](std::string_view l) { server_log.emplace_back(l); };
  basic_server<in_process_transport, consistency::bsp> server(st, so);
  asio::co_spawn(io, test::listen_and_serve(st, "shard0", server), asio::detached);
  auto sp = spec(0, 2);
  sp.opts.servers = {"shard0"};
  sp.opts.wait_timeout = std::chrono::hours(1);  // without stop(), the wait ends only then
  using worker_t = basic_worker<test::counter_model, in_process_transport, consistency::bsp>;
  worker_t* wp = nullptr;
  sp.opts.on_clock = [&](const clock_report& r) {
    // Clock 0 is done; clock 1 waits for a second member, which never comes.
    if (r.clock == 0) asio::post(io, [&] { wp->stop(); });
  };
  worker_t w(wt, sp.model, sp.opts);
  wp = &w;
  std::optional<std::error_code> ec;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        ec = co_await w.async_run(10);
        server.stop();
      },
      asio::detached);
  io.run_for(std::chrono::seconds(60));  // a bound for a broken stop(), not a timing check
  INFO(joined(server_log));
  REQUIRE(ec.has_value());
  CHECK(*ec == errc::stopped);
  CHECK(w.stats().clocks == 1);
  // The server saw an orderly leave (bye), not a lost connection.
  CHECK(server.stats().departures == 1);
  CHECK(any_line_has(server_log, "worker 0 leaves at clock 1: it said bye"));
}

TEST_CASE("front door: a TCP connect failure names address and port") {
  asio::io_context io(1);
  // A port nothing listens on: bind one, note it, close it.
  std::uint16_t port = 0;
  {
    asio::ip::tcp::acceptor a(io, asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    port = a.local_endpoint().port();
  }
  tcp_transport t(io.get_executor());
  lines log;
  test::counter_model m(0, 1, 0);
  worker_options<asio::ip::tcp::endpoint> o;
  o.servers = {asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port)};
  o.connect_timeout = std::chrono::milliseconds(0);
  o.log = [&](std::string_view l) { log.emplace_back(l); };
  worker<test::counter_model, consistency::bsp> w(t, m, o);  // the defaulted alias
  std::error_code ec;
  asio::co_spawn(
      io, [&]() -> asio::awaitable<void> { ec = co_await w.async_run(1); }, asio::detached);
  io.run();
  CHECK(ec);  // connection refused (Asio's system category)
  INFO(joined(log));
  CHECK(any_line_has(log, "cannot connect to server 0 at 127.0.0.1:" + std::to_string(port)));
  struct opaque {};
  CHECK(detail::endpoint_string(opaque{}) == "endpoint");
  CHECK(detail::endpoint_string(std::string("abc")) == "abc");
}

TEST_CASE("front door: a worker blocked by a missing worker names it, so does the server") {
  server_options so = one_table(3);
  so.watchdog_interval = std::chrono::milliseconds(50);
  std::vector<worker_spec<test::counter_model>> ws;
  for (std::uint32_t w = 0; w < 2; ++w) {  // worker 2 never starts
    ws.push_back(spec(w, 3));
    ws.back().opts.wait_timeout = std::chrono::milliseconds(600);
  }
  const auto r = run_in_process<consistency::bsp, consistency::bsp>(so, std::move(ws), 3);
  CHECK(r.errors[0] == errc::timeout);
  CHECK(r.errors[1] == errc::timeout);
  INFO(joined(r.server_log));
  INFO(joined(r.worker_log));
  CHECK(any_line_has(r.server_log, "waiting for worker 2 to connect (2 of 3 connected)"));
  CHECK(any_line_has(r.server_log, "worker 2 holds it back at clock 0 (not connected)"));
  CHECK(any_line_has(r.worker_log, "no fresh rows for clock 1 within the wait timeout (600 ms): "
                                   "waits for server clock >= 1; server 0 at shard0 is at server "
                                   "clock 0, slowest worker 2 at clock 0 (not connected)"));
}

TEST_CASE("front door: a gradient value left unwritten fails the run naming table/row/column") {
  std::vector<worker_spec<spoiling_model>> ws;
  ws.push_back(spec<spoiling_model>(0, 2));
  ws.back().opts.check_gradients = true;  // forced on (the dev preset defines NDEBUG)
  ws.back().opts.wait_timeout = std::chrono::milliseconds(500);
  ws.back().model.spoil = [](std::int64_t, gradient_view& g) {
    // "Forget" one value: put back what the buffer held before compute_gradient.
    g.table(0)(1, 2) = std::bit_cast<float>(unwritten_gradient_bits);
  };
  const auto r = run_in_process<consistency::asp, consistency::asp>(one_table(2), std::move(ws), 3);
  CHECK(r.errors[0] == errc::bad_gradient);
  INFO(joined(r.worker_log));
  CHECK(any_line_has(r.worker_log, "the gradient of table 0 row 1 column 2 was not written"));
  CHECK(r.server_values == std::vector<float>(8, 0.0f));  // nothing was pushed
}

TEST_CASE("front door: a computed NaN or infinity gets its own message") {
  for (const float bad : {std::nanf(""), INFINITY}) {
    std::vector<worker_spec<spoiling_model>> ws;
    ws.push_back(spec<spoiling_model>(0, 1));
    ws.back().opts.check_gradients = true;
    ws.back().model.spoil = [bad](std::int64_t c, gradient_view& g) {
      if (c == 1) g.table(0)(0, 3) = bad;
    };
    const auto r =
        run_in_process<consistency::bsp, consistency::bsp>(one_table(1), std::move(ws), 4);
    CHECK(r.errors[0] == errc::bad_gradient);
    INFO(joined(r.worker_log));
    CHECK(any_line_has(r.worker_log,
                       std::string("compute_gradient at clock 1: the gradient of table 0 row 0 "
                                   "column 3 is ") +
                           (std::isnan(bad) ? "NaN (computed)" : "infinite (computed)")));
  }
}

TEST_CASE("front door: check_gradients passes models that write every value (dense, sparse)") {
  {
    std::vector<worker_spec<test::counter_model>> ws;
    for (std::uint32_t w = 0; w < 2; ++w) {
      ws.push_back(spec(w, 2));
      ws.back().opts.check_gradients = true;
    }
    const auto r =
        run_in_process<consistency::ssp<1>, consistency::ssp<1>>(one_table(2), std::move(ws), 5);
    CHECK(!r.errors[0]);
    CHECK(!r.errors[1]);
  }
  {
    std::vector<worker_spec<test::sparse_counter_model>> ws;
    for (std::uint32_t w = 0; w < 2; ++w) {
      ws.push_back(spec<test::sparse_counter_model>(w, 2, 16));
      ws.back().opts.check_gradients = true;
    }
    const auto r = run_in_process<consistency::ssp<1>, consistency::ssp<1>>(one_table(2, 16),
                                                                            std::move(ws), 5);
    CHECK(!r.errors[0]);
    CHECK(!r.errors[1]);
  }
}

TEST_CASE("front door: local_step unset reads its own writes exactly as with it set") {
  // One worker under SSP(3) reads its cache without pulling for 3 clocks: only the local
  // application of its own gradient (read-my-writes) shows it its writes.
  const auto run = [](std::optional<float> step) {
    std::vector<worker_spec<test::counter_model>> ws;
    ws.push_back(spec(0, 1));
    ws.back().model.staleness = 3;
    ws.back().opts.local_step = step;
    return run_in_process<consistency::ssp<3>, consistency::ssp<3>>(one_table(1), std::move(ws), 12,
                                                                    1.0f);
  };
  const auto unset = run(std::nullopt);
  const auto set = run(1.0f);
  const auto off = run(0.0f);
  REQUIRE(!unset.errors[0]);
  REQUIRE(!set.errors[0]);
  REQUIRE(!off.errors[0]);
  CHECK(unset.models[0].own_write_violations == 0);
  CHECK(set.models[0].own_write_violations == 0);
  CHECK(off.models[0].own_write_violations > 0);  // the check can tell
  CHECK(same_bits(unset.caches[0], set.caches[0]));
  CHECK(same_bits(unset.server_values, set.server_values));
}

TEST_CASE("front door: the defaulted aliases and the model-layout constructor") {
  static_assert(
      std::is_same_v<server<consistency::bsp>, basic_server<tcp_transport, consistency::bsp,
                                                            recovery::none, optimizer::sgd>>);
  static_assert(
      std::is_same_v<
          worker<test::counter_model, consistency::ssp<2>>,
          basic_worker<test::counter_model, tcp_transport, consistency::ssp<2>, recovery::none>>);
  asio::io_context io(1);
  tcp_transport st(io.get_executor());
  const test::counter_model layout(0, 2, 0, 6);
  server_options so;
  so.num_workers = 2;
  so.log = [](std::string_view) {};
  server<consistency::bsp> s(st, layout, so, optimizer::sgd{1.0f});  // tables from the model
  REQUIRE(s.options().tables.size() == 1);
  CHECK(s.options().tables[0] == layout.spec[0]);
  so.tables = {layout.spec[0]};
  CHECK_NOTHROW(server<consistency::bsp>(st, layout, so));  // equal: fine
  so.tables = {table_spec{0, 2, 8, 0.0f}};
  try {
    server<consistency::bsp> bad(st, layout, so);
    FAIL("a different layout must throw");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("table 0: server_options 2 x 8, model 2 x 6") !=
          std::string::npos);
  }

  // Train over TCP with the aliases: two workers, the server built from the model.
  auto acc = st.listen(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  REQUIRE(acc.has_value());
  const auto ep = acc.value().local_endpoint();
  asio::co_spawn(
      io, [&]() -> asio::awaitable<void> { (void)co_await s.async_serve(std::move(acc).value()); },
      asio::detached);
  std::array<test::counter_model, 2> models{test::counter_model(0, 2, 0, 6),
                                            test::counter_model(1, 2, 0, 6)};
  std::array<std::unique_ptr<tcp_transport>, 2> ts;
  std::vector<std::unique_ptr<worker<test::counter_model, consistency::bsp>>> ws;
  std::array<std::error_code, 2> errors;
  int done = 0;
  for (std::uint32_t w = 0; w < 2; ++w) {
    ts[w] = std::make_unique<tcp_transport>(io.get_executor());
    worker_options<asio::ip::tcp::endpoint> o;
    o.id = w;
    o.servers = {ep};
    o.log = [](std::string_view) {};
    ws.push_back(
        std::make_unique<worker<test::counter_model, consistency::bsp>>(*ts[w], models[w], o));
    asio::co_spawn(
        io,
        [&, w]() -> asio::awaitable<void> {
          errors[w] = co_await ws[w]->async_run(5);
          if (++done == 2) s.stop();
        },
        asio::detached);
  }
  io.run();
  CHECK(!errors[0]);
  CHECK(!errors[1]);
  CHECK(s.clock() == 5);
  CHECK(s.values(0)[0] == 5.0f);               // row 0 counts worker 0's pushes
  CHECK(models[0].own_write_violations == 0);  // local_step learned from the server (1)
}

// ---- deadlines over real TCP (issue 15) ----

namespace {

using namespace std::chrono_literals;

// Waits (polling every 10 ms) until `done()` holds; false after `limit`.
template <class P>
asio::awaitable<bool> eventually(P done, std::chrono::milliseconds limit = 10s) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  for (auto waited = 0ms; !done(); waited += 10ms) {
    if (waited >= limit) co_return false;
    t.expires_after(10ms);
    co_await t.async_wait(detail::use_tuple);
  }
  co_return true;
}

shared_secret test_secret() {
  std::array<std::byte, 32> b{};
  b.fill(std::byte{0x5a});
  return shared_secret(b);
}

message hello_message(tcp_transport& t, std::uint32_t id, std::uint32_t rows, std::uint32_t width) {
  return protocol::encode(
      protocol::hello{.worker = id,
                      .clock = 0,
                      .fingerprint = policy_fingerprint<consistency::bsp, recovery::none>(),
                      .layout = {{rows, width}}},
      [&](std::size_t n) { return t.allocate(n); });
}

}  // namespace

TEST_CASE("front door: an authenticated connection that never says hello is refused with "
          "timeout after hello_timeout; workers are not") {
  asio::io_context io(1);
  tcp_options secured;
  secured.secret = test_secret();
  tcp_transport st(io.get_executor(), secured);
  tcp_transport idle_t(io.get_executor(), secured);
  lines log;
  server_options so = one_table(1);
  so.hello_timeout = 300ms;
  so.log = [&](std::string_view l) { log.emplace_back(l); };
  server<consistency::bsp> s(st, so, optimizer::sgd{1.0f});
  auto acc = st.listen(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  REQUIRE(acc.has_value());
  const auto ep = acc.value().local_endpoint();
  asio::co_spawn(
      io, [&]() -> asio::awaitable<void> { (void)co_await s.async_serve(std::move(acc).value()); },
      asio::detached);
  std::error_code worker_ec;
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    // Proves the secret, then says nothing.
    auto [ec, c] = co_await idle_t.async_connect(ep);
    REQUIRE(!ec);
    auto [rec, m] = co_await c.async_receive();  // the server speaks first only to refuse
    REQUIRE(!rec);
    REQUIRE(m.header.type == message_type::error);
    protocol::error e;
    std::string detail;
    REQUIRE(!protocol::decode(m, e, detail));
    CHECK(e.code == errc::timeout);
    CHECK(e.reason.find("within 300 ms") != std::string::npos);
    auto [eof, none] = co_await c.async_receive();
    CHECK(eof);  // then closed
    CHECK(s.stats().rejected == 1);
    CHECK(s.connections() == 0);
    INFO(joined(log));
    CHECK(any_line_has(log, "closing connection of unidentified peer 127.0.0.1:"));
    CHECK(any_line_has(log, "operation timed out (no hello or other valid first message within "
                            "300 ms of the connection)"));

    // A worker says hello at once and trains; its compute time is not bounded.
    tcp_transport wt(io.get_executor(), secured);
    test::counter_model model(0, 1, 0, 4);
    worker_options<asio::ip::tcp::endpoint> o;
    o.servers = {ep};
    o.log = [](std::string_view) {};
    worker<test::counter_model, consistency::bsp> w(wt, model, o);
    worker_ec = co_await w.async_run(3);
    s.stop();
  });
  CHECK(!worker_ec);
  CHECK(s.clock() == 3);
  CHECK(s.stats().rejected == 1);
}

TEST_CASE("front door: a worker that stops reading is closed after send_timeout") {
  asio::io_context io(1);
  tcp_transport st(io.get_executor());
  tcp_transport ct(io.get_executor());
  lines log;
  server_options so;
  so.num_workers = 1;
  so.tables = {table_spec{0, 256, 1024, 0.0f}};  // a whole-table reply is 1 MiB
  so.send_timeout = 300ms;
  so.log = [&](std::string_view l) { log.emplace_back(l); };
  server<consistency::bsp> s(st, so, optimizer::sgd{1.0f});
  auto acc = st.listen(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  REQUIRE(acc.has_value());
  const auto ep = acc.value().local_endpoint();
  asio::co_spawn(
      io, [&]() -> asio::awaitable<void> { (void)co_await s.async_serve(std::move(acc).value()); },
      asio::detached);
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    auto [ec, c] = co_await ct.async_connect(ep);
    REQUIRE(!ec);
    c.socket().set_option(asio::socket_base::receive_buffer_size(4096));
    REQUIRE(!(co_await c.async_send(hello_message(ct, 0, 256, 1024))));
    // 32 MiB of replies: far more than the sockets' buffers hold. Nothing is read.
    for (int i = 0; i < 32; ++i) {
      message pull;
      pull.header.type = message_type::pull;
      pull.header.flags = frame_flags::range;
      pull.header.row_count = 256;
      REQUIRE(!(co_await c.async_send(std::move(pull))));
    }
    CHECK(co_await eventually([&] { return s.stats().rejected == 1; }));
    CHECK(co_await eventually([&] { return s.connections() == 0; }));
    INFO(joined(log));
    CHECK(any_line_has(log, "closing connection of worker 0 127.0.0.1:"));
    CHECK(any_line_has(log, "a write has not completed for 300 ms (send_timeout; "));
    CHECK(s.workers_connected() == 0);
    c.close();
    s.stop();
  });
  CHECK(s.stats().over_budget_closes == 0);
}

TEST_CASE("run_polling runs every handler, sleeps through a late timer, stops when out of work") {
  asio::io_context io;
  int posted = 0;
  bool fired = false;
  for (int i = 0; i < 5; ++i) asio::post(io, [&] { ++posted; });
  asio::steady_timer late(io);
  late.expires_after(std::chrono::milliseconds(20));  // beyond the spin: run_one sleeps
  late.async_wait([&](std::error_code ec) { fired = !ec; });
  const std::size_t ran = run_polling(io, std::chrono::microseconds(200));
  CHECK(posted == 5);
  CHECK(fired);
  CHECK(ran == 6);
  CHECK(io.stopped());

  // A zero spin is plain run(); so is a context that was stopped first.
  io.restart();
  asio::post(io, [&] { ++posted; });
  CHECK(run_polling(io, std::chrono::nanoseconds::zero()) == 1);
  io.restart();
  asio::post(io, [&] { ++posted; });
  io.stop();
  CHECK(run_polling(io, std::chrono::microseconds(50)) == 0);
  CHECK(posted == 6);
}

TEST_CASE(
    "elastic membership over TCP: a worker killed mid-run leaves after the grace period, "
    "the other trains on, and a late worker joins at the server clock and stops at end_clock") {
  for (const bool elastic : {true, false}) {
    CAPTURE(elastic);
    asio::io_context io(1);
    lines server_log, worker_log;
    server_options so = one_table(3);
    so.log = [&](std::string_view l) { server_log.emplace_back(l); };
    if (elastic) {
      so.elastic = membership_options{.start_members = 2, .grace = std::chrono::milliseconds(150)};
    } else {
      so.num_workers = 2;  // fixed membership: workers 0 and 1 (the layout stays 3 rows)
    }
    tcp_transport st(io.get_executor());
    basic_server<tcp_transport, consistency::bsp> server(st, so, optimizer::sgd{1.0f});
    auto acc = st.listen({asio::ip::address_v4::loopback(), 0});
    REQUIRE(acc.has_value());
    const auto ep = acc.value().local_endpoint();
    asio::co_spawn(io, server.async_serve(std::move(acc).value()), asio::detached);

    using worker_t = basic_worker<test::counter_model, tcp_transport, consistency::bsp>;
    const auto options = [&](std::uint32_t id) {
      worker_t::options_type o;
      o.id = id;
      o.servers = {ep};
      o.wait_timeout = std::chrono::seconds(2);
      o.log = [&](std::string_view l) { worker_log.emplace_back(l); };
      return o;
    };
    tcp_transport t0(io.get_executor()), t1(io.get_executor()), t2(io.get_executor());
    test::counter_model m0(0, 3, -1), m2(2, 3, -1);
    std::optional<worker_t> late;
    std::error_code e0, e2;
    int running = 1;
    auto o0 = options(0);
    o0.on_clock = [&](const clock_report& r) {
      if (!elastic || r.clock != 20 || late) return;
      // A worker joins the running job; it trains to the job's end clock (40), however
      // many clocks that leaves it.
      auto o2 = options(2);
      o2.end_clock = 40;
      late.emplace(t2, m2, o2);
      ++running;
      asio::co_spawn(
          io,
          [&]() -> asio::awaitable<void> {
            e2 = co_await late->async_run(1000);
            if (--running == 0) server.stop();
          },
          asio::detached);
    };
    worker_t w0(t0, m0, o0);
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          e0 = co_await w0.async_run(40);
          if (--running == 0) server.stop();
        },
        asio::detached);
    // Worker 1 is a bare protocol client: hello, 5 clocks of pushes, then its process "dies"
    // (the connection closes without bye).
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          auto [ec, c] = co_await t1.async_connect(ep);
          REQUIRE(!ec);
          REQUIRE(!(co_await c.async_send(hello_message(t1, 1, 3, 4))));
          for (clock_value k = 0; k < 5; ++k) {
            message p;
            p.header.type = message_type::push;
            p.header.flags = frame_flags::range | frame_flags::end_of_clock;
            p.header.sender = 1;
            p.header.clock = k;
            p.header.row_count = 3;
            p.header.width = 4;
            p.payload = t1.allocate(3 * 4 * sizeof(float));
            std::fill_n(p.payload.floats().data(), 12, 0.0f);
            REQUIRE(!(co_await c.async_send(std::move(p))));
          }
          c.close();
        },
        asio::detached);
    io.run();
    INFO(joined(server_log));
    INFO(joined(worker_log));
    if (elastic) {
      CHECK(!e0);  // trained on without worker 1
      CHECK(m0.clock == 40);
      CHECK(m0.own_write_violations == 0);
      REQUIRE(late.has_value());
      CHECK(!e2);
      CHECK(late->clock() == 40);  // stopped at end_clock, not after 1000 clocks
      CHECK(m2.clock >= 10);       // it joined at the server clock (about 20)
      CHECK(m2.clock <= 25);
      CHECK(late->stats().clocks == static_cast<std::uint64_t>(m2.clock));
      CHECK(server.stats().joins == 3);
      CHECK(server.stats().departures >= 2);  // worker 1 (gone), and the finished ones' bye
      CHECK(any_line_has(server_log, "worker 1 leaves at clock 5: its connection has been gone"));
      CHECK(any_line_has(server_log, "worker 2 joins at clock "));
    } else {
      CHECK(e0 == errc::timeout);  // fixed membership: worker 1 holds BSP back for good
      CHECK(server.stats().departures == 0);
    }
  }
}

TEST_CASE("basic_worker::stop_at ends the run early with success; the earlier of it and "
          "end_clock wins, and a later stop_at does not extend the run") {
  for (const bool with_end_clock : {false, true}) {
    CAPTURE(with_end_clock);
    asio::io_context io(1);
    server_options so = one_table(1);
    so.log = [](std::string_view) {};
    tcp_transport st(io.get_executor()), wt(io.get_executor());
    basic_server<tcp_transport, consistency::bsp> server(st, so, optimizer::sgd{1.0f});
    auto acc = st.listen({asio::ip::address_v4::loopback(), 0});
    REQUIRE(acc.has_value());
    const auto ep = acc.value().local_endpoint();
    asio::co_spawn(io, server.async_serve(std::move(acc).value()), asio::detached);

    using worker_t = basic_worker<test::counter_model, tcp_transport, consistency::bsp>;
    worker_t::options_type o;
    o.id = 0;
    o.servers = {ep};
    o.wait_timeout = std::chrono::seconds(2);
    o.log = [](std::string_view) {};
    if (with_end_clock) o.end_clock = 8;
    test::counter_model m(0, 1, -1);
    std::optional<worker_t> w;
    o.on_clock = [&](const clock_report& r) {
      if (r.clock == 3) w->stop_at(12);
      if (r.clock == 5) w->stop_at(30);
    };
    w.emplace(wt, m, o);
    std::error_code ec = errc::timeout;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          ec = co_await w->async_run(100);
          server.stop();
        },
        asio::detached);
    io.run();
    const clock_value want = with_end_clock ? 8 : 12;
    CHECK(!ec);
    CHECK(w->clock() == want);
    CHECK(m.clock == static_cast<std::int64_t>(want));
    CHECK(w->stats().clocks == want);
    CHECK(m.own_write_violations == 0);
  }
}

TEST_CASE("front door: a server that goes silent while the worker waits is taken for lost after "
          "silence_timeout, not after wait_timeout") {
  for (const bool silence : {true, false}) {
    CAPTURE(silence);
    asio::io_context io(1);
    tcp_transport st(io.get_executor()), wt(io.get_executor());
    auto acc = st.listen({asio::ip::address_v4::loopback(), 0});
    REQUIRE(acc.has_value());
    lines log;
    std::optional<tcp_transport::connection> held;  // the silent server keeps it open
    // A "server" whose host vanished after the welcome: it reads, and never answers again.
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          auto [ec, c] = co_await acc.value().async_accept();
          REQUIRE(!ec);
          auto [hec, hello] = co_await c.async_receive();
          REQUIRE(!hec);
          protocol::welcome w{.shard = 0,
                              .num_shards = 1,
                              .server_clock = 0,
                              .last_seq = 0,
                              .worker_clock = 0,
                              .policy_bit = false,
                              .tables = {{1, 4, 0}},
                              .local_step = 0};
          REQUIRE(!(co_await c.async_send(
              protocol::encode(w, [&](std::size_t n) { return st.allocate(n); }))));
          held.emplace(std::move(c));
        },
        asio::detached);
    test::counter_model m(0, 1, -1);
    basic_worker<test::counter_model, tcp_transport, consistency::bsp>::options_type o;
    o.servers = {acc.value().local_endpoint()};
    o.wait_timeout = std::chrono::seconds(2);
    o.silence_timeout = silence ? std::chrono::milliseconds(200) : std::chrono::milliseconds(0);
    o.log = [&](std::string_view l) { log.emplace_back(l); };
    basic_worker<test::counter_model, tcp_transport, consistency::bsp> w(wt, m, o);
    std::error_code e;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          e = co_await w.async_run(5);
          if (held) held->close();
          acc.value().close();
        },
        asio::detached);
    io.run();
    INFO(joined(log));
    if (silence) {
      CHECK(e == errc::server_lost);
      CHECK(any_line_has(log, "has sent nothing for 200 ms while this worker waits for it "
                              "(silence_timeout): taken for lost"));
    } else {
      CHECK(e == errc::timeout);  // only wait_timeout ends the wait
    }
  }
}
