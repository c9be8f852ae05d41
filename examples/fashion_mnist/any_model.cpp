// fashion_mnist — `any_model` and `load_data` (declared in any_model.hpp): the only translation
// unit that compiles the models' Eigen kernels (models.hpp).
#include "any_model.hpp"

#include <chrono>
#include <iostream>
#include <thread>
#include <tuple>
#include <variant>

#include "models.hpp"

namespace fashion {

struct any_model::impl {
  using variant = std::variant<fashion::softmax_model, fashion::mlp_model, fashion::cnn_model>;
  impl(const config& c, const fashion::dataset& train, std::uint32_t shard, std::uint32_t shards)
      : m(make(c, train, shard, shards)), decay_at(c.decay_at), factor(c.decay_factor),
        slow(any_model::is_slow(c, shard) ? c.slow_factor : 1.0) {}
  static variant make(const config& c, const fashion::dataset& train, std::uint32_t shard,
                      std::uint32_t shards) {
    if (c.model == "mlp") {
      return variant(std::in_place_type<fashion::mlp_model>, train, shard, shards, c.batch, c.seed,
                     c.l2, c.hidden);
    }
    if (c.model == "cnn") {
      variant v(std::in_place_type<fashion::cnn_model>, train, shard, shards, c.batch, c.seed, c.l2,
                fashion::cnn_model::default_channels1, fashion::cnn_model::default_channels2,
                c.hidden);
      std::get<fashion::cnn_model>(v).set_augmentation({c.flip, c.max_shift});
      return v;
    }
    return variant(std::in_place_type<fashion::softmax_model>, train, shard, shards, c.batch,
                   c.seed, c.l2);
  }
  variant m;
  double decay_at;
  float factor;
  double slow;
};

any_model::any_model(const config& c, const fashion::dataset& train, std::uint32_t shard,
                     std::uint32_t shards)
    : impl_(std::make_unique<impl>(c, train, shard, shards)) {}
any_model::any_model(any_model&&) noexcept = default;
any_model& any_model::operator=(any_model&&) noexcept = default;
any_model::~any_model() = default;

std::span<const asyncps::table_spec> any_model::tables() const {
  return std::visit([](const auto& m) { return m.tables(); }, impl_->m);
}

float any_model::compute_gradient(const asyncps::parameter_view& p, asyncps::gradient_view& g) {
  const auto t0 = clock_type::now();
  const float loss = std::visit([&](auto& m) { return m.compute_gradient(p, g); }, impl_->m);
  if (impl_->slow > 1) std::this_thread::sleep_for((clock_type::now() - t0) * (impl_->slow - 1));
  if (impl_->decay_at >= 0 && epoch() >= impl_->decay_at) {
    for (asyncps::table_id t = 0; t < g.tables().size(); ++t) {
      const auto s = g.span(t);
      Eigen::Map<Eigen::ArrayXf>(s.data(), static_cast<Eigen::Index>(s.size())) *= impl_->factor;
    }
  }
  return loss;
}

double any_model::epoch() const {
  return std::visit([](const auto& m) { return m.epoch(); }, impl_->m);
}

evaluation any_model::evaluate(const asyncps::parameter_view& p, const fashion::dataset& t) const {
  return std::visit([&](const auto& m) { return std::decay_t<decltype(m)>::evaluate(p, t, 1000); },
                    impl_->m);
}

bool load_data(const config& c, fashion::dataset& train, fashion::dataset& test,
               std::vector<asyncps::table_spec>& layout) {
  // The layout depends on the model's flags only: a model over one blank example tells it.
  fashion::dataset blank;
  blank.images = asyncps::row_matrix::Zero(1, static_cast<Eigen::Index>(fashion::image_pixels));
  blank.labels = {0};
  const any_model probe(c, blank, 0, 1);
  layout.assign(probe.tables().begin(), probe.tables().end());
  if (c.role == "server" || c.role == "master") return true;  // servers train on no data
  // A worker process keeps only its own part of the training set.
  const fashion::partition part =
      c.role == "worker" ? fashion::partition{c.worker_id, c.workers} : fashion::partition{};
  auto loaded = fashion::load_fashion_mnist(c.data, part);
  if (!loaded) {
    std::cerr << "fashion_mnist: " << loaded.error().message << '\n';
    return false;
  }
  std::tie(train, test) = std::move(loaded).value();
  return true;
}

}  // namespace fashion
