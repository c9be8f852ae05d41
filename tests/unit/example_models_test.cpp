// Tests of the Fashion-MNIST example's data loader and models (examples/fashion_mnist/).
//
// Gradients are checked against central differences of the loss the model itself returns;
// the loader is checked on small gzip files written here, and on the installed data set when
// the Debian package dataset-fashion-mnist is present.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <zlib.h>

#include "asyncps/error.hpp"
#include "asyncps/model.hpp"
#include "asyncps/table.hpp"
#include "build_mode.hpp"
#include "examples/fashion_mnist/dataset.hpp"
#include "examples/fashion_mnist/models.hpp"

namespace {

/// `n` images of uniform random pixels in [0, 1] with uniform random labels.
fashion::dataset synthetic_dataset(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::uniform_int_distribution<int> label(0, 9);
  fashion::dataset d;
  d.images.resize(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(fashion::image_pixels));
  for (Eigen::Index i = 0; i < d.images.size(); ++i) d.images.data()[i] = pixel(rng);
  for (std::size_t i = 0; i < n; ++i) d.labels.push_back(static_cast<std::uint8_t>(label(rng)));
  return d;
}

/// Parameters for `layout`, uniform in [-scale, scale] (scale = `fallback` for zero-scale tables).
std::vector<float> random_parameters(std::span<const asyncps::table_spec> layout,
                                     std::uint64_t seed, float fallback) {
  std::mt19937_64 rng(seed);
  std::vector<float> params;
  for (const auto& t : layout) {
    const float s = t.init_scale > 0.0f ? t.init_scale : fallback;
    std::uniform_real_distribution<float> u(-s, s);
    for (std::size_t i = 0; i < t.size(); ++i) params.push_back(u(rng));
  }
  return params;
}

/// What `check_gradient` checks.
struct gradient_check {
  /// The finite-difference step of each table (the loss is a float: a step too small drowns a
  /// small gradient in rounding, one too large crosses many ReLU/max-pool kinks when one weight
  /// feeds many units).
  std::vector<float> eps;
  int weights = 8;  ///< random weights (any column but the last) per table
  int biases = 2;   ///< random biases (the last column) per table
  /// Where the one-sided differences disagree by more than the tolerance (a kink inside the step
  /// whose jump is too small to skip the coordinate: the CNN's pools and ReLUs have many), also
  /// accept a gradient that matches one of them: it is the derivative on that side of the kink.
  bool one_sided_at_kinks = false;
};

/// Per table: how many coordinates `check_gradient` compared, and how many of those weights and
/// biases had a gradient of magnitude above 1e-3 (not a dead unit's).
struct gradient_check_result {
  int checked = 0;
  std::vector<int> live_weights, live_biases;
};

/// Compares `model`'s gradient with central differences of its loss at `opts.weights` random
/// weights and `opts.biases` random biases of every table. The model must draw the whole
/// (single) shard in every batch, so every call sees the same examples. Coordinates where the
/// forward and backward one-sided differences disagree (a ReLU or max-pool kink inside
/// [-eps, eps]) by more than 0.1 |central difference| + 2e-3 are skipped: that depends on the
/// loss only, not on the gradient compared, so it lowers the count but hides no wrong gradient.
template <class Model>
gradient_check_result check_gradient(Model& model, std::vector<float> params,
                                     const gradient_check& opts, std::uint64_t seed) {
  const auto layout = model.tables();
  const std::size_t n = asyncps::layout_size(layout);
  REQUIRE(params.size() == n);
  REQUIRE(opts.eps.size() == layout.size());
  std::vector<float> grad(n, std::nanf("")), scratch(n);
  asyncps::gradient_view g(layout, grad.data());
  asyncps::gradient_view s(layout, scratch.data());
  const float loss0 = model.compute_gradient(asyncps::parameter_view(layout, params.data()), g);
  CHECK(std::isfinite(loss0));
  // Every value was written (the buffer started as NaN).
  REQUIRE(std::all_of(grad.begin(), grad.end(), [](float v) { return std::isfinite(v); }));

  const auto loss_at = [&](std::size_t k, float value) {
    const float saved = params[k];
    params[k] = value;
    const float l = model.compute_gradient(asyncps::parameter_view(layout, params.data()), s);
    params[k] = saved;
    return static_cast<double>(l);
  };

  std::mt19937_64 rng(seed);
  gradient_check_result result;
  result.live_weights.assign(layout.size(), 0);
  result.live_biases.assign(layout.size(), 0);
  std::size_t offset = 0;
  for (const auto& t : layout) {
    std::vector<std::size_t> coords;
    std::uniform_int_distribution<std::uint32_t> row(0, t.rows - 1);
    std::uniform_int_distribution<std::uint32_t> col(0, t.width - 2);
    for (int i = 0; i < opts.weights; ++i)
      coords.push_back(offset + std::size_t{row(rng)} * t.width + col(rng));
    for (int i = 0; i < opts.biases; ++i)
      coords.push_back(offset + std::size_t{row(rng)} * t.width + t.width - 1);
    const float eps = opts.eps[t.id];
    for (const std::size_t k : coords) {
      const double plus = loss_at(k, params[k] + eps);
      const double minus = loss_at(k, params[k] - eps);
      const double forward = (plus - loss0) / eps;
      const double backward = (loss0 - minus) / eps;
      const double numeric = (plus - minus) / (2.0 * eps);
      const double analytic = grad[k];
      const double tolerance = 2e-2 * std::max(std::abs(analytic), std::abs(numeric)) + 1e-4;
      const double kink = std::abs(forward - backward);
      if (kink > 0.1 * std::abs(numeric) + 2e-3) continue;
      bool agrees = std::abs(analytic - numeric) <= tolerance;
      if (!agrees && opts.one_sided_at_kinks && kink > tolerance) {
        agrees =
            std::abs(analytic - forward) <= tolerance || std::abs(analytic - backward) <= tolerance;
      }
      INFO("table ", t.id, " index ", k - offset, ": analytic ", analytic, ", numeric ", numeric,
           " (one-sided ", forward, ", ", backward, ")");
      CHECK(agrees);
      ++result.checked;
      if (std::abs(analytic) > 1e-3) {
        ++((k - offset) % t.width == t.width - 1 ? result.live_biases : result.live_weights)[t.id];
      }
    }
    offset += t.size();
  }
  return result;
}

/// `check_gradient` at 8 weights and 2 biases of every table, with step `eps` in all; returns
/// the number of coordinates compared.
template <class Model>
int check_gradient(Model& model, std::vector<float> params, float eps, std::uint64_t seed) {
  gradient_check opts;
  opts.eps.assign(model.tables().size(), eps);
  return check_gradient(model, std::move(params), opts, seed).checked;
}

/// A fresh directory under the system temp directory, removed on destruction.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() /
           ("asyncps_fashion_test_" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

void put_u32(std::vector<unsigned char>& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<unsigned char>(v >> shift));
}

/// An IDX images file body: header (magic, count, rows, cols) then `pixels` bytes of pixel i % 256.
std::vector<unsigned char> image_bytes(std::uint32_t magic, std::uint32_t count, std::size_t pixels,
                                       std::uint32_t rows = 28, std::uint32_t cols = 28) {
  std::vector<unsigned char> out;
  put_u32(out, magic);
  put_u32(out, count);
  put_u32(out, rows);
  put_u32(out, cols);
  for (std::size_t i = 0; i < pixels; ++i) out.push_back(static_cast<unsigned char>(i % 256));
  return out;
}

/// An IDX labels file body: header (magic, count) then `labels`.
std::vector<unsigned char> label_bytes(std::uint32_t magic, std::uint32_t count,
                                       const std::vector<unsigned char>& labels) {
  std::vector<unsigned char> out;
  put_u32(out, magic);
  put_u32(out, count);
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

void write_gz(const std::filesystem::path& file, const std::vector<unsigned char>& bytes) {
  gzFile f = gzopen(file.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!bytes.empty()) {
    REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
            static_cast<int>(bytes.size()));
  }
  REQUIRE(gzclose(f) == Z_OK);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("fashion models satisfy asyncps::model and have the documented layouts") {
  static_assert(asyncps::model<fashion::softmax_model>);
  static_assert(asyncps::model<fashion::mlp_model>);
  static_assert(asyncps::model<fashion::cnn_model>);
  const auto data = synthetic_dataset(8, 1);

  const fashion::softmax_model softmax(data, 0, 1, 4, 1);
  REQUIRE(softmax.tables().size() == 1);
  CHECK(softmax.tables()[0] == asyncps::table_spec{0, 10, 785, 0.0f});

  const fashion::mlp_model mlp(data, 0, 1, 4, 1, 0.0f, 32);
  REQUIRE(mlp.tables().size() == 2);
  CHECK(mlp.hidden() == 32);
  CHECK(mlp.tables()[0].id == 0);
  CHECK(mlp.tables()[0].rows == 32);
  CHECK(mlp.tables()[0].width == 785);
  CHECK(mlp.tables()[0].init_scale == doctest::Approx(std::sqrt(6.0 / (784 + 32))));
  CHECK(mlp.tables()[1].id == 1);
  CHECK(mlp.tables()[1].rows == 10);
  CHECK(mlp.tables()[1].width == 33);
  CHECK(mlp.tables()[1].init_scale == doctest::Approx(std::sqrt(6.0 / (32 + 10))));
  CHECK(fashion::mlp_model(data, 0, 1, 4, 1).hidden() == fashion::mlp_model::default_hidden);

  const fashion::cnn_model cnn(data, 0, 1, 4, 1, 0.0f, 3, 5);
  CHECK(cnn.channels1() == 3);
  CHECK(cnn.channels2() == 5);
  REQUIRE(cnn.tables().size() == 3);
  CHECK(cnn.tables()[0].id == 0);
  CHECK(cnn.tables()[0].rows == 3);
  CHECK(cnn.tables()[0].width == 26);  // 5 x 5 taps | bias
  CHECK(cnn.tables()[0].init_scale == doctest::Approx(std::sqrt(6.0 / 25)));
  CHECK(cnn.tables()[1].id == 1);
  CHECK(cnn.tables()[1].rows == 5);
  CHECK(cnn.tables()[1].width == 76);  // 5 x 5 x 3 taps | bias
  CHECK(cnn.tables()[1].init_scale == doctest::Approx(std::sqrt(6.0 / 75)));
  CHECK(cnn.tables()[2].id == 2);
  CHECK(cnn.tables()[2].rows == 10);
  CHECK(cnn.tables()[2].width == 81);  // 4 x 4 x 5 pooled features | bias
  CHECK(cnn.tables()[2].init_scale == doctest::Approx(std::sqrt(6.0 / (80 + 10))));
  const fashion::cnn_model default_cnn(data, 0, 1, 4, 1);
  CHECK(default_cnn.channels1() == fashion::cnn_model::default_channels1);
  CHECK(default_cnn.channels2() == fashion::cnn_model::default_channels2);
  CHECK(default_cnn.hidden() == 0);
  const fashion::cnn_model hidden_cnn(data, 0, 1, 4, 1, 0.0f, 3, 5, 7);
  CHECK(hidden_cnn.hidden() == 7);
  REQUIRE(hidden_cnn.tables().size() == 4);
  CHECK(hidden_cnn.tables()[2].width == 8);  // output reads the 7 hidden units | bias
  CHECK(hidden_cnn.tables()[2].init_scale == doctest::Approx(std::sqrt(6.0 / (7 + 10))));
  CHECK(hidden_cnn.tables()[3].id == 3);
  CHECK(hidden_cnn.tables()[3].rows == 7);
  CHECK(hidden_cnn.tables()[3].width == 81);  // 4 x 4 x 5 pooled features | bias
  CHECK(hidden_cnn.tables()[3].init_scale == doctest::Approx(std::sqrt(6.0 / 80)));
  CHECK(asyncps::layout_size(default_cnn.tables()) == 16 * 26 + 32 * 401 + 10 * 513);
}

TEST_CASE("fashion model constructors reject impossible arguments") {
  const auto data = synthetic_dataset(4, 2);
  CHECK_THROWS_AS(fashion::softmax_model(data, 1, 1, 4, 0), std::invalid_argument);
  CHECK_THROWS_AS(fashion::softmax_model(data, 0, 0, 4, 0), std::invalid_argument);
  CHECK_THROWS_AS(fashion::softmax_model(data, 0, 1, 0, 0), std::invalid_argument);
  CHECK_THROWS_AS(fashion::softmax_model(data, 0, 8, 4, 0), std::invalid_argument);  // empty shard
  CHECK_THROWS_AS(fashion::mlp_model(data, 0, 1, 4, 0, 0.0f, 0), std::invalid_argument);
  CHECK_THROWS_AS(fashion::cnn_model(data, 0, 1, 4, 0, 0.0f, 0, 4), std::invalid_argument);
  CHECK_THROWS_AS(fashion::cnn_model(data, 0, 1, 4, 0, 0.0f, 4, 0), std::invalid_argument);
  CHECK_THROWS_AS(fashion::cnn_model(data, 0, 1, 4, 0, 0.0f, 4097, 4), std::invalid_argument);
  CHECK_THROWS_AS(fashion::cnn_model(data, 0, 1, 4, 0, 0.0f, 4, 4, 4097), std::invalid_argument);
  CHECK_THROWS_AS(fashion::cnn_model(data, 1, 1, 4, 0), std::invalid_argument);
  CHECK_THROWS_AS(fashion::cnn_model(data, 0, 1, 0, 0), std::invalid_argument);
  auto bad_label = data;
  bad_label.labels[2] = 10;
  CHECK_THROWS_AS(fashion::mlp_model(bad_label, 0, 1, 4, 0), std::invalid_argument);
  auto bad_shape = data;
  bad_shape.labels.pop_back();
  CHECK_THROWS_AS(fashion::softmax_model(bad_shape, 0, 1, 4, 0), std::invalid_argument);
}

TEST_CASE("softmax_model gradient matches central differences") {
  const auto data = synthetic_dataset(20, 3);
  for (const float l2 : {0.0f, 0.05f}) {
    CAPTURE(l2);
    fashion::softmax_model model(data, 0, 1, 20, 7, l2);
    const auto params = random_parameters(model.tables(), 11, 0.05f);
    CHECK(check_gradient(model, params, 1e-2f, 5) == 10);
  }
}

TEST_CASE("mlp_model gradient matches central differences") {
  const auto data = synthetic_dataset(20, 4);
  for (const float l2 : {0.0f, 0.05f}) {
    CAPTURE(l2);
    fashion::mlp_model model(data, 0, 1, 20, 7, l2, 5);
    const auto params = random_parameters(model.tables(), 13, 0.0f);
    CHECK(check_gradient(model, params, 1e-3f, 6) >= 16);  // of 20
  }
}

TEST_CASE("cnn_model gradient matches central differences") {
  // 40 weights and 10 biases of each table: both convolutions (through both pools and the
  // im2col/col2im pair) and the dense layer. Few channels and examples keep it fast; the
  // default initial scales keep activations in the ReLUs' active range. A conv 1 weight feeds
  // every position of its channel, so its step is small (few pool/ReLU kinks crossed); the
  // other tables' gradients are small, so theirs is larger (float rounding of the loss).
  const auto data = synthetic_dataset(5, 8);
  for (const float l2 : {0.0f, 0.05f}) {
    CAPTURE(l2);
    fashion::cnn_model model(data, 0, 1, 5, 7, l2, 4, 4);
    const auto params = random_parameters(model.tables(), 19, 0.0f);
    const auto r = check_gradient(model, params, {{1e-3f, 1e-2f, 1e-2f}, 40, 10, true}, 8);
    CHECK(r.checked >= 135);  // of 150
    // Each table's checks include weights and biases of live units (not only a dead unit's 0).
    for (std::size_t t = 0; t < 3; ++t) {
      CAPTURE(t);
      CHECK(r.live_weights[t] >= 5);
      CHECK(r.live_biases[t] >= 3);
    }
  }
  // With a hidden dense layer of 6 units (table 3) between the pooled features and the output.
  for (const float l2 : {0.0f, 0.05f}) {
    CAPTURE(l2);
    fashion::cnn_model model(data, 0, 1, 5, 7, l2, 4, 4, 6);
    REQUIRE(model.tables().size() == 4);
    const auto params = random_parameters(model.tables(), 29, 0.0f);
    const auto r = check_gradient(model, params, {{5e-4f, 1e-2f, 1e-2f, 1e-2f}, 40, 10, true}, 9);
    CHECK(r.checked >= 180);  // of 4 x (up to 40 + 10); table 2 has 7 columns
    for (std::size_t t = 0; t < 4; ++t) {
      CAPTURE(t);
      CHECK(r.live_weights[t] >= 5);
      CHECK(r.live_biases[t] >= 3);
    }
  }
}

TEST_CASE("evaluate agrees with the loss of a full-batch step") {
  const auto data = synthetic_dataset(30, 5);
  fashion::mlp_model mlp(data, 0, 1, 30, 1, 0.0f, 6);
  const auto params = random_parameters(mlp.tables(), 17, 0.0f);
  std::vector<float> grad(params.size());
  asyncps::gradient_view g(mlp.tables(), grad.data());
  const asyncps::parameter_view p(mlp.tables(), params.data());
  const float loss = mlp.compute_gradient(p, g);
  for (const std::size_t chunk : {std::size_t{7}, std::size_t{1000}}) {
    const auto e = fashion::evaluate<fashion::mlp_model>(p, data, chunk);
    CHECK(e.loss == doctest::Approx(loss).epsilon(1e-5));
    CHECK(e.accuracy >= 0.0);
    CHECK(e.accuracy <= 1.0);
  }

  // The CNN evaluates in blocks of 100 examples: 250 examples make two full blocks and a
  // partial one in one chunk, and chunks of 7 split them differently.
  const auto more = synthetic_dataset(250, 9);
  fashion::cnn_model cnn(more, 0, 1, 250, 1, 0.0f, 4, 6);
  const auto cnn_params = random_parameters(cnn.tables(), 23, 0.0f);
  std::vector<float> cnn_grad(cnn_params.size());
  asyncps::gradient_view cg(cnn.tables(), cnn_grad.data());
  const asyncps::parameter_view cp(cnn.tables(), cnn_params.data());
  const float cnn_loss = cnn.compute_gradient(cp, cg);
  for (const std::size_t chunk : {std::size_t{7}, std::size_t{1000}}) {
    CAPTURE(chunk);
    const auto e = fashion::evaluate<fashion::cnn_model>(cp, more, chunk);
    CHECK(e.loss == doctest::Approx(cnn_loss).epsilon(1e-5));
    CHECK(e.accuracy >= 0.0);
    CHECK(e.accuracy <= 1.0);
  }
  // With the hidden layer: evaluate reads H from the layout.
  fashion::cnn_model hcnn(more, 0, 1, 250, 1, 0.0f, 4, 6, 9);
  const auto h_params = random_parameters(hcnn.tables(), 31, 0.0f);
  std::vector<float> h_grad(h_params.size());
  asyncps::gradient_view hg(hcnn.tables(), h_grad.data());
  const asyncps::parameter_view hp(hcnn.tables(), h_params.data());
  const float h_loss = hcnn.compute_gradient(hp, hg);
  CHECK(fashion::evaluate<fashion::cnn_model>(hp, more, 7).loss ==
        doctest::Approx(h_loss).epsilon(1e-5));

  // All-zero softmax parameters: uniform prediction, loss log(10); arg-max is class 0.
  const fashion::softmax_model softmax(data, 0, 1, 30, 1);
  const std::vector<float> zeros(asyncps::layout_size(softmax.tables()), 0.0f);
  const auto e = fashion::softmax_model::evaluate(
      asyncps::parameter_view(softmax.tables(), zeros.data()), data, 4);
  CHECK(e.loss == doctest::Approx(std::log(10.0)));
  CHECK(e.accuracy ==
        doctest::Approx(static_cast<double>(std::count(data.labels.begin(), data.labels.end(), 0)) /
                        30.0));
}

TEST_CASE("models count samples and epochs of their own shard") {
  const auto data = synthetic_dataset(20, 6);
  const auto count = [](auto&& model) {
    std::vector<float> params(asyncps::layout_size(model.tables()), 0.0f), grad(params.size());
    asyncps::gradient_view g(model.tables(), grad.data());
    const asyncps::parameter_view p(model.tables(), params.data());
    CHECK(model.samples_seen() == 0);
    for (int i = 0; i < 5; ++i) static_cast<void>(model.compute_gradient(p, g));
    CHECK(model.samples_seen() == 20);
    CHECK(model.epoch() == doctest::Approx(2.0));
  };
  count(fashion::softmax_model(data, 1, 2, 4, 9));  // shard 1 of 2: 10 examples
  count(fashion::cnn_model(data, 1, 2, 4, 9, 0.0f, 2, 3));
}

TEST_CASE("compute_gradient does not allocate after construction") {
  // The test target defines EIGEN_RUNTIME_NO_MALLOC: Eigen then asserts (aborting the run) on
  // any heap allocation while it is disallowed; this is what catches a GEMM whose packing
  // buffers outgrow the stack. (A standalone build without the define skips the check; the
  // sampler's own std containers are sized in the constructor and never grow.)
#ifdef EIGEN_RUNTIME_NO_MALLOC
  const auto data = synthetic_dataset(600, 7);
  const auto steps_without_malloc = [](auto& model) {
    std::vector<float> params(asyncps::layout_size(model.tables()), 0.01f);
    std::vector<float> grad(params.size());
    const asyncps::parameter_view p(model.tables(), params.data());
    asyncps::gradient_view g(model.tables(), grad.data());
    static_cast<void>(model.compute_gradient(p, g));
    Eigen::internal::set_is_malloc_allowed(false);
    for (int i = 0; i < 12; ++i) static_cast<void>(model.compute_gradient(p, g));  // > 1 epoch
    Eigen::internal::set_is_malloc_allowed(true);
    return model.epoch();
  };
  for (const std::uint32_t batch : {32u, 256u}) {
    CAPTURE(batch);
    fashion::softmax_model softmax(data, 1, 3, batch, 1, 1e-4f);
    CHECK(steps_without_malloc(softmax) > 1.0);
    fashion::mlp_model mlp(data, 2, 3, batch, 1, 1e-4f, 256);
    CHECK(steps_without_malloc(mlp) > 1.0);
    // The CNN at batch 256 takes minutes unoptimised (the clang-asan stage): batch 32 there.
    if (batch > 32 && !asyncps::test::optimized_build) continue;
    fashion::cnn_model cnn(data, 0, 3, batch, 1, 1e-4f);  // the default channels
    cnn.set_augmentation({true, 2});
    CHECK(steps_without_malloc(cnn) > 1.0);
    fashion::cnn_model hidden_cnn(data, 0, 3, batch, 1, 1e-4f, 16, 32, 128);
    CHECK(steps_without_malloc(hidden_cnn) > 1.0);
  }
#else
  MESSAGE("skipped: needs EIGEN_RUNTIME_NO_MALLOC (the asyncps test targets define it)");
#endif
}

TEST_CASE("CNN augmentation: flip_shift mirrors and moves with zero fill; bad shifts rejected") {
  std::vector<float> in(784);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i + 1);  // no zeros
  std::vector<float> out(784, -1.0f);
  const auto at = [](const std::vector<float>& v, int y, int x) {
    return v[static_cast<std::size_t>(y * 28 + x)];
  };
  fashion::detail::flip_shift(in.data(), false, 0, 0, out.data());
  CHECK(out == in);
  fashion::detail::flip_shift(in.data(), true, 0, 0, out.data());
  CHECK(at(out, 0, 0) == at(in, 0, 27));
  CHECK(at(out, 5, 3) == at(in, 5, 24));
  fashion::detail::flip_shift(in.data(), false, 2, -1, out.data());  // right 2, up 1
  CHECK(at(out, 0, 0) == 0.0f);                                      // uncovered columns
  CHECK(at(out, 27, 5) == 0.0f);                                     // uncovered bottom row
  CHECK(at(out, 0, 2) == at(in, 1, 0));
  CHECK(at(out, 26, 27) == at(in, 27, 25));
  fashion::detail::flip_shift(in.data(), true, 1, 0, out.data());  // mirror, then right 1
  CHECK(at(out, 3, 0) == 0.0f);
  CHECK(at(out, 3, 1) == at(in, 3, 27));
  CHECK(at(out, 3, 27) == at(in, 3, 1));
  std::size_t zeros = 0;
  for (float v : out) zeros += v == 0.0f ? 1 : 0;
  CHECK(zeros == 28);  // one column

  const auto data = synthetic_dataset(8, 3);
  fashion::cnn_model cnn(data, 0, 1, 4, 1, 0.0f, 2, 2);
  CHECK_THROWS_AS(cnn.set_augmentation({false, 28}), std::invalid_argument);
  CHECK(!cnn.get_augmentation().flip);
  cnn.set_augmentation({true, 27});
  CHECK(cnn.get_augmentation().max_shift == 27);
  // Augmented minibatches change the gradient, deterministically from the seed.
  const auto gradient = [&](fashion::augmentation a, std::uint64_t seed) {
    fashion::cnn_model m(data, 0, 1, 4, seed, 0.0f, 2, 2);
    m.set_augmentation(a);
    const auto params = random_parameters(m.tables(), 17, 0.05f);
    std::vector<float> grad(params.size());
    const asyncps::parameter_view p(m.tables(), params.data());
    asyncps::gradient_view g(m.tables(), grad.data());
    static_cast<void>(m.compute_gradient(p, g));
    return grad;
  };
  CHECK(gradient({true, 2}, 5) == gradient({true, 2}, 5));
  CHECK(gradient({true, 2}, 5) != gradient({}, 5));
}

TEST_CASE("load_idx reads a well-formed pair of files") {
  const temp_dir dir;
  const auto images = dir.path / "images.gz";
  const auto labels = dir.path / "labels.gz";
  write_gz(images, image_bytes(2051, 3, 3 * 784));
  write_gz(labels, label_bytes(2049, 3, {0, 9, 4}));
  const auto r = fashion::load_idx(images, labels);
  REQUIRE_MESSAGE(r.has_value(), (r.has_error() ? r.error().message : std::string()));
  const auto& d = r.value();
  CHECK(d.size() == 3);
  CHECK(d.images.rows() == 3);
  CHECK(d.images.cols() == 784);
  CHECK(d.labels == std::vector<std::uint8_t>{0, 9, 4});
  CHECK(d.images(0, 0) == 0.0f);
  CHECK(d.images(0, 255) == 1.0f);
  CHECK(d.images(2, 783) == doctest::Approx(static_cast<float>((2 * 784 + 783) % 256) / 255.0f));
}

TEST_CASE("load_idx with a partition keeps only that part, and a model over it trains as over "
          "the whole file") {
  const temp_dir dir;
  const auto images = dir.path / "images.gz";
  const auto labels = dir.path / "labels.gz";
  constexpr std::uint32_t n = 2500;  // several 1024-image read chunks
  std::vector<unsigned char> ys(n);
  for (std::uint32_t i = 0; i < n; ++i) ys[i] = static_cast<unsigned char>((i * 7) % 10);
  write_gz(images, image_bytes(2051, n, std::size_t{n} * 784));
  write_gz(labels, label_bytes(2049, n, ys));
  const auto whole = fashion::load_idx(images, labels);
  REQUIRE(whole.has_value());
  CHECK(whole.value().first == 0);
  CHECK(whole.value().file_size() == n);
  for (std::uint32_t part = 0; part < 3; ++part) {
    CAPTURE(part);
    const auto r = fashion::load_idx(images, labels, {part, 3});
    REQUIRE_MESSAGE(r.has_value(), (r.has_error() ? r.error().message : std::string()));
    const auto& d = r.value();
    const auto range = asyncps::shard_range(n, part, 3);
    CHECK(d.first == range.begin);
    CHECK(d.size() == range.size());
    CHECK(d.file_size() == n);
    CHECK(d.images == whole.value().images.middleRows(range.begin, range.size()));
    CHECK(std::equal(d.labels.begin(), d.labels.end(), whole.value().labels.begin() + range.begin));
    // A worker's model over its part draws the same minibatches as over the whole file.
    fashion::softmax_model over_part(d, part, 3, 16, 5), over_whole(whole.value(), part, 3, 16, 5);
    std::vector<float> params(asyncps::layout_size(over_part.tables()), 0.01f);
    std::vector<float> g1(params.size()), g2(params.size());
    const asyncps::parameter_view p(over_part.tables(), params.data());
    asyncps::gradient_view v1(over_part.tables(), g1.data()), v2(over_part.tables(), g2.data());
    for (int step = 0; step < 60; ++step) {  // > 1 epoch of the part (833 or 834 examples)
      CHECK(over_part.compute_gradient(p, v1) == over_whole.compute_gradient(p, v2));
      REQUIRE(g1 == g2);
    }
    // Another worker's shard is not in this part.
    CHECK_THROWS_AS(fashion::softmax_model(d, (part + 1) % 3, 3, 16, 5), std::invalid_argument);
  }
  const auto bad = fashion::load_idx(images, labels, {3, 3});
  REQUIRE(bad.has_error());
  CHECK(contains(bad.error().message, "partition 3 of 3 does not exist"));
}

TEST_CASE("load_idx reports what is wrong and with which file") {
  const temp_dir dir;
  const auto images = dir.path / "images.gz";
  const auto labels = dir.path / "labels.gz";
  const auto expect_error = [](const fashion::load_result<fashion::dataset>& r,
                               const std::filesystem::path& file, const std::string& what) {
    REQUIRE(r.has_error());
    INFO(r.error().message);
    CHECK(r.error().code == asyncps::errc::bad_file);
    CHECK(r.error().code == asyncps::condition::fatal);
    CHECK(contains(r.error().message, file.string() + ": "));
    CHECK(contains(r.error().message, what));
  };

  SUBCASE("missing file") {
    write_gz(labels, label_bytes(2049, 1, {1}));
    const auto r = fashion::load_idx(images, labels);
    expect_error(r, images, "missing (install the Debian package dataset-fashion-mnist");
    try {
      static_cast<void>(r.value());
      FAIL("value() of a failure must throw");
    } catch (const std::system_error& e) {
      CHECK(e.code() == asyncps::errc::bad_file);
      CHECK(contains(e.what(), images.string()));
    }
  }
  SUBCASE("missing label file") {
    write_gz(images, image_bytes(2051, 1, 784));
    expect_error(fashion::load_idx(images, labels), labels, "missing");
  }
  SUBCASE("bad image magic") {
    write_gz(images, image_bytes(1234, 1, 784));
    write_gz(labels, label_bytes(2049, 1, {1}));
    expect_error(fashion::load_idx(images, labels), images, "bad magic 1234 (expected 2051)");
  }
  SUBCASE("bad label magic") {
    write_gz(images, image_bytes(2051, 1, 784));
    write_gz(labels, label_bytes(2051, 1, {1}));
    expect_error(fashion::load_idx(images, labels), labels, "bad magic 2051 (expected 2049)");
  }
  SUBCASE("wrong image size") {
    write_gz(images, image_bytes(2051, 1, 32 * 32, 32, 32));
    write_gz(labels, label_bytes(2049, 1, {1}));
    expect_error(fashion::load_idx(images, labels), images, "32 x 32 (expected 28 x 28)");
  }
  SUBCASE("truncated images") {
    write_gz(images, image_bytes(2051, 3, 2 * 784 + 100));
    write_gz(labels, label_bytes(2049, 3, {1, 2, 3}));
    expect_error(fashion::load_idx(images, labels), images, "truncated after 2 of 3 images");
  }
  SUBCASE("truncated header") {
    write_gz(images, {0, 0, 8, 3, 0});
    write_gz(labels, label_bytes(2049, 1, {1}));
    expect_error(fashion::load_idx(images, labels), images, "truncated header");
  }
  SUBCASE("trailing bytes") {
    write_gz(images, image_bytes(2051, 1, 785));
    write_gz(labels, label_bytes(2049, 1, {1}));
    expect_error(fashion::load_idx(images, labels), images, "trailing bytes after 1 images");
  }
  SUBCASE("truncated labels") {
    write_gz(images, image_bytes(2051, 3, 3 * 784));
    write_gz(labels, label_bytes(2049, 3, {1}));
    expect_error(fashion::load_idx(images, labels), labels, "truncated after 1 of 3 labels");
  }
  SUBCASE("counts differ") {
    write_gz(images, image_bytes(2051, 2, 2 * 784));
    write_gz(labels, label_bytes(2049, 3, {1, 2, 3}));
    expect_error(fashion::load_idx(images, labels), labels, "holds 3 labels but");
  }
  SUBCASE("label out of range") {
    write_gz(images, image_bytes(2051, 2, 2 * 784));
    write_gz(labels, label_bytes(2049, 2, {1, 10}));
    expect_error(fashion::load_idx(images, labels), labels, "label 10 at index 1 (expected < 10)");
  }
  SUBCASE("empty file") {
    write_gz(images, {});
    write_gz(labels, label_bytes(2049, 1, {1}));
    expect_error(fashion::load_idx(images, labels), images, "truncated header (0 of 16 bytes)");
  }
  SUBCASE("corrupt gzip stream") {
    {
      // A gzip header (deflate, no flags) followed by bytes that are not a deflate stream.
      std::ofstream out(images, std::ios::binary);
      const unsigned char bytes[] = {0x1f, 0x8b, 8,    0,    0,    0,    0,    0,
                                     0,    3,    0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                     0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
      out.write(reinterpret_cast<const char*>(bytes), sizeof bytes);
    }
    write_gz(labels, label_bytes(2049, 1, {1}));
    expect_error(fashion::load_idx(images, labels), images, "gzip error");
  }
  SUBCASE("load_fashion_mnist names the first missing file") {
    const auto r = fashion::load_fashion_mnist(dir.path);
    REQUIRE(r.has_error());
    CHECK(contains(r.error().message, (dir.path / "train-images-idx3-ubyte.gz").string()));
  }
}

TEST_CASE("load_fashion_mnist reads the installed data set") {
  const auto dir = fashion::default_data_dir();
  if (!std::filesystem::exists(dir / "train-images-idx3-ubyte.gz")) {
    MESSAGE("skipped: ", dir.string(), " not installed (Debian package dataset-fashion-mnist)");
    return;
  }
  const auto r = fashion::load_fashion_mnist(dir);
  REQUIRE_MESSAGE(r.has_value(), (r.has_error() ? r.error().message : std::string()));
  const auto& [train, test] = r.value();
  CHECK(train.size() == 60000);
  CHECK(test.size() == 10000);
  CHECK(train.images.rows() == 60000);
  CHECK(test.images.cols() == 784);
  CHECK(*std::max_element(train.labels.begin(), train.labels.end()) == 9);
  CHECK(*std::max_element(test.labels.begin(), test.labels.end()) == 9);
  CHECK(train.images.minCoeff() >= 0.0f);
  CHECK(train.images.maxCoeff() <= 1.0f);
  // Fashion-MNIST is balanced: 6,000 training and 1,000 test examples per class.
  CHECK(std::count(train.labels.begin(), train.labels.end(), 3) == 6000);
  CHECK(std::count(test.labels.begin(), test.labels.end(), 7) == 1000);
}
