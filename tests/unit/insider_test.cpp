// A peer that holds the secret is still input (issue 32, docs/security.md "What an insider can
// still do"): a restored or replicated state is validated before it is installed, a replica-log
// rebuild never calls itself exact on a replica's word, positions from the wire are
// range-checked, and one hello cannot end a live worker's run. Each test steps a real server
// over the in-process transport with a hand-written hostile peer, or steps the shard core.
// The "memory:" cases (a transport whose receive and accept throw std::bad_alloc): an
// allocation failure while a frame is received closes that connection only, logged (the shard
// server, the chain master, the rendezvous), and an accept that throws is retried (the chain
// master, the rendezvous).
// The "identity:" cases (real TCP + TLS, certificates made by test_pki.hpp): a certificate's
// asyncps identity (URI SAN `asyncps://<role>/<id>`) bounds the ids its holder may claim: a
// worker hello, a chain_hello at the master or a member, a rendezvous announce or lookup.
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <list>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <doctest/doctest.h>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/detail/codec/shard_state.hpp"
#include "asyncps/detail/server/shard_core.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery/chain/master.hpp"
#include "asyncps/recovery/chain_replication.hpp"
#include "asyncps/recovery/replica_log.hpp"
#include "asyncps/recovery/stateless.hpp"
#include "asyncps/rendezvous.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/in_process.hpp"
#include "asyncps/transport/tcp.hpp"
#include "asyncps/worker.hpp"
#include "counter_model.hpp"
#include "listen_and_serve.hpp"
#include "log_lines.hpp"
#include "run_coro.hpp"
#include "test_pki.hpp"

using namespace asyncps;
using namespace std::chrono_literals;

namespace {

using test::any_line_has;
using test::joined;
using core_t = detail::shard_core<optimizer::momentum, int, int>;

// The server options of these tests: `workers` workers, one table of 4 rows x 2 (zeros), log
// lines into `slog`, no watchdog.
server_options logged_options(std::uint32_t workers, test::log_lines& slog) {
  server_options so;
  so.num_workers = workers;
  so.tables = {table_spec{0, 4, 2, 0.0f}};
  so.log = [&slog](std::string_view l) { slog.emplace_back(l); };
  so.watchdog_interval = std::chrono::milliseconds(0);
  return so;
}

// One table of 8 rows x 2, shard 0 of 1, 2 workers.
core_t make_core() {
  const std::vector<table_spec> layout{table_spec{0, 8, 2, 0.5f}};
  return core_t(0, 1, 2, layout, 42, optimizer::momentum{0.1f, 0.9f});
}

// A frame of type `t` with header flags `flags` and seq `seq` from worker `w` (no payload).
message header_only(message_type t, std::uint8_t flags, std::uint64_t seq, std::uint32_t w = 0) {
  message m;
  m.header.type = t;
  m.header.flags = flags;
  m.header.seq = seq;
  m.header.sender = w;
  return m;
}

// A hello of worker `w` at clock `c` for `layout`, policies `Consistency` and `Recovery`,
// header flags `flags` (e.g. `frame_flags::policy`: it holds a replica log for the shard).
template <class Consistency, class Recovery>
message hello_of(std::uint32_t w, clock_value c, std::vector<protocol::layout_entry> layout,
                 std::uint8_t flags, in_process_transport& t, std::uint64_t incarnation = 99) {
  protocol::hello h{.worker = w,
                    .clock = c,
                    .fingerprint = policy_fingerprint<Consistency, Recovery>(),
                    .incarnation = incarnation,
                    .layout = std::move(layout)};
  message m = protocol::encode(h, [&](std::size_t n) { return t.allocate(n); });
  m.header.flags = flags;
  return m;
}

// Worker `w`'s push of clock 0 (seq 1) over rows [0, 4) of a 4 x 2 table, every value `g`,
// ending its clock; `flags` added to the header (e.g. `frame_flags::want_ack`).
message push_of(in_process_transport& t, std::uint32_t w, float g, std::uint8_t flags = 0) {
  message push;
  push.header.type = message_type::push;
  push.header.flags = frame_flags::range | frame_flags::end_of_clock | flags;
  push.header.sender = w;
  push.header.seq = 1;
  push.header.row_count = 4;
  push.header.width = 2;
  push.payload = t.allocate(8 * sizeof(float));
  const std::vector<float> v(8, g);
  std::memcpy(push.payload.data(), v.data(), 8 * sizeof(float));
  return push;
}

}  // namespace

TEST_CASE("insider: restore_state refuses a state no run can reach, naming the field") {
  auto core = make_core();
  shard_state good;
  core.save_state(good);
  REQUIRE(good.tables[0].optimizer_state.size() == good.tables[0].values.size());
  const auto refused = [&](const shard_state& st, std::string_view field) {
    auto fresh = make_core();
    std::string detail;
    const auto ec = fresh.restore_state(st, detail);
    INFO(detail);
    CHECK(ec == errc::bad_state);
    CHECK(detail.find(field) != std::string::npos);
    CHECK(!fresh.has_state());  // nothing installed
    CHECK(fresh.worker_clock(0) == 0);
    CHECK(fresh.last_seq(0) == 0);
  };
  {
    auto st = good;
    st.tables[0].values[5] = std::nanf("");
    refused(st, "'tables[0].values' is not all finite");
  }
  {
    auto st = good;
    st.tables[0].optimizer_state[3] = std::numeric_limits<float>::infinity();
    refused(st, "'tables[0].optimizer_state' is not all finite");
  }
  {
    auto st = good;
    st.worker_clocks[1] = protocol::max_clock + 1;
    refused(st, "'worker_clocks[1]' is 4294967296");
  }
  {
    auto st = good;
    st.worker_clocks[0] = -3;
    refused(st, "'worker_clocks[0]' is -3");
  }
  {
    auto st = good;
    st.last_seq = {0, std::numeric_limits<std::uint64_t>::max()};  // would drop every push
    refused(st, "'last_seq[1]' is 18446744073709551615");
  }
  {
    auto st = good;
    st.tables[0].step = std::numeric_limits<std::uint64_t>::max();  // ++step wraps to 0
    refused(st, "'tables[0].step'");
  }
  {
    auto st = good;
    st.applied[1] = protocol::max_seq + 1;
    refused(st, "'applied[1]'");
  }
  {
    auto st = good;
    st.last_seq = {1, 2, 3};  // neither empty nor one per worker
    auto fresh = make_core();
    CHECK(fresh.restore_state(st) == errc::layout_mismatch);
  }
  // The largest values a run can reach are taken.
  auto st = good;
  st.worker_clocks = {protocol::max_clock, 7};
  st.last_seq = {protocol::max_seq, 0};
  auto fresh = make_core();
  CHECK(!fresh.restore_state(st));
  CHECK(fresh.clock() == 7);
  CHECK(fresh.last_seq(0) == protocol::max_seq);
}

TEST_CASE("insider: a replica-log replica claiming positions no worker logged is not installed "
          "and the rebuild is not exact on its word") {
  // A fresh replica-log shard meets a hello with flag `policy` (`holds_log_flag`, as after a
  // restart) and rebuilds. The only peer is an insider with worker 0's id: it sends a finite
  // replica of position 2^62 whose values are all 1000, an empty log, and the end of its replay at
  // stable position 0. Its replica claims 2^62 updates no log holds: the shard rebuilds from
  // its initial state (exactly right: no update was ever logged) and never installs it.
  asio::io_context io(1);
  in_process_network net;
  test::log_lines slog;
  const server_options so = logged_options(1, slog);
  in_process_transport st(io.get_executor(), net);
  using server_t = basic_server<in_process_transport, consistency::bsp, recovery::replica_log>;
  server_t server(st, so, optimizer::sgd{1.0f});
  asio::co_spawn(io, test::listen_and_serve(st, "shard0", server), asio::detached);
  in_process_transport evil(io.get_executor(), net);
  test::run_coro(
      io,
      [&]() -> asio::awaitable<void> {
        auto [ec, c] = co_await evil.async_connect("shard0");
        REQUIRE(!ec);
        const std::vector<protocol::layout_entry> layout{{4, 2}};
        (void)co_await c.async_send(hello_of<consistency::bsp, recovery::replica_log>(
            0, 5, layout, frame_flags::policy, evil));
        auto [wec, welcome] = co_await c.async_receive();
        REQUIRE(!wec);
        REQUIRE(welcome.header.type == message_type::welcome);
        CHECK(welcome.header.has(frame_flags::policy));  // rebuilding: send replicas and logs
        shard_state forged;
        server.save_state(forged);
        for (auto& v : forged.tables[0].values) v = 1000.0f;
        message rep;
        rep.header.type = protocol::replica_type;
        rep.header.seq = std::uint64_t{1} << 62;
        rep.payload = evil.allocate(detail::encoded_state_size(forged));
        detail::encode_state(forged, std::span<std::byte>(rep.payload.data(), rep.payload.size()));
        (void)co_await c.async_send(std::move(rep));
        (void)co_await c.async_send(header_only(protocol::replay_type, frame_flags::policy, 0));
        asio::steady_timer t(io);
        for (int i = 0; i < 200 && server.recovery().recovering(); ++i) {
          t.expires_after(5ms);
          co_await t.async_wait(detail::use_tuple);
        }
        server.stop();
      },
      std::chrono::seconds(10));
  INFO(joined(slog));
  CHECK(server.recovery().serving());
  CHECK(server.recovery().stats().stable == 0);
  CHECK(server.values(0)[0] == 0.0f);  // the initial values, not the forged 1000s
  CHECK(any_line_has(slog, "1 state replica(s) above the newest stable position 0 claim "
                           "positions no worker logged: not installed"));
  CHECK(!any_line_has(slog, "rebuilt from the replica of position"));
}

TEST_CASE("insider: a replay naming a position near 2^64 is refused (bad_position); the "
          "position counter cannot wrap") {
  // A fresh replica-log shard rebuilds on an insider's hello with flag `policy`; the insider
  // then ends its replay at stable position 2^64 - 2 (or announces an entry there). Accepted,
  // it made the shard's next position 2^64 - 1, then 0: every worker refused the orders. It is
  // refused with bad_position, and the rebuild goes on without it.
  for (const std::uint8_t flags : {frame_flags::policy, std::uint8_t{0}}) {
    CAPTURE(flags);
    asio::io_context io(1);
    in_process_network net;
    test::log_lines slog;
    const server_options so = logged_options(1, slog);
    in_process_transport st(io.get_executor(), net);
    using server_t = basic_server<in_process_transport, consistency::bsp, recovery::replica_log>;
    server_t server(st, so, optimizer::sgd{1.0f});
    asio::co_spawn(io, test::listen_and_serve(st, "shard0", server), asio::detached);
    in_process_transport evil(io.get_executor(), net);
    std::optional<errc> refusal;
    test::run_coro(
        io,
        [&]() -> asio::awaitable<void> {
          auto [ec, c] = co_await evil.async_connect("shard0");
          REQUIRE(!ec);
          const std::vector<protocol::layout_entry> layout{{4, 2}};
          (void)co_await c.async_send(hello_of<consistency::bsp, recovery::replica_log>(
              0, 5, layout, frame_flags::policy, evil));
          auto [wec, welcome] = co_await c.async_receive();
          REQUIRE(!wec);
          REQUIRE(welcome.header.type == message_type::welcome);
          (void)co_await c.async_send(header_only(protocol::replay_type, flags,
                                                  std::numeric_limits<std::uint64_t>::max() - 1));
          auto [eec, err] = co_await c.async_receive();
          REQUIRE(!eec);
          REQUIRE(err.header.type == message_type::error);
          protocol::error e;
          std::string why;
          REQUIRE(!protocol::decode(err, e, why));
          refusal = e.code;
          server.stop();
        },
        std::chrono::seconds(10));
    INFO(joined(slog));
    CHECK(refusal == errc::bad_position);
    CHECK(any_line_has(slog, "names position 18446744073709551614; positions lie in [0, "
                             "4611686018427387904]"));
    CHECK(server.recovery().recovering());  // the forged end did not finish the rebuild
    CHECK(server.recovery().stats().missing_positions == 0);
    CHECK(!any_line_has(slog, "positions missing"));
  }
}

TEST_CASE("insider: a hello for a live worker's id is refused as transient; the live worker "
          "trains on, and a worker retries that refusal until the id is free") {
  // Worker 0 trains; an insider (another process: another incarnation) says hello as worker 0
  // after worker 0's first clock. The live connection keeps the id: the insider is refused
  // with worker_id_in_use, and nobody gets duplicate_worker. A real worker refused so (a
  // restarted process whose old connection the server still holds) retries: the third
  // worker, also id 0, gets in once worker 0 has said bye.
  asio::io_context io(1);
  in_process_network net;
  test::log_lines slog, wlog;
  server_options so;
  so.num_workers = 2;
  so.tables = {table_spec{0, 2, 4, 0.0f}};
  so.log = [&](std::string_view l) { slog.emplace_back(l); };
  in_process_transport st(io.get_executor(), net);
  basic_server<in_process_transport, consistency::asp> server(st, so, optimizer::sgd{1.0f});
  asio::co_spawn(io, test::listen_and_serve(st, "shard0", server), asio::detached);
  using worker_t = basic_worker<test::counter_model, in_process_transport, consistency::asp>;
  std::array<test::counter_model, 3> models{
      test::counter_model(0, 2, 0), test::counter_model(1, 2, 0), test::counter_model(0, 2, 0)};
  std::array<std::unique_ptr<in_process_transport>, 3> ts;
  std::array<std::unique_ptr<worker_t>, 3> ws;
  std::array<std::error_code, 3> errors;
  std::optional<errc> insider_refusal;
  int done = 0;
  in_process_transport evil(io.get_executor(), net);
  const auto run = [&](int i) {
    asio::co_spawn(
        io,
        [&, i]() -> asio::awaitable<void> {
          errors[i] = co_await ws[i]->async_run(4);
          if (++done == 3) server.stop();
        },
        asio::detached);
  };
  for (int i = 0; i < 3; ++i) {
    worker_t::options_type o;
    o.id = i == 1 ? 1 : 0;
    o.servers = {"shard0"};
    o.wait_timeout = std::chrono::seconds(10);
    o.connect_timeout = std::chrono::seconds(10);
    o.log = [&](std::string_view l) { wlog.emplace_back(l); };
    if (i == 0)
      o.on_clock = [&](const clock_report& c) {
        if (c.clock != 0) return;
        run(2);  // the second process with id 0 starts while worker 0 lives
        asio::co_spawn(
            io,
            [&]() -> asio::awaitable<void> {
              auto [ec, c] = co_await evil.async_connect("shard0");
              REQUIRE(!ec);
              const std::vector<protocol::layout_entry> layout{{2, 4}};
              (void)co_await c.async_send(
                  hello_of<consistency::asp, recovery::none>(0, 0, layout, 0, evil, 12345));
              auto [rec, m] = co_await c.async_receive();
              REQUIRE(!rec);
              REQUIRE(m.header.type == message_type::error);
              protocol::error e;
              std::string why;
              REQUIRE(!protocol::decode(m, e, why));
              insider_refusal = e.code;
            },
            asio::detached);
      };
    ts[i] = std::make_unique<in_process_transport>(io.get_executor(), net);
    ws[i] = std::make_unique<worker_t>(*ts[i], models[i], o);
  }
  run(0);
  run(1);
  io.run_for(std::chrono::seconds(30));
  INFO(joined(slog));
  INFO(joined(wlog));
  CHECK(insider_refusal == errc::worker_id_in_use);
  CHECK(!errors[0]);  // the live worker trained to the end
  CHECK(!errors[1]);
  CHECK(!errors[2]);  // retried, then took the freed id
  CHECK(server.stats().takeovers == 0);
  CHECK(!any_line_has(wlog, "worker id taken over"));
  CHECK(any_line_has(slog, "another live connection holds this worker id: retry later (worker 0 "
                           "is held by a connection"));
  CHECK(make_error_code(errc::worker_id_in_use) == condition::transient);
}

namespace {

// A server protocol stepped by hand (as tests/unit/server_core_test.cpp does): the sessions
// and a shell that records.
using step_time = std::chrono::steady_clock::time_point;
struct step_session : detail::server_session_state<step_time> {
  explicit step_session(int t) : tag(t) {}
  int tag;
  std::list<step_session>::iterator self;
};
struct step_io {
  struct ctx_type {};
  ctx_type ctx() { return {}; }
  void wake(step_session&) {}
  void close(step_session&) {}
  buffer allocate(std::size_t n) { return pool.allocate(n); }
  step_time now() const { return time; }
  void wake_watchdog() {}
  void wake_sweeper() {}
  step_io& server() { return *this; }
  buffer_pool pool;
  step_time time{};
};
using step_proto = detail::server_protocol<consistency::ssp<0>, recovery::none, optimizer::sgd,
                                           step_session, step_time, step_io>;

message step_hello(step_io& io, std::uint32_t w, clock_value c, std::uint64_t incarnation) {
  return protocol::encode(
      protocol::hello{.worker = w,
                      .clock = c,
                      .fingerprint = policy_fingerprint<consistency::ssp<0>, recovery::none>(),
                      .incarnation = incarnation,
                      .layout = {{8, 2}}},
      [&](std::size_t n) { return io.allocate(n); });
}
std::optional<errc> refusal_of(const step_session& s) {
  if (s.outbox.empty() || s.outbox.back().header.type != message_type::error) return {};
  protocol::error e;
  std::string why;
  if (protocol::decode(s.outbox.back(), e, why)) return {};
  return e.code;
}
protocol::welcome welcome_of(const step_session& s) {
  protocol::welcome w;
  std::string why;
  REQUIRE(!s.outbox.empty());
  REQUIRE(!protocol::decode(s.outbox.front(), w, why));
  return w;
}

}  // namespace

TEST_CASE("insider: a hello at an absurd clock leaves nothing behind; a connection that never "
          "trained vetoes no rejoin; a silent holder's id is taken over") {
  step_io io;
  server_options o;
  o.num_workers = 2;
  o.tables = {table_spec{0, 8, 2, 0.0f}};
  o.takeover_silence = std::chrono::seconds(60);
  test::log_lines log;
  o.log = [&](std::string_view l) { log.emplace_back(l); };
  step_proto proto(io, o, optimizer::sgd{1.0f}, {});

  // No worker is connected: an insider says hello as worker 0 at clock 10^6 (accepted: the
  // shard cannot know the run's clock), and leaves without training. Worker 0's clock here
  // goes back to 0, so the real worker 0 is welcomed at its own clock.
  for (const clock_value absurd : {clock_value{1000000}, protocol::max_clock - 1}) {
    CAPTURE(absurd);
    auto& evil = proto.add_session(1);
    auto h = step_hello(io, 0, absurd, 666);
    REQUIRE(proto.receive(evil, h));
    CHECK(proto.core().worker_clock(0) == absurd);
    evil.open = false;
    evil.running = 0;
    proto.session_finished(evil);
    CHECK(proto.core().worker_clock(0) == 0);
  }
  CHECK(any_line_has(log, "worker 0's clock goes back from 4294967294 to 0: the connection whose "
                          "hello moved it up never trained"));

  // The insider says hello again as worker 1 at clock 0 and stays (never trains). The real
  // worker 0 rejoins at clock 4181 (the shard restarted while it trained): an idle
  // connection's clock does not veto it (bad_clock).
  auto& idle = proto.add_session(2);
  auto h1 = step_hello(io, 1, 0, 666);
  REQUIRE(proto.receive(idle, h1));
  auto& real = proto.add_session(3);
  auto h0 = step_hello(io, 0, 4181, 7);
  CHECK(proto.receive(real, h0));
  CHECK(proto.worker_session(0) == &real);
  CHECK(welcome_of(real).worker_clock == 4181);

  // A second process claims worker 0 while the real one lives: refused (transient), the real
  // one keeps its id.
  io.time += std::chrono::seconds(59);
  message tick;  // worker 0 ends its clock 4181: it trains, and is heard from now
  tick.header.type = message_type::clock;
  tick.header.sender = 0;
  tick.header.clock = 4181;
  tick.header.seq = 1;
  REQUIRE(proto.receive(real, tick));
  io.time += std::chrono::seconds(59);
  auto& impostor = proto.add_session(4);
  auto hi = step_hello(io, 0, 4181, 8);
  CHECK(!proto.receive(impostor, hi));
  CHECK(refusal_of(impostor) == errc::worker_id_in_use);
  CHECK(proto.worker_session(0) == &real);
  CHECK(proto.stats().takeovers == 0);
  // Once the holder has been silent for takeover_silence, a hello takes the id over (its
  // process or host is gone); so does one of the same incarnation at any time.
  io.time += std::chrono::seconds(2);
  auto& successor = proto.add_session(5);
  auto hs = step_hello(io, 0, 4182, 9);
  CHECK(proto.receive(successor, hs));
  CHECK(proto.worker_session(0) == &successor);
  CHECK(refusal_of(real) == errc::duplicate_worker);
  auto& again = proto.add_session(6);
  auto ha = step_hello(io, 0, 4182, 9);
  CHECK(proto.receive(again, ha));
  CHECK(proto.worker_session(0) == &again);
  CHECK(proto.stats().takeovers == 2);
}

TEST_CASE("insider: max_update_norm refuses a finite but huge push whole; 0 bounds nothing") {
  for (const double bound : {0.0, 10.0}) {
    CAPTURE(bound);
    step_io io;
    server_options o;
    o.num_workers = 1;
    o.tables = {table_spec{0, 8, 2, 0.0f}};
    o.max_update_norm = bound;
    test::log_lines log;
    o.log = [&](std::string_view l) { log.emplace_back(l); };
    step_proto proto(io, o, optimizer::sgd{1.0f}, {});
    auto& w = proto.add_session(0);
    auto h = step_hello(io, 0, 0, 1);
    REQUIRE(proto.receive(w, h));
    // A range push of all 8 rows x 2 of `g`: L2 norm 4 |g|.
    const auto push = [&](float g, std::uint64_t seq) {
      message m;
      m.header.type = message_type::push;
      m.header.flags = frame_flags::range;
      m.header.sender = 0;
      m.header.first_row = 0;
      m.header.row_count = 8;
      m.header.width = 2;
      m.header.seq = seq;
      m.payload = io.allocate(16 * sizeof(float));
      for (std::size_t i = 0; i < 16; ++i) m.payload.floats()[i] = g;
      return m;
    };
    auto small = push(2.0f, 1);  // norm 8
    CHECK(proto.receive(w, small));
    CHECK(proto.core().table(0).values[0] == -2.0f);
    auto huge = push(1e37f, 2);  // finite: norm 4e37
    if (bound == 0) {
      CHECK(proto.receive(w, huge));  // no bound: applied
      CHECK(proto.core().table(0).values[0] < -1e36f);
    } else {
      CHECK(!proto.receive(w, huge));
      CHECK(refusal_of(w) == errc::update_too_large);
      CHECK(proto.core().table(0).values[0] == -2.0f);  // nothing applied
      CHECK(proto.stats().pushes == 1);
      CHECK(any_line_has(log, "push refused: its L2 norm exceeds the server's max_update_norm "
                              "(table 0: L2 norm 4e+37 of the push from worker 0, "
                              "max_update_norm 10)"));
      CHECK(make_error_code(errc::update_too_large) == condition::fatal);
    }
  }
}

namespace {

using strict_chain = recovery::chain_replication<recovery::chain_mode::strict>;
using chain_server_t = basic_server<in_process_transport, consistency::bsp, strict_chain>;

// A chain_hello of `member` of shard 0 with the strict chain's fingerprint under BSP.
message chain_hello_of(std::uint32_t member, in_process_transport& t) {
  return protocol::encode(
      protocol::chain_hello{.shard = 0,
                            .member = member,
                            .fingerprint = policy_fingerprint<consistency::bsp, strict_chain>()},
      [&](std::size_t n) { return t.allocate(n); });
}

// The code of the error frame `c` receives next (an errc, or chain replication's own); nullopt when
// it receives something else first, or the connection ends without one.
template <class Connection>
asio::awaitable<std::optional<std::error_code>> refusal_on(Connection& c) {
  auto [ec, m] = co_await c.async_receive();
  if (ec || m.header.type != message_type::error) co_return std::nullopt;
  protocol::error e;
  std::string why;
  if (protocol::decode(m, e, why)) co_return std::nullopt;
  if (e.code) co_return make_error_code(*e.code);
  co_return detail::policy_error_from_wire<strict_chain>(e.policy_code);
}

// Waits on `io` (in 5 ms steps, at most `limit`) until `pred()` holds.
template <class Pred>
asio::awaitable<void> wait_until(asio::io_context& io, Pred pred,
                                 std::chrono::milliseconds limit = 5s) {
  asio::steady_timer t(io);
  for (auto waited = 0ms; !pred() && waited < limit; waited += 5ms) {
    t.expires_after(5ms);
    co_await t.async_wait(detail::use_tuple);
  }
}

}  // namespace

TEST_CASE("insider: the chain master registers only the configured member ids, and a live "
          "member's id is not taken over") {
  // A chain of 3. Before the real servers register, an insider registers members 7 and
  // 2^32 - 1: before the check they filled two of the three places, and the chain started
  // with them (0 -> 7 -> 4294967295) as soon as member 0 registered. Then, with the chain
  // running, an insider registers as member 0 (the live head): before the check the master
  // removed the real head ("registered again") and appended the insider as the tail.
  asio::io_context io(1);
  in_process_network net;
  test::log_lines slog, mlog;
  in_process_transport mt(io.get_executor(), net);
  chain_master_options mo;
  mo.members = 3;
  mo.log = [&](std::string_view l) { mlog.emplace_back(l); };
  basic_chain_master<in_process_transport> master(mt, mo);
  asio::co_spawn(io, test::listen_and_serve(mt, "master", master), asio::detached);
  const server_options so = logged_options(1, slog);
  strict_chain::server_part part;
  part.options.heartbeat_interval = 20ms;
  const std::vector<std::string> names{"s0", "s1", "s2"};
  std::vector<std::unique_ptr<in_process_transport>> sts;
  std::vector<std::unique_ptr<chain_server_t>> servers;
  in_process_transport evil(io.get_executor(), net);
  std::vector<bool> bogus_closed;
  std::vector<std::uint32_t> chain_before_servers, chain_after_claim;
  std::uint64_t failures_after_claim = 1;
  test::run_coro(
      io,
      [&]() -> asio::awaitable<void> {
        for (const std::uint32_t bogus : {7u, 0xffffffffu}) {
          auto [ec, c] = co_await evil.async_connect("master");
          REQUIRE(!ec);
          (void)co_await c.async_send(chain_hello_of(bogus, evil));
          auto [rec, m] = co_await c.async_receive();  // closed without a configuration
          bogus_closed.push_back(static_cast<bool>(rec));
        }
        chain_before_servers = master.chain(0);
        for (std::uint32_t m = 0; m < 3; ++m) {
          sts.push_back(std::make_unique<in_process_transport>(io.get_executor(), net));
          servers.push_back(
              std::make_unique<chain_server_t>(*sts.back(), so, optimizer::sgd{1.0f}, part));
          servers.back()->recovery().set_chain(std::string("master"), names, m);
          asio::co_spawn(io, test::listen_and_serve(*sts.back(), names[m], *servers.back()),
                         asio::detached);
        }
        co_await wait_until(io, [&] { return master.started(); });
        REQUIRE(master.chain(0) == std::vector<std::uint32_t>{0, 1, 2});
        // The head is live (heartbeats every 20 ms): a second claim of its id is refused.
        auto [ec, c] = co_await evil.async_connect("master");
        REQUIRE(!ec);
        (void)co_await c.async_send(chain_hello_of(0, evil));
        auto [rec, m] = co_await c.async_receive();
        CHECK(rec);  // closed, no configuration
        chain_after_claim = master.chain(0);
        failures_after_claim = master.stats().failures;
        for (auto& s : servers) s->stop();
        master.stop();
      },
      10s);
  INFO(joined(mlog));
  INFO(joined(slog));
  CHECK(bogus_closed == std::vector<bool>{true, true});
  CHECK(chain_before_servers.empty());  // the bogus ids hold no place
  CHECK(master.stats().refused == 3);
  CHECK(failures_after_claim == 0);  // the real head was never removed
  CHECK(chain_after_claim == std::vector<std::uint32_t>{0, 1, 2});
  CHECK(master.stats().joins == 0);
  CHECK(any_line_has(mlog, "chain_hello names member 7 of shard 0; member ids lie in [0, 3)"));
  CHECK(any_line_has(mlog, "chain_hello names member 4294967295 of shard 0"));
  CHECK(any_line_has(mlog, "chain_hello names shard 0 server 0, which a live registration holds"));
  CHECK(!any_line_has(mlog, "registered again"));
}

TEST_CASE("insider: a chain_hello for a live predecessor's id is refused (member_id_in_use); a "
          "silent link is replaced; member ids and state positions are range-checked") {
  // A chain of 2 whose member 0 is an insider registered with the master (so member 1's
  // predecessor is "0"); member 1 is a real server. The insider links to member 1 as member 0
  // and keeps the link live with heartbeats. A second claim of member 0 is refused while that
  // link is live (before the check it replaced the link), and taken once the link has been
  // silent for link_silence. A claim of member 9 is refused by range, and a state transfer at
  // log position 2^64 - 1 is refused with bad_position (nothing installed).
  asio::io_context io(1);
  in_process_network net;
  test::log_lines slog, mlog;
  in_process_transport mt(io.get_executor(), net);
  chain_master_options mo;
  mo.members = 2;
  mo.heartbeat_timeout = 30s;  // the insider's registration sends no heartbeats
  mo.log = [&](std::string_view l) { mlog.emplace_back(l); };
  basic_chain_master<in_process_transport> master(mt, mo);
  asio::co_spawn(io, test::listen_and_serve(mt, "master", master), asio::detached);
  const server_options so = logged_options(1, slog);
  strict_chain::server_part part;
  part.options.heartbeat_interval = 20ms;
  part.options.link_silence = 300ms;
  in_process_transport st(io.get_executor(), net);
  chain_server_t member1(st, so, optimizer::sgd{1.0f}, part);
  member1.recovery().set_chain(std::string("master"), std::vector<std::string>{"s0", "s1"}, 1);
  asio::co_spawn(io, test::listen_and_serve(st, "s1", member1), asio::detached);
  in_process_transport evil(io.get_executor(), net);
  std::optional<std::error_code> live_claim, range_claim, state_refusal;
  bool first_acked = false, silent_claim_acked = false;
  test::run_coro(
      io,
      [&]() -> asio::awaitable<void> {
        auto [mec, reg] = co_await evil.async_connect("master");
        REQUIRE(!mec);
        (void)co_await reg.async_send(chain_hello_of(0, evil));
        co_await wait_until(io, [&] { return master.started(); });
        co_await wait_until(io, [&] { return member1.recovery().stats().configs > 0; });
        REQUIRE(master.chain(0) == std::vector<std::uint32_t>{0, 1});
        // The first link as member 0: accepted (no live link holds the id).
        auto [ec1, link1] = co_await evil.async_connect("s1");
        REQUIRE(!ec1);
        (void)co_await link1.async_send(chain_hello_of(0, evil));
        auto [aec, ack] = co_await link1.async_receive();
        first_acked = !aec && ack.header.type == message_type::ack;
        // A second claim right after a heartbeat on the live link: refused.
        message hb;
        hb.header.type = message_type::heartbeat;
        (void)co_await link1.async_send(std::move(hb));
        auto [ec2, link2] = co_await evil.async_connect("s1");
        REQUIRE(!ec2);
        (void)co_await link2.async_send(chain_hello_of(0, evil));
        live_claim = co_await refusal_on(link2);
        // A member id outside the chain.
        auto [ec3, link3] = co_await evil.async_connect("s1");
        REQUIRE(!ec3);
        (void)co_await link3.async_send(chain_hello_of(9, evil));
        range_claim = co_await refusal_on(link3);
        // link1 goes silent past link_silence: a new claim replaces it.
        asio::steady_timer t(io);
        t.expires_after(400ms);
        co_await t.async_wait(detail::use_tuple);
        auto [ec4, link4] = co_await evil.async_connect("s1");
        REQUIRE(!ec4);
        (void)co_await link4.async_send(chain_hello_of(0, evil));
        auto [a4ec, ack4] = co_await link4.async_receive();
        silent_claim_acked = !a4ec && ack4.header.type == message_type::ack;
        // A state transfer claiming log position 2^64 - 1.
        shard_state st_forged;
        member1.save_state(st_forged);
        message state;
        state.header.type = protocol::chain_state_type;
        state.header.seq = std::numeric_limits<std::uint64_t>::max();
        state.payload = evil.allocate(detail::encoded_state_size(st_forged));
        detail::encode_state(st_forged,
                             std::span<std::byte>(state.payload.data(), state.payload.size()));
        (void)co_await link4.async_send(std::move(state));
        state_refusal = co_await refusal_on(link4);
        member1.stop();
        master.stop();
      },
      10s);
  INFO(joined(slog));
  INFO(joined(mlog));
  CHECK(first_acked);
  CHECK(live_claim == recovery::chain_errc::member_id_in_use);
  CHECK(range_claim == errc::unexpected_message);
  CHECK(silent_claim_acked);
  CHECK(state_refusal == errc::bad_position);
  CHECK(member1.recovery().stats().claims_refused == 1);
  CHECK(member1.recovery().stats().states_installed == 0);
  CHECK(member1.recovery().log_position() == 0);
  CHECK(any_line_has(slog, "a live chain link holds this member id: retry later"));
  CHECK(any_line_has(slog, "member ids of this chain lie in [0, 2)"));
  CHECK(any_line_has(slog, "a new link replaces one silent for"));
  CHECK(make_error_code(recovery::chain_errc::member_id_in_use) == condition::transient);
}

TEST_CASE("insider: a stateless shard installs no implausible replica; the table waits for a "
          "plausible one") {
  // A restarted (fresh) stateless shard asks the workers that say hello at a clock > 0 for
  // their replicas. Before the checks it installed the first replica push of each table
  // whatever it held. Now a replica from the future (clock 99, its sender is at clock 5) and
  // one with values above max_replica_value are refused with bad_state and not installed; the
  // third, plausible one is.
  asio::io_context io(1);
  in_process_network net;
  test::log_lines slog;
  const server_options so = logged_options(3, slog);
  in_process_transport st(io.get_executor(), net);
  using server_t = basic_server<in_process_transport, consistency::asp, recovery::stateless>;
  recovery::stateless::server_part part;
  part.options.max_replica_value = 100.0f;
  server_t server(st, so, optimizer::sgd{1.0f}, part);
  asio::co_spawn(io, test::listen_and_serve(st, "shard0", server), asio::detached);
  in_process_transport evil(io.get_executor(), net);
  std::vector<std::optional<std::error_code>> outcomes;  // per replica: the refusal, or none
  std::vector<bool> asked;                               // per hello: the welcome asked for state
  std::vector<bool> recovering_after;
  std::list<in_process_transport::connection_type> conns;
  const auto replica = [&](std::uint32_t w, clock_value c, float value) {
    message m;
    m.header.type = message_type::push;
    m.header.flags = static_cast<std::uint8_t>(frame_flags::range | frame_flags::policy);
    m.header.sender = w;
    m.header.table = 0;
    m.header.clock = c;
    m.header.first_row = 0;
    m.header.row_count = 4;
    m.header.width = 2;
    m.payload = evil.allocate(8 * sizeof(float));
    const std::vector<float> v(8, value);
    std::memcpy(m.payload.data(), v.data(), 8 * sizeof(float));
    return m;
  };
  test::run_coro(
      io,
      [&]() -> asio::awaitable<void> {
        const std::vector<std::pair<clock_value, float>> tries{{99, 1.0f}, {5, 1.0e30f}, {5, 1.0f}};
        for (std::uint32_t w = 0; w < 3; ++w) {
          auto [ec, c] = co_await evil.async_connect("shard0");
          REQUIRE(!ec);
          const std::vector<protocol::layout_entry> layout{{4, 2}};
          (void)co_await c.async_send(
              hello_of<consistency::asp, recovery::stateless>(w, 5, layout, 0, evil, 7 + w));
          auto [wec, welcome] = co_await c.async_receive();
          REQUIRE(!wec);
          REQUIRE(welcome.header.type == message_type::welcome);
          asked.push_back(welcome.header.has(frame_flags::policy));
          (void)co_await c.async_send(replica(w, tries[w].first, tries[w].second));
          // The refusal, or (when the replica was installed) none: the table stops waiting.
          outcomes.emplace_back();
          bool answered = false;
          conns.push_back(std::move(c));
          asio::co_spawn(
              io,
              [&, w, &conn = conns.back()]() -> asio::awaitable<void> {
                outcomes[w] = co_await refusal_on(conn);
                answered = true;
              },
              asio::detached);
          co_await wait_until(io, [&] { return answered || !server.recovery().recovering(); }, 2s);
          recovering_after.push_back(server.recovery().recovering());
        }
        server.stop();
      },
      10s);
  INFO(joined(slog));
  CHECK(asked == std::vector<bool>{true, true, true});
  REQUIRE(outcomes.size() == 3);
  CHECK(outcomes[0] == errc::bad_state);
  CHECK(outcomes[1] == errc::bad_state);
  CHECK(recovering_after == std::vector<bool>{true, true, false});
  CHECK(server.recovery().stats().replicas_installed == 1);
  CHECK(server.values(0)[0] == 1.0f);
  CHECK(any_line_has(slog, "refused the replica of table 0 from worker 0 (replica at clock 99; "
                           "worker 0 is at clock 5 here"));
  CHECK(any_line_has(slog, "exceeds max_replica_value"));
  CHECK(any_line_has(slog, "rebuilt table 0 from the replica of worker 2 (clock 5)"));
}

TEST_CASE("insider: a held replica-log push refused when its turn comes is counted and logged, "
          "never dropped silently") {
  // Under replica_log a push is held until its worker confirms the position it was ordered
  // at; only then is it dispatched. One that the server refuses at that point (here: above
  // max_update_norm) used to be dropped without a count or a line (`(void)dispatch_of`).
  asio::io_context io(1);
  in_process_network net;
  test::log_lines slog;
  server_options so = logged_options(1, slog);
  so.max_update_norm = 1.0;
  in_process_transport st(io.get_executor(), net);
  using server_t = basic_server<in_process_transport, consistency::asp, recovery::replica_log>;
  server_t server(st, so, optimizer::sgd{1.0f});
  asio::co_spawn(io, test::listen_and_serve(st, "shard0", server), asio::detached);
  in_process_transport evil(io.get_executor(), net);
  std::optional<std::error_code> refusal;
  std::uint64_t position = 0;
  test::run_coro(
      io,
      [&]() -> asio::awaitable<void> {
        auto [ec, c] = co_await evil.async_connect("shard0");
        REQUIRE(!ec);
        const std::vector<protocol::layout_entry> layout{{4, 2}};
        (void)co_await c.async_send(
            hello_of<consistency::asp, recovery::replica_log>(0, 0, layout, 0, evil));
        auto [wec, welcome] = co_await c.async_receive();
        REQUIRE(!wec);
        REQUIRE(welcome.header.type == message_type::welcome);
        // Every value 10: L2 norm 28.3 > max_update_norm 1.
        (void)co_await c.async_send(push_of(evil, 0, 10.0f));
        auto [oec, om] = co_await c.async_receive();
        REQUIRE(!oec);
        REQUIRE(om.header.type == protocol::order_type);
        protocol::order o;
        std::string why;
        REQUIRE(!protocol::decode(om, o, why));
        REQUIRE(o.size() == 1);
        position = o.entry(0).position;
        (void)co_await c.async_send(header_only(protocol::commit_type, 0, position));
        refusal = co_await refusal_on(c);
        server.stop();
      },
      10s);
  INFO(joined(slog));
  CHECK(position == 1);
  CHECK(refusal == errc::update_too_large);
  CHECK(server.recovery().stats().dropped == 1);
  CHECK(server.stats().pushes == 0);
  CHECK(any_line_has(slog, "dropped a held message of worker 0 (type 3, clock 0, position 1): "
                           "push refused: its L2 norm exceeds the server's max_update_norm"));
}

TEST_CASE("insider: a replica-log worker that never confirms its order is closed after "
          "commit_timeout; its update is voided, never applied, and the honest worker's applies") {
  // Write-ahead: every later update waits behind an unconfirmed position. Worker 0 (raw frames)
  // pushes, takes its order and never commits; worker 1 pushes behind it and commits. The real
  // server's watch closes worker 0 after commit_timeout, voids its order after void_timeout
  // (it does not come back) and applies worker 1's update, which is then acknowledged.
  asio::io_context io(1);
  in_process_network net;
  test::log_lines slog;
  server_options so = logged_options(2, slog);
  in_process_transport st(io.get_executor(), net);
  using server_t = basic_server<in_process_transport, consistency::asp, recovery::replica_log>;
  recovery::replica_log_server_part part;
  part.options.commit_timeout = 200ms;
  part.options.void_timeout = 200ms;
  server_t server(st, so, optimizer::sgd{1.0f}, std::move(part));
  asio::co_spawn(io, test::listen_and_serve(st, "shard0", server), asio::detached);
  in_process_transport t0(io.get_executor(), net), t1(io.get_executor(), net);
  const std::vector<protocol::layout_entry> layout{{4, 2}};
  bool evil_closed = false;
  std::uint64_t acked = 0;
  test::run_coro(
      io,
      [&]() -> asio::awaitable<void> {
        auto [ec0, c0] = co_await t0.async_connect("shard0");
        REQUIRE(!ec0);
        (void)co_await c0.async_send(
            hello_of<consistency::asp, recovery::replica_log>(0, 0, layout, 0, t0, 7));
        auto [wec0, w0] = co_await c0.async_receive();
        REQUIRE(!wec0);
        REQUIRE(w0.header.type == message_type::welcome);
        (void)co_await c0.async_send(push_of(t0, 0, 1.0f, frame_flags::want_ack));
        auto [oec0, o0] = co_await c0.async_receive();
        REQUIRE(!oec0);
        REQUIRE(o0.header.type == protocol::order_type);  // position 1: never confirmed

        auto [ec1, c1] = co_await t1.async_connect("shard0");
        REQUIRE(!ec1);
        (void)co_await c1.async_send(
            hello_of<consistency::asp, recovery::replica_log>(1, 0, layout, 0, t1, 8));
        auto [wec1, w1] = co_await c1.async_receive();
        REQUIRE(!wec1);
        (void)co_await c1.async_send(push_of(t1, 1, 2.0f, frame_flags::want_ack));
        auto [oec1, o1] = co_await c1.async_receive();
        REQUIRE(!oec1);
        protocol::order o;
        std::string why;
        REQUIRE(!protocol::decode(o1, o, why));
        REQUIRE(o.size() == 1);
        CHECK(o.entry(0).position == 2);
        (void)co_await c1.async_send(header_only(protocol::commit_type, 0, 2, 1));

        // Worker 0's connection ends (the server closes it); nothing else comes on it.
        auto [cec, cm] = co_await c0.async_receive();
        evil_closed = static_cast<bool>(cec);
        // Worker 1's push is applied once worker 0's order is voided, and acknowledged.
        auto [aec, am] = co_await c1.async_receive();
        REQUIRE(!aec);
        if (am.header.type == message_type::ack) acked = am.header.seq;
        server.stop();
      },
      20s);
  INFO(joined(slog));
  CHECK(evil_closed);
  CHECK(acked == 1);
  CHECK(server.recovery().stats().commit_timeouts == 1);
  CHECK(server.recovery().stats().voided == 1);
  CHECK(server.stats().pushes == 1);  // worker 1's only
  CHECK(any_line_has(slog, "worker 0 did not confirm position 1 within 200 ms of its order"));
  CHECK(any_line_has(slog, "dropped the unconfirmed updates of disconnected workers"));
}

namespace {

// An in-process transport whose receive throws std::bad_alloc for a heartbeat with seq
// `no_memory_seq`, as a real transport's frame allocation does when the heap is exhausted,
// and whose acceptor throws it after taking a connection while `failing_accepts` > 0 (each
// such accept counts it down; the connection taken is dropped, closed).
struct alloc_failing_transport {
  static constexpr std::uint64_t no_memory_seq = 0xbad;
  using executor_type = in_process_transport::executor_type;
  using endpoint_type = in_process_transport::endpoint_type;
  struct connection_type {
    in_process_transport::connection_type inner;
    asio::awaitable<std::error_code> async_send(message m) {
      co_return co_await inner.async_send(std::move(m));
    }
    asio::awaitable<std::tuple<std::error_code, message>> async_receive() {
      auto r = co_await inner.async_receive();
      const auto& h = std::get<1>(r).header;
      if (!std::get<0>(r) && h.type == message_type::heartbeat && h.seq == no_memory_seq)
        throw std::bad_alloc();
      co_return r;
    }
    void close() noexcept { inner.close(); }
    bool is_open() const { return inner.is_open(); }
  };
  struct acceptor_type {
    in_process_transport::acceptor_type inner;
    int* failing;
    asio::awaitable<std::tuple<std::error_code, connection_type>> async_accept() {
      auto [ec, c] = co_await inner.async_accept();
      if (!ec && *failing > 0) {
        --*failing;
        throw std::bad_alloc();
      }
      co_return std::tuple{ec, connection_type{std::move(c)}};
    }
    void close() noexcept { inner.close(); }
  };
  in_process_transport& inner;
  int failing_accepts = 0;
  executor_type get_executor() const { return inner.get_executor(); }
  result<acceptor_type> listen(const endpoint_type& ep) {
    auto r = inner.listen(ep);
    if (!r) return r.error();
    return acceptor_type{std::move(r).value(), &failing_accepts};
  }
  asio::awaitable<std::tuple<std::error_code, connection_type>> async_connect(endpoint_type ep) {
    auto [ec, c] = co_await inner.async_connect(std::move(ep));
    co_return std::tuple{ec, connection_type{std::move(c)}};
  }
  buffer allocate(std::size_t n) { return inner.allocate(n); }
  const wire_limits& limits() const { return inner.limits(); }
};
static_assert(transport<alloc_failing_transport>);

}  // namespace

TEST_CASE("memory: a std::bad_alloc while receiving a frame closes that session, logged; the "
          "server serves on and stops") {
  // The read loop used to let the exception end its coroutine (detached: swallowed) without
  // finishing the session: no log line, the worker id held, and a server that never stopped.
  asio::io_context io(1);
  in_process_network net;
  test::log_lines slog;
  const server_options so = logged_options(1, slog);
  in_process_transport inner(io.get_executor(), net);
  alloc_failing_transport st{inner};
  basic_server<alloc_failing_transport, consistency::asp> server(st, so, optimizer::sgd{1.0f});
  bool served = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        co_await test::listen_and_serve(st, std::string("shard0"), server);
        served = true;
      },
      asio::detached);
  in_process_transport client(io.get_executor(), net);
  bool first_closed = false, second_welcomed = false, dropped = false, third_welcomed = false;
  test::run_coro(
      io,
      [&]() -> asio::awaitable<void> {
        const std::vector<protocol::layout_entry> layout{{4, 2}};
        {
          auto [ec, c] = co_await client.async_connect("shard0");
          REQUIRE(!ec);
          (void)co_await c.async_send(
              hello_of<consistency::asp, recovery::none>(0, 0, layout, 0, client, 1));
          auto [wec, welcome] = co_await c.async_receive();
          REQUIRE(!wec);
          REQUIRE(welcome.header.type == message_type::welcome);
          (void)co_await c.async_send(
              header_only(message_type::heartbeat, 0, alloc_failing_transport::no_memory_seq));
          auto [rec, m] = co_await c.async_receive();
          first_closed = static_cast<bool>(rec);
        }
        // The server serves on: the same worker id gets in again (its session finished).
        co_await wait_until(io, [&] { return server.workers_connected() == 0; }, 2s);
        auto [ec, c] = co_await client.async_connect("shard0");
        REQUIRE(!ec);
        (void)co_await c.async_send(
            hello_of<consistency::asp, recovery::none>(0, 0, layout, 0, client, 2));
        auto [wec, welcome] = co_await c.async_receive();
        second_welcomed = !wec && welcome.header.type == message_type::welcome;
        c.close();
        // The next accept throws after taking a connection: that one is dropped, the server
        // pauses, logs and accepts again (before, the exception ended async_serve).
        co_await wait_until(io, [&] { return server.workers_connected() == 0; }, 2s);
        st.failing_accepts = 1;
        {
          auto [dec, d] = co_await client.async_connect("shard0");
          REQUIRE(!dec);
          auto [rec, m] = co_await d.async_receive();
          dropped = static_cast<bool>(rec);
        }
        auto [tec, t] = co_await client.async_connect("shard0");
        REQUIRE(!tec);
        (void)co_await t.async_send(
            hello_of<consistency::asp, recovery::none>(0, 0, layout, 0, client, 3));
        auto [tw, third] = co_await t.async_receive();
        third_welcomed = !tw && third.header.type == message_type::welcome;
        t.close();
        server.stop();
        co_await wait_until(io, [&] { return served; }, 2s);
      },
      10s);
  INFO(joined(slog));
  CHECK(first_closed);
  CHECK(second_welcomed);
  CHECK(dropped);
  CHECK(any_line_has(slog, "accept failed (" +
                               std::make_error_code(std::errc::not_enough_memory).message() +
                               "); retrying in 1 ms"));
  CHECK(third_welcomed);
  CHECK(served);  // async_serve completed: every session finished
  CHECK(server.stats().rejected >= 1);
  CHECK(any_line_has(slog, "closing connection of worker 0: out of memory while handling the "
                           "peer's message (no memory for a received frame)"));
}

TEST_CASE("memory: a std::bad_alloc while the chain master receives a frame closes that member's "
          "session only, logged and counted; a throwing accept is retried; the master serves "
          "on and stops") {
  // The master's read loop used to let the exception end its coroutine (detached: swallowed)
  // without finishing the session: the member stayed registered with its connection open (no
  // failover, no log line), and async_serve never completed after stop(). An accept that
  // threw ended async_serve itself: the master stopped serving, silently.
  asio::io_context io(1);
  in_process_network net;
  test::log_lines mlog;
  in_process_transport inner(io.get_executor(), net);
  alloc_failing_transport mt{inner};
  chain_master_options mo;
  mo.members = 1;  // a chain of one: a registration is answered with its configuration at once
  mo.heartbeat_timeout = 30s;
  mo.log = [&](std::string_view l) { mlog.emplace_back(l); };
  basic_chain_master<alloc_failing_transport> master(mt, mo);
  bool served = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        co_await test::listen_and_serve(mt, std::string("master"), master);
        served = true;
      },
      asio::detached);
  in_process_transport client(io.get_executor(), net);
  // Registers as member 0 of shard 0 on `c`; whether the master answered with a configuration.
  const auto registered = [&](auto& c) -> asio::awaitable<bool> {
    (void)co_await c.async_send(chain_hello_of(0, client));
    auto [ec, m] = co_await c.async_receive();
    co_return !ec && m.header.type == protocol::chain_config_type;
  };
  bool first_registered = false, first_closed = false, removed = false;
  bool second_registered = false, dropped = false, third_registered = false;
  std::uint64_t out_of_memory_before_accept = 0;
  test::run_coro(
      io,
      [&]() -> asio::awaitable<void> {
        {
          auto [ec, c] = co_await client.async_connect("master");
          REQUIRE(!ec);
          first_registered = co_await registered(c);
          (void)co_await c.async_send(
              header_only(message_type::heartbeat, 0, alloc_failing_transport::no_memory_seq));
          auto [rec, m] = co_await c.async_receive();
          first_closed = static_cast<bool>(rec);
        }
        co_await wait_until(io, [&] { return master.chain(0).empty(); }, 2s);
        removed = master.chain(0).empty();
        out_of_memory_before_accept = master.stats().out_of_memory;
        {  // the master serves on: member 0 registers again
          auto [ec, c] = co_await client.async_connect("master");
          REQUIRE(!ec);
          second_registered = co_await registered(c);
        }  // closed: member 0 is free again
        co_await wait_until(io, [&] { return master.chain(0).empty(); }, 2s);
        // The next accept throws after taking a connection: that one is dropped, the master
        // pauses, logs and accepts again.
        mt.failing_accepts = 1;
        {
          auto [ec, c] = co_await client.async_connect("master");
          REQUIRE(!ec);
          auto [rec, m] = co_await c.async_receive();
          dropped = static_cast<bool>(rec);
        }
        auto [ec, c] = co_await client.async_connect("master");
        REQUIRE(!ec);
        third_registered = co_await registered(c);
        c.close();
        master.stop();
        co_await wait_until(io, [&] { return served; }, 2s);
      },
      10s);
  INFO(joined(mlog));
  CHECK(first_registered);
  CHECK(first_closed);
  CHECK(removed);  // the member whose session ended is out of its chain
  CHECK(out_of_memory_before_accept == 1);
  CHECK(any_line_has(mlog, "closing the connection of shard 0 server 0: out of memory while "
                           "handling the peer's message (no memory for a received frame)"));
  CHECK(any_line_has(mlog, "shard 0 server 0 removed (connection lost)"));
  CHECK(second_registered);
  CHECK(dropped);
  CHECK(any_line_has(mlog, "accept failed (" +
                               std::make_error_code(std::errc::not_enough_memory).message() +
                               "); retrying in 1 ms"));
  CHECK(third_registered);
  CHECK(master.stats().registrations == 3);
  CHECK(master.stats().refused == 0);
  CHECK(served);  // async_serve completed: every session finished
}

TEST_CASE("memory: a std::bad_alloc while the rendezvous receives a frame closes that session "
          "only, logged and counted; a waiting lookup is answered; a throwing accept is "
          "retried; the rendezvous serves on and stops") {
  // The rendezvous's read loop used to let the exception end its coroutine (detached:
  // swallowed) without finishing the session: its connection stayed open with no log line,
  // and async_serve never completed after stop(). An accept that threw ended async_serve.
  asio::io_context io(1);
  in_process_network net;
  test::log_lines rlog;
  in_process_transport inner(io.get_executor(), net);
  alloc_failing_transport rt{inner};
  rendezvous_options ro;
  ro.num_servers = 1;
  ro.num_workers = 2;
  ro.log = [&](std::string_view l) { rlog.emplace_back(l); };
  basic_rendezvous<alloc_failing_transport> rv(rt, ro);
  bool served = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        co_await test::listen_and_serve(rt, std::string("rendezvous"), rv);
        served = true;
      },
      asio::detached);
  in_process_transport client(io.get_executor(), net);
  std::optional<std::tuple<std::error_code, rendezvous_directory>> waiting;
  bool first_closed = false, dropped = false;
  std::size_t waiting_after_failure = 0;
  std::error_code announced = make_error_code(errc::timeout);
  std::optional<std::tuple<std::error_code, rendezvous_directory>> after_accept;
  test::run_coro(
      io,
      [&]() -> asio::awaitable<void> {
        // A lookup waits for shard 0 on its own connection.
        asio::co_spawn(
            io,
            [&]() -> asio::awaitable<void> {
              waiting = co_await async_lookup_servers(client, std::string("rendezvous"),
                                                      std::nullopt, 5s);
            },
            asio::detached);
        co_await wait_until(io, [&] { return rv.waiting_lookups() == 1; }, 2s);
        REQUIRE(rv.waiting_lookups() == 1);
        {
          auto [ec, c] = co_await client.async_connect("rendezvous");
          REQUIRE(!ec);
          (void)co_await c.async_send(
              header_only(message_type::heartbeat, 0, alloc_failing_transport::no_memory_seq));
          auto [rec, m] = co_await c.async_receive();
          first_closed = static_cast<bool>(rec);
        }
        waiting_after_failure = rv.waiting_lookups();
        // The rendezvous serves on: an announce is answered, and so is the waiting lookup.
        auto [aec, a] = co_await async_announce_server(client, std::string("rendezvous"), 0u, 7000,
                                                       5s, "node-a");
        announced = aec;
        co_await wait_until(io, [&] { return waiting.has_value(); }, 2s);
        // The next accept throws after taking a connection: that one is dropped, the
        // rendezvous pauses, logs and accepts again.
        rt.failing_accepts = 1;
        {
          auto [ec, c] = co_await client.async_connect("rendezvous");
          REQUIRE(!ec);
          auto [rec, m] = co_await c.async_receive();
          dropped = static_cast<bool>(rec);
        }
        after_accept =
            co_await async_lookup_servers(client, std::string("rendezvous"), std::nullopt, 5s);
        rv.stop();
        co_await wait_until(io, [&] { return served; }, 2s);
      },
      10s);
  INFO(joined(rlog));
  CHECK(first_closed);
  CHECK(waiting_after_failure == 1);  // the other session is untouched
  CHECK(rv.stats().out_of_memory == 1);
  CHECK(rv.stats().refused == 0);
  CHECK(any_line_has(rlog, "closing the connection: out of memory while handling the peer's "
                           "message (no memory for a received frame)"));
  CHECK(!announced);
  REQUIRE(waiting.has_value());
  CHECK(!std::get<0>(*waiting));
  CHECK(std::get<1>(*waiting).servers == std::vector<std::string>{"node-a:7000"});
  CHECK(std::get<1>(*waiting).worker_id == 0);
  CHECK(dropped);
  CHECK(any_line_has(rlog, "accept failed (" +
                               std::make_error_code(std::errc::not_enough_memory).message() +
                               "); retrying in 1 ms"));
  REQUIRE(after_accept.has_value());
  CHECK(!std::get<0>(*after_accept));
  CHECK(std::get<1>(*after_accept).worker_id == 1);
  CHECK(rv.stats().lookups == 2);
  CHECK(served);  // async_serve completed: every session finished
}

namespace {

// TCP options over TLS with `tls` (the certificate issued by test_pki).
tcp_options tls_only(const tls_options& tls) {
  tcp_options o;
  o.tls = tls;
  return o;
}

// Listens on a free loopback port of `t`; `node.async_serve` runs on `io`. Returns the port.
template <class Node>
asio::ip::tcp::endpoint serve_loopback(asio::io_context& io, tcp_transport& t, Node& node) {
  auto acc = t.listen({asio::ip::make_address("127.0.0.1"), 0});
  REQUIRE(acc.has_value());
  const auto ep = acc.value().local_endpoint();
  asio::co_spawn(io, node.async_serve(std::move(acc).value()), asio::detached);
  return ep;
}

}  // namespace

TEST_CASE("identity: URIs parse strictly; a name covers its own id or every id of its role") {
  CHECK(parse_peer_name("asyncps://worker/1") == peer_name{peer_role::worker, 1});
  CHECK(parse_peer_name("asyncps://server/*") == peer_name{peer_role::server, peer_name::any});
  CHECK(parse_peer_name("asyncps://chain/0/2") == peer_name{peer_role::chain, 0, 2});
  CHECK(parse_peer_name("asyncps://reader/*").has_value());
  for (const char* bad : {"asyncps://wroker/1", "asyncps://Worker/1", "asyncps://worker/",
                          "asyncps://worker", "asyncps://worker/1/2", "asyncps://chain/0",
                          "asyncps://worker/-1", "asyncps://worker/4294967295",
                          "asyncps://worker/99999999999", "asyncps:/worker/1", "https://x/1"}) {
    INFO(bad);
    CHECK(!parse_peer_name(bad).has_value());
  }
  CHECK(is_identity_uri("ASYNCPS://worker/1"));  // refused as malformed, never ignored
  CHECK(!is_identity_uri("https://example.org"));
  const peer_identity p{{{peer_role::worker, 1}, {peer_role::chain, 0, peer_name::any}}};
  CHECK(p.allows(peer_role::worker, 1));
  CHECK(!p.allows(peer_role::worker, 0));
  CHECK(p.allows(peer_role::chain, 0, 5));
  CHECK(!p.allows(peer_role::chain, 1, 5));
  CHECK(!p.allows(peer_role::server, 0));
  CHECK(to_string(p) == "asyncps://worker/1, asyncps://chain/0/*");
  CHECK(detail::identity_refusal(nullptr, "x", peer_role::worker, 0).empty());
  CHECK(detail::identity_refusal(&p, "a hello as worker 0", peer_role::worker, 0) ==
        "a hello as worker 0, but this connection's certificate names asyncps://worker/1, "
        "asyncps://chain/0/*");
}

TEST_CASE("identity: the TLS connection names the peer's identity; a malformed one, or none "
          "under require_identity, fails the handshake; none without it is any member") {
  asio::io_context io(1);
  test::test_pki pki("identity");
  tls_options listener_tls = pki.issue("server-0", {"asyncps://server/0"});
  listener_tls.require_identity = true;
  tcp_transport strict(io.get_executor(), tls_only(listener_tls));
  tcp_transport lenient(io.get_executor(), tls_only(pki.issue("server-1")));
  tcp_transport named(io.get_executor(), tls_only(pki.issue("worker-1", {"asyncps://worker/1",
                                                                         "asyncps://reader/*"})));
  tcp_transport unnamed(io.get_executor(), tls_only(pki.issue("plain")));
  tcp_transport misspelt(io.get_executor(), tls_only(pki.issue("typo", {"asyncps://wroker/1"})));
  auto sacc = strict.listen({asio::ip::make_address("127.0.0.1"), 0});
  auto lacc = lenient.listen({asio::ip::make_address("127.0.0.1"), 0});
  REQUIRE(sacc.has_value());
  REQUIRE(lacc.has_value());
  const auto sep = sacc.value().local_endpoint();
  const auto lep = lacc.value().local_endpoint();
  std::string named_seen, named_saw_listener, unnamed_refusal, listener_refusal, typo_refusal,
      typo_listener_refusal;
  std::error_code unnamed_ec, typo_ec;
  bool lenient_unnamed_null = false;
  test::run_coro(io, [&]() -> asio::awaitable<void> {
    // A named certificate: accepted, and both ends see the other's names.
    {
      auto accepted = [&]() -> asio::awaitable<void> {
        auto [aec, a] = co_await sacc.value().async_accept();
        REQUIRE(!aec);
        CHECK(a.identity() == nullptr);  // the handshake runs in the first receive
        auto [rec, m] = co_await a.async_receive();
        REQUIRE(!rec);
        REQUIRE(a.identity() != nullptr);
        named_seen = to_string(*a.identity());
      };
      asio::co_spawn(io, accepted(), asio::detached);
      auto [ec, c] = co_await named.async_connect(sep);
      REQUIRE(!ec);
      REQUIRE(c.identity() != nullptr);
      named_saw_listener = to_string(*c.identity());
      (void)co_await c.async_send(header_only(message_type::heartbeat, 0, 0));
      co_await wait_until(io, [&] { return !named_seen.empty(); });
    }
    // No asyncps name under require_identity: refused, and the connector is told (final).
    {
      auto accepted = [&]() -> asio::awaitable<void> {
        auto [aec, a] = co_await sacc.value().async_accept();
        REQUIRE(!aec);
        auto [rec, m] = co_await a.async_receive();
        CHECK(rec == errc::tls_handshake_failed);
        listener_refusal = std::string(a.tls_failure());
      };
      asio::co_spawn(io, accepted(), asio::detached);
      auto [ec, c] = co_await unnamed.async_connect(sep);
      unnamed_ec = ec;
      unnamed_refusal = std::string(c.tls_failure());
    }
    // A misspelt asyncps name: refused even by a listener without require_identity.
    {
      auto accepted = [&]() -> asio::awaitable<void> {
        auto [aec, a] = co_await lacc.value().async_accept();
        REQUIRE(!aec);
        auto [rec, m] = co_await a.async_receive();
        CHECK(rec == errc::tls_handshake_failed);
        typo_listener_refusal = std::string(a.tls_failure());
      };
      asio::co_spawn(io, accepted(), asio::detached);
      auto [ec, c] = co_await misspelt.async_connect(lep);
      typo_ec = ec;
      typo_refusal = std::string(c.tls_failure());
    }
    // Without require_identity, no name is today's behaviour: accepted, no identity.
    {
      bool received = false;
      auto accepted = [&]() -> asio::awaitable<void> {
        auto [aec, a] = co_await lacc.value().async_accept();
        REQUIRE(!aec);
        auto [rec, m] = co_await a.async_receive();
        lenient_unnamed_null = !rec && a.identity() == nullptr;
        received = true;
      };
      asio::co_spawn(io, accepted(), asio::detached);
      auto [ec, c] = co_await unnamed.async_connect(lep);
      REQUIRE(!ec);
      CHECK(c.identity() == nullptr);  // the listener's certificate names none either
      (void)co_await c.async_send(header_only(message_type::heartbeat, 0, 0));
      co_await wait_until(io, [&] { return received; });
    }
  });
  CHECK(named_seen == "asyncps://worker/1, asyncps://reader/*");
  CHECK(named_saw_listener == "asyncps://server/0");
  CHECK(unnamed_ec == errc::tls_handshake_failed);
  CHECK(is_final_connect_error(unnamed_ec));
  CHECK(unnamed_refusal.find("the listener refused this node's certificate identity") == 0);
  CHECK(listener_refusal ==
        "the peer's certificate names no asyncps identity (tls_options::require_identity)");
  CHECK(typo_ec == errc::tls_handshake_failed);
  CHECK(typo_listener_refusal.find("malformed asyncps identity") != std::string::npos);
  CHECK(typo_refusal.find("the listener refused") == 0);
  CHECK(lenient_unnamed_null);
  // require_identity means nothing without verification: refused at setup.
  tls_options unverified = pki.issue("unverified");
  unverified.verify_peer = false;
  unverified.require_identity = true;
  std::string why;
  CHECK(!make_tls_context(unverified, why));
  CHECK(why.find("require_identity needs verify_peer") != std::string::npos);
}

TEST_CASE("identity: worker 1's certificate cannot say hello as worker 0; a matching one and "
          "one naming no identity train") {
  asio::io_context io(1);
  test::test_pki pki("hello");
  tcp_transport st(io.get_executor(), tls_only(pki.issue("server", {"asyncps://server/0"})));
  test::log_lines slog;
  server_options so = logged_options(2, slog);
  so.tables = {table_spec{0, 2, 4, 0.0f}};  // counter_model's: one row per worker
  basic_server<tcp_transport, consistency::ssp<1>> server(st, so, optimizer::sgd{1.0f});
  const auto ep = serve_loopback(io, st, server);
  using worker_t = basic_worker<test::counter_model, tcp_transport, consistency::ssp<1>>;
  // Worker 0 with worker 1's certificate; then worker 0 with its own, worker 1 with none.
  const std::vector<std::pair<std::uint32_t, std::vector<std::string>>> runs{
      {0, {"asyncps://worker/1"}}, {0, {"asyncps://worker/0"}}, {1, {}}};
  std::vector<std::unique_ptr<tcp_transport>> ts;
  std::vector<std::unique_ptr<test::counter_model>> models;
  std::vector<std::unique_ptr<worker_t>> ws;
  test::log_lines wlog;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    ts.push_back(std::make_unique<tcp_transport>(
        io.get_executor(), tls_only(pki.issue("worker-run-" + std::to_string(i), runs[i].second))));
    models.push_back(std::make_unique<test::counter_model>(runs[i].first, 2, 1));
    worker_options<asio::ip::tcp::endpoint> o;
    o.id = runs[i].first;
    o.servers = {ep};
    o.wait_timeout = 10s;
    o.log = [&wlog](std::string_view l) { wlog.emplace_back(l); };
    ws.push_back(std::make_unique<worker_t>(*ts[i], *models[i], o));
  }
  std::error_code impostor, errors[2];
  std::uint64_t rejected_after_impostor = 0;
  test::run_coro(
      io,
      [&]() -> asio::awaitable<void> {
        impostor = co_await ws[0]->async_run(5);
        rejected_after_impostor = server.stats().rejected;
        int done = 0;
        for (std::size_t i = 1; i < 3; ++i)
          asio::co_spawn(
              io,
              [&, i]() -> asio::awaitable<void> {
                errors[i - 1] = co_await ws[i]->async_run(5);
                ++done;
              },
              asio::detached);
        co_await wait_until(io, [&] { return done == 2; }, 20s);
        server.stop();
      },
      30s);
  INFO(joined(slog));
  INFO(joined(wlog));
  CHECK(impostor == errc::bad_sender);
  CHECK(rejected_after_impostor == 1);
  CHECK(any_line_has(slog, "a hello as worker 0, but this connection's certificate names "
                           "asyncps://worker/1"));
  CHECK(!errors[0]);
  CHECK(!errors[1]);
  const auto v = server.values(0);
  bool exact = true;
  for (float x : v) exact = exact && x == 5.0f;  // row w: worker w's 5 pushes
  CHECK(exact);
}

TEST_CASE("identity: a worker's certificate cannot register as a chain member, at the master "
          "or at a member; a chain certificate registers only the member it names") {
  asio::io_context io(1);
  test::test_pki pki("chain");
  test::log_lines slog, mlog;
  tcp_transport mt(io.get_executor(), tls_only(pki.issue("master", {"asyncps://master/*"})));
  chain_master_options mo;
  mo.members = 2;
  mo.log = [&](std::string_view l) { mlog.emplace_back(l); };
  basic_chain_master<tcp_transport> master(mt, mo);
  const auto mep = serve_loopback(io, mt, master);
  using tcp_chain_server = basic_server<tcp_transport, consistency::bsp, strict_chain>;
  const server_options so = logged_options(1, slog);
  strict_chain::server_part part;
  part.options.heartbeat_interval = 20ms;
  std::vector<std::unique_ptr<tcp_transport>> sts;
  std::vector<std::unique_ptr<tcp_chain_server>> servers;
  std::vector<tcp_transport::acceptor> accs;
  std::vector<asio::ip::tcp::endpoint> eps;
  for (std::uint32_t m = 0; m < 2; ++m) {
    sts.push_back(std::make_unique<tcp_transport>(
        io.get_executor(), tls_only(pki.issue("member-" + std::to_string(m),
                                              {"asyncps://chain/0/" + std::to_string(m)}))));
    auto acc = sts.back()->listen({asio::ip::make_address("127.0.0.1"), 0});
    REQUIRE(acc.has_value());
    eps.push_back(acc.value().local_endpoint());
    accs.push_back(std::move(acc).value());
  }
  tcp_transport worker_cert(io.get_executor(),
                            tls_only(pki.issue("worker-0", {"asyncps://worker/0"})));
  tcp_transport member1_cert(io.get_executor(),
                             tls_only(pki.issue("member-1-again", {"asyncps://chain/0/1"})));
  std::vector<bool> refused_at_master;
  std::optional<std::error_code> worker_at_member, other_member_at_member;
  bool started = false;
  std::vector<std::uint32_t> chain;
  // A chain_hello of member `member` over a new connection of `t` to `ep`; the error code
  // of the refusal (nullopt: none, e.g. closed without a word).
  const auto claim = [&](tcp_transport& t, asio::ip::tcp::endpoint ep,
                         std::uint32_t member) -> asio::awaitable<std::optional<std::error_code>> {
    auto [ec, c] = co_await t.async_connect(ep);
    REQUIRE(!ec);
    (void)co_await c.async_send(protocol::encode(
        protocol::chain_hello{.shard = 0,
                              .member = member,
                              .fingerprint = policy_fingerprint<consistency::bsp, strict_chain>()},
        [&](std::size_t n) { return t.allocate(n); }));
    co_return co_await refusal_on(c);
  };
  test::run_coro(
      io,
      [&]() -> asio::awaitable<void> {
        // At the master, before the real members: a worker's certificate as member 0, and
        // member 1's certificate as member 0. The master closes both without a frame.
        for (auto* t : {&worker_cert, &member1_cert}) {
          auto [ec, c] = co_await t->async_connect(mep);
          REQUIRE(!ec);
          (void)co_await c.async_send(protocol::encode(
              protocol::chain_hello{.shard = 0,
                                    .member = 0,
                                    .fingerprint =
                                        policy_fingerprint<consistency::bsp, strict_chain>()},
              [&](std::size_t n) { return t->allocate(n); }));
          auto [rec, m] = co_await c.async_receive();
          refused_at_master.push_back(static_cast<bool>(rec));
        }
        CHECK(master.chain(0).empty());
        // The real members, each with its own certificate.
        for (std::uint32_t m = 0; m < 2; ++m) {
          servers.push_back(
              std::make_unique<tcp_chain_server>(*sts[m], so, optimizer::sgd{1.0f}, part));
          servers.back()->recovery().set_chain(mep, eps, m);
          asio::co_spawn(io, servers.back()->async_serve(std::move(accs[m])), asio::detached);
        }
        co_await wait_until(io, [&] { return master.started(); });
        started = master.started();
        chain = master.chain(0);
        // At member 1, whose predecessor is member 0: the same two claims of member 0.
        worker_at_member = co_await claim(worker_cert, eps[1], 0);
        other_member_at_member = co_await claim(member1_cert, eps[1], 0);
        for (auto& s : servers) s->stop();
        master.stop();
      },
      20s);
  INFO(joined(mlog));
  INFO(joined(slog));
  CHECK(refused_at_master == std::vector<bool>{true, true});
  CHECK(started);
  CHECK(chain == std::vector<std::uint32_t>{0, 1});
  CHECK(master.stats().refused == 2);
  CHECK(master.stats().registrations == 2);
  CHECK(any_line_has(mlog, "chain_hello names shard 0 server 0, but this connection's "
                           "certificate names asyncps://worker/0"));
  CHECK(any_line_has(mlog, "chain_hello names shard 0 server 0, but this connection's "
                           "certificate names asyncps://chain/0/1"));
  // Without the identity check the live link's id would answer member_id_in_use (transient:
  // retried) or, once silent, install the claimant as the predecessor.
  CHECK(worker_at_member == errc::bad_sender);
  CHECK(other_member_at_member == errc::bad_sender);
  CHECK(any_line_has(slog, "chain_hello from server 0 of shard 0, but this connection's "
                           "certificate names asyncps://worker/0"));
  CHECK(any_line_has(slog, "chain_hello from server 0 of shard 0, but this connection's "
                           "certificate names asyncps://chain/0/1"));
}

TEST_CASE("identity: the rendezvous takes an announce or a worker id only as the certificate "
          "names it") {
  asio::io_context io(1);
  test::test_pki pki("rendezvous");
  test::log_lines rlog;
  tcp_transport rt(io.get_executor(), tls_only(pki.issue("root", {"asyncps://rendezvous/*"})));
  rendezvous_options ro;
  ro.num_servers = 2;
  ro.num_workers = 2;
  ro.log = [&](std::string_view l) { rlog.emplace_back(l); };
  basic_rendezvous<tcp_transport> rv(rt, ro);
  const auto root = serve_loopback(io, rt, rv);
  tcp_transport server0(io.get_executor(), tls_only(pki.issue("s0", {"asyncps://server/0"})));
  tcp_transport any_server(io.get_executor(), tls_only(pki.issue("s", {"asyncps://server/*"})));
  tcp_transport worker1(io.get_executor(), tls_only(pki.issue("w1", {"asyncps://worker/1"})));
  const log_function quiet = [](std::string_view) {};
  std::error_code as_shard1, as_any, as_shard0, wildcard_any, as_worker0, as_any_worker, as_worker1,
      no_id;
  std::uint32_t wildcard_shard = 99;
  test::run_coro(
      io,
      [&]() -> asio::awaitable<void> {
        as_shard1 = std::get<0>(
            co_await async_announce_server(server0, root, 1u, 7001, 5s, "127.0.0.1", quiet));
        as_any = std::get<0>(co_await async_announce_server(server0, root, std::nullopt, 7001, 5s,
                                                            "127.0.0.1", quiet));
        as_shard0 = std::get<0>(
            co_await async_announce_server(server0, root, 0u, 7000, 5s, "127.0.0.1", quiet));
        auto [wec, wa] = co_await async_announce_server(any_server, root, std::nullopt, 7001, 5s,
                                                        "127.0.0.1", quiet);
        wildcard_any = wec;
        wildcard_shard = wa.shard;
        as_worker0 = std::get<0>(co_await async_lookup_servers(worker1, root, 0u, 5s, quiet));
        as_any_worker =
            std::get<0>(co_await async_lookup_servers(worker1, root, std::nullopt, 5s, quiet));
        as_worker1 = std::get<0>(co_await async_lookup_servers(worker1, root, 1u, 5s, quiet));
        no_id = std::get<0>(
            co_await async_lookup_servers(server0, root, rendezvous_no_worker_id, 5s, quiet));
        rv.stop();
      },
      20s);
  INFO(joined(rlog));
  CHECK(as_shard1 == errc::rendezvous_refused);
  CHECK(as_any == errc::rendezvous_refused);
  CHECK(!as_shard0);
  CHECK(!wildcard_any);
  CHECK(wildcard_shard == 1);
  CHECK(as_worker0 == errc::rendezvous_refused);
  CHECK(as_any_worker == errc::rendezvous_refused);
  CHECK(!as_worker1);
  CHECK(!no_id);
  CHECK(rv.stats().refused == 4);
  CHECK(rv.stats().announces == 2);
  CHECK(any_line_has(rlog, "an announce of shard 1, but this connection's certificate names "
                           "asyncps://server/0"));
  CHECK(any_line_has(rlog, "an announce of any shard, but this connection's certificate names "
                           "asyncps://server/0"));
  CHECK(any_line_has(rlog, "a lookup as worker 0, but this connection's certificate names "
                           "asyncps://worker/1"));
  CHECK(any_line_has(rlog, "a lookup for any worker id, but this connection's certificate "
                           "names asyncps://worker/1"));
}
