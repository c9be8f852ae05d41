// Step 5: training through a server failure with a recovery policy.
//
// `recovery::checkpoint` (CheckFreq-style): the server snapshots its shard every 25 server
// clocks and persists it in the background; a server started on the same directory restores
// the newest checkpoint before it accepts anyone. Here the server is killed mid-run (stopped,
// its connections cut) and a fresh one takes its place 50 ms later; the 2 workers reconnect,
// learn how many of their pushes the restore lost, and train on. The recovery policy is a
// template parameter of both the server and the workers (they must agree).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asyncps/asyncps.hpp>

#include "linear_regression.hpp"

int main() {
  using tutorial::linear_regression;
  using policy = asyncps::consistency::ssp<1>;
  using recovery = asyncps::recovery::checkpoint;
  using server_type =
      asyncps::basic_server<asyncps::in_process_transport, policy, recovery>;  // + optimizer
  using worker_type =
      asyncps::basic_worker<linear_regression, asyncps::in_process_transport, policy, recovery>;
  const asyncps::optimizer::sgd sgd{0.05f};
  const auto quiet = [](std::string_view) {};

  std::string dir = (std::filesystem::temp_directory_path() / "asyncps-tutorial-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) return std::perror("mkdtemp"), 1;
  const asyncps::recovery::checkpoint_options checkpoints{.directory = dir,
                                                          .every_clocks = 25,
                                                          .log = quiet,
                                                          .reconnect_timeout =
                                                              std::chrono::seconds(5)};

  asio::io_context io(1);
  asyncps::in_process_network network;  // in-process "network": endpoints are names
  asyncps::in_process_transport server_net(io.get_executor(), network);
  const asyncps::server_options so{
      .num_workers = 2, .tables = {linear_regression::layout[0]}, .log = quiet};
  std::optional<server_type> first, second;
  auto start = [&](std::optional<server_type>& server) {
    server.emplace(server_net, so, sgd, recovery::server_part(checkpoints));
    asio::co_spawn(io, server->async_serve(server_net.listen("shard0").value()), asio::detached);
  };
  start(first);

  // The failure: kill the server at server clock 150, start a fresh one 50 ms later.
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        asio::steady_timer timer(io);
        while (first->clock() < 150) {
          timer.expires_after(std::chrono::milliseconds(1));
          co_await timer.async_wait(asio::use_awaitable);
        }
        std::printf("server killed at server clock %ld\n", long(first->clock()));
        first->stop();
        timer.expires_after(std::chrono::milliseconds(50));
        co_await timer.async_wait(asio::use_awaitable);
        start(second);  // restores the newest checkpoint, then accepts the workers again
      },
      asio::detached);

  linear_regression models[2]{linear_regression(1), linear_regression(2)};
  std::optional<asyncps::in_process_transport> worker_nets[2];
  std::optional<worker_type> workers[2];
  std::error_code results[2];
  int running = 2;
  for (std::uint32_t id = 0; id < 2; ++id) {
    worker_nets[id].emplace(io.get_executor(), network);
    workers[id].emplace(
        *worker_nets[id], models[id],
        worker_type::options_type{
            .id = id, .servers = {"shard0"}, .local_step = sgd.local_step(), .log = quiet},
        std::nullopt, recovery::worker_part(checkpoints));
    asio::co_spawn(
        io,
        [&, id]() -> asio::awaitable<void> {
          results[id] = co_await workers[id]->async_run(400);
          if (--running == 0 && second) second->stop();
        },
        asio::detached);
  }
  io.run();
  std::filesystem::remove_all(dir);

  const auto restored = second ? second->recovery().stats().restored_clock : -1;
  std::printf("restarted server restored the checkpoint of clock %ld\n", long(restored));
  for (std::uint32_t id = 0; id < 2; ++id)
    std::printf("worker %u: %s, %lu reconnect(s), %lu push(es) lost by the restore\n", id,
                results[id] ? results[id].message().c_str() : "400 clocks",
                static_cast<unsigned long>(workers[id]->stats().reconnects),
                static_cast<unsigned long>(workers[id]->stats().lost_pushes));
  const float error = second ? linear_regression::error(second->values(0)) : 1e9f;
  std::printf("|w - w_true| = %.6f\n", error);
  const bool ok = !results[0] && !results[1] && restored >= 0 && error < 0.02f;
  std::puts(ok ? "recovered and converged" : "FAILED");
  return ok ? 0 : 1;
}
