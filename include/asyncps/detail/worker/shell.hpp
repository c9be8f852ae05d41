// asyncps — the worker's coroutine shell (see asyncps/worker.hpp for what a worker does).
//
// `detail::worker_shell` carries out the steps of the sans-io core (fsm.hpp, protocol.hpp,
// cache.hpp, push_builder.hpp): connections, the wake timer, read loops, reconnects, the
// shutdown. `asyncps::basic_worker` (worker.hpp) is a thin, documented front that holds one,
// with the user's model behind a `model_ref` (model_ref.hpp). Its coroutines are defined in
// shell.ipp, included at the end of this file.
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
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include "asyncps/consistency.hpp"
#include "asyncps/detail/ring.hpp"
#include "asyncps/detail/transport_time.hpp"
#include "asyncps/detail/wait_group.hpp"
#include "asyncps/detail/worker/fsm.hpp"
#include "asyncps/detail/worker/shell_support.hpp"
#include "asyncps/model.hpp"
#include "asyncps/recovery.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/worker_options.hpp"

namespace asyncps::detail {

/// The coroutine shell of `asyncps::basic_worker` (worker.hpp, where its members are
/// documented): connections, the clock loop executing the sans-io core's steps (fsm.hpp), read
/// loops, reconnects and the shutdown. `Model` is a `model_ref` (model_ref.hpp), so the shell
/// is generated once per kind of model (dense or sparse reads and gradients, plain or
/// coroutine gradient), not once per model type, and the common configurations are compiled
/// once under separate compilation (asyncps/src.hpp). Its coroutines are defined out of the
/// class (shell.ipp), so an `extern template` declaration keeps them out of a user's
/// translation unit.
///
/// Thread safety: every member on `transport.get_executor()`.
template <checked_model Model, transport Transport, consistency_policy Consistency,
          recovery_policy Recovery>
class worker_shell {
 public:
  // The transport's timer and clock (asio::steady_timer and std::chrono::steady_clock unless
  // it declares its own, e.g. a simulated transport's virtual time).
  using timer_type = transport_timer_t<Transport>;
  using clock_type = transport_clock_t<Transport>;
  using core_type = worker_core<Model, Consistency, Recovery, Transport, clock_type,
                                typename Transport::endpoint_type>;

  using options_type = worker_options<typename Transport::endpoint_type>;

  // basic_worker's constructor.
  worker_shell(Transport& transport, Model model, options_type opts,
               std::optional<asio::any_io_executor> compute,
               typename Recovery::worker_part recovery)
      : transport_(transport), model_(model), opts_(checked(std::move(opts))),
        compute_(std::move(compute)), wake_(transport.get_executor()),
        tasks_(transport.get_executor()), core_(model_, opts_, transport, std::move(recovery)),
        conns_(opts_.servers.size()), heard_(opts_.servers.size()),
        sending_(opts_.servers.size(), 0), send_queue_(opts_.servers.size()),
        backoff_waits_(opts_.servers.size(), nullptr) {}

  worker_shell(const worker_shell&) = delete;
  worker_shell& operator=(const worker_shell&) = delete;

  // basic_worker::async_run.
  asio::awaitable<std::error_code> async_run(std::uint64_t clocks);

  // The sans-io core (its counters, cache, consistency and recovery part) and the options,
  // for basic_worker's accessors (documented there).
  core_type& core() noexcept { return core_; }
  const core_type& core() const noexcept { return core_; }
  const options_type& options() const noexcept { return opts_; }

  void stop_at(clock_value clock) noexcept {
    opts_.end_clock = opts_.end_clock ? std::min(*opts_.end_clock, clock) : clock;
  }

  // basic_worker::stop: the loops check stop_requested_ before each step, connect attempt
  // and reconnect attempt; the wake-up timer's wait and every reconnect's backoff wait end
  // now, and a handshake in progress ends with its connection (an established link is left to
  // shutdown's bye).
  void stop() noexcept {
    stop_requested_ = true;
    wake_.cancel();
    for (auto* t : backoff_waits_)
      if (t != nullptr) t->cancel();
    for (auto& l : core_.links())
      if (!l.up && conns_[l.shard].is_open()) conns_[l.shard].close();
  }

 private:
  using step = loop_step;

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

  asio::awaitable<std::error_code> connect_all();

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
                  duration_text(opts_.silence_timeout) +
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
  asio::awaitable<std::error_code> handshake(std::uint32_t s);

  // Receives link `s`'s messages until it is down. An allocation failure (receiving a frame,
  // handling it, queueing the replies) fails the link and ends the run (out_of_memory).
  asio::awaitable<void> read_loop(std::uint32_t s);

  // The recovery part's replies to link `s` (e.g. recovery::replica_log's commits), sent now,
  // or queued when the clock loop is sending on the link (it sends them after its message):
  // a connection takes one send at a time.
  asio::awaitable<std::error_code> send_replies(std::uint32_t s);
  // Sends link `s`'s queued replies in order (the caller holds `sending_[s]`).
  asio::awaitable<std::error_code> drain(std::uint32_t s);

  // Reconnects link `s` with exponential backoff until it is connected and greeted (then the
  // clock loop finishes the rejoin, see `join_links`), the worker stops, or the policy's
  // reconnect_timeout passes (then the run ends with errc::server_lost).
  // An allocation failure gives up on the link and ends the run (out_of_memory).
  asio::awaitable<void> reconnect(std::uint32_t s);
  // The attempts of `reconnect`: ends with the link greeted (`l.joining`), given up, or the
  // worker stopping.
  asio::awaitable<void> reconnect_attempts(std::uint32_t s);

  // Finishes the rejoin of every reconnected link, at a clock boundary of the clock loop (so
  // nothing else sends on it meanwhile): what the recovery policy queues (`on_rejoin`: e.g.
  // clock messages for the clocks trained locally, replica, backlog, resent pushes), then the
  // link is up.
  asio::awaitable<void> join_links();

  // Leaves the servers and ends every read loop and reconnect. An allocation failure here
  // only costs a bye or the graceful wait: the connections are closed all the same.
  asio::awaitable<void> shutdown();

  Transport& transport_;
  Model model_;  // a model_ref: the user's model, by reference
  options_type opts_;
  std::optional<asio::any_io_executor> compute_;
  timer_type wake_;
  wait_group<timer_type> tasks_;  // read loops and reconnects running
  core_type core_;
  std::vector<typename Transport::connection_type> conns_;  // per shard
  // Per shard: when its server was last heard from (any message), for silence_timeout.
  std::vector<typename clock_type::time_point> heard_;
  std::vector<rejoin_message> rejoin_out_;  // scratch of join_links
  // Recovery parts that take server messages (`on_server_message`) and VAP readers (their
  // visibility acks) reply from the read loops: per shard, whether a send is in progress and
  // what waits for it.
  static constexpr bool replies =
      worker_hooks::takes_server_messages<typename Recovery::worker_part> ||
      is_value_bounded_v<Consistency>;
  std::vector<char> sending_;
  std::vector<ring<message>> send_queue_;
  // Per shard: the backoff timer of its reconnect in progress (null when none), for stop().
  std::vector<timer_type*> backoff_waits_;
  bool stopping_ = false;
  bool stop_requested_ = false;  // stop(): end the run with errc::stopped
};

}  // namespace asyncps::detail

#include "asyncps/detail/worker/shell.ipp"
