// asyncps — the definitions of the optimizers' `apply` and `stays_finite`
// (optimizer/optimizers.hpp), Eigen array expressions over the rows of one chunk.
//
// Not a header to include on its own: optimizer/optimizers.hpp includes it (header-only, the
// default), or asyncps/src.hpp compiles it once (ASYNCPS_SEPARATE_COMPILATION defined;
// docs/build_time.md, "Separate compilation"), so that a translation unit that only declares
// them generates none of Eigen's kernels for them (about 80 MB of a g++ compile). It does not
// include that header back (no include cycle): whoever includes this file has included the
// header first.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#include <Eigen/Core>

#include "asyncps/detail/config.hpp"
#include "asyncps/optimizer.hpp"

namespace asyncps::optimizer {

namespace detail {
using vec_map = Eigen::Map<Eigen::ArrayXf>;
using cvec_map = Eigen::Map<const Eigen::ArrayXf>;
inline vec_map map(std::span<float> s) { return {s.data(), static_cast<Eigen::Index>(s.size())}; }
inline cvec_map cmap(std::span<const float> s) {
  return {s.data(), static_cast<Eigen::Index>(s.size())};
}
// Whether every coefficient of the expressions `e...` (of one size) is finite: x * 0 is 0 for
// finite x and NaN otherwise, and NaN survives the sum. One vectorised pass that evaluates each
// expression once and writes nothing.
template <class... E>
bool all_finite(const E&... e) noexcept {
  return std::isfinite(((e * 0.0f) + ...).sum());
}
}  // namespace detail

ASYNCPS_DECL void sgd::apply(std::span<float> p, std::span<const float> g,
                             const optimizer_state<0>&, std::uint64_t) const noexcept {
  detail::vec_map(p.data(), static_cast<Eigen::Index>(p.size())) -=
      learning_rate * detail::cvec_map(g.data(), static_cast<Eigen::Index>(g.size()));
}

ASYNCPS_DECL bool sgd::stays_finite(std::span<const float> p, std::span<const float> g,
                                    const optimizer_state<0>&, std::uint64_t) const noexcept {
  return detail::all_finite(detail::cmap(p) - learning_rate * detail::cmap(g));
}

ASYNCPS_DECL void momentum::apply(std::span<float> p, std::span<const float> g,
                                  const optimizer_state<1>& s, std::uint64_t) const noexcept {
  const auto n = p.size();
  auto v = detail::map(s[0]);
  v = momentum * v + detail::cvec_map(g.data(), static_cast<Eigen::Index>(n));
  detail::vec_map(p.data(), static_cast<Eigen::Index>(n)) -= learning_rate * v;
}

ASYNCPS_DECL bool momentum::stays_finite(std::span<const float> p, std::span<const float> g,
                                         const optimizer_state<1>& s,
                                         std::uint64_t) const noexcept {
  const auto v = momentum * detail::cmap(s[0]) + detail::cmap(g);
  return detail::all_finite(detail::cmap(p) - learning_rate * v, v);
}

ASYNCPS_DECL void adagrad::apply(std::span<float> p, std::span<const float> g,
                                 const optimizer_state<1>& s, std::uint64_t) const noexcept {
  const auto n = p.size();
  const detail::cvec_map gm(g.data(), static_cast<Eigen::Index>(n));
  auto a = detail::map(s[0]);
  a += gm.square();
  detail::vec_map(p.data(), static_cast<Eigen::Index>(n)) -=
      learning_rate * gm / (a.sqrt() + epsilon);
}

ASYNCPS_DECL bool adagrad::stays_finite(std::span<const float> p, std::span<const float> g,
                                        const optimizer_state<1>& s, std::uint64_t) const noexcept {
  const auto gm = detail::cmap(g);
  const auto a = detail::cmap(s[0]) + gm.square();
  return detail::all_finite(detail::cmap(p) - learning_rate * gm / (a.sqrt() + epsilon), a);
}

ASYNCPS_DECL void adam::apply(std::span<float> p, std::span<const float> g,
                              const optimizer_state<2>& s, std::uint64_t step) const noexcept {
  const auto n = p.size();
  const detail::cvec_map gm(g.data(), static_cast<Eigen::Index>(n));
  auto m = detail::map(s[0]);
  auto v = detail::map(s[1]);
  m = beta1 * m + (1.0f - beta1) * gm;
  v = beta2 * v + (1.0f - beta2) * gm.square();
  const auto t = static_cast<float>(step == 0 ? 1 : step);
  const float c1 = 1.0f - std::pow(beta1, t);
  const float c2 = 1.0f - std::pow(beta2, t);
  detail::vec_map(p.data(), static_cast<Eigen::Index>(n)) -=
      (learning_rate / c1) * m / ((v / c2).sqrt() + epsilon);
}

ASYNCPS_DECL bool adam::stays_finite(std::span<const float> p, std::span<const float> g,
                                     const optimizer_state<2>& s,
                                     std::uint64_t step) const noexcept {
  const auto gm = detail::cmap(g);
  const auto m = beta1 * detail::cmap(s[0]) + (1.0f - beta1) * gm;
  const auto v = beta2 * detail::cmap(s[1]) + (1.0f - beta2) * gm.square();
  const auto t = static_cast<float>(step == 0 ? 1 : step);
  const float c1 = 1.0f - std::pow(beta1, t);
  const float c2 = 1.0f - std::pow(beta2, t);
  return detail::all_finite(
      detail::cmap(p) - (learning_rate / c1) * m / ((v / c2).sqrt() + epsilon), m, v);
}

}  // namespace asyncps::optimizer
