// The tutorial's model (examples 2-6): linear regression on generated data.
//
// y = x . w_true + noise, x ~ N(0, I) in `dim` dimensions. The parameters are one table of
// 1 row x `dim` floats (the weights w). Each worker owns `samples` samples of its own (drawn
// from its seed) and reads them in minibatches of `batch`, cyclically. The loss is the mean
// squared error / 2, so the gradient of a minibatch is X^T (X w - y) / batch.
#pragma once

#include <array>
#include <cstdint>
#include <random>
#include <span>

#include <Eigen/Core>

#include "asyncps/table.hpp"

namespace tutorial {

struct linear_regression {
  static constexpr std::uint32_t dim = 8, samples = 1024, batch = 32;
  static constexpr std::array<asyncps::table_spec, 1> layout{{{.id = 0, .rows = 1, .width = dim}}};
  /// The weights the data was generated from: -1, ..., 1.
  static Eigen::VectorXf true_weights() { return Eigen::VectorXf::LinSpaced(dim, -1.0f, 1.0f); }

  explicit linear_regression(unsigned seed) : x(samples, dim), y(samples) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal;
    for (float& v : x.reshaped()) v = normal(gen);
    y.noalias() = x * true_weights();
    for (float& v : y) v += 0.01f * normal(gen);
  }

  // --- the `asyncps::model` concept: a layout and a gradient ---
  std::span<const asyncps::table_spec> tables() const { return layout; }
  float compute_gradient(const asyncps::parameter_view& p, asyncps::gradient_view& g) {
    const auto xb = x.middleRows(next, batch);  // the next minibatch
    residual.noalias() = xb * p.table(0).transpose();
    residual -= y.segment(next, batch);
    g.table(0).noalias() = residual.transpose() * xb / float{batch};  // writes every value
    next = (next + batch) % samples;
    return 0.5f * residual.squaredNorm() / float{batch};
  }

  /// Distance of weights `w` (`dim` floats, e.g. a server's table 0) from the true weights.
  static float error(std::span<const float> w) {
    return (Eigen::Map<const Eigen::VectorXf>(w.data(), dim) - true_weights()).norm();
  }

  asyncps::row_matrix x;
  Eigen::VectorXf y, residual{batch};
  Eigen::Index next = 0;
};

}  // namespace tutorial
