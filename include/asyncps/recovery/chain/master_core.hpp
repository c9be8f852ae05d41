// asyncps — the chain master's protocol, sans-io: who is in which chain, in what order, and
// the `chain_config` each member is sent (van Renesse & Schneider, "Chain Replication for
// Supporting High Throughput and Availability", OSDI 2004: the master's part). Events in
// (a connection opened, a message or a receive error, a connection closed, a watchdog tick,
// a stop), actions out through a narrow shell interface (queue a message and wake the
// session's writer, close a connection, log). No coroutine, timer, socket or thread here:
// `basic_chain_master` (master.hpp) is the Asio shell, and tests step the core event by event.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "asyncps/detail/accept_retry.hpp"
#include "asyncps/detail/log_limiter.hpp"
#include "asyncps/error.hpp"
#include "asyncps/log.hpp"
#include "asyncps/peer_identity.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery/chain/master_options.hpp"
#include "asyncps/recovery/chain/messages.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::detail {

/// One connection to the chain master as its core sees it; the shell's session derives from
/// it (adding the connection, its writer's wake-up, ...).
template <class TimePoint>
struct chain_master_session {
  std::vector<message> outbox;  ///< `chain_config`s to send, in order (the shell sends them)
  bool open = true;             ///< false once the core or the shell closed it
  bool registered = false;      ///< a member of a shard's chain (or waiting for its start)
  bool joining = false;         ///< its next configuration tells it to wait for a state
  std::uint32_t shard = 0;
  std::uint32_t member = 0;
  TimePoint last_seen{};  ///< when it was accepted, or last sent something
};

/// The chain master's protocol for sessions of type `Session` (derived from
/// `chain_master_session<TimePoint>`). `Io` is the shell:
///
/// | expression | what the shell does |
/// |---|---|
/// | `io.now()` | the current time (`TimePoint`) |
/// | `io.allocate(n)` | a `buffer` of `n` bytes for a message |
/// | `io.wake(s)` | `s.outbox` has messages: send them |
/// | `io.close(s)` | close `s`'s connection (its loops end; the shell then calls `on_closed`) |
/// | `io.address(s)` | " at HOST:PORT", or empty when the transport knows none |
/// | `io.host(s)` | the peer's host, for rate-limited logging (empty when unknown) |
/// | `io.identity(s)` | the identities `s`'s certificate names (`std::shared_ptr<const peer_identity>`; null: none) |
/// | `io.tls_note(s)` | why a TLS handshake with `s` failed, for the log (or empty) |
///
/// Thread safety: one thread (the shell's executor) calls every member.
template <class Session, class TimePoint, class Io>
class chain_master_core {
 public:
  /// Throws `std::invalid_argument` when `num_shards` or `members` is 0.
  chain_master_core(chain_master_options opts, Io& io)
      : opts_(std::move(opts)), io_(&io), shards_(opts_.num_shards) {
    if (opts_.num_shards == 0 || opts_.members == 0)
      throw std::invalid_argument("asyncps::chain_master_options: num_shards and members > 0");
  }

  // ---- events ----

  /// A connection was accepted (before any message): the register timeout starts now.
  void on_open(Session& s) {
    s.last_seen = io_->now();
    sessions_.push_back(&s);
  }

  /// `s`'s receive completed with `ec` and message `m`: a registration, a heartbeat, or a
  /// failure or refusal (counted in `refused`, logged rate-limited). Returns whether to read
  /// on; false: the shell closes `s`.
  bool on_receive(Session& s, std::error_code ec, const message& m) {
    if (ec) {
      if (ec == errc::authentication_failed || ec == errc::tls_handshake_failed ||
          (ec == errc::timeout && !s.registered)) {
        ++stats_.refused;
        if (may_log(log_kind::refused_connection, s))
          log("refused an unauthenticated connection" + io_->address(s) + ": " + ec.message() +
              io_->tls_note(s));
      }
      return false;
    }
    s.last_seen = io_->now();
    const auto& h = m.header;
    if (s.registered) {
      if (h.type == message_type::heartbeat) return true;
      log("closing the connection of shard " + std::to_string(s.shard) + " server " +
          std::to_string(s.member) + ": unexpected message type " +
          std::to_string(static_cast<int>(h.type)));
      return false;
    }
    protocol::chain_hello hello;
    std::string why;
    if (h.type != protocol::chain_hello_type || protocol::decode(m, hello, why) ||
        hello.shard >= opts_.num_shards)
      return refuse(s, ": expected chain_hello with shard < " + std::to_string(opts_.num_shards) +
                           why);
    if (hello.member >= opts_.members)
      return refuse(s, ": chain_hello names member " + std::to_string(hello.member) + " of shard " +
                           std::to_string(hello.shard) + "; member ids lie in [0, " +
                           std::to_string(opts_.members) + ")");
    // A certificate that names identities registers only the members it names (a worker's
    // certificate none).
    const auto identity = io_->identity(s);
    if (auto who = identity_refusal(identity.get(),
                                    "chain_hello names shard " + std::to_string(hello.shard) +
                                        " server " + std::to_string(hello.member),
                                    peer_role::chain, hello.shard, hello.member);
        !who.empty())
      return refuse(s, ": " + who);
    if (const Session* holder = live_holder(s, hello.shard, hello.member))
      return refuse(s, ": chain_hello names shard " + std::to_string(hello.shard) + " server " +
                           std::to_string(hello.member) +
                           ", which a live registration holds (heard from " +
                           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                              io_->now() - holder->last_seen)
                                              .count()) +
                           " ms ago" + io_->address(*holder) +
                           "); it is taken over once closed or silent for heartbeat_timeout " +
                           std::to_string(opts_.heartbeat_timeout.count()) + " ms");
    enroll(s, hello.shard, hello.member);
    return true;
  }

  /// `s`'s connection is closed and both its loops have ended: a registered member leaves its
  /// chain (its neighbours get their new configuration), and the core forgets `s`. No memory
  /// to log the removal or to encode the new configuration loses those, never the removal.
  void on_closed(Session& s) {
    if (s.registered) despite_no_memory([&] { remove(s, "connection lost"); });
    s.registered = false;  // even when remove() could not log
    std::erase(sessions_, &s);
  }

  /// The watchdog, every `tick_interval()`: removes and closes registered members silent for
  /// `heartbeat_timeout`, and closes connections that did not register within
  /// `register_timeout`. No memory for a log line loses the line, never a close.
  void on_tick() {
    const auto now = io_->now();
    despite_no_memory([&] { limiter_.flush(now, sink()); });  // a flood that has stopped
    for (Session* sp : sessions_) {
      Session& s = *sp;
      if (s.registered && s.open && now - s.last_seen > opts_.heartbeat_timeout) {
        despite_no_memory([&] {
          log("shard " + std::to_string(s.shard) + " server " + std::to_string(s.member) +
              " missed its heartbeats; removing it");
          remove(s, "heartbeat timeout");
        });
        close(s);  // on_closed removes it if the above could not
      } else if (!s.registered && s.open && opts_.register_timeout.count() > 0 &&
                 now - s.last_seen > opts_.register_timeout) {
        ++stats_.refused;
        despite_no_memory([&] {
          if (may_log(log_kind::refused_connection, s))
            log("closing the connection" + io_->address(s) + ": no chain_hello within " +
                std::to_string(opts_.register_timeout.count()) + " ms (register_timeout)");
        });
        close(s);
      }
    }
  }

  /// An allocation failed while `s`'s frame was received or handled, its messages sent, or
  /// its session started (`what`: where): no error frame (no memory for one), counted in
  /// `out_of_memory`, logged rate-limited when a line can be allocated; `s` is closed.
  void on_out_of_memory(Session& s, const char* what) {
    ++stats_.out_of_memory;
    despite_no_memory([&] {
      if (may_log(log_kind::refused_connection, s))
        log("closing the connection" + who(s) + ": " +
            make_error_code(errc::resource_exhausted).message() + " (" + what + ")");
    });
    close(s);
  }

  /// A transient accept failure (`ec`; the accept loop pauses `pause`), logged rate-limited.
  void on_accept_failure(std::error_code ec, std::chrono::milliseconds pause) {
    log_accept_failure(limiter_, io_->now(), ec, pause, sink());
  }

  /// The master stops: every session is closed, membership changes are no longer sent, and
  /// the counts the log limiter held back are logged.
  void on_stop() {
    stopped_ = true;
    for (Session* s : sessions_) close(*s);
    limiter_.flush_all(io_->now(), sink());
  }

  // ---- queries ----

  /// How often the shell calls `on_tick`: a quarter of `heartbeat_timeout` (at least 1 ms).
  std::chrono::milliseconds tick_interval() const noexcept {
    return std::max(opts_.heartbeat_timeout / 4, std::chrono::milliseconds(1));
  }
  /// Shard `shard`'s chain, head first (member ids). Empty before its first configuration.
  std::vector<std::uint32_t> chain(std::uint32_t shard) const {
    std::vector<std::uint32_t> out;
    for (const Session* s : shards_[shard].chain) out.push_back(s->member);
    return out;
  }
  /// Whether every shard's chain has started.
  bool started() const noexcept {
    return std::all_of(shards_.begin(), shards_.end(), [](const shard& s) { return s.started; });
  }
  /// The configuration epoch of shard `shard`'s chain (0: never configured).
  std::int64_t epoch(std::uint32_t shard) const noexcept { return shards_[shard].epoch; }
  const chain_master_stats& stats() const noexcept { return stats_; }

 private:
  static constexpr std::uint32_t none = 0xffffffffu;
  struct shard {
    bool started = false;
    std::vector<Session*> chain;    // head first
    std::vector<Session*> waiting;  // registered before the start
    std::int64_t epoch = 0;
  };

  void log(const std::string& line) const { emit(opts_.log, "asyncps chain master: " + line); }
  auto sink() const {
    return [this](const std::string& line) { log(line); };
  }
  // Whether a line of `kind` about `s`'s peer may be logged now (log_limiter).
  bool may_log(std::string_view kind, const Session& s) {
    return limiter_.admit(kind, io_->host(s), io_->now(), sink());
  }
  // The peer of `s` as log lines name it: " of shard S server M" once registered, and its
  // address when the transport knows it.
  std::string who(const Session& s) const {
    return (s.registered
                ? " of shard " + std::to_string(s.shard) + " server " + std::to_string(s.member)
                : std::string{}) +
           io_->address(s);
  }
  // Refuses `s`'s first message (`why` says what was wrong): counted, logged rate-limited;
  // returns false (the shell closes `s`).
  bool refuse(Session& s, const std::string& why) {
    ++stats_.refused;
    if (may_log(log_kind::refused_request, s)) log("refusing a connection" + io_->address(s) + why);
    return false;
  }
  void close(Session& s) {
    if (!s.open) return;
    s.open = false;
    io_->close(s);
  }

  // The registration of `member` of shard `shard_id` other than `s` that is live: open and
  // heard from within heartbeat_timeout (the watchdog removes it at that silence anyway).
  // Null when none holds it.
  const Session* live_holder(const Session& s, std::uint32_t shard_id, std::uint32_t member) const {
    const auto now = io_->now();
    for (const Session* o : sessions_)
      if (o != &s && o->registered && o->open && o->shard == shard_id && o->member == member &&
          now - o->last_seen < opts_.heartbeat_timeout)
        return o;
    return nullptr;
  }

  void enroll(Session& s, std::uint32_t shard_id, std::uint32_t member) {
    auto& sh = shards_[shard_id];
    // A new registration of a member the master still lists, whose registration is closing
    // or silent (live_holder refused the others): the old one is gone.
    for (Session* o : sessions_)
      if (o != &s && o->registered && o->shard == shard_id && o->member == member) {
        remove(*o, "registered again");
        close(*o);
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
                [](const Session* a, const Session* b) { return a->member < b->member; });
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

  void remove(Session& s, const char* why) {
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
    for (const Session* m : sh.chain)
      out += (out.empty() ? "" : " -> ") + std::to_string(m->member);
    return out.empty() ? std::string("(empty)") : out;
  }

  // Sends every member of the chain its predecessor and successor.
  void configure(shard& sh, std::uint32_t shard_id) {
    ++sh.epoch;
    for (std::size_t i = 0; i < sh.chain.size(); ++i) {
      Session& s = *sh.chain[i];
      message m = protocol::encode(
          protocol::chain_config{.shard = shard_id,
                                 .member = s.member,
                                 .predecessor = i == 0 ? none : sh.chain[i - 1]->member,
                                 .successor =
                                     i + 1 == sh.chain.size() ? none : sh.chain[i + 1]->member,
                                 .epoch = sh.epoch,
                                 .joining = s.joining},
          [this](std::size_t n) { return io_->allocate(n); });
      s.joining = false;
      s.outbox.push_back(std::move(m));
      io_->wake(s);
      ++stats_.configs_sent;
    }
  }

  chain_master_options opts_;
  Io* io_;
  std::vector<shard> shards_;
  std::vector<Session*> sessions_;  // every open or closing session, in accept order
  log_limiter<TimePoint> limiter_;  // refusals, failed accepts
  bool stopped_ = false;
  chain_master_stats stats_{};
};

}  // namespace asyncps::detail
