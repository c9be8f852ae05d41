// Test model whose parameter values count pushes, so consistency bounds can be checked
// exactly: table 0 has one row per worker (width `width`); worker w's gradient is -1 on its
// own row and 0 elsewhere, so with SGD (learning rate 1) row w holds the number of w's pushes
// the reader has seen. Every read checks the SSP bound and read-my-writes. With
// `generated_before_read` set (single-threaded runs, e.g. the simulation), every read also
// measures how many of each other worker's computed updates it lacks (VAP's bound, in updates).
// `sparse_counter_model` reads a random subset of the rows each clock (sparse pulls) and checks
// the bounds on exactly those rows.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "asyncps/model.hpp"
#include "asyncps/table.hpp"

namespace asyncps::test {

struct counter_model {
  counter_model(std::uint32_t id, std::uint32_t workers, std::int64_t staleness,
                std::uint32_t width = 4, std::uint64_t seed = 1, int max_delay_us = 0)
      : id(id), workers(workers), staleness(staleness), rng(seed * 7919 + id),
        max_delay_us(max_delay_us) {
    spec[0] = asyncps::table_spec{0, workers, width, 0.0f};
  }

  std::span<const asyncps::table_spec> tables() const { return spec; }

  float compute_gradient(const asyncps::parameter_view& p, asyncps::gradient_view& g) {
    const auto t = p.table(0);
    const std::int64_t c = clock;
    for (std::uint32_t w = 0; w < workers; ++w) {
      // Sparse reads: only the rows read are checked (and the own row, always exact).
      if (read_set != nullptr && w != id &&
          !std::binary_search(read_set->begin(), read_set->end(), w))
        continue;
      const auto seen = static_cast<std::int64_t>(t(w, 0));
      if (w == id) {
        if (seen != c) ++own_write_violations;
      } else if (staleness >= 0 && seen < c - staleness) {
        ++bound_violations;
      }
      // Observed per-row lag (clocks of w's updates this reader has not seen, vs its own).
      const std::int64_t lag = c - seen;
      if (w != id && lag > max_lag) max_lag = lag;
      if (generated_before_read && w != id) {
        const std::int64_t missing = generated_before_read(id, w) - seen;
        if (missing > max_missing) max_missing = missing;
      }
    }
    auto gt = g.table(0);
    gt.setZero();
    gt.row(id).setConstant(-1.0f);
    ++clock;
    if (on_generated) on_generated(id);
    if (max_delay_us > 0) {
      std::uniform_int_distribution<int> d(0, max_delay_us);
      std::this_thread::sleep_for(std::chrono::microseconds(d(rng)));
    }
    return 0.0f;
  }

  std::uint32_t id;
  std::uint32_t workers;
  std::int64_t staleness;  // -1: unbounded (ASP)
  std::array<asyncps::table_spec, 1> spec{};
  std::mt19937_64 rng;
  int max_delay_us;
  std::int64_t clock = 0;
  std::int64_t bound_violations = 0;
  std::int64_t own_write_violations = 0;
  std::int64_t max_lag = 0;
  /// (reader, writer) -> updates the writer had computed when the reader took the snapshot
  /// it is reading now. Empty: not tracked.
  std::function<std::int64_t(std::uint32_t, std::uint32_t)> generated_before_read{};
  /// Called with this model's id each time it computes an update. May be empty.
  std::function<void(std::uint32_t)> on_generated{};
  /// Largest number of another worker's computed updates a read lacked.
  std::int64_t max_missing = 0;
  /// The rows this clock reads (sorted), or null: all of them.
  const std::vector<asyncps::row_id>* read_set = nullptr;
};

/// The counter model with sparse reads (`asyncps::sparse_read_source`): each clock it reads a
/// random subset of table 0's rows (each with probability 1/2, at least one), drawn from
/// `seed` and the id, and checks the bounds on exactly those rows.
struct sparse_counter_model : counter_model {
  sparse_counter_model(std::uint32_t id, std::uint32_t workers, std::int64_t staleness,
                       std::uint32_t width = 16, std::uint64_t seed = 1, int max_delay_us = 0)
      : counter_model(id, workers, staleness, width, seed, max_delay_us), pick(seed * 104729 + id) {
    reads.reserve(workers);
  }

  std::span<const asyncps::row_id> rows_to_read(asyncps::table_id) {
    if (!drawn) {
      reads.clear();
      while (reads.empty())
        for (asyncps::row_id r = 0; r < workers; ++r)
          if (pick() % 2 == 0) reads.push_back(r);
      drawn = true;
    }
    return reads;
  }

  float compute_gradient(const asyncps::parameter_view& p, asyncps::gradient_view& g) {
    (void)rows_to_read(0);
    drawn = false;
    read_set = &reads;
    return counter_model::compute_gradient(p, g);
  }

  std::mt19937_64 pick;
  std::vector<asyncps::row_id> reads;
  bool drawn = false;
};

}  // namespace asyncps::test
