// Step 3: a server and its workers as separate processes, talking TCP.
//
//   3_multi_process server PORT WORKERS      one server shard on 127.0.0.1:PORT (0: any port)
//   3_multi_process worker HOST:PORT ID      worker ID (0 .. WORKERS-1) of that server
//   3_multi_process                          forks a server and 2 workers on loopback (for CI)
//
// Every process runs one node on its own io_context. The server cannot know when training
// ends, so it stops itself once its clock (the slowest worker's) reaches the clock count and
// every worker has said goodbye. Exit status 0 means the run converged.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asyncps/asyncps.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include "linear_regression.hpp"

using tutorial::linear_regression;
using policy = asyncps::consistency::ssp<2>;  // servers and workers must use the same policy
constexpr asyncps::optimizer::sgd sgd{0.05f};
constexpr std::uint64_t clocks = 300;

// Serves until `clocks` server clocks and every worker gone. Writes the bound port to
// `port_fd` when it is >= 0 (the forking demo reads it).
int run_server(unsigned short port, std::uint32_t workers, int port_fd) {
  asio::io_context io(1);
  asyncps::tcp_transport net(io.get_executor());
  asyncps::server<policy> server(  // the layout given as is: no model object (and no data) here
      net, {.num_workers = workers, .tables = {linear_regression::layout[0]}}, sgd);
  auto acceptor = net.listen({asio::ip::make_address("127.0.0.1"), port});
  if (!acceptor) return std::fprintf(stderr, "listen: %s\n", acceptor.error().message().c_str()), 1;
  port = acceptor.value().local_endpoint().port();
  std::printf("server: listening on 127.0.0.1:%u for %u workers\n", port, workers);
  std::fflush(stdout);
  if (port_fd >= 0 &&
      (::write(port_fd, &port, sizeof port) != ssize_t{sizeof port} || ::close(port_fd)))
    return std::perror("write"), 1;
  asio::co_spawn(io, server.async_serve(std::move(acceptor).value()), asio::detached);
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {  // the stop condition
        asio::steady_timer timer(io);
        while (server.clock() < asyncps::clock_value{clocks} || server.connections() > 0) {
          timer.expires_after(std::chrono::milliseconds(10));
          co_await timer.async_wait(asio::use_awaitable);
        }
        server.stop();
      },
      asio::detached);
  io.run();
  const float error = linear_regression::error(server.values(0));
  std::printf("server: %ld clocks, |w - w_true| = %.6f: %s\n", long(server.clock()), error,
              error < 0.02f ? "converged" : "FAILED");
  return error < 0.02f ? 0 : 1;
}

int run_worker(const std::string& address, std::uint32_t id) {
  const auto endpoint = asyncps::parse_tcp_endpoint(address);
  if (!endpoint) return std::fprintf(stderr, "bad address '%s'\n", address.c_str()), 1;
  asio::io_context io(1);
  asyncps::tcp_transport net(io.get_executor());
  linear_regression model(id + 1);  // this worker's data
  // The read-my-writes step comes from the server's welcome (its optimizer's local_step()).
  asyncps::worker<linear_regression, policy> worker(net, model,
                                                    {.id = id, .servers = {endpoint.value()}});
  std::error_code result;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        result =
            co_await worker.async_run(clocks);  // retries the connection while the server starts
      },
      asio::detached);
  io.run();
  std::printf("worker %u: %s, |w - w_true| = %.6f in its last read\n", id,
              result ? result.message().c_str() : "done",
              linear_regression::error(worker.cache().span(0)));
  return result ? 1 : 0;
}

// No arguments: fork a server (on a port the system picks) and 2 workers, wait for all three.
int demo() {
  constexpr std::uint32_t workers = 2;
  int fds[2];
  if (::pipe(fds) != 0) return std::perror("pipe"), 1;
  std::fflush(stdout);
  const pid_t server = ::fork();
  if (server == 0) {
    ::close(fds[0]);
    const int rc = run_server(0, workers, fds[1]);
    std::fflush(stdout);  // _Exit does not flush
    std::_Exit(rc);
  }
  ::close(fds[1]);
  unsigned short port = 0;
  if (::read(fds[0], &port, sizeof port) != ssize_t{sizeof port})
    return std::puts("server failed"), 1;
  ::close(fds[0]);
  pid_t children[workers];
  for (std::uint32_t id = 0; id < workers; ++id) {
    if ((children[id] = ::fork()) == 0) {
      const int rc = run_worker("127.0.0.1:" + std::to_string(port), id);
      std::fflush(stdout);
      std::_Exit(rc);
    }
  }
  int failures = 0, status = 0;
  for (const pid_t child : children)
    failures += ::waitpid(child, &status, 0) != child || status != 0;
  if (failures > 0) ::kill(server, SIGTERM);  // it would wait for the missing clocks forever
  failures += ::waitpid(server, &status, 0) != server || status != 0;
  std::puts(failures == 0 ? "all processes succeeded" : "FAILED");
  return failures == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  const std::string role = argc > 1 ? argv[1] : "";
  if (role.empty()) return demo();
  if (role == "server" && argc == 4)
    return run_server(static_cast<unsigned short>(std::atoi(argv[2])),
                      static_cast<std::uint32_t>(std::atoi(argv[3])), -1);
  if (role == "worker" && argc == 4)
    return run_worker(argv[2], static_cast<std::uint32_t>(std::atoi(argv[3])));
  std::fprintf(stderr,
               "usage: %s [server PORT WORKERS | worker HOST:PORT ID]\n"
               "       (no arguments: fork a server and 2 workers)\n",
               argv[0]);
  return 2;
}
