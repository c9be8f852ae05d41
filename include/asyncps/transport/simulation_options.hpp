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
};

}  // namespace asyncps
