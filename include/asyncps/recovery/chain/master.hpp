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

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <list>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include "asyncps/detail/accept_loop.hpp"
#include "asyncps/detail/accept_retry.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/log_limiter.hpp"
#include "asyncps/detail/peer_address.hpp"
#include "asyncps/detail/transport_time.hpp"
#include "asyncps/detail/wait_group.hpp"
#include "asyncps/error.hpp"
#include "asyncps/log.hpp"
#include "asyncps/peer_identity.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery/chain/messages.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

/// Configuration of a chain master.
struct chain_master_options {
  std::uint32_t num_shards = 1;  ///< shards (one chain each)
  /// Servers per chain at start: a shard's first configuration is sent once this many of its
  /// servers registered (ordered by member id: member 0 is the first head). Member ids lie
  /// in [0, members) (each server's `set_chain` lists that many endpoints): a `chain_hello`
  /// naming another id is refused (counted in `refused`, logged), so it never holds a place
  /// in a chain or blocks its start or a failover. Over TLS, a `chain_hello` from a
  /// certificate that names asyncps identities is refused the same way unless one of them is
  /// `asyncps://chain/<shard>/<member>` for its shard and member (or `*`; docs/security.md).
  std::uint32_t members = 2;
  /// A registered server silent for this long is declared failed (its connection is closed).
  /// Until then its member id is its own: a `chain_hello` naming the id of a live
  /// registration (open and heard from within this bound) is refused and the holder stays,
  /// so a peer with the secret cannot displace a live member. A restarted server gets in
  /// once its old registration is closed or silent this long (it retries its registration).
  std::chrono::milliseconds heartbeat_timeout{1000};
  /// A connection that has not registered (`chain_hello`) this long after its accept is
  /// closed, logged with its address (the transport's handshake counts in it). Checked by the
  /// heartbeat watchdog, so up to `heartbeat_timeout / 4` late. 0: no limit.
  std::chrono::milliseconds register_timeout{std::chrono::seconds(10)};
  /// Membership changes; empty: stderr. Failed accepts and refused connections are logged
  /// rate-limited (a few lines per peer host and kind every 10 s, then a count of the rest).
  log_function log{};
};

/// Counters of a chain master (read on its executor).
struct chain_master_stats {
  std::uint64_t registrations = 0;  ///< servers registered (initial and rejoining)
  std::uint64_t failures = 0;       ///< servers removed (connection lost or heartbeat timeout)
  std::uint64_t joins = 0;          ///< servers appended as a new tail
  std::uint64_t configs_sent = 0;   ///< chain_config messages sent
  /// Connections refused or closed before registering: a failed authentication, no valid
  /// `chain_hello` as their first message (a member id outside the chain, one the
  /// certificate does not name, one a live registration holds), none within
  /// `register_timeout`.
  std::uint64_t refused = 0;
  /// Connections closed because an allocation failed (`std::bad_alloc`, `std::length_error`)
  /// while their frame was received or handled, their messages were sent, or their session
  /// was started: no error frame (no memory for one), logged rate-limited ("out of memory"),
  /// and a registered member is removed as when its connection is lost. Every other
  /// connection is served on.
  std::uint64_t out_of_memory = 0;
};

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
      : transport_(transport), opts_(std::move(opts)), shards_(opts_.num_shards),
        running_(transport.get_executor()), pause_(transport.get_executor()) {
    if (opts_.num_shards == 0 || opts_.members == 0)
      throw std::invalid_argument("asyncps::chain_master_options: num_shards and members > 0");
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
          detail::log_accept_failure(limiter_, clock_type::now(), ec, pause, sink());
        });
  }

  /// Stops accepting and closes every connection; `async_serve` then completes.
  void stop() {
    stopped_ = true;
    if (acceptor_ != nullptr) acceptor_->close();
    pause_.cancel();
    for (auto& s : sessions_) close(s);
    limiter_.flush_all(clock_type::now(), sink());
  }

  /// Shard `shard`'s chain, head first (member ids). Empty before its first configuration.
  std::vector<std::uint32_t> chain(std::uint32_t shard) const {
    std::vector<std::uint32_t> out;
    for (const session* s : shards_[shard].chain) out.push_back(s->member);
    return out;
  }
  /// Whether every shard's chain has started.
  bool started() const noexcept {
    return std::all_of(shards_.begin(), shards_.end(), [](const shard& s) { return s.started; });
  }
  const chain_master_stats& stats() const noexcept { return stats_; }

 private:
  // The transport's timer and clock (asio::steady_timer and std::chrono::steady_clock unless
  // it declares its own, e.g. a simulated transport's virtual time).
  using timer_type = detail::transport_timer_t<Transport>;
  using clock_type = detail::transport_clock_t<Transport>;

  static constexpr std::uint32_t none = 0xffffffffu;
  struct session {
    session(typename Transport::connection_type c, const typename Transport::executor_type& ex)
        : conn(std::move(c)), wake(ex, clock_type::time_point::max()) {}
    typename Transport::connection_type conn;
    timer_type wake;
    typename std::list<session>::iterator self;
    std::vector<message> outbox;
    bool open = true;
    int running = 2;
    bool registered = false;
    bool joining = false;  // its next configuration tells it to wait for a state transfer
    std::uint32_t shard = 0;
    std::uint32_t member = 0;
    typename clock_type::time_point last_seen{};
  };
  struct shard {
    bool started = false;
    std::vector<session*> chain;    // head first
    std::vector<session*> waiting;  // registered before the start
    std::int64_t epoch = 0;
  };

  void log(const std::string& line) const {
    detail::emit(opts_.log, "asyncps chain master: " + line);
  }
  // Where the log limiter writes its summaries.
  auto sink() const {
    return [this](const std::string& line) { log(line); };
  }
  // Whether a line of `kind` about `s`'s peer may be logged now (detail::log_limiter).
  bool may_log(std::string_view kind, const session& s) {
    return limiter_.admit(kind, detail::peer_host(s.conn), clock_type::now(), sink());
  }

  // A new session (`detail::serve_sessions`): its read and write loops, which finish it. No
  // memory to spawn them closes it (out_of_memory), and each loop not spawned finishes it in
  // its place. Does not throw (serve_sessions' contract).
  void start(session& s) {
    s.last_seen = clock_type::now();
    int spawned = detail::spawn_session_loops(
        transport_.get_executor(), [&] { return read_loop(s); }, [&] { return write_loop(s); });
    if (spawned == 2) return;
    out_of_memory(s, "no memory to start its session");
    for (; spawned < 2; ++spawned) finish(s);  // the last one erases s
  }

  // The peer of `s` as log lines name it: " of shard S server M" once registered, and its
  // address when the transport knows it.
  std::string who(const session& s) const {
    return (s.registered
                ? " of shard " + std::to_string(s.shard) + " server " + std::to_string(s.member)
                : std::string{}) +
           detail::peer_address(s.conn);
  }

  // Closes `s` after an allocation failure while serving it (`what`: where): no error frame
  // (no memory for one), counted in `out_of_memory`, logged rate-limited when a line can be
  // allocated.
  void out_of_memory(session& s, const char* what) {
    ++stats_.out_of_memory;
    detail::despite_no_memory([&] {
      if (may_log(detail::log_kind::refused_connection, s))
        log("closing the connection" + who(s) + ": " +
            make_error_code(errc::resource_exhausted).message() + " (" + what + ")");
    });
    close(s);
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
    if (no_memory && s.open) out_of_memory(s, "no memory to send its messages");
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
        go_on = receive(s, ec, m);
      } catch (const std::bad_alloc&) {
        no_memory = true;
      } catch (const std::length_error&) {
        no_memory = true;
      }
      if (no_memory && s.open) out_of_memory(s, what);
      if (!go_on) break;
    }
    close(s);
    finish(s);
  }

  // Handles what `s`'s receive completed with (`ec`, `m`): a registration, a heartbeat, or a
  // failure or refusal (logged). Returns whether to read on.
  bool receive(session& s, std::error_code ec, const message& m) {
    if (ec) {
      if (ec == errc::authentication_failed || ec == errc::tls_handshake_failed ||
          (ec == errc::timeout && !s.registered)) {
        ++stats_.refused;
        if (may_log(detail::log_kind::refused_connection, s))
          log("refused an unauthenticated connection" + detail::peer_address(s.conn) + ": " +
              ec.message() + detail::tls_failure_note(s.conn));
      }
      return false;
    }
    s.last_seen = clock_type::now();
    const auto& h = m.header;
    if (!s.registered) {
      protocol::chain_hello hello;
      std::string why;
      if (h.type != protocol::chain_hello_type || protocol::decode(m, hello, why) ||
          hello.shard >= opts_.num_shards) {
        ++stats_.refused;
        if (may_log(detail::log_kind::refused_request, s))
          log("refusing a connection" + detail::peer_address(s.conn) +
              ": expected chain_hello with shard < " + std::to_string(opts_.num_shards) + why);
        return false;
      }
      if (hello.member >= opts_.members) {
        ++stats_.refused;
        if (may_log(detail::log_kind::refused_request, s))
          log("refusing a connection" + detail::peer_address(s.conn) +
              ": chain_hello names member " + std::to_string(hello.member) + " of shard " +
              std::to_string(hello.shard) + "; member ids lie in [0, " +
              std::to_string(opts_.members) + ")");
        return false;
      }
      // A certificate that names identities registers only the members it names (a worker's
      // certificate none).
      if (auto why =
              detail::identity_refusal(detail::identity_of(s.conn).get(),
                                       "chain_hello names shard " + std::to_string(hello.shard) +
                                           " server " + std::to_string(hello.member),
                                       peer_role::chain, hello.shard, hello.member);
          !why.empty()) {
        ++stats_.refused;
        if (may_log(detail::log_kind::refused_request, s))
          log("refusing a connection" + detail::peer_address(s.conn) + ": " + why);
        return false;
      }
      if (const session* holder = live_holder(s, hello.shard, hello.member)) {
        ++stats_.refused;
        if (may_log(detail::log_kind::refused_request, s))
          log("refusing a connection" + detail::peer_address(s.conn) +
              ": chain_hello names shard " + std::to_string(hello.shard) + " server " +
              std::to_string(hello.member) + ", which a live registration holds (heard from " +
              std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 clock_type::now() - holder->last_seen)
                                 .count()) +
              " ms ago" + detail::peer_address(holder->conn) +
              "); it is taken over once closed or silent for heartbeat_timeout " +
              std::to_string(opts_.heartbeat_timeout.count()) + " ms");
        return false;
      }
      enroll(s, hello.shard, hello.member);
    } else if (h.type != message_type::heartbeat) {
      log("closing the connection of shard " + std::to_string(s.shard) + " server " +
          std::to_string(s.member) + ": unexpected message type " +
          std::to_string(static_cast<int>(h.type)));
      return false;
    }
    return true;
  }

  // One of `s`'s two loops ended; the last one removes it from its chain and erases it. No
  // memory to log the removal or to encode the new configuration loses those (the chain no
  // longer lists `s` either way: remove() takes it out first), never the session's end.
  void finish(session& s) {
    if (--s.running > 0) return;
    if (s.registered) detail::despite_no_memory([&] { remove(s, "connection lost"); });
    sessions_.erase(s.self);
    running_.done();
  }

  // Every heartbeat_timeout / 4: removes and closes registered members silent for
  // heartbeat_timeout, and closes connections that did not register within register_timeout.
  // No memory for a log line loses the line, never a close, nor the watchdog itself.
  asio::awaitable<void> watchdog() {
    timer_type timer(transport_.get_executor());
    while (!stopped_) {
      timer.expires_after(std::max(opts_.heartbeat_timeout / 4, std::chrono::milliseconds(1)));
      try {
        co_await timer.async_wait(detail::use_tuple);
      } catch (const std::bad_alloc&) {  // no memory for the wait: check now
      } catch (const std::length_error&) {}
      const auto now = clock_type::now();
      detail::despite_no_memory(
          [&] { limiter_.flush(now, sink()); });  // the counts of a flood that has stopped
      for (auto& s : sessions_) {
        if (s.registered && s.open && now - s.last_seen > opts_.heartbeat_timeout) {
          detail::despite_no_memory([&] {
            log("shard " + std::to_string(s.shard) + " server " + std::to_string(s.member) +
                " missed its heartbeats; removing it");
            remove(s, "heartbeat timeout");
          });
          close(s);  // its loops' finish() removes it if the above could not
        } else if (!s.registered && s.open && opts_.register_timeout.count() > 0 &&
                   now - s.last_seen > opts_.register_timeout) {
          ++stats_.refused;
          detail::despite_no_memory([&] {
            if (may_log(detail::log_kind::refused_connection, s))
              log("closing the connection" + detail::peer_address(s.conn) +
                  ": no chain_hello within " + std::to_string(opts_.register_timeout.count()) +
                  " ms (register_timeout)");
          });
          close(s);
        }
      }
    }
    running_.done();
  }

  // The registration of `member` of shard `shard_id` other than `s` that is live: open and
  // heard from within heartbeat_timeout (the watchdog removes it at that silence anyway).
  // Null when none holds it.
  const session* live_holder(const session& s, std::uint32_t shard_id, std::uint32_t member) const {
    const auto now = clock_type::now();
    for (const auto& o : sessions_)
      if (&o != &s && o.registered && o.open && o.shard == shard_id && o.member == member &&
          now - o.last_seen < opts_.heartbeat_timeout)
        return &o;
    return nullptr;
  }

  void enroll(session& s, std::uint32_t shard_id, std::uint32_t member) {
    auto& sh = shards_[shard_id];
    // A new registration of a member the master still lists, whose registration is closing
    // or silent (live_holder refused the others): the old one is gone.
    for (auto& o : sessions_)
      if (&o != &s && o.registered && o.shard == shard_id && o.member == member) {
        remove(o, "registered again");
        close(o);
      }
    s.registered = true;
    s.shard = shard_id;
    s.member = member;
    ++stats_.registrations;
    if (!sh.started) {
      sh.waiting.push_back(&s);
      if (sh.waiting.size() < opts_.members) return;
      sh.chain = sh.waiting;
      sh.waiting.clear();
      std::sort(sh.chain.begin(), sh.chain.end(),
                [](const session* a, const session* b) { return a->member < b->member; });
      sh.started = true;
      log("shard " + std::to_string(shard_id) + " chain starts: " + describe(sh));
    } else {
      s.joining = true;
      sh.chain.push_back(&s);
      ++stats_.joins;
      log("shard " + std::to_string(shard_id) + " server " + std::to_string(member) +
          " joins as the tail: " + describe(sh));
    }
    configure(sh, shard_id);
  }

  void remove(session& s, const char* why) {
    if (!s.registered) return;
    s.registered = false;
    auto& sh = shards_[s.shard];
    std::erase(sh.waiting, &s);
    const auto before = sh.chain.size();
    std::erase(sh.chain, &s);
    if (sh.chain.size() == before) return;
    ++stats_.failures;
    if (stopped_) return;
    log("shard " + std::to_string(s.shard) + " server " + std::to_string(s.member) + " removed (" +
        why + "): " + describe(sh));
    if (sh.chain.empty()) log("shard " + std::to_string(s.shard) + " has no server left");
    configure(sh, s.shard);
  }

  std::string describe(const shard& sh) const {
    std::string out;
    for (const session* m : sh.chain)
      out += (out.empty() ? "" : " -> ") + std::to_string(m->member);
    return out.empty() ? std::string("(empty)") : out;
  }

  // Sends every member of the chain its predecessor and successor.
  void configure(shard& sh, std::uint32_t shard_id) {
    ++sh.epoch;
    for (std::size_t i = 0; i < sh.chain.size(); ++i) {
      session& s = *sh.chain[i];
      message m = protocol::encode(
          protocol::chain_config{.shard = shard_id,
                                 .member = s.member,
                                 .predecessor = i == 0 ? none : sh.chain[i - 1]->member,
                                 .successor =
                                     i + 1 == sh.chain.size() ? none : sh.chain[i + 1]->member,
                                 .epoch = sh.epoch,
                                 .joining = s.joining},
          [this](std::size_t n) { return transport_.allocate(n); });
      s.joining = false;
      s.outbox.push_back(std::move(m));
      s.wake.cancel();
      ++stats_.configs_sent;
    }
  }

  Transport& transport_;
  chain_master_options opts_;
  std::vector<shard> shards_;
  std::list<session> sessions_;
  detail::wait_group<timer_type> running_;  // the watchdog and every session
  timer_type pause_;                        // the accept loop's pause after a failed accept
  detail::log_limiter<typename clock_type::time_point> limiter_;  // refusals, failed accepts
  typename Transport::acceptor_type* acceptor_ = nullptr;
  bool stopped_ = false;
  chain_master_stats stats_{};
};

}  // namespace asyncps
