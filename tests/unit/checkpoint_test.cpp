// recovery::checkpoint and its file format (recovery/checkpoint/file.hpp, a framing around
// detail/codec/shard_state.hpp): bit-identical round trips, rejection of truncated/corrupt/
// hostile/old-version files, atomic writes, pruning, restore fallback, the fixed and adaptive
// schedule driven by made-up times (recovery/checkpoint/schedule.hpp) and by an injected clock,
// and a real in-process server restored from disk. Nothing here sleeps.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <doctest/doctest.h>
#include <unistd.h>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/detail/codec/shard_state.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/recovery/checkpoint.hpp"
#include "asyncps/recovery/checkpoint/file.hpp"
#include "asyncps/recovery/checkpoint/schedule.hpp"
#include "asyncps/recovery/checkpoint/store.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/in_process.hpp"
#include "asyncps/worker.hpp"
#include "counter_model.hpp"

using namespace asyncps;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system temp directory, removed with everything in it.
struct temp_dir {
  fs::path path;
  temp_dir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path = fs::temp_directory_path() / ("asyncps-ckpt-" + std::to_string(::getpid()) + "-" +
                                        std::to_string(counter++) + "-" + std::to_string(rd()));
    fs::create_directories(path);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::vector<char> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::vector<char>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(b.data(), static_cast<std::streamsize>(b.size()));
}

// Recomputes the trailing checksum, so a test can plant a hostile field that only the
// structural checks can catch.
void reseal(std::vector<char>& b) {
  const std::uint64_t sum = XXH3_64bits(b.data(), b.size() - 8);
  std::memcpy(b.data() + b.size() - 8, &sum, 8);
}

template <class T>
void poke(std::vector<char>& b, std::size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof v);
}

// A consistent state: `tables` tables, Adam-like (2 optimizer planes), random bits including
// -0, NaN payloads and denormals so the comparison must be bit-exact.
shard_state make_state(std::uint32_t shard, std::uint32_t shards, std::uint32_t workers,
                       std::uint32_t spp, clock_value clock, std::uint64_t seed = 1,
                       std::uint32_t rows = 9, std::uint32_t width = 5) {
  std::mt19937_64 rng(seed);
  shard_state st;
  st.shard = shard;
  st.num_shards = shards;
  st.num_workers = workers;
  st.state_per_param = spp;
  st.server_clock = clock;
  for (std::uint32_t w = 0; w < workers; ++w) st.worker_clocks.push_back(clock + w);
  const std::uint32_t ntables = 2;
  for (std::uint32_t i = 0; i < workers * ntables; ++i) st.applied.push_back(rng());
  for (std::uint32_t t = 0; t < ntables; ++t) {
    table_state_copy c;
    c.spec = table_spec{t, rows + t, width + t, 0.25f};
    c.range = shard_range(c.spec.rows, shard, shards);
    c.step = rng();
    c.values.resize(std::size_t{c.range.size()} * c.spec.width);
    c.optimizer_state.resize(c.values.size() * spp);
    auto fill = [&](std::vector<float>& v) {
      for (auto& x : v) {
        const auto bits = static_cast<std::uint32_t>(rng());
        std::memcpy(&x, &bits, 4);
      }
    };
    fill(c.values);
    fill(c.optimizer_state);
    if (!c.values.empty()) c.values[0] = -0.0f;
    st.tables.push_back(std::move(c));
  }
  return st;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

void check_same(const shard_state& a, const shard_state& b) {
  CHECK(a.shard == b.shard);
  CHECK(a.num_shards == b.num_shards);
  CHECK(a.num_workers == b.num_workers);
  CHECK(a.state_per_param == b.state_per_param);
  CHECK(a.server_clock == b.server_clock);
  CHECK(a.worker_clocks == b.worker_clocks);
  CHECK(a.applied == b.applied);
  REQUIRE(a.tables.size() == b.tables.size());
  for (std::size_t i = 0; i < a.tables.size(); ++i) {
    CAPTURE(i);
    const auto& x = a.tables[i];
    const auto& y = b.tables[i];
    CHECK(x.spec == y.spec);
    CHECK(std::memcmp(&x.spec.init_scale, &y.spec.init_scale, 4) == 0);
    CHECK(x.range == y.range);
    CHECK(x.step == y.step);
    CHECK(same_bits(x.values, y.values));
    CHECK(same_bits(x.optimizer_state, y.optimizer_state));
  }
}

result<void> read(const fs::path& p, shard_state& out, std::string& why) {
  return detail::read_checkpoint(p, out, &why);
}

// Expects `file` to be rejected as bad_file with a reason naming it.
void expect_bad(const fs::path& file, std::string_view reason_part = {}) {
  shard_state out;
  std::string why;
  result<void> r = BOOST_OUTCOME_V2_NAMESPACE::success();
  CHECK_NOTHROW(r = read(file, out, why));
  REQUIRE(r.has_error());
  CHECK(r.error() == errc::bad_file);
  CHECK(why.find(file.string()) != std::string::npos);
  if (!reason_part.empty()) CHECK_MESSAGE(why.find(reason_part) != std::string::npos, why);
}

// A clock the test moves by hand: what `checkpoint_options::clock` reads instead of
// steady_clock. Thread-safe (the persist thread reads it too).
struct fake_clock {
  std::atomic<std::int64_t> ns{1'000'000'000};
  void advance(std::chrono::nanoseconds d) { ns += d.count(); }
  std::chrono::steady_clock::time_point now() const {
    return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns.load()));
  }
  recovery::checkpoint_clock source() {
    return [this] { return now(); };
  }
};

// Stands in for basic_server: what the checkpoint policy uses of it.
struct fake_server {
  struct options_t {
    std::uint32_t shard = 0;
  };
  options_t opts;
  shard_state state;
  fake_clock* clock = nullptr;  // when set, a snapshot advances it by `save_delay`
  std::chrono::microseconds save_delay{0};
  int restores = 0;

  const options_t& options() const { return opts; }
  void save_state(shard_state& out) const {
    out.shard = state.shard;
    out.num_shards = state.num_shards;
    out.num_workers = state.num_workers;
    out.state_per_param = state.state_per_param;
    out.server_clock = state.server_clock;
    out.worker_clocks.assign(state.worker_clocks.begin(), state.worker_clocks.end());
    out.applied.assign(state.applied.begin(), state.applied.end());
    out.tables.resize(state.tables.size());
    for (std::size_t i = 0; i < state.tables.size(); ++i) {
      const auto& t = state.tables[i];
      auto& o = out.tables[i];
      o.spec = t.spec;
      o.range = t.range;
      o.step = t.step;
      o.values.assign(t.values.begin(), t.values.end());
      o.optimizer_state.assign(t.optimizer_state.begin(), t.optimizer_state.end());
    }
    if (clock != nullptr) clock->advance(save_delay);
  }
  std::error_code restore_state(const shard_state& st) {
    if (st.shard != state.shard || st.state_per_param != state.state_per_param ||
        st.num_workers != state.num_workers || st.tables.size() != state.tables.size())
      return errc::layout_mismatch;
    state = st;
    ++restores;
    return {};
  }
  // One "clock" of training: change every value, as an optimizer step would.
  void step(clock_value c) {
    state.server_clock = c;
    for (auto& w : state.worker_clocks) w = c;
    for (auto& a : state.applied) ++a;
    for (auto& t : state.tables) {
      ++t.step;
      for (auto& v : t.values) v += 1.0f;
      for (auto& v : t.optimizer_state) v *= 0.5f;
    }
  }
};

fake_server make_fake(std::uint32_t shard = 0, std::uint32_t rows = 9, std::uint32_t width = 5) {
  fake_server s;
  s.opts.shard = shard;
  s.state = make_state(shard, 2, 3, 2, 0, 7, rows, width);
  s.state.worker_clocks.assign(3, 0);
  return s;
}

struct log_capture {
  std::vector<std::string> lines;
  std::function<void(std::string_view)> sink() {
    return [this](std::string_view l) { lines.emplace_back(l); };
  }
  bool contains(std::string_view a, std::string_view b = {}) const {
    for (const auto& l : lines)
      if (l.find(a) != std::string::npos && l.find(b) != std::string::npos) return true;
    return false;
  }
};

std::vector<clock_value> clocks_on_disk(const fs::path& dir, std::uint32_t shard) {
  auto files = recovery::list_checkpoints(dir, shard);
  REQUIRE(files.has_value());
  std::vector<clock_value> c;
  for (const auto& f : files.value()) c.push_back(f.clock);
  return c;
}

}  // namespace

TEST_CASE("checkpoint file: round trip is bit-identical") {
  temp_dir d;
  for (std::uint32_t spp : {0u, 1u, 2u}) {
    CAPTURE(spp);
    const shard_state st = make_state(1, 3, 4, spp, 123456789, 99 + spp);
    const fs::path f = d.path / "state.ckpt";
    std::string why;
    auto w = detail::write_checkpoint(f, st, &why);
    REQUIRE_MESSAGE(!w.has_error(), why);
    CHECK(!fs::exists(d.path / "state.ckpt.tmp"));
    shard_state back = make_state(0, 1, 1, 1, 5, 3);  // stale contents must be replaced
    auto r = read(f, back, why);
    REQUIRE_MESSAGE(!r.has_error(), why);
    check_same(st, back);
    // Overwriting goes through the same rename and leaves no temporary file.
    const shard_state st2 = make_state(1, 3, 4, spp, 7, 5);
    REQUIRE(!detail::write_checkpoint(f, st2).has_error());
    REQUIRE(!read(f, back, why).has_error());
    check_same(st2, back);
  }
}

TEST_CASE("checkpoint file: inconsistent states are not written") {
  temp_dir d;
  shard_state st = make_state(0, 1, 2, 2, 1);
  st.tables[1].optimizer_state.pop_back();
  std::string why;
  auto w = detail::write_checkpoint(d.path / "x.ckpt", st, &why);
  REQUIRE(w.has_error());
  CHECK(w.error() == errc::invalid_argument);
  CHECK(why.find("optimizer") != std::string::npos);
  CHECK(!fs::exists(d.path / "x.ckpt"));
  CHECK(!fs::exists(d.path / "x.ckpt.tmp"));
  // A missing directory is a system error that names the file.
  w = detail::write_checkpoint(d.path / "missing" / "x.ckpt", make_state(0, 1, 1, 0, 0), &why);
  REQUIRE(w.has_error());
  CHECK(w.error() == std::errc::no_such_file_or_directory);
  CHECK(why.find("x.ckpt") != std::string::npos);
}

TEST_CASE("checkpoint file: every truncation is rejected") {
  temp_dir d;
  const fs::path f = d.path / "small.ckpt";
  REQUIRE(!detail::write_checkpoint(f, make_state(0, 2, 2, 2, 3, 11, 3, 2)).has_error());
  const auto bytes = read_bytes(f);
  REQUIRE(bytes.size() > detail::checkpoint_header_bytes + detail::checkpoint_checksum_bytes);
  const fs::path t = d.path / "truncated.ckpt";
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    CAPTURE(n);
    write_bytes(t, std::vector<char>(bytes.begin(), bytes.begin() + static_cast<long>(n)));
    expect_bad(t, "truncated");
  }
  // Trailing garbage is rejected too.
  auto longer = bytes;
  longer.push_back('x');
  write_bytes(t, longer);
  expect_bad(t, "trailing bytes");
}

TEST_CASE("checkpoint file: every flipped byte is rejected") {
  temp_dir d;
  const fs::path f = d.path / "small.ckpt";
  REQUIRE(!detail::write_checkpoint(f, make_state(1, 2, 2, 1, 3, 12, 3, 2)).has_error());
  const auto bytes = read_bytes(f);
  const fs::path t = d.path / "flipped.ckpt";
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    CAPTURE(i);
    auto b = bytes;
    b[i] = static_cast<char>(b[i] ^ 0x10);
    write_bytes(t, b);
    expect_bad(t);
  }
  // Where the magic, version and size are intact, the checksum names the corruption.
  auto b = bytes;
  b[100] = static_cast<char>(b[100] ^ 1);
  write_bytes(t, b);
  expect_bad(t, "checksum mismatch");
}

TEST_CASE("checkpoint file: bad magic, version and hostile counts") {
  temp_dir d;
  const fs::path f = d.path / "good.ckpt";
  REQUIRE(!detail::write_checkpoint(f, make_state(0, 1, 2, 2, 3, 13, 4, 3)).has_error());
  const auto bytes = read_bytes(f);
  const fs::path t = d.path / "bad.ckpt";

  auto b = bytes;
  std::memcpy(b.data(), "NOTACKPT", 8);
  write_bytes(t, b);
  expect_bad(t, "bad magic");

  // A file of the previous format (version 1, before the shared state encoding) and one of a
  // future version are rejected by version, naming the file.
  b = bytes;
  poke<std::uint32_t>(b, 8, 1);
  reseal(b);
  write_bytes(t, b);
  expect_bad(t, "unsupported format version 1 (this library reads 2");
  b = bytes;
  poke<std::uint32_t>(b, 8, 3);
  reseal(b);
  write_bytes(t, b);
  expect_bad(t, "version 3");

  // Counts that are checksummed correctly but describe far more data than the file holds must
  // be rejected before anything is allocated (a resize to these sizes would throw or exhaust
  // memory).
  // The record (detail/codec/shard_state.hpp) starts after the file header.
  const std::size_t h = detail::checkpoint_header_bytes;
  b = bytes;
  poke<std::uint32_t>(b, h + 8, 0xffffffffu);  // num_workers
  reseal(b);
  write_bytes(t, b);
  expect_bad(t, "num_workers");

  b = bytes;
  poke<std::uint32_t>(b, h + 16, 0x40000000u);  // table_count
  reseal(b);
  write_bytes(t, b);
  expect_bad(t, "table_count");

  // First table record: after the record's 32 fixed bytes, 2 worker clocks and 2 x 2 applied
  // counters (no last_seq).
  const std::size_t rec = h + detail::state_header_bytes + 2 * 8 + 4 * 8;
  b = bytes;
  poke<std::uint32_t>(b, rec + 8, 0x7fffffffu);                      // width
  poke<std::uint64_t>(b, rec + 32, std::uint64_t{4} * 0x7fffffffu);  // value_count = rows x width
  reseal(b);
  write_bytes(t, b);
  expect_bad(t, "value_count");

  b = bytes;
  poke<std::uint64_t>(b, rec + 40, std::uint64_t{1} << 61);  // state_count
  reseal(b);
  write_bytes(t, b);
  expect_bad(t, "state_count");

  b = bytes;
  poke<std::uint32_t>(b, rec + 20, 0);  // range.end = 0: no rows, but values are stored
  reseal(b);
  write_bytes(t, b);
  expect_bad(t, "value_count");

  b = bytes;
  poke<std::uint64_t>(b, 16, std::uint64_t{1} << 62);  // file_bytes
  reseal(b);
  write_bytes(t, b);
  expect_bad(t, "truncated");

  // Not found is a system error, not bad_file.
  shard_state out;
  std::string why;
  auto r = read(d.path / "nope.ckpt", out, why);
  REQUIRE(r.has_error());
  CHECK(r.error() == std::errc::no_such_file_or_directory);
  CHECK(why.find("nope.ckpt") != std::string::npos);
}

TEST_CASE("checkpoint file: names, listing and keep=N pruning") {
  CHECK(recovery::checkpoint_file_name(3, 42) == "shard-3-clock-000000000042.ckpt");
  CHECK(recovery::parse_checkpoint_file_name("shard-3-clock-000000000042.ckpt", 3) == 42);
  CHECK(!recovery::parse_checkpoint_file_name("shard-3-clock-000000000042.ckpt", 4));
  CHECK(!recovery::parse_checkpoint_file_name("shard-3-clock-000000000042.ckpt.tmp", 3));
  CHECK(!recovery::parse_checkpoint_file_name("shard-3-clock-42.ckpt", 3));
  CHECK(!recovery::parse_checkpoint_file_name("shard-3-clock-00000000004x.ckpt", 3));
  CHECK(recovery::parse_checkpoint_file_name("shard-3-clock-1000000000000.ckpt", 3) ==
        1000000000000);

  temp_dir d;
  const auto st = make_state(0, 2, 1, 0, 0);
  for (clock_value c : {5, 40, 10, 30, 20}) {
    REQUIRE(
        !detail::write_checkpoint(d.path / recovery::checkpoint_file_name(0, c), st).has_error());
  }
  const auto st1 = make_state(1, 2, 1, 0, 0);
  REQUIRE(
      !detail::write_checkpoint(d.path / recovery::checkpoint_file_name(1, 99), st1).has_error());
  write_bytes(d.path / (recovery::checkpoint_file_name(0, 50) + ".tmp"), {'x'});
  write_bytes(d.path / "notes.txt", {'x'});

  CHECK(clocks_on_disk(d.path, 0) == std::vector<clock_value>{40, 30, 20, 10, 5});
  CHECK(clocks_on_disk(d.path, 1) == std::vector<clock_value>{99});
  CHECK(clocks_on_disk(d.path / "missing", 0).empty());

  auto none = recovery::prune_checkpoints(d.path, 0, 0);  // keep = 0 keeps all
  REQUIRE(none.has_value());
  CHECK(none.value() == 0);
  auto pruned = recovery::prune_checkpoints(d.path, 0, 2);
  REQUIRE(pruned.has_value());
  CHECK(pruned.value() == 3);
  CHECK(clocks_on_disk(d.path, 0) == std::vector<clock_value>{40, 30});
  CHECK(clocks_on_disk(d.path, 1) == std::vector<clock_value>{99});  // other shards untouched
  CHECK(fs::exists(d.path / "notes.txt"));
  auto tmps = recovery::list_stale_checkpoint_tmps(d.path, 0);
  REQUIRE(tmps.has_value());
  REQUIRE(tmps.value().size() == 1);
  CHECK(tmps.value()[0].filename() == recovery::checkpoint_file_name(0, 50) + ".tmp");
}

TEST_CASE("checkpoint policy: options, disabled part and worker part") {
  recovery::checkpoint::server_part off;
  CHECK(!off.enabled());
  fake_server s = make_fake();
  const shard_state before = s.state;
  off.on_start(s);
  off.on_clock(1, s);
  off.on_stop();
  CHECK(s.restores == 0);
  CHECK(off.stats().restored_clock == -1);
  CHECK(off.stats().checkpoints_persisted == 0);

  CHECK_THROWS_AS(
      recovery::checkpoint::server_part(recovery::checkpoint_options{.every_clocks = 5}),
      std::invalid_argument);
  CHECK_THROWS_AS(recovery::checkpoint::server_part(
                      recovery::checkpoint_options{.directory = "x", .every_seconds = -1}),
                  std::invalid_argument);
  CHECK_THROWS_AS(recovery::checkpoint::server_part(
                      recovery::checkpoint_options{.directory = "x", .max_overhead = -0.1}),
                  std::invalid_argument);

  // Movable before it is started (basic_server takes it by value).
  temp_dir d;
  recovery::checkpoint::server_part a(
      recovery::checkpoint_options{.directory = d.path, .every_clocks = 1});
  recovery::checkpoint::server_part b(std::move(a));
  CHECK(b.enabled());
  CHECK(b.options().every_clocks == 1);

  recovery::checkpoint::worker_part w;
  CHECK(w.on_server_lost(make_error_code(errc::connection_closed)) == recovery_action::reconnect);
  CHECK(w.reconnect_timeout() == std::chrono::seconds(30));
  CHECK(recovery::checkpoint::worker_part(std::chrono::milliseconds(1500)).reconnect_timeout() ==
        std::chrono::milliseconds(1500));
  CHECK(recovery::checkpoint::worker_part(
            recovery::checkpoint_options{.reconnect_timeout = std::chrono::milliseconds(7)})
            .reconnect_timeout() == std::chrono::milliseconds(7));
  CHECK(recovery::checkpoint::name == "checkpoint");
}

TEST_CASE("checkpoint policy: a checkpoint every k clocks, restored bit-identically") {
  temp_dir d;
  log_capture logs;
  recovery::checkpoint_options o{.directory = d.path / "ckpt", .every_clocks = 3, .keep = 0};
  o.log = logs.sink();
  fake_server s = make_fake(1);
  shard_state at9;
  {
    recovery::checkpoint::server_part p(o);
    p.on_start(s);  // creates the directory; nothing to restore
    CHECK(p.stats().restored_clock == -1);
    CHECK(logs.contains("starting fresh"));
    for (clock_value c = 1; c <= 10; ++c) {
      s.step(c);
      p.on_clock(c, s);
      p.wait_persisted();  // never skip: the test wants every due checkpoint
      if (c == 9) at9 = s.state;
    }
    p.on_stop();
    const auto st = p.stats();
    CHECK(st.checkpoints_persisted == 3);
    CHECK(st.skipped == 0);
    CHECK(st.failed == 0);
    CHECK(st.last_persisted_clock == 9);
    CHECK(st.interval_clocks == 3);
    CHECK(st.last_bytes == s.state.data_bytes());
    CHECK(st.snapshot_seconds_total > 0);
    CHECK(st.persist_seconds_total > 0);
    CHECK(!st.last_error);
  }
  CHECK(clocks_on_disk(d.path / "ckpt", 1) == std::vector<clock_value>{9, 6, 3});

  // A fresh server (same layout, different values) restores clock 9 exactly.
  fake_server fresh = make_fake(1);
  recovery::checkpoint::server_part p(o);
  p.on_start(fresh);
  CHECK(fresh.restores == 1);
  CHECK(p.stats().restored_clock == 9);
  check_same(fresh.state, at9);
  CHECK(logs.contains("restored from", recovery::checkpoint_file_name(1, 9)));
  // The interval counts from the restored clock: the next checkpoint is at 12.
  for (clock_value c = 10; c <= 12; ++c) {
    fresh.step(c);
    p.on_clock(c, fresh);
    p.wait_persisted();
  }
  p.on_stop();
  CHECK(p.stats().last_persisted_clock == 12);
  CHECK(clocks_on_disk(d.path / "ckpt", 1) == std::vector<clock_value>{12, 9, 6, 3});
}

TEST_CASE("checkpoint policy: keep=2 prunes after each persist") {
  temp_dir d;
  recovery::checkpoint_options o{.directory = d.path, .every_clocks = 1};
  o.log = [](std::string_view) {};
  fake_server s = make_fake();
  recovery::checkpoint::server_part p(o);
  p.on_start(s);
  for (clock_value c = 1; c <= 6; ++c) {
    s.step(c);
    p.on_clock(c, s);
    p.wait_persisted();
    CHECK(clocks_on_disk(d.path, 0).size() ==
          static_cast<std::size_t>(std::min<clock_value>(c, 2)));
  }
  p.on_stop();
  CHECK(clocks_on_disk(d.path, 0) == std::vector<clock_value>{6, 5});
  CHECK(p.stats().checkpoints_persisted == 6);
}

TEST_CASE("checkpoint policy: restore skips a leftover .tmp, a corrupt file and a misfit") {
  temp_dir d;
  fake_server s = make_fake(0);
  s.step(10);
  const shard_state at10 = s.state;
  REQUIRE(
      !detail::write_checkpoint(d.path / recovery::checkpoint_file_name(0, 10), at10).has_error());
  s.step(20);
  const fs::path newest = d.path / recovery::checkpoint_file_name(0, 20);
  REQUIRE(!detail::write_checkpoint(newest, s.state).has_error());
  auto b = read_bytes(newest);
  b.resize(b.size() / 2);  // a torn file under the final name (e.g. copied by hand)
  write_bytes(newest, b);
  // A file at clock 25 from an optimizer with another state layout.
  shard_state other = s.state;
  other.state_per_param = 1;
  for (auto& t : other.tables) t.optimizer_state.resize(t.values.size());
  REQUIRE(
      !detail::write_checkpoint(d.path / recovery::checkpoint_file_name(0, 25), other).has_error());
  // A persist killed half-way at clock 30: only the .tmp exists.
  const fs::path tmp = d.path / (recovery::checkpoint_file_name(0, 30) + ".tmp");
  write_bytes(tmp, std::vector<char>(100, 'x'));

  log_capture logs;
  recovery::checkpoint_options o{.directory = d.path, .every_clocks = 5};
  o.log = logs.sink();
  fake_server fresh = make_fake(0);
  recovery::checkpoint::server_part p(o);
  p.on_start(fresh);
  CHECK(p.stats().restored_clock == 10);
  CHECK(fresh.restores == 1);
  check_same(fresh.state, at10);
  CHECK(!fs::exists(tmp));
  CHECK(logs.contains("removed unfinished", tmp.filename().string()));
  CHECK(logs.contains(newest.string(), "truncated"));
  CHECK(logs.contains(recovery::checkpoint_file_name(0, 25), "does not fit"));
  p.on_stop();

  // No valid file at all: the server starts fresh and says so.
  fs::remove(d.path / recovery::checkpoint_file_name(0, 10));
  log_capture logs2;
  o.log = logs2.sink();
  fake_server fresh2 = make_fake(0);
  recovery::checkpoint::server_part p2(o);
  p2.on_start(fresh2);
  CHECK(p2.stats().restored_clock == -1);
  CHECK(fresh2.restores == 0);
  CHECK(logs2.contains("no valid checkpoint"));
}

TEST_CASE("checkpoint policy: a checkpoint due during a persist is skipped") {
  temp_dir d;
  std::mutex m;
  std::condition_variable cv;
  bool release = false;
  int writes = 0;
  recovery::checkpoint_options o{.directory = d.path, .every_clocks = 1};
  o.log = [](std::string_view) {};
  o.writer = [&](const fs::path& f, const shard_state& st) {
    std::unique_lock lock(m);
    ++writes;
    cv.wait(lock, [&] { return release; });
    return detail::write_checkpoint(f, st);
  };
  fake_server s = make_fake();
  recovery::checkpoint::server_part p(o);
  p.on_start(s);
  s.step(1);
  p.on_clock(1, s);  // snapshot; the writer blocks
  for (clock_value c = 2; c <= 4; ++c) {
    s.step(c);
    p.on_clock(c, s);  // persist in flight: skipped
  }
  CHECK(p.stats().skipped == 3);
  {
    std::lock_guard lock(m);
    release = true;
  }
  cv.notify_all();
  p.wait_persisted();
  s.step(5);
  p.on_clock(5, s);
  p.on_stop();
  const auto st = p.stats();
  CHECK(st.checkpoints_persisted == 2);
  CHECK(st.skipped == 3);
  CHECK(writes == 2);
  CHECK(clocks_on_disk(d.path, 0) == std::vector<clock_value>{5, 1});
}

TEST_CASE("checkpoint policy: a failed persist is counted, logged and retried later") {
  temp_dir d;
  log_capture logs;
  int calls = 0;
  recovery::checkpoint_options o{.directory = d.path, .every_clocks = 1};
  o.log = logs.sink();
  o.writer = [&](const fs::path& f, const shard_state& st) -> result<void> {
    if (++calls == 1) return make_error_code(std::errc::no_space_on_device);
    return detail::write_checkpoint(f, st);
  };
  fake_server s = make_fake();
  recovery::checkpoint::server_part p(o);
  p.on_start(s);
  s.step(1);
  p.on_clock(1, s);
  p.wait_persisted();
  CHECK(p.stats().failed == 1);
  CHECK(p.stats().last_error == std::errc::no_space_on_device);
  s.step(2);
  p.on_clock(2, s);  // logs the failure, checkpoints again
  p.on_stop();
  CHECK(logs.contains(recovery::checkpoint_file_name(0, 1)));
  CHECK(p.stats().checkpoints_persisted == 1);
  CHECK(p.stats().last_persisted_clock == 2);
}

namespace {

// The schedule alone, driven by made-up times: `clocks` server clocks `clock_gap` apart; a
// snapshot takes `save` and its persist `persist` (it runs in the background: clocks go on
// meanwhile, and a checkpoint due while it runs is skipped).
struct simulated_run {
  std::uint64_t interval_clocks = 0;
  std::uint64_t persisted = 0;
  std::uint64_t skipped = 0;
  clock_value last_persisted_clock = -1;
  double snapshot_seconds_total = 0;
  double clock_seconds = 0;
};

simulated_run simulate(double max_overhead, std::chrono::microseconds persist,
                       std::chrono::microseconds save, std::uint64_t clocks = 400,
                       std::chrono::microseconds clock_gap = std::chrono::milliseconds(1)) {
  using time_point = recovery::checkpoint_schedule::time_point;
  time_point t{std::chrono::seconds(1)};
  recovery::checkpoint_schedule s(0, 0, max_overhead, t);
  s.start(t);
  simulated_run r;
  bool running = false;
  time_point done_at{};
  clock_value job = -1;
  for (clock_value c = 1; c <= static_cast<clock_value>(clocks); ++c) {
    t += clock_gap;
    if (running && t >= done_at) {
      running = false;
      s.persist_finished(std::chrono::duration<double>(persist).count());
      ++r.persisted;
      r.last_persisted_clock = job;
    }
    switch (s.at_clock(c, t, running)) {
      case recovery::checkpoint_decision::not_due: s.clock_done(t, running); break;
      case recovery::checkpoint_decision::skip:
        ++r.skipped;
        s.clock_done(t, true);
        break;
      case recovery::checkpoint_decision::snapshot: {
        const time_point started = t;
        t += save;
        s.snapshot_taken(std::chrono::duration<double>(save).count(), started);
        r.snapshot_seconds_total += std::chrono::duration<double>(save).count();
        running = true;
        done_at = t + persist;
        job = c;
        s.clock_done(t, true);
        break;
      }
    }
  }
  r.interval_clocks = s.interval_clocks();
  r.clock_seconds = s.clock_seconds();
  return r;
}

}  // namespace

TEST_CASE("checkpoint schedule: fixed intervals in clocks, in seconds, or whichever first") {
  using time_point = recovery::checkpoint_schedule::time_point;
  using std::chrono::milliseconds;
  auto due_clocks = [](std::uint64_t every_clocks, double every_seconds, milliseconds gap) {
    time_point t{std::chrono::seconds(5)};
    recovery::checkpoint_schedule s(every_clocks, every_seconds, 0, t);
    s.start(t);
    std::vector<clock_value> due;
    for (clock_value c = 1; c <= 12; ++c) {
      t += gap;
      const auto d = s.at_clock(c, t, false);
      CHECK(d != recovery::checkpoint_decision::skip);
      if (d == recovery::checkpoint_decision::snapshot) {
        due.push_back(c);
        s.snapshot_taken(0.001, t);
      }
      s.clock_done(t, false);
    }
    CHECK(s.interval_clocks() == every_clocks);
    return due;
  };
  CHECK(due_clocks(3, 0, milliseconds(100)) == std::vector<clock_value>{3, 6, 9, 12});
  CHECK(due_clocks(0, 0.5, milliseconds(100)) == std::vector<clock_value>{5, 10});
  CHECK(due_clocks(0, 0.25, milliseconds(100)) == std::vector<clock_value>{3, 6, 9, 12});
  CHECK(due_clocks(4, 0.25, milliseconds(100)) == std::vector<clock_value>{3, 6, 9, 12});
  CHECK(due_clocks(2, 0.5, milliseconds(100)) == std::vector<clock_value>{2, 4, 6, 8, 10, 12});
  // A checkpoint due while the previous persist runs is skipped, and the interval counts on
  // from the skip; a restore moves the start of the count.
  time_point t{};
  recovery::checkpoint_schedule s(2, 0, 0, t);
  s.count_from(10);
  s.start(t);
  CHECK(s.at_clock(11, t, false) == recovery::checkpoint_decision::not_due);
  CHECK(s.at_clock(12, t, true) == recovery::checkpoint_decision::skip);
  CHECK(s.at_clock(13, t, false) == recovery::checkpoint_decision::not_due);
  CHECK(s.at_clock(14, t, false) == recovery::checkpoint_decision::snapshot);
  CHECK(!recovery::checkpoint_schedule().active());
}

TEST_CASE("checkpoint schedule: the adaptive interval grows when persist is slow") {
  // Clocks every 1 ms. A persist that takes 40 ms needs k >= 40 clocks between checkpoints
  // (CheckFreq's k = ceil(t_persist / t_clock)); an instant one keeps k near 1.
  using std::chrono::microseconds;
  using std::chrono::milliseconds;
  const auto slow = simulate(0.05, milliseconds(40), {});
  const auto fast = simulate(0.05, {}, {});
  MESSAGE("slow persist: k = " << slow.interval_clocks << ", persisted " << slow.persisted
                               << ", skipped " << slow.skipped << ", clock "
                               << slow.clock_seconds * 1e3 << " ms");
  MESSAGE("fast persist: k = " << fast.interval_clocks << ", persisted " << fast.persisted
                               << ", skipped " << fast.skipped);
  CHECK(slow.interval_clocks >= 40);
  CHECK(slow.interval_clocks > fast.interval_clocks);
  CHECK(slow.persisted >= 2);
  CHECK(slow.skipped >= 1);  // the first persist was profiled while clocks went on
  CHECK(fast.persisted > slow.persisted);
  CHECK(fast.interval_clocks == 1);
  CHECK(fast.skipped == 0);
  CHECK(slow.last_persisted_clock > 0);
  CHECK(slow.clock_seconds == doctest::Approx(1e-3));

  // A slow snapshot (5 ms per snapshot, clocks 1 ms apart) with a 5% bound needs
  // k >= ceil(5 / (0.05 x 1)) = 100.
  const auto costly = simulate(0.05, {}, microseconds(5000));
  MESSAGE("slow snapshot: k = " << costly.interval_clocks << ", persisted " << costly.persisted);
  CHECK(costly.interval_clocks >= 100);
  CHECK(costly.snapshot_seconds_total < 0.25 * 400 * 1e-3 + 0.05);
}

TEST_CASE("checkpoint policy: the injected clock drives every_seconds and the adaptive k") {
  using std::chrono::milliseconds;
  temp_dir d;
  fake_clock clock;
  {
    recovery::checkpoint_options o{.directory = d.path, .every_seconds = 0.5};
    o.log = [](std::string_view) {};
    o.clock = clock.source();
    fake_server s = make_fake();
    recovery::checkpoint::server_part p(o);
    p.on_start(s);
    for (clock_value c = 1; c <= 10; ++c) {
      clock.advance(milliseconds(100));
      s.step(c);
      p.on_clock(c, s);
      p.wait_persisted();
    }
    p.on_stop();
    const auto st = p.stats();
    CHECK(st.checkpoints_persisted == 2);
    CHECK(st.last_persisted_clock == 10);
    CHECK(st.interval_clocks == 0);  // no clock trigger
    CHECK(st.clock_seconds == doctest::Approx(0.1));
    CHECK(st.last_persist_seconds == 0);  // the fake clock stood still while it ran
    CHECK(clocks_on_disk(d.path, 0) == std::vector<clock_value>{10, 5});
  }
  {
    // A snapshot that costs 5 ms of (fake) time with clocks 1 ms apart and a 5% bound: the
    // first checkpoint profiles it, then k = ceil(5 / (0.05 x 1)) = 100.
    temp_dir d2;
    recovery::checkpoint_options o{.directory = d2.path, .max_overhead = 0.05, .keep = 0};
    o.log = [](std::string_view) {};
    o.clock = clock.source();
    fake_server s = make_fake(0, 4, 2);
    s.clock = &clock;
    s.save_delay = std::chrono::microseconds(5000);
    recovery::checkpoint::server_part p(o);
    p.on_start(s);
    for (clock_value c = 1; c <= 400; ++c) {
      clock.advance(milliseconds(1));
      s.step(c);
      p.on_clock(c, s);
      p.wait_persisted();  // persists take no fake time: none is skipped
    }
    p.on_stop();
    const auto st = p.stats();
    CHECK(st.interval_clocks == 100);
    CHECK(st.skipped == 0);
    CHECK(clocks_on_disk(d2.path, 0) == std::vector<clock_value>{301, 201, 101, 1});
    CHECK(st.checkpoints_persisted == 4);
    CHECK(st.last_snapshot_seconds == doctest::Approx(0.005));
    CHECK(st.snapshot_seconds_total == doctest::Approx(4 * 0.005));
    CHECK(st.clock_seconds == doctest::Approx(0.001));
  }
}

TEST_CASE("checkpoint file: the record is the shared shard_state encoding, last_seq included") {
  temp_dir d;
  shard_state st = make_state(1, 2, 3, 1, 17, 21);
  st.last_seq = {5, 0, 9};
  const fs::path f = d.path / "x.ckpt";
  REQUIRE(!detail::write_checkpoint(f, st).has_error());
  const auto file = read_bytes(f);
  std::vector<std::byte> record(detail::encoded_state_size(st));
  detail::encode_state(st, record);
  REQUIRE(file.size() ==
          detail::checkpoint_header_bytes + record.size() + detail::checkpoint_checksum_bytes);
  CHECK(std::memcmp(file.data() + detail::checkpoint_header_bytes, record.data(), record.size()) ==
        0);
  shard_state back;
  std::string why;
  REQUIRE_MESSAGE(!read(f, back, why).has_error(), why);
  check_same(st, back);
  CHECK(back.last_seq == st.last_seq);
  // A state whose last_seq has the wrong length is not written.
  st.last_seq.pop_back();
  auto w = detail::write_checkpoint(f, st, &why);
  REQUIRE(w.has_error());
  CHECK(w.error() == errc::invalid_argument);
  CHECK(why.find("last_seq") != std::string::npos);
}

namespace {

// counter_model that runs a hook before each gradient (here: wait for the servers' persists,
// so no checkpoint is skipped and the test is deterministic).
struct hooked_model : test::counter_model {
  using test::counter_model::counter_model;
  std::function<void()> before;
  float compute_gradient(const parameter_view& p, gradient_view& g) {
    if (before) before();
    return test::counter_model::compute_gradient(p, g);
  }
};

using ckpt_server = basic_server<in_process_transport, consistency::ssp<1>, recovery::checkpoint,
                                 optimizer::momentum>;
using ckpt_worker =
    basic_worker<hooked_model, in_process_transport, consistency::ssp<1>, recovery::checkpoint>;

}  // namespace

TEST_CASE("checkpoint policy: a real server checkpoints every k clocks; a fresh one restores it") {
  temp_dir d;
  const std::uint32_t workers = 2;
  const std::uint32_t shards = 2;
  const std::uint64_t clocks = 12;
  log_capture logs;
  recovery::checkpoint_options co{.directory = d.path, .every_clocks = 4, .keep = 10};
  co.log = logs.sink();
  server_options so;
  so.num_workers = workers;
  so.num_shards = shards;
  so.tables = {table_spec{0, 6, 3, 0.5f}};
  so.log = [](std::string_view) {};
  const optimizer::momentum opt{0.05f, 0.9f};

  asio::io_context io(1);
  in_process_network net;
  std::vector<std::unique_ptr<in_process_transport>> ts;
  std::vector<std::unique_ptr<ckpt_server>> servers;
  for (std::uint32_t s = 0; s < shards; ++s) {
    ts.push_back(std::make_unique<in_process_transport>(io.get_executor(), net));
    so.shard = s;
    servers.push_back(
        std::make_unique<ckpt_server>(*ts.back(), so, opt, recovery::checkpoint::server_part(co)));
    auto acc = ts.back()->listen("s" + std::to_string(s));
    REQUIRE(acc.has_value());
    asio::co_spawn(io, servers.back()->async_serve(std::move(acc).value()), asio::detached);
  }
  std::vector<hooked_model> models;
  for (std::uint32_t w = 0; w < workers; ++w) models.emplace_back(w, workers, 1, 3);
  std::vector<std::unique_ptr<ckpt_worker>> ws;
  int done = 0;
  std::error_code errors[workers];
  for (std::uint32_t w = 0; w < workers; ++w) {
    models[w].spec[0] = so.tables[0];
    models[w].before = [&] {
      for (auto& s : servers) s->recovery().wait_persisted();
    };
    ts.push_back(std::make_unique<in_process_transport>(io.get_executor(), net));
    ckpt_worker::options_type o;
    o.id = w;
    o.servers = {"s0", "s1"};
    o.local_step = 0.0f;
    o.log = [](std::string_view) {};
    ws.push_back(std::make_unique<ckpt_worker>(*ts.back(), models[w], o));
  }
  for (std::uint32_t w = 0; w < workers; ++w) {
    asio::co_spawn(
        io,
        [&, w]() -> asio::awaitable<void> {
          errors[w] = co_await ws[w]->async_run(clocks);
          if (++done == static_cast<int>(workers))
            for (auto& s : servers) s->stop();
        },
        asio::detached);
  }
  io.run();
  REQUIRE(!errors[0]);
  REQUIRE(!errors[1]);

  for (std::uint32_t s = 0; s < shards; ++s) {
    CAPTURE(s);
    const auto& srv = *servers[s];
    REQUIRE(srv.clock() == static_cast<clock_value>(clocks));
    const auto st = srv.recovery().stats();
    CHECK(st.checkpoints_persisted == 3);
    CHECK(st.skipped == 0);
    CHECK(st.last_persisted_clock == 12);
    CHECK(st.restored_clock == -1);
    CHECK(clocks_on_disk(d.path, s) == std::vector<clock_value>{12, 8, 4});

    // Every file is a consistent clock-boundary snapshot of this shard.
    for (clock_value c : {4, 8, 12}) {
      shard_state f;
      std::string why;
      REQUIRE_MESSAGE(!read(d.path / recovery::checkpoint_file_name(s, c), f, why).has_error(),
                      why);
      CHECK(f.shard == s);
      CHECK(f.server_clock == c);
      CHECK(*std::min_element(f.worker_clocks.begin(), f.worker_clocks.end()) == c);
      CHECK(f.state_per_param == 1);
      REQUIRE(f.tables.size() == 1);
      CHECK(f.tables[0].optimizer_state.size() == f.tables[0].values.size());
    }
    // The last checkpoint was taken at the final clock, so it equals the final state.
    shard_state final_state, on_disk;
    srv.save_state(final_state);
    std::string why;
    REQUIRE(!read(d.path / recovery::checkpoint_file_name(s, 12), on_disk, why).has_error());
    check_same(on_disk, final_state);
  }

  // Fresh servers with the same options restore the newest checkpoint: values, optimizer
  // state, steps, vector clock and applied counts are bit-identical.
  asio::io_context io2(1);
  in_process_network net2;
  for (std::uint32_t s = 0; s < shards; ++s) {
    CAPTURE(s);
    in_process_transport t(io2.get_executor(), net2);
    so.shard = s;
    so.seed = 1234;  // different initial values: everything must come from the file
    ckpt_server fresh(t, so, opt, recovery::checkpoint::server_part(co));
    auto acc = t.listen("fresh");
    REQUIRE(acc.has_value());
    std::error_code serve_ec = make_error_code(errc::timeout);
    asio::co_spawn(
        io2,
        [&]() -> asio::awaitable<void> {
          serve_ec = co_await fresh.async_serve(std::move(acc).value());
        },
        asio::detached);
    asio::post(io2, [&] { fresh.stop(); });
    io2.restart();
    io2.run();
    CHECK(!serve_ec);
    CHECK(fresh.recovery().stats().restored_clock == 12);
    CHECK(fresh.clock() == 12);
    shard_state restored, original;
    fresh.save_state(restored);
    servers[s]->save_state(original);
    check_same(restored, original);
  }
  CHECK(logs.contains("restored from", recovery::checkpoint_file_name(1, 12)));
}
