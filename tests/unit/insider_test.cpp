// A peer that holds the secret is still input (issue 32, docs/security.md "What an insider can
// still do"): a restored or replicated state is validated before it is installed, a replica-log
// rebuild never calls itself exact on a replica's word, positions from the wire are
// range-checked, and one hello cannot end a live worker's run. Each test steps a real server
// over the in-process transport with a hand-written hostile peer, or steps the shard core.
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <doctest/doctest.h>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/detail/shard_core.hpp"
#include "asyncps/detail/shard_state_codec.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery/replica_log.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/in_process.hpp"
#include "asyncps/worker.hpp"
#include "counter_model.hpp"
#include "listen_and_serve.hpp"
#include "log_lines.hpp"
#include "run_coro.hpp"

using namespace asyncps;
using namespace std::chrono_literals;

namespace {

using test::any_line_has;
using test::joined;
using core_t = detail::shard_core<optimizer::momentum, int, int>;

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
// header flags `flags` (e.g. `frame_flags::state`: it holds a replica log for the shard).
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
  // A fresh replica-log shard meets a hello with the state flag (as after a restart) and
  // rebuilds. The only peer is an insider with worker 0's id: it sends a finite replica of
  // position 2^62 whose values are all 1000, an empty log, and the end of its replay at
  // stable position 0. Its replica claims 2^62 updates no log holds: the shard rebuilds from
  // its initial state (exactly right: no update was ever logged) and never installs it.
  asio::io_context io(1);
  in_process_network net;
  test::log_lines slog;
  server_options so;
  so.num_workers = 1;
  so.tables = {table_spec{0, 4, 2, 0.0f}};
  so.log = [&](std::string_view l) { slog.emplace_back(l); };
  so.watchdog_interval = 0ms;
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
            0, 5, layout, frame_flags::state, evil));
        auto [wec, welcome] = co_await c.async_receive();
        REQUIRE(!wec);
        REQUIRE(welcome.header.type == message_type::welcome);
        CHECK(welcome.header.has(frame_flags::state));  // rebuilding: send replicas and logs
        shard_state forged;
        server.save_state(forged);
        for (auto& v : forged.tables[0].values) v = 1000.0f;
        message rep;
        rep.header.type = message_type::state;
        rep.header.seq = std::uint64_t{1} << 62;
        rep.payload = evil.allocate(detail::encoded_state_size(forged));
        detail::encode_state(forged, std::span<std::byte>(rep.payload.data(), rep.payload.size()));
        (void)co_await c.async_send(std::move(rep));
        (void)co_await c.async_send(header_only(message_type::replay, frame_flags::state, 0));
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
  // A fresh replica-log shard rebuilds on an insider's hello with the state flag; the insider
  // then ends its replay at stable position 2^64 - 2 (or announces an entry there). Accepted,
  // it made the shard's next position 2^64 - 1, then 0: every worker refused the orders. It is
  // refused with bad_position, and the rebuild goes on without it.
  for (const std::uint8_t flags : {frame_flags::state, std::uint8_t{0}}) {
    CAPTURE(flags);
    asio::io_context io(1);
    in_process_network net;
    test::log_lines slog;
    server_options so;
    so.num_workers = 1;
    so.tables = {table_spec{0, 4, 2, 0.0f}};
    so.log = [&](std::string_view l) { slog.emplace_back(l); };
    so.watchdog_interval = 0ms;
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
              0, 5, layout, frame_flags::state, evil));
          auto [wec, welcome] = co_await c.async_receive();
          REQUIRE(!wec);
          REQUIRE(welcome.header.type == message_type::welcome);
          (void)co_await c.async_send(header_only(message_type::replay, flags,
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
