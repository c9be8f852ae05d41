// MSG_ZEROCOPY against plain send for a one-way stream of 4 MiB messages over loopback TCP
// (docs/performance.md, "Socket buffers"). Rounds alternate plain and zerocopy (A B A B ..);
// each round sends `count` messages from a sender thread to a reader thread, blocking sockets,
// TCP_NODELAY. Zerocopy: SO_ZEROCOPY on, every send with MSG_ZEROCOPY, completions read from
// the error queue (MSG_ERRQUEUE) as they come and all of them before the round ends (a sender
// may reuse a buffer only then); the count of completions the kernel marks
// SO_EE_CODE_ZEROCOPY_COPIED (it copied after all) is printed.
//   g++ -std=c++20 -O2 zerocopy_probe.cpp -o zerocopy_probe -pthread && ./zerocopy_probe [ROUNDS]
#include <arpa/inet.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#ifndef SO_EE_ORIGIN_ZEROCOPY
#define SO_EE_ORIGIN_ZEROCOPY 5
#endif
#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

static void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

struct counts {
  unsigned long done = 0;    // completions (each may cover a range of sends)
  unsigned long copied = 0;  // of which the kernel copied
};

// Reads every completion waiting on the error queue; returns the highest send id completed + 1.
static unsigned long drain(int fd, counts& c, unsigned long completed) {
  for (;;) {
    char control[128];
    msghdr msg{};
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    if (::recvmsg(fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return completed;
      die("recvmsg errqueue");
    }
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
      auto* ee = reinterpret_cast<sock_extended_err*>(CMSG_DATA(cm));
      if (ee->ee_origin != SO_EE_ORIGIN_ZEROCOPY) continue;
      ++c.done;
      if (ee->ee_code & SO_EE_CODE_ZEROCOPY_COPIED) ++c.copied;
      completed = std::max<unsigned long>(completed, ee->ee_data + 1ul);
    }
  }
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 6;
  const std::size_t size = std::size_t{4} << 20;
  const int count = 200;
  int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) || ::listen(ls, 1) ||
      ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len))
    die("listen");
  int tx = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(tx, reinterpret_cast<sockaddr*>(&a), sizeof a)) die("connect");
  int rx = ::accept(ls, nullptr, nullptr);
  const int one = 1;
  ::setsockopt(tx, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(rx, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (::setsockopt(tx, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one)) die("SO_ZEROCOPY");
  std::vector<char> out(size, 'x'), in(size);
  std::printf("round mode      MB/s   completions copied\n");
  for (int r = 0; r < 2 * rounds; ++r) {
    const bool zc = r % 2 == 1;
    std::thread reader([&] {
      for (std::size_t got = 0; got < size * count;) {
        const ssize_t n = ::recv(rx, in.data(), size, 0);
        if (n <= 0) die("recv");
        got += static_cast<std::size_t>(n);
      }
    });
    counts c;
    unsigned long sent = 0, completed = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int m = 0; m < count; ++m) {
      for (std::size_t off = 0; off < size;) {
        const ssize_t n = ::send(tx, out.data() + off, size - off, zc ? MSG_ZEROCOPY : 0);
        if (n < 0 && errno == ENOBUFS && zc) {  // too many completions pending: read them
          completed = drain(tx, c, completed);
          continue;
        }
        if (n < 0) die("send");
        off += static_cast<std::size_t>(n);
        if (zc) ++sent;
      }
      if (zc) completed = drain(tx, c, completed);
    }
    while (zc && completed < sent) {  // every buffer released before the round counts as done
      pollfd p{tx, 0, 0};
      ::poll(&p, 1, 10);
      completed = drain(tx, c, completed);
    }
    reader.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%5d %-9s %7.0f %11lu %6lu\n", r / 2 + 1, zc ? "zerocopy" : "plain",
                static_cast<double>(size) * count / s / 1e6, c.done, c.copied);
    std::fflush(stdout);
  }
}
