// Recovery policies' server parts stepped message by message: detail::server_protocol with a
// recording shell whose hook context is the sans-io `detail::part_context` (no transport,
// executor, timer or thread of the server's). Covered: recovery::stateless (replicas and
// backlogs), recovery::checkpoint (snapshot at a clock boundary, restore into a fresh shard),
// and `fenced`, a sixth policy defined entirely in this file: it plugs into the unchanged
// library through the hooks of recovery.hpp, is stepped like the others, then trains end to
// end in a local_cluster.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <list>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <doctest/doctest.h>
#include <unistd.h>

#include "asyncps/buffer.hpp"
#include "asyncps/consistency/policies.hpp"
#include "asyncps/detail/server/part_context.hpp"
#include "asyncps/detail/server_protocol.hpp"
#include "asyncps/detail/server_session.hpp"
#include "asyncps/local_cluster.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery.hpp"
#include "asyncps/recovery/checkpoint.hpp"
#include "asyncps/recovery/stateless.hpp"
#include "asyncps/server_options.hpp"
#include "asyncps/wire.hpp"
#include "counter_model.hpp"

using namespace asyncps;

// ---------------------------------------------------------------------------------------------
// A sixth recovery policy, defined here and nowhere else.
// ---------------------------------------------------------------------------------------------
namespace {

/// What a `fenced` server part saw, kept where the test can read it (the part holds a
/// pointer: local_cluster moves parts into its servers).
struct fence_audit {
  std::uint64_t updates = 0;        ///< updates applied (on_update)
  std::uint64_t rows = 0;           ///< rows they touched
  double gradient_sum = 0;          ///< sum of every applied gradient float
  std::vector<clock_value> clocks;  ///< server clocks, in the order on_clock saw them
  std::uint64_t fenced_hellos = 0;  ///< hellos refused
  std::uint64_t sessions_closed = 0;
};

/// recovery policy `fenced`: the operator fences worker ids (a process declared dead, whose
/// zombie must not train again), and each shard keeps an audit of what it applied. No failure
/// recovery: a worker that loses a shard reconnects for up to a second. It uses only hooks
/// of recovery.hpp and the sans-io context, so it runs unchanged in `basic_server`.
struct fenced {
  static constexpr std::string_view name = "fenced";

  struct server_part {
    fence_audit* audit = nullptr;
    std::set<std::uint32_t> fenced_ids{};

    template <class Ctx>
    std::error_code on_hello(Ctx ctx, const frame_header& hello, std::string& detail) {
      if (!fenced_ids.contains(hello.sender)) return {};
      ++audit->fenced_hellos;
      detail = " (worker " + std::to_string(hello.sender) + " is fenced on this shard; shard " +
               std::to_string(ctx.options().shard) + " is at clock " + std::to_string(ctx.clock()) +
               ")";
      return errc::bad_sender;
    }
    void on_update(table_id, std::uint64_t, std::uint32_t rows, std::span<const float> grad) {
      ++audit->updates;
      audit->rows += rows;
      for (float g : grad) audit->gradient_sum += g;
    }
    void on_clock(clock_value c) { audit->clocks.push_back(c); }
    template <class Ctx>
    void on_session_closed(Ctx, detail::session_base&) {
      ++audit->sessions_closed;
    }
    std::string log_suffix() const { return " (fenced)"; }
  };

  struct worker_part {
    recovery_action on_server_lost(std::error_code) { return recovery_action::reconnect; }
    std::chrono::milliseconds reconnect_timeout() const { return std::chrono::seconds(1); }
  };
};
static_assert(recovery_policy<fenced>);

// ---------------------------------------------------------------------------------------------
// The stepping harness: a shard's protocol, a recording shell, the sans-io hook context.
// ---------------------------------------------------------------------------------------------

buffer_pool pool;
using test_time = std::chrono::steady_clock::time_point;

struct step_session : detail::server_session_state<test_time> {
  explicit step_session(int tag_) : tag(tag_) {}
  int tag;
  std::list<step_session>::iterator self;
};

template <class Recovery>
struct policy_io;
template <class Recovery>
using proto_of = detail::server_protocol<consistency::ssp<0>, Recovery, optimizer::sgd,
                                         step_session, test_time, policy_io<Recovery>>;

// The shell: records closes; hooks get `detail::part_context`; `on_start` / `on_clock(c,
// server)` get a view of the shard's state, all a part may use of a server without I/O.
template <class Recovery>
struct policy_io {
  using proto_type = proto_of<Recovery>;
  struct server_view {
    proto_type* p;
    const server_options& options() const { return p->options(); }
    void save_state(shard_state& out) const { p->save_state(out); }
    std::error_code restore_state(const shard_state& st) const { return p->restore_state(st); }
  };

  detail::part_context<proto_type> ctx() { return detail::part_context<proto_type>(*view.p); }
  void wake(step_session&) {}
  void close(step_session& s) { closed.push_back(s.tag); }
  buffer allocate(std::size_t n) { return pool.allocate(n); }
  test_time now() const { return time; }
  void wake_watchdog() {}
  void wake_sweeper() {}
  server_view& server() { return view; }

  server_view view{nullptr};  // set once the protocol is built
  std::vector<int> closed;
  test_time time{};
};

std::vector<std::string> log_lines;

// Shard 0 of 2 of one table of 8 rows x 2 (rows [0, 4)), 2 workers.
server_options step_options() {
  server_options o;
  o.shard = 0;
  o.num_shards = 2;
  o.num_workers = 2;
  o.tables = {table_spec{0, 8, 2, 0.0f}};
  o.log = [](std::string_view line) { log_lines.emplace_back(line); };
  return o;
}

template <class Recovery>
struct stepped {
  using proto_type = proto_of<Recovery>;
  explicit stepped(typename Recovery::server_part part = {})
      : proto{io, step_options(), optimizer::sgd{1.0f}, std::move(part)} {
    io.view.p = &proto;
    log_lines.clear();
  }
  policy_io<Recovery> io;
  proto_type proto;

  message hello(std::uint32_t w, clock_value c) {
    return protocol::encode(
        protocol::hello{.worker = w,
                        .clock = c,
                        .fingerprint = policy_fingerprint<consistency::ssp<0>, Recovery>(),
                        .incarnation = 1,
                        .layout = {{8, 2}}},
        [](std::size_t n) { return pool.allocate(n); });
  }
  // Worker `w` says hello at clock `c`: its session, the welcome left in its outbox.
  step_session& worker(std::uint32_t w, clock_value c = 0) {
    auto& s = proto.add_session(static_cast<int>(w));
    auto h = hello(w, c);
    REQUIRE(proto.receive(s, h));
    return s;
  }
  // The error code of the message last queued to `s` (an error frame).
  static std::optional<errc> error_of(const step_session& s) {
    REQUIRE(!s.outbox.empty());
    protocol::error e;
    std::string detail;
    REQUIRE(!protocol::decode(s.outbox.back(), e, detail));
    return e.code;
  }
};

// A push of worker `w` at clock `c` covering the shard's rows [0, 4), every float `g`;
// `flags` adds `state` (a replica) or `backlog` (with a prefix summing `backlog_clocks`).
message shard_push(std::uint32_t w, clock_value c, float g, std::uint8_t flags = 0,
                   std::uint64_t backlog_clocks = 0) {
  message m;
  m.header.type = message_type::push;
  m.header.flags =
      static_cast<std::uint8_t>(frame_flags::range | frame_flags::end_of_clock | flags);
  m.header.sender = w;
  m.header.clock = c;
  m.header.first_row = 0;
  m.header.row_count = 4;
  m.header.width = 2;
  const bool backlog = (flags & frame_flags::backlog) != 0;
  const std::size_t prefix = backlog ? backlog_prefix_bytes : 0;
  m.payload = pool.allocate(prefix + 8 * sizeof(float));
  if (backlog) protocol::set_backlog_clocks(m.payload, backlog_clocks);
  auto* f = reinterpret_cast<float*>(m.payload.data() + prefix);
  for (int i = 0; i < 8; ++i) f[i] = g;
  return m;
}

message clock_message(std::uint32_t w, clock_value c) {
  message m;
  m.header.type = message_type::clock;
  m.header.sender = w;
  m.header.clock = c;
  return m;
}

std::vector<float> shard_values(const auto& proto) {
  const auto& v = proto.core().table(0).values;
  return {v.begin(), v.end()};
}

bool logged(std::string_view part) {
  for (const auto& l : log_lines)
    if (l.find(part) != std::string::npos) return true;
  return false;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The policy defined in this file
// ---------------------------------------------------------------------------------------------

TEST_CASE("fenced (a policy defined in a test file), stepped: its hooks see hellos, updates, "
          "clocks and closed sessions") {
  fence_audit audit;
  stepped<fenced> t(fenced::server_part{.audit = &audit, .fenced_ids = {1}});
  auto& w0 = t.worker(0);
  CHECK(w0.is_worker());

  // Worker 1 is fenced: its hello is refused with the hook's code and detail, logged with the
  // part's suffix.
  auto& w1 = t.proto.add_session(1);
  auto h1 = t.hello(1, 0);
  CHECK(!t.proto.receive(w1, h1));
  CHECK(t.error_of(w1) == errc::bad_sender);
  CHECK(audit.fenced_hellos == 1);
  CHECK(logged("asyncps server 0 (fenced)"));
  CHECK(logged("worker 1 is fenced on this shard"));
  t.proto.session_finished(w1);
  CHECK(audit.sessions_closed == 1);

  // Worker 0's push is applied and audited; the clock does not move (worker 1 is at clock 0).
  auto p = shard_push(0, 0, 0.25f);
  CHECK(t.proto.receive(w0, p));
  CHECK(audit.updates == 1);
  CHECK(audit.rows == 4);
  CHECK(audit.gradient_sum == doctest::Approx(8 * 0.25));
  CHECK(shard_values(t.proto)[0] == -0.25f);
  CHECK(audit.clocks.empty());
  CHECK(t.proto.core().clock() == 0);
}

TEST_CASE("fenced (a policy defined in a test file), stepped: on_clock follows the server "
          "clock") {
  fence_audit audit;
  stepped<fenced> t(fenced::server_part{.audit = &audit});
  auto& w0 = t.worker(0);
  auto& w1 = t.worker(1);
  for (clock_value c = 0; c < 3; ++c) {
    auto a = shard_push(0, c, 1.0f);
    auto b = clock_message(1, c);
    REQUIRE(t.proto.receive(w0, a));
    REQUIRE(t.proto.receive(w1, b));
  }
  CHECK(audit.clocks == std::vector<clock_value>{1, 2, 3});
  CHECK(audit.updates == 3);
  CHECK(shard_values(t.proto)[7] == -3.0f);
}

TEST_CASE("fenced (a policy defined in a test file) trains in a local_cluster, and a fenced "
          "worker stops it with the hook's error") {
  constexpr std::uint32_t workers = 2, servers = 2, clocks = 5;
  std::vector<fence_audit> audits(servers);
  const auto run = [&](std::set<std::uint32_t> fenced_on_shard_0) {
    local_cluster<test::counter_model, consistency::ssp<1>, fenced> cluster(
        {.servers = servers, .workers = workers, .log = [](std::string_view) {}},
        [=](std::uint32_t w) { return test::counter_model(w, workers, 1); }, optimizer::sgd{1.0f});
    cluster.set_server_recovery([&](std::uint32_t s) {
      return fenced::server_part{.audit = &audits[s],
                                 .fenced_ids =
                                     s == 0 ? fenced_on_shard_0 : std::set<std::uint32_t>{}};
    });
    return cluster.run(clocks);
  };

  SUBCASE("nobody fenced: every update and clock reaches the part") {
    const auto report = run({});
    REQUIRE(report.ok());
    for (std::uint32_t s = 0; s < servers; ++s) {
      CHECK(audits[s].fenced_hellos == 0);
      CHECK(audits[s].updates == report.servers[s].stats.pushes);
      CHECK(audits[s].clocks.size() == clocks);
      CHECK(audits[s].clocks.back() == clocks);
    }
    // counter_model: worker w pushes -1 on its own row (width 4) every clock; the shards
    // together applied W x clocks rows of -4.
    CHECK(audits[0].gradient_sum + audits[1].gradient_sum ==
          doctest::Approx(-4.0 * workers * clocks));
    const auto t0 = report.table(0);
    for (std::uint32_t w = 0; w < workers; ++w) CHECK(t0(w, 0) == float(clocks));
  }
  SUBCASE("worker 1 fenced on shard 0: the run fails, naming it") {
    const auto report = run({1});
    CHECK(!report.ok());
    CHECK(audits[0].fenced_hellos >= 1);
    CHECK(report.failure.find("worker 1") != std::string::npos);
  }
}

// ---------------------------------------------------------------------------------------------
// recovery::stateless
// ---------------------------------------------------------------------------------------------

TEST_CASE("stateless, stepped: a shard without state asks for replicas, refuses an "
          "implausible one, installs the first valid one and merges the other backlogs") {
  recovery::stateless::server_part part;
  part.options.rule = recovery::merge_rule::mean;
  stepped<recovery::stateless> t(std::move(part));

  // Both workers have trained (clock 5): a shard holding no state asks each for its replica.
  auto& w0 = t.worker(0, 5);
  auto& w1 = t.worker(1, 5);
  for (auto* s : {&w0, &w1}) {
    REQUIRE(s->outbox.size() == 1);
    CHECK(s->outbox[0].header.type == message_type::welcome);
    CHECK(s->outbox[0].header.has(frame_flags::state));
  }
  CHECK(t.proto.part().recovering());

  // A replica from the future (clock 6 > the sender's clock 5) is refused and not installed.
  auto future = shard_push(0, 6, 3.0f, frame_flags::state);
  CHECK(!t.proto.receive(w0, future));
  CHECK(t.error_of(w0) == errc::bad_state);
  CHECK(logged("refused the replica of table 0 from worker 0"));
  CHECK(t.proto.part().recovering());
  CHECK(shard_values(t.proto) == std::vector<float>(8, 0.0f));

  // Worker 1's replica rebuilds the table; a later replica (worker 0 reconnected) is dropped.
  auto replica = shard_push(1, 5, 2.0f, frame_flags::state);
  CHECK(t.proto.receive(w1, replica));
  CHECK(!t.proto.part().recovering());
  CHECK(t.proto.part().stats().replicas_installed == 1);
  CHECK(shard_values(t.proto) == std::vector<float>(8, 2.0f));
  auto& w0b = t.proto.add_session(10);
  t.proto.session_finished(w0);
  auto h = t.hello(0, 5);
  REQUIRE(t.proto.receive(w0b, h));
  auto late = shard_push(0, 5, 7.0f, frame_flags::state);
  CHECK(t.proto.receive(w0b, late));
  CHECK(t.proto.part().stats().replicas_installed == 1);

  // Backlogs: worker 1's own is already in its replica (skipped); worker 0's sums 4 clocks
  // and is applied scaled by 1/4 (rule mean): sgd at rate 1 subtracts it.
  auto own = shard_push(1, 5, 1.0f, frame_flags::backlog, 4);
  CHECK(t.proto.receive(w1, own));
  CHECK(t.proto.part().stats().backlogs_merged == 0);
  auto other = shard_push(0, 5, 1.0f, frame_flags::backlog, 4);
  CHECK(t.proto.receive(w0b, other));
  CHECK(t.proto.part().stats().backlogs_merged == 1);
  CHECK(t.proto.part().stats().backlog_clocks == 4);
  CHECK(shard_values(t.proto) == std::vector<float>(8, 2.0f - 0.25f));
}

TEST_CASE("stateless, stepped: a shard that holds state asks for nothing, and a replica or "
          "backlog that does not cover the shard's range is refused") {
  stepped<recovery::stateless> t;
  auto& w0 = t.worker(0);  // clock 0: nothing trained yet
  CHECK(!w0.outbox[0].header.has(frame_flags::state));
  auto p = shard_push(0, 0, 1.0f);
  REQUIRE(t.proto.receive(w0, p));
  CHECK(t.proto.core().has_state());
  auto& w1 = t.worker(1, 3);  // has trained, but the shard has state: no replica wanted
  CHECK(!w1.outbox[0].header.has(frame_flags::state));
  CHECK(!t.proto.part().recovering());

  auto part = shard_push(1, 3, 1.0f, frame_flags::backlog, 1);
  part.header.row_count = 2;  // rows [0, 2) of [0, 4)
  part.payload = pool.allocate(backlog_prefix_bytes + 4 * sizeof(float));
  std::memset(part.payload.data(), 0, part.payload.size());
  CHECK(!t.proto.receive(w1, part));
  CHECK(t.error_of(w1) == errc::unexpected_message);
  CHECK(shard_values(t.proto) == std::vector<float>(8, -1.0f));

  // A backlog at a clock no run reaches (INT64_MIN: its staleness would overflow) is refused
  // before anything is scaled or merged.
  auto wild = shard_push(0, 1, 1.0f, frame_flags::backlog, 1);
  wild.header.clock = std::numeric_limits<clock_value>::min();
  CHECK(!t.proto.receive(w0, wild));
  CHECK(t.error_of(w0) == errc::bad_clock);
  CHECK(t.proto.part().stats().backlogs_merged == 0);
  CHECK(shard_values(t.proto) == std::vector<float>(8, -1.0f));
}

// ---------------------------------------------------------------------------------------------
// recovery::checkpoint
// ---------------------------------------------------------------------------------------------

TEST_CASE("checkpoint, stepped: a snapshot at each clock boundary, restored into a fresh "
          "shard by on_start") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("asyncps_policy_steps_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const auto options = [&] {
    recovery::checkpoint_options o;
    o.directory = dir;
    o.every_clocks = 1;
    o.log = [](std::string_view) {};
    return o;
  };
  std::vector<float> trained;
  {
    stepped<recovery::checkpoint> t{recovery::checkpoint::server_part(options())};
    t.proto.part().on_start(t.io.server());  // nothing to restore yet
    CHECK(t.proto.part().stats().restored_clock == -1);
    auto& w0 = t.worker(0);
    auto& w1 = t.worker(1);
    for (clock_value c = 0; c < 2; ++c) {
      auto a = shard_push(0, c, 0.5f);
      auto b = shard_push(1, c, 0.25f);
      REQUIRE(t.proto.receive(w0, a));
      REQUIRE(t.proto.receive(w1, b));  // the server clock advances: on_clock snapshots
      t.proto.part().wait_persisted();
    }
    CHECK(t.proto.core().clock() == 2);
    const auto st = t.proto.part().stats();
    CHECK(st.checkpoints_persisted == 2);
    CHECK(st.last_persisted_clock == 2);
    trained = shard_values(t.proto);
    CHECK(trained == std::vector<float>(8, -1.5f));
    t.proto.part().on_stop();
  }
  stepped<recovery::checkpoint> fresh{recovery::checkpoint::server_part(options())};
  fresh.proto.part().on_start(fresh.io.server());
  CHECK(fresh.proto.part().stats().restored_clock == 2);
  CHECK(fresh.proto.core().clock() == 2);
  CHECK(shard_values(fresh.proto) == trained);
  fresh.proto.part().on_stop();
  std::filesystem::remove_all(dir);
}
