// asyncps — simulated_network: the virtual clock, event queue, nodes, fault schedule and
// connections of a simulation; simulated_timer, a timer on its virtual clock; and the executor
// that charges workers' compute time. The endpoint type is simulated_transport
// (asyncps/transport/simulated.hpp, the header to include). Guide: docs/concepts/simulation.md.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
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
#include <utility>
#include <vector>

#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/error.hpp>
#include <asio/execution.hpp>
#include <asio/execution_context.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/query.hpp>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/pipe_connection.hpp"
#include "asyncps/transport/sim/handlers.hpp"
#include "asyncps/transport/sim/pipe.hpp"
#include "asyncps/transport/simulation_options.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

class simulated_timer;
class simulated_transport;

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
  template <class, class>
  friend class detail::pipe_end;  // calls `release`
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

  // --- connections (defined in transport/sim/connections.ipp) -----------------------------

  void schedule_delivery(detail::sim_pipe& p, int d);
  void unschedule_delivery(detail::sim_direction& dir);
  void deliver(detail::sim_pipe& p, int d);
  void try_receive(detail::sim_pipe& p, int d);
  // Puts `m` on the wire of side `side`'s direction; sets `wait_until` to the bytes its
  // receiver must have taken before the send completes (0: at once; send_buffer_bytes).
  std::error_code transmit(detail::sim_pipe& p, int side, message m, std::uint64_t& wait_until);
  // Completes `c` once side `side`'s receiver has taken `until` bytes (or with the error that
  // ends the wait: a fault's, or connection_closed when side `side` closes).
  void start_send_wait(detail::sim_pipe& p, int side, std::uint64_t until,
                       detail::sim_completion<std::error_code> c);
  void wake_senders(detail::sim_direction& dir);  // the sends with room now complete
  void fail_senders(detail::sim_direction& dir, std::error_code ec);
  void break_pipe(detail::sim_pipe& p, std::error_code ec);
  // Side `side` closes: its receive completes; the peer receives connection_closed after the
  // messages already on their way to it (what the peer sends from now on is dropped).
  void close_side(detail::sim_pipe& p, int side);
  void release(detail::sim_pipe& p);
  void start_receive(detail::sim_pipe& p, int d,
                     detail::sim_completion<std::error_code, message> c);
  void start_connect(std::uint32_t from, std::string name,
                     detail::sim_completion<std::error_code, detail::sim_pipe*> c);
  void on_syn(std::uint32_t from, const std::string& name,
              detail::sim_completion<std::error_code, detail::sim_pipe*> c);
  void start_accept(detail::sim_listener& l,
                    detail::sim_completion<std::error_code, detail::sim_pipe*> c);
  void close_listener(detail::sim_listener* l, const std::string& name);

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

}  // namespace asyncps

// The member functions of simulated_network declared above and defined out of line.
#include "asyncps/transport/sim/connections.ipp"
