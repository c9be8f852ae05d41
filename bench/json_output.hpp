// Small helpers for the experiment drivers' JSON lines (nlohmann::json): numbers that may be
// NaN or infinite (a diverged run) become null instead of invalid JSON.
#pragma once

#include <cmath>

#include <nlohmann/json.hpp>

namespace asyncps::bench {

/// `x` as a JSON value: the number, or null for NaN and infinities.
inline nlohmann::json num(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json();
}

/// A JSON array of `num(f(x))` for `x` in `xs` (`f` returns something convertible to double).
template <class Range, class F>
nlohmann::json numbers(const Range& xs, F f) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& x : xs) a.push_back(num(static_cast<double>(f(x))));
  return a;
}

}  // namespace asyncps::bench
