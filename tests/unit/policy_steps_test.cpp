// Recovery policies' server parts stepped message by message: detail::server_protocol with a
// recording shell whose hook context is the sans-io `detail::part_context` (no transport,
// executor, timer or thread of the server's). Covered: recovery::stateless (replicas and
// backlogs), recovery::checkpoint (snapshot at a clock boundary, restore into a fresh shard),
// recovery::replica_log (its watch on the part's timer: a rebuild that never completes, orders
// a closed connection left unconfirmed, an order a connected worker never confirms),
// recovery::chain_replication (head, middle and tail members: the links to the master and the
// successor on the part's timers and connects, entries down the chain, commits back up, a failover;
// and its master's membership protocol, detail::chain_master_core), and `fenced`, a sixth policy
// defined entirely in this file: it plugs into the unchanged library through the hooks of
// recovery.hpp, is stepped like the others, then trains end to end in a local_cluster.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <list>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <doctest/doctest.h>
#include <unistd.h>

#include "asyncps/buffer.hpp"
#include "asyncps/consistency/policies.hpp"
#include "asyncps/detail/endian.hpp"
#include "asyncps/detail/server/part_context.hpp"
#include "asyncps/detail/server/protocol.hpp"
#include "asyncps/detail/server/session.hpp"
#include "asyncps/local_cluster.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery.hpp"
#include "asyncps/recovery/chain/master_core.hpp"
#include "asyncps/recovery/chain_replication.hpp"
#include "asyncps/recovery/checkpoint.hpp"
#include "asyncps/recovery/replica_log.hpp"
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

/// `fenced`'s own error codes (recovery.hpp, `R::error_enum`), in their own category: they
/// travel in error frames as `policy_error_base` + code, and a worker of the policy reads them
/// back as these codes.
enum class fenced_errc {
  fenced = 1,           ///< the worker id is fenced on this shard
  bad_audit_query = 2,  ///< an audit query with a payload
};
struct fenced_category_impl final : std::error_category {
  const char* name() const noexcept override { return "fenced"; }
  std::string message(int ev) const override {
    return ev == 1 ? "worker fenced" : ev == 2 ? "malformed audit query" : "unknown fenced error";
  }
};
const std::error_category& fenced_category() {
  static const fenced_category_impl instance;
  return instance;
}
std::error_code make_error_code(fenced_errc e) { return {static_cast<int>(e), fenced_category()}; }

}  // namespace

template <>
struct std::is_error_code_enum<fenced_errc> : std::true_type {};

namespace {

/// recovery policy `fenced`: the operator fences worker ids (a process declared dead, whose
/// zombie must not train again), and each shard keeps an audit of what it applied, which a
/// worker may ask for with the policy's own message. No failure recovery: a worker that loses
/// a shard reconnects for up to a second. It uses only hooks of recovery.hpp, the sans-io
/// context and the policy message types of wire.hpp, so it runs unchanged in `basic_server`.
struct fenced {
  static constexpr std::string_view name = "fenced";

  /// The policy's own messages (wire.hpp, `policy_message`): a worker asks a shard for its
  /// audit (no payload; header `seq` = the query's number), the shard answers with the updates
  /// and rows it applied (u64 each) under the query's `seq`.
  static constexpr message_type audit_query = policy_message(0);
  static constexpr message_type audit_report = policy_message(1);
  static constexpr std::uint64_t audit_report_bytes = 16;
  using error_enum = fenced_errc;
  static constexpr fenced_errc last_error = fenced_errc::bad_audit_query;

  struct server_part {
    fence_audit* audit = nullptr;
    std::set<std::uint32_t> fenced_ids{};

    /// An audit query is answered; every other message goes on to the server. Errors: an
    /// audit query with a payload (`fenced_errc::bad_audit_query`).
    template <class Ctx>
    std::optional<std::error_code> on_worker_message(Ctx ctx, detail::session_base& s, message& m,
                                                     std::string& why) {
      if (m.header.type != audit_query) return std::nullopt;
      if (!m.payload.empty()) {
        why = " (an audit query has no payload)";
        return make_error_code(fenced_errc::bad_audit_query);
      }
      message r;
      r.header.type = audit_report;
      r.header.sender = ctx.options().shard;
      r.header.seq = m.header.seq;
      r.payload = ctx.allocate(audit_report_bytes);
      asyncps::detail::store_le(r.payload.data(), audit->updates);
      asyncps::detail::store_le(r.payload.data() + 8, audit->rows);
      ctx.send_worker(s.worker, std::move(r));
      return std::error_code{};
    }

    template <class Ctx>
    std::error_code on_hello(Ctx ctx, const frame_header& hello, std::string& detail) {
      if (!fenced_ids.contains(hello.sender)) return {};
      ++audit->fenced_hellos;
      detail = " (worker " + std::to_string(hello.sender) + " is fenced on this shard; shard " +
               std::to_string(ctx.options().shard) + " is at clock " + std::to_string(ctx.clock()) +
               ")";
      return fenced_errc::fenced;
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

// The shell: records closes and connects; every hook (`on_start` and `on_clock(c, ctx)`
// included) gets the context below, all a part may use of a server.
template <class Recovery>
struct policy_io {
  using proto_type = proto_of<Recovery>;

  // The hooks' context: the sans-io `part_context` plus the one I/O action a part may ask
  // for, `connect`, recorded here (the test completes it by hand with `part_connected`).
  struct context : detail::part_context<proto_type> {
    using endpoint_type = std::string;
    context(proto_type& p, policy_io* io) : detail::part_context<proto_type>(p), io_(io) {}
    void connect(std::uint8_t role, std::string ep) const {
      io_->connects.push_back({role, std::move(ep)});
    }
    std::size_t max_frame_bytes() const { return std::size_t{1} << 20; }
    policy_io* io_;
  };
  struct connect_request {
    std::uint8_t role;
    std::string endpoint;
  };
  context ctx() { return context(*proto, this); }
  void wake(step_session&) {}
  void close(step_session& s) { closed.push_back(s.tag); }
  buffer allocate(std::size_t n) { return pool.allocate(n); }
  test_time now() const { return time; }
  void wake_watchdog() {}
  void wake_sweeper() {}

  proto_type* proto = nullptr;  // set once the protocol is built
  std::vector<int> closed;
  std::vector<connect_request> connects;  // the part's connects, in order
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
    io.proto = &proto;
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
  // The error code of the message last queued to `s` (an error frame), as a worker of the
  // policy reads it: an errc or the policy's own code.
  static std::optional<std::error_code> error_of(const step_session& s) {
    REQUIRE(!s.outbox.empty());
    protocol::error e;
    std::string detail;
    REQUIRE(!protocol::decode(s.outbox.back(), e, detail));
    if (e.code) return make_error_code(*e.code);
    return detail::policy_error_from_wire<Recovery>(e.policy_code);
  }
};

// A push of worker `w` at clock `c` covering the shard's rows [0, 4), every float `g`;
// `flags` adds `policy` (stateless: a replica) or `prefixed` (stateless: a backlog, with a
// prefix summing `backlog_clocks`).
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
  const bool backlog = (flags & frame_flags::prefixed) != 0;
  const std::size_t prefix = backlog ? push_prefix_bytes : 0;
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

  // Worker 1 is fenced: its hello is refused with the hook's code (the policy's own) and
  // detail, logged with the part's suffix.
  auto& w1 = t.proto.add_session(1);
  auto h1 = t.hello(1, 0);
  CHECK(!t.proto.receive(w1, h1));
  CHECK(t.error_of(w1) == fenced_errc::fenced);
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

TEST_CASE("fenced (a policy defined in a test file), stepped: its own message types travel "
          "through the unchanged frame layer and server") {
  fence_audit audit;
  stepped<fenced> t(fenced::server_part{.audit = &audit});
  auto& w0 = t.worker(0);
  auto p = shard_push(0, 0, 0.5f);
  REQUIRE(t.proto.receive(w0, p));

  // The query passes the frame layer's checks as any frame would (a type of the policy's).
  message q;
  q.header.type = fenced::audit_query;
  q.header.sender = 0;
  q.header.seq = 7;
  std::array<std::byte, header_size> bytes{};
  encode_header(q.header, bytes, {}, true);
  CHECK(!validate_header(decode_header(bytes), wire_limits{}));
  q.header.flags = frame_flags::payload_unchecked;  // a policy's message is always checksummed
  CHECK(validate_header(q.header, wire_limits{}) == errc::bad_flags);
  q.header.flags = 0;

  w0.outbox.clear();
  REQUIRE(t.proto.receive(w0, q));
  REQUIRE(w0.outbox.size() == 1);
  const message& r = w0.outbox[0];
  CHECK(r.header.type == fenced::audit_report);
  CHECK(is_policy_message(r.header.type));
  CHECK(r.header.seq == 7);
  REQUIRE(r.payload.size() == fenced::audit_report_bytes);
  CHECK(detail::load_le<std::uint64_t>(r.payload.data()) == 1);      // updates
  CHECK(detail::load_le<std::uint64_t>(r.payload.data() + 8) == 4);  // rows

  // A malformed one is refused with the part's code and detail; the model is untouched.
  auto& w1 = t.worker(1);
  message bad;
  bad.header.type = fenced::audit_query;
  bad.header.sender = 1;
  bad.payload = pool.allocate(8);
  CHECK(!t.proto.receive(w1, bad));
  CHECK(t.error_of(w1) == fenced_errc::bad_audit_query);
  {
    protocol::error e;
    std::string detail;
    REQUIRE(!protocol::decode(w1.outbox.back(), e, detail));
    CHECK(!e.code);  // on the wire: policy_error_base + 2, no errc
    CHECK(e.policy_code == 2);
  }
  // Codes the policy does not have are not read back; an errc is not sent as a policy code.
  CHECK(detail::policy_error_from_wire<fenced>(0) == std::nullopt);
  CHECK(detail::policy_error_from_wire<fenced>(3) == std::nullopt);
  CHECK(detail::policy_error_to_wire<fenced>(errc::unexpected_message) == 0);
  CHECK(detail::policy_error_to_wire<fenced>(fenced_errc::fenced) == 1);
  CHECK(logged("an audit query has no payload"));
  CHECK(shard_values(t.proto)[0] == -0.5f);

  // Under a policy that does not know the type (none), the same frame is refused.
  stepped<recovery::none> plain;
  auto& v0 = plain.worker(0);
  message q2;
  q2.header.type = fenced::audit_query;
  q2.header.sender = 0;
  CHECK(!plain.proto.receive(v0, q2));
  CHECK(plain.error_of(v0) == errc::unexpected_message);
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
    // The worker read the policy's own code back from the error frame.
    CHECK(report.workers[1].error == fenced_errc::fenced);
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
    CHECK(s->outbox[0].header.has(frame_flags::policy));
  }
  CHECK(t.proto.part().recovering());

  // A replica from the future (clock 6 > the sender's clock 5) is refused and not installed.
  auto future = shard_push(0, 6, 3.0f, frame_flags::policy);
  CHECK(!t.proto.receive(w0, future));
  CHECK(t.error_of(w0) == errc::bad_state);
  CHECK(logged("refused the replica of table 0 from worker 0"));
  CHECK(t.proto.part().recovering());
  CHECK(shard_values(t.proto) == std::vector<float>(8, 0.0f));

  // Worker 1's replica rebuilds the table; a later replica (worker 0 reconnected) is dropped.
  auto replica = shard_push(1, 5, 2.0f, frame_flags::policy);
  CHECK(t.proto.receive(w1, replica));
  CHECK(!t.proto.part().recovering());
  CHECK(t.proto.part().stats().replicas_installed == 1);
  CHECK(shard_values(t.proto) == std::vector<float>(8, 2.0f));
  auto& w0b = t.proto.add_session(10);
  t.proto.session_finished(w0);
  auto h = t.hello(0, 5);
  REQUIRE(t.proto.receive(w0b, h));
  auto late = shard_push(0, 5, 7.0f, frame_flags::policy);
  CHECK(t.proto.receive(w0b, late));
  CHECK(t.proto.part().stats().replicas_installed == 1);

  // Backlogs: worker 1's own is already in its replica (skipped); worker 0's sums 4 clocks
  // and is applied scaled by 1/4 (rule mean): sgd at rate 1 subtracts it.
  auto own = shard_push(1, 5, 1.0f, frame_flags::prefixed, 4);
  CHECK(t.proto.receive(w1, own));
  CHECK(t.proto.part().stats().backlogs_merged == 0);
  auto other = shard_push(0, 5, 1.0f, frame_flags::prefixed, 4);
  CHECK(t.proto.receive(w0b, other));
  CHECK(t.proto.part().stats().backlogs_merged == 1);
  CHECK(t.proto.part().stats().backlog_clocks == 4);
  CHECK(shard_values(t.proto) == std::vector<float>(8, 2.0f - 0.25f));
}

TEST_CASE("stateless, stepped: a shard that holds state asks for nothing, and a replica or "
          "backlog that does not cover the shard's range is refused") {
  stepped<recovery::stateless> t;
  auto& w0 = t.worker(0);  // clock 0: nothing trained yet
  CHECK(!w0.outbox[0].header.has(frame_flags::policy));
  auto p = shard_push(0, 0, 1.0f);
  REQUIRE(t.proto.receive(w0, p));
  CHECK(t.proto.core().has_state());
  auto& w1 = t.worker(1, 3);  // has trained, but the shard has state: no replica wanted
  CHECK(!w1.outbox[0].header.has(frame_flags::policy));
  CHECK(!t.proto.part().recovering());

  auto part = shard_push(1, 3, 1.0f, frame_flags::prefixed, 1);
  part.header.row_count = 2;  // rows [0, 2) of [0, 4)
  part.payload = pool.allocate(push_prefix_bytes + 4 * sizeof(float));
  std::memset(part.payload.data(), 0, part.payload.size());
  CHECK(!t.proto.receive(w1, part));
  CHECK(t.error_of(w1) == errc::unexpected_message);
  CHECK(shard_values(t.proto) == std::vector<float>(8, -1.0f));

  // A backlog at a clock no run reaches (INT64_MIN: its staleness would overflow) is refused
  // before anything is scaled or merged.
  auto wild = shard_push(0, 1, 1.0f, frame_flags::prefixed, 1);
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
    auto ctx = t.io.ctx();
    t.proto.part().on_start(ctx);  // nothing to restore yet
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
  auto fresh_ctx = fresh.io.ctx();
  fresh.proto.part().on_start(fresh_ctx);
  CHECK(fresh.proto.part().stats().restored_clock == 2);
  CHECK(fresh.proto.core().clock() == 2);
  CHECK(shard_values(fresh.proto) == trained);
  fresh.proto.part().on_stop();
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// replica_log: the watch runs on the part's timer (ctx.arm_timer / on_timer), stepped by the
// sweeper's calls with the shell's clock moved by hand
// ---------------------------------------------------------------------------------------------

TEST_CASE("replica_log, stepped: a rebuild whose second log never arrives ends at "
          "recovery_timeout on the part's timer, counted incomplete") {
  using namespace std::chrono_literals;
  recovery::replica_log_server_part part;
  part.options.recovery_timeout = 200ms;
  stepped<recovery::replica_log> t(std::move(part));
  using proto_type = stepped<recovery::replica_log>::proto_type;
  CHECK(!t.proto.part_timer_armed(0));
  CHECK(!t.proto.sweep());  // nothing watched: the sweeper sleeps

  // Worker 0 holds a log for this shard (hello flag `policy`, `holds_log_flag`) and meets a shard
  // without state: the shard rebuilds, and the watch arms the part's timer for one tick.
  auto& w0 = t.proto.add_session(0);
  auto h = t.hello(0, 0);
  h.header.flags |= frame_flags::policy;
  REQUIRE(t.proto.receive(w0, h));
  CHECK(t.proto.part().recovering());
  CHECK(t.proto.part_timer_armed(0));
  CHECK(logged("rebuilding from the workers' replicas and logs"));
  REQUIRE(t.proto.sweep());
  CHECK(*t.proto.sweep() == t.io.time + 50ms);  // the tick is the sweeper's next deadline

  // Worker 1 never sends its log. Before its deadline a sweep fires nothing.
  t.io.time += 49ms;
  t.proto.sweep();
  CHECK(t.proto.part().recovering());
  // Three ticks (150 ms): still rebuilding, the timer re-armed each time.
  t.io.time += 1ms;
  for (int tick = 0; tick < 3; ++tick) {
    t.proto.sweep();
    CHECK(t.proto.part().recovering());
    CHECK(t.proto.part_timer_armed(0));
    t.io.time += 50ms;
  }
  // The fourth (200 ms): the rebuild ends without worker 1's log, counted as incomplete, and
  // the watch stops (nothing is left to time).
  t.proto.sweep();
  CHECK(!t.proto.part().recovering());
  CHECK(t.proto.part().serving());
  CHECK(t.proto.part().stats().recoveries == 1);
  CHECK(t.proto.part().stats().incomplete_recoveries == 1);
  CHECK(!t.proto.part_timer_armed(0));
  static_assert(proto_type::part_timer_count >= 1);
}

TEST_CASE("replica_log, stepped: its commit, a message type of its own, applies a held push; "
          "one with a payload is refused and applies nothing") {
  stepped<recovery::replica_log> t;
  auto& w0 = t.worker(0);
  auto& w1 = t.worker(1);
  REQUIRE(t.proto.part().serving());
  const auto before = shard_values(t.proto);
  auto order_of = [&](step_session& s) {
    protocol::order o;
    std::string detail;
    REQUIRE(!protocol::decode(s.outbox.back(), o, detail));
    return o;
  };
  auto commit = [](std::uint32_t w, std::uint64_t position, std::size_t payload) {
    message c;
    c.header.type = protocol::commit_type;
    c.header.sender = w;
    c.header.seq = position;
    if (payload > 0) c.payload = pool.allocate(payload);
    return c;
  };

  // Worker 0's push is ordered and applied once its commit (header only) comes.
  auto p0 = shard_push(0, 0, 1.0f);
  p0.header.seq = 1;
  REQUIRE(t.proto.receive(w0, p0));
  const protocol::order o0 = order_of(w0);
  REQUIRE(o0.size() == 1);
  CHECK(o0.entry(0).seq == 1);
  CHECK(!o0.applied);
  CHECK(shard_values(t.proto) == before);
  auto good = commit(0, o0.entry(0).position, 0);
  REQUIRE(t.proto.receive(w0, good));
  const auto applied = shard_values(t.proto);
  CHECK(applied[0] == -1.0f);

  // Worker 1's push is ordered; a commit of its position with 8 payload bytes is refused, and
  // the push is not applied.
  auto p1 = shard_push(1, 0, 2.0f);
  p1.header.seq = 1;
  REQUIRE(t.proto.receive(w1, p1));
  const protocol::order o1 = order_of(w1);
  REQUIRE(o1.size() == 1);
  auto bad = commit(1, o1.entry(0).position, 8);
  CHECK(!t.proto.receive(w1, bad));
  CHECK(t.error_of(w1) == errc::payload_size_mismatch);
  CHECK(logged("worker 1's commit carries 8 payload bytes; it has none"));
  CHECK(shard_values(t.proto) == applied);
}

TEST_CASE("replica_log apply-first, stepped: one ack per worker clock carrying its order, no "
          "commit, and a replica stored before the order went out does not reach past its "
          "positions") {
  recovery::replica_log_server_part part;
  part.options.ordering = recovery::replica_log_ordering::apply_first;
  part.options.log_budget = 0.001;  // the first push is over budget: a replica goes out at once
  stepped<recovery::replica_log> t(std::move(part));
  auto& w0 = t.worker(0);
  auto& w1 = t.worker(1);
  const auto before = shard_values(t.proto);
  auto count = [](const step_session& s, message_type type) {
    return std::count_if(s.outbox.begin(), s.outbox.end(),
                         [&](const message& m) { return m.header.type == type; });
  };
  const auto orders0 = count(w0, protocol::order_type), acks0 = count(w0, message_type::ack);

  // Worker 0's first push of its clock (not its last): applied on arrival, neither ordered
  // nor acknowledged yet; its apply puts the log over the budget, so a replica goes out.
  auto p1 = shard_push(0, 0, 1.0f, frame_flags::want_ack);
  p1.header.flags &= static_cast<std::uint8_t>(~frame_flags::end_of_clock);
  p1.header.seq = 1;
  REQUIRE(t.proto.receive(w0, p1));
  CHECK(shard_values(t.proto) != before);
  CHECK(count(w0, protocol::order_type) == orders0);
  CHECK(count(w0, message_type::ack) == acks0);
  REQUIRE(t.proto.part().stats().replicas_sent == 1);
  // The replica (position 1) is stored by its holder before worker 0's order goes out.
  step_session& holder = count(w0, protocol::replica_type) == 1 ? w0 : w1;
  REQUIRE(count(holder, protocol::replica_type) == 1);
  message stored;
  stored.header.type = protocol::commit_type;
  stored.header.flags = protocol::replica_stored_flag;
  stored.header.sender = holder.worker;
  stored.header.seq = 1;
  REQUIRE(t.proto.receive(holder, stored));
  CHECK(t.proto.part().stats().stable == 1);

  // The clock's last push: applied, then one message: the ack of seq 2 carrying the order
  // of both (applied: no commit wanted; wire version 7, before an order then an ack). It
  // carries the newest stable position, 1, though position 1 is among its entries: an applied
  // order may (the replica holds that update), and a stable position an order carries is
  // always a stored replica's, which a rebuild can start from.
  auto p2 = shard_push(0, 0, 1.0f, frame_flags::want_ack);
  p2.header.seq = 2;
  REQUIRE(t.proto.receive(w0, p2));
  CHECK(count(w0, protocol::order_type) == orders0);
  REQUIRE(count(w0, message_type::ack) == acks0 + 1);
  const message& om = w0.outbox.back();
  REQUIRE(om.header.type == message_type::ack);
  CHECK(om.header.seq == 2);
  CHECK(om.header.has(protocol::carries_order_flag));
  protocol::order o;
  std::string detail;
  REQUIRE(!protocol::decode(om, o, detail));
  CHECK(o.applied);
  REQUIRE(o.size() == 2);
  CHECK(o.entry(0).seq == 1);
  CHECK(o.entry(0).position == 1);
  CHECK(o.entry(1).seq == 2);
  CHECK(o.entry(1).position == 2);
  CHECK(o.stable == 1);
  CHECK(t.proto.part().stats().orders_sent == 1);
  CHECK(t.proto.part().stats().ordered == 2);
}

TEST_CASE("replica_log apply-first with ack_delay, stepped: clocks flagged ack-later share one "
          "ack carrying all their positions, sent after ack_delay, at half of max_unacked, or "
          "with the next prompt ack") {
  using namespace std::chrono_literals;
  recovery::replica_log_server_part part;
  part.options.ordering = recovery::replica_log_ordering::apply_first;
  part.options.ack_delay = 5ms;
  part.options.max_unacked = 8;  // an ack is sent at once when 4 positions wait
  stepped<recovery::replica_log> t(std::move(part));
  auto& w0 = t.worker(0);
  auto& w1 = t.worker(1);
  auto count = [](const step_session& s, message_type type) {
    return std::count_if(s.outbox.begin(), s.outbox.end(),
                         [&](const message& m) { return m.header.type == type; });
  };
  const auto acks0 = count(w0, message_type::ack);
  const auto orders0 = count(w0, protocol::order_type);
  std::uint64_t seq = 0;
  // Worker 0 ends clock seq - 1 (one push), then worker 1 the same clock (no ack wanted), so
  // the server clock follows.
  auto push = [&](bool later) {
    auto p = shard_push(0, static_cast<clock_value>(seq), 1.0f, frame_flags::want_ack);
    if (later) p.header.flags |= protocol::ack_later_flag;
    p.header.seq = ++seq;
    REQUIRE(t.proto.receive(w0, p));
    auto q = shard_push(1, static_cast<clock_value>(seq - 1), 0.5f);
    q.header.seq = seq;
    REQUIRE(t.proto.receive(w1, q));
  };
  auto last_order = [&](std::uint64_t ack_seq) {
    const message& om = w0.outbox.back();
    REQUIRE(om.header.type == message_type::ack);
    CHECK(om.header.seq == ack_seq);
    REQUIRE(om.header.has(protocol::carries_order_flag));
    protocol::order o;
    std::string detail;
    REQUIRE(!protocol::decode(om, o, detail));
    CHECK(o.applied);
    return o;
  };

  // Two clocks flagged ack-later: applied, neither acknowledged nor ordered yet; the timer runs.
  push(true);
  push(true);
  CHECK(t.proto.part().stats().ordered == 4);
  CHECK(count(w0, message_type::ack) == acks0);
  CHECK(count(w0, protocol::order_type) == orders0);
  CHECK(t.proto.part_timer_armed(1));
  // Before ack_delay a sweep sends nothing; at ack_delay one ack of seq 2 with both positions.
  t.io.time += 4ms;
  t.proto.sweep();
  CHECK(count(w0, message_type::ack) == acks0);
  t.io.time += 1ms;
  t.proto.sweep();
  REQUIRE(count(w0, message_type::ack) == acks0 + 1);
  {
    const protocol::order o = last_order(2);
    REQUIRE(o.size() == 2);
    CHECK(o.entry(0).seq == 1);
    CHECK(o.entry(1).seq == 2);
    CHECK(o.entry(0).position == 1);
    CHECK(o.entry(1).position == 3);  // worker 1's push of clock 0 took position 2
  }
  CHECK(!t.proto.part_timer_armed(1));

  // One clock flagged ack-later, then one without the flag: the prompt ack covers both.
  push(true);
  push(false);
  REQUIRE(count(w0, message_type::ack) == acks0 + 2);
  {
    const protocol::order o = last_order(4);
    REQUIRE(o.size() == 2);
    CHECK(o.entry(0).seq == 3);
    CHECK(o.entry(1).seq == 4);
  }
  // The timer then finds nothing owed: no further ack.
  t.io.time += 5ms;
  t.proto.sweep();
  CHECK(count(w0, message_type::ack) == acks0 + 2);

  // Four clocks flagged ack-later: the fourth position waiting is half of max_unacked, so its
  // ack goes at once, with the four positions.
  for (int i = 0; i < 4; ++i) push(true);
  REQUIRE(count(w0, message_type::ack) == acks0 + 3);
  CHECK(last_order(8).size() == 4);
  CHECK(count(w0, protocol::order_type) == orders0);
  CHECK(t.proto.part().stats().ordered == 16);
}

TEST_CASE("replica_log write-ahead, stepped: a push flagged ack-later is refused") {
  stepped<recovery::replica_log> t(recovery::replica_log_server_part{});
  auto& w0 = t.worker(0);
  t.worker(1);
  auto p = shard_push(0, 0, 1.0f, frame_flags::want_ack);
  p.header.flags |= protocol::ack_later_flag;
  p.header.seq = 1;
  CHECK(!t.proto.receive(w0, p));
  CHECK(t.error_of(w0) == errc::unexpected_message);
  CHECK(t.proto.part().stats().ordered == 0);
}

TEST_CASE("replica_log, stepped: a push ordered but never confirmed is voided after "
          "void_timeout once its worker's connection closed, never applied") {
  using namespace std::chrono_literals;
  recovery::replica_log_server_part part;
  part.options.void_timeout = 100ms;
  stepped<recovery::replica_log> t(std::move(part));
  auto& w0 = t.worker(0);
  t.worker(1);
  CHECK(t.proto.part().serving());
  const auto before = shard_values(t.proto);

  // Write-ahead: the push is held and its position sent to the worker (an `order`); it is
  // applied only once the worker confirms it has logged it.
  const std::size_t queued = w0.outbox.size();
  auto p = shard_push(0, 0, 1.0f);
  p.header.seq = 1;  // the worker's first numbered message
  REQUIRE(t.proto.receive(w0, p));
  CHECK(t.proto.part().stats().ordered == 1);
  REQUIRE(w0.outbox.size() == queued + 1);
  protocol::order o;
  std::string detail;
  REQUIRE(!protocol::decode(w0.outbox.back(), o, detail));
  CHECK(shard_values(t.proto) == before);
  // The watch on the part's timer runs: it times how long the unconfirmed order keeps the
  // shard waiting (commit_timeout, 10 s by default).
  CHECK(t.proto.part_timer_armed(0));

  // Its connection closes before the confirmation: the order is an orphan, and the watch
  // times it too.
  t.proto.close(w0);
  t.proto.session_finished(w0);
  CHECK(t.proto.part_timer_armed(0));
  t.io.time += 50ms;
  t.proto.sweep();
  CHECK(t.proto.part().stats().voided == 0);
  t.io.time += 50ms;
  t.proto.sweep();
  CHECK(t.proto.part().stats().voided == 1);
  CHECK(logged("dropped the unconfirmed updates of disconnected workers after 100 ms"));
  CHECK(!t.proto.part_timer_armed(0));
  CHECK(shard_values(t.proto) == before);  // never applied
}

TEST_CASE("a part's timers: an id at or above timer_count is refused by arm_timer with "
          "std::out_of_range naming it, never armed, and ignored by cancel_timer") {
  using namespace std::chrono_literals;
  stepped<recovery::replica_log> t;
  auto ctx = t.io.ctx();
  constexpr std::uint32_t n = decltype(ctx)::timer_count;
  static_assert(n >= 1);
  ctx.arm_timer(n - 1, 10ms);
  CHECK(ctx.timer_armed(n - 1));
  std::string what;
  try {
    ctx.arm_timer(n, 10ms);
  } catch (const std::out_of_range& e) {
    what = e.what();
  }
  CHECK(what == "asyncps: a recovery part armed timer " + std::to_string(n) +
                    "; its timers are 0 to " + std::to_string(n - 1) +
                    " (part_context::timer_count)");
  CHECK_THROWS_AS(ctx.arm_timer(std::numeric_limits<std::uint32_t>::max(), 1ms), std::out_of_range);
  CHECK(!ctx.timer_armed(n));
  ctx.cancel_timer(n);            // nothing to cancel
  CHECK(ctx.timer_armed(n - 1));  // the valid timer is untouched
  ctx.cancel_timer(n - 1);
  CHECK(!ctx.timer_armed(n - 1));
}

TEST_CASE("replica_log, stepped: a worker that never confirms stalls the shard for a bounded "
          "time: its unfinished clock's order goes early, its connection is closed, its "
          "reconnected session's old orders are voided, and the other worker's update applies") {
  using namespace std::chrono_literals;
  recovery::replica_log_server_part part;
  part.options.commit_timeout = 200ms;
  part.options.void_timeout = 1h;  // only commit_timeout acts in this test
  stepped<recovery::replica_log> t(std::move(part));
  auto& w0 = t.worker(0);
  auto& w1 = t.worker(1);
  const auto before = shard_values(t.proto);
  auto orders = [](const step_session& s) {
    return std::count_if(s.outbox.begin(), s.outbox.end(),
                         [](const message& m) { return m.header.type == protocol::order_type; });
  };
  auto tick = [&](int n) {
    for (int i = 0; i < n; ++i) {
      t.io.time += 50ms;
      t.proto.sweep();
    }
  };
  const auto orders0 = orders(w0);

  // Worker 0's first push of a clock it never ends: position 1, no order yet (orders go out
  // at the end of a clock). The watch starts: an unconfirmed order keeps the shard waiting.
  auto p0 = shard_push(0, 0, 1.0f);
  p0.header.flags &= static_cast<std::uint8_t>(~frame_flags::end_of_clock);
  p0.header.seq = 1;
  REQUIRE(t.proto.receive(w0, p0));
  CHECK(orders(w0) == orders0);
  CHECK(t.proto.part_timer_armed(0));

  // Worker 1's push, ordered (position 2) and confirmed, waits behind it.
  auto p1 = shard_push(1, 0, 2.0f);
  p1.header.seq = 1;
  REQUIRE(t.proto.receive(w1, p1));
  protocol::order o1;
  std::string detail;
  REQUIRE(!protocol::decode(w1.outbox.back(), o1, detail));
  REQUIRE(o1.size() == 1);
  CHECK(o1.entry(0).position == 2);
  message c1;
  c1.header.type = protocol::commit_type;
  c1.header.sender = 1;
  c1.header.seq = 2;
  REQUIRE(t.proto.receive(w1, c1));
  CHECK(shard_values(t.proto) == before);

  // After commit_timeout the order of worker 0's unfinished clock goes out early.
  tick(3);
  CHECK(orders(w0) == orders0);
  tick(1);
  REQUIRE(orders(w0) == orders0 + 1);
  protocol::order o0;
  REQUIRE(!protocol::decode(w0.outbox.back(), o0, detail));
  REQUIRE(o0.size() == 1);
  CHECK(o0.entry(0).seq == 1);
  CHECK(o0.entry(0).position == 1);
  CHECK(t.proto.part().stats().early_orders == 1);
  CHECK(t.proto.part().stats().commit_timeouts == 0);
  CHECK(t.io.closed.empty());

  // It does not confirm it within commit_timeout either: its connection is closed, logged and
  // counted. Nothing is applied yet (its order may be in its log: it may come back).
  tick(3);
  CHECK(t.io.closed.empty());
  tick(1);
  REQUIRE(t.io.closed.size() == 1);
  CHECK(t.io.closed[0] == 0);
  CHECK(t.proto.part().stats().commit_timeouts == 1);
  CHECK(logged("worker 0 did not confirm position 1 within 200 ms of its order"));
  t.proto.session_finished(w0);
  CHECK(shard_values(t.proto) == before);

  // It reconnects and again confirms nothing: after commit_timeout the closed connection's
  // order is voided (void_timeout, an hour, did not act) and worker 1's update applies.
  t.worker(0);
  tick(3);
  CHECK(t.proto.part().stats().voided == 0);
  CHECK(shard_values(t.proto) == before);
  tick(1);
  CHECK(t.proto.part().stats().voided == 1);
  CHECK(t.proto.part().stats().commit_timeouts == 2);
  CHECK(logged("worker 0 reconnected but did not confirm position 1"));
  // Worker 1's gradient (2 on each of the shard's 4 x 2 floats), at learning rate 1; worker
  // 0's never.
  CHECK(shard_values(t.proto) == std::vector<float>(8, -2.0f));
  CHECK(t.proto.part().stats().position == 2);
  // Nothing waits any more: the watch stops at its next tick.
  tick(1);
  CHECK(!t.proto.part_timer_armed(0));
}

TEST_CASE("replica_log, stepped: with commit_timeout 0 an unconfirmed order waits; an honest "
          "worker that confirms in time is never timed out") {
  using namespace std::chrono_literals;
  SUBCASE("commit_timeout 0: off") {
    recovery::replica_log_server_part part;
    part.options.commit_timeout = 0ms;
    stepped<recovery::replica_log> t(std::move(part));
    auto& w0 = t.worker(0);
    t.worker(1);
    auto p = shard_push(0, 0, 1.0f);
    p.header.seq = 1;
    REQUIRE(t.proto.receive(w0, p));
    CHECK(!t.proto.part_timer_armed(0));  // nothing to time
    t.io.time += 1h;
    t.proto.sweep();
    CHECK(t.io.closed.empty());
    CHECK(t.proto.part().stats().commit_timeouts == 0);
  }
  SUBCASE("default commit_timeout, confirmed before it") {
    stepped<recovery::replica_log> t;
    auto& w0 = t.worker(0);
    t.worker(1);
    const auto before = shard_values(t.proto);
    for (std::uint64_t k = 1; k <= 3; ++k) {
      auto p = shard_push(0, static_cast<clock_value>(k - 1), 1.0f);
      p.header.seq = k;
      REQUIRE(t.proto.receive(w0, p));
      protocol::order o;
      std::string detail;
      REQUIRE(!protocol::decode(w0.outbox.back(), o, detail));
      REQUIRE(o.size() == 1);
      for (int i = 0; i < 190; ++i) {  // 9.5 s of the default 10 s, in the watch's ticks
        t.io.time += 50ms;
        t.proto.sweep();
      }
      message c;
      c.header.type = protocol::commit_type;
      c.header.sender = 0;
      c.header.seq = o.entry(0).position;
      REQUIRE(t.proto.receive(w0, c));
    }
    CHECK(t.io.closed.empty());
    CHECK(t.proto.part().stats().commit_timeouts == 0);
    CHECK(t.proto.part().stats().early_orders == 0);
    CHECK(shard_values(t.proto)[0] == before[0] - 3.0f);
  }
}

// ---------------------------------------------------------------------------------------------
// chain_replication (strict): one member stepped. Its links are the part's timers and the
// connects it asks for (recorded by the test shell, completed by hand); the master and the
// other members are sessions the test feeds.
// ---------------------------------------------------------------------------------------------

namespace {

using strict_chain = recovery::chain_replication<recovery::chain_mode::strict>;
constexpr std::uint32_t no_member = protocol::chain_config::none;

recovery::chain_server_part<recovery::chain_mode::strict> chain_member(std::uint32_t self) {
  recovery::chain_server_part<recovery::chain_mode::strict> part;
  part.set_chain<std::string>("master", {"m0", "m1", "m2"}, self);
  return part;
}

message chain_config_message(std::uint32_t member, std::uint32_t pred, std::uint32_t succ,
                             std::int64_t epoch, bool joining = false) {
  return protocol::encode(protocol::chain_config{.shard = 0,
                                                 .member = member,
                                                 .predecessor = pred,
                                                 .successor = succ,
                                                 .epoch = epoch,
                                                 .joining = joining},
                          [](std::size_t n) { return pool.allocate(n); });
}

// A predecessor's chain_hello: member `member` of shard 0, at configuration `epoch`.
message chain_hello_from(std::uint32_t member, std::int64_t epoch) {
  return protocol::encode(
      protocol::chain_hello{.shard = 0,
                            .member = member,
                            .fingerprint = policy_fingerprint<consistency::ssp<0>, strict_chain>(),
                            .epoch = epoch},
      [](std::size_t n) { return pool.allocate(n); });
}

message chain_ack(std::uint64_t position, std::uint8_t flags = 0) {
  message m;
  m.header.type = message_type::ack;
  m.header.flags = flags;
  m.header.seq = position;
  return m;
}

// The part's pending connect `i` completes: a peer session tagged as the part asked.
template <class T>
step_session& complete_connect(T& t, std::size_t i, int tag) {
  REQUIRE(t.io.connects.size() > i);
  auto& s = t.proto.add_session(tag);
  decltype(t.io.ctx())::claim(s, t.io.connects[i].role);
  t.proto.part_connected(s);
  return s;
}

bool has_type(const step_session& s, message_type type) {
  return std::any_of(s.outbox.begin(), s.outbox.end(),
                     [&](const message& m) { return m.header.type == type; });
}

std::size_t count_type(const step_session& s, message_type type) {
  return static_cast<std::size_t>(std::count_if(
      s.outbox.begin(), s.outbox.end(), [&](const message& m) { return m.header.type == type; }));
}

}  // namespace

TEST_CASE("chain (strict), stepped as the head: registers on a connect, links to its "
          "successor, acks a push once the tail has it, heartbeats on its timers") {
  using namespace std::chrono_literals;
  stepped<strict_chain> t(chain_member(0));
  auto& part = t.proto.part();
  REQUIRE(!part.on_serve(t.io.ctx()));
  // on_serve asks for one connect: to the master.
  REQUIRE(t.io.connects.size() == 1);
  CHECK(t.io.connects[0].endpoint == "master");
  auto& master = complete_connect(t, 0, 100);
  CHECK(has_type(master, protocol::chain_hello_type));  // registered
  CHECK(t.proto.part_timer_armed(0));                   // its heartbeat

  // The master makes it head, with member 1 as its successor: the successor link starts on
  // the part's timer and asks for a connect to m1.
  auto cfg = chain_config_message(0, no_member, 1, 1);
  REQUIRE(t.proto.receive(master, cfg));
  CHECK(part.is_head());
  CHECK(t.io.connects.size() == 1);  // not yet: on the next sweep
  t.proto.sweep();
  REQUIRE(t.io.connects.size() == 2);
  CHECK(t.io.connects[1].endpoint == "m1");
  auto& succ = complete_connect(t, 1, 101);
  CHECK(has_type(succ, protocol::chain_hello_type));
  // The successor answers with its log position (0): the link is synced.
  auto ready = chain_ack(0);
  REQUIRE(t.proto.receive(succ, ready));

  // A worker's push is applied at the head and goes down the chain as entry 1; its ack waits
  // for the tail.
  auto& w0 = t.worker(0);
  const std::size_t w0_queued = w0.outbox.size();
  auto p = shard_push(0, 0, 1.0f);
  p.header.seq = 1;
  p.header.flags |= frame_flags::want_ack;
  REQUIRE(t.proto.receive(w0, p));
  CHECK(part.log_position() == 1);
  CHECK(count_type(succ, message_type::push) == 1);
  CHECK(w0.outbox.size() == w0_queued);  // no ack yet
  CHECK(part.committed() == 0);
  // The successor (the tail) acknowledges position 1: committed, and the worker is acked.
  auto tail_ack = chain_ack(1);
  REQUIRE(t.proto.receive(succ, tail_ack));
  CHECK(part.committed() == 1);
  REQUIRE(w0.outbox.size() == w0_queued + 1);
  CHECK(w0.outbox.back().header.type == message_type::ack);
  CHECK(w0.outbox.back().header.seq == 1);

  // Heartbeats: after heartbeat_interval, one to the master and one to the synced successor.
  const auto hb = part.options.heartbeat_interval;
  const std::size_t master_beats = count_type(master, message_type::heartbeat);
  const std::size_t succ_beats = count_type(succ, message_type::heartbeat);
  t.io.time += hb;
  t.proto.sweep();
  CHECK(count_type(master, message_type::heartbeat) == master_beats + 1);
  CHECK(count_type(succ, message_type::heartbeat) == succ_beats + 1);
}

TEST_CASE("chain (strict), stepped as middle and tail: a worker is refused with not_head "
          "(routine: not counted), entries from the predecessor are applied and acked") {
  stepped<strict_chain> t(chain_member(1));
  auto& part = t.proto.part();
  REQUIRE(!part.on_serve(t.io.ctx()));
  auto& master = complete_connect(t, 0, 100);
  // Member 1 is the tail, after member 0.
  auto cfg = chain_config_message(1, 0, no_member, 1);
  REQUIRE(t.proto.receive(master, cfg));
  CHECK(!part.is_head());
  t.proto.sweep();
  CHECK(t.io.connects.size() == 1);  // a tail connects to no successor

  // A worker is refused with not_head, which is routine: neither logged nor counted.
  auto& w = t.proto.add_session(0);
  auto h = t.hello(0, 0);
  CHECK(!t.proto.receive(w, h));
  CHECK(t.error_of(w) == recovery::chain_errc::not_head);
  CHECK(t.proto.stats().rejected == 0);

  // The predecessor links in with a chain_hello; the tail answers with its log position.
  auto& pred = t.proto.add_session(200);
  auto hello = chain_hello_from(0, 1);
  REQUIRE(t.proto.receive(pred, hello));
  REQUIRE(!pred.outbox.empty());
  CHECK(pred.outbox.back().header.type == message_type::ack);
  CHECK(pred.outbox.back().header.seq == 0);

  // Entry 1 (a push of worker 0) arrives from the predecessor: applied, and the tail commits
  // it at once (it acks position 1 up the chain).
  const auto before = shard_values(t.proto);
  auto e = shard_push(0, 0, 1.0f);
  e.header.seq = 1;
  REQUIRE(t.proto.receive(pred, e));
  CHECK(part.log_position() == 1);
  CHECK(shard_values(t.proto) != before);
  CHECK(pred.outbox.back().header.type == message_type::ack);
  CHECK(pred.outbox.back().header.seq == 1);

  // Made the middle (a new tail, member 2, joins after it): it links to member 2.
  auto cfg2 = chain_config_message(1, 0, 2, 2);
  REQUIRE(t.proto.receive(master, cfg2));
  t.proto.sweep();
  REQUIRE(t.io.connects.size() == 2);
  CHECK(t.io.connects[1].endpoint == "m2");
}

TEST_CASE("chain (strict), stepped through a failover: a lost successor link is made again at "
          "once, failed connects back off, a lost master link registers again") {
  using namespace std::chrono_literals;
  stepped<strict_chain> t(chain_member(0));
  auto& part = t.proto.part();
  REQUIRE(!part.on_serve(t.io.ctx()));

  // The master is down at first: the connect fails and is retried after 20 ms, then 40 ms.
  t.proto.part_connect_failed(t.io.connects[0].role, make_error_code(errc::connection_closed));
  CHECK(t.io.connects.size() == 1);
  t.io.time += 19ms;
  t.proto.sweep();
  CHECK(t.io.connects.size() == 1);
  t.io.time += 1ms;
  t.proto.sweep();
  REQUIRE(t.io.connects.size() == 2);
  t.proto.part_connect_failed(t.io.connects[1].role, make_error_code(errc::connection_closed));
  t.io.time += 39ms;
  t.proto.sweep();
  CHECK(t.io.connects.size() == 2);
  t.io.time += 1ms;
  t.proto.sweep();
  REQUIRE(t.io.connects.size() == 3);
  auto* master = &complete_connect(t, 2, 100);

  auto cfg = chain_config_message(0, no_member, 1, 1);
  REQUIRE(t.proto.receive(*master, cfg));
  t.proto.sweep();
  REQUIRE(t.io.connects.size() == 4);
  auto& succ = complete_connect(t, 3, 101);
  auto ready = chain_ack(0);
  REQUIRE(t.proto.receive(succ, ready));

  // The successor link drops: the next connect is asked for on the next sweep, not after a
  // heartbeat interval.
  t.proto.close(succ);
  t.proto.session_finished(succ);
  t.proto.sweep();
  REQUIRE(t.io.connects.size() == 5);
  CHECK(t.io.connects[4].endpoint == "m1");

  // The master reconfigures (member 1 failed): member 2 is the successor now. The connect to
  // m1 completes late and is closed; the next step connects to m2.
  auto cfg2 = chain_config_message(0, no_member, 2, 2);
  REQUIRE(t.proto.receive(*master, cfg2));
  auto& late = complete_connect(t, 4, 102);
  CHECK(t.io.closed.back() == 102);
  (void)late;
  // The backoff doubles with each attempt since the link was last synced (1 ms at the
  // configuration, 2 ms after the first link's connect, 4 ms after this one).
  t.io.time += 3ms;
  t.proto.sweep();
  CHECK(t.io.connects.size() == 5);
  t.io.time += 1ms;
  t.proto.sweep();
  REQUIRE(t.io.connects.size() == 6);
  CHECK(t.io.connects[5].endpoint == "m2");

  // The master link drops: at the next heartbeat tick the member registers again.
  t.proto.close(*master);
  t.proto.session_finished(*master);
  t.io.time += part.options.heartbeat_interval;
  t.proto.sweep();
  REQUIRE(t.io.connects.size() == 7);
  CHECK(t.io.connects[6].endpoint == "master");
  master = &complete_connect(t, 6, 103);
  CHECK(has_type(*master, protocol::chain_hello_type));
}

TEST_CASE("chain (strict), stepped: a member joining a running chain links to its successor "
          "only once a state transfer arrived (no timer meanwhile)") {
  // The head: its successor asks for a state transfer (ack flag `policy`,
  // `chain_needs_state_flag`), which the head queues on the link.
  stepped<strict_chain> head(chain_member(0));
  REQUIRE(!head.proto.part().on_serve(head.io.ctx()));
  auto& head_master = complete_connect(head, 0, 100);
  auto head_cfg = chain_config_message(0, no_member, 1, 1);
  REQUIRE(head.proto.receive(head_master, head_cfg));
  head.proto.sweep();
  auto& head_succ = complete_connect(head, 1, 101);
  auto wants_state = chain_ack(0, frame_flags::policy);
  REQUIRE(head.proto.receive(head_succ, wants_state));
  REQUIRE(has_type(head_succ, protocol::chain_state_type));
  const message& transfer = head_succ.outbox.back();
  REQUIRE(transfer.header.type == protocol::chain_state_type);

  // Member 1 joins as the middle, before member 2, without the shard's state (fresh).
  stepped<strict_chain> t(chain_member(1));
  auto& part = t.proto.part();
  REQUIRE(!part.on_serve(t.io.ctx()));
  auto& master = complete_connect(t, 0, 100);
  auto cfg = chain_config_message(1, 0, 2, 2, /*joining=*/true);
  REQUIRE(t.proto.receive(master, cfg));
  t.proto.sweep();
  CHECK(t.io.connects.size() == 1);     // nothing to feed member 2 with yet
  CHECK(!t.proto.part_timer_armed(1));  // and no timer polls for it
  t.io.time += std::chrono::seconds(1);
  t.proto.sweep();
  CHECK(t.io.connects.size() == 1);

  // The predecessor links in and sends the state: installed, and the successor link starts.
  auto& pred = t.proto.add_session(200);
  auto hello = chain_hello_from(0, 2);
  REQUIRE(t.proto.receive(pred, hello));
  message copy{transfer.header, transfer.payload.share()};
  REQUIRE(t.proto.receive(pred, copy));
  CHECK(part.stats().states_installed == 1);
  t.proto.sweep();
  REQUIRE(t.io.connects.size() == 2);
  CHECK(t.io.connects[1].endpoint == "m2");
}

// ---------------------------------------------------------------------------------------------
// chain master (detail::chain_master_core): membership stepped event by event, with a shell
// that records closes and wakes and a clock moved by hand
// ---------------------------------------------------------------------------------------------

struct master_session : detail::chain_master_session<test_time> {
  explicit master_session(int tag_) : tag(tag_) {}
  int tag;
};

struct master_io {
  test_time now() const { return time; }
  buffer allocate(std::size_t n) { return pool.allocate(n); }
  void wake(master_session& s) { woken.push_back(s.tag); }
  void close(master_session& s) { closed.push_back(s.tag); }
  std::string address(const master_session& s) const { return " at peer" + std::to_string(s.tag); }
  std::string host(const master_session& s) const { return "peer" + std::to_string(s.tag); }
  std::shared_ptr<const peer_identity> identity(const master_session&) const { return nullptr; }
  std::string tls_note(const master_session&) const { return {}; }

  test_time time{};
  std::vector<int> woken, closed;
};

struct stepped_master {
  explicit stepped_master(std::uint32_t shards = 1, std::uint32_t members = 2)
      : core({.num_shards = shards,
              .members = members,
              .heartbeat_timeout = std::chrono::milliseconds(1000),
              .register_timeout = std::chrono::milliseconds(5000),
              .log = [](std::string_view line) { log_lines.emplace_back(line); }},
             io) {
    log_lines.clear();
  }
  master_io io;
  detail::chain_master_core<master_session, test_time, master_io> core;
  std::list<master_session> sessions;

  master_session& open() {
    auto& s = sessions.emplace_back(static_cast<int>(sessions.size()));
    core.on_open(s);
    return s;
  }
  // A connection that registers as `member` of `shard`: whether the core reads on.
  bool hello(master_session& s, std::uint32_t shard, std::uint32_t member) {
    const message m = protocol::encode(protocol::chain_hello{.shard = shard, .member = member},
                                       [](std::size_t n) { return pool.allocate(n); });
    return core.on_receive(s, {}, m);
  }
  void advance(std::chrono::milliseconds d) { io.time += d; }
  // The configuration last queued to `s`.
  static protocol::chain_config config_of(const master_session& s) {
    REQUIRE(!s.outbox.empty());
    protocol::chain_config c;
    std::string why;
    REQUIRE(!protocol::decode(s.outbox.back(), c, why));
    return c;
  }
};

TEST_CASE("chain master, stepped: a chain starts once every member registered, head first by "
          "member id; a silent head is removed and its successor becomes head") {
  stepped_master t;
  auto& b = t.open();
  auto& a = t.open();
  CHECK(t.hello(b, 0, 1));  // member 1 first: the chain waits for member 0
  CHECK(b.outbox.empty());
  CHECK(t.core.chain(0).empty());
  CHECK(!t.core.started());
  CHECK(t.hello(a, 0, 0));
  CHECK(t.core.started());
  CHECK(t.core.chain(0) == std::vector<std::uint32_t>{0, 1});
  CHECK(logged("shard 0 chain starts: 0 -> 1"));
  auto ca = t.config_of(a), cb = t.config_of(b);
  CHECK(ca.predecessor == no_member);
  CHECK(ca.successor == 1);
  CHECK(cb.predecessor == 0);
  CHECK(cb.successor == no_member);
  CHECK(ca.epoch == 1);
  CHECK(!ca.joining);
  CHECK(t.io.woken.size() == 2);
  CHECK(t.core.stats().registrations == 2);
  CHECK(t.core.stats().configs_sent == 2);

  // Member 1 sends heartbeats, member 0 falls silent: after heartbeat_timeout the watchdog
  // removes and closes member 0; member 1 is told it is head and tail (epoch 2).
  for (int i = 0; i < 5; ++i) {
    t.advance(std::chrono::milliseconds(250));
    message hb;
    hb.header.type = message_type::heartbeat;
    CHECK(t.core.on_receive(b, {}, hb));
    t.core.on_tick();
  }
  CHECK(t.io.closed == std::vector<int>{a.tag});
  CHECK(!a.open);
  CHECK(t.core.chain(0) == std::vector<std::uint32_t>{1});
  cb = t.config_of(b);
  CHECK(cb.predecessor == no_member);
  CHECK(cb.successor == no_member);
  CHECK(cb.epoch == 2);
  CHECK(t.core.stats().failures == 1);
  CHECK(logged("shard 0 server 0 missed its heartbeats; removing it"));
  t.core.on_closed(a);  // its loops end: nothing more changes
  CHECK(t.core.stats().failures == 1);
  CHECK(t.core.epoch(0) == 2);
}

TEST_CASE("chain master, stepped: a restarted member joins a running chain as the tail and is "
          "told to wait for a state transfer; a lost connection reconfigures the chain") {
  stepped_master t;
  auto& a = t.open();
  auto& b = t.open();
  REQUIRE(t.hello(a, 0, 0));
  REQUIRE(t.hello(b, 0, 1));
  a.open = false;  // member 0's connection drops
  t.core.on_closed(a);
  CHECK(t.core.chain(0) == std::vector<std::uint32_t>{1});
  CHECK(logged("shard 0 server 0 removed (connection lost): 1"));

  auto& a2 = t.open();  // member 0 restarted
  CHECK(t.hello(a2, 0, 0));
  CHECK(t.core.chain(0) == std::vector<std::uint32_t>{1, 0});
  CHECK(t.core.stats().joins == 1);
  const auto joined = t.config_of(a2);
  CHECK(joined.joining);
  CHECK(joined.predecessor == 1);
  CHECK(joined.successor == no_member);
  const auto head = t.config_of(b);
  CHECK(!head.joining);
  CHECK(head.successor == 0);
  CHECK(head.epoch == 3);
  CHECK(logged("shard 0 server 0 joins as the tail: 1 -> 0"));
}

TEST_CASE("chain master, stepped: refusals (a member id outside the chain, a live member's id, "
          "no chain_hello first, none in time) leave every chain as it was") {
  stepped_master t(2, 2);
  auto& a = t.open();
  auto& b = t.open();
  REQUIRE(t.hello(a, 0, 0));
  REQUIRE(t.hello(b, 0, 1));
  const auto before = t.core.stats();

  auto& out_of_range = t.open();
  CHECK(!t.hello(out_of_range, 0, 2));
  CHECK(logged("chain_hello names member 2 of shard 0; member ids lie in [0, 2)"));

  auto& no_shard = t.open();
  CHECK(!t.hello(no_shard, 5, 0));
  CHECK(logged("expected chain_hello with shard < 2"));

  // A second claim of live member 0's id is refused; the holder stays.
  t.advance(std::chrono::milliseconds(100));
  auto& claim = t.open();
  CHECK(!t.hello(claim, 0, 0));
  CHECK(logged("which a live registration holds (heard from 100 ms ago at peer0)"));

  auto& not_hello = t.open();
  message hb;
  hb.header.type = message_type::heartbeat;
  CHECK(!t.core.on_receive(not_hello, {}, hb));

  // A failed authentication is counted and logged as refused.
  auto& stranger = t.open();
  CHECK(!t.core.on_receive(stranger, errc::authentication_failed, message{}));
  CHECK(logged("refused an unauthenticated connection at peer"));

  CHECK(t.core.stats().refused == before.refused + 5);
  CHECK(t.core.chain(0) == std::vector<std::uint32_t>{0, 1});
  CHECK(t.core.epoch(0) == 1);
  CHECK(t.core.stats().configs_sent == before.configs_sent);
  CHECK(t.io.closed.empty());  // the shell closes a refused connection (on_receive: false)

  // A connection that never says chain_hello is closed after register_timeout by the
  // watchdog; the registered members keep sending heartbeats.
  auto& idle = t.open();
  for (int i = 0; i < 21; ++i) {
    t.advance(std::chrono::milliseconds(250));
    message h;
    h.header.type = message_type::heartbeat;
    REQUIRE(t.core.on_receive(a, {}, h));
    REQUIRE(t.core.on_receive(b, {}, h));
    t.core.on_tick();
  }
  CHECK(std::count(t.io.closed.begin(), t.io.closed.end(), idle.tag) == 1);
  CHECK(logged("no chain_hello within 5000 ms (register_timeout)"));
  CHECK(t.core.chain(0) == std::vector<std::uint32_t>{0, 1});

  // Stopping closes every open session and sends no membership change.
  t.core.on_stop();
  CHECK(!a.open);
  CHECK(!b.open);
  a.open = false;
  t.core.on_closed(a);
  CHECK(t.core.epoch(0) == 1);
}
