// asyncps — observed-staleness histogram.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "asyncps/layout.hpp"

namespace asyncps {

/// Histogram of observed staleness in clocks. A worker's histogram (`basic_worker::staleness`)
/// has one sample per row read per clock: `worker clock - server clock of that row` (a row's
/// server clock m means it holds every update of clocks <= m - 1 of every worker; Bösen's
/// definition). A group link's (`basic_group_link::staleness`) has one sample per central push.
/// Bucket i counts staleness i for i < 31; bucket 31 counts staleness >= 31. Staleness 0 means
/// the row reflects every update from all earlier clocks.
struct staleness_histogram {
  static constexpr std::size_t buckets = 32;
  std::array<std::uint64_t, buckets> counts{};

  /// Adds `n` samples of `staleness` clocks (negative counts as 0).
  void record(clock_value staleness, std::uint64_t n = 1) noexcept {
    const auto s = staleness < 0 ? 0 : staleness;
    counts[s >= static_cast<clock_value>(buckets - 1) ? buckets - 1
                                                      : static_cast<std::size_t>(s)] += n;
  }
  std::uint64_t total() const noexcept {
    std::uint64_t n = 0;
    for (auto c : counts) n += c;
    return n;
  }
  /// Mean staleness in clocks (bucket 31 counted as 31). 0 when empty.
  double mean() const noexcept {
    std::uint64_t n = 0;
    double sum = 0;
    for (std::size_t i = 0; i < buckets; ++i) {
      n += counts[i];
      sum += static_cast<double>(i) * static_cast<double>(counts[i]);
    }
    return n == 0 ? 0.0 : sum / static_cast<double>(n);
  }
  /// Largest staleness observed (31 means >= 31); -1 when empty.
  int max() const noexcept {
    for (std::size_t i = buckets; i-- > 0;)
      if (counts[i] != 0) return static_cast<int>(i);
    return -1;
  }
  staleness_histogram& operator+=(const staleness_histogram& o) noexcept {
    for (std::size_t i = 0; i < buckets; ++i) counts[i] += o.counts[i];
    return *this;
  }
  /// "0:123 1:45 2:6" (non-empty buckets only).
  std::string to_string() const {
    std::string out;
    for (std::size_t i = 0; i < buckets; ++i) {
      if (counts[i] == 0) continue;
      if (!out.empty()) out += ' ';
      out += std::to_string(i) + (i == buckets - 1 ? "+:" : ":") + std::to_string(counts[i]);
    }
    return out;
  }
};

}  // namespace asyncps
