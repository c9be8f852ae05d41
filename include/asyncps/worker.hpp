// asyncps — basic_worker: the pull -> gradient -> push -> clock loop of one worker.
//
// A worker connects to every shard, keeps a local cache of all tables stamped with the server
// clock each part reflects (each row, for a model with sparse reads), and per clock: asks its
// consistency policy whether each cached part (or the rows the model will read) may be read
// (pulling or waiting when not), snapshots the cache, computes the gradient
// straight into a pooled buffer (on the compute executor, so I/O continues meanwhile), applies
// it to its own cache (read-my-writes), and pushes each shard's slice of that same buffer
// without copying it, the last push of a shard marking the end of the clock.
//
// This file is the coroutine shell: connections, the wake timer, reconnects. What to send and
// when is decided by the sans-io core (detail/worker/fsm.hpp, detail/worker/protocol.hpp,
// detail/worker/cache.hpp, detail/worker/push_builder.hpp); the recovery policy plugs in through
// the hooks of its worker part (recovery/worker_hooks.hpp). Its options and counters
// (`worker_options`, `worker_stats`, `clock_report`) are in asyncps/worker_options.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <asio/any_io_executor.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/use_awaitable.hpp>

#include "asyncps/consistency.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/ring.hpp"
#include "asyncps/detail/transport_time.hpp"
#include "asyncps/detail/wait_group.hpp"
#include "asyncps/detail/worker/fsm.hpp"
#include "asyncps/detail/worker/shell_support.hpp"
#include "asyncps/model.hpp"
#include "asyncps/recovery.hpp"
#include "asyncps/recovery/none.hpp"  // the default template argument only
#include "asyncps/transport.hpp"
#include "asyncps/transport/tcp.hpp"
#include "asyncps/worker_options.hpp"

namespace asyncps {

/// One worker.
///
/// Template parameters: `Model` (models `model`), `Transport` (models `transport`),
/// `Consistency` (models `consistency_policy`, same as the servers'), `Recovery` (models
/// `recovery_policy`, same as the servers'; its worker part's hooks are listed in
/// docs/concepts/recovery.md, "Worker hooks").
///
/// Thread safety: call every member on `transport.get_executor()` (a strand or a
/// single-threaded context). `compute_gradient` runs on `compute` when given (e.g. a
/// `asio::thread_pool`'s executor) so communication overlaps it; otherwise inline.
/// Object lifetime: transport and model outlive the worker; `async_run` must have completed
/// before the worker is destroyed.
template <checked_model Model, transport Transport, consistency_policy Consistency,
          recovery_policy Recovery = recovery::none>
class basic_worker {
 public:
  using model_type = Model;
  using transport_type = Transport;
  using consistency_type = Consistency;
  using recovery_type = Recovery;
  using options_type = worker_options<typename Transport::endpoint_type>;

  /// Throws `std::invalid_argument` when `opts.servers` is empty. `recovery` is the worker
  /// part of the recovery policy (default-constructed when omitted).
  basic_worker(Transport& transport, Model& model, options_type opts,
               std::optional<asio::any_io_executor> compute = std::nullopt,
               typename Recovery::worker_part recovery = {})
      : transport_(transport), model_(model), opts_(checked(std::move(opts))),
        compute_(std::move(compute)), wake_(transport.get_executor()),
        tasks_(transport.get_executor()), core_(model, opts_, transport, std::move(recovery)),
        conns_(opts_.servers.size()), heard_(opts_.servers.size()),
        sending_(opts_.servers.size(), 0), send_queue_(opts_.servers.size()) {}

  basic_worker(const basic_worker&) = delete;
  basic_worker& operator=(const basic_worker&) = delete;

  /// Runs `clocks` iterations of pull -> gradient -> push -> clock (fewer when its clock
  /// reaches `worker_options::end_clock` first), then closes its connections. Completes with
  /// success, or: the code of a server's refusal (its error frame's `seq`, the reason logged
  /// escaped, at most 200 bytes): `errc::bad_sender` (id >= num_workers), `errc::duplicate_worker`,
  /// `errc::policy_mismatch`, `errc::layout_mismatch` (the log names each differing table, both
  /// sides' rows x width), `errc::non_finite_value` (a NaN or infinite push refused mid-run),
  /// `errc::non_finite_update` (a finite push that would have made a parameter non-finite, refused
  /// whole mid-run), ...; `errc::server_lost` (a connection failed and the recovery policy gave
  /// up), `errc::timeout` (no fresh rows, or no ack of pending pushes, within `wait_timeout`; the
  /// log names the clock waited for, the shard, its server clock and the slowest worker when the
  /// server reported it), `errc::bad_gradient`
  /// (`check_gradients`), `errc::unexpected_message` (a malformed handshake reply),
  /// a routine refusal's code (the recovery policy's `on_refused` answered `next_server`, e.g.
  /// chain replication's `errc::not_head`: no server of a shard accepted it within
  /// `connect_timeout`), `errc::worker_id_in_use` (a live connection held this worker's id
  /// for all of `connect_timeout`: retried meanwhile), a refusal the policy answers `lost` (e.g.
  /// chain replication's `errc::shard_lost`: every server holding a shard's state failed;
  /// `stats().lost_pushes` counts this worker's pushes lost with it), or a connect error (the log
  /// names the endpoint; one that `is_final_connect_error` says no retry can fix, such as a wrong
  /// secret or a refused certificate, ends the run at once instead of after `connect_timeout`),
  /// `errc::resource_exhausted` (an allocation failed, `std::bad_alloc` or `std::length_error`, in
  /// the worker's loops or its transport: logged once, counted in `stats().out_of_memory`; no
  /// exception leaves the run). Precondition: runs on `transport.get_executor()`.
  asio::awaitable<std::error_code> async_run(std::uint64_t clocks) {
    std::error_code ec;
    try {
      ec = co_await connect_all();
    } catch (...) {  // the first resume ends the run
      detail::rethrow_unless_no_memory();
      core_.out_of_memory("connecting to the servers");
    }
    core_.start(clocks, ec);
    // The whole clock loop runs in this one coroutine frame, executing the core's steps: a
    // coroutine call per clock would allocate a frame per clock (too large for Asio's frame
    // recycling).
    for (;;) {
      const char* doing = "building the next message";
      try {
        auto a = core_.resume(clock_type::now());
        if (a.kind == step::done) {
          ec = a.ec;
          break;
        }
        switch (a.kind) {
          case step::join:
            doing = "rejoining a server";
            co_await join_links();
            break;
          case step::send: {
            doing = "sending a message";
            if constexpr (replies) {
              // A read loop may be sending the recovery part's replies on this link.
              if (sending_[a.shard]) {
                send_queue_[a.shard].push_back(std::move(a.msg));
                break;
              }
            }
            detail::send_turn turn(sending_, a.shard);
            if (auto err = co_await conns_[a.shard].async_send(std::move(a.msg))) {
              if constexpr (replies) send_queue_[a.shard].clear();
              fail(a.shard, err, "");
            }
            if constexpr (replies) {
              if (auto err = co_await drain(a.shard)) fail(a.shard, err, "");
            }
            break;
          }
          case step::reconnect:
            doing = "starting a reconnect";
            spawn(reconnect(a.shard));
            break;
          case step::wait:
            doing = "waiting";
            if (auto wait = silence_check(a.wait)) {
              wake_.expires_after(*wait);
              co_await wake_.async_wait(detail::use_tuple);
            }
            break;
          case step::compute: {
            doing = "computing a gradient";
            buffer grad = transport_.allocate(core_.snapshot().size() * sizeof(float));
            const auto tables = core_.cache().tables();
            const parameter_view params(tables, core_.snapshot().data());
            gradient_view gview(tables, reinterpret_cast<float*>(grad.data()));
            if (opts_.check_gradients) detail::fill_bits(grad, unwritten_gradient_bits);
            float loss = 0;
            if constexpr (async_gradient_source<Model>) {
              loss = co_await model_.async_compute_gradient(params, gview);
            } else if (compute_) {
              loss = co_await asio::co_spawn(
                  *compute_,
                  [&]() -> asio::awaitable<float> {
                    co_return model_.compute_gradient(params, gview);
                  },
                  asio::use_awaitable);
            } else {
              loss = model_.compute_gradient(params, gview);
            }
            core_.computed(std::move(grad), loss, clock_type::now());
            break;
          }
          case step::done: break;  // (above)
        }
      } catch (...) {  // the next resume ends the run
        detail::rethrow_unless_no_memory();
        core_.out_of_memory(doing);
      }
    }
    co_await shutdown();
    // One that came after the last step (a read loop's, during the shutdown) ends it too.
    if (!ec && core_.stats().out_of_memory > 0) ec = make_error_code(errc::resource_exhausted);
    co_return ec;
  }

  /// The worker's current clock.
  clock_value clock() const noexcept { return core_.clock(); }
  /// The consistency policy object, for policies configured at run time (e.g.
  /// `consistency::vap::magnitude`). Set it before `async_run`; on the worker's executor.
  Consistency& consistency() noexcept { return core_.consistency(); }
  const Consistency& consistency() const noexcept { return core_.consistency(); }
  /// Observed staleness of every read so far: one sample per row read per clock (`clock -` the
  /// row's server clock; see `staleness_histogram`).
  const staleness_histogram& staleness() const noexcept { return core_.staleness(); }
  const worker_stats& stats() const noexcept { return core_.stats(); }
  /// The recovery policy's worker part (its options; its counters, e.g. `recovery().stats()`
  /// for `recovery::stateless`). On the worker's executor.
  typename Recovery::worker_part& recovery() noexcept { return core_.recovery(); }
  const typename Recovery::worker_part& recovery() const noexcept { return core_.recovery(); }
  /// The local cache of all tables (table-major, see parameter_view).
  parameter_view cache() const noexcept {
    return {core_.cache().tables(), core_.cache().values().data()};
  }
  const options_type& options() const noexcept { return opts_; }

  /// Ends the run early: `async_run` starts no clock once the worker's clock has reached
  /// `clock` (clocks, as `worker_options::end_clock`; the earlier of the two wins), finishes
  /// the clock in progress, leaves the servers and completes with success. For a fixed amount
  /// of work split between workers at run time (elastic membership lets the others go on
  /// without it). Precondition: on `transport.get_executor()`, e.g. from `on_clock`.
  void stop_at(clock_value clock) noexcept {
    opts_.end_clock = opts_.end_clock ? std::min(*opts_.end_clock, clock) : clock;
  }

 private:
  // The transport's timer and clock (asio::steady_timer and std::chrono::steady_clock unless
  // it declares its own, e.g. a simulated transport's virtual time).
  using timer_type = detail::transport_timer_t<Transport>;
  using clock_type = detail::transport_clock_t<Transport>;
  using core_type = detail::worker_core<Model, Consistency, Recovery, Transport, clock_type,
                                        typename Transport::endpoint_type>;
  using step = detail::loop_step;

  static options_type checked(options_type o) {
    if (o.servers.empty())
      throw std::invalid_argument("asyncps::worker_options: servers must not be empty");
    return o;
  }

  // Link `s` failed: mark it down, close its connection, wake the clock loop.
  void fail(std::uint32_t s, std::error_code ec, std::string reason) {
    if (!core_.fail(s, ec, std::move(reason))) return;
    conns_[s].close();
    wake_.cancel();
  }
  // Starts `task` (a read loop or a reconnect), counted in tasks_. Throws what co_spawn
  // throws (std::bad_alloc), the task then neither counted nor started.
  void spawn(asio::awaitable<void> task) {
    tasks_.add();
    try {
      asio::co_spawn(transport_.get_executor(), std::move(task), asio::detached);
    } catch (...) {
      tasks_.done();
      throw;
    }
  }
  void start_reading(std::uint32_t s) {
    auto& l = core_.link_of(s);
    l.reading = true;
    try {
      spawn(read_loop(s));
    } catch (...) {
      l.reading = false;
      throw;
    }
  }

  asio::awaitable<std::error_code> connect_all() {
    for (auto& l : core_.links()) {
      const auto deadline = clock_type::now() + opts_.connect_timeout;
      std::chrono::milliseconds backoff{20};
      bool logged = false;
      for (;;) {
        auto [ec, conn] = co_await transport_.async_connect(core_.endpoint_of(l));
        bool routine = false;  // a refusal the recovery policy answers `next_server`
        if (!ec) {
          conns_[l.shard] = std::move(conn);
          ec = co_await handshake(l.shard);
          if (!ec) break;
          // A routine refusal: the shard's next server (e.g. a chain's head); worker_id_in_use:
          // a live connection holds this id (e.g. this worker's previous process, not yet seen
          // to be gone): retry.
          routine = l.refusal == refusal_action::next_server;
          if (!routine && ec != errc::worker_id_in_use) co_return ec;
        } else if (is_final_connect_error(ec)) {  // e.g. a wrong secret: no retry helps
          core_.log("cannot connect to " + core_.server_name(l) + ": " + ec.message());
          co_return ec;
        }
        const auto now = clock_type::now();
        if (now >= deadline) {
          core_.log("cannot connect to " + core_.server_name(l) + ": " + ec.message());
          co_return ec;
        }
        if (!logged && !routine) {  // say so now, not after connect_timeout
          logged = true;
          core_.log("cannot connect to " + core_.server_name(l) + " (" + ec.message() +
                    "); retrying for " + detail::duration_text(opts_.connect_timeout));
        }
        core_.next_endpoint(l);
        if (l.endpoint != 0) continue;  // try the shard's other servers before backing off
        // The last wait is cut to the deadline, so the worker tries until the timeout ends.
        wake_.expires_after(std::min<typename clock_type::duration>(backoff, deadline - now));
        co_await wake_.async_wait(detail::use_tuple);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
      }
      l.up = true;
    }
    for (auto& l : core_.links()) start_reading(l.shard);
    co_return std::error_code{};
  }

  // `worker_options::silence_timeout`: before a wait of `wait`, fails every link the worker
  // waits on that has sent nothing for that long (then returns nothing: the loop goes on at
  // once and handles the failure), else returns the wait, cut to the earliest silence deadline.
  template <class Duration>
  std::optional<Duration> silence_check(Duration wait) {
    if (opts_.silence_timeout <= std::chrono::milliseconds::zero()) return wait;
    const auto now = clock_type::now();
    bool failed = false;
    for (auto& l : core_.links()) {
      if (!l.up || !core_.waits_on(l.shard)) continue;
      const auto deadline = heard_[l.shard] + opts_.silence_timeout;
      if (deadline <= now) {
        core_.log(core_.server_name(l) + " has sent nothing for " +
                  detail::duration_text(opts_.silence_timeout) +
                  " while this worker waits for it (silence_timeout): taken for lost");
        fail(l.shard, make_error_code(errc::timeout), "silent");
        failed = true;
      } else {
        wait = std::min(wait, std::chrono::duration_cast<Duration>(deadline - now));
      }
    }
    if (failed) return std::nullopt;
    return wait;
  }

  // Sends link `s`'s hello and checks the reply (see worker_protocol::on_handshake_reply).
  asio::awaitable<std::error_code> handshake(std::uint32_t s) {
    if (auto ec = co_await conns_[s].async_send(core_.hello(s))) co_return ec;
    auto [ec, m] = co_await conns_[s].async_receive();
    if (ec) co_return ec;
    heard_[s] = clock_type::now();
    if (auto err = core_.on_handshake_reply(s, m)) {
      conns_[s].close();
      co_return err;
    }
    co_return std::error_code{};
  }

  // Receives link `s`'s messages until it is down. An allocation failure (receiving a frame,
  // handling it, queueing the replies) fails the link and ends the run (out_of_memory).
  asio::awaitable<void> read_loop(std::uint32_t s) {
    while (core_.link_of(s).up) {
      try {
        auto [ec, m] = co_await conns_[s].async_receive();
        if (ec) {
          fail(s, ec, "");
          break;
        }
        core_.stats().bytes_in += m.payload.size();
        heard_[s] = clock_type::now();
        const auto out = core_.on_message(s, m);
        if (out.error) {
          fail(s, out.error, "");
          break;
        }
        if constexpr (replies) {
          if (auto err = co_await send_replies(s)) {
            fail(s, err, "");
            break;
          }
        }
        if (out.closed) conns_[s].close();
        if (out.wake) wake_.cancel();
      } catch (...) {
        detail::rethrow_unless_no_memory();
        core_.out_of_memory("receiving from", s);
        fail(s, make_error_code(errc::resource_exhausted), "out of memory");
        break;
      }
    }
    core_.link_of(s).reading = false;
    wake_.cancel();
    tasks_.done();
  }

  // The recovery part's replies to link `s` (e.g. recovery::replica_log's commits), sent now,
  // or queued when the clock loop is sending on the link (it sends them after its message):
  // a connection takes one send at a time.
  asio::awaitable<std::error_code> send_replies(std::uint32_t s) {
    auto& r = core_.replies(s);
    if (r.empty()) co_return std::error_code{};
    for (auto& m : r) send_queue_[s].push_back(std::move(m));
    r.clear();
    if (sending_[s]) co_return std::error_code{};
    detail::send_turn turn(sending_, s);
    co_return co_await drain(s);
  }
  // Sends link `s`'s queued replies in order (the caller holds `sending_[s]`).
  asio::awaitable<std::error_code> drain(std::uint32_t s) {
    auto& q = send_queue_[s];
    std::error_code ec;
    while (!ec && !q.empty()) {
      message m = std::move(q.front());
      q.pop_front();
      ec = co_await conns_[s].async_send(std::move(m));
    }
    if (ec) q.clear();
    co_return ec;
  }

  // Reconnects link `s` with exponential backoff until it is connected and greeted (then the
  // clock loop finishes the rejoin, see `join_links`), the worker stops, or the policy's
  // reconnect_timeout passes (then the run ends with errc::server_lost).
  // An allocation failure gives up on the link and ends the run (out_of_memory).
  asio::awaitable<void> reconnect(std::uint32_t s) {
    auto& l = core_.link_of(s);
    try {
      co_await reconnect_attempts(s);
    } catch (...) {
      detail::rethrow_unless_no_memory();
      core_.out_of_memory("reconnecting to", s);
      conns_[s].close();
      l.gave_up = true;
      l.refused = true;
      l.failure = make_error_code(errc::resource_exhausted);
    }
    l.reconnecting = false;
    wake_.cancel();
    tasks_.done();
  }
  // The attempts of `reconnect`: ends with the link greeted (`l.joining`), given up, or the
  // worker stopping.
  asio::awaitable<void> reconnect_attempts(std::uint32_t s) {
    auto& l = core_.link_of(s);
    timer_type timer(transport_.get_executor());
    const auto timeout = std::chrono::milliseconds(core_.recovery().reconnect_timeout());
    const auto deadline = clock_type::now() + timeout;
    std::chrono::milliseconds backoff{20};
    while (!stopping_) {
      if (!l.reading) {  // the old read loop is done with the old connection
        auto [ec, conn] = co_await transport_.async_connect(core_.endpoint_of(l));
        if (ec && is_final_connect_error(ec)) {  // e.g. a wrong secret: no retry helps
          core_.log("cannot reconnect to server " + std::to_string(s) + ": " + ec.message() +
                    "; giving up");
          l.gave_up = true;
          l.refused = true;
          l.failure = ec;
          break;
        }
        if (!ec && !stopping_) {
          conns_[s] = std::move(conn);
          ec = co_await handshake(s);
          if (!ec && !stopping_) {
            l.joining = true;
            break;
          }
          conns_[s].close();
          if (ec == errc::layout_mismatch || ec == errc::server_lost ||
              l.refusal == refusal_action::lost || ec == condition::protocol_violation) {
            l.gave_up = true;  // a different server answers there: retrying will not help
            l.refused = ec != errc::server_lost;
            l.failure = ec;
            break;
          }
        }
        core_.next_endpoint(l);         // the next server may serve the shard (replicas)
        if (l.endpoint != 0) continue;  // back off only after trying every server once
      }
      const auto now = clock_type::now();
      if (now >= deadline) {
        core_.log("server " + std::to_string(s) + " still unreachable after " +
                  std::to_string(timeout.count()) + " ms; giving up");
        l.gave_up = true;
        l.refused = false;  // lost, whatever refusal started the outage
        break;
      }
      // The last wait is cut to the deadline, so the worker tries until the timeout ends.
      timer.expires_after(std::min<typename clock_type::duration>(backoff, deadline - now));
      co_await timer.async_wait(detail::use_tuple);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
    }
  }

  // Finishes the rejoin of every reconnected link, at a clock boundary of the clock loop (so
  // nothing else sends on it meanwhile): what the recovery policy queues (`on_rejoin`: e.g.
  // clock messages for the clocks trained locally, replica, backlog, resent pushes), then the
  // link is up.
  asio::awaitable<void> join_links() {
    for (auto& l : core_.links()) {
      if (!l.joining) continue;
      l.joining = false;
      core_.queue_rejoin(l.shard, rejoin_out_);
      std::error_code ec;
      for (auto& q : rejoin_out_) {
        core_.stats().bytes_out += q.counted_bytes;
        const frame_header h = q.msg.header;
        if ((ec = co_await conns_[l.shard].async_send(std::move(q.msg)))) break;
        core_.rejoin_sent(l.shard, h);
      }
      rejoin_out_.clear();
      if (ec) {
        l.failure = ec;
        conns_[l.shard].close();
        continue;  // still down: the clock loop's check starts over
      }
      core_.rejoined(l.shard);
      start_reading(l.shard);
    }
  }

  // Leaves the servers and ends every read loop and reconnect. An allocation failure here
  // only costs a bye or the graceful wait: the connections are closed all the same.
  asio::awaitable<void> shutdown() {
    stopping_ = true;
    for (auto& l : core_.links()) {
      if (!l.up) continue;
      try {
        message bye;
        bye.header.type = message_type::bye;
        bye.header.sender = opts_.id;
        if constexpr (replies) {
          // A read loop may be sending replies: the bye goes after them.
          send_queue_[l.shard].push_back(std::move(bye));
          if (sending_[l.shard]) continue;
          detail::send_turn turn(sending_, l.shard);
          (void)co_await drain(l.shard);
        } else {
          (void)co_await conns_[l.shard].async_send(std::move(bye));
        }
      } catch (...) {
        detail::rethrow_unless_no_memory();  // (the close below goes on)
      }
    }
    // Graceful close: a server answers `bye` by closing once it has sent what it queued.
    // Closing first could reset a TCP connection that still has rows arriving (ESSP, VAP), and
    // a reset may drop this worker's last pushes before the server has read them. (A bounded
    // poll rather than tasks_: this wait ends after 2 s whatever is still open.)
    try {
      const auto deadline = clock_type::now() + std::chrono::seconds(2);
      while (clock_type::now() < deadline &&
             std::any_of(core_.links().begin(), core_.links().end(),
                         [](const auto& l) { return l.up && l.reading; })) {
        wake_.expires_after(std::chrono::milliseconds(10));
        co_await wake_.async_wait(detail::use_tuple);
      }
    } catch (...) {
      detail::rethrow_unless_no_memory();  // (the close below goes on)
    }
    for (auto& l : core_.links()) {
      l.up = false;
      conns_[l.shard].close();
    }
    // Every read loop and reconnect has ended (they must, before the worker may go: a wait
    // that cannot be allocated is tried again).
    while (tasks_.count() > 0) {
      try {
        co_await tasks_.async_wait();
      } catch (...) {
        detail::rethrow_unless_no_memory();
      }
    }
    rejoin_out_.clear();
    core_.clear_local();
  }

  Transport& transport_;
  Model& model_;
  options_type opts_;
  std::optional<asio::any_io_executor> compute_;
  timer_type wake_;
  detail::wait_group<timer_type> tasks_;  // read loops and reconnects running
  core_type core_;
  std::vector<typename Transport::connection_type> conns_;  // per shard
  // Per shard: when its server was last heard from (any message), for silence_timeout.
  std::vector<typename clock_type::time_point> heard_;
  std::vector<rejoin_message> rejoin_out_;  // scratch of join_links
  // Recovery parts that take server messages (`on_server_message`) and VAP readers (their
  // visibility acks) reply from the read loops: per shard, whether a send is in progress and
  // what waits for it.
  static constexpr bool replies =
      detail::worker_hooks::takes_server_messages<typename Recovery::worker_part> ||
      is_value_bounded_v<Consistency>;
  std::vector<char> sending_;
  std::vector<detail::ring<message>> send_queue_;
  bool stopping_ = false;
};

/// The TCP worker most programs use: `basic_worker` over `tcp_transport`, with no recovery
/// unless named. Example: `asyncps::worker<my_model, consistency::ssp<3>>`.
template <checked_model Model, consistency_policy Consistency,
          recovery_policy Recovery = recovery::none>
using worker = basic_worker<Model, tcp_transport, Consistency, Recovery>;

}  // namespace asyncps
