// Test helper: a descriptor flood against a TCP service (shard server, chain master,
// rendezvous), run in a forked child whose RLIMIT_NOFILE is lowered, so that the test process
// keeps its own descriptors and limit. The child's exit status says what went wrong.
//
// Under AddressSanitizer the forked child fails inside Asio's reactor once its descriptors are
// exhausted (UBSan reports an invalid vptr in epoll_reactor; the sanitizer runtime itself needs
// descriptors): these tests run in the plain builds (dev preset) only.
#pragma once

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include "asyncps/detail/asio_compat.hpp"

namespace asyncps::test {

/// Whether AddressSanitizer instruments this build (see the file comment).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool address_sanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool address_sanitized = true;
#else
inline constexpr bool address_sanitized = false;
#endif
#else
inline constexpr bool address_sanitized = false;
#endif

/// What `flood_then_probe` (and the child around it) report as the child's exit status.
enum flood_status : int {
  flood_served = 0,            ///< the service failed to accept, kept serving, then served
  flood_no_limit = 10,         ///< setrlimit failed
  flood_no_listener = 12,      ///< the service could not listen
  flood_no_connect = 13,       ///< the flooding client could not connect
  flood_serve_ended = 14,      ///< the service's async_serve ended on the accept error
  flood_no_failure_seen = 15,  ///< the service never logged a failed accept
  flood_probe_failed = 16,     ///< the real request afterwards was not served
  flood_log_unlimited = 17,    ///< more than 5 "accept failed" lines (not rate-limited)
};

/// Runs `body()` (returns the exit status, 0-255) in a forked child whose soft RLIMIT_NOFILE
/// is at most `limit`, ended by SIGALRM after 30 s. Returns the child's exit status, or -1
/// when it did not exit normally (a signal), -2 when fork failed.
template <class Body>
int run_with_descriptor_limit(rlim_t limit, Body body) {
  const pid_t pid = ::fork();
  if (pid < 0) return -2;
  if (pid == 0) {
    ::alarm(30);  // never hang the test run
    rlimit rl{};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = std::min<rlim_t>(rl.rlim_cur, limit);
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) ::_exit(flood_no_limit);
    ::_exit(body());
  }
  int wstatus = 0;
  if (::waitpid(pid, &wstatus, 0) != pid || !WIFEXITED(wstatus)) return -1;
  return WEXITSTATUS(wstatus);
}

/// The flood, on the service's executor in the child: takes every free descriptor but one,
/// connects a TCP client to `service` with that one (the service's accept then fails with
/// EMFILE: there is no descriptor for the connection), waits until `logs` (the service's log
/// lines) has an "accept failed" line, lets the service fail and retry for `retry_for` more,
/// frees every descriptor and the client, and `co_await`s `probe()` (an
/// `asio::awaitable<bool>`: a real request to the service; true when it was served).
/// `serve_ended`: whether the service's `async_serve` has completed. Returns a
/// `flood_status`; the caller then stops the service.
template <class Probe>
asio::awaitable<int>
flood_then_probe(asio::ip::tcp::endpoint service, const std::vector<std::string>& logs,
                 const bool& serve_ended, Probe probe,
                 std::chrono::milliseconds retry_for = std::chrono::milliseconds(300)) {
  auto ex = co_await asio::this_coro::executor;
  asio::steady_timer t(ex);
  auto sleep = [&](std::chrono::milliseconds d) -> asio::awaitable<void> {
    t.expires_after(d);
    co_await t.async_wait(detail::use_tuple);
  };
  const auto failures_logged = [&] {
    return std::count_if(logs.begin(), logs.end(), [](const std::string& l) {
      return l.find("accept failed") != std::string::npos;
    });
  };
  std::vector<int> held;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY)) >= 0;) held.push_back(fd);
  const auto release = [&] {
    for (int fd : held) ::close(fd);
    held.clear();
  };
  if (held.size() < 2) co_return flood_no_connect;
  ::close(held.back());  // for the client's socket
  held.pop_back();
  asio::ip::tcp::socket client(ex);
  auto [cec] = co_await client.async_connect(service, detail::use_tuple);
  if (cec) {
    release();
    co_return flood_no_connect;
  }
  for (int i = 0; i < 500 && failures_logged() == 0 && !serve_ended; ++i)
    co_await sleep(std::chrono::milliseconds(10));
  if (!serve_ended) co_await sleep(retry_for);  // more failures, longer pauses
  const bool ended = serve_ended;
  const bool seen = failures_logged() > 0;
  release();
  client.close();
  if (ended) co_return flood_serve_ended;
  if (!seen) co_return flood_no_failure_seen;
  if (!co_await probe()) co_return flood_probe_failed;
  if (serve_ended) co_return flood_serve_ended;
  if (failures_logged() > 5) co_return flood_log_unlimited;
  co_return flood_served;
}

/// In the child: listens on a loopback port of `t` (a TCP transport on `io`), serves
/// `service` there (a shard server, chain master or rendezvous: `async_serve(acceptor)`,
/// `stop()`), floods it (`flood_then_probe`, with `probe(endpoint)` as the real request), stops
/// it and returns the `flood_status`. `logs`: the lines the service's log function collects.
template <class Transport, class Service, class Probe>
int flood_service(asio::io_context& io, Transport& t, Service& service,
                  const std::vector<std::string>& logs, Probe probe) {
  auto acc = t.listen({asio::ip::make_address("127.0.0.1"), 0});
  if (!acc.has_value()) return flood_no_listener;
  const auto ep = acc.value().local_endpoint();
  bool serve_ended = false;
  int status = flood_probe_failed;  // the run ended before the flood did
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        (void)co_await service.async_serve(std::move(acc).value());
        serve_ended = true;
      },
      asio::detached);
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        status = co_await flood_then_probe(ep, logs, serve_ended, [&] { return probe(ep); });
        service.stop();
      },
      asio::detached);
  io.run_for(std::chrono::seconds(20));
  return status;
}

}  // namespace asyncps::test
