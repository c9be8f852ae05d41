// asyncps — basic_chain_master: the membership service of chain replication.
//
// As in van Renesse & Schneider (OSDI'04), one master decides every chain's order: servers
// register with it and send heartbeats; when one fails (its connection drops, or it is silent
// for `heartbeat_timeout`) the master removes it and tells its neighbours their new
// predecessor / successor (a `chain_config` message); a server that registers while its
// shard's chain is running is appended as the new tail and receives the old tail's state.
// Workers need no master: they try a shard's servers in turn, and only the head accepts them.
//
// The master itself is not replicated (the paper runs it on Paxos): run it where it outlives
// the servers, e.g. in the process that supervises them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <new>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/accept_loop.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/peer_address.hpp"
#include "asyncps/detail/transport_time.hpp"
#include "asyncps/detail/wait_group.hpp"
#include "asyncps/peer_identity.hpp"
#include "asyncps/recovery/chain/master_core.hpp"
#include "asyncps/recovery/chain/master_options.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

/// The chain master. `Transport` models `transport`.
///
/// Thread safety: construct anywhere; call every member on `transport.get_executor()`.
/// Object lifetime: the transport outlives the master; `async_serve` must have completed
/// before it is destroyed.
template <transport Transport>
class basic_chain_master {
 public:
  /// Throws `std::invalid_argument` when `num_shards` or `members` is 0.
  basic_chain_master(Transport& transport, chain_master_options opts)
      : transport_(transport), core_(std::move(opts), io_), running_(transport.get_executor()),
        pause_(transport.get_executor()) {
    io_.self = this;
  }
  basic_chain_master(const basic_chain_master&) = delete;
  basic_chain_master& operator=(const basic_chain_master&) = delete;

  /// Serves registrations on `acceptor` until `stop()`. Completes with success after a stop,
  /// or with the acceptor's error; a transient one (out of descriptors, no memory for the
  /// accept, ...) is logged and retried after a pause instead (`detail::serve_sessions`). An
  /// allocation failure while one connection is served closes that connection only
  /// (`chain_master_stats::out_of_memory`). Precondition: runs on `transport.get_executor()`.
  asio::awaitable<std::error_code> async_serve(typename Transport::acceptor_type acceptor) {
    running_.add();  // the watchdog
    asio::co_spawn(transport_.get_executor(), watchdog(), asio::detached);
    co_return co_await detail::serve_sessions(
        acceptor, acceptor_, pause_, stopped_, sessions_, running_, transport_.get_executor(),
        [this](session& s) { start(s); }, [this] { stop(); },
        [this](std::error_code ec, std::chrono::milliseconds pause) {
          core_.on_accept_failure(ec, pause);
        });
  }

  /// Stops accepting and closes every connection; `async_serve` then completes.
  void stop() {
    stopped_ = true;
    if (acceptor_ != nullptr) acceptor_->close();
    pause_.cancel();
    core_.on_stop();
    for (auto& s : sessions_) close(s);  // also those the core already saw closed
  }

  /// Shard `shard`'s chain, head first (member ids). Empty before its first configuration.
  std::vector<std::uint32_t> chain(std::uint32_t shard) const { return core_.chain(shard); }
  /// Whether every shard's chain has started.
  bool started() const noexcept { return core_.started(); }
  const chain_master_stats& stats() const noexcept { return core_.stats(); }

 private:
  // The transport's timer and clock (asio::steady_timer and std::chrono::steady_clock unless
  // it declares its own, e.g. a simulated transport's virtual time).
  using timer_type = detail::transport_timer_t<Transport>;
  using clock_type = detail::transport_clock_t<Transport>;

  struct session : detail::chain_master_session<typename clock_type::time_point> {
    session(typename Transport::connection_type c, const typename Transport::executor_type& ex)
        : conn(std::move(c)), wake(ex, clock_type::time_point::max()) {}
    typename Transport::connection_type conn;
    timer_type wake;
    typename std::list<session>::iterator self;
    int running = 2;  // its read and write loops
  };

  // What the core asks of the shell (master_core.hpp, `Io`).
  struct io {
    basic_chain_master* self = nullptr;
    typename clock_type::time_point now() const { return clock_type::now(); }
    buffer allocate(std::size_t n) const { return self->transport_.allocate(n); }
    void wake(session& s) const { s.wake.cancel(); }
    void close(session& s) const { self->close(s); }
    std::string address(const session& s) const { return detail::peer_address(s.conn); }
    std::string host(const session& s) const { return detail::peer_host(s.conn); }
    std::shared_ptr<const peer_identity> identity(const session& s) const {
      return detail::identity_of(s.conn);
    }
    std::string tls_note(const session& s) const { return detail::tls_failure_note(s.conn); }
  };
  using core_type = detail::chain_master_core<session, typename clock_type::time_point, io>;

  // A new session (`detail::serve_sessions`): its read and write loops, which finish it. No
  // memory to spawn them closes it (out_of_memory), and each loop not spawned finishes it in
  // its place. Does not throw (serve_sessions' contract).
  void start(session& s) {
    core_.on_open(s);
    int spawned = detail::spawn_session_loops(
        transport_.get_executor(), [&] { return read_loop(s); }, [&] { return write_loop(s); });
    if (spawned == 2) return;
    core_.on_out_of_memory(s, "no memory to start its session");
    for (; spawned < 2; ++spawned) finish(s);  // the last one erases s
  }

  void close(session& s) {
    s.open = false;
    s.conn.close();
    s.wake.cancel();
  }

  asio::awaitable<void> write_loop(session& s) {
    std::vector<message> sending;
    bool no_memory = false;
    try {
      while (s.open || !s.outbox.empty()) {
        if (s.outbox.empty()) {
          co_await s.wake.async_wait(detail::use_tuple);
          continue;
        }
        std::swap(s.outbox, sending);
        for (auto& m : sending)
          if (co_await s.conn.async_send(std::move(m))) s.open = false;
        sending.clear();
        if (!s.open) break;
      }
    } catch (const std::bad_alloc&) {
      no_memory = true;
    } catch (const std::length_error&) {
      no_memory = true;
    }
    if (no_memory && s.open) core_.on_out_of_memory(s, "no memory to send its messages");
    close(s);
    finish(s);
  }

  // Reads `s`'s messages until it closes or is refused. An allocation failure while a frame
  // is received (the transport allocates its buffer) or handled closes `s` only
  // (out_of_memory); it must not end the coroutine without finish() (the session would stay,
  // registered, and async_serve would never complete).
  asio::awaitable<void> read_loop(session& s) {
    while (s.open) {
      const char* what = "no memory for a received frame";
      bool go_on = false;
      bool no_memory = false;
      try {
        auto [ec, m] = co_await s.conn.async_receive();
        what = "no memory to handle its message";
        go_on = core_.on_receive(s, ec, m);
      } catch (const std::bad_alloc&) {
        no_memory = true;
      } catch (const std::length_error&) {
        no_memory = true;
      }
      if (no_memory && s.open) core_.on_out_of_memory(s, what);
      if (!go_on) break;
    }
    close(s);
    finish(s);
  }

  // One of `s`'s two loops ended; the last one takes it out of the core (and its chain) and
  // erases it.
  void finish(session& s) {
    if (--s.running > 0) return;
    core_.on_closed(s);
    sessions_.erase(s.self);
    running_.done();
  }

  // Calls the core's watchdog every `tick_interval()` until the master stops. No memory for
  // the wait checks at once.
  asio::awaitable<void> watchdog() {
    timer_type timer(transport_.get_executor());
    while (!stopped_) {
      timer.expires_after(core_.tick_interval());
      try {
        co_await timer.async_wait(detail::use_tuple);
      } catch (const std::bad_alloc&) {  // no memory for the wait: check now
      } catch (const std::length_error&) {}
      if (!stopped_) core_.on_tick();
    }
    running_.done();
  }

  Transport& transport_;
  io io_{};
  core_type core_;
  std::list<session> sessions_;
  detail::wait_group<timer_type> running_;  // the watchdog and every session
  timer_type pause_;                        // the accept loop's pause after a failed accept
  typename Transport::acceptor_type* acceptor_ = nullptr;
  bool stopped_ = false;
};

}  // namespace asyncps
