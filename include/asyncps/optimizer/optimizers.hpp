// asyncps — server-side optimizers: SGD, momentum, AdaGrad, Adam.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "asyncps/detail/config.hpp"
#include "asyncps/optimizer.hpp"

namespace asyncps::optimizer {

// Each optimizer's optional `stays_finite(p, g, s, step)`: whether `apply(p, g, s, step)` would
// leave every value of `p` and of the state planes finite. It evaluates the same expressions as
// `apply`, in one read-only pass, and writes nothing. `shard_core::check_update` (a check without
// applying) calls it; a server's push path instead applies chunk by chunk and checks the result,
// undoing the push when it is not finite (`shard_core::check_and_apply`).

/// Plain SGD: p -= learning_rate * g (learning_rate in parameter units per gradient unit).
struct sgd {
  float learning_rate = 0.1f;
  static constexpr std::size_t state_per_param = 0;
  ASYNCPS_DECL void apply(std::span<float> p, std::span<const float> g, const optimizer_state<0>&,
                          std::uint64_t) const noexcept;
  ASYNCPS_DECL bool stays_finite(std::span<const float> p, std::span<const float> g,
                                 const optimizer_state<0>&, std::uint64_t) const noexcept;
  float local_step() const noexcept { return learning_rate; }
};

/// Heavy-ball momentum: v = momentum * v + g; p -= learning_rate * v.
struct momentum {
  float learning_rate = 0.05f;
  float momentum = 0.9f;
  static constexpr std::size_t state_per_param = 1;
  ASYNCPS_DECL void apply(std::span<float> p, std::span<const float> g, const optimizer_state<1>& s,
                          std::uint64_t) const noexcept;
  ASYNCPS_DECL bool stays_finite(std::span<const float> p, std::span<const float> g,
                                 const optimizer_state<1>& s, std::uint64_t) const noexcept;
  float local_step() const noexcept { return learning_rate; }
};

/// AdaGrad (Duchi et al. 2011; used by Downpour SGD): a += g^2; p -= lr * g / (sqrt(a) + eps).
struct adagrad {
  float learning_rate = 0.05f;
  float epsilon = 1e-8f;
  static constexpr std::size_t state_per_param = 1;
  ASYNCPS_DECL void apply(std::span<float> p, std::span<const float> g, const optimizer_state<1>& s,
                          std::uint64_t) const noexcept;
  ASYNCPS_DECL bool stays_finite(std::span<const float> p, std::span<const float> g,
                                 const optimizer_state<1>& s, std::uint64_t) const noexcept;
  float local_step() const noexcept { return 0.0f; }  // no cheap exact estimate
};

/// Adam (Kingma & Ba 2015) with bias correction; `step` is the table's update count.
struct adam {
  float learning_rate = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  static constexpr std::size_t state_per_param = 2;
  ASYNCPS_DECL void apply(std::span<float> p, std::span<const float> g, const optimizer_state<2>& s,
                          std::uint64_t step) const noexcept;
  ASYNCPS_DECL bool stays_finite(std::span<const float> p, std::span<const float> g,
                                 const optimizer_state<2>& s, std::uint64_t step) const noexcept;
  float local_step() const noexcept { return 0.0f; }
};

static_assert(optimizer_policy<sgd> && optimizer_policy<momentum> && optimizer_policy<adagrad> &&
              optimizer_policy<adam>);

}  // namespace asyncps::optimizer

#if !defined(ASYNCPS_SEPARATE_COMPILATION)
#include "asyncps/optimizer/impl/optimizers.ipp"
#endif
