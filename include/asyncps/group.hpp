// asyncps — group servers against stragglers (HiPC 2018, "Balancing stragglers against
// staleness"; protocol reconstructed in docs/concepts/groups.md).
//
// Workers form groups. Each group trains synchronously (BSP) on its own group server; group
// servers update a central server asynchronously (ASP). A straggler then slows only its own
// group, and the number of groups bounds how stale the central model's updates can be.
//
// A group server is composed of the library's two loops, unchanged:
// - a `basic_server<Transport, consistency::bsp>` that serves the group's workers, and
// - a `basic_worker<group_link, Transport, consistency::asp>` that is one worker of the central
//   servers: its "model", `group_link`, waits for the group's progress and pushes it.
// The central servers are plain `basic_server<Transport, consistency::asp>` (learning rate 1)
// over `central_layout(model, groups)`.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/transport_time.hpp"
#include "asyncps/detail/wait_group.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/recovery/none.hpp"
#include "asyncps/server.hpp"
#include "asyncps/staleness.hpp"
#include "asyncps/table.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/worker.hpp"

namespace asyncps {

/// Which group each worker trains in. Workers of group g get the local ids 0..n_g-1 on their
/// group server, in increasing global id.
struct group_plan {
  std::uint32_t groups = 1;               ///< number of groups
  std::vector<std::uint32_t> group_of{};  ///< group of worker w (global id)

  /// The global ids of group `g`'s workers, increasing. Precondition: `g < groups`.
  std::vector<std::uint32_t> members(std::uint32_t g) const {
    std::vector<std::uint32_t> out;
    for (std::uint32_t w = 0; w < group_of.size(); ++w)
      if (group_of[w] == g) out.push_back(w);
    return out;
  }
  /// Worker `w`'s id on its group server. Precondition: `w < group_of.size()`.
  std::uint32_t local_id(std::uint32_t w) const {
    std::uint32_t id = 0;
    for (std::uint32_t v = 0; v < w; ++v)
      if (group_of[v] == group_of[w]) ++id;
    return id;
  }
  friend bool operator==(const group_plan&, const group_plan&) = default;
};

namespace detail {
inline void check_groups(std::size_t workers, std::uint32_t groups, const char* who) {
  if (groups == 0 || groups > workers)
    throw std::invalid_argument(std::string("asyncps::") + who + ": groups must be in [1, " +
                                std::to_string(workers) + "] (got " + std::to_string(groups) + ")");
}
}  // namespace detail

/// Groups by worker id: contiguous blocks of ids, sizes differing by at most one (the split
/// `shard_range` uses). Throws `std::invalid_argument` unless `1 <= groups <= workers`.
inline group_plan groups_by_id(std::uint32_t workers, std::uint32_t groups) {
  detail::check_groups(workers, groups, "groups_by_id");
  group_plan p{groups, std::vector<std::uint32_t>(workers)};
  for (std::uint32_t g = 0; g < groups; ++g) {
    const key_range r = shard_range(workers, g, groups);
    for (row_id w = r.begin; w < r.end; ++w) p.group_of[w] = g;
  }
  return p;
}

/// Groups by measured speed: workers sorted by `seconds_per_clock` (fastest first; ties by id)
/// fill the groups in order with the same sizes as `groups_by_id`, so the slowest workers share
/// the last group and a straggler holds back as few others as possible. Regroup by calling it
/// again with fresh measurements (e.g. `worker_stats::compute_seconds / clocks`) and comparing
/// the plans. Throws `std::invalid_argument` unless `1 <= groups <= size` and every time is
/// finite and >= 0.
inline group_plan groups_by_speed(std::span<const double> seconds_per_clock, std::uint32_t groups) {
  const auto n = static_cast<std::uint32_t>(seconds_per_clock.size());
  detail::check_groups(n, groups, "groups_by_speed");
  for (double s : seconds_per_clock)
    if (!(s >= 0) || s == std::numeric_limits<double>::infinity())
      throw std::invalid_argument("asyncps::groups_by_speed: times must be finite and >= 0");
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return seconds_per_clock[a] < seconds_per_clock[b];
  });
  group_plan p{groups, std::vector<std::uint32_t>(n)};
  for (std::uint32_t g = 0; g < groups; ++g) {
    const key_range r = shard_range(n, g, groups);
    for (row_id i = r.begin; i < r.end; ++i) p.group_of[order[i]] = g;
  }
  return p;
}

/// The central servers' layout for `groups` group servers: the model's tables, then one
/// counter table (`groups` rows x 1 float) in which group g's pushes count up row g. The
/// counters let a group measure how many other groups' updates its progress did not see.
inline std::vector<table_spec> central_layout(std::span<const table_spec> model,
                                              std::uint32_t groups) {
  std::vector<table_spec> out(model.begin(), model.end());
  out.push_back(table_spec{static_cast<table_id>(model.size()), groups, 1, 0.0f});
  return out;
}

/// Configuration of a group server's central side.
struct group_options {
  std::uint32_t group = 0;   ///< this group's index, < groups (its worker id at the central)
  std::uint32_t groups = 1;  ///< number of groups (rows of the central counter table)
  /// Group clocks per central push (H). 1: after every group clock.
  std::uint32_t push_every = 1;
  /// Clocks the group's workers run; the last push follows the group's last clock.
  std::uint64_t group_clocks = 0;
  /// Scale each push by 1 / max(1, staleness), staleness being the other groups' central
  /// updates the push did not see (Zhang et al., IJCAI 2016). Off: every push at full weight.
  bool scale_by_staleness = false;
  /// How often the link re-checks the group's clock if a wake-up were missed (the group
  /// server's `on_clock` wakes it at once).
  std::chrono::milliseconds wait_timeout{std::chrono::seconds(1)};
};

/// The central side of a group server, as a `model` for `basic_worker` (see
/// `async_gradient_source`): each "gradient" is the group's progress since its last push.
///
/// `async_compute_gradient(p, g)`, given the central view `p` (central layout), waits until
/// the group server's clock has advanced `push_every` clocks (or reached `group_clocks`), then:
/// Δ = group values − values at the last sync; τ = counter rows of other groups in `p` minus
/// those at the last sync; α = 1/max(1, τ) or 1; g = −αΔ (central learning rate 1) and −1 on
/// this group's counter row; and the group server adopts `p + αΔ`, so the group goes on from
/// the central model plus its own progress. Runs on the worker's executor, which must be the
/// group server's (the values are read and replaced between two of its messages).
template <class GroupServer>
class group_link {
 public:
  using timer_type = detail::transport_timer_t<typename GroupServer::transport_type>;

  /// `server` is this group's server (one shard holding every row). Throws
  /// `std::invalid_argument` when it is sharded or `opts` is inconsistent.
  group_link(GroupServer& server, group_options opts)
      : server_(server), opts_(opts), wake_(server.transport().get_executor()) {
    if (server.options().num_shards != 1)
      throw std::invalid_argument("asyncps::group_link: the group server must be one shard");
    if (opts_.group >= opts_.groups || opts_.push_every == 0 || opts_.group_clocks == 0)
      throw std::invalid_argument(
          "asyncps::group_options: need group < groups, push_every > 0, group_clocks > 0");
    model_tables_ = server.options().tables;
    layout_ = central_layout(model_tables_, opts_.groups);
    const std::size_t n = layout_size(model_tables_);
    base_.resize(n);
    next_.resize(n);
    base_counts_.assign(opts_.groups, 0.0f);
    rebase();
  }

  /// The central layout (`central_layout(group tables, groups)`).
  std::span<const table_spec> tables() const noexcept { return layout_; }

  /// Number of central pushes a run of `group_clocks` group clocks makes.
  std::uint64_t pushes() const noexcept {
    return (opts_.group_clocks + opts_.push_every - 1) / opts_.push_every;
  }

  /// See the class comment. Returns the L2 norm of the pushed update (there is no loss). After
  /// `stop()` it no longer waits: it pushes whatever progress the group made.
  asio::awaitable<float> async_compute_gradient(const parameter_view& p, gradient_view& g) {
    const clock_value target = std::min<clock_value>(synced_ + opts_.push_every,
                                                     static_cast<clock_value>(opts_.group_clocks));
    while (server_.clock() < target && !stopped_) {
      wake_.expires_after(opts_.wait_timeout);  // notify() and stop() cut it short
      co_await wake_.async_wait(detail::use_tuple);
    }
    synced_ = server_.clock();
    // Staleness: other groups' pushes in the central view since this group's last sync.
    const auto counts = p.span(static_cast<table_id>(model_tables_.size()));
    double tau = 0;
    for (std::uint32_t k = 0; k < opts_.groups; ++k)
      if (k != opts_.group) tau += std::max(0.0f, counts[k] - base_counts_[k]);
    const auto tau_clocks = static_cast<clock_value>(std::llround(tau));
    staleness_.record(tau_clocks);
    const float alpha = opts_.scale_by_staleness
                            ? 1.0f / static_cast<float>(std::max<clock_value>(1, tau_clocks))
                            : 1.0f;
    copy_group_values(next_);  // the group's values now
    const auto n = static_cast<Eigen::Index>(next_.size());
    Eigen::Map<Eigen::VectorXf> now(next_.data(), n);
    Eigen::Map<Eigen::VectorXf> base(base_.data(), n);
    now -= base;  // Δ
    now *= alpha;
    float norm = now.norm();
    std::size_t off = 0;
    for (table_id t = 0; t < model_tables_.size(); ++t) {
      auto gt = g.span(t);
      const auto pt = p.span(t);
      for (std::size_t i = 0; i < gt.size(); ++i) {
        gt[i] = -next_[off + i];
        next_[off + i] += pt[i];  // p + αΔ
      }
      off += gt.size();
    }
    auto gc = g.span(static_cast<table_id>(model_tables_.size()));
    std::fill(gc.begin(), gc.end(), 0.0f);
    gc[opts_.group] = -1.0f;
    off = 0;
    for (table_id t = 0; t < model_tables_.size(); ++t) {
      const std::size_t sz = model_tables_[t].size();
      server_.set_values(t, std::span<const float>(next_.data() + off, sz));
      off += sz;
    }
    base_.swap(next_);
    std::copy(counts.begin(), counts.end(), base_counts_.begin());
    base_counts_[opts_.group] += 1.0f;
    ++pushed_;
    co_return norm;
  }

  /// Takes the group server's current values as the last sync point. The constructor does it;
  /// call it again after replacing the group's values before it serves (e.g. when a new
  /// grouping starts from the central model). They must equal the central model's then.
  void rebase() { copy_group_values(base_); }
  /// Wakes a waiting `async_compute_gradient` (call from the group server's `on_clock`).
  void notify() { wake_.cancel(); }
  /// The group server stopped: stop waiting for its progress.
  void stop() {
    stopped_ = true;
    wake_.cancel();
  }
  /// Staleness τ of each push: other groups' central updates it did not see.
  const staleness_histogram& staleness() const noexcept { return staleness_; }
  /// Pushes made so far.
  std::uint64_t pushed() const noexcept { return pushed_; }

 private:
  void copy_group_values(std::vector<float>& out) const {
    std::size_t off = 0;
    for (table_id t = 0; t < model_tables_.size(); ++t) {
      const auto v = server_.values(t);
      std::copy(v.begin(), v.end(), out.begin() + static_cast<std::ptrdiff_t>(off));
      off += v.size();
    }
  }

  GroupServer& server_;
  group_options opts_;
  timer_type wake_;
  std::vector<table_spec> model_tables_;
  std::vector<table_spec> layout_;
  std::vector<float> base_;         // group values at the last sync
  std::vector<float> next_;         // scratch: Δ, then the values the group adopts
  std::vector<float> base_counts_;  // central push counters at the last sync
  clock_value synced_ = 0;
  bool stopped_ = false;
  std::uint64_t pushed_ = 0;
  staleness_histogram staleness_{};
};

/// A group server: a BSP server for its group's workers plus one ASP worker of the central
/// servers, composed from `basic_server` and `basic_worker` (see the file comment).
///
/// Thread safety: every member on `transport.get_executor()`; the group server and its central
/// link share that executor. Lifetime: the transport outlives it; `async_run` must complete
/// before it is destroyed.
template <transport Transport, optimizer_policy Optimizer = optimizer::sgd>
class basic_group_server {
 public:
  using server_type = basic_server<Transport, consistency::bsp, recovery::none, Optimizer>;
  using link_model_type = group_link<server_type>;
  using link_type = basic_worker<link_model_type, Transport, consistency::asp>;
  using endpoint_type = typename Transport::endpoint_type;

  /// `group`: the group server's options (`num_shards` 1, `num_workers` = the group's size,
  /// `tables` = the model's layout, the same `seed` as the central servers so both start
  /// equal). `central`: the link's worker options (`servers` = the central shards; its `id`
  /// and `local_step` are set here to `link.group` and 1). Throws `std::invalid_argument` on
  /// inconsistent options.
  basic_group_server(Transport& transport, server_options group,
                     worker_options<endpoint_type> central, group_options link, Optimizer opt = {})
      : server_(transport, with_hook(std::move(group)), opt), model_(server_, link),
        link_(transport, model_, with_id(std::move(central), link.group)) {}

  /// Serves the group on `acceptor` and pushes its progress to the central servers until the
  /// group has run `group_clocks` clocks and the last of it is pushed; then stops the group
  /// server. The group's workers must run exactly `group_clocks` clocks. When the group
  /// server stops first (`group_server().stop()`), the link pushes the progress made so far
  /// and ends. Completes with the central link's error (`errc::server_lost`, `errc::timeout`,
  /// a connect error) or success.
  asio::awaitable<std::error_code> async_run(typename Transport::acceptor_type acceptor) {
    detail::wait_group<detail::transport_timer_t<Transport>> serving(
        server_.transport().get_executor());
    serving.add();
    asio::co_spawn(
        server_.transport().get_executor(),
        [&]() -> asio::awaitable<void> {
          (void)co_await server_.async_serve(std::move(acceptor));
          // Stopped early (or done): the link pushes the progress made, then ends, instead
          // of pushing nothing once per group clock left.
          model_.stop();
          link_.stop_at(link_.clock() + 1);
          serving.done();
        },
        asio::detached);
    const std::error_code ec = co_await link_.async_run(model_.pushes());
    server_.stop();
    co_await serving.async_wait();
    co_return ec;
  }

  /// The group's BSP server (its stats, values).
  server_type& group_server() noexcept { return server_; }
  /// The central link (its stats; `staleness()` is the ASP view staleness in clocks).
  link_type& central_link() noexcept { return link_; }
  /// The group's progress pushes (their staleness in other groups' updates).
  const link_model_type& link_model() const noexcept { return model_; }
  /// Starts the group from `values` (the model's tables, table-major, e.g. the central
  /// model's current values when regrouping). Before `async_run`. Throws
  /// `std::invalid_argument` when the size differs or a value is not finite.
  void set_values(std::span<const float> values) {
    std::size_t off = 0;
    const auto& tables = server_.options().tables;
    if (values.size() != layout_size(tables))
      throw std::invalid_argument("asyncps::basic_group_server::set_values: expected " +
                                  std::to_string(layout_size(tables)) + " floats, got " +
                                  std::to_string(values.size()));
    for (table_id t = 0; t < tables.size(); ++t) {
      server_.set_values(t, values.subspan(off, tables[t].size()));
      off += tables[t].size();
    }
    model_.rebase();
  }

 private:
  server_options with_hook(server_options o) {
    o.on_clock = [this](clock_value) { model_.notify(); };
    return o;
  }
  static worker_options<endpoint_type> with_id(worker_options<endpoint_type> o, std::uint32_t id) {
    o.id = id;
    o.local_step = 1.0f;
    return o;
  }

  server_type server_;
  link_model_type model_;
  link_type link_;
};

}  // namespace asyncps
