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
}  // namespace detail

/// Plain SGD: p -= learning_rate * g (learning_rate in parameter units per gradient unit).
struct sgd {
  float learning_rate = 0.1f;
  static constexpr std::size_t state_per_param = 0;
  void apply(std::span<float> p, std::span<const float> g, const optimizer_state<0>&,
             std::uint64_t) const noexcept {
    detail::vec_map(p.data(), static_cast<Eigen::Index>(p.size())) -=
        learning_rate * detail::cvec_map(g.data(), static_cast<Eigen::Index>(g.size()));
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
  float local_step() const noexcept { return 0.0f; }
};

static_assert(optimizer_policy<sgd> && optimizer_policy<momentum> && optimizer_policy<adagrad> &&
              optimizer_policy<adam>);

}  // namespace asyncps::optimizer
