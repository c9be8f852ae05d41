// Tests of the matrix-factorization example (examples/matrix_factorization/mf.hpp): the
// synthetic generator, the MovieLens loader, the splits, and `mf_model`'s gradient, which is
// checked against central differences and by training a rank-5 problem with plain SGD; and the
// worker's sparse pushes of its touched rows (same result as dense pushes, far fewer bytes).
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <vector>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/error.hpp"
#include "asyncps/model.hpp"
#include "asyncps/server.hpp"
#include "asyncps/table.hpp"
#include "asyncps/transport/simulated.hpp"
#include "asyncps/worker.hpp"
#include "examples/matrix_factorization/mf.hpp"

namespace {

namespace mf = asyncps::examples::mf;

/// Parameters for `layout`, uniform in [-scale, scale].
std::vector<float> random_parameters(std::span<const asyncps::table_spec> layout, float scale,
                                     std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> params(asyncps::layout_size(layout));
  for (float& v : params) v = u(rng);
  return params;
}

/// Entries as comparable tuples (value compared bit for bit through ==).
std::vector<std::tuple<std::uint32_t, std::uint32_t, float>> as_tuples(const mf::ratings& r) {
  std::vector<std::tuple<std::uint32_t, std::uint32_t, float>> out;
  for (const auto& e : r.entries) out.emplace_back(e.user, e.item, e.value);
  return out;
}

/// Fraction of `entries` whose `key` is among the 10% most frequent keys of [0, n).
template <class Key>
double top_decile_share(const mf::ratings& r, std::uint32_t n, Key key) {
  std::vector<std::size_t> counts(n, 0);
  for (const auto& e : r.entries) ++counts[key(e)];
  std::sort(counts.begin(), counts.end(), std::greater<>());
  std::size_t top = 0;
  for (std::uint32_t k = 0; k < n / 10; ++k) top += counts[k];
  return static_cast<double>(top) / static_cast<double>(r.size());
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// A fresh directory under the system temp directory, removed on destruction.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() /
           ("asyncps_mf_test_" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

void write_file(const std::filesystem::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary);
  REQUIRE(out.is_open());
  out << text;
  REQUIRE(out.good());
}

/// The same four ratings, remapped: users 196->0, 186->1, 22->2; items 242->0, 302->1, 377->2.
void check_sample(const mf::ratings& r) {
  CHECK(r.users == 3);
  CHECK(r.items == 3);
  REQUIRE(r.size() == 4);
  using t = std::tuple<std::uint32_t, std::uint32_t, float>;
  CHECK(as_tuples(r) == std::vector<t>{{0, 0, 3.0f}, {1, 1, 3.5f}, {0, 2, 1.0f}, {2, 0, 5.0f}});
}

mf::load_result<mf::ratings> parse(const std::string& text) {
  std::istringstream in(text);
  return mf::parse_ratings(in, "input.txt");
}

/// A small problem for gradient checks: 5 users, 4 items; user 4 and item 3 have no rating.
mf::ratings tiny_ratings() {
  mf::ratings r;
  r.users = 5;
  r.items = 4;
  r.entries = {{0, 0, 1.0f},  {0, 1, -0.5f}, {1, 1, 2.0f},  {1, 2, 0.25f}, {2, 0, -1.5f},
               {2, 2, 0.75f}, {3, 0, 0.5f},  {3, 1, -1.0f}, {3, 2, 1.25f}, {1, 0, 0.0f}};
  return r;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// (a) the synthetic generator
// ---------------------------------------------------------------------------------------------

TEST_CASE("mf: make_synthetic is deterministic and has the requested shape") {
  mf::synthetic_options o;
  o.users = 400;
  o.items = 300;
  o.rank = 4;
  o.count = 9000;
  o.noise = 0.1f;
  o.seed = 7;
  const mf::ratings a = mf::make_synthetic(o);
  const mf::ratings b = mf::make_synthetic(o);
  CHECK(a.users == 400);
  CHECK(a.items == 300);
  REQUIRE(a.size() == 9000);
  CHECK(as_tuples(a) == as_tuples(b));

  o.seed = 8;
  const mf::ratings c = mf::make_synthetic(o);
  REQUIRE(c.size() == 9000);
  CHECK(as_tuples(a) != as_tuples(c));

  // Indices in range, (user, item) pairs distinct, values finite with about unit variance
  // (true ratings have variance 1, plus noise 0.01).
  std::vector<std::uint64_t> keys;
  double sum = 0.0, sum_sq = 0.0;
  for (const auto& e : a.entries) {
    REQUIRE(e.user < a.users);
    REQUIRE(e.item < a.items);
    REQUIRE(std::isfinite(e.value));
    keys.push_back((std::uint64_t{e.user} << 32) | e.item);
    sum += e.value;
    sum_sq += static_cast<double>(e.value) * e.value;
  }
  std::sort(keys.begin(), keys.end());
  CHECK(std::adjacent_find(keys.begin(), keys.end()) == keys.end());
  const double n = static_cast<double>(a.size());
  const double variance = sum_sq / n - (sum / n) * (sum / n);
  CHECK(variance > 0.5);
  CHECK(variance < 2.0);
}

TEST_CASE("mf: make_synthetic frequencies follow the requested skew") {
  mf::synthetic_options o;
  o.users = 1000;
  o.items = 500;
  o.count = 20000;
  o.user_exponent = 1.0;
  o.item_exponent = 1.0;
  const mf::ratings skewed = mf::make_synthetic(o);
  const auto by_user = [](const mf::rating& e) { return e.user; };
  const auto by_item = [](const mf::rating& e) { return e.item; };
  // Zipf(1): the top 10% hold H(n/10) / H(n) of the draws (0.57 for users, 0.66 for items),
  // less once repeated pairs are redrawn (measured: 0.47 and 0.46); uniform sampling gives
  // about 0.1 plus sampling noise (measured: 0.14 and 0.13).
  const double user_share = top_decile_share(skewed, o.users, by_user);
  const double item_share = top_decile_share(skewed, o.items, by_item);
  INFO("skewed: top-decile user share ", user_share, ", item share ", item_share);
  CHECK(user_share > 0.4);
  CHECK(item_share > 0.4);
  // Popular ids are scattered by a random permutation, not 0, 1, 2, ...
  std::vector<std::size_t> item_counts(o.items, 0);
  for (const auto& e : skewed.entries) ++item_counts[e.item];
  const auto most_popular = std::max_element(item_counts.begin(), item_counts.end());
  CHECK(most_popular != item_counts.begin());

  o.user_exponent = 0.0;
  o.item_exponent = 0.0;
  const mf::ratings uniform = mf::make_synthetic(o);
  const double uniform_user = top_decile_share(uniform, o.users, by_user);
  const double uniform_item = top_decile_share(uniform, o.items, by_item);
  INFO("uniform: top-decile user share ", uniform_user, ", item share ", uniform_item);
  CHECK(uniform_user < 0.2);
  CHECK(uniform_item < 0.2);
}

TEST_CASE("mf: make_synthetic rejects impossible options") {
  mf::synthetic_options o;
  o.users = 10;
  o.items = 10;
  o.count = 50;
  CHECK_NOTHROW(mf::make_synthetic(o));
  auto bad = o;
  bad.users = 0;
  CHECK_THROWS_AS(mf::make_synthetic(bad), std::invalid_argument);
  bad = o;
  bad.rank = 0;
  CHECK_THROWS_AS(mf::make_synthetic(bad), std::invalid_argument);
  bad = o;
  bad.count = 101;
  CHECK_THROWS_AS(mf::make_synthetic(bad), std::invalid_argument);
  bad = o;
  bad.noise = -1.0f;
  CHECK_THROWS_AS(mf::make_synthetic(bad), std::invalid_argument);
  bad = o;
  bad.item_exponent = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_AS(mf::make_synthetic(bad), std::invalid_argument);
  // Every pair of a 10 x 10 matrix, even when skewed: found (or reported), never a hang.
  bad = o;
  bad.count = 100;
  bad.user_exponent = 1.0;
  CHECK(mf::make_synthetic(bad).size() == 100);
  bad.user_exponent = 40.0;  // the last user's weight is 10^-40: unreachable
  CHECK_THROWS_AS(mf::make_synthetic(bad), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// (b) the loader
// ---------------------------------------------------------------------------------------------

TEST_CASE("mf: load_ratings parses tab, '::', comma and blank separated files") {
  temp_dir dir;
  // ml-100k u.data: tab separated with a timestamp.
  write_file(dir.path / "u.data", "196\t242\t3\t881250949\n"
                                  "186\t302\t3.5\t891717742\n"
                                  "196\t377\t1\t878887116\n"
                                  "22\t242\t5\t878887116\n");
  // ml-1m ratings.dat: '::' separated, no newline at the end.
  write_file(dir.path / "ratings.dat", "196::242::3::881250949\n"
                                       "186::302::3.5::891717742\n"
                                       "196::377::1::878887116\n"
                                       "22::242::5::878887116");
  // ml-latest ratings.csv: a header line, comma separated, CRLF line ends.
  write_file(dir.path / "ratings.csv", "userId,movieId,rating,timestamp\r\n"
                                       "196,242,3.0,881250949\r\n"
                                       "186,302,3.5,891717742\r\n"
                                       "196,377,1.0,878887116\r\n"
                                       "22,242,5.0,878887116\r\n");
  // Blank separated, with comments, blank lines and ragged spacing.
  write_file(dir.path / "plain.txt", "# user item rating\n"
                                     "\n"
                                     "196 242 3\n"
                                     "  186   302\t3.5  \n"
                                     "196 377 1\n"
                                     "\n"
                                     "22 242 5e0\n");
  for (const char* name : {"u.data", "ratings.dat", "ratings.csv", "plain.txt"}) {
    INFO("file ", name);
    const auto r = mf::load_ratings(dir.path / name);
    REQUIRE_MESSAGE(r.has_value(), (r ? std::string() : r.error().message));
    check_sample(r.value());
  }
}

TEST_CASE("mf: the loader rejects malformed lines with an error naming the line") {
  using namespace std::string_literals;
  struct bad_input {
    std::string text;
    int line;
    std::string what;
  };
  const std::vector<bad_input> cases = {
      {"1\t2\t3\n4\t5\n", 2, "found 2"},
      {"1,2,3\n1,2,x\n", 2, "field 3 (rating) 'x'"},
      {"1::2::3\n1,2,3\n", 2, "separator differs"},
      {"1 2 nan\n", 1, "field 3"},
      {"1 2 inf\n", 1, "field 3"},
      {"1 2 1e99\n", 1, "field 3"},  // out of float range
      {"-1 2 3\n", 1, "field 1 (user id) '-1'"},
      {"1 2.5 3\n", 1, "field 2 (item id) '2.5'"},
      {"99999999999999999999 1 2\n", 1, "field 1"},  // > 2^64 - 1
      {"1:2:3\n", 1, "single ':'"},
      {"1,,3\n", 1, "field 2 is empty"},
      {",1,2,3\n", 1, "field 1 is empty"},
      {"1,2,3,\n", 1, "separator ends the line"},
      {"1 2 3 , 4\n", 1, "mixed separators"},
      {"\n# comment\n1 2 3\n\n1 2\n", 5, "found 2"},
      {"userId item rating\nfoo bar baz\n", 2, "field 1 (user id) 'foo'"},
      {"1 2 3\n\x01\x02\xff garbage\x00 9\n"s, 2, "field 1"},  // binary bytes
  };
  for (const auto& c : cases) {
    INFO("input: ", c.text);
    const auto r = parse(c.text);
    REQUIRE_FALSE(r.has_value());
    const auto& error = r.error();
    INFO("message: ", error.message);
    CHECK(error.code == asyncps::errc::bad_file);
    CHECK(error.code == asyncps::condition::fatal);
    CHECK(contains(error.message, "input.txt:" + std::to_string(c.line) + ": "));
    CHECK(contains(error.message, c.what));
    CHECK_THROWS_AS((void)r.value(), std::system_error);
  }

  // Inputs without a rating: no line to name.
  for (const std::string text : {"", "\n\n", "# nothing\n", "user,item,rating\n"}) {
    INFO("input: ", text);
    const auto r = parse(text);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == asyncps::errc::bad_file);
    CHECK(r.error().message == "input.txt: no ratings");
  }

  temp_dir dir;
  const auto missing = mf::load_ratings(dir.path / "absent.dat");
  REQUIRE_FALSE(missing.has_value());
  CHECK(contains(missing.error().message, "absent.dat: missing"));
  const auto directory = mf::load_ratings(dir.path);
  REQUIRE_FALSE(directory.has_value());
  CHECK(contains(directory.error().message, "is a directory"));
  write_file(dir.path / "bad.dat", "1::10::4\n2::10::x\n");
  const auto bad = mf::load_ratings(dir.path / "bad.dat");
  REQUIRE_FALSE(bad.has_value());
  CHECK(contains(bad.error().message, (dir.path / "bad.dat").string() + ":2: "));
}

TEST_CASE("mf: the loader remaps sparse ids densely in order of first appearance") {
  const auto r = parse("1000000 7 1\n5 7 2\n1000000 18446744073709551615 3\n");
  REQUIRE(r.has_value());
  using t = std::tuple<std::uint32_t, std::uint32_t, float>;
  CHECK(as_tuples(r.value()) == std::vector<t>{{0, 0, 1.0f}, {1, 0, 2.0f}, {0, 1, 3.0f}});
  CHECK(r.value().users == 2);
  CHECK(r.value().items == 2);
}

// ---------------------------------------------------------------------------------------------
// Splits
// ---------------------------------------------------------------------------------------------

TEST_CASE("mf: split is deterministic, exact, disjoint and complete") {
  mf::synthetic_options o;
  o.users = 100;
  o.items = 80;
  o.count = 1001;
  const mf::ratings all = mf::make_synthetic(o);
  const auto [train, test] = mf::split(all, 0.2, 3);
  CHECK(test.size() == 200);  // llround(200.2)
  CHECK(train.size() == 801);
  CHECK(train.users == all.users);
  CHECK(test.items == all.items);

  // Same seed, same split; another seed, another split.
  CHECK(as_tuples(mf::split(all, 0.2, 3).test) == as_tuples(test));
  CHECK(as_tuples(mf::split(all, 0.2, 4).test) != as_tuples(test));

  // The parts partition the entries (which are distinct pairs).
  auto joined = as_tuples(train);
  const auto test_tuples = as_tuples(test);
  joined.insert(joined.end(), test_tuples.begin(), test_tuples.end());
  auto original = as_tuples(all);
  std::sort(joined.begin(), joined.end());
  std::sort(original.begin(), original.end());
  CHECK(joined == original);

  CHECK(mf::split(all, 0.0, 1).test.size() == 0);
  CHECK(mf::split(all, 1.0, 1).train.size() == 0);
  CHECK_THROWS_AS(mf::split(all, 1.5, 1), std::invalid_argument);
  CHECK_THROWS_AS(mf::split(all, -0.1, 1), std::invalid_argument);
  CHECK_THROWS_AS(mf::split(all, std::nan(""), 1), std::invalid_argument);
}

TEST_CASE("mf: take_shard splits the entries into contiguous balanced parts") {
  const mf::ratings all = tiny_ratings();
  std::vector<std::tuple<std::uint32_t, std::uint32_t, float>> joined;
  for (std::uint32_t s = 0; s < 3; ++s) {
    const mf::ratings part = mf::take_shard(all, s, 3);
    CHECK(part.users == all.users);
    CHECK(part.items == all.items);
    CHECK(part.size() >= 3);
    CHECK(part.size() <= 4);
    const auto t = as_tuples(part);
    joined.insert(joined.end(), t.begin(), t.end());
  }
  CHECK(joined == as_tuples(all));
  CHECK_THROWS_AS(mf::take_shard(all, 3, 3), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------------

TEST_CASE("mf: mf_model is an asyncps::model with the documented layout") {
  static_assert(asyncps::model<mf::mf_model>);
  const mf::mf_model m(tiny_ratings(), 3, 4, 0.1f, 1);
  const auto layout = m.tables();
  REQUIRE(layout.size() == 2);
  CHECK(layout[0] == asyncps::table_spec{mf::mf_model::user_table, 5, 3, 0.1f});
  CHECK(layout[1] == asyncps::table_spec{mf::mf_model::item_table, 4, 3, 0.1f});
  CHECK(m.rank() == 3);
  CHECK(m.batch_size() == 4);
  CHECK(m.touched_rows(0).empty());
  CHECK(m.last_penalty() == 0.0f);
}

TEST_CASE("mf: mf_model rejects impossible arguments") {
  CHECK_THROWS_AS(mf::mf_model(tiny_ratings(), 0, 4, 0.1f, 1), std::invalid_argument);
  CHECK_THROWS_AS(mf::mf_model(tiny_ratings(), 3, 0, 0.1f, 1), std::invalid_argument);
  CHECK_THROWS_AS(mf::mf_model(tiny_ratings(), 3, 4, -0.1f, 1), std::invalid_argument);
  CHECK_THROWS_AS(mf::mf_model(tiny_ratings(), 3, 4, 0.1f, 1, std::nanf("")),
                  std::invalid_argument);
  mf::ratings empty = tiny_ratings();
  empty.entries.clear();
  CHECK_THROWS_AS(mf::mf_model(empty, 3, 4, 0.1f, 1), std::invalid_argument);
  mf::ratings out_of_range = tiny_ratings();
  out_of_range.entries.push_back({5, 0, 1.0f});  // user 5 of 5
  CHECK_THROWS_AS(mf::mf_model(out_of_range, 3, 4, 0.1f, 1), std::invalid_argument);
}

TEST_CASE("mf: rmse of a known factorization") {
  // rank 1: L = [1, 2], R = [3, -1]; errors 0, -1, +1.
  const std::array<asyncps::table_spec, 2> layout{{{0, 2, 1, 0.0f}, {1, 2, 1, 0.0f}}};
  const std::vector<float> params{1.0f, 2.0f, 3.0f, -1.0f};
  const asyncps::parameter_view p(layout, params.data());
  mf::ratings data;
  data.users = 2;
  data.items = 2;
  data.entries = {{0, 0, 3.0f}, {1, 1, -1.0f}, {1, 0, 5.0f}};
  CHECK(mf::rmse(p, data) == doctest::Approx(std::sqrt(2.0 / 3.0)).epsilon(1e-12));
  data.entries.push_back({2, 0, 1.0f});  // user 2 is outside the 2-row table
  CHECK_THROWS_AS(mf::rmse(p, data), std::invalid_argument);
  data.entries.clear();
  CHECK(std::isnan(mf::rmse(p, data)));
}

// (c) the analytic gradient against central differences.
TEST_CASE("mf: the gradient matches central differences of mse + penalty") {
  const mf::ratings data = tiny_ratings();
  const float lambda = 0.3f;
  // batch_size == shard size: every call draws all 10 ratings (in some order), so every call
  // evaluates the same objective.
  mf::mf_model m(data, 3, static_cast<std::uint32_t>(data.size()), lambda, 5);
  const auto layout = m.tables();
  std::vector<float> params = random_parameters(layout, 0.8f, 11);
  const std::size_t n = params.size();
  std::vector<float> grad(n, std::nanf("")), scratch(n);
  asyncps::gradient_view g(layout, grad.data());
  asyncps::gradient_view s(layout, scratch.data());
  const asyncps::parameter_view p(layout, params.data());

  const float mse = m.compute_gradient(p, g);
  const float penalty = m.last_penalty();
  REQUIRE(std::all_of(grad.begin(), grad.end(), [](float v) { return std::isfinite(v); }));

  // The returned loss and penalty, recomputed independently.
  const auto left = p.table(0);
  const auto right = p.table(1);
  double squared = 0.0;
  for (const auto& e : data.entries) {
    const double err = left.row(e.user).dot(right.row(e.item)) - e.value;
    squared += err * err;
  }
  CHECK(mse == doctest::Approx(squared / static_cast<double>(data.size())).epsilon(1e-5));
  const double norms = left.topRows(4).squaredNorm() + right.topRows(3).squaredNorm();
  CHECK(penalty == doctest::Approx(0.5 * lambda * norms).epsilon(1e-5));
  CHECK(penalty > 0.0f);

  const auto objective = [&](std::size_t k, float value) {
    const float saved = params[k];
    params[k] = value;
    const float loss = m.compute_gradient(asyncps::parameter_view(layout, params.data()), s);
    const double total = static_cast<double>(loss) + static_cast<double>(m.last_penalty());
    params[k] = saved;
    return total;
  };
  const float eps = 1e-2f;
  int nonzero = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const double numeric =
        (objective(k, params[k] + eps) - objective(k, params[k] - eps)) / (2.0 * eps);
    const double analytic = grad[k];
    INFO("coordinate ", k, ": analytic ", analytic, ", numeric ", numeric);
    CHECK(std::abs(analytic - numeric) <=
          1e-2 * std::max(std::abs(analytic), std::abs(numeric)) + 1e-4);
    if (std::abs(analytic) > 1e-3) ++nonzero;
  }
  CHECK(nonzero >= 20);  // 7 touched rows x 3: the check above is not vacuous

  // User 4 and item 3 have no rating: exactly zero gradient.
  CHECK(g.table(0).row(4).isZero(0.0f));
  CHECK(g.table(1).row(3).isZero(0.0f));
}

// (e) rows outside the minibatch get exactly zero, on any buffer.
TEST_CASE("mf: rows a minibatch does not touch get exactly zero gradient") {
  mf::synthetic_options o;
  o.users = 120;
  o.items = 90;
  o.count = 3000;
  o.seed = 21;
  mf::mf_model m(mf::make_synthetic(o), 4, 8, 0.05f, 3);
  const auto layout = m.tables();
  const std::vector<float> params = random_parameters(layout, 0.5f, 4);
  const asyncps::parameter_view p(layout, params.data());
  std::vector<float> grad(params.size(), std::nanf(""));
  asyncps::gradient_view g(layout, grad.data());

  std::vector<asyncps::row_id> previous_users;
  for (int step = 0; step < 20; ++step) {
    // Odd steps reuse the buffer as the previous step left it; even steps get a NaN-filled one.
    if (step % 2 == 0) std::fill(grad.begin(), grad.end(), std::nanf(""));
    const float loss = m.compute_gradient(p, g);
    CHECK(std::isfinite(loss));
    int rows_checked_zero = 0;
    int untouched_nonzero = 0;
    for (asyncps::table_id t : {mf::mf_model::user_table, mf::mf_model::item_table}) {
      const auto touched = m.touched_rows(t);
      REQUIRE(!touched.empty());
      CHECK(touched.size() <= 8);
      CHECK(std::adjacent_find(touched.begin(), touched.end(), std::greater_equal<>()) ==
            touched.end());  // strictly ascending
      const auto table = g.table(t);
      for (Eigen::Index r = 0; r < table.rows(); ++r) {
        const bool is_touched =
            std::binary_search(touched.begin(), touched.end(), static_cast<asyncps::row_id>(r));
        if (is_touched) {
          CHECK(table.row(r).allFinite());
          CHECK_FALSE(table.row(r).isZero(0.0f));
        } else {
          // Exactly zero, including rows the previous step touched in this buffer.
          if (!table.row(r).isZero(0.0f)) ++untouched_nonzero;
          ++rows_checked_zero;
        }
      }
    }
    INFO("step ", step);
    CHECK(untouched_nonzero == 0);
    CHECK(rows_checked_zero >= 120 + 90 - 16);
    const auto users = m.touched_rows(mf::mf_model::user_table);
    if (step % 2 == 1) {
      // The previous step's rows that this step did not touch were cleared.
      for (const auto u : previous_users) {
        if (!std::binary_search(users.begin(), users.end(), u)) {
          CHECK(g.table(0).row(u).isZero(0.0f));
        }
      }
    }
    previous_users.assign(users.begin(), users.end());
  }
  CHECK(m.samples_seen() == 160);
  CHECK(m.touched_rows(2).empty());
}

// (d) plain SGD with the model's gradient fits a rank-5 problem down to the noise.
TEST_CASE("mf: minibatch SGD on the model's gradient reaches the noise level of a rank-5 problem") {
  mf::synthetic_options o;
  o.users = 300;
  o.items = 200;
  o.rank = 5;
  o.count = 15000;
  o.noise = 0.2f;
  o.user_exponent = 0.5;
  o.item_exponent = 0.8;
  o.seed = 2015;
  const auto [train, test] = mf::split(mf::make_synthetic(o), 0.1, 9);

  const std::uint32_t batch = 64;
  mf::mf_model m(train, 5, batch, 1e-3f, 17);
  const auto layout = m.tables();
  // The tables' documented initialisation: uniform in [-init_scale, init_scale].
  std::vector<float> params = random_parameters(layout, mf::mf_model::default_init_scale, 23);
  std::vector<float> grad(params.size());
  const asyncps::parameter_view p(layout, params.data());
  asyncps::gradient_view g(layout, grad.data());

  const double train_before = mf::rmse(p, train);
  const double test_before = mf::rmse(p, test);
  // Per-rating step ~ 0.05 (the gradient of the mean over the batch is scaled by 2 / batch).
  float lr = 0.025f * static_cast<float>(batch);
  while (m.epoch() < 40.0) {
    const double epoch_before = std::floor(m.epoch());
    const float loss = m.compute_gradient(p, g);
    REQUIRE(std::isfinite(loss));
    for (std::size_t k = 0; k < params.size(); ++k) params[k] -= lr * grad[k];
    if (std::floor(m.epoch()) > epoch_before) lr *= 0.93f;
  }
  const double train_after = mf::rmse(p, train);
  const double test_after = mf::rmse(p, test);
  INFO("train RMSE ", train_before, " -> ", train_after, "; test RMSE ", test_before, " -> ",
       test_after, "; noise ", o.noise);
  CHECK(train_before > 0.9);  // the true ratings have unit variance
  // Measured: train 0.194, test 0.238 (from 0.99 and 1.02).
  CHECK(train_after < 1.25 * o.noise);
  CHECK(test_after < 1.5 * o.noise);  // it generalises: the fit is the low-rank structure
}

// ---------------------------------------------------------------------------------------------
// Sparse pushes (asyncps::sparse_gradient_source): the worker sends only the touched rows; and
// sparse pulls (asyncps::sparse_read_source): it pulls, checks and subscribes to only the rows
// the next minibatch reads.

namespace {

// The same model with `touched_rows` and `rows_to_read` hidden: the worker pulls and pushes
// whole shards.
struct dense_mf {
  asyncps::examples::mf::mf_model m;
  std::span<const asyncps::table_spec> tables() const { return m.tables(); }
  float compute_gradient(const asyncps::parameter_view& p, asyncps::gradient_view& g) {
    return m.compute_gradient(p, g);
  }
};
// Sparse pushes, whole-shard pulls.
struct push_sparse_mf : dense_mf {
  std::span<const asyncps::row_id> touched_rows(asyncps::table_id t) const {
    return m.touched_rows(t);
  }
};
static_assert(asyncps::sparse_gradient_source<asyncps::examples::mf::mf_model>);
static_assert(asyncps::sparse_read_source<asyncps::examples::mf::mf_model>);
static_assert(!asyncps::sparse_gradient_source<dense_mf>);
static_assert(!asyncps::sparse_read_source<dense_mf>);
static_assert(asyncps::sparse_gradient_source<push_sparse_mf>);
static_assert(!asyncps::sparse_read_source<push_sparse_mf>);

struct mf_run {
  std::vector<std::vector<float>> values;  // [shard * 2 + table]
  std::uint64_t bytes_out = 0;
  std::uint64_t bytes_in = 0;
  std::uint64_t pushes = 0;
  std::uint64_t pulls = 0;
  std::uint64_t eager_messages = 0;
  asyncps::staleness_histogram staleness;
};

// 3 workers (worker 2 at half speed), 2 shards, 20 clocks of `Policy` on the simulated
// transport.
template <class Policy, class Model>
mf_run run_mf(std::vector<Model>& models) {
  using namespace asyncps;
  simulation_options so;
  so.seed = 9;
  so.compute.base = std::chrono::milliseconds(1);
  so.compute.speed_factor = {1.0, 1.0, 2.0};
  simulated_network net(so);
  const auto quiet = [](std::string_view) {};
  using server_t = basic_server<simulated_transport, Policy>;
  using worker_t = basic_worker<Model, simulated_transport, Policy>;
  std::vector<std::unique_ptr<simulated_transport>> ts;
  std::vector<std::unique_ptr<server_t>> servers;
  const std::span<const table_spec> layout = models[0].tables();
  for (std::uint32_t s = 0; s < 2; ++s) {
    ts.push_back(std::make_unique<simulated_transport>(net, "server" + std::to_string(s)));
    server_options o;
    o.shard = s;
    o.num_shards = 2;
    o.num_workers = static_cast<std::uint32_t>(models.size());
    o.tables.assign(layout.begin(), layout.end());
    o.log = quiet;
    servers.push_back(std::make_unique<server_t>(*ts.back(), o, optimizer::sgd{0.05f}));
    asio::co_spawn(net.get_executor(),
                   servers.back()->async_serve(ts.back()->listen("s" + std::to_string(s)).value()),
                   asio::detached);
  }
  std::vector<std::unique_ptr<worker_t>> ws;
  int done = 0;
  for (std::uint32_t w = 0; w < models.size(); ++w) {
    ts.push_back(std::make_unique<simulated_transport>(net, "worker" + std::to_string(w)));
    worker_options<std::string> o;
    o.id = w;
    o.servers = {"s0", "s1"};
    o.local_step = 0.05f;
    o.log = quiet;
    ws.push_back(std::make_unique<worker_t>(*ts.back(), models[w], o,
                                            asio::any_io_executor(net.compute_executor(w))));
    asio::co_spawn(
        net.get_executor(),
        [&, w]() -> asio::awaitable<void> {
          CHECK(!co_await ws[w]->async_run(20));
          ++done;
        },
        asio::detached);
  }
  net.run();
  REQUIRE(done == static_cast<int>(models.size()));
  asio::post(net.get_executor(), [&] {
    for (auto& s : servers) s->stop();
  });
  net.run();
  mf_run r;
  for (auto& s : servers)
    for (table_id t = 0; t < 2; ++t) {
      const auto v = s->values(t);
      r.values.emplace_back(v.begin(), v.end());
    }
  for (auto& w : ws) {
    r.bytes_out += w->stats().bytes_out;
    r.bytes_in += w->stats().bytes_in;
    r.pushes += w->stats().pushes;
    r.pulls += w->stats().pulls;
    r.eager_messages += w->stats().eager_messages;
    r.staleness += w->staleness();
  }
  return r;
}

mf::ratings small_problem() {
  mf::synthetic_options so;
  so.users = 400;
  so.items = 300;
  so.rank = 4;
  so.count = 6000;
  so.seed = 5;
  return mf::make_synthetic(so);
}

// Three workers' models of one kind, each over its shard of `all`.
template <class Model>
std::vector<Model> mf_workers(const mf::ratings& all) {
  std::vector<Model> models;
  for (std::uint32_t w = 0; w < 3; ++w) {
    mf::mf_model m(mf::take_shard(all, w, 3), 4, 20, 0.01f, 100 + w);
    if constexpr (std::is_same_v<Model, mf::mf_model>) {
      models.push_back(std::move(m));
    } else {
      models.push_back(Model{{std::move(m)}});
    }
  }
  return models;
}

}  // namespace

TEST_CASE("mf: sparse pulls and pushes send only the rows a minibatch reads and train exactly "
          "like dense ones (BSP)") {
  using namespace asyncps;
  const mf::ratings all = small_problem();
  auto sparse = mf_workers<mf::mf_model>(all);
  auto push_only = mf_workers<push_sparse_mf>(all);
  auto dense = mf_workers<dense_mf>(all);
  const mf_run a = run_mf<consistency::bsp>(sparse);
  const mf_run b = run_mf<consistency::bsp>(push_only);
  const mf_run c = run_mf<consistency::bsp>(dense);
  CHECK(a.pushes == c.pushes);
  CHECK(b.pushes == c.pushes);
  REQUIRE(a.values.size() == c.values.size());
  REQUIRE(b.values.size() == c.values.size());
  // Under BSP every read sees exactly the previous clock's model, so reading only the rows the
  // minibatch uses changes nothing: the servers end bit-identical.
  for (std::size_t i = 0; i < c.values.size(); ++i) {
    CHECK(a.values[i] == c.values[i]);
    CHECK(b.values[i] == c.values[i]);
  }
  CHECK(a.staleness.max() == 0);
  // 20 ratings touch at most 20 users and 20 items per clock, against 400 + 300 rows.
  MESSAGE("bytes out (pushes, pull keys): sparse " << a.bytes_out << ", push-sparse " << b.bytes_out
                                                   << ", dense " << c.bytes_out);
  MESSAGE("bytes in (rows): sparse " << a.bytes_in << ", push-sparse " << b.bytes_in << ", dense "
                                     << c.bytes_in);
  CHECK(b.bytes_out * 5 < c.bytes_out);
  CHECK(a.bytes_out * 4 < c.bytes_out);  // keyed pulls cost 4 bytes a row (padded to 16)
  CHECK(b.bytes_in == c.bytes_in);
  CHECK(a.bytes_in * 5 < c.bytes_in);
}

TEST_CASE_TEMPLATE("mf: sparse reads keep the staleness bound per row read and subscribe only "
                   "those rows",
                   Policy, asyncps::consistency::ssp<2>, asyncps::consistency::essp<2>) {
  using namespace asyncps;
  const mf::ratings all = small_problem();
  auto sparse = mf_workers<mf::mf_model>(all);
  auto push_only = mf_workers<push_sparse_mf>(all);
  const mf_run a = run_mf<Policy>(sparse);
  const mf_run b = run_mf<Policy>(push_only);
  MESSAGE("staleness: sparse reads " << a.staleness.to_string() << "; whole-shard reads "
                                     << b.staleness.to_string());
  MESSAGE("bytes in: sparse " << a.bytes_in << ", whole-shard " << b.bytes_in
                              << "; rows messages pushed by the servers: " << a.eager_messages
                              << " vs " << b.eager_messages);
  CHECK(a.staleness.max() <= 2);
  CHECK(b.staleness.max() <= 2);
  CHECK(a.staleness.total() > 0);
  if constexpr (Policy::eager) {
    // Eager rows carry only the subscribed rows that changed since the last ones sent: far
    // less than one whole shard of a table per message (the 400 x 4 and 300 x 4 floats of
    // the two tables are split over 2 shards: 2,800 bytes per shard and table on average).
    const std::uint64_t whole_shards = b.eager_messages * (400 + 300) * 4 * 4 / 4;
    CHECK(a.eager_messages > 0);
    CHECK(b.bytes_in * 2 < whole_shards);
    CHECK(a.bytes_in < b.bytes_in);
  } else {
    CHECK(a.bytes_in * 2 < b.bytes_in);
  }
  for (const auto& v : a.values)
    for (float x : v) REQUIRE(std::isfinite(x));
}
