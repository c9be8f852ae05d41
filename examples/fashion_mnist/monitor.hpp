// fashion_mnist — progress and metrics of the workers of this process (`monitor`): the
// training loss, the divergence test, the evaluations (of worker 0's view, or of the servers'
// model read on a thread of its own, `evaluator`), the metrics file and the progress line.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

#include "../common/model_reader.hpp"
#include "any_model.hpp"
#include "asyncps/asyncps.hpp"
#include "config.hpp"
#include "dataset.hpp"

namespace fashion {

// Evaluates on a thread of its own, so that worker 0 does not wait for it: the servers' model,
// read as a reader (asyncps::examples::read_servers_model, with the run's secret and TLS),
// and/or a copy of worker 0's view. One evaluation at a time: a request made while one runs is
// refused (the caller then evaluates worker 0's view itself).
class evaluator {
 public:
  // What one evaluation produced: the servers' model's (when read) and worker 0's view's
  // (when asked for, or when the servers were not read: `servers_error` says why).
  struct result {
    std::optional<evaluation> servers;
    std::optional<evaluation> worker;
    std::string servers_error;
  };

  evaluator(std::vector<asyncps::tcp_transport::endpoint_type> servers,
            std::vector<asyncps::table_spec> layout, asyncps::tcp_options options,
            const any_model& model, const fashion::dataset& test)
      : servers_(std::move(servers)), layout_(std::move(layout)), options_(std::move(options)),
        model_(model), test_(test), params_(asyncps::layout_size(layout_)) {}

  // Starts an evaluation of the servers' model (each shard once its server clock reached
  // `min_clock`) and, when `both`, of `worker_view` (worker 0's parameters, copied by the
  // caller); `done(result)` runs on the evaluator's thread. False when one is running.
  bool start(std::vector<float> worker_view, bool both, asyncps::clock_value min_clock,
             std::function<void(const result&)> done) {
    return jobs_.try_start(
        [this, view = std::move(worker_view), both, min_clock, done = std::move(done)] {
          result r;
          r.servers_error = read_servers(min_clock);
          if (r.servers_error.empty())
            r.servers = model_.evaluate(asyncps::parameter_view(layout_, params_.data()), test_);
          if (both || !r.servers)
            r.worker = model_.evaluate(asyncps::parameter_view(layout_, view.data()), test_);
          done(r);
        });
  }
  // Reads the servers' model now, on the calling thread (after `stop`), into `out`. Returns
  // the error, empty on success.
  std::string read_now(std::vector<float>& out, asyncps::clock_value min_clock) {
    std::string error = read_servers(min_clock);
    if (error.empty()) out = params_;
    return error;
  }
  // Lets a started evaluation finish, then joins the evaluator's thread.
  void stop() { jobs_.stop(); }

 private:
  std::string read_servers(asyncps::clock_value min_clock) {
    return asyncps::examples::read_servers_model(servers_, layout_, params_, options_,
                                                 std::chrono::seconds(2), min_clock);
  }

  std::vector<asyncps::tcp_transport::endpoint_type> servers_;
  std::vector<asyncps::table_spec> layout_;
  asyncps::tcp_options options_;
  const any_model& model_;
  const fashion::dataset& test_;
  std::vector<float> params_;                  // the servers' model, as read
  asyncps::examples::single_job_thread jobs_;  // last: stopped before the members above go
};

// Progress and metrics shared by the workers of this process.
struct monitor {
  monitor(const config& c, const fashion::dataset& t) : cfg(c), test(t), metrics(c.metrics) {}
  ~monitor() { stop_reader(); }
  // --eval servers|both: evaluations read the servers' model through `reader` (set once the
  // servers' addresses are known; stop it with stop_reader before the model it uses goes).
  std::unique_ptr<evaluator> reader;
  void stop_reader() {
    if (reader) reader->stop();
  }
  const config& cfg;
  const fashion::dataset& test;
  std::ofstream metrics;
  clock_type::time_point start = clock_type::now();
  std::mutex mutex;
  std::atomic<std::uint64_t> samples{0};
  double last_print = -1;
  double next_eval = 0;
  double last_accuracy = -1;
  float loss_ema = -1;
  float start_loss = -1;  // worker 0's first training loss
  // Worker 0's last `recent.size()` training losses (a ring) and their count: the divergence
  // test reads their mean, which, unlike `loss_ema`, holds nothing of the start after an
  // epoch even when an epoch is few clocks (many workers).
  std::array<float, 16> recent{};
  std::uint64_t recent_count = 0;
  // Set once worker 0's training loss turns non-finite, or its recent mean rises past twice
  // its start (or twice chance level), or is still near chance level after an epoch: every worker
  // then ends at its next clock, and the run ends with an error naming the settings (`diverged_at`:
  // the epoch, `diverged_loss`).
  std::atomic<bool> diverged{false};
  double diverged_at = 0;
  float diverged_loss = 0;
  bool tty = isatty(STDOUT_FILENO) != 0;
  bool started = false;

  double elapsed() const {
    return std::chrono::duration<double>(clock_type::now() - start).count();
  }

  // Called by worker 0 after each clock (on its executor).
  void on_clock(const asyncps::clock_report& r, const any_model& m,
                const asyncps::staleness_histogram& st) {
    std::lock_guard lock(mutex);
    if (!started) {
      started = true;
      if (cfg.on_first_clock) cfg.on_first_clock();
    }
    loss_ema = loss_ema < 0 ? r.loss : 0.98f * loss_ema + 0.02f * r.loss;
    const double epoch = m.epoch();
    const double t = elapsed();
    if (start_loss < 0 && std::isfinite(r.loss)) start_loss = r.loss;
    recent[recent_count++ % recent.size()] = r.loss;
    const std::size_t n = std::min<std::uint64_t>(recent_count, recent.size());
    float recent_mean = 0;
    for (std::size_t k = 0; k < n; ++k) recent_mean += recent[k] / static_cast<float>(n);
    // Chance level: the cross-entropy of a uniform guess over the 10 classes is ln 10; a run
    // that learns is well below it after one epoch.
    const float chance = 0.9f * std::log(10.0f);
    // Relative to chance as well as to the start: a worker that joins a trained model (a
    // late or restarted elastic worker) starts low, and its loss moves around that.
    if (!diverged && (!std::isfinite(r.loss) || recent_mean > 2 * std::max(start_loss, chance) ||
                      (epoch >= 1 && recent_mean >= chance))) {
      diverged_at = epoch;
      diverged_loss = std::isfinite(r.loss) ? recent_mean : r.loss;
      diverged = true;
    }
    if (epoch >= next_eval) {
      next_eval += cfg.eval_every;
      // --eval servers (or both): the evaluator thread reads and evaluates the servers' model
      // (test_accuracy, eval_source "servers") and, for both, worker 0's view beside it
      // (worker_test_accuracy); when the servers do not answer, worker 0's view stands in
      // (eval_source "worker", and why). --eval worker, or the evaluator busy: worker 0's
      // view (its cache at the start of this clock), evaluated here.
      nlohmann::json rec{
          {"time_s", t}, {"clock", r.clock}, {"epoch", epoch}, {"train_loss", loss_ema}};
      const auto write = [this](nlohmann::json& j, const evaluation& e, const char* source) {
        j["test_accuracy"] = e.accuracy;
        j["test_loss"] = e.loss;
        j["eval_source"] = source;
        last_accuracy = e.accuracy;
        metrics << j.dump() << '\n';
        metrics.flush();
      };
      bool started = false;
      if (reader) {
        std::vector<float> view;  // worker 0's parameters now (the evaluator reads them later)
        view.reserve(asyncps::layout_size(r.params.tables()));
        for (std::size_t k = 0; k < r.params.tables().size(); ++k) {
          const auto sp = r.params.span(static_cast<asyncps::table_id>(k));
          view.insert(view.end(), sp.begin(), sp.end());
        }
        // Past the first clocks every shard's server clock is >= 1: a shard at clock 0 then
        // is a server restarted without state that no worker has rejoined yet (stateless,
        // replica-log), whose fresh values are not the model; the read waits for it.
        const asyncps::clock_value min_clock =
            r.clock > static_cast<asyncps::clock_value>(cfg.staleness) + 1 ? 1 : 0;
        started = reader->start(std::move(view), cfg.eval == "both", min_clock,
                                [this, rec, write](const evaluator::result& res) mutable {
                                  std::lock_guard lock(mutex);
                                  rec["eval_s"] = elapsed() - rec["time_s"].get<double>();
                                  if (res.worker) {
                                    rec["worker_test_accuracy"] = res.worker->accuracy;
                                    rec["worker_test_loss"] = res.worker->loss;
                                  }
                                  if (!res.servers) rec["servers_unreadable"] = res.servers_error;
                                  write(rec, res.servers ? *res.servers : *res.worker,
                                        res.servers ? "servers" : "worker");
                                });
        if (!started) rec["servers_unreadable"] = "an earlier evaluation is still running";
      }
      if (!started) {
        const auto e = m.evaluate(r.params, test);
        write(rec, e, "worker");
      }
    }
    if (!cfg.quiet && (t - last_print >= 1.0 || last_print < 0)) {
      last_print = t;
      char line[256];
      std::snprintf(line, sizeof line,
                    "epoch %5.2f  clock %6lld  %8.0f samples/s  loss %.4f  staleness mean %.2f "
                    "max %d  test acc %s",
                    epoch, static_cast<long long>(r.clock),
                    static_cast<double>(samples.load()) / (t > 0 ? t : 1), loss_ema, st.mean(),
                    st.max(),
                    last_accuracy < 0 ? "-" : std::to_string(last_accuracy).substr(0, 6).c_str());
      std::cout << (tty ? "\r" : "") << line << (tty ? "" : "\n") << std::flush;
    }
  }
};

}  // namespace fashion
