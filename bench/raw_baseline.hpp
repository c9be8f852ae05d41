// asyncps bench — the machine's ceiling: plain blocking write/read on a loopback TCP pair.
//
// Two measurements per message size S, both with TCP_NODELAY (as tcp_transport sets it):
//   one-way: a writer thread writes N messages of S bytes, the reader reads them; MB/s.
//   round trip: the client writes S bytes, a server thread reads them and replies R bytes
//               (8: a request/reply such as a push and its ack; S: an exchange such as a push
//               followed by a pull of the same size); per-request microseconds (the caller
//               takes the median).
// The helper thread of each is pinned to `peer_cpu` when that is >= 0 (`--cpu`).
// Nothing here touches asyncps: it is the yardstick the library is compared with.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "report.hpp"

namespace asyncps::bench::raw {

using bench_clock = std::chrono::steady_clock;

[[noreturn]] inline void fail(const char* what) {
  throw std::runtime_error(std::string("raw baseline: ") + what + ": " + std::strerror(errno));
}

/// A connected loopback TCP pair (client end, server end); closes both on destruction.
class socket_pair {
 public:
  socket_pair() {
    const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0) fail("socket");
    const int one = 1;
    ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof addr;
    if (::bind(ls, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(ls, 1) != 0 ||
        ::getsockname(ls, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ::close(ls);
      fail("bind/listen");
    }
    client_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (client_ < 0 || ::connect(client_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(ls);
      fail("connect");
    }
    server_ = ::accept(ls, nullptr, nullptr);
    ::close(ls);
    if (server_ < 0) fail("accept");
    ::setsockopt(client_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::setsockopt(server_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  socket_pair(const socket_pair&) = delete;
  socket_pair& operator=(const socket_pair&) = delete;
  ~socket_pair() {
    if (client_ >= 0) ::close(client_);
    if (server_ >= 0) ::close(server_);
  }
  int client() const noexcept { return client_; }
  int server() const noexcept { return server_; }

 private:
  int client_ = -1;
  int server_ = -1;
};

inline void write_all(int fd, const std::byte* p, std::size_t n) {
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      fail("write");
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

/// Reads exactly `n` bytes; false on EOF before the first byte.
inline bool read_all(int fd, std::byte* p, std::size_t n) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t k = ::read(fd, p + got, n - got);
    if (k < 0) {
      if (errno == EINTR) continue;
      fail("read");
    }
    if (k == 0) {
      if (got == 0) return false;
      throw std::runtime_error("raw baseline: EOF inside a message");
    }
    got += static_cast<std::size_t>(k);
  }
  return true;
}

/// One-way throughput of `count` messages of `size` bytes over `p` (writer thread -> this
/// thread). Returns bytes per second.
inline double one_way(socket_pair& p, std::size_t size, std::size_t count, int peer_cpu = -1) {
  std::vector<std::byte> out(size, std::byte{1});
  std::vector<std::byte> in(size);
  const auto t0 = bench_clock::now();
  std::thread writer([&] {
    pin_current_thread(peer_cpu);
    for (std::size_t i = 0; i < count; ++i) write_all(p.client(), out.data(), size);
  });
  for (std::size_t i = 0; i < count; ++i) {
    if (!read_all(p.server(), in.data(), size)) throw std::runtime_error("raw baseline: early EOF");
  }
  const auto t1 = bench_clock::now();
  writer.join();
  return static_cast<double>(size * count) / std::chrono::duration<double>(t1 - t0).count();
}

/// Round trips of a `size`-byte request and a `reply_size`-byte reply over a fresh pair, until
/// `deadline` (and at least `min_count`). Returns every round trip in microseconds.
inline std::vector<double> round_trips(std::size_t size, std::size_t reply_size,
                                       bench_clock::time_point deadline, std::size_t min_count,
                                       int peer_cpu = -1) {
  socket_pair p;
  std::thread responder([&] {
    pin_current_thread(peer_cpu);
    std::vector<std::byte> req(size);
    const std::vector<std::byte> reply(reply_size);
    while (read_all(p.server(), req.data(), size))
      write_all(p.server(), reply.data(), reply.size());
  });
  std::vector<std::byte> req(size, std::byte{1});
  std::vector<std::byte> reply(reply_size);
  std::vector<double> us;
  for (std::size_t i = 0; i < min_count || bench_clock::now() < deadline; ++i) {
    const auto t0 = bench_clock::now();
    write_all(p.client(), req.data(), size);
    if (!read_all(p.client(), reply.data(), reply.size()))
      throw std::runtime_error("raw baseline: EOF");
    us.push_back(std::chrono::duration<double, std::micro>(bench_clock::now() - t0).count());
  }
  ::shutdown(p.client(), SHUT_WR);
  responder.join();
  return us;
}

}  // namespace asyncps::bench::raw
