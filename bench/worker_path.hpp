// asyncps bench — the headline figures through the real worker: one `basic_worker` (model
// `fixed_gradient`: its gradient is a fixed buffer) training against one `basic_server` shard,
// as a user's trainer runs them.
//
// Per clock the worker computes its gradient (one memcpy of the table's bytes), applies it to
// its cache (read-my-writes), pushes it whole (the table's bytes) and, when its consistency
// policy asks, pulls the table (the table's bytes back). The policy is `ssp<>` with staleness
// `window - 1`: window 1 is BSP (push, then pull the next clock's rows: one at a time, the
// worker-path form of a request/reply), window W lets the worker run W - 1 clocks ahead of the
// server (pushes in flight, a pull every W clocks or so: the pipelined form).
//
// Measured: every clock's completion time (`worker_options::on_clock`) and payload bytes (both
// directions, `worker_stats`); the thread CPU time of the server's thread and of the worker's
// thread over the whole run. The first tenth of the clocks is warm-up; the rest is split into
// `reps` equal repetitions.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/run_loop.hpp"
#include "asyncps/server.hpp"
#include "asyncps/worker.hpp"

#include "fixed_gradient.hpp"
#include "report.hpp"

namespace asyncps::bench {

/// What one worker-path run measured.
struct worker_path_result {
  std::vector<double> mbps;          ///< per repetition: payload MB/s, pushes + rows
  std::vector<double> clocks_per_s;  ///< per repetition: clocks per second
  std::vector<double> clock_us;      ///< per repetition: median clock time, us
  std::vector<double> all_clock_us;  ///< every measured clock's time, us
  double server_cpu_s = 0;           ///< the server thread's CPU seconds over the whole run
  double client_cpu_s = 0;           ///< the worker thread's CPU seconds over the whole run
  double bytes = 0;                  ///< payload bytes over the whole run, both directions
  double compute_s = 0;              ///< the worker's `compute_seconds` (the model's memcpy)
  std::uint64_t clocks = 0;
};

/// One server shard holding a `rows x 1024` float table and one worker, on `Env`'s transports
/// (bench/throughput.cpp: `tcp_env`, `in_process_env`; `mode` are its extra constructor
/// arguments): the server on its own thread (pinned to `server_cpu` when >= 0), the worker on
/// the calling thread, both run by `run_polling(ctx, spin)` (0: plain `run()`). Runs `clocks`
/// clocks at staleness `window - 1`. `gradient`: the table's floats. Throws
/// std::runtime_error when the worker fails.
template <class Env, class... Mode>
worker_path_result run_worker_path(std::uint32_t rows, unsigned window, std::uint64_t clocks,
                                   unsigned reps, std::span<const float> gradient, int server_cpu,
                                   std::chrono::microseconds spin, Mode&&... mode) {
  using transport_t = typename Env::transport_type;
  using policy = consistency::ssp<>;
  using server_t = basic_server<transport_t, policy>;
  using worker_t = basic_worker<fixed_gradient, transport_t, policy>;
  constexpr std::uint32_t width = 1024;

  asio::io_context server_ctx{1};
  asio::io_context client_ctx{1};
  Env env(server_ctx, client_ctx, std::forward<Mode>(mode)...);
  const table_spec spec{0, rows, width, 0.0f};

  server_options so;
  so.num_workers = 1;
  so.tables = {spec};
  so.log = [](std::string_view m) {
    std::fprintf(stderr, "  server: %.*s\n", static_cast<int>(m.size()), m.data());
  };
  server_t server(env.server, so);
  auto acceptor = env.listen();
  if (!acceptor) throw std::runtime_error("listen: " + acceptor.error().message());
  const auto ep = Env::endpoint(acceptor.value());
  asio::co_spawn(server_ctx, server.async_serve(std::move(acceptor).value()), asio::detached);
  worker_path_result r;
  std::thread server_thread([&] {
    pin_current_thread(server_cpu);
    run_polling(server_ctx, spin);
    r.server_cpu_s = thread_cpu_seconds();
  });

  struct sample {
    double t = 0;
    std::uint64_t bytes = 0;
  };
  std::vector<sample> log;
  log.reserve(clocks);
  fixed_gradient model;
  model.spec[0] = spec;
  model.gradient = gradient;
  const worker_t* self = nullptr;
  typename worker_t::options_type wo;
  wo.servers = {ep};
  wo.check_gradients = false;
  wo.log = [](std::string_view m) {
    std::fprintf(stderr, "  worker: %.*s\n", static_cast<int>(m.size()), m.data());
  };
  wo.on_clock = [&](const clock_report&) {
    const worker_stats& s = self->stats();
    log.push_back(
        {std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(),
         s.bytes_out + s.bytes_in});
  };
  worker_t worker(env.client, model, std::move(wo));
  self = &worker;
  worker.consistency().staleness = static_cast<clock_value>(window) - 1;
  std::error_code ec;
  asio::co_spawn(
      client_ctx, [&]() -> asio::awaitable<void> { ec = co_await worker.async_run(clocks); },
      asio::detached);
  const double cpu0 = thread_cpu_seconds();
  run_polling(client_ctx, spin);
  r.client_cpu_s = thread_cpu_seconds() - cpu0;
  asio::post(server_ctx, [&] { server.stop(); });
  server_thread.join();
  if (ec) throw std::runtime_error("worker: " + ec.message());
  if (log.size() != clocks) throw std::runtime_error("worker: fewer clocks than asked");

  const worker_stats& ws = worker.stats();
  r.bytes = static_cast<double>(ws.bytes_out + ws.bytes_in);
  r.compute_s = ws.compute_seconds;
  r.clocks = clocks;
  const std::size_t warm = std::max<std::size_t>(2, clocks / 10);
  const std::size_t per_rep = (clocks - warm) / std::max(1u, reps);
  for (unsigned k = 0; k < reps && per_rep > 0; ++k) {
    const std::size_t a = warm + k * per_rep - 1;  // the clock before the repetition
    const std::size_t b = a + per_rep;
    const double dt = log[b].t - log[a].t;
    r.mbps.push_back(dt > 0 ? static_cast<double>(log[b].bytes - log[a].bytes) / dt / 1e6 : 0.0);
    r.clocks_per_s.push_back(dt > 0 ? static_cast<double>(per_rep) / dt : 0.0);
    std::vector<double> us;
    for (std::size_t i = a + 1; i <= b; ++i) us.push_back((log[i].t - log[i - 1].t) * 1e6);
    r.clock_us.push_back(median(us));
    r.all_clock_us.insert(r.all_clock_us.end(), us.begin(), us.end());
  }
  return r;
}

}  // namespace asyncps::bench
