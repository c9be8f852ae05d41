// mf — a matrix-factorization workload for asyncps: rating data (a synthetic Netflix-like
// generator and a MovieLens loader), train/test and per-worker splits, and `mf_model`, an
// `asyncps::model` that learns user and item factors by minibatch SGD on squared error.
//
// This is the MF setup of Dai, Kumar, Wei, Ho, Gibson and Xing, "High-Performance Distributed
// ML at Scale through Parameter Server Consistency Models" (AAAI 2015): Netflix
// (480k users x 18k items, 100M ratings), factors held in two parameter-server tables, each
// worker drawing minibatches of 1% or 10% of its data per clock. A minibatch touches few rows
// of two large tables, which is the case sparse (row-set) pulls and pushes are for: see
// `mf_model::rows_to_read` and `mf_model::touched_rows`.
//
// Errors from the loader are `load_result<T>`: a Boost.Outcome `std_result` whose error is a
// `load_error` (the code `asyncps::errc::bad_file` plus a message "<file>:<line>: <what>"):
//
//   auto r = asyncps::examples::mf::load_ratings("ml-1m/ratings.dat");
//   if (!r) { std::cerr << r.error().message << '\n'; return 1; }
//   auto [train, test] = asyncps::examples::mf::split(r.value(), 0.1, 42);
//
// Determinism: every random choice here (synthetic data, splits, minibatch order) is drawn from
// `std::mt19937_64` with this file's own distribution code, never the standard library's
// distributions or `std::shuffle`, whose algorithms are implementation-defined; results are
// therefore the same with every standard library (up to the last-bit rounding of `std::log`,
// `std::cos` and `std::pow`, which the synthetic generator uses).
#pragma once

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <istream>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <boost/outcome/std_result.hpp>

#include "asyncps/error.hpp"
#include "asyncps/model.hpp"
#include "asyncps/table.hpp"

#include "../common/load_result.hpp"

namespace asyncps::examples::mf {

// ---------------------------------------------------------------------------------------------
// Rating data
// ---------------------------------------------------------------------------------------------

/// One observed rating: user `user` gave item `item` the value `value`.
struct rating {
  std::uint32_t user = 0;  ///< dense user index in [0, ratings::users)
  std::uint32_t item = 0;  ///< dense item index in [0, ratings::items)
  float value = 0.0f;      ///< the rating (MovieLens: stars 0.5-5; synthetic: unitless, ~N(0, 1))
};

/// A sparse `users x items` rating matrix, as a list of entries.
/// Invariant (as produced by this file's functions): every entry has `user < users` and
/// `item < items`. `users` and `items` are the dimensions of the whole data set, also in a
/// train/test split or a worker's shard, so that every worker builds the same table layout;
/// some users or items may therefore have no entry.
struct ratings {
  std::uint32_t users = 0;      ///< number of rows of the rating matrix
  std::uint32_t items = 0;      ///< number of columns of the rating matrix
  std::vector<rating> entries;  ///< the observed entries, in no particular order

  /// Number of entries. Complexity: O(1).
  std::size_t size() const noexcept { return entries.size(); }
};

namespace detail {

/// splitmix64: a well-mixed 64-bit value from `x` (used to derive seeds).
constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// A double uniform in [0, 1) from the top 53 bits of one draw.
inline double uniform01(std::mt19937_64& rng) noexcept {
  return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);  // 2^-53
}

/// An integer uniform in [0, n), unbiased (rejects the draws below 2^64 mod n).
/// Precondition: `n > 0`.
inline std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t n) noexcept {
  const std::uint64_t threshold = (0 - n) % n;  // 2^64 mod n
  for (;;) {
    const std::uint64_t r = rng();
    if (r >= threshold) return r % n;
  }
}

/// A standard normal draw (Box-Muller; one value per call).
inline double standard_normal(std::mt19937_64& rng) noexcept {
  const double u1 = 1.0 - uniform01(rng);  // (0, 1]: the log is finite
  const double u2 = uniform01(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

/// Fisher-Yates shuffle of `values` (the same permutation on every standard library).
template <class T>
void shuffle(std::span<T> values, std::mt19937_64& rng) noexcept {
  for (std::size_t i = values.size(); i > 1; --i) {
    const auto j = static_cast<std::size_t>(uniform_below(rng, i));
    std::swap(values[i - 1], values[j]);
  }
}

/// Samples ranks k in [0, n) with probability proportional to (k + 1)^-exponent (a truncated
/// Zipf law; exponent 0 is uniform). Construction O(n), sampling O(log n).
class zipf_sampler {
 public:
  zipf_sampler(std::uint32_t n, double exponent) : cdf_(n) {
    double sum = 0.0;
    for (std::uint32_t k = 0; k < n; ++k) {
      sum += std::pow(static_cast<double>(k) + 1.0, -exponent);
      cdf_[k] = sum;
    }
  }

  std::uint32_t operator()(std::mt19937_64& rng) const noexcept {
    const double u = uniform01(rng) * cdf_.back();
    const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
    const auto k = static_cast<std::size_t>(it - cdf_.begin());
    return static_cast<std::uint32_t>(std::min(k, cdf_.size() - 1));
  }

 private:
  std::vector<double> cdf_;
};

/// `ids[k]` = the id given rank k: a random permutation of [0, n).
inline std::vector<std::uint32_t> random_permutation(std::uint32_t n, std::mt19937_64& rng) {
  std::vector<std::uint32_t> ids(n);
  for (std::uint32_t k = 0; k < n; ++k) ids[k] = k;
  shuffle(std::span<std::uint32_t>(ids), rng);
  return ids;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Synthetic Netflix-like data
// ---------------------------------------------------------------------------------------------

/// Parameters of `make_synthetic`.
struct synthetic_options {
  std::uint32_t users = 1000;  ///< rows of the rating matrix (> 0)
  std::uint32_t items = 500;   ///< columns of the rating matrix (> 0)
  std::uint32_t rank = 5;      ///< rank of the true factorization (> 0)
  std::size_t count = 20000;   ///< number of distinct (user, item) entries (<= users * items)
  float noise = 0.1f;          ///< standard deviation of the Gaussian noise (>= 0)
  double user_exponent = 0.5;  ///< Zipf exponent of user activity (>= 0; 0 = uniform)
  double item_exponent = 1.0;  ///< Zipf exponent of item popularity (>= 0; 0 = uniform)
  std::uint64_t seed = 1;      ///< everything is a function of the options, seed included
};

/// A synthetic, Netflix-like rating matrix with a known low-rank truth.
///
/// Draws true factors L (users x rank) and R (items x rank) with i.i.d. N(0, rank^-1/2)
/// entries, so that each true rating L_u . R_i has variance 1; then draws `count` distinct
/// (user, item) pairs, the user with probability proportional to (k_u + 1)^-user_exponent and
/// the item with probability proportional to (k_i + 1)^-item_exponent, where k_u and k_i are
/// ranks given to users and items by random permutations (so popular ids are scattered, not
/// 0, 1, 2, ...); each entry's value is L_u . R_i + N(0, noise^2). A repeated pair is
/// redrawn. Users or items that were never drawn have no entry. Entries are in draw order.
///
/// Preconditions: as documented on each `synthetic_options` member.
/// Errors: throws `std::invalid_argument` if an option is out of range, or if `count` distinct
/// pairs were not found in 64 * count + 2^20 draws (the skew concentrates too much mass on too
/// few pairs: lower `count` or the exponents); `std::bad_alloc`.
/// Complexity: O((users + items) * rank + count) expected time and memory.
/// Thread safety: reentrant. Determinism: see the file comment.
inline ratings make_synthetic(const synthetic_options& o) {
  if (o.users == 0 || o.items == 0 || o.rank == 0) {
    throw std::invalid_argument("mf::make_synthetic: users, items and rank must be > 0");
  }
  if (o.count > std::uint64_t{o.users} * std::uint64_t{o.items}) {
    throw std::invalid_argument("mf::make_synthetic: count exceeds users * items");
  }
  if (!std::isfinite(o.noise) || o.noise < 0.0f) {
    throw std::invalid_argument("mf::make_synthetic: noise must be finite and >= 0");
  }
  if (!std::isfinite(o.user_exponent) || o.user_exponent < 0.0 || !std::isfinite(o.item_exponent) ||
      o.item_exponent < 0.0) {
    throw std::invalid_argument("mf::make_synthetic: exponents must be finite and >= 0");
  }

  std::mt19937_64 rng(detail::splitmix64(o.seed));
  const double factor_sd = std::pow(static_cast<double>(o.rank), -0.25);
  row_matrix left(o.users, o.rank);
  row_matrix right(o.items, o.rank);
  for (Eigen::Index k = 0; k < left.size(); ++k) {
    left.data()[k] = static_cast<float>(factor_sd * detail::standard_normal(rng));
  }
  for (Eigen::Index k = 0; k < right.size(); ++k) {
    right.data()[k] = static_cast<float>(factor_sd * detail::standard_normal(rng));
  }
  const std::vector<std::uint32_t> user_of_rank = detail::random_permutation(o.users, rng);
  const std::vector<std::uint32_t> item_of_rank = detail::random_permutation(o.items, rng);
  const detail::zipf_sampler user_rank(o.users, o.user_exponent);
  const detail::zipf_sampler item_rank(o.items, o.item_exponent);

  ratings out;
  out.users = o.users;
  out.items = o.items;
  out.entries.reserve(o.count);
  std::unordered_set<std::uint64_t> seen;
  seen.reserve(o.count);
  const std::uint64_t max_draws = 64 * std::uint64_t{o.count} + (std::uint64_t{1} << 20);
  for (std::uint64_t draws = 0; out.entries.size() < o.count; ++draws) {
    if (draws == max_draws) {
      throw std::invalid_argument("mf::make_synthetic: could not draw " + std::to_string(o.count) +
                                  " distinct pairs; lower count or the exponents");
    }
    const std::uint32_t u = user_of_rank[user_rank(rng)];
    const std::uint32_t i = item_of_rank[item_rank(rng)];
    if (!seen.insert((std::uint64_t{u} << 32) | i).second) continue;
    const float truth = left.row(u).dot(right.row(i));
    const auto noise = static_cast<float>(o.noise * detail::standard_normal(rng));
    out.entries.push_back({u, i, truth + noise});
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Loading MovieLens-style text files
// ---------------------------------------------------------------------------------------------

// `load_error`, `load_result` and their ADL hooks live in examples/common/load_result.hpp.
using asyncps::examples::load_error;
using asyncps::examples::load_result;
using asyncps::examples::make_error_code;
using asyncps::examples::outcome_throw_as_system_error_with_payload;

namespace detail {

inline load_error source_error(std::string_view source, std::size_t line, const std::string& what) {
  std::string message(source);
  if (line > 0) message += ":" + std::to_string(line);
  message += ": " + what;
  return {make_error_code(errc::bad_file), std::move(message)};
}

/// `token` quoted for an error message, cut to 40 characters.
inline std::string quoted(std::string_view token) {
  constexpr std::size_t max_chars = 40;
  if (token.size() <= max_chars) return "'" + std::string(token) + "'";
  return "'" + std::string(token.substr(0, max_chars)) + "...'";
}

/// The separator a line uses between its fields.
enum class separator { none, whitespace, comma, double_colon };

inline bool is_blank(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\v' || c == '\f' || c == '\r';
}

/// The first fields of one line and how they are separated.
struct split_line {
  std::array<std::string_view, 3> fields{};  ///< the first min(count, 3) fields
  std::size_t count = 0;                     ///< number of fields on the line
  separator sep = separator::none;           ///< none when count <= 1
};

/// Splits `line` (not blank) into fields separated by "::", by ',' (either with optional blanks
/// around it) or by a run of blanks; the same separator throughout. Returns an empty string on
/// success, else what is wrong.
inline std::string split_fields(std::string_view line, split_line& out) {
  out = split_line{};
  const std::size_t n = line.size();
  std::size_t pos = 0;
  const auto skip_blanks = [&] {
    while (pos < n && is_blank(line[pos])) ++pos;
  };
  skip_blanks();
  for (;;) {
    const std::size_t start = pos;
    while (pos < n && !is_blank(line[pos]) && line[pos] != ',' && line[pos] != ':') ++pos;
    if (pos == start) return "field " + std::to_string(out.count + 1) + " is empty";
    if (out.count < out.fields.size()) out.fields[out.count] = line.substr(start, pos - start);
    ++out.count;
    skip_blanks();
    if (pos == n) return {};
    separator here = separator::whitespace;
    if (line[pos] == ',') {
      here = separator::comma;
      ++pos;
    } else if (line.substr(pos, 2) == "::") {
      here = separator::double_colon;
      pos += 2;
    } else if (line[pos] == ':') {
      return "a single ':' after field " + std::to_string(out.count) +
             " (fields are separated by blanks, ',' or '::')";
    }
    if (out.sep == separator::none) {
      out.sep = here;
    } else if (out.sep != here) {
      return "mixed separators";
    }
    skip_blanks();
    if (pos == n) return "a separator ends the line";
  }
}

inline bool parse_id(std::string_view token, std::uint64_t& out) noexcept {
  const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), out);
  return ec == std::errc{} && end == token.data() + token.size();
}

inline bool parse_value(std::string_view token, float& out) noexcept {
  const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), out);
  return ec == std::errc{} && end == token.data() + token.size() && std::isfinite(out);
}

/// Maps sparse external ids to dense indices 0..n-1 in order of first appearance.
class id_map {
 public:
  /// The dense index of `id`, adding it if new; false if a new id would exceed 2^32 - 1 ids.
  bool lookup(std::uint64_t id, std::uint32_t& dense) {
    const auto [it, added] = map_.try_emplace(id, static_cast<std::uint32_t>(map_.size()));
    if (added && map_.size() > std::numeric_limits<std::uint32_t>::max()) {
      map_.erase(it);
      return false;
    }
    dense = it->second;
    return true;
  }
  std::uint32_t size() const noexcept { return static_cast<std::uint32_t>(map_.size()); }

 private:
  std::unordered_map<std::uint64_t, std::uint32_t> map_;
};

}  // namespace detail

/// Parses MovieLens-style ratings from `in`; `source` names the input in error messages.
///
/// Format: one rating per line, `user item rating [more fields...]`, fields separated by "::"
/// (ml-1m, ml-10m `ratings.dat`), by ',' (ml-latest `ratings.csv`) or by blanks (ml-100k
/// `u.data` is tab separated); one separator kind per file; fields after the third (e.g. a
/// timestamp) are ignored; "\r\n" line ends are accepted. `user` and `item` are non-negative
/// decimal integers < 2^64, remapped to dense indices 0..n-1 in order of first appearance;
/// `rating` is a finite decimal float. Blank lines and lines whose first non-blank character is
/// '#' are skipped, and so is a header: the first other line if it holds no digit (e.g.
/// "userId,movieId,rating,timestamp"). Repeated (user, item) pairs are kept as they are.
///
/// Errors (`load_error`, code `asyncps::errc::bad_file`, message "<source>:<line>: <what>"
/// with the 1-based line number): a line with fewer than 3 fields, an empty field, a single ':',
/// a separator kind other than the file's, an id that is not a non-negative integer, a rating
/// that is not a finite float; "<source>: ..." for a read error or an input with no rating.
/// Exceptions: `std::bad_alloc` only (and what `in` throws if its exceptions are enabled).
/// Complexity: O(bytes) expected time; memory O(entries + distinct ids).
/// Thread safety: reentrant (distinct streams).
inline load_result<ratings> parse_ratings(std::istream& in, std::string_view source) {
  ratings out;
  detail::id_map users;
  detail::id_map items;
  detail::split_line fields;
  detail::separator file_sep = detail::separator::none;
  bool header_allowed = true;
  std::string line;
  std::size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const std::string_view text(line);
    const auto first = std::find_if_not(text.begin(), text.end(), detail::is_blank);
    if (first == text.end() || *first == '#') continue;
    if (std::exchange(header_allowed, false) &&
        std::none_of(first, text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    if (auto what = detail::split_fields(text, fields); !what.empty()) {
      return detail::source_error(source, line_no, what);
    }
    if (fields.count < 3) {
      return detail::source_error(source, line_no,
                                  "expected at least 3 fields (user item rating), found " +
                                      std::to_string(fields.count));
    }
    if (file_sep == detail::separator::none) {
      file_sep = fields.sep;
    } else if (fields.sep != file_sep) {
      return detail::source_error(source, line_no, "separator differs from the earlier lines'");
    }
    std::uint64_t user_id = 0;
    std::uint64_t item_id = 0;
    float value = 0.0f;
    if (!detail::parse_id(fields.fields[0], user_id)) {
      return detail::source_error(source, line_no,
                                  "field 1 (user id) " + detail::quoted(fields.fields[0]) +
                                      " is not a non-negative integer");
    }
    if (!detail::parse_id(fields.fields[1], item_id)) {
      return detail::source_error(source, line_no,
                                  "field 2 (item id) " + detail::quoted(fields.fields[1]) +
                                      " is not a non-negative integer");
    }
    if (!detail::parse_value(fields.fields[2], value)) {
      return detail::source_error(source, line_no,
                                  "field 3 (rating) " + detail::quoted(fields.fields[2]) +
                                      " is not a finite number");
    }
    rating r{0, 0, value};
    if (!users.lookup(user_id, r.user) || !items.lookup(item_id, r.item)) {
      return detail::source_error(source, line_no, "more than 2^32 - 1 distinct ids");
    }
    out.entries.push_back(r);
  }
  if (in.bad()) {
    return detail::source_error(source, 0, "read error after line " + std::to_string(line_no));
  }
  if (out.entries.empty()) return detail::source_error(source, 0, "no ratings");
  out.users = users.size();
  out.items = items.size();
  return out;
}

/// Reads the ratings file `file`: `parse_ratings` on its contents, with the path as `source`.
/// Errors: as `parse_ratings`, plus "<file>: missing", "<file>: is a directory",
/// "<file>: cannot be accessed (<reason>)" and "<file>: cannot be opened (<reason>)".
/// Exceptions: `std::bad_alloc` only. Thread safety: reentrant.
inline load_result<ratings> load_ratings(const std::filesystem::path& file) {
  const std::string name = file.string();
  std::error_code ec;
  const auto status = std::filesystem::status(file, ec);
  if (status.type() == std::filesystem::file_type::not_found) {
    return detail::source_error(name, 0, "missing");
  }
  if (ec) return detail::source_error(name, 0, "cannot be accessed (" + ec.message() + ")");
  if (std::filesystem::is_directory(status)) {
    return detail::source_error(name, 0, "is a directory");
  }
  std::ifstream in(file, std::ios::binary);
  if (!in.is_open()) {
    return detail::source_error(
        name, 0, "cannot be opened (" + std::generic_category().message(errno) + ")");
  }
  return parse_ratings(in, name);
}

// ---------------------------------------------------------------------------------------------
// Splits
// ---------------------------------------------------------------------------------------------

/// A train/test split of one `ratings`.
struct train_test {
  ratings train;  ///< the entries not chosen for `test`
  ratings test;   ///< round(test_fraction * size) entries chosen at random
};

/// Splits `all` at random into train and test: exactly `llround(test_fraction * all.size())`
/// entries go to `test`, the rest to `train`; each part keeps the entries' original order and
/// `all`'s `users` and `items`. The same (all, test_fraction, seed) always gives the same split.
/// Errors: throws `std::invalid_argument` unless `0 <= test_fraction <= 1`; `std::bad_alloc`.
/// Complexity: O(all.size()). Thread safety: reentrant.
inline train_test split(const ratings& all, double test_fraction, std::uint64_t seed) {
  if (!(test_fraction >= 0.0 && test_fraction <= 1.0)) {
    throw std::invalid_argument("mf::split: test_fraction must be in [0, 1]");
  }
  const std::size_t n = all.size();
  const auto test_count = std::min<std::size_t>(
      n, static_cast<std::size_t>(std::llround(test_fraction * static_cast<double>(n))));
  // A partial Fisher-Yates shuffle picks the test indices.
  std::vector<std::size_t> order(n);
  for (std::size_t k = 0; k < n; ++k) order[k] = k;
  std::mt19937_64 rng(detail::splitmix64(seed ^ 0x5D1B5EEDull));
  for (std::size_t k = 0; k < test_count; ++k) {
    const auto j = k + static_cast<std::size_t>(detail::uniform_below(rng, n - k));
    std::swap(order[k], order[j]);
  }
  std::vector<bool> in_test(n, false);
  for (std::size_t k = 0; k < test_count; ++k) in_test[order[k]] = true;

  train_test out;
  out.train.users = out.test.users = all.users;
  out.train.items = out.test.items = all.items;
  out.train.entries.reserve(n - test_count);
  out.test.entries.reserve(test_count);
  for (std::size_t k = 0; k < n; ++k) {
    (in_test[k] ? out.test : out.train).entries.push_back(all.entries[k]);
  }
  return out;
}

/// Worker `shard`'s part of `all` when split `num_shards` ways: the contiguous entries
/// `asyncps::shard_range(all.size(), shard, num_shards)`, with `all`'s `users` and `items`.
/// (A loaded MovieLens file is sorted by user, so contiguous shards then hold mostly disjoint
/// users; `split`'s output keeps that order.)
/// Errors: throws `std::invalid_argument` unless `shard < num_shards` and
/// `all.size() < 2^32`; `std::bad_alloc`.
/// Complexity: O(size of the shard). Thread safety: reentrant.
inline ratings take_shard(const ratings& all, std::uint32_t shard, std::uint32_t num_shards) {
  if (num_shards == 0 || shard >= num_shards) {
    throw std::invalid_argument("mf::take_shard: need shard < num_shards");
  }
  if (all.size() > std::numeric_limits<std::uint32_t>::max()) {
    throw std::invalid_argument("mf::take_shard: more than 2^32 - 1 entries");
  }
  const key_range range = shard_range(static_cast<std::uint32_t>(all.size()), shard, num_shards);
  ratings out;
  out.users = all.users;
  out.items = all.items;
  out.entries.assign(all.entries.begin() + range.begin, all.entries.begin() + range.end);
  return out;
}

// ---------------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------------

/// Matrix factorization R ~ L R^T by minibatch SGD, one object per worker.
///
/// Layout: table 0 (`user_table`) is users x rank (row u = L_u), table 1 (`item_table`) is
/// items x rank (row i = R_i), both initialised uniformly in [-init_scale, init_scale].
/// Loss of a minibatch B (drawn from the worker's own ratings), with U and I the sets of
/// distinct users and items in B:
///
///   mse(B)     = (1/|B|) sum_{(u,i,r) in B} (L_u . R_i - r)^2
///   penalty(B) = (lambda / 2) (sum_{u in U} |L_u|^2 + sum_{i in I} |R_i|^2)
///
/// `compute_gradient` writes the gradient of mse + penalty (non-zero only in the rows of U and
/// I) and returns mse; `last_penalty()` is the penalty of the same minibatch.
/// The minibatch sampler visits the worker's ratings in a fresh random order every epoch;
/// batches run across epoch boundaries, so every batch has exactly `batch_size` entries.
/// Thread safety: distinct objects are independent; one object is used by one thread at a time.
class mf_model {
 public:
  /// The user factor table L.
  static constexpr table_id user_table = 0;
  /// The item factor table R.
  static constexpr table_id item_table = 1;
  /// The default `init_scale`.
  static constexpr float default_init_scale = 0.1f;

  /// A worker's model over `train` (its own shard: see `take_shard`), with factors of width
  /// `rank`, `batch_size` ratings per step, L2 coefficient `lambda`, and minibatch order drawn
  /// from a `std::mt19937_64` seeded from `seed` (give each worker its own seed).
  /// `train.users` and `train.items` size the tables: they must be the whole data set's, the
  /// same on every worker.
  /// Errors: throws `std::invalid_argument` unless `train` has at least one entry,
  /// `train.users > 0`, `train.items > 0`, every entry's indices are in range, `rank > 0`,
  /// `batch_size > 0`, `lambda` is finite and >= 0, `init_scale` is finite and >= 0, and
  /// `train.size() < 2^32`; `std::bad_alloc`.
  /// Complexity: O(train.size() + batch_size) time and memory.
  mf_model(ratings train, std::uint32_t rank, std::uint32_t batch_size, float lambda,
           std::uint64_t seed, float init_scale = default_init_scale)
      : tables_{{{user_table, train.users, rank, init_scale},
                 {item_table, train.items, rank, init_scale}}},
        train_(std::move(train)), batch_size_(batch_size), lambda_(lambda),
        rng_(detail::splitmix64(seed)) {
    if (train_.entries.empty()) throw std::invalid_argument("mf::mf_model: no training ratings");
    if (train_.users == 0 || train_.items == 0) {
      throw std::invalid_argument("mf::mf_model: users and items must be > 0");
    }
    if (train_.size() > std::numeric_limits<std::uint32_t>::max()) {
      throw std::invalid_argument("mf::mf_model: more than 2^32 - 1 training ratings");
    }
    if (rank == 0) throw std::invalid_argument("mf::mf_model: rank must be > 0");
    if (batch_size == 0) throw std::invalid_argument("mf::mf_model: batch_size must be > 0");
    if (!std::isfinite(lambda) || lambda < 0.0f) {
      throw std::invalid_argument("mf::mf_model: lambda must be finite and >= 0");
    }
    if (!std::isfinite(init_scale) || init_scale < 0.0f) {
      throw std::invalid_argument("mf::mf_model: init_scale must be finite and >= 0");
    }
    for (const rating& r : train_.entries) {
      if (r.user >= train_.users || r.item >= train_.items) {
        throw std::invalid_argument("mf::mf_model: a rating's user or item is out of range");
      }
    }
    order_.resize(train_.size());
    for (std::uint32_t k = 0; k < order_.size(); ++k) order_[k] = k;
    detail::shuffle(std::span<std::uint32_t>(order_), rng_);
    batch_.reserve(batch_size);
    touched_[user_table].reserve(batch_size);
    touched_[item_table].reserve(batch_size);
  }

  /// The parameter layout (see the class comment). Valid while the model lives.
  std::span<const table_spec> tables() const noexcept { return tables_; }

  /// Draws the next minibatch (or takes the one `rows_to_read` drew) and writes into every
  /// value of `g` the gradient, at `p`, of the minibatch's mse + penalty (see the class
  /// comment): in row u of table 0,
  /// (2/|B|) sum_{(u,i,r) in B} e R_i + lambda L_u, with e = L_u . R_i - r, and symmetrically in
  /// table 1; zero in every row the minibatch does not touch. Returns mse (squared rating
  /// units; the penalty is `last_penalty()`).
  /// The whole of `g` is written (the worker's gradient buffer is pooled and not zeroed, and
  /// may be a different block on each call), so this is O(size of the tables) for the zeroing
  /// alone; a sparse push can send only `touched_rows()`.
  /// Preconditions: `p` and `g` have the layout `tables()`.
  /// Allocation: none. Complexity: O((users + items) * rank + batch_size * (rank + log
  /// batch_size)).
  float compute_gradient(const parameter_view& p, gradient_view& g) noexcept {
    const auto left = p.table(user_table);
    const auto right = p.table(item_table);
    auto grad_left = g.table(user_table);
    auto grad_right = g.table(item_table);
    grad_left.setZero();
    grad_right.setZero();

    if (!drawn_) next_batch();
    drawn_ = false;
    const float scale = 2.0f / static_cast<float>(batch_size_);
    double squared = 0.0;
    for (const std::uint32_t k : batch_) {
      const rating& r = train_.entries[k];
      const float e = left.row(r.user).dot(right.row(r.item)) - r.value;
      squared += static_cast<double>(e) * static_cast<double>(e);
      grad_left.row(r.user) += (scale * e) * right.row(r.item);
      grad_right.row(r.item) += (scale * e) * left.row(r.user);
    }
    double norms = 0.0;
    for (const row_id u : touched_[user_table]) {
      norms += static_cast<double>(left.row(u).squaredNorm());
      grad_left.row(u) += lambda_ * left.row(u);
    }
    for (const row_id i : touched_[item_table]) {
      norms += static_cast<double>(right.row(i).squaredNorm());
      grad_right.row(i) += lambda_ * right.row(i);
    }
    last_penalty_ = static_cast<float>(0.5 * static_cast<double>(lambda_) * norms);
    return static_cast<float>(squared / static_cast<double>(batch_size_));
  }

  /// The rows of table `t` that the last `compute_gradient` touched (users for `user_table`,
  /// items for `item_table`), sorted ascending, without repeats; empty before the first call
  /// and for any other `t`. Every other row of the last gradient is zero. Valid until the next
  /// `compute_gradient` or `rows_to_read`. Complexity: O(1).
  std::span<const row_id> touched_rows(table_id t) const noexcept {
    if (t >= touched_.size()) return {};
    return touched_[t];
  }

  /// The rows of table `t` the next `compute_gradient` reads (and touches): draws the next
  /// minibatch if it is not drawn yet, so the worker can pull only those rows
  /// (`asyncps::sparse_read_source`). The minibatch sequence is the same whether or not this
  /// is called. Sorted ascending, without repeats; empty for any `t` other than the two
  /// tables. Valid until the next `compute_gradient`.
  /// Allocation: none. Complexity: O(batch_size log batch_size) for the first call after a
  /// `compute_gradient`, O(1) after that.
  std::span<const row_id> rows_to_read(table_id t) noexcept {
    if (!drawn_) {
      next_batch();
      drawn_ = true;
    }
    return touched_rows(t);
  }

  /// The penalty (lambda / 2)(sum |L_u|^2 + sum |R_i|^2) over the rows the last
  /// `compute_gradient` touched, at the parameters it was given; 0 before the first call.
  /// `compute_gradient`'s return value plus this is the objective its gradient is of.
  float last_penalty() const noexcept { return last_penalty_; }

  /// The factor width.
  std::uint32_t rank() const noexcept { return tables_[user_table].width; }
  /// Ratings per minibatch.
  std::uint32_t batch_size() const noexcept { return batch_size_; }
  /// This worker's training ratings.
  const ratings& train() const noexcept { return train_; }
  /// Ratings drawn so far by this object.
  std::uint64_t samples_seen() const noexcept { return seen_; }
  /// Passes over this object's ratings so far (fractional).
  double epoch() const noexcept {
    return static_cast<double>(seen_) / static_cast<double>(order_.size());
  }

 private:
  /// Fills `batch_` with the next `batch_size_` entry indices and `touched_` with their
  /// distinct users and items.
  void next_batch() noexcept {
    batch_.clear();
    auto& users = touched_[user_table];
    auto& items = touched_[item_table];
    users.clear();
    items.clear();
    for (std::uint32_t b = 0; b < batch_size_; ++b) {
      if (cursor_ == order_.size()) {
        detail::shuffle(std::span<std::uint32_t>(order_), rng_);
        cursor_ = 0;
      }
      const std::uint32_t k = order_[cursor_++];
      batch_.push_back(k);
      users.push_back(train_.entries[k].user);
      items.push_back(train_.entries[k].item);
    }
    seen_ += batch_size_;
    for (auto* rows : {&users, &items}) {
      std::sort(rows->begin(), rows->end());
      rows->erase(std::unique(rows->begin(), rows->end()), rows->end());
    }
  }

  std::array<table_spec, 2> tables_;
  ratings train_;
  std::uint32_t batch_size_;
  float lambda_;
  std::mt19937_64 rng_;
  std::vector<std::uint32_t> order_;  // a permutation of the entry indices
  std::size_t cursor_ = 0;            // next position in order_
  std::uint64_t seen_ = 0;
  std::vector<std::uint32_t> batch_;            // entry indices of the last minibatch
  std::array<std::vector<row_id>, 2> touched_;  // sorted distinct rows per table
  bool drawn_ = false;                          // batch_ is the next minibatch, not the last
  float last_penalty_ = 0.0f;
};

static_assert(model<mf_model>);
static_assert(sparse_gradient_source<mf_model> && sparse_read_source<mf_model>);

/// Root-mean-square error of the factorization in `p` on `data`, in rating units:
/// sqrt(mean over entries of (L_u . R_i - value)^2), where L = `p.table(mf_model::user_table)`
/// and R = `p.table(mf_model::item_table)` (as `mf_model` lays them out).
/// Returns NaN if `data` is empty.
/// Errors: throws `std::invalid_argument` if `p` has fewer than 2 tables, tables of different
/// widths, or fewer rows than an entry's user or item index needs.
/// Complexity: O(size * rank); allocates nothing. Thread safety: reentrant.
inline double rmse(const parameter_view& p, const ratings& data) {
  const auto layout = p.tables();
  if (layout.size() < 2 ||
      layout[mf_model::user_table].width != layout[mf_model::item_table].width) {
    throw std::invalid_argument("mf::rmse: parameters do not have an mf_model layout");
  }
  const auto left = p.table(mf_model::user_table);
  const auto right = p.table(mf_model::item_table);
  double squared = 0.0;
  for (const rating& r : data.entries) {
    if (r.user >= layout[mf_model::user_table].rows ||
        r.item >= layout[mf_model::item_table].rows) {
      throw std::invalid_argument("mf::rmse: a rating's user or item is outside the tables");
    }
    const double e =
        static_cast<double>(left.row(r.user).dot(right.row(r.item))) - static_cast<double>(r.value);
    squared += e * e;
  }
  if (data.entries.empty()) return std::numeric_limits<double>::quiet_NaN();
  return std::sqrt(squared / static_cast<double>(data.size()));
}

}  // namespace asyncps::examples::mf
