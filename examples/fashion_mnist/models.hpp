// fashion — three `asyncps::model`s for Fashion-MNIST: softmax regression, a one-hidden-layer
// ReLU network and a small convolutional network, each trained with minibatch gradients of the
// mean cross-entropy.
//
// One model object is one worker's: it owns an index permutation of its contiguous shard of the
// training set and its own generator, and draws `batch_size` examples per `compute_gradient`.
// Everything a step touches is allocated in the constructor; a step allocates nothing.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include <Eigen/Core>

#include "asyncps/model.hpp"
#include "asyncps/table.hpp"
#include "dataset.hpp"

namespace fashion {

namespace detail {

/// Draws minibatches from one worker's shard: a contiguous slice of the training set, visited
/// in a fresh random order each epoch. Batches run across epoch boundaries, so every batch
/// has exactly `batch_size` examples.
class minibatch_sampler {
 public:
  minibatch_sampler(const dataset& train, std::uint32_t shard, std::uint32_t num_shards,
                    std::uint32_t batch_size, std::uint64_t seed)
      : train_(&train), batch_size_(batch_size) {
    if (num_shards == 0 || shard >= num_shards) {
      throw std::invalid_argument("fashion model: need shard < num_shards");
    }
    if (batch_size == 0) throw std::invalid_argument("fashion model: batch_size must be > 0");
    if (train.size() > std::numeric_limits<std::uint32_t>::max() ||
        train.images.rows() != static_cast<Eigen::Index>(train.size()) ||
        train.images.cols() != static_cast<Eigen::Index>(image_pixels)) {
      throw std::invalid_argument("fashion model: training set is not n x 784 with n labels");
    }
    if (std::any_of(train.labels.begin(), train.labels.end(),
                    [](std::uint8_t y) { return y >= num_classes; })) {
      throw std::invalid_argument("fashion model: a training label is >= 10");
    }
    // The shard is a range of the whole file's examples; `train` may hold only a part of the
    // file (`dataset::first`), which must cover the shard.
    const auto range =
        asyncps::shard_range(static_cast<std::uint32_t>(train.file_size()), shard, num_shards);
    if (range.empty()) throw std::invalid_argument("fashion model: the shard is empty");
    if (range.begin < train.first || range.end > train.first + train.size())
      throw std::invalid_argument("fashion model: the training data loaded does not hold the "
                                  "worker's shard");
    order_.resize(range.size());
    for (std::uint32_t i = 0; i < range.size(); ++i)
      order_[i] = static_cast<std::uint32_t>(range.begin - train.first + i);
    // splitmix64 of (seed, shard): distinct, well-mixed streams per worker.
    std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (std::uint64_t{shard} + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    rng_.seed(z ^ (z >> 31));
    std::shuffle(order_.begin(), order_.end(), rng_);
  }

  /// Copies the next `batch_size` examples into `x` (batch_size x 784) and `labels`.
  void next(asyncps::row_matrix& x, std::vector<std::uint8_t>& labels) noexcept {
    for (std::uint32_t i = 0; i < batch_size_; ++i) {
      if (cursor_ == order_.size()) {
        std::shuffle(order_.begin(), order_.end(), rng_);
        cursor_ = 0;
      }
      const std::uint32_t k = order_[cursor_++];
      x.row(i) = train_->images.row(k);
      labels[i] = train_->labels[k];
    }
    seen_ += batch_size_;
  }

  std::uint64_t samples_seen() const noexcept { return seen_; }
  double epoch() const noexcept {
    return static_cast<double>(seen_) / static_cast<double>(order_.size());
  }
  std::uint32_t batch_size() const noexcept { return batch_size_; }

 private:
  const dataset* train_;
  std::uint32_t batch_size_;
  std::vector<std::uint32_t> order_;
  std::size_t cursor_ = 0;
  std::mt19937_64 rng_;
  std::uint64_t seen_ = 0;
};

/// Floats one Eigen GEMM may pack on the stack: its packed lhs panel (kc x mc) and rhs panel
/// (kc x nc) each go to the heap when larger than EIGEN_STACK_ALLOCATION_LIMIT bytes.
inline constexpr Eigen::Index max_stack_panel =
    std::max<Eigen::Index>(EIGEN_STACK_ALLOCATION_LIMIT / sizeof(float), 64 * 64);
/// The largest depth of one sub-product of `product_into`.
inline constexpr Eigen::Index max_product_depth = 128;

/// `dst = lhs * rhs` without heap allocation: Eigen's GEMM packs panels of up to
/// depth x rows and depth x cols, which go to the heap above 128 KiB (e.g. 784 x 64 floats), so
/// the product is computed as a sum, over depth slices of at most `max_product_depth`, of
/// sub-products on tiles of `dst` small enough that both panels stay on the stack.
/// Preconditions: shapes agree; `dst` does not alias `lhs` or `rhs`.
/// Complexity: that of the product, plus one extra read-modify-write of `dst` per depth slice.
template <class Dst, class Lhs, class Rhs>
void product_into(Dst&& dst, const Lhs& lhs, const Rhs& rhs) noexcept {
  const Eigen::Index rows = lhs.rows();
  const Eigen::Index cols = rhs.cols();
  const Eigen::Index depth = lhs.cols();
  const Eigen::Index slices =
      std::max<Eigen::Index>(1, (depth + max_product_depth - 1) / max_product_depth);
  const Eigen::Index step = std::max<Eigen::Index>(1, (depth + slices - 1) / slices);
  const Eigen::Index side = std::max<Eigen::Index>(1, max_stack_panel / step);
  for (Eigen::Index i = 0; i < rows; i += side) {
    const Eigen::Index mi = std::min(side, rows - i);
    for (Eigen::Index j = 0; j < cols; j += side) {
      const Eigen::Index nj = std::min(side, cols - j);
      auto tile = dst.block(i, j, mi, nj);
      if (depth == 0) tile.setZero();
      for (Eigen::Index k = 0; k < depth; k += step) {
        const Eigen::Index dk = std::min(step, depth - k);
        if (k == 0) {
          tile.noalias() = lhs.block(i, k, mi, dk) * rhs.block(k, j, dk, nj);
        } else {
          tile.noalias() += lhs.block(i, k, mi, dk) * rhs.block(k, j, dk, nj);
        }
      }
    }
  }
}

/// Turns logits `z` (m x 10) in place into `scale * (softmax(z) - onehot(labels))`, the
/// gradient of `scale * sum_i cross_entropy_i` with respect to `z`, and returns that sum of
/// cross-entropies (nats, unscaled). Numerically stable (subtracts each row's maximum).
/// When `correct` is non-null, adds the number of rows whose arg-max is the label.
inline double softmax_cross_entropy(Eigen::Ref<asyncps::row_matrix> z, const std::uint8_t* labels,
                                    float scale, std::size_t* correct = nullptr) noexcept {
  double loss = 0.0;
  for (Eigen::Index i = 0; i < z.rows(); ++i) {
    auto row = z.row(i);
    Eigen::Index arg_max = 0;
    const float max = row.maxCoeff(&arg_max);
    const Eigen::Index y = labels[i];
    if (correct != nullptr && arg_max == y) ++*correct;
    const float shifted_y = row(y) - max;
    row.array() = (row.array() - max).exp();
    const float sum = row.sum();
    loss += static_cast<double>(std::log(sum) - shifted_y);
    row *= scale / sum;
    row(y) -= scale;
  }
  return loss;
}

/// im2col of a 5 x 5 "valid" convolution (stride 1) over `m` images of `side` x `side` pixels
/// and `channels` channels, stored NHWC (pixel (y, x) of image b, channel c at
/// `in[((b * side + y) * side + x) * channels + c]`). Writes one row per output position
/// (b, oy, ox), in that order, of 25 * channels values at columns (ky * 5 + kx) * channels + c;
/// consecutive rows are `row_stride` (>= 25 * channels) floats apart, and the columns past
/// 25 * channels are left untouched. Complexity: O(m * (side - 4)^2 * 25 * channels).
inline void im2col5(const float* in, Eigen::Index m, Eigen::Index side, Eigen::Index channels,
                    float* cols, Eigen::Index row_stride) noexcept {
  const Eigen::Index out = side - 4;
  const Eigen::Index run = 5 * channels;  // one kernel row: 5 pixels x all channels
  for (Eigen::Index b = 0; b < m; ++b) {
    for (Eigen::Index oy = 0; oy < out; ++oy) {
      for (Eigen::Index ox = 0; ox < out; ++ox) {
        float* dst = cols + ((b * out + oy) * out + ox) * row_stride;
        for (Eigen::Index ky = 0; ky < 5; ++ky)
          std::copy_n(in + ((b * side + oy + ky) * side + ox) * channels, run, dst + ky * run);
      }
    }
  }
}

/// The adjoint of `im2col5`: sets `in` (NHWC, m x side x side x channels) to zero, then adds
/// every value of `cols` (laid out as `im2col5` writes it) to the input value it was copied from.
/// Complexity: O(m * (side - 4)^2 * 25 * channels).
inline void col2im5(const float* cols, Eigen::Index row_stride, Eigen::Index m, Eigen::Index side,
                    Eigen::Index channels, float* in) noexcept {
  const Eigen::Index out = side - 4;
  const Eigen::Index run = 5 * channels;
  std::fill_n(in, m * side * side * channels, 0.0f);
  for (Eigen::Index b = 0; b < m; ++b) {
    for (Eigen::Index oy = 0; oy < out; ++oy) {
      for (Eigen::Index ox = 0; ox < out; ++ox) {
        const float* src = cols + ((b * out + oy) * out + ox) * row_stride;
        for (Eigen::Index ky = 0; ky < 5; ++ky) {
          float* dst = in + ((b * side + oy + ky) * side + ox) * channels;
          const float* s = src + ky * run;
          for (Eigen::Index k = 0; k < run; ++k) dst[k] += s[k];
        }
      }
    }
  }
}

/// ReLU then 2 x 2 max pooling (stride 2) of pre-activations `a`: m images of `side` x `side`
/// (even) positions and `channels` channels, NHWC. Output position (py, px), channel c of image
/// b goes to `out[b * out_stride + (py * side / 2 + px) * channels + c]` (= max(0, the window's
/// maximum)), and the index into `a` of the window's maximum to `arg[(b * (side / 2)^2 + py *
/// side / 2 + px) * channels + c]`. Complexity: O(m * side^2 * channels).
inline void relu_max_pool(const float* a, Eigen::Index m, Eigen::Index side, Eigen::Index channels,
                          float* out, Eigen::Index out_stride, std::uint32_t* arg) noexcept {
  const Eigen::Index half = side / 2;
  for (Eigen::Index b = 0; b < m; ++b) {
    for (Eigen::Index py = 0; py < half; ++py) {
      for (Eigen::Index px = 0; px < half; ++px) {
        const Eigen::Index base = ((b * side + 2 * py) * side + 2 * px) * channels;
        const Eigen::Index pos = py * half + px;
        float* o = out + b * out_stride + pos * channels;
        std::uint32_t* g = arg + (b * half * half + pos) * channels;
        const std::array<Eigen::Index, 4> window{base, base + channels, base + side * channels,
                                                 base + (side + 1) * channels};
        for (Eigen::Index c = 0; c < channels; ++c) {
          Eigen::Index best = window[0] + c;
          for (int k = 1; k < 4; ++k) {
            if (a[window[k] + c] > a[best]) best = window[k] + c;
          }
          o[c] = std::max(a[best], 0.0f);
          g[c] = static_cast<std::uint32_t>(best);
        }
      }
    }
  }
}

/// The adjoint of `relu_max_pool` (arguments as there): sets `d_a` to
/// the gradient with respect to the pre-activations given `d_out`, the gradient with respect to
/// the pooled outputs `out` (same layout as `out`): each pooled value's gradient goes to its
/// window's maximum when that value is positive; every other value of `d_a` is zero. (`a` itself
/// is not read, so `d_a` may reuse its storage.) Complexity: O(m * side^2 * channels).
inline void relu_max_pool_backward(const float* out, const float* d_out, Eigen::Index m,
                                   Eigen::Index side, Eigen::Index channels,
                                   Eigen::Index out_stride, const std::uint32_t* arg,
                                   float* d_a) noexcept {
  const Eigen::Index positions = (side / 2) * (side / 2) * channels;
  std::fill_n(d_a, m * side * side * channels, 0.0f);
  for (Eigen::Index b = 0; b < m; ++b) {
    const float* o = out + b * out_stride;
    const float* d = d_out + b * out_stride;
    const std::uint32_t* g = arg + b * positions;
    for (Eigen::Index k = 0; k < positions; ++k) {
      if (o[k] > 0.0f) d_a[g[k]] = d[k];
    }
  }
}

/// Evaluates `forward(x, logits)` (which fills `logits`, m x 10, from images `x`, m x 784)
/// over `test` in chunks of `chunk_rows`.
template <class Forward>
evaluation evaluate_chunks(const dataset& test, std::size_t chunk_rows, Forward&& forward) {
  if (test.size() == 0) return {};
  chunk_rows = std::clamp<std::size_t>(chunk_rows, 1, test.size());
  asyncps::row_matrix logits(static_cast<Eigen::Index>(chunk_rows),
                             static_cast<Eigen::Index>(num_classes));
  double loss = 0.0;
  std::size_t correct = 0;
  for (std::size_t begin = 0; begin < test.size(); begin += chunk_rows) {
    const auto m = static_cast<Eigen::Index>(std::min(chunk_rows, test.size() - begin));
    auto z = logits.topRows(m);
    forward(test.images.middleRows(static_cast<Eigen::Index>(begin), m), z);
    loss += softmax_cross_entropy(z, test.labels.data() + begin, 1.0f, &correct);
  }
  const auto n = static_cast<double>(test.size());
  return {static_cast<double>(correct) / n, loss / n};
}

}  // namespace detail

/// Multinomial logistic regression: p(y | x) = softmax(W x + b), W 10 x 784, b 10.
///
/// Layout: table 0 is 10 rows x 785 (row c = [W_c | b_c]), initialised to zeros.
/// Loss per minibatch: mean cross-entropy + (l2 / 2) * ||W||^2 (biases not regularised).
/// Object lifetimes: the training set passed to the constructor must outlive the model.
/// Thread safety: distinct objects are independent; one object is used by one thread at a time.
class softmax_model {
 public:
  /// The only table.
  static constexpr asyncps::table_id weights_table = 0;

  /// A worker's model over shard `shard` of `num_shards` (a balanced contiguous split of
  /// `train`, as `asyncps::shard_range`), drawing `batch_size` examples per step, shuffling its
  /// shard each epoch with a `std::mt19937_64` seeded from (seed, shard); `l2` >= 0 is the
  /// weight-decay coefficient.
  /// Errors: throws `std::invalid_argument` unless `shard < num_shards`, `batch_size > 0`,
  /// `train` is n x 784 with n labels, all < 10, and the shard is non-empty; `std::bad_alloc`.
  /// Complexity: O(shard size + batch_size * 784) time and memory.
  softmax_model(const dataset& train, std::uint32_t shard, std::uint32_t num_shards,
                std::uint32_t batch_size, std::uint64_t seed, float l2 = 0.0f)
      : sampler_(train, shard, num_shards, batch_size, seed), l2_(l2),
        x_(batch_size, static_cast<Eigen::Index>(image_pixels)), labels_(batch_size),
        logits_(batch_size, static_cast<Eigen::Index>(num_classes)) {}

  /// The parameter layout (see the class comment). Valid while the model lives.
  std::span<const asyncps::table_spec> tables() const noexcept { return tables_; }

  /// Draws the next minibatch and writes into every value of `g` the gradient, at `p`, of the
  /// minibatch's mean cross-entropy plus (l2 / 2) ||W||^2; returns that loss (nats).
  /// Preconditions: `p` and `g` have the layout `tables()`.
  /// Allocation: none. Complexity: O(batch_size * 7850).
  float compute_gradient(const asyncps::parameter_view& p, asyncps::gradient_view& g) noexcept {
    sampler_.next(x_, labels_);
    const auto theta = p.table(weights_table);
    const auto w = theta.leftCols(image_pixels);
    detail::product_into(logits_, x_, w.transpose());
    logits_.rowwise() += theta.col(image_pixels).transpose();
    const auto batch = static_cast<float>(x_.rows());
    double loss = detail::softmax_cross_entropy(logits_, labels_.data(), 1.0f / batch) / batch;

    auto grad = g.table(weights_table);
    detail::product_into(grad.leftCols(image_pixels), logits_.transpose(), x_);
    grad.col(image_pixels) = logits_.colwise().sum().transpose();
    if (l2_ != 0.0f) {
      grad.leftCols(image_pixels) += l2_ * w;
      loss += 0.5 * static_cast<double>(l2_) * static_cast<double>(w.squaredNorm());
    }
    return static_cast<float>(loss);
  }

  /// Examples drawn so far by this object.
  std::uint64_t samples_seen() const noexcept { return sampler_.samples_seen(); }
  /// Passes over this object's shard so far (fractional).
  double epoch() const noexcept { return sampler_.epoch(); }

  /// Accuracy and mean cross-entropy of parameters `p` (layout `tables()`) on `test`,
  /// computed in chunks of `chunk_rows` rows. Preconditions: `test` is n x 784 with n labels,
  /// all < 10 (as `load_idx` makes it). Allocates O(chunk_rows * 10) floats.
  /// Thread safety: reentrant.
  static evaluation evaluate(const asyncps::parameter_view& p, const dataset& test,
                             std::size_t chunk_rows = 1000) {
    const auto theta = p.table(weights_table);
    return detail::evaluate_chunks(test, chunk_rows, [&](const auto& x, auto& z) {
      z.noalias() = x * theta.leftCols(image_pixels).transpose();
      z.rowwise() += theta.col(image_pixels).transpose();
    });
  }

 private:
  std::array<asyncps::table_spec, 1> tables_{
      {{weights_table, static_cast<std::uint32_t>(num_classes),
        static_cast<std::uint32_t>(image_pixels + 1), 0.0f}}};
  detail::minibatch_sampler sampler_;
  float l2_;
  asyncps::row_matrix x_;             // batch x 784
  std::vector<std::uint8_t> labels_;  // batch
  asyncps::row_matrix logits_;        // batch x 10; then d(loss)/d(logits)
};

/// A 784 -> H (ReLU) -> 10 network: p(y | x) = softmax(W2 relu(W1 x + b1) + b2).
///
/// Layout: table 0 is H rows x 785 (row j = [W1_j | b1_j]), Glorot-uniform scale
/// sqrt(6 / (784 + H)); table 1 is 10 rows x (H + 1) (row c = [W2_c | b2_c]), scale
/// sqrt(6 / (H + 10)). (Biases start uniform too: the layout has one scale per table.)
/// Loss per minibatch: mean cross-entropy + (l2 / 2) (||W1||^2 + ||W2||^2).
/// Object lifetimes: the training set passed to the constructor must outlive the model.
/// Thread safety: distinct objects are independent; one object is used by one thread at a time.
class mlp_model {
 public:
  /// Hidden layer parameters [W1 | b1].
  static constexpr asyncps::table_id hidden_table = 0;
  /// Output layer parameters [W2 | b2].
  static constexpr asyncps::table_id output_table = 1;
  /// The default hidden width.
  static constexpr std::uint32_t default_hidden = 128;

  /// A worker's model; arguments as `softmax_model`'s, plus the hidden width `hidden` (> 0).
  /// Errors: as `softmax_model`'s constructor, and `std::invalid_argument` if `hidden == 0`.
  /// Complexity: O(shard size + batch_size * (784 + H)) time and memory.
  mlp_model(const dataset& train, std::uint32_t shard, std::uint32_t num_shards,
            std::uint32_t batch_size, std::uint64_t seed, float l2 = 0.0f,
            std::uint32_t hidden = default_hidden)
      : tables_{{{hidden_table, hidden, static_cast<std::uint32_t>(image_pixels + 1),
                  std::sqrt(6.0f / static_cast<float>(image_pixels + hidden))},
                 {output_table, static_cast<std::uint32_t>(num_classes), hidden + 1,
                  std::sqrt(6.0f / static_cast<float>(hidden + num_classes))}}},
        sampler_(train, shard, num_shards, batch_size, seed), l2_(l2),
        x_(batch_size, static_cast<Eigen::Index>(image_pixels)), labels_(batch_size),
        hidden_(batch_size, hidden), hidden_delta_(batch_size, hidden),
        logits_(batch_size, static_cast<Eigen::Index>(num_classes)) {
    if (hidden == 0) throw std::invalid_argument("fashion::mlp_model: hidden must be > 0");
  }

  /// The parameter layout (see the class comment). Valid while the model lives.
  std::span<const asyncps::table_spec> tables() const noexcept { return tables_; }

  /// Draws the next minibatch and writes into every value of `g` the gradient, at `p`, of the
  /// minibatch's mean cross-entropy plus (l2 / 2)(||W1||^2 + ||W2||^2); returns that loss.
  /// Preconditions: `p` and `g` have the layout `tables()`.
  /// Allocation: none. Complexity: O(batch_size * H * 794).
  float compute_gradient(const asyncps::parameter_view& p, asyncps::gradient_view& g) noexcept {
    sampler_.next(x_, labels_);
    const Eigen::Index h = hidden_.cols();
    const auto theta1 = p.table(hidden_table);
    const auto theta2 = p.table(output_table);
    const auto w1 = theta1.leftCols(image_pixels);
    const auto w2 = theta2.leftCols(h);

    detail::product_into(hidden_, x_, w1.transpose());
    hidden_.rowwise() += theta1.col(image_pixels).transpose();
    hidden_ = hidden_.cwiseMax(0.0f);
    detail::product_into(logits_, hidden_, w2.transpose());
    logits_.rowwise() += theta2.col(h).transpose();
    const auto batch = static_cast<float>(x_.rows());
    double loss = detail::softmax_cross_entropy(logits_, labels_.data(), 1.0f / batch) / batch;

    auto grad2 = g.table(output_table);
    detail::product_into(grad2.leftCols(h), logits_.transpose(), hidden_);
    grad2.col(h) = logits_.colwise().sum().transpose();
    detail::product_into(hidden_delta_, logits_, w2);
    hidden_delta_.array() *= (hidden_.array() > 0.0f).cast<float>();
    auto grad1 = g.table(hidden_table);
    detail::product_into(grad1.leftCols(image_pixels), hidden_delta_.transpose(), x_);
    grad1.col(image_pixels) = hidden_delta_.colwise().sum().transpose();
    if (l2_ != 0.0f) {
      grad1.leftCols(image_pixels) += l2_ * w1;
      grad2.leftCols(h) += l2_ * w2;
      loss += 0.5 * static_cast<double>(l2_) *
              (static_cast<double>(w1.squaredNorm()) + static_cast<double>(w2.squaredNorm()));
    }
    return static_cast<float>(loss);
  }

  /// Examples drawn so far by this object.
  std::uint64_t samples_seen() const noexcept { return sampler_.samples_seen(); }
  /// Passes over this object's shard so far (fractional).
  double epoch() const noexcept { return sampler_.epoch(); }
  /// The hidden width H.
  std::uint32_t hidden() const noexcept { return tables_[hidden_table].rows; }

  /// Accuracy and mean cross-entropy of parameters `p` on `test`, in chunks of `chunk_rows`
  /// rows. H is read from `p.tables()`. Preconditions: `p` has an `mlp_model` layout; `test` is
  /// n x 784 with n labels, all < 10.
  /// Allocates O(chunk_rows * H) floats. Thread safety: reentrant.
  static evaluation evaluate(const asyncps::parameter_view& p, const dataset& test,
                             std::size_t chunk_rows = 1000) {
    const auto theta1 = p.table(hidden_table);
    const auto theta2 = p.table(output_table);
    const Eigen::Index h = theta1.rows();
    asyncps::row_matrix act(static_cast<Eigen::Index>(std::max<std::size_t>(chunk_rows, 1)), h);
    return detail::evaluate_chunks(test, chunk_rows, [&](const auto& x, auto& z) {
      auto a = act.topRows(x.rows());
      a.noalias() = x * theta1.leftCols(image_pixels).transpose();
      a.rowwise() += theta1.col(image_pixels).transpose();
      a = a.cwiseMax(0.0f);
      z.noalias() = a * theta2.leftCols(h).transpose();
      z.rowwise() += theta2.col(h).transpose();
    });
  }

 private:
  std::array<asyncps::table_spec, 2> tables_;
  detail::minibatch_sampler sampler_;
  float l2_;
  asyncps::row_matrix x_;             // batch x 784
  std::vector<std::uint8_t> labels_;  // batch
  asyncps::row_matrix hidden_;        // batch x H: relu(x W1^T + b1)
  asyncps::row_matrix hidden_delta_;  // batch x H: d(loss)/d(pre-activation)
  asyncps::row_matrix logits_;        // batch x 10; then d(loss)/d(logits)
};

/// Random changes to each training image, drawn per example (the test set is never changed).
struct augmentation {
  bool flip = false;            ///< mirror left-right with probability 1/2
  std::uint32_t max_shift = 0;  ///< move by dx, dy uniform in [-max_shift, max_shift] pixels,
                                ///< filling with 0 (background); at most 27
};

namespace detail {

/// Writes into `out` the 28 x 28 image `in` (row-major), mirrored left-right if `flip`, then
/// moved by (`dx`, `dy`) pixels (right and down positive) with the uncovered pixels 0.
/// Preconditions: `in` and `out` hold 784 floats and do not overlap.
inline void flip_shift(const float* in, bool flip, int dx, int dy, float* out) noexcept {
  for (int y = 0; y < 28; ++y) {
    const int sy = y - dy;
    for (int x = 0; x < 28; ++x) {
      const int sx0 = x - dx;
      const int sx = flip ? 27 - sx0 : sx0;
      out[y * 28 + x] = (sy < 0 || sy > 27 || sx0 < 0 || sx0 > 27) ? 0.0f : in[sy * 28 + sx];
    }
  }
}

}  // namespace detail

/// A small convolutional network: conv 5x5 (1 -> C1) -> ReLU -> max pool 2x2 -> conv 5x5
/// (C1 -> C2) -> ReLU -> max pool 2x2 -> [dense (16 C2 -> H) -> ReLU, when H > 0] -> dense
/// (-> 10) -> softmax. Spatial sizes: 28 -> 24 -> 12 -> 8 -> 4 ("valid" convolutions, stride
/// 1; pools of stride 2).
///
/// Layout (each row is one output unit's weights followed by its bias, as the MLP's [W | b]):
/// * table 0, conv 1: C1 rows x 26; row f = [w_f(ky, kx) at column ky * 5 + kx | b_f].
///   He-uniform scale sqrt(6 / 25).
/// * table 1, conv 2: C2 rows x (25 C1 + 1); row f = [w_f(ky, kx, c) at column
///   (ky * 5 + kx) * C1 + c | b_f]. He-uniform scale sqrt(6 / (25 C1)).
/// * table 2, output: 10 rows x (F + 1), F = H if H > 0, else 16 C2; without the hidden layer,
///   row k = [w_k(y, x, c) at column (y * 4 + x) * C2 + c | b_k], over the 4 x 4 x C2 pooled
///   features. Glorot-uniform scale sqrt(6 / (F + 10)).
/// * table 3, hidden dense layer (only when H > 0): H rows x (16 C2 + 1), columns as table 2's
///   without it. He-uniform scale sqrt(6 / (16 C2)).
/// (Biases start uniform too: the layout has one scale per table.)
/// Loss per minibatch: mean cross-entropy + (l2 / 2) * (sum of squared weights, biases excluded).
///
/// Each convolution is one GEMM over the whole batch: the inputs are unrolled (im2col, with a
/// column of ones that multiplies the bias column) into (batch * positions) x (25 C_in + 1)
/// rows, times the table transposed. Activations are NHWC (channel fastest). Per example, the
/// forward pass is 576 * 26 * C1 + 64 * (25 C1 + 1) * C2 + (H > 0 ? H (16 C2 + 1) + 10 (H + 1)
/// : 10 (16 C2 + 1)) multiply-adds (about 1.07 M for the default C1 = 16, C2 = 32, H = 0; the
/// hidden layer adds 66 K for H = 128), the gradient about 3 times that.
/// Object lifetimes: the training set passed to the constructor must outlive the model.
/// Thread safety: distinct objects are independent; one object is used by one thread at a time.
class cnn_model {
 public:
  /// First convolution [W1 | b1].
  static constexpr asyncps::table_id conv1_table = 0;
  /// Second convolution [W2 | b2].
  static constexpr asyncps::table_id conv2_table = 1;
  /// Dense output layer [W3 | b3].
  static constexpr asyncps::table_id output_table = 2;
  /// Hidden dense layer [Wh | bh] (present when the hidden width H > 0).
  static constexpr asyncps::table_id hidden_table = 3;
  /// The default channel counts C1 and C2.
  static constexpr std::uint32_t default_channels1 = 16;
  static constexpr std::uint32_t default_channels2 = 32;

  /// A worker's model; arguments as `softmax_model`'s, plus the channel counts `channels1` and
  /// `channels2` (both > 0) of the two convolutions and the width `hidden` of a hidden dense
  /// layer before the output (0: none, the output layer reads the pooled features).
  /// Errors: as `softmax_model`'s constructor, and `std::invalid_argument` if a channel count is
  /// 0 or above 4096, or `hidden` is above 4096.
  /// Complexity: O(shard size + batch_size * (576 * (C1 + 26) + 64 * (25 C1 + C2))) time and
  /// memory (about 230 KB per example of the batch for the default channels).
  cnn_model(const dataset& train, std::uint32_t shard, std::uint32_t num_shards,
            std::uint32_t batch_size, std::uint64_t seed, float l2 = 0.0f,
            std::uint32_t channels1 = default_channels1,
            std::uint32_t channels2 = default_channels2, std::uint32_t hidden = 0)
      : tables_(make_tables(channels1, channels2, hidden)), table_count_(hidden > 0 ? 4 : 3),
        sampler_(train, shard, num_shards, batch_size, seed), l2_(l2),
        x_(batch_size, static_cast<Eigen::Index>(image_pixels)), labels_(batch_size),
        work_(batch_size, channels1, channels2, hidden),
        augment_rng_(seed ^
                     (0xA5A5A5A5A5A5A5A5ull + std::uint64_t{shard} * 0x9E3779B97F4A7C15ull)) {}

  /// The parameter layout (see the class comment). Valid while the model lives.
  std::span<const asyncps::table_spec> tables() const noexcept {
    return std::span<const asyncps::table_spec>(tables_).first(table_count_);
  }

  /// Changes every later training minibatch by `a` (none by default); the draws are
  /// deterministic from the constructor's seed and shard.
  /// Errors: `std::invalid_argument` if `a.max_shift > 27`.
  void set_augmentation(augmentation a) {
    if (a.max_shift > 27)
      throw std::invalid_argument("fashion::cnn_model: augmentation shift must be <= 27 pixels");
    augment_ = a;
  }
  /// The augmentation in use.
  augmentation get_augmentation() const noexcept { return augment_; }

  /// Draws the next minibatch (augmented, see `set_augmentation`) and writes into every value
  /// of `g` the gradient, at `p`, of the minibatch's mean cross-entropy plus (l2 / 2) * (squared
  /// weights); returns that loss (nats).
  /// Preconditions: `p` and `g` have the layout `tables()`.
  /// Allocation: none. Complexity: O(batch_size * 3 * (forward multiply-adds, class comment)).
  float compute_gradient(const asyncps::parameter_view& p, asyncps::gradient_view& g) noexcept {
    sampler_.next(x_, labels_);
    if (augment_.flip || augment_.max_shift != 0) augment_batch();
    workspace& w = work_;
    const Eigen::Index m = x_.rows();
    const Eigen::Index c1 = w.c1;
    const Eigen::Index c2 = w.c2;
    const auto theta1 = p.table(conv1_table);
    const auto theta2 = p.table(conv2_table);
    const auto theta3 = p.table(output_table);
    const auto thetah = p.table(table_count_ > 3 ? hidden_table : output_table);
    w.forward(theta1, theta2, theta3, thetah, x_.data(), m);
    const auto batch = static_cast<float>(m);
    double loss = detail::softmax_cross_entropy(w.logits, labels_.data(), 1.0f / batch) / batch;

    const Eigen::Index features = 16 * c2;
    auto grad3 = g.table(output_table);
    if (w.h > 0) {
      // Output layer: d[W3 | b3] = d_logits^T [hidden | 1]; then through the hidden ReLU:
      // d[Wh | bh] = d_hidden^T [features | 1], d_features = d_hidden Wh.
      detail::product_into(grad3, w.logits.transpose(), w.hidden);
      detail::product_into(w.d_hidden, w.logits, theta3.leftCols(w.h));
      w.d_hidden.array() *= (w.hidden.leftCols(w.h).array() > 0.0f).cast<float>();
      auto gradh = g.table(hidden_table);
      detail::product_into(gradh, w.d_hidden.transpose(), w.pooled2);
      detail::product_into(w.d_pooled2.leftCols(features), w.d_hidden, thetah.leftCols(features));
    } else {
      // Output layer: d(loss)/d[W3 | b3] = d_logits^T [features | 1].
      detail::product_into(grad3, w.logits.transpose(), w.pooled2);
      detail::product_into(w.d_pooled2.leftCols(features), w.logits, theta3.leftCols(features));
    }
    // Pool 2 and ReLU, into the conv 2 pre-activations' storage.
    detail::relu_max_pool_backward(w.pooled2.data(), w.d_pooled2.data(), m, 8, c2, features + 1,
                                   w.arg2.data(), w.act2.data());
    // Conv 2: d[W2 | b2] = d_act2^T cols2; then d_cols2 = d_act2 W2 into cols2's storage (its
    // last column, the ones, is not written and is restored by the next forward pass anyway).
    auto grad2 = g.table(conv2_table);
    detail::product_into(grad2, w.act2.transpose(), w.cols2);
    detail::product_into(w.cols2.leftCols(25 * c1), w.act2, theta2.leftCols(25 * c1));
    detail::col2im5(w.cols2.data(), w.cols2.cols(), m, 12, c1, w.d_pooled1.data());
    // Pool 1 and ReLU, into the conv 1 pre-activations' storage.
    detail::relu_max_pool_backward(w.pooled1.data(), w.d_pooled1.data(), m, 24, c1, 144 * c1,
                                   w.arg1.data(), w.act1.data());
    auto grad1 = g.table(conv1_table);
    detail::product_into(grad1, w.act1.transpose(), w.cols1);

    if (l2_ != 0.0f) {
      double squares = 0.0;
      const auto decay = [&](auto grad, const auto& theta, Eigen::Index weights) {
        grad.leftCols(weights) += l2_ * theta.leftCols(weights);
        squares += static_cast<double>(theta.leftCols(weights).squaredNorm());
      };
      decay(grad1, theta1, 25);
      decay(grad2, theta2, 25 * c1);
      decay(grad3, theta3, w.h > 0 ? w.h : features);
      if (w.h > 0) {
        auto gradh = g.table(hidden_table);
        decay(gradh, thetah, features);
      }
      loss += 0.5 * static_cast<double>(l2_) * squares;
    }
    return static_cast<float>(loss);
  }

  /// Examples drawn so far by this object.
  std::uint64_t samples_seen() const noexcept { return sampler_.samples_seen(); }
  /// Passes over this object's shard so far (fractional).
  double epoch() const noexcept { return sampler_.epoch(); }
  /// The channel counts C1 and C2.
  std::uint32_t channels1() const noexcept { return tables_[conv1_table].rows; }
  std::uint32_t channels2() const noexcept { return tables_[conv2_table].rows; }
  /// The hidden dense layer's width H (0: none).
  std::uint32_t hidden() const noexcept {
    return table_count_ > 3 ? tables_[hidden_table].rows : 0;
  }

  /// Accuracy and mean cross-entropy of parameters `p` on `test`, in chunks of `chunk_rows`
  /// rows, each run as forward passes of at most 100 images. C1, C2 and H are read from
  /// `p.tables()`. Preconditions: `p` has a `cnn_model` layout; `test` is n x 784 with n
  /// labels, all < 10. Allocates O(chunk_rows * 10) floats and the activations of 100 examples
  /// (about 23 MB for the default channels). Thread safety: reentrant.
  static evaluation evaluate(const asyncps::parameter_view& p, const dataset& test,
                             std::size_t chunk_rows = 1000) {
    const auto theta1 = p.table(conv1_table);
    const auto theta2 = p.table(conv2_table);
    const auto theta3 = p.table(output_table);
    const bool has_hidden = p.tables().size() > hidden_table;
    const auto thetah = p.table(has_hidden ? hidden_table : output_table);
    constexpr Eigen::Index block = 100;
    workspace w(block, static_cast<std::uint32_t>(theta1.rows()),
                static_cast<std::uint32_t>(theta2.rows()),
                has_hidden ? static_cast<std::uint32_t>(thetah.rows()) : 0);
    return detail::evaluate_chunks(test, chunk_rows, [&](const auto& x, auto& z) {
      for (Eigen::Index r = 0; r < x.rows(); r += block) {
        const Eigen::Index m = std::min(block, x.rows() - r);
        w.forward(theta1, theta2, theta3, thetah, x.row(r).data(), m);
        z.middleRows(r, m) = w.logits.topRows(m);
      }
    });
  }

 private:
  /// The layout for channel counts (c1, c2) and hidden width h (the fourth entry is used only
  /// when h > 0); throws `std::invalid_argument` if a channel count is 0 or above 4096, or h
  /// is above 4096.
  static std::array<asyncps::table_spec, 4> make_tables(std::uint32_t c1, std::uint32_t c2,
                                                        std::uint32_t h) {
    if (c1 == 0 || c2 == 0 || c1 > 4096 || c2 > 4096)
      throw std::invalid_argument("fashion::cnn_model: channel counts must be in [1, 4096]");
    if (h > 4096)
      throw std::invalid_argument("fashion::cnn_model: the hidden width must be in [0, 4096]");
    const auto he = [](std::uint32_t fan_in) {
      return std::sqrt(6.0f / static_cast<float>(fan_in));
    };
    const std::uint32_t out_in = h > 0 ? h : 16 * c2;
    return {{{conv1_table, c1, 26, he(25)},
             {conv2_table, c2, 25 * c1 + 1, he(25 * c1)},
             {output_table, static_cast<std::uint32_t>(num_classes), out_in + 1,
              std::sqrt(6.0f / static_cast<float>(out_in + num_classes))},
             {hidden_table, h, 16 * c2 + 1, he(16 * c2)}}};
  }

  /// The activations of up to `capacity` examples, and the gradients flowing back through them.
  struct workspace {
    workspace(Eigen::Index capacity, std::uint32_t channels1, std::uint32_t channels2,
              std::uint32_t hidden_width)
        : c1(channels1), c2(channels2), h(hidden_width), cols1(capacity * 576, 26),
          act1(capacity * 576, c1), pooled1(capacity * 144, c1), d_pooled1(capacity * 144, c1),
          arg1(static_cast<std::size_t>(capacity * 144 * c1)), cols2(capacity * 64, 25 * c1 + 1),
          act2(capacity * 64, c2), pooled2(capacity, 16 * c2 + 1), d_pooled2(capacity, 16 * c2 + 1),
          arg2(static_cast<std::size_t>(capacity * 16 * c2)), hidden(capacity, h + 1),
          d_hidden(capacity, h), logits(capacity, static_cast<Eigen::Index>(num_classes)) {
      // The ones that multiply the bias columns; no pass overwrites them.
      cols1.col(25).setOnes();
      cols2.col(25 * c1).setOnes();
      pooled2.col(16 * c2).setOnes();
      hidden.col(h).setOnes();
    }

    /// Fills the top m rows of `logits` with the logits of the m <= capacity images at `x`
    /// (m x 784, row-major, contiguous), keeping every activation for the backward pass.
    /// `thetah`: the hidden layer's table (read only when h > 0).
    template <class Theta>
    void forward(const Theta& theta1, const Theta& theta2, const Theta& theta3, const Theta& thetah,
                 const float* x, Eigen::Index m) noexcept {
      detail::im2col5(x, m, 28, 1, cols1.data(), cols1.cols());
      auto a1 = act1.topRows(m * 576);
      detail::product_into(a1, cols1.topRows(m * 576), theta1.transpose());
      detail::relu_max_pool(act1.data(), m, 24, c1, pooled1.data(), 144 * c1, arg1.data());
      detail::im2col5(pooled1.data(), m, 12, c1, cols2.data(), cols2.cols());
      auto a2 = act2.topRows(m * 64);
      detail::product_into(a2, cols2.topRows(m * 64), theta2.transpose());
      detail::relu_max_pool(act2.data(), m, 8, c2, pooled2.data(), pooled2.cols(), arg2.data());
      auto z = logits.topRows(m);
      if (h > 0) {
        auto a = hidden.topRows(m).leftCols(h);
        detail::product_into(a, pooled2.topRows(m), thetah.transpose());
        a = a.cwiseMax(0.0f);
        detail::product_into(z, hidden.topRows(m), theta3.transpose());
      } else {
        detail::product_into(z, pooled2.topRows(m), theta3.transpose());
      }
    }

    Eigen::Index c1, c2, h;
    asyncps::row_matrix cols1;        // (m * 576) x 26: conv 1 input patches | 1
    asyncps::row_matrix act1;         // (m * 576) x C1: conv 1 pre-activations; then gradient
    asyncps::row_matrix pooled1;      // (m * 144) x C1: relu(pool(act1)), NHWC
    asyncps::row_matrix d_pooled1;    // (m * 144) x C1: d(loss)/d(pooled1)
    std::vector<std::uint32_t> arg1;  // m * 144 * C1: index into act1 of each pool maximum
    asyncps::row_matrix cols2;        // (m * 64) x (25 C1 + 1): conv 2 patches | 1; then grad
    asyncps::row_matrix act2;         // (m * 64) x C2: conv 2 pre-activations; then gradient
    asyncps::row_matrix pooled2;      // m x (16 C2 + 1): relu(pool(act2)), NHWC | 1
    asyncps::row_matrix d_pooled2;    // m x (16 C2 + 1): d(loss)/d(pooled2) (last col unused)
    std::vector<std::uint32_t> arg2;  // m * 16 * C2: index into act2 of each pool maximum
    asyncps::row_matrix hidden;       // m x (H + 1): relu(pooled2 [Wh | bh]^T) | 1 (H > 0)
    asyncps::row_matrix d_hidden;     // m x H: d(loss)/d(hidden pre-activation)
    asyncps::row_matrix logits;       // m x 10; then d(loss)/d(logits)
  };

  /// Applies `augment_` to every image of `x_`, one draw per image.
  void augment_batch() noexcept {
    const int shift = static_cast<int>(augment_.max_shift);
    std::uniform_int_distribution<int> offset(-shift, shift);
    for (Eigen::Index i = 0; i < x_.rows(); ++i) {
      const bool flip = augment_.flip && (augment_rng_() & 1u) != 0;
      const int dx = offset(augment_rng_);
      const int dy = offset(augment_rng_);
      detail::flip_shift(x_.row(i).data(), flip, dx, dy, image_.data());
      std::copy(image_.begin(), image_.end(), x_.row(i).data());
    }
  }

  std::array<asyncps::table_spec, 4> tables_;
  std::size_t table_count_;  // 3, or 4 with the hidden layer
  detail::minibatch_sampler sampler_;
  float l2_;
  asyncps::row_matrix x_;             // batch x 784
  std::vector<std::uint8_t> labels_;  // batch
  workspace work_;
  augmentation augment_{};
  std::mt19937_64 augment_rng_;
  std::array<float, image_pixels> image_{};  // one augmented image
};

static_assert(asyncps::model<softmax_model>);
static_assert(asyncps::model<mlp_model>);
static_assert(asyncps::model<cnn_model>);

/// `Model::evaluate(p, test)`: accuracy and mean cross-entropy of `p` on `test`.
template <class Model>
evaluation evaluate(const asyncps::parameter_view& p, const dataset& test,
                    std::size_t chunk_rows = 1000) {
  return Model::evaluate(p, test, chunk_rows);
}

}  // namespace fashion
