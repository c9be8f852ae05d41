// asyncps — basic_rendezvous: where servers publish their addresses and workers find them.
//
// A job started by a launcher (Slurm's srun, Open MPI's mpirun, torchrun, a ps-lite/BytePS
// style DMLC_* environment) knows each process's role and rank and one address, the root's;
// no process knows the others'. The root process (rank 0, next to server 0) runs a rendezvous:
// every server announces the shard it serves and the port it listens on, and every worker
// looks the servers up, getting their addresses in shard order once all of them have
// announced, and its worker id if it asked for one. This is the part ps-lite's scheduler node
// and torchrun's MASTER_ADDR:MASTER_PORT store play; here it is one more service over the
// `transport` concept, so it gets the transport's shared-secret authentication, TLS and frame
// bounds as the servers do. Message flow, errors and how a launcher uses it:
// docs/concepts/rendezvous.md; the four message types: docs/wire-format.md ("Rendezvous").
//
// The rendezvous keeps only the latest address of each shard: a server that restarts
// announces again and replaces its entry, and a later lookup gets the current directory. It is
// not replicated and keeps no state on disk: run it where it outlives the job's servers (the
// root process), as the chain master.
//
// This header declares the service and the clients; the service's member functions are defined
// by idea in detail/rendezvous/ (sessions.ipp: refusals, read and write loops, the watchdog;
// directory.ipp: announces, lookups, worker ids), included at the end of this file, and the
// clients' request and retry loop is detail/rendezvous/client.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <new>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include "asyncps/detail/accept_loop.hpp"
#include "asyncps/detail/accept_retry.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/codec/rendezvous_messages.hpp"
#include "asyncps/detail/log_limiter.hpp"
#include "asyncps/detail/peer_address.hpp"
#include "asyncps/detail/rendezvous/client.hpp"
#include "asyncps/detail/text.hpp"
#include "asyncps/detail/transport_time.hpp"
#include "asyncps/detail/wait_group.hpp"
#include "asyncps/error.hpp"
#include "asyncps/log.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/transport/tcp.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

/// Configuration of a rendezvous.
struct rendezvous_options {
  /// Shards of the job (servers, one per shard), 1 to `max_directory_servers`. A lookup is
  /// answered once every shard in [0, num_servers) has announced.
  std::uint32_t num_servers = 1;
  /// Workers of the job; 0: unknown. When known, a lookup claiming a worker id >= num_workers,
  /// or asking for one when all are taken, is refused (`errc::rendezvous_refused`); it is also
  /// passed on to servers (`server_assignment`) and workers (`rendezvous_directory`).
  std::uint32_t num_workers = 0;
  /// A connection that has sent no request this long after its accept (the transport's
  /// handshake counts in it), or stays open this long after its last reply, is closed; the
  /// first kind is logged with its address and counted as refused. A lookup waiting for the
  /// directory is never closed for this. Checked every `register_timeout / 4`. 0: no limit.
  std::chrono::milliseconds register_timeout{std::chrono::seconds(10)};
  /// Announces, replacements, refusals; empty: stderr. Failed accepts and refusals are logged
  /// rate-limited (a few lines per peer host and kind every 10 s, then a count of the rest).
  log_function log{};
};

/// Counters of a rendezvous (read on its executor).
struct rendezvous_stats {
  std::uint64_t announces = 0;  ///< announces accepted (first ones and repeated ones)
  std::uint64_t replaced = 0;   ///< announces that changed a shard's address (a restart)
  std::uint64_t lookups = 0;    ///< lookups answered with the directory
  /// Connections refused: a failed authentication or TLS handshake, no request within
  /// `register_timeout`, or a request refused with an `error` frame (malformed, a shard or
  /// worker id outside the job or not named by the peer's certificate, none left to assign).
  std::uint64_t refused = 0;
  /// Connections closed because an allocation failed (`std::bad_alloc`, `std::length_error`)
  /// while their frame was received or their request handled or answered, their replies were
  /// sent, or their session was started: no error frame (no memory for one), logged
  /// rate-limited ("out of memory"). Every other connection is served on.
  std::uint64_t out_of_memory = 0;
};

/// "host:port" as the directory lists it: a host containing ':' (an IPv6 literal) in
/// brackets, "[fe80::1%eth0]:7000"; any other host as is, "10.0.0.7:7000". The text
/// `parse_tcp_endpoint` reads back when the host is an IP literal. Thread safety: pure.
inline std::string host_port_string(std::string_view host, std::uint16_t port) {
  std::string out;
  if (host.find(':') != std::string_view::npos) {
    out.reserve(host.size() + 8);
    out += '[';
    out += host;
    out += ']';
  } else {
    out = host;
  }
  out += ':';
  out += std::to_string(port);
  return out;
}

/// The rendezvous service. `Transport` models `transport`.
///
/// Serves any number of connections; each sends requests one at a time and gets one reply per
/// request: `announce` -> `assigned`, `lookup` -> `directory` (held back until every shard has
/// announced). A request that is malformed or not valid for this job gets an `error` frame
/// naming what was wrong (its code: `unexpected_message`, a header error such as
/// `frame_too_large`, or `rendezvous_refused`), and that connection is closed; the service and
/// every other connection go on. Peers the transport does not authenticate never get a frame
/// through (logged as refused, with their address). Over TLS, a peer whose certificate names
/// asyncps identities (`peer_identity`) announces only a shard it names
/// (`asyncps://server/<shard>`; any shard: `asyncps://server/*`) and looks up only as a worker
/// id it names (`asyncps://worker/<id>`; any id: `asyncps://worker/*`; a lookup taking no id
/// is not checked); anything else is refused with `rendezvous_refused`, naming both. An allocation
/// failure while one connection is served (its frame received, its request handled or answered)
/// closes that connection only, without an error frame (`rendezvous_stats::out_of_memory`).
///
/// Thread safety: construct anywhere; call every member on `transport.get_executor()`, which
/// runs one handler at a time (an `io_context` run by one thread, or a strand).
/// Object lifetime: the transport outlives the rendezvous; `async_serve` must have completed
/// before it is destroyed.
template <transport Transport>
class basic_rendezvous {
 public:
  /// Throws `std::invalid_argument` when `num_servers` is 0 or above `max_directory_servers`,
  /// or `num_workers` is `protocol::no_worker_id` or above.
  basic_rendezvous(Transport& transport, rendezvous_options opts)
      : transport_(transport), opts_(std::move(opts)), running_(transport.get_executor()),
        watchdog_timer_(transport.get_executor()), pause_(transport.get_executor()) {
    if (opts_.num_servers == 0 || opts_.num_servers > max_directory_servers)
      throw std::invalid_argument("asyncps::rendezvous_options: num_servers in [1, 4096]");
    if (opts_.num_workers >= protocol::no_worker_id)
      throw std::invalid_argument("asyncps::rendezvous_options: num_workers < 0xfffffffe");
    shards_.resize(opts_.num_servers);
  }
  basic_rendezvous(const basic_rendezvous&) = delete;
  basic_rendezvous& operator=(const basic_rendezvous&) = delete;

  /// Serves announces and lookups on `acceptor` until `stop()`. Completes with success after
  /// a stop, or with the acceptor's error (then every connection is closed first); a transient
  /// one (out of descriptors, no memory for the accept, ...) is logged and retried after a
  /// pause instead (`detail::serve_sessions`).
  /// Precondition: runs on `transport.get_executor()`; called once.
  asio::awaitable<std::error_code> async_serve(typename Transport::acceptor_type acceptor) {
    if (opts_.register_timeout.count() > 0) {
      running_.add();  // the watchdog
      asio::co_spawn(transport_.get_executor(), watchdog(), asio::detached);
    }
    co_return co_await detail::serve_sessions(
        acceptor, acceptor_, pause_, stopped_, sessions_, running_, transport_.get_executor(),
        [this](session& s) { start(s); }, [this] { stop(); },
        [this](std::error_code ec, std::chrono::milliseconds pause) {
          detail::log_accept_failure(limiter_, clock_type::now(), ec, pause, sink());
        });
  }

  /// Stops accepting and closes every connection (waiting lookups get no reply; their clients
  /// retry until their timeout); `async_serve` then completes.
  void stop() {
    stopped_ = true;
    if (acceptor_ != nullptr) acceptor_->close();
    watchdog_timer_.cancel();
    pause_.cancel();
    for (auto& s : sessions_) close(s);
    limiter_.flush_all(clock_type::now(), sink());
  }

  /// Whether every shard has announced (lookups are answered at once).
  bool complete() const noexcept { return announced_ == opts_.num_servers; }
  /// Every shard's address ("host:port", `host_port_string`) in shard order; "" for a shard
  /// that has not announced yet.
  std::vector<std::string> servers() const {
    std::vector<std::string> out;
    out.reserve(shards_.size());
    for (const auto& e : shards_)
      out.push_back(e.announced ? host_port_string(e.host, e.port) : std::string{});
    return out;
  }
  /// Lookups waiting for the directory (0 once it is complete).
  std::size_t waiting_lookups() const noexcept { return waiting_.size(); }
  const rendezvous_stats& stats() const noexcept { return stats_; }

 private:
  // The transport's timer and clock (virtual time under a simulated transport).
  using timer_type = detail::transport_timer_t<Transport>;
  using clock_type = detail::transport_clock_t<Transport>;

  struct session {
    session(typename Transport::connection_type c, const typename Transport::executor_type& ex)
        : conn(std::move(c)), wake(ex, clock_type::time_point::max()) {}
    typename Transport::connection_type conn;
    timer_type wake;  // wakes the write loop (cancelled, never expires)
    typename std::list<session>::iterator self;
    std::vector<message> outbox;
    bool open = true;
    bool closing = false;  // refused: send what is queued (the error frame), then close
    bool waiting = false;  // its lookup waits for the directory (in waiting_)
    int running = 2;       // its read and write loops
    std::uint64_t requests = 0;
    std::uint32_t wanted = protocol::no_worker_id;  // the worker id its waiting lookup claims
    typename clock_type::time_point last_seen{};
  };
  struct entry {
    std::string host;
    std::uint16_t port = 0;
    bool announced = false;
  };

  void log(const std::string& line) const {
    detail::emit(opts_.log, "asyncps rendezvous: " + line);
  }
  // Where the log limiter writes its summaries.
  auto sink() const {
    return [this](const std::string& line) { log(line); };
  }
  // Whether a line of `kind` about `s`'s peer may be logged now (detail::log_limiter).
  bool may_log(std::string_view kind, const session& s) {
    return limiter_.admit(kind, detail::peer_host(s.conn), clock_type::now(), sink());
  }

  template <class M>
  message encode(const M& m) {
    return protocol::encode(m, [this](std::size_t n) { return transport_.allocate(n); });
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

  void close(session& s) {
    s.open = false;
    unwait(s);
    s.conn.close();
    s.wake.cancel();
  }
  void unwait(session& s) {
    if (!s.waiting) return;
    s.waiting = false;
    std::erase(waiting_, &s);
  }
  void reply(session& s, message m) {
    s.outbox.push_back(std::move(m));
    s.wake.cancel();
  }
  // Sessions (detail/rendezvous/sessions.ipp): refusals, closing after an allocation failure,
  // the read and write loops, the watchdog.
  void refuse(session& s, std::error_code code, const std::string& reason);
  void out_of_memory(session& s, const char* what);
  asio::awaitable<void> write_loop(session& s);
  asio::awaitable<void> read_loop(session& s);
  bool receive(session& s, std::error_code ec, const message& m);
  void finish(session& s);
  asio::awaitable<void> watchdog();
  // Requests and the directory (detail/rendezvous/directory.ipp).
  void handle(session& s, const message& m);
  std::string missing_shards() const;
  std::string progress() const;
  void on_announce(session& s, const message& m);
  void on_lookup(session& s, const message& m);
  void answer(session& s);

  Transport& transport_;
  rendezvous_options opts_;
  std::vector<entry> shards_;
  std::uint32_t announced_ = 0;
  std::set<std::uint32_t> taken_;  // worker ids assigned or claimed
  std::uint32_t next_free_ = 0;    // the lowest id not in taken_
  std::deque<session*> waiting_;   // lookups waiting for the directory, in arrival order
  std::list<session> sessions_;
  detail::wait_group<timer_type> running_;  // the watchdog and every session
  timer_type watchdog_timer_;
  timer_type pause_;  // the accept loop's pause after a failed accept
  detail::log_limiter<typename clock_type::time_point> limiter_;  // refusals, failed accepts
  typename Transport::acceptor_type* acceptor_ = nullptr;
  bool stopped_ = false;
  rendezvous_stats stats_{};
};

/// The rendezvous over TCP.
using rendezvous = basic_rendezvous<tcp_transport>;

// ---------------------------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------------------------

/// The rendezvous's reply to an announce.
struct server_assignment {
  std::uint32_t shard = 0;        ///< the shard this server serves
  std::uint32_t num_servers = 0;  ///< shards of the job
  std::uint32_t num_workers = 0;  ///< workers of the job (0: unknown to the rendezvous)
};

/// The rendezvous's reply to a lookup.
struct rendezvous_directory {
  /// Every shard's address in shard order, "host:port" (`host_port_string`: IPv6 in
  /// brackets); `servers.size()` is the job's number of shards.
  std::vector<std::string> servers{};
  /// The worker id the rendezvous gave (or recorded); `rendezvous_no_worker_id` when the
  /// lookup took none.
  std::uint32_t worker_id = protocol::no_worker_id;
  std::uint32_t num_workers = 0;  ///< workers of the job (0: unknown to the rendezvous)
};

/// Pass as `worker_id` to `async_lookup_servers` to take no worker id (a server or a tool that
/// only wants the addresses).
inline constexpr std::uint32_t rendezvous_no_worker_id = protocol::no_worker_id;

/// Announces a server to the rendezvous at `root`: the shard it serves and where it listens.
/// Call it once the server listens (its port is known), and again after a restart: the new
/// address replaces the old one.
///
/// `shard`: the shard it serves; empty: the rendezvous assigns one (the shard it already lists
/// at the same host and port, else the lowest shard not announced yet). `port`: the port it
/// listens on (its real one: after a listen on port 0, the acceptor's). `host`: where others
/// reach it, a host name or an IP literal (an IPv6 one with or without brackets), at most 255
/// bytes of letters, digits and `-._:%`; empty: the address the rendezvous sees the announce
/// come from (right for a server listening on 0.0.0.0, unless it reaches the rendezvous over
/// loopback: then 127.0.0.1 is published). (Separate parameters, not a struct: g++ 12 destroys
/// a braced aggregate temporary in a `co_await` operand twice.)
///
/// `timeout` (> 0) bounds the whole operation: while the rendezvous cannot be reached (it may
/// start later than this server) or drops the connection, the connect is retried (backoff 20
/// ms doubling to 1 s). Completes with the shard to serve and the job's counts, or:
/// `errc::invalid_argument` (port 0, a host that is not a host name or IP literal of at most
/// 255 bytes, a shard index >= `protocol::no_worker_id`, or `timeout` <= 0; nothing is sent);
/// the last connect error (e.g. `connection_refused`; condition `transient`), or
/// `errc::timeout`, when the rendezvous was not reached in time; an error no retry fixes at
/// once (`is_final_connect_error`: a wrong secret, a refused certificate); the code of the
/// rendezvous's `error` frame (`rendezvous_refused`: a shard >= its `num_servers`, none
/// left for "any", or a shard this node's certificate does not name; `unexpected_message`, a header
/// error: a malformed request); or `unexpected_message` for a reply that is not a valid `assigned`.
/// Every failure is logged on `log` (empty: stderr) naming the endpoint, and the rendezvous's
/// reason.
///
/// Thread safety: runs on `t`'s executor, which runs one handler at a time; `t` outlives the
/// operation. Completion: `std::tuple<std::error_code, server_assignment>`.
template <transport Transport>
asio::awaitable<std::tuple<std::error_code, server_assignment>>
async_announce_server(Transport& t, typename Transport::endpoint_type root,
                      std::optional<std::uint32_t> shard, std::uint16_t port,
                      std::chrono::milliseconds timeout, std::string host = {},
                      log_function log = {}) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  const std::uint32_t wanted = shard.value_or(protocol::any_id);
  if (port == 0 || (!host.empty() && !protocol::valid_host(host)) ||
      (shard && wanted >= protocol::no_worker_id) || timeout.count() <= 0) {
    detail::emit(log, "asyncps: announce to the rendezvous: invalid argument (port " +
                          std::to_string(port) + ", host '" + detail::peer_text(host) +
                          "', timeout " + std::to_string(timeout.count()) + " ms)");
    co_return std::tuple{make_error_code(errc::invalid_argument), server_assignment{}};
  }
  protocol::announce request;
  request.shard = wanted;
  request.port = port;
  request.host = std::move(host);
  auto make = [&] {
    return protocol::encode(request, [&](std::size_t n) { return t.allocate(n); });
  };
  auto [ec, m] = co_await detail::rendezvous_request(t, root, make, timeout, log, "announce");
  if (ec) co_return std::tuple{ec, server_assignment{}};
  protocol::assigned a;
  if (auto rec = detail::rendezvous_reply(m, a, message_type::assigned, log, "announce"))
    co_return std::tuple{rec, server_assignment{}};
  if (shard && a.shard != wanted) {
    detail::emit(log, "asyncps: the rendezvous assigned shard " + std::to_string(a.shard) +
                          " to an announce of shard " + std::to_string(wanted));
    co_return std::tuple{make_error_code(errc::unexpected_message), server_assignment{}};
  }
  co_return std::tuple{std::error_code{}, server_assignment{a.shard, a.num_servers, a.num_workers}};
}

/// Looks up the servers at the rendezvous at `root`: their addresses in shard order,
/// once every shard has announced (the reply waits for that), and a worker id.
///
/// `worker_id`: empty: the rendezvous assigns the lowest id not yet given or claimed (ids 0,
/// 1, 2, ... in the order lookups are answered, as ps-lite's scheduler does); a value: this
/// id is recorded (a restarted worker keeps its id); `rendezvous_no_worker_id`: take none.
/// A later lookup gets the current directory (a worker joining a running job, or one that
/// lost a server that then restarted elsewhere).
///
/// `timeout` (> 0) bounds the whole operation, the wait for the last server included: while
/// the rendezvous cannot be reached or drops the connection, the connect is retried (backoff
/// 20 ms doubling to 1 s). A retry after the connection dropped with a lookup for any id
/// (the rendezvous restarted) may be given another id. Completes with the directory, or:
/// `errc::invalid_argument` (`timeout` <= 0); `errc::timeout` when the rendezvous was reached
/// but some shard did not announce in time; the last connect error (e.g.
/// `connection_refused`; condition `transient`), or `errc::timeout`, when the rendezvous was
/// not reached in time; an error no retry fixes at once (`is_final_connect_error`); the code
/// of the rendezvous's `error` frame (`rendezvous_refused`: a worker id >= its
/// `num_workers`, every id taken, or an id this node's certificate does not name); or
/// `unexpected_message` for a reply that is not a valid `directory` (or gives another id than the
/// one claimed). Every failure is logged on `log` (empty: stderr) naming the endpoint, and the
/// rendezvous's reason.
///
/// Thread safety: runs on `t`'s executor, which runs one handler at a time; `t` outlives the
/// operation. Completion: `std::tuple<std::error_code, rendezvous_directory>`.
template <transport Transport>
asio::awaitable<std::tuple<std::error_code, rendezvous_directory>>
async_lookup_servers(Transport& t, typename Transport::endpoint_type root,
                     std::optional<std::uint32_t> worker_id, std::chrono::milliseconds timeout,
                     log_function log = {}) {
  if (timeout.count() <= 0 || (worker_id && *worker_id == protocol::any_id)) {
    detail::emit(log, "asyncps: lookup at the rendezvous: invalid argument (timeout " +
                          std::to_string(timeout.count()) + " ms)");
    co_return std::tuple{make_error_code(errc::invalid_argument), rendezvous_directory{}};
  }
  const protocol::lookup request{.worker = worker_id.value_or(protocol::any_id)};
  auto make = [&] {
    return protocol::encode(request, [&](std::size_t n) { return t.allocate(n); });
  };
  auto [ec, m] = co_await detail::rendezvous_request(t, root, make, timeout, log, "lookup");
  if (ec) co_return std::tuple{ec, rendezvous_directory{}};
  protocol::directory d;
  if (auto rec = detail::rendezvous_reply(m, d, message_type::directory, log, "lookup"))
    co_return std::tuple{rec, rendezvous_directory{}};
  if ((worker_id && d.worker != *worker_id) || (!worker_id && d.worker == protocol::no_worker_id)) {
    detail::emit(log, "asyncps: the rendezvous gave worker id " + std::to_string(d.worker) +
                          " to a lookup " +
                          (worker_id ? "as worker " + std::to_string(*worker_id)
                                     : std::string("for any worker id")));
    co_return std::tuple{make_error_code(errc::unexpected_message), rendezvous_directory{}};
  }
  rendezvous_directory out;
  out.worker_id = d.worker;
  out.num_workers = d.num_workers;
  out.servers.reserve(d.servers.size());
  for (const auto& s : d.servers) out.servers.push_back(host_port_string(s.host, s.port));
  co_return std::tuple{std::error_code{}, std::move(out)};
}

}  // namespace asyncps

#include "asyncps/detail/rendezvous/directory.ipp"
#include "asyncps/detail/rendezvous/sessions.ipp"
