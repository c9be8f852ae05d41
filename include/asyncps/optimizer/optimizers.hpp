// asyncps — server-side optimizers: SGD, momentum, AdaGrad, Adam.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include <Eigen/Core>

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

// Each optimizer's optional `stays_finite(p, g, s, step)`: whether `apply(p, g, s, step)` would
// leave every value of `p` and of the state planes finite. It evaluates the same expressions as
// `apply`, in one read-only pass, and writes nothing. `shard_core::check_update` (a check without
// applying) calls it; a server's push path instead applies chunk by chunk and checks the result,
// undoing the push when it is not finite (`shard_core::check_and_apply`).

/// Plain SGD: p -= learning_rate * g (learning_rate in parameter units per gradient unit).
struct sgd {
  float learning_rate = 0.1f;
  static constexpr std::size_t state_per_param = 0;
  void apply(std::span<float> p, std::span<const float> g, const optimizer_state<0>&,
             std::uint64_t) const noexcept {
    detail::vec_map(p.data(), static_cast<Eigen::Index>(p.size())) -=
        learning_rate * detail::cvec_map(g.data(), static_cast<Eigen::Index>(g.size()));
  }
  bool stays_finite(std::span<const float> p, std::span<const float> g, const optimizer_state<0>&,
                    std::uint64_t) const noexcept {
    return detail::all_finite(detail::cmap(p) - learning_rate * detail::cmap(g));
  }
  float local_step() const noexcept { return learning_rate; }
};

/// Heavy-ball momentum: v = momentum * v + g; p -= learning_rate * v.
struct momentum {
  float learning_rate = 0.05f;
  float momentum = 0.9f;
  static constexpr std::size_t state_per_param = 1;
  void apply(std::span<float> p, std::span<const float> g, const optimizer_state<1>& s,
             std::uint64_t) const noexcept {
    const auto n = p.size();
    auto v = detail::map(s[0]);
    v = momentum * v + detail::cvec_map(g.data(), static_cast<Eigen::Index>(n));
    detail::vec_map(p.data(), static_cast<Eigen::Index>(n)) -= learning_rate * v;
  }
  bool stays_finite(std::span<const float> p, std::span<const float> g, const optimizer_state<1>& s,
                    std::uint64_t) const noexcept {
    const auto v = momentum * detail::cmap(s[0]) + detail::cmap(g);
    return detail::all_finite(detail::cmap(p) - learning_rate * v, v);
  }
  float local_step() const noexcept { return learning_rate; }
};

/// AdaGrad (Duchi et al. 2011; used by Downpour SGD): a += g^2; p -= lr * g / (sqrt(a) + eps).
struct adagrad {
  float learning_rate = 0.05f;
  float epsilon = 1e-8f;
  static constexpr std::size_t state_per_param = 1;
  void apply(std::span<float> p, std::span<const float> g, const optimizer_state<1>& s,
             std::uint64_t) const noexcept {
    const auto n = p.size();
    const detail::cvec_map gm(g.data(), static_cast<Eigen::Index>(n));
    auto a = detail::map(s[0]);
    a += gm.square();
    detail::vec_map(p.data(), static_cast<Eigen::Index>(n)) -=
        learning_rate * gm / (a.sqrt() + epsilon);
  }
  bool stays_finite(std::span<const float> p, std::span<const float> g, const optimizer_state<1>& s,
                    std::uint64_t) const noexcept {
    const auto gm = detail::cmap(g);
    const auto a = detail::cmap(s[0]) + gm.square();
    return detail::all_finite(detail::cmap(p) - learning_rate * gm / (a.sqrt() + epsilon), a);
  }
  float local_step() const noexcept { return 0.0f; }  // no cheap exact estimate
};

/// Adam (Kingma & Ba 2015) with bias correction; `step` is the table's update count.
struct adam {
  float learning_rate = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  static constexpr std::size_t state_per_param = 2;
  void apply(std::span<float> p, std::span<const float> g, const optimizer_state<2>& s,
             std::uint64_t step) const noexcept {
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
  bool stays_finite(std::span<const float> p, std::span<const float> g, const optimizer_state<2>& s,
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
  float local_step() const noexcept { return 0.0f; }
};

static_assert(optimizer_policy<sgd> && optimizer_policy<momentum> && optimizer_policy<adagrad> &&
              optimizer_policy<adam>);

}  // namespace asyncps::optimizer
