// model_reader — how the asyncps examples evaluate the servers' model: a blocking read of it
// as a reader (`read_servers_model`: asyncps::async_read_model over an io_context and a TCP
// transport of its own), and a thread that runs one such evaluation at a time
// (`single_job_thread`), so that worker 0 never waits for one. Shared by
// examples/fashion_mnist (monitor.hpp's evaluator, train_groups.cpp's final central read) and
// examples/matrix_factorization (mf_trainer's evaluator).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/thread_pool.hpp>

#include "asyncps/reader.hpp"
#include "asyncps/transport/tcp.hpp"

namespace asyncps::examples {

/// Reads the servers' model into `out` (`layout_size(layout)` floats, table-major) as a reader,
/// blocking the calling thread for at most about `timeout` per step: asyncps::async_read_model
/// over an io_context and a TCP transport of its own, with `options`' secret and TLS.
/// `min_clock`: each shard answers once its server clock has reached it (0: at once). Returns
/// the error, empty on success: the line async_read_model logged (it names the server and what
/// failed: nobody listening, a refused secret, a layout mismatch, a timeout), else its error
/// code's message. Thread safety: reentrant (every call has its own io_context and transport).
inline std::string read_servers_model(std::span<const tcp_transport::endpoint_type> servers,
                                      std::span<const table_spec> layout, std::span<float> out,
                                      const tcp_options& options, std::chrono::milliseconds timeout,
                                      clock_value min_clock = 0) {
  asio::io_context io(1);
  tcp_transport t(io.get_executor(), options);
  std::error_code ec;
  std::string why;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        ec = co_await async_read_model(
            t, servers, layout, out, timeout, [&why](std::string_view l) { why = l; }, min_clock);
      },
      asio::detached);
  io.run();
  if (ec) return why.empty() ? ec.message() : why;
  return {};
}

/// A thread that runs one job at a time, for background evaluations (an `asio::thread_pool`
/// of one thread). `try_start` hands it a job unless one is accepted and not finished yet (then
/// it returns false and drops the job); `stop` lets an accepted job run to its end, then joins
/// the thread (idempotent; the destructor calls it). Thread safety: `try_start` and `stop`
/// from any thread, but not concurrently with each other; a job must not call either.
class single_job_thread {
 public:
  single_job_thread() = default;
  single_job_thread(const single_job_thread&) = delete;
  single_job_thread& operator=(const single_job_thread&) = delete;
  ~single_job_thread() { stop(); }

  /// Runs `job` on this thread unless a job is pending or running, or `stop` was called.
  bool try_start(std::function<void()> job) {
    if (stopping_ || busy_.exchange(true)) return false;
    asio::post(pool_, [this, job = std::move(job)] {
      job();
      busy_ = false;
    });
    return true;
  }

  void stop() {
    stopping_ = true;
    pool_.join();
  }

 private:
  asio::thread_pool pool_{1};
  std::atomic<bool> busy_{false};  // a job is accepted and has not finished
  std::atomic<bool> stopping_{false};
};

}  // namespace asyncps::examples
