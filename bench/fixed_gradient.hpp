// asyncps bench — the synthetic model of the worker-path benchmarks (asyncps_bench's worker
// rows, asyncps_scaling): one dense table whose gradient is a fixed buffer.
#pragma once

#include <array>
#include <chrono>
#include <cstring>
#include <span>
#include <thread>

#include "asyncps/model.hpp"
#include "asyncps/table.hpp"

namespace asyncps::bench {

/// Models `asyncps::model`: one dense table (`spec[0]`); the gradient is a fixed buffer
/// (`gradient`, `spec[0].rows * spec[0].width` floats, shared by every worker, outliving the
/// model), copied into the worker's gradient buffer: one memcpy of the table's bytes per clock,
/// as a real model writes its whole gradient. With `sleep` > 0 each gradient first sleeps that
/// long (compute time that holds no core). Thread safety: one worker per object.
struct fixed_gradient {
  std::array<table_spec, 1> spec{};
  std::span<const float> gradient;
  std::chrono::microseconds sleep{0};

  std::span<const table_spec> tables() const { return spec; }
  float compute_gradient(const parameter_view&, gradient_view& g) {
    if (sleep.count() > 0) std::this_thread::sleep_for(sleep);
    const auto out = g.span(0);
    std::memcpy(out.data(), gradient.data(), out.size_bytes());
    return 0.0f;
  }
};

}  // namespace asyncps::bench
