// asyncps — simulated transport: the unchanged `basic_server` and `basic_worker` on a simulated
// network with a virtual clock, all in one thread.
//
// A `simulated_network` owns an `asio::io_context` (run only through `simulated_network::run`),
// the virtual clock and an event queue ordered by (virtual time, sequence number). Message
// delivery comes from a latency model, worker compute time from a per-worker speed profile
// (pass `compute_executor(worker)` as `basic_worker`'s `compute` argument), failures and
// partitions from a fault schedule, and every random choice from one seeded generator, so a
// run is reproducible from its seed. `run()` alternates "run every ready handler" and "jump
// the clock to the next event"; nothing ever sleeps, and the real CPU only does the math.
// Guide: docs/concepts/simulation.md.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <asio/any_io_executor.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/error.hpp>
#include <asio/execution.hpp>
#include <asio/execution_context.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/query.hpp>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/error.hpp"
#include "asyncps/options.hpp"
#include "asyncps/result.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

class simulated_network;
class simulated_timer;
class simulated_transport;

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

namespace detail {

using sim_time = simulated_clock::time_point;
using sim_event_key = std::pair<sim_time, std::uint64_t>;

/// A move-only `void()` callable (events hold move-only handlers).
class sim_action {
 public:
  sim_action() noexcept = default;
  template <class F>
    requires(!std::same_as<std::remove_cvref_t<F>, sim_action>)
  explicit sim_action(F&& f)
      : p_(std::make_unique<impl<std::remove_cvref_t<F>>>(std::forward<F>(f))) {}
  void operator()() { p_->call(); }
  explicit operator bool() const noexcept { return p_ != nullptr; }

 private:
  struct base {
    virtual ~base() = default;
    virtual void call() = 0;
  };
  template <class F>
  struct impl final : base {
    template <class G>
    explicit impl(G&& g) : fn(std::forward<G>(g)) {}
    void call() override { fn(); }
    F fn;
  };
  std::unique_ptr<base> p_;
};

/// A type-erased, move-only completion handler taking `Args...`. `post` submits it, with its
/// arguments, to the handler's associated executor (never runs it inline), as Asio's own
/// operations do.
template <class... Args>
class sim_completion {
 public:
  sim_completion() noexcept = default;
  template <class Handler>
  sim_completion(Handler&& h, const asio::any_io_executor& fallback)
      : p_(std::make_unique<impl<std::remove_cvref_t<Handler>>>(std::forward<Handler>(h),
                                                                fallback)) {}
  explicit operator bool() const noexcept { return p_ != nullptr; }
  /// Posts the handler with `args`; this object is empty afterwards. Precondition: not empty.
  void post(Args... args) {
    auto p = std::move(p_);
    p->post(std::move(args)...);
  }

 private:
  struct base {
    virtual ~base() = default;
    virtual void post(Args&&... args) = 0;
  };
  template <class H>
  struct impl final : base {
    template <class G>
    impl(G&& g, const asio::any_io_executor& fb) : h(std::forward<G>(g)), fallback(fb) {}
    void post(Args&&... args) override {
      auto ex = asio::get_associated_executor(h, fallback);
      asio::post(ex, [h = std::move(h), ... a = std::move(args)]() mutable {
        std::move(h)(std::move(a)...);
      });
    }
    H h;
    asio::any_io_executor fallback;
  };
  std::unique_ptr<base> p_;
};

/// A message (or the sender's close, `eof`) on its way.
struct sim_flight {
  sim_time at;
  message m;
  bool eof = false;
};

/// One direction of a simulated connection.
struct sim_direction {
  std::deque<sim_flight> flight;                      // sent, not arrived (non-decreasing `at`)
  std::deque<message> arrived;                        // arrived, not received yet
  sim_completion<std::error_code, message> receiver;  // the outstanding receive
  sim_time last{};                                    // arrival time of the newest message
  sim_event_key event{};                              // the next delivery, when `scheduled`
  bool scheduled = false;
  bool eof = false;            // the sender's close arrived (after `arrived`)
  bool reader_closed = false;  // the receiving side closed: sends fail
};

/// A connection between two nodes: dir[0] carries side 0's (the connector's) messages to side 1
/// (the acceptor's), dir[1] the other way.
struct sim_pipe {
  sim_direction dir[2];
  std::uint32_t node[2] = {0, 0};
  std::error_code broken{};  // a fault reset the connection
  int refs = 2;              // connection objects (or pending setups) still using it
  std::list<sim_pipe>::iterator self;
};

/// A listening name.
struct sim_listener {
  std::uint32_t node = 0;
  std::deque<sim_pipe*> backlog;                         // connections not accepted yet
  sim_completion<std::error_code, sim_pipe*> accepting;  // the outstanding accept
};

/// Finds the `simulated_network` from one of its executors (see `network_of`).
class sim_service final : public asio::execution_context::service {
 public:
  static inline asio::execution_context::id id;
  explicit sim_service(asio::execution_context& ctx) : service(ctx) {}
  sim_service(asio::execution_context& ctx, simulated_network* n) : service(ctx), net(n) {}
  simulated_network* net = nullptr;

 private:
  void shutdown() override {}
};

}  // namespace detail

/// The simulated network: virtual clock, event queue, nodes, connections, fault schedule and
/// the buffer pool of every simulated transport made on it.
///
/// Preconditions: outlives every `simulated_transport`, connection, acceptor, timer and buffer
/// made from it; servers and workers are destroyed before it (a coroutine still suspended
/// when it is destroyed is destroyed with it, never resumed).
/// Thread safety: single-threaded. Construct, configure, `run` and destroy it on one thread;
/// every coroutine of the simulation runs inside `run()` on that thread. During its `run()` it
/// is this thread's network for `simulated_clock::now()` (a thread_local pointer).
class simulated_network {
 public:
  using clock_type = simulated_clock;
  using time_point = simulated_clock::time_point;
  using duration = simulated_clock::duration;

  /// A network at virtual time 0 with no nodes. Throws `std::invalid_argument` when a speed
  /// factor is not positive or a jitter is negative.
  explicit simulated_network(simulation_options opts = {})
      : pool_(opts.pool_cache_bytes), opts_(std::move(opts)), rng_(opts_.seed) {
    for (double f : opts_.compute.speed_factor)
      if (!(f > 0.0))
        throw std::invalid_argument("asyncps::compute_model: speed factors must be > 0");
    if (opts_.compute.jitter < 0.0 || opts_.latency.jitter.count() < 0 ||
        opts_.latency.base.count() < 0 || opts_.compute.base.count() < 0)
      throw std::invalid_argument("asyncps::simulation_options: durations and jitters >= 0");
    io_.emplace(1);
    asio::make_service<detail::sim_service>(*io_, this);
    work_.emplace(io_->get_executor());
  }
  simulated_network(const simulated_network&) = delete;
  simulated_network& operator=(const simulated_network&) = delete;
  /// Destroys every handler still pending (their coroutines are destroyed, not resumed).
  ~simulated_network();

  /// The executor every simulated transport's coroutines run on.
  asio::any_io_executor get_executor() const { return io_->get_executor(); }
  /// Current virtual time (since the start of the simulation).
  time_point now() const noexcept { return now_; }
  /// When worker `worker`'s latest compute job was posted to its `compute_executor` (for
  /// `basic_worker`: when it took the parameter snapshot of its current gradient); the epoch
  /// if it never was. A compute job runs at this time plus its compute time.
  time_point compute_started(std::uint32_t worker) const noexcept {
    return worker < compute_started_.size() ? compute_started_[worker] : time_point{};
  }
  /// The configuration it was built with.
  const simulation_options& options() const noexcept { return opts_; }
  /// Counters so far (deterministic for a given configuration and seed).
  const simulation_stats& stats() const noexcept { return stats_; }
  /// The pool every simulated transport's `allocate` draws from.
  buffer_pool& pool() noexcept { return pool_; }

  /// Runs the simulation until nothing is left to do: repeatedly runs every ready handler,
  /// then advances the clock to the earliest pending event and executes it. Returns the
  /// number of events executed. Returns early after `stop()`. Handlers' exceptions propagate.
  /// A coroutine waiting on something that can never happen (a timer at `time_point::max()`,
  /// a receive on an idle connection) does not keep it running: when no event is pending the
  /// simulation is quiescent and `run` returns (stop the servers, then `run` again to let
  /// them finish).
  std::size_t run() { return run_until(time_point::max()); }

  /// As `run`, but executes no event later than virtual time `limit`; when it stops because
  /// of the limit the clock is set to `limit`.
  std::size_t run_until(time_point limit) {
    struct current_guard {
      explicit current_guard(simulated_network* n) : prev(current()) { current() = n; }
      ~current_guard() { current() = prev; }
      simulated_network* prev;
    } guard(this);
    stopped_ = false;
    std::size_t n = 0;
    for (;;) {
      while (!stopped_ && io_->poll() > 0) {}
      if (io_->stopped()) io_->restart();
      if (stopped_ || events_.empty()) break;
      auto it = events_.begin();
      if (it->first.first > limit) {
        now_ = std::max(now_, limit);
        break;
      }
      auto node = events_.extract(it);
      now_ = node.key().first;
      ++stats_.events;
      ++n;
      node.mapped()();
    }
    return n;
  }

  /// As `run_until(now() + d)`.
  std::size_t run_for(duration d) { return run_until(now_ + d); }

  /// Makes the running `run()` return after the handler that called this (call from inside
  /// the simulation, e.g. when every worker is done).
  void stop() noexcept { stopped_ = true; }

  /// Runs `f()` (a `void()` callable) at virtual time `when` since the start, from the event
  /// loop (e.g. stop a server at t1 and start a fresh one at t2). Throws
  /// `std::invalid_argument` when `when < now()`.
  template <class F>
  void at(duration when, F&& f) {
    schedule(checked(when), detail::sim_action(std::forward<F>(f)));
  }

  /// Fault: node `node` is cut off from the network from virtual time `from` until `until`
  /// (both since the start): every connection to or from it is reset at `from` (both ends see
  /// `std::errc::connection_reset`; messages in flight are lost), and connecting to or from
  /// it is refused until `until`. Its processes keep running and keep their state (a
  /// partition; to model a crash, also stop its server with `at`). Throws
  /// `std::invalid_argument` unless `now() <= from < until`.
  void node_down(std::string_view node, duration from, duration until) {
    add_fault(node_id(node), no_node, from, until);
  }
  /// Fault: the link between nodes `a` and `b` is down from `from` until `until` (as
  /// `node_down`, for connections between `a` and `b` only).
  void link_down(std::string_view a, std::string_view b, duration from, duration until) {
    const auto x = node_id(a);
    const auto y = node_id(b);
    if (x == y) throw std::invalid_argument("asyncps::simulated_network::link_down: a == b");
    add_fault(x, y, from, until);
  }

  /// An executor for worker `worker`'s gradient computations (`basic_worker`'s `compute`
  /// argument): each job posted to it runs `compute_time(worker)` of virtual time later.
  /// Convertible to `asio::any_io_executor`.
  class compute_executor_type;
  compute_executor_type compute_executor(std::uint32_t worker);

  /// Whether nodes `a` and `b` can reach each other now (neither down, their link up).
  bool reachable(std::string_view a, std::string_view b) {
    return reachable(node_id(a), node_id(b));
  }

  /// The node named `name`, created if new. Nodes are identified by name; any number of
  /// transports may share one.
  std::uint32_t node_id(std::string_view name) {
    if (auto it = node_ids_.find(name); it != node_ids_.end()) return it->second;
    const auto id = static_cast<std::uint32_t>(nodes_.size());
    nodes_.push_back(node_state{std::string(name)});
    node_ids_.emplace(std::string(name), id);
    return id;
  }

 private:
  friend class simulated_timer;
  friend class simulated_transport;
  friend struct simulated_clock;

  static constexpr std::uint32_t no_node = 0xffffffffu;
  struct node_state {
    std::string name;
    int down = 0;
    time_point egress_free{};  // when its interface finishes the messages queued so far
  };
  struct fault {
    std::uint32_t a;
    std::uint32_t b;  // no_node: node fault
  };

  static simulated_network*& current() noexcept {
    thread_local simulated_network* p = nullptr;
    return p;
  }

  time_point checked(duration when) const {
    if (when < now_.time_since_epoch())
      throw std::invalid_argument("asyncps::simulated_network: event scheduled in the past");
    return time_point(when);
  }

  detail::sim_event_key schedule(time_point t, detail::sim_action a) {
    const detail::sim_event_key key{t, ++seq_};
    events_.emplace(key, std::move(a));
    return key;
  }
  void unschedule(const detail::sim_event_key& key) { events_.erase(key); }

  double uniform01() noexcept { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

  duration latency_sample() {
    const auto j = opts_.latency.jitter.count();
    return opts_.latency.base +
           duration(j > 0 ? static_cast<duration::rep>(uniform01() * static_cast<double>(j)) : 0);
  }

  duration compute_time(std::uint32_t worker) {
    const auto& c = opts_.compute;
    const double f = worker < c.speed_factor.size() ? c.speed_factor[worker] : 1.0;
    const double j = c.jitter > 0 ? 1.0 + c.jitter * uniform01() : 1.0;
    return duration(std::llround(static_cast<double>(c.base.count()) * f * j));
  }

  // Arrival time of `bytes` sent now from `from` on a direction whose last arrival is `last`.
  time_point arrival(std::uint32_t from, std::size_t bytes, time_point last) {
    const double bw = opts_.latency.bytes_per_second;
    const duration tx(bw > 0 ? std::llround(static_cast<double>(bytes) * 1e9 / bw) : 0);
    time_point depart = now_ + tx;
    if (opts_.latency.shared_egress) {
      auto& n = nodes_[from];
      depart = std::max(now_, n.egress_free) + tx;
      n.egress_free = depart;
    }
    return std::max(last, depart + latency_sample());
  }

  bool reachable(std::uint32_t a, std::uint32_t b) const {
    if (nodes_[a].down > 0 || nodes_[b].down > 0) return false;
    return a == b || !links_down_.contains(std::minmax(a, b));
  }

  void add_fault(std::uint32_t a, std::uint32_t b, duration from, duration until) {
    if (from < now_.time_since_epoch() || !(from < until))
      throw std::invalid_argument(
          "asyncps::simulated_network: a fault needs now() <= from < until");
    const auto i = faults_.size();
    faults_.push_back(fault{a, b});
    schedule(time_point(from), detail::sim_action([this, i] { apply_fault(i, true); }));
    schedule(time_point(until), detail::sim_action([this, i] { apply_fault(i, false); }));
  }

  void apply_fault(std::size_t i, bool begin) {
    const fault f = faults_[i];
    const int delta = begin ? 1 : -1;
    if (f.b == no_node) {
      nodes_[f.a].down += delta;
    } else {
      const auto key = std::minmax(f.a, f.b);
      if ((links_down_[key] += delta) == 0) links_down_.erase(key);
    }
    if (!begin) return;
    ++stats_.faults;
    for (auto& p : pipes_) {
      const bool hit = f.b == no_node ? (p.node[0] == f.a || p.node[1] == f.a)
                                      : std::minmax(p.node[0], p.node[1]) == std::minmax(f.a, f.b);
      if (hit) break_pipe(p, std::make_error_code(std::errc::connection_reset));
    }
  }

  // Hands `args` to `c` (posted), or drops it while the network is being destroyed.
  template <class... A, class... V>
  void complete(detail::sim_completion<A...>& c, V&&... args) {
    if (!c) return;
    if (shutting_down_) {
      auto dropped = std::move(c);
      return;
    }
    c.post(std::forward<V>(args)...);
  }

  // --- connections ------------------------------------------------------------------------

  void schedule_delivery(detail::sim_pipe& p, int d) {
    auto& dir = p.dir[d];
    dir.event =
        schedule(dir.flight.front().at, detail::sim_action([this, &p, d] { deliver(p, d); }));
    dir.scheduled = true;
  }

  void unschedule_delivery(detail::sim_direction& dir) {
    if (dir.scheduled) unschedule(dir.event);
    dir.scheduled = false;
  }

  void deliver(detail::sim_pipe& p, int d) {
    auto& dir = p.dir[d];
    dir.scheduled = false;
    while (!dir.flight.empty() && dir.flight.front().at <= now_) {
      auto& f = dir.flight.front();
      if (f.eof) {
        dir.eof = true;
      } else {
        ++stats_.messages;
        stats_.bytes += header_size + f.m.payload.size();
        dir.arrived.push_back(std::move(f.m));
      }
      dir.flight.pop_front();
    }
    if (!dir.flight.empty()) schedule_delivery(p, d);
    try_receive(p, d);
  }

  void try_receive(detail::sim_pipe& p, int d) {
    auto& dir = p.dir[d];
    if (!dir.receiver) return;
    if (p.broken) {
      complete(dir.receiver, p.broken, message{});
    } else if (!dir.arrived.empty()) {
      message m = std::move(dir.arrived.front());
      dir.arrived.pop_front();
      complete(dir.receiver, std::error_code{}, std::move(m));
    } else if (dir.eof || dir.reader_closed) {
      complete(dir.receiver, make_error_code(errc::connection_closed), message{});
    }
  }

  std::error_code transmit(detail::sim_pipe& p, int side, message m) {
    if (p.broken) return p.broken;
    auto& dir = p.dir[side];
    // The peer closed: as with TCP before the peer's reset comes back, the send succeeds and
    // the bytes are dropped; this side learns of the close from the peer's FIN (`eof`).
    if (dir.reader_closed) return {};
    const time_point at = arrival(p.node[side], header_size + m.payload.size(), dir.last);
    dir.last = at;
    dir.flight.push_back(detail::sim_flight{at, std::move(m), false});
    if (!dir.scheduled) schedule_delivery(p, side);
    return {};
  }

  void break_pipe(detail::sim_pipe& p, std::error_code ec) {
    if (p.broken) return;
    p.broken = ec;
    ++stats_.broken;
    for (int d = 0; d < 2; ++d) {
      auto& dir = p.dir[d];
      unschedule_delivery(dir);
      dir.flight.clear();
      dir.arrived.clear();
      complete(dir.receiver, ec, message{});
    }
  }

  // Side `side` closes: its receive completes; the peer receives connection_closed after the
  // messages already on their way to it (what the peer sends from now on is dropped).
  void close_side(detail::sim_pipe& p, int side) {
    auto& in = p.dir[1 - side];
    auto& out = p.dir[side];
    in.reader_closed = true;
    if (shutting_down_) return;
    unschedule_delivery(in);
    in.flight.clear();
    in.arrived.clear();
    complete(in.receiver, make_error_code(errc::connection_closed), message{});
    if (!p.broken && !out.reader_closed) {
      out.last = arrival(p.node[side], 0, out.last);
      out.flight.push_back(detail::sim_flight{out.last, message{}, true});
      if (!out.scheduled) schedule_delivery(p, side);
    }
  }

  void release(detail::sim_pipe& p) {
    if (--p.refs > 0) return;
    for (auto& d : p.dir) unschedule_delivery(d);
    pipes_.erase(p.self);
  }

  void start_receive(detail::sim_pipe& p, int d,
                     detail::sim_completion<std::error_code, message> c) {
    p.dir[d].receiver = std::move(c);
    try_receive(p, d);
  }

  void start_connect(std::uint32_t from, std::string name,
                     detail::sim_completion<std::error_code, detail::sim_pipe*> c) {
    schedule(now_ + latency_sample(),
             detail::sim_action([this, from, name = std::move(name), c = std::move(c)]() mutable {
               on_syn(from, name, std::move(c));
             }));
  }

  void on_syn(std::uint32_t from, const std::string& name,
              detail::sim_completion<std::error_code, detail::sim_pipe*> c) {
    const auto it = listeners_.find(name);
    if (it == listeners_.end() || !reachable(from, it->second->node)) {
      schedule(now_ + latency_sample(), detail::sim_action([this, c = std::move(c)]() mutable {
                 complete(c, std::make_error_code(std::errc::connection_refused),
                          static_cast<detail::sim_pipe*>(nullptr));
               }));
      return;
    }
    auto& l = *it->second;
    auto& p = pipes_.emplace_back();
    p.self = std::prev(pipes_.end());
    p.node[0] = from;
    p.node[1] = l.node;
    ++stats_.connections;
    if (l.accepting) {
      complete(l.accepting, std::error_code{}, &p);
    } else {
      l.backlog.push_back(&p);
    }
    schedule(now_ + latency_sample(), detail::sim_action([this, &p, c = std::move(c)]() mutable {
               if (p.broken) {
                 const auto ec = p.broken;
                 release(p);
                 complete(c, ec, static_cast<detail::sim_pipe*>(nullptr));
               } else {
                 complete(c, std::error_code{}, &p);
               }
             }));
  }

  void start_accept(detail::sim_listener& l,
                    detail::sim_completion<std::error_code, detail::sim_pipe*> c) {
    if (!l.backlog.empty()) {
      detail::sim_pipe* p = l.backlog.front();
      l.backlog.pop_front();
      complete(c, std::error_code{}, p);
    } else {
      l.accepting = std::move(c);
    }
  }

  void close_listener(detail::sim_listener* l, const std::string& name) {
    const auto it = listeners_.find(name);
    if (it == listeners_.end() || it->second.get() != l) return;
    auto owned = std::move(it->second);
    listeners_.erase(it);
    complete(owned->accepting, make_error_code(errc::stopped),
             static_cast<detail::sim_pipe*>(nullptr));
    for (detail::sim_pipe* p : owned->backlog) {
      close_side(*p, 1);
      release(*p);
    }
  }

  void schedule_compute(std::uint32_t worker, detail::sim_action job) {
    if (compute_started_.size() <= worker) compute_started_.resize(worker + 1);
    compute_started_[worker] = now_;
    schedule(now_ + compute_time(worker),
             detail::sim_action([this, job = std::move(job)]() mutable {
               ++stats_.computations;
               job();
             }));
  }

  // Destroys every pending handler (and so the coroutines suspended on them), repeatedly,
  // since destroying one may release others.
  void drop_pending();

  buffer_pool pool_;  // first: outlives every buffer held by the members below
  simulation_options opts_;
  std::mt19937_64 rng_;
  time_point now_{};
  std::vector<time_point> compute_started_;  // per worker: when its latest compute job was posted
  std::uint64_t seq_ = 0;
  // The event queue, earliest (time, sequence number) first. An ordered map rather than a
  // heap: a cancelled timer wait or delivery is erased, so it never advances the clock.
  std::map<detail::sim_event_key, detail::sim_action> events_;
  std::vector<node_state> nodes_;
  std::map<std::string, std::uint32_t, std::less<>> node_ids_;
  std::map<std::pair<std::uint32_t, std::uint32_t>, int> links_down_;
  std::vector<fault> faults_;
  std::list<detail::sim_pipe> pipes_;
  std::map<std::string, std::unique_ptr<detail::sim_listener>, std::less<>> listeners_;
  std::set<simulated_timer*> timers_;  // timers with pending waits
  simulation_stats stats_{};
  bool stopped_ = false;
  bool shutting_down_ = false;
  mutable std::optional<asio::io_context> io_;  // mutable: get_executor() const
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
};

inline simulated_clock::time_point simulated_clock::now() noexcept {
  const simulated_network* n = simulated_network::current();
  return n != nullptr ? n->now() : time_point{};
}

namespace detail {
/// The simulated network whose executor `ex` is. Throws `std::invalid_argument` for an
/// executor of any other execution context.
inline simulated_network& network_of(const asio::any_io_executor& ex) {
  auto& ctx = asio::query(ex, asio::execution::context);
  if (!asio::has_service<sim_service>(ctx) || asio::use_service<sim_service>(ctx).net == nullptr)
    throw std::invalid_argument("asyncps: not the executor of a simulated_network");
  return *asio::use_service<sim_service>(ctx).net;
}
}  // namespace detail

/// A waitable timer on the virtual clock; the `timer_type` of `simulated_transport`. Behaves
/// like `asio::steady_timer`: `async_wait` completes with success at the expiry (at once, posted,
/// when already expired) or with `asio::error::operation_aborted` when cancelled, re-armed
/// (`expires_at` / `expires_after`) or destroyed. A wait until `time_point::max()` only ends by
/// cancellation and does not keep the simulation running.
///
/// Completion signature: `void(std::error_code)`, posted to the handler's associated executor.
/// Thread safety: the network's thread. Not copyable or movable (pending waits refer to it).
class simulated_timer {
 public:
  using clock_type = simulated_clock;
  using duration = simulated_clock::duration;
  using time_point = simulated_clock::time_point;
  using executor_type = asio::any_io_executor;

  /// An expired timer. Throws `std::invalid_argument` when `ex` is not a simulated network's.
  explicit simulated_timer(const executor_type& ex)
      : net_(&detail::network_of(ex)), ex_(ex), expiry_(net_->now()) {}
  /// A timer expiring at `t`.
  simulated_timer(const executor_type& ex, time_point t) : simulated_timer(ex) { expiry_ = t; }
  /// A timer expiring `d` from now.
  simulated_timer(const executor_type& ex, duration d) : simulated_timer(ex) {
    expiry_ = net_->now() + d;
  }
  simulated_timer(const simulated_timer&) = delete;
  simulated_timer& operator=(const simulated_timer&) = delete;
  ~simulated_timer() { cancel(); }

  /// The executor it was made with.
  executor_type get_executor() const noexcept { return ex_; }
  /// The current expiry (virtual time).
  time_point expiry() const noexcept { return expiry_; }

  /// Sets the expiry; pending waits complete with `operation_aborted`. Returns their number.
  std::size_t expires_at(time_point t) {
    const std::size_t n = cancel();
    expiry_ = t;
    return n;
  }
  /// Sets the expiry to `now() + d` (saturating at `time_point::max()`).
  std::size_t expires_after(duration d) {
    const auto now = net_->now();
    return expires_at(d >= time_point::max() - now ? time_point::max() : now + d);
  }

  /// Completes every pending wait with `asio::error::operation_aborted`; returns their number.
  std::size_t cancel() {
    if (waits_.empty()) return 0;
    auto ws = std::move(waits_);
    waits_.clear();
    net_->timers_.erase(this);
    for (auto& w : ws) {
      if (w.scheduled) net_->unschedule(w.key);
      net_->complete(w.handler, std::error_code(asio::error::operation_aborted));
    }
    return ws.size();
  }

  /// Waits for the expiry. `token`: any Asio completion token for `void(std::error_code)`
  /// (the library uses `detail::use_tuple`).
  template <class Token>
  auto async_wait(Token&& token) {
    return asio::async_initiate<Token, void(std::error_code)>(
        [this](auto handler) {
          start_wait(detail::sim_completion<std::error_code>(std::move(handler), ex_));
        },
        token);
  }

 private:
  friend class simulated_network;
  struct wait {
    std::uint64_t id;
    detail::sim_completion<std::error_code> handler;
    detail::sim_event_key key;
    bool scheduled;
  };

  void start_wait(detail::sim_completion<std::error_code> h) {
    if (expiry_ <= net_->now()) {
      net_->complete(h, std::error_code{});
      return;
    }
    const std::uint64_t id = ++next_id_;
    wait w{id, std::move(h), {}, false};
    if (expiry_ != time_point::max()) {
      w.key = net_->schedule(expiry_, detail::sim_action([this, id] { fire(id); }));
      w.scheduled = true;
    }
    if (waits_.empty()) net_->timers_.insert(this);
    waits_.push_back(std::move(w));
  }

  void fire(std::uint64_t id) {
    const auto it =
        std::find_if(waits_.begin(), waits_.end(), [id](const wait& w) { return w.id == id; });
    if (it == waits_.end()) return;
    auto h = std::move(it->handler);
    waits_.erase(it);
    if (waits_.empty()) net_->timers_.erase(this);
    net_->complete(h, std::error_code{});
  }

  simulated_network* net_;
  executor_type ex_;
  time_point expiry_;
  std::uint64_t next_id_ = 0;
  std::vector<wait> waits_;
};

/// An executor that runs each job `compute_time(worker)` of virtual time after it is posted
/// (the job then runs on the simulation's thread). Models Asio's executor requirements
/// (`execute`, `query(context)`, `blocking.never`); convert it to `asio::any_io_executor` for
/// `basic_worker`. `basic_worker` posts one job per gradient, so each clock of worker `w` costs
/// one compute time. Obtain it from `simulated_network::compute_executor`.
class simulated_network::compute_executor_type {
 public:
  compute_executor_type(simulated_network& net, std::uint32_t worker) noexcept
      : net_(&net), worker_(worker) {}

  /// Schedules `f` (a `void()` callable) after the worker's compute time.
  template <class F>
  void execute(F&& f) const {
    net_->schedule_compute(worker_, detail::sim_action(std::forward<F>(f)));
  }
  /// Asio property: the network's `io_context`.
  asio::execution_context& query(asio::execution::context_t) const noexcept { return *net_->io_; }
  /// Asio property: `execute` never runs the job inline.
  static constexpr asio::execution::blocking_t query(asio::execution::blocking_t) noexcept {
    return asio::execution::blocking.never;
  }
  /// Asio property: already `blocking.never`.
  compute_executor_type require(asio::execution::blocking_t::never_t) const noexcept {
    return *this;
  }
  /// The worker whose speed factor it applies.
  std::uint32_t worker() const noexcept { return worker_; }
  /// Equal when they charge the same worker on the same network.
  friend bool operator==(const compute_executor_type&, const compute_executor_type&) = default;

 private:
  simulated_network* net_;
  std::uint32_t worker_;
};

inline simulated_network::compute_executor_type
simulated_network::compute_executor(std::uint32_t worker) {
  return compute_executor_type(*this, worker);
}

inline void simulated_network::drop_pending() {
  for (bool any = true; any;) {
    any = false;
    {
      auto events = std::move(events_);
      events_.clear();
      any = any || !events.empty();
    }
    while (!timers_.empty()) {
      simulated_timer* t = *timers_.begin();
      timers_.erase(timers_.begin());
      auto waits = std::move(t->waits_);
      t->waits_.clear();
      any = true;
    }
    std::vector<detail::sim_completion<std::error_code, message>> receivers;
    for (auto& p : pipes_)
      for (auto& d : p.dir)
        if (d.receiver) receivers.push_back(std::move(d.receiver));
    std::vector<detail::sim_completion<std::error_code, detail::sim_pipe*>> accepts;
    for (auto& [name, l] : listeners_)
      if (l->accepting) accepts.push_back(std::move(l->accepting));
    any = any || !receivers.empty() || !accepts.empty();
  }
}

inline simulated_network::~simulated_network() {
  shutting_down_ = true;
  drop_pending();
  work_.reset();
  io_.reset();  // destroys the handlers posted but not run (and their coroutines)
  drop_pending();
}

/// One node's endpoint on a `simulated_network`. Models `asyncps::transport`, with the
/// optional time part (`timer_type`, `clock_type`: the network's virtual time). Endpoints are
/// names (`std::string`); the node is named at construction (several transports may share a
/// node, e.g. a server restarted on the same machine).
///
/// Thread safety: the network's thread. Object lifetime: the network outlives it; it outlives
/// its acceptors (connections only need the network).
class simulated_transport {
 public:
  using executor_type = asio::any_io_executor;
  using endpoint_type = std::string;
  using clock_type = simulated_clock;
  using timer_type = simulated_timer;

  /// One end of a simulated connection. Models `asyncps::connection`.
  class connection {
   public:
    /// A closed connection (placeholder before connecting).
    connection() = default;
    /// Takes over `o`'s end (`o` is left closed).
    connection(connection&& o) noexcept
        : net_(std::exchange(o.net_, nullptr)), pipe_(std::exchange(o.pipe_, nullptr)),
          side_(o.side_), limits_(o.limits_), open_(std::exchange(o.open_, false)) {}
    connection& operator=(connection&& o) noexcept {
      if (this != &o) {
        reset();
        net_ = std::exchange(o.net_, nullptr);
        pipe_ = std::exchange(o.pipe_, nullptr);
        side_ = o.side_;
        limits_ = o.limits_;
        open_ = std::exchange(o.open_, false);
      }
      return *this;
    }
    ~connection() { reset(); }

    /// Puts `m` on the wire; it arrives after the latency model's delay (FIFO per connection).
    /// Completes at once (the sender is never blocked). Errors: `errc::connection_closed`
    /// when this side closed, `std::errc::connection_reset` after a fault. After the peer
    /// closed, sends succeed and the messages are dropped (as TCP's do until the peer's reset
    /// arrives); the peer's close arrives here as `connection_closed` from `async_receive`.
    asio::awaitable<std::error_code> async_send(message m) {
      std::error_code ec = make_error_code(errc::connection_closed);
      if (open_) {
        m.header.payload_bytes = m.payload.size();
        ec = net_->transmit(*pipe_, side_, std::move(m));
        if (ec) close();
      }
      co_return ec;
    }

    /// The next message. Errors: `errc::connection_closed` (either side closed; after the
    /// messages already sent), `std::errc::connection_reset` (a fault), or a
    /// `validate_header` error (the connection stays open: the owner decides).
    asio::awaitable<std::tuple<std::error_code, message>> async_receive() {
      std::tuple<std::error_code, message> out{make_error_code(errc::connection_closed), message{}};
      if (open_) {
        auto [ec, m] = co_await asio::async_initiate<decltype(detail::use_tuple),
                                                     void(std::error_code, message)>(
            [this](auto handler) {
              net_->start_receive(*pipe_, 1 - side_,
                                  detail::sim_completion<std::error_code, message>(
                                      std::move(handler), net_->get_executor()));
            },
            detail::use_tuple);
        if (ec) {
          close();
          std::get<0>(out) = ec;
        } else if (auto v = validate_header(m.header, limits_)) {
          std::get<0>(out) = v;
        } else {
          out = {std::error_code{}, std::move(m)};
        }
      }
      co_return out;
    }

    /// Closes both directions: the peer receives `connection_closed` after the messages
    /// already on their way; an outstanding receive here completes with `connection_closed`.
    void close() noexcept {
      if (!open_) return;
      open_ = false;
      net_->close_side(*pipe_, side_);
    }
    /// False after `close()`, a failed operation, or a fault that reset the connection.
    bool is_open() const noexcept { return open_ && !pipe_->broken; }

   private:
    friend class simulated_transport;
    connection(simulated_network& n, detail::sim_pipe* p, int side, wire_limits lim)
        : net_(&n), pipe_(p), side_(side), limits_(lim), open_(true) {}
    void reset() noexcept {
      close();
      if (pipe_ != nullptr) net_->release(*pipe_);
      pipe_ = nullptr;
    }
    simulated_network* net_ = nullptr;
    detail::sim_pipe* pipe_ = nullptr;
    int side_ = 0;
    wire_limits limits_{};
    bool open_ = false;
  };

  /// A listening name. Models `asyncps::acceptor<connection>`.
  class acceptor {
   public:
    /// Takes over `o`'s name (`o` is left closed).
    acceptor(acceptor&& o) noexcept
        : transport_(o.transport_), name_(std::move(o.name_)),
          listener_(std::exchange(o.listener_, nullptr)) {}
    acceptor& operator=(acceptor&& o) noexcept {
      if (this != &o) {
        close();
        transport_ = o.transport_;
        name_ = std::move(o.name_);
        listener_ = std::exchange(o.listener_, nullptr);
      }
      return *this;
    }
    ~acceptor() { close(); }

    /// The next connection. Errors: `errc::stopped` once closed.
    asio::awaitable<std::tuple<std::error_code, connection>> async_accept() {
      if (listener_ == nullptr) co_return std::tuple{make_error_code(errc::stopped), connection{}};
      simulated_network& net = *transport_->net_;
      auto [ec, p] = co_await asio::async_initiate<decltype(detail::use_tuple),
                                                   void(std::error_code, detail::sim_pipe*)>(
          [this, &net](auto handler) {
            net.start_accept(*listener_, detail::sim_completion<std::error_code, detail::sim_pipe*>(
                                             std::move(handler), net.get_executor()));
          },
          detail::use_tuple);
      if (ec || p == nullptr) co_return std::tuple{make_error_code(errc::stopped), connection{}};
      co_return std::tuple{std::error_code{}, connection{net, p, 1, transport_->limits_}};
    }
    /// Unregisters the name (later connects are refused); an outstanding accept completes
    /// with `errc::stopped`; connections not accepted yet are closed.
    void close() noexcept {
      if (listener_ == nullptr) return;
      transport_->net_->close_listener(std::exchange(listener_, nullptr), name_);
    }

   private:
    friend class simulated_transport;
    acceptor(simulated_transport& t, std::string name, detail::sim_listener* l)
        : transport_(&t), name_(std::move(name)), listener_(l) {}
    simulated_transport* transport_;
    std::string name_;
    detail::sim_listener* listener_;
  };

  using connection_type = connection;
  using acceptor_type = acceptor;

  /// The endpoint of node `node` (created on first use) on `net`; `limits` validate the
  /// frames it receives.
  simulated_transport(simulated_network& net, std::string_view node, wire_limits limits = {})
      : net_(&net), node_(net.node_id(node)), limits_(limits) {}
  simulated_transport(const simulated_transport&) = delete;
  simulated_transport& operator=(const simulated_transport&) = delete;

  /// The network's executor (every node's coroutines run on the simulation's one thread).
  executor_type get_executor() const { return net_->get_executor(); }
  /// Validation limits for received frames.
  const wire_limits& limits() const noexcept { return limits_; }
  /// This transport's node id (see `simulated_network::node_id`).
  std::uint32_t node() const noexcept { return node_; }
  simulated_network& network() const noexcept { return *net_; }

  /// Registers `name` on this node. Errors: `std::errc::address_in_use` when it is taken.
  result<acceptor> listen(const endpoint_type& name) {
    auto [it, fresh] = net_->listeners_.try_emplace(name);
    if (!fresh) return std::make_error_code(std::errc::address_in_use);
    it->second = std::make_unique<detail::sim_listener>();
    it->second->node = node_;
    return acceptor{*this, name, it->second.get()};
  }

  /// Connects to `name` after a simulated round trip. Errors: `std::errc::connection_refused`
  /// when nobody listens there or a fault separates the nodes, `std::errc::connection_reset`
  /// when a fault began during the setup.
  asio::awaitable<std::tuple<std::error_code, connection>> async_connect(endpoint_type name) {
    auto [ec, p] = co_await asio::async_initiate<decltype(detail::use_tuple),
                                                 void(std::error_code, detail::sim_pipe*)>(
        [this](auto handler, std::string n) {
          net_->start_connect(node_, std::move(n),
                              detail::sim_completion<std::error_code, detail::sim_pipe*>(
                                  std::move(handler), net_->get_executor()));
        },
        detail::use_tuple, std::move(name));
    if (ec || p == nullptr) co_return std::tuple{ec, connection{}};
    co_return std::tuple{std::error_code{}, connection{*net_, p, 0, limits_}};
  }

  /// A buffer from the network's pool.
  buffer allocate(std::size_t bytes) { return net_->pool().allocate(bytes); }

 private:
  simulated_network* net_;
  std::uint32_t node_;
  wire_limits limits_;
};

static_assert(transport<simulated_transport>);

}  // namespace asyncps
