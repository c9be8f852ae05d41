// fashion_mnist — `any_model`, one worker's model chosen at run time, and `load_data`. Defined
// in any_model.cpp, the only translation unit that compiles the models' Eigen kernels
// (models.hpp); this header is light, so the train_*.cpp that instantiate basic_worker with it
// do not compile them again.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "asyncps/model.hpp"
#include "config.hpp"
#include "dataset.hpp"

namespace fashion {

using clock_type = std::chrono::steady_clock;

/// One worker's model: softmax regression, the MLP or the CNN (models.hpp), chosen at run time.
class any_model {
 public:
  /// Worker `shard` of `shards`: draws minibatches from its contiguous part of `train`, which
  /// must outlive the model.
  any_model(const config& c, const fashion::dataset& train, std::uint32_t shard,
            std::uint32_t shards);
  any_model(any_model&&) noexcept;
  any_model& operator=(any_model&&) noexcept;
  ~any_model();
  /// Whether worker `w` is the straggler --slow-worker/--slow-factor inject.
  static bool is_slow(const config& c, std::uint32_t w) {
    return c.slow_factor > 1 && c.slow_worker == w;
  }
  std::span<const asyncps::table_spec> tables() const;
  // Learning-rate step schedule, applied as gradient scaling so it works with every server
  // optimizer and keeps read-my-writes exact: after `decay_at` epochs of this worker's shard,
  // gradients are multiplied by `decay_factor`.
  // A straggler (--slow-worker) also sleeps (factor - 1) x the time the gradient took, on
  // its own compute thread (run() gives it one), so it is slower without slowing the others.
  float compute_gradient(const asyncps::parameter_view& p, asyncps::gradient_view& g);
  /// Passes over this worker's shard so far.
  double epoch() const;
  /// Accuracy and loss of `p` on `t`.
  evaluation evaluate(const asyncps::parameter_view& p, const fashion::dataset& t) const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// The layout of the model `c` selects into `layout`, and Fashion-MNIST from `c.data` into
/// `train` and `test` (10,000): for `--role all` the whole training set (60,000 images), for
/// `--role worker` only the part worker `c.worker_id` of `c.workers` trains on
/// (`dataset::first`), for `--role server|master` nothing. On a missing or bad file prints the
/// error (it names the file) and returns false. Defined in any_model.cpp.
bool load_data(const config& c, fashion::dataset& train, fashion::dataset& test,
               std::vector<asyncps::table_spec>& layout);

}  // namespace fashion
