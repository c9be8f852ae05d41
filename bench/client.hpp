// asyncps bench — a protocol client written against a transport's connection directly.
//
// It speaks just enough of the worker protocol to drive a real `basic_server`: the hello /
// welcome handshake, ranged pushes with `want_ack` (the server replies with an ack echoing the
// push's seq) and ranged pulls at `no_clock` (the server replies with the rows). Requests are
// sent one at a time (window 1: each round trip is timed) or with up to `window` requests in
// flight: one sender and one receiver coroutine per connection, the sender refilling the
// window whenever the receiver takes a reply.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <asio/awaitable.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/experimental/channel.hpp>

#include "asyncps/buffer.hpp"
#include "asyncps/consistency.hpp"
#include "asyncps/consistency/policies.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery.hpp"
#include "asyncps/recovery/none.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::bench {

using bench_clock = std::chrono::steady_clock;

/// What a run sends.
enum class op_kind {
  push,       ///< push + ack
  pull,       ///< pull + rows
  push_pull,  ///< alternating push and pull (payload bytes of both directions count)
};

inline const char* op_name(op_kind op) {
  switch (op) {
    case op_kind::push: return "push";
    case op_kind::pull: return "pull";
    case op_kind::push_pull: return "push+pull";
  }
  return "?";
}

/// Parameters of one timed run of one connection.
struct workload {
  op_kind op = op_kind::push;
  std::size_t size = 0;                ///< payload bytes per push / per rows reply
  unsigned window = 1;                 ///< requests in flight
  bench_clock::time_point deadline{};  ///< stop sending once past it ...
  std::uint64_t min_requests = 1;      ///< ... and once at least this many replies arrived
  bool record_latency = false;         ///< window 1 only: time every round trip
};

/// What one connection achieved in a run.
struct worker_result {
  std::uint64_t bytes = 0;     ///< payload bytes of completed requests
  std::uint64_t requests = 0;  ///< completed requests (replies received)
  std::uint64_t pushes = 0;    ///< acks received
  bench_clock::time_point end{};
  std::vector<double> latency_us;  ///< per round trip (window 1 with record_latency)
};

/// One worker's connection to the server shard, holding a single table of
/// `rows x width` floats, all of which every push and pull covers.
template <class Connection>
class client {
 public:
  /// `gradient`: `rows * width` finite floats, shared (not copied) into every push.
  client(Connection conn, std::uint32_t worker, std::uint32_t rows, std::uint32_t width,
         buffer gradient)
      : conn_(std::move(conn)), worker_(worker), rows_(rows), width_(width),
        gradient_(std::move(gradient)) {}

  /// Sends hello (layout: one `rows x width` table, encoded into `payload`, at least
  /// `protocol::hello_bytes(1)` bytes) and awaits welcome.
  asio::awaitable<void> handshake(buffer payload) {
    message hello = protocol::encode(
        protocol::hello{.worker = worker_,
                        .clock = 0,
                        .fingerprint = policy_fingerprint<consistency::asp, recovery::none>(),
                        .layout = {{rows_, width_}}},  // the server's policy
        [&](std::size_t n) { return n <= payload.size() ? payload.share(0, n) : buffer{}; });
    if (auto ec = co_await conn_.async_send(std::move(hello))) fail("send hello", ec);
    auto [ec, reply] = co_await conn_.async_receive();
    if (ec) fail("receive welcome", ec);
    if (reply.header.type != message_type::welcome) fail("expected welcome", {});
  }

  /// Runs `w` to completion (every request sent has its reply) and fills `out`.
  asio::awaitable<void> run(const workload& w, worker_result& out) {
    if (w.window <= 1) {
      co_await run_sequential(w, out);
    } else {
      using namespace asio::experimental::awaitable_operators;
      pipeline st(co_await asio::this_coro::executor, w.window);
      co_await (send_loop(w, st) && receive_loop(w, st, out));
    }
  }

  void close() noexcept { conn_.close(); }

 private:
  // Asio 1.22: a channel of `void(std::error_code)` alone does not compile (ambiguous traits),
  // hence the dummy int; and a channel must not be moved (its moved-to copy is left pointing at
  // freed state; seen with AddressSanitizer), hence the constructor.
  using window_tokens = asio::experimental::channel<void(std::error_code, int)>;
  struct pipeline {
    pipeline(const asio::any_io_executor& ex, unsigned window) : tokens(ex, window) {}
    window_tokens tokens;  // one per request in flight; the sender waits while it is full
    std::uint64_t sent = 0;
    std::uint64_t received = 0;
    bool stop = false;
  };

  [[noreturn]] void fail(const char* what, std::error_code ec) {
    conn_.close();  // so the other coroutine of this connection completes too
    throw std::runtime_error("bench client " + std::to_string(worker_) + ": " + what +
                             (ec ? ": " + ec.message() : std::string()));
  }

  static bool is_push(op_kind op, std::uint64_t i) noexcept {
    return op == op_kind::push || (op == op_kind::push_pull && i % 2 == 0);
  }

  message request(bool push) {
    message m;
    m.header.type = push ? message_type::push : message_type::pull;
    m.header.sender = worker_;
    m.header.table = 0;
    m.header.row_count = rows_;
    m.header.width = width_;
    m.header.first_row = 0;
    if (push) {
      m.header.flags = frame_flags::range | frame_flags::want_ack;
      m.header.seq = ++push_seq_;
      m.payload = gradient_.share();
    } else {
      m.header.flags = frame_flags::range;
      m.header.clock = no_clock;
    }
    return m;
  }

  void check_reply(const message& r, bool push, std::size_t size) {
    if (push) {
      if (r.header.type != message_type::ack) fail("expected ack", {});
      if (r.header.seq != ++ack_seq_) fail("ack out of order", {});
    } else {
      if (r.header.type != message_type::rows) fail("expected rows", {});
      if (r.payload.size() != size) fail("rows reply of the wrong size", {});
    }
  }

  asio::awaitable<void> run_sequential(const workload& w, worker_result& out) {
    if (w.record_latency) out.latency_us.reserve(std::size_t{1} << 14);
    for (std::uint64_t i = 0; i < w.min_requests || bench_clock::now() < w.deadline; ++i) {
      const bool push = is_push(w.op, i);
      const auto t0 = bench_clock::now();
      if (auto ec = co_await conn_.async_send(request(push))) fail("send", ec);
      auto [ec, reply] = co_await conn_.async_receive();
      if (ec) fail("receive", ec);
      check_reply(reply, push, w.size);
      if (w.record_latency)
        out.latency_us.push_back(
            std::chrono::duration<double, std::micro>(bench_clock::now() - t0).count());
      out.bytes += w.size;
      ++out.requests;
      out.pushes += push ? 1 : 0;
    }
    out.end = bench_clock::now();
  }

  asio::awaitable<void> send_loop(const workload& w, pipeline& st) {
    for (;;) {
      auto [ec] = co_await st.tokens.async_send(std::error_code{}, 0, detail::use_tuple);
      if (ec || st.stop) break;
      const bool push = is_push(w.op, st.sent++);
      if (auto ec = co_await conn_.async_send(request(push))) fail("send", ec);
    }
  }

  asio::awaitable<void> receive_loop(const workload& w, pipeline& st, worker_result& out) {
    // The receiver decides when to stop (it is the one that knows how many replies are still
    // due), so neither coroutine can be left waiting for a reply that will never come.
    while (!(st.stop && st.received == st.sent)) {
      auto [ec, reply] = co_await conn_.async_receive();
      if (ec) {
        st.stop = true;
        st.tokens.close();
        fail("receive", ec);
      }
      const bool push = is_push(w.op, st.received++);
      check_reply(reply, push, w.size);
      out.bytes += w.size;
      ++out.requests;
      out.pushes += push ? 1 : 0;
      if (st.received >= w.min_requests && bench_clock::now() >= w.deadline) st.stop = true;
      st.tokens.try_receive([](std::error_code, int) {});  // frees a slot (wakes the sender)
    }
    out.end = bench_clock::now();
  }

  Connection conn_;
  std::uint32_t worker_;
  std::uint32_t rows_;
  std::uint32_t width_;
  buffer gradient_;
  std::uint64_t push_seq_ = 0;
  std::uint64_t ack_seq_ = 0;
};

}  // namespace asyncps::bench
