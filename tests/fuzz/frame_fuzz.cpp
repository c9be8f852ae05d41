// libFuzzer target `frame`: a server shard (detail::server_protocol, the sans-io core that
// basic_server runs) fed frames cut from the input by up to 4 connections, as the transports
// deliver them (fuzz_support.hpp: read_frame). Input: one byte choosing the policies (mod 8:
// 0-2 ssp<1>, essp<1>, vap with recovery::none; 3-6 ssp<1> with recovery::stateless, merge
// rule sum, mean, lr_scaled, staleness_aware, max_replica_value 100; 7 the same, lr_scaled,
// unbounded), then operations: a byte `op` (bits 0-1: the connection) followed,
// for op < 0x80, by one frame; 0x80-0xbf: the connection ends; 0xc0-0xff: time passes and the
// watchdog reports. A bad header or checksum is handled as basic_server's read loop does
// (refused, then the session ends).
//
// Invariants checked after every operation (abort on violation):
//   - the parameters are bitwise unchanged, except after an accepted push, when they are
//     exactly the previous values minus the push's gradient (sgd, rate 1) at its rows;
//     stateless: or after a replica push (flag `policy`) the part installed, when its table
//     holds exactly the replica, whose clock lies in [0, its sender's clock] and whose values
//     are within `max_replica_value`; or after a backlog push (flag `prefixed`) it merged, when
//     they are the previous values minus the backlog as the part scaled it;
//   - every parameter is finite; the server clock is the minimum of the worker clocks and
//     never moves back; no session has more pulls waiting than `max_pending_pulls`, and their
//     keys stay within `max_total_pending_pull_bytes`;
//   - every message the server queues passes `validate_header` once encoded; a welcome,
//     error or report decodes; a rows message holds rows of this shard with the values the
//     shard has now.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/detail/server/part_context.hpp"
#include "asyncps/detail/server/protocol.hpp"
#include "asyncps/detail/server/session.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery/none.hpp"
#include "asyncps/recovery/stateless.hpp"
#include "asyncps/server_options.hpp"
#include "asyncps/wire.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace asyncps;
using fuzz::require;
using fuzz_time = std::chrono::steady_clock::time_point;

struct fuzz_session : detail::server_session_state<fuzz_time> {
  explicit fuzz_session(int slot_) : slot(slot_) {}
  int slot;
  std::list<fuzz_session>::iterator self;
};

template <class Consistency, class Recovery>
struct fuzz_io;
template <class Consistency, class Recovery>
using proto_of = detail::server_protocol<Consistency, Recovery, optimizer::sgd, fuzz_session,
                                         fuzz_time, fuzz_io<Consistency, Recovery>>;

// The shell: no sockets; records what the protocol asks for. The recovery part's hooks get
// the sans-io `detail::part_context`.
template <class Consistency, class Recovery>
struct fuzz_io {
  detail::part_context<proto_of<Consistency, Recovery>> ctx() {
    return detail::part_context<proto_of<Consistency, Recovery>>(*proto);
  }
  void wake(fuzz_session&) {}
  void close(fuzz_session& s) { cut.push_back(&s); }
  buffer allocate(std::size_t n) { return fuzz::allocate(n); }
  fuzz_time now() const { return time; }
  void wake_watchdog() {}
  void wake_sweeper() {}
  fuzz_io& server() { return *this; }

  std::vector<fuzz_session*> cut;  // sessions closed at once (e.g. over their queue limits)
  fuzz_time time{};
  proto_of<Consistency, Recovery>* proto = nullptr;  // set once the protocol is built
};

// The stateless part's replicas installed and backlogs merged (0, 0 for other policies).
template <class Proto>
std::pair<std::uint64_t, std::uint64_t> recovery_counts(const Proto& p) {
  if constexpr (std::is_same_v<typename Proto::recovery_type, recovery::stateless>)
    return {p.part().stats().replicas_installed, p.part().stats().backlogs_merged};
  else
    return {0, 0};
}

constexpr int slots = 4;
const wire_limits limits{};

server_options options() {
  server_options o;
  o.shard = 1;  // shard 1 of 2: rows do not start at 0
  o.num_shards = 2;
  o.num_workers = 3;
  o.tables = {table_spec{0, 8, 2, 0.5f}, table_spec{1, 16, 1, 0.0f}};
  o.max_pending_pulls = 4;
  o.max_queued_messages = 64;
  o.max_total_queued_bytes = 2048;      // small: eager rows and replies to 4 sessions reach it
  o.max_total_pending_pull_bytes = 64;  // four keyed pulls of up to 4 keys
  o.log = [](std::string_view) {};
  return o;
}

using values_t = std::vector<std::vector<float>>;

template <class Proto>
values_t snapshot(const Proto& p) {
  values_t v;
  for (std::size_t t = 0; t < p.core().num_tables(); ++t) {
    const auto& values = p.core().table(t).values;
    v.emplace_back(values.begin(), values.end());
  }
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// `before` with accepted push `m` applied as sgd with rate 1 does it.
template <class Proto>
values_t apply_model(const Proto& p, values_t before, const message& m) {
  const auto& h = m.header;
  const auto& t = p.core().table(h.table);
  const std::uint32_t w = t.spec.width;
  auto& v = before[h.table];
  const auto g = payload_floats(m);
  const auto keys = payload_keys(m);
  for (std::uint32_t i = 0; i < h.row_count; ++i) {
    const std::uint64_t row = h.has(frame_flags::range) ? h.first_row + i : keys[i];
    for (std::uint32_t j = 0; j < w; ++j)
      v[(row - t.range.begin) * w + j] -= g[std::size_t{i} * w + j];
  }
  return before;
}

// Checks one message the server queued.
template <class Proto>
void check_sent(const Proto& p, message& m) {
  m.header.payload_bytes = m.payload.size();
  std::array<std::byte, header_size> head{};
  encode_header(m.header, head, m.payload.bytes(), true);
  const auto back = decode_header(head);
  require(!validate_header(back, limits), "a message the server sends passes validate_header");
  std::string detail;
  switch (m.header.type) {
    case message_type::welcome: {
      protocol::welcome w;
      require(!protocol::decode(m, w, detail), "the server's welcome decodes");
      require(w.tables.size() == p.core().num_tables(), "the welcome lists every table");
      break;
    }
    case message_type::error: {
      protocol::error e;
      require(!protocol::decode(m, e, detail), "the server's error decodes");
      require(e.code.has_value(), "the server's error names an errc");
      break;
    }
    case message_type::report: {
      protocol::report r;
      require(!protocol::decode(m, r, detail), "the server's report decodes");
      break;
    }
    case message_type::rows: {
      require(m.header.table < p.core().num_tables(), "rows of a table of the shard");
      const auto& t = p.core().table(m.header.table);
      require(m.header.width == t.spec.width, "rows have the table's width");
      const auto keys = payload_keys(m);
      const auto f = payload_floats(m);
      require(f.size() == std::size_t{m.header.row_count} * t.spec.width, "rows payload size");
      for (std::uint32_t i = 0; i < m.header.row_count; ++i) {
        const std::uint64_t row =
            m.header.has(frame_flags::range) ? m.header.first_row + i : keys[i];
        require(row >= t.range.begin && row < t.range.end, "rows of this shard only");
        require(std::memcmp(f.data() + std::size_t{i} * t.spec.width,
                            t.values.data() + (row - t.range.begin) * t.spec.width,
                            t.spec.width * sizeof(float)) == 0,
                "rows carry the shard's current values");
      }
      break;
    }
    case message_type::ack: break;
    default: require(false, "the server sends only welcome, error, report, rows, ack");
  }
}

template <class Consistency, class Recovery = recovery::none>
void run(fuzz::byte_reader& in, typename Recovery::server_part part = {}) {
  constexpr bool stateless = std::is_same_v<Recovery, recovery::stateless>;
  fuzz_io<Consistency, Recovery> io;
  proto_of<Consistency, Recovery> proto{io, options(), optimizer::sgd{1.0f}, std::move(part)};
  io.proto = &proto;
  std::array<fuzz_session*, slots> slot{};
  clock_value server_clock = proto.core().clock();

  auto drain = [&] {
    for (auto& s : proto.sessions()) {
      for (auto& m : s.outbox) {  // what basic_server's write loop does, the peer reading
        check_sent(proto, m);
        proto.send_started(s);
        proto.sent(s, m.payload.size());
      }
      s.outbox.clear();
    }
  };
  auto finish = [&](fuzz_session& s) {
    drain();
    slot[s.slot] = nullptr;
    proto.session_finished(s);
  };
  auto check_state = [&] {
    const auto& core = proto.core();
    for (std::size_t t = 0; t < core.num_tables(); ++t)
      for (float v : core.table(t).values) require(std::isfinite(v), "parameters stay finite");
    const auto& clocks = core.worker_clocks();
    require(core.clock() == *std::min_element(clocks.begin(), clocks.end()),
            "the server clock is the minimum of the worker clocks");
    require(core.clock() >= server_clock, "the server clock never moves back");
    server_clock = core.clock();
    std::uint64_t queued = 0;
    for (const auto& s : proto.sessions()) {
      require(s.pending_pulls <= proto.options().max_pending_pulls, "pending pulls bounded");
      if (!s.cut) queued += s.queued_bytes;
    }
    require(queued == proto.total_queued_bytes(), "the server's queued bytes add up");
    std::uint64_t keys = 0;
    for (const auto& p : core.pending()) keys += p.request.payload.size();
    require(keys == core.pending_bytes(), "the waiting pulls' key bytes add up");
    require(keys <= proto.options().max_total_pending_pull_bytes, "waiting keys within bound");
    require(queued <= proto.options().max_total_queued_bytes, "queued bytes within the budget");
  };

  while (in.left() != 0) {
    const std::uint8_t op = in.u8();
    const int k = op & 3;
    if (op >= 0xc0) {
      io.time += std::chrono::seconds(1);
      proto.report_blocked(std::chrono::milliseconds(500));
      (void)proto.sweep();  // sessions without a hello for hello_timeout (10 s) are refused
      for (auto* c : slot)
        if (c != nullptr && !c->open) finish(*c);
      io.cut.clear();
      drain();
      check_state();
      continue;
    }
    if (op >= 0x80) {
      if (slot[k] != nullptr) finish(*slot[k]);
      check_state();
      continue;
    }
    if (slot[k] == nullptr) slot[k] = &proto.add_session(k);
    fuzz_session& s = *slot[k];
    message m;
    const auto r = fuzz::read_frame(in, limits, m);
    if (r.truncated) break;
    const values_t before = snapshot(proto);
    const auto pushes = proto.stats().pushes;
    const auto counts = recovery_counts(proto);
    if (r.ec) {
      proto.reject(s, r.ec, "");  // what basic_server's read loop does with a bad frame
      finish(s);
    } else {
      const bool kept = proto.receive(s, m);
      const bool applied = proto.stats().pushes != pushes;
      require(!applied || proto.stats().pushes == pushes + 1, "one message, one push");
      require(!applied || (kept && m.header.type == message_type::push),
              "only an accepted push is applied");
      const auto counts_after = recovery_counts(proto);
      const bool installed = counts_after.first != counts.first;
      const bool merged = counts_after.second != counts.second;
      require(counts_after.first - counts.first <= 1 && counts_after.second - counts.second <= 1 &&
                  int{applied} + int{installed} + int{merged} <= 1,
              "one message, one change");
      const auto& h = m.header;
      require(!installed || (kept && h.type == message_type::push && h.has(frame_flags::policy)),
              "only an accepted replica push is installed");
      require(!merged || (kept && h.type == message_type::push && h.has(frame_flags::prefixed)),
              "only an accepted backlog push is merged");
      // A merged backlog: its floats as the part scaled them, in place.
      values_t expected = applied || merged ? apply_model(proto, before, m) : before;
      if (installed) {
        if constexpr (stateless) {
          const auto v = payload_floats(m);
          expected[h.table].assign(v.begin(), v.end());
          require(h.clock >= 0 && h.clock <= proto.core().worker_clock(h.sender),
                  "an installed replica's clock lies in [0, its sender's clock]");
          const float bound = proto.part().options.max_replica_value;
          for (float x : v)
            require(bound <= 0.0f || std::abs(x) <= bound,
                    "an installed replica is within max_replica_value");
        }
      }
      const values_t after = snapshot(proto);
      for (std::size_t t = 0; t < after.size(); ++t)
        require(same_bits(after[t], expected[t]),
                applied     ? "an accepted push changes exactly its rows by its gradient"
                : merged    ? "a merged backlog changes its rows by its scaled gradient"
                : installed ? "an installed replica replaces its table"
                            : "parameters are unchanged unless a push is applied");
      if (!kept || !s.open) finish(s);
    }
    for (auto* c : io.cut)
      if (slot[c->slot] == c) finish(*c);
    io.cut.clear();
    drain();
    check_state();
  }
  for (auto* s : slot)
    if (s != nullptr) finish(*s);
  require(proto.sessions().empty(), "every session is forgotten when it ends");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::byte_reader in(std::as_bytes(std::span(data, size)));
  const std::uint8_t policy = in.u8() % 8;
  switch (policy) {
    case 0: run<consistency::ssp<1>>(in); break;
    case 1: run<consistency::essp<1>>(in); break;
    case 2: run<consistency::vap>(in); break;
    default: {
      recovery::stateless_server_part part;
      part.options.rule = policy == 7 ? recovery::merge_rule::lr_scaled
                                      : static_cast<recovery::merge_rule>(policy - 3);
      part.options.max_replica_value = policy == 7 ? 0.0f : 100.0f;
      run<consistency::ssp<1>, recovery::stateless>(in, std::move(part));
    }
  }
  return 0;
}
