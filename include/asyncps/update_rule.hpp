// asyncps — update rules: how much of the optimizer's step one push takes, given how many
// workers push and how stale the push is. An update rule scales the learning rate of each
// push; it is chosen at compile time with `optimizer::with_update_rule<Optimizer, Rule>`.
// Requirements table: docs/concepts/optimizer.md ("Update rules").
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>

#include "asyncps/layout.hpp"
#include "asyncps/optimizer.hpp"

namespace asyncps {

/// What the server knows about one push when it applies it. Every field is a function of the
/// shard's replicated state (the vector clock and the push), never of timing, so chain
/// backups and replica-log replays compute the same scale as the server that applied it first.
struct push_context {
  std::uint32_t worker = 0;      ///< the pushing worker's id
  std::uint32_t workers = 1;     ///< workers whose clocks count for the server clock (>= 1)
  clock_value clock = 0;         ///< the push's clock (the worker's clock)
  clock_value server_clock = 0;  ///< the shard's server clock (the minimum over `workers`)
  /// Updates of other workers newer than the push, already applied: the sum over the other
  /// workers v of max(0, clock_v - clock) (clocks). Each counts a push of clock >= this push's
  /// clock, which the pushing worker cannot have read. Under BSP it is exact (the k-th push of
  /// a clock has staleness k - 1); under SSP and ASP it is a lower bound (the worker may have
  /// read rows older than its clock). A straggler's push has a large staleness.
  std::uint64_t staleness = 0;
};

/// An update rule: `r.scale(ctx)` is the factor (>= 0, finite, typically <= 1) by which the
/// server multiplies the optimizer's learning rate for the push described by `ctx`. `R::name`
/// names it in logs and flags. Pure and deterministic: the same context gives the same scale
/// on every replica. Called on the server's strand, once per push; must not allocate.
template <class R>
concept update_rule_policy = std::copy_constructible<R> && requires(const R& r, push_context ctx) {
  { r.scale(ctx) } -> std::convertible_to<float>;
  { R::name } -> std::convertible_to<std::string_view>;
};

namespace update_rule {

/// Every push takes the optimizer's full step: W workers take W steps per clock (the
/// parameter-server default of Li et al., "Scaling Distributed Machine Learning with the
/// Parameter Server", OSDI 2014, and of SSP: Ho et al., NIPS 2013). The learning rate is per
/// push; with many workers it must be lowered by hand.
struct sum {
  static constexpr std::string_view name = "sum";
  float scale(const push_context&) const noexcept { return 1.0f; }
};

/// Each push takes 1/W of the step: the W pushes of a clock together take one step of the
/// mean gradient, as synchronous data parallelism does (one step of the global batch of W
/// minibatches; Dean et al., "Large Scale Distributed Deep Networks", NIPS 2012). The
/// learning rate is per global batch; W is the number of member workers when the push applies.
struct mean {
  static constexpr std::string_view name = "mean";
  float scale(const push_context& c) const noexcept {
    return 1.0f / static_cast<float>(std::max<std::uint32_t>(c.workers, 1));
  }
};

/// Staleness-aware scaling: a push's step is divided by its staleness, `1 / (1 + staleness)`
/// (Zhang, Gupta, Lian, Liu, "Staleness-aware Async-SGD for Distributed Deep Learning",
/// IJCAI 2016: alpha = alpha_0 / tau, where their tau counts the push's own update, so
/// tau = 1 + `push_context::staleness`). With W workers at equal speed the W pushes of a
/// clock take about H_W = 1 + 1/2 + ... + 1/W steps (2.1 at W = 4, 3.4 at W = 16); a
/// straggler's pushes, stale by many clocks of every other worker, take a small step.
struct staleness_aware {
  static constexpr std::string_view name = "staleness-aware";
  float scale(const push_context& c) const noexcept {
    return 1.0f / (1.0f + static_cast<float>(c.staleness));
  }
};

/// The linear-scaling rule with gradual warm-up (Goyal et al., "Accurate, Large Minibatch SGD:
/// Training ImageNet in 1 Hour", 2017): the learning rate is one worker's (per minibatch);
/// the global batch of W minibatches takes W times that rate, i.e. each push its full step
/// (as `sum`), reached linearly from one worker's rate for the global batch (each push 1/W,
/// as `mean`) over the first `warmup_clocks` server clocks (Goyal et al.: 5 epochs).
/// Optionally capped: `max_factor` > 0 limits the global rate to `max_factor` times one
/// worker's (each push min(1, max_factor / W)), for global batches past the rule's range.
struct linear_scaling {
  static constexpr std::string_view name = "linear-scaling";
  clock_value warmup_clocks = 0;  ///< server clocks of warm-up (0: none)
  float max_factor = 0;           ///< cap on the global rate in units of one worker's (0: none)
  float scale(const push_context& c) const noexcept {
    const float w = static_cast<float>(std::max<std::uint32_t>(c.workers, 1));
    float target = 1.0f;
    if (max_factor > 0) target = std::min(1.0f, max_factor / w);
    const float start = std::min(target, 1.0f / w);
    if (warmup_clocks <= 0 || c.server_clock >= warmup_clocks) return target;
    const float f = static_cast<float>(c.server_clock) / static_cast<float>(warmup_clocks);
    return start + (target - start) * f;
  }
};

/// One of the rules above, chosen at run time (for command lines and experiments; each rule
/// alone is a compile-time choice). Default: `sum`.
struct selectable {
  static constexpr std::string_view name = "selectable";
  enum class kind : std::uint8_t { sum, mean, staleness_aware, linear_scaling };
  kind which = kind::sum;
  update_rule::linear_scaling linear{};  ///< parameters of `kind::linear_scaling`
  float scale(const push_context& c) const noexcept {
    switch (which) {
      case kind::mean: return mean{}.scale(c);
      case kind::staleness_aware: return staleness_aware{}.scale(c);
      case kind::linear_scaling: return linear.scale(c);
      case kind::sum: break;
    }
    return 1.0f;
  }
  /// The name of the chosen rule ("sum", "mean", "staleness-aware", "linear-scaling").
  std::string_view chosen_name() const noexcept {
    switch (which) {
      case kind::mean: return mean::name;
      case kind::staleness_aware: return staleness_aware::name;
      case kind::linear_scaling: return linear_scaling::name;
      case kind::sum: break;
    }
    return sum::name;
  }
  /// Parses a rule name as `chosen_name` prints it; false (and nothing changed) for another.
  bool choose(std::string_view n) noexcept {
    if (n == sum::name)
      which = kind::sum;
    else if (n == mean::name)
      which = kind::mean;
    else if (n == staleness_aware::name)
      which = kind::staleness_aware;
    else if (n == linear_scaling::name)
      which = kind::linear_scaling;
    else
      return false;
    return true;
  }
};

static_assert(update_rule_policy<sum> && update_rule_policy<mean> &&
              update_rule_policy<staleness_aware> && update_rule_policy<linear_scaling> &&
              update_rule_policy<selectable>);

}  // namespace update_rule

namespace optimizer {

/// Optimizer `Inner` whose learning rate each push scales by `Rule::scale(push_context)`:
/// the server computes the push's context and applies it with a copy of `inner` whose
/// `learning_rate` is multiplied by the scale (so `Inner` needs a `float learning_rate`
/// member, as every shipped optimizer has). State, snapshots and replicas are `Inner`'s.
/// Example: `with_update_rule<sgd, update_rule::staleness_aware>{{.learning_rate = 0.1f}}`.
template <optimizer_policy Inner, update_rule_policy Rule>
struct with_update_rule {
  static_assert(
      requires(Inner o) { o.learning_rate *= 1.0f; },
      "asyncps::optimizer::with_update_rule: the optimizer needs a float member "
      "`learning_rate` that the update rule can scale");
  Inner inner{};
  Rule rule{};
  static constexpr std::size_t state_per_param = Inner::state_per_param;
  /// `inner`, its learning rate scaled for the push `ctx`.
  Inner for_push(const push_context& ctx) const noexcept {
    Inner o = inner;
    o.learning_rate *= static_cast<float>(rule.scale(ctx));
    return o;
  }
  /// `inner.apply` at the unscaled rate (the server calls `for_push(ctx).apply` instead).
  void apply(std::span<float> p, std::span<const float> g,
             const optimizer_state<state_per_param>& s, std::uint64_t step) const noexcept {
    inner.apply(p, g, s, step);
  }
  /// `inner`'s read-my-writes step; the server scales it by the rule for a fresh push.
  float local_step() const noexcept { return static_cast<float>(inner.local_step()); }
};

}  // namespace optimizer

/// The optimizer type that applies one push: `O`, or `Inner` for
/// `optimizer::with_update_rule<Inner, Rule>`.
template <class O>
struct push_optimizer_of {
  using type = O;
};
template <class Inner, class Rule>
struct push_optimizer_of<optimizer::with_update_rule<Inner, Rule>> {
  using type = Inner;
};
template <class O>
using push_optimizer_t = typename push_optimizer_of<O>::type;

/// Whether `O` is an `optimizer::with_update_rule` (its pushes are scaled by a rule).
template <class O>
inline constexpr bool has_update_rule_v = !std::same_as<push_optimizer_t<O>, O>;

}  // namespace asyncps
