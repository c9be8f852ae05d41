// asyncps — the simulated network's configuration (latency and compute models), its counters
// and its virtual clock. Part of the simulated transport (asyncps/transport/simulated.hpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace asyncps {

/// The virtual clock of the simulated network whose `run()` is executing on this thread. Its
/// epoch is the start of the simulation; it only moves when `simulated_network::run` jumps to
/// the next event. Meets the C++ Clock requirements (steady). Thread safety: `now()` reads a
/// thread_local pointer set for the duration of `run()`: one running simulation per thread at
/// a time (code outside `run()` reads `simulated_network::now()` instead).
struct simulated_clock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<simulated_clock, duration>;
  static constexpr bool is_steady = true;
  /// Virtual time since the start of the running simulation; `time_point{}` outside `run()`.
  static time_point now() noexcept;
};

/// How long a message takes from one node to another. A message of `b` bytes (64-byte header
/// + payload) sent at virtual time `t` leaves its sender after transmitting `b / bytes_per_second`
/// (queued behind the node's earlier messages when `shared_egress`), then arrives `base` plus
/// a uniform random `[0, jitter)` later, but never before the previous message of the same
/// connection and direction (connections are FIFO). Connection setup costs one such trip each
/// way (SYN, SYN-ACK); a refusal takes the same round trip.
struct latency_model {
  std::chrono::nanoseconds base{std::chrono::microseconds(50)};  ///< one-way propagation
  std::chrono::nanoseconds jitter{0};  ///< + uniform [0, jitter) per message, from the seed
  double bytes_per_second = 1.25e9;    ///< link bandwidth (10 Gbit/s); <= 0: infinite
  /// Each node has one network interface: its outgoing messages (on all its connections)
  /// are transmitted one after the other. False: every connection has its own bandwidth.
  bool shared_egress = true;
};

/// How long a worker's gradient takes in virtual time: every job posted to
/// `simulated_network::compute_executor(w)` runs after `base * speed_factor[w] * (1 + jitter *
/// u)` with `u` uniform in [0, 1) from the seed. Workers without an entry have factor 1.
struct compute_model {
  std::chrono::nanoseconds base{std::chrono::milliseconds(10)};  ///< one gradient, speed 1
  std::vector<double> speed_factor{};  ///< per worker id; 4.0: four times slower
  double jitter = 0.0;                 ///< relative extra time, uniform in [0, jitter)
};

/// Configuration of a `simulated_network`.
struct simulation_options {
  std::uint64_t seed = 1;  ///< seeds every random choice (latency jitter, compute jitter)
  latency_model latency{};
  compute_model compute{};
  std::size_t pool_cache_bytes = std::size_t{1} << 30;  ///< see `buffer_pool`
  /// Send-side flow control, per connection and direction, in bytes (64-byte headers
  /// included), like a socket's send buffer: `async_send` puts its message on the wire at once
  /// (its arrival time is what it would be without the bound) but completes only once the
  /// bytes queued on that direction (sent, and not yet taken by the receiver's
  /// `async_receive`: in flight or arrived) are at most this many, counting its own message,
  /// or once nothing is queued ahead of it (a message larger than the bound waits for the
  /// messages before it, then completes). So a sender that outruns its link or its reader
  /// waits, in virtual time, and one direction holds at most `send_buffer_bytes` plus one
  /// message. The room is noticed when the receiver takes the bytes (no acknowledgement delay).
  /// Default 4 MiB: the largest send buffer Linux autotunes a TCP socket to (the maximum of
  /// `net.ipv4.tcp_wmem`, 4194304), as on loopback; a real connection also holds its receive
  /// buffer's bytes, so this paces a little earlier than Linux would. 0: unbounded (sends
  /// complete at once, as before this option existed).
  std::size_t send_buffer_bytes = std::size_t{4} << 20;
};

/// Counters of a `simulated_network` (read between runs or from its handlers).
struct simulation_stats {
  std::uint64_t events = 0;        ///< events executed (deliveries, timers, computations, ...)
  std::uint64_t messages = 0;      ///< messages delivered
  std::uint64_t bytes = 0;         ///< bytes delivered (64-byte headers included)
  std::uint64_t computations = 0;  ///< jobs run on compute executors
  std::uint64_t connections = 0;   ///< connections established
  std::uint64_t faults = 0;        ///< faults (node or link down) that began
  std::uint64_t broken = 0;        ///< connections reset by a fault
  std::uint64_t send_waits = 0;    ///< sends that waited for room (`send_buffer_bytes`)
  /// The most bytes (headers included) one direction of a connection held at once, sent and
  /// not yet taken by its receiver (at most `send_buffer_bytes` plus one message when bounded).
  std::uint64_t max_queued_bytes = 0;
};

}  // namespace asyncps
