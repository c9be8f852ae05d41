// asyncps — detail::worker_protocol: what a worker knows about each link and how it answers
// each message, sans-io. The worker's options and counters are in asyncps/worker_options.hpp.
//
// `worker_protocol` holds the worker's cache, every link's protocol state (up, sequence
// numbers, VAP updates in transit, the server's last heartbeat report), the recovery policy's
// worker part and the counters. It builds the hello, checks the handshake reply, installs
// received messages and queues a rejoining link's messages; it touches no socket, timer or
// executor. `worker_core` (fsm.hpp) adds the clock loop; `basic_worker` executes both.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "asyncps/consistency.hpp"
#include "asyncps/detail/config.hpp"
#include "asyncps/detail/endian.hpp"
#include "asyncps/detail/ring.hpp"
#include "asyncps/detail/text.hpp"
#include "asyncps/detail/worker/cache.hpp"
#include "asyncps/detail/worker/hooks.hpp"
#include "asyncps/error.hpp"
#include "asyncps/log.hpp"
#include "asyncps/model.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery.hpp"
#include "asyncps/staleness.hpp"
#include "asyncps/table.hpp"
#include "asyncps/wire.hpp"
#include "asyncps/worker_options.hpp"

namespace asyncps {

namespace detail {

/// `given` when set and not 0, else a random non-zero 64-bit value from `std::random_device`
/// (a worker's incarnation, see `worker_options::incarnation`).
ASYNCPS_DECL std::uint64_t draw_incarnation(std::optional<std::uint64_t> given);

/// A worker's protocol state and message handling (see the file comment). `Alloc` has
/// `buffer allocate(std::size_t)` (the transport's pool). Thread safety: the owner's executor.
template <class Model, class Consistency, class Recovery, class Alloc, class Endpoint>
class worker_protocol {
 public:
  using part_type = typename Recovery::worker_part;
  static constexpr bool value_bounded = is_value_bounded_v<Consistency>;
  static constexpr bool sparse_reads = sparse_read_source<Model>;
  static_assert(check_worker_part<part_type>());

  struct in_transit_update {
    std::uint64_t seq = 0;
    float magnitude = 0;
  };
  /// The protocol state of the link to one shard (the shell owns its connection).
  struct link {
    std::uint32_t shard = 0;
    std::uint32_t endpoint = 0;  ///< 0: servers[shard]; i > 0: replicas[shard][i - 1]
    bool up = false;
    bool reading = false;       ///< its read loop runs
    bool reconnecting = false;  ///< its reconnect coroutine runs
    bool joining = false;       ///< reconnected and greeted; the clock loop finishes the rejoin
    clock_value hello_clock = 0;
    bool gave_up = false;
    /// Pushes were built for this link while it was down and not sent (the policy's `on_push`
    /// may keep them); the run does not end before the link is up again, so that its welcome
    /// counts the ones the server lacks (`worker_stats::lost_pushes`), or the policy gives up.
    bool unsent = false;
    bool welcome_policy_bit = false;  ///< the server's welcome had flag `policy`
    /// The recovery policy answered `continue_local` to this link's loss: train on from the
    /// cache while it is down (the gradient slices go to the part's `while_away` hook).
    bool trains_away = false;
    std::error_code failure;
    std::string reason;
    std::uint64_t seq = 0;
    /// This worker's clocks the server has not acknowledged yet: under VAP, as visible (with
    /// their magnitude); otherwise, as applied (the push window, `worker_options::push_window`).
    /// Also the magnitude of the clock being pushed now (VAP).
    detail::ring<in_transit_update> in_transit;
    float magnitude = 0;
    /// VAP: the eager rows messages received on this connection that asked for an
    /// acknowledgement (each is acknowledged with this count, see `on_message`).
    std::uint64_t visibility_rows = 0;
    bool refused = false;  ///< `failure` is the code of the server's refusal (reported as is)
    /// What the recovery policy answered the last handshake's refusal (`on_refused`; `fail`
    /// when the handshake was not refused): `next_server` tells the shell to try the shard's
    /// next server quietly, `lost` to give the link up.
    refusal_action refusal = refusal_action::fail;
    /// The server's last heartbeat report: its clock; the slowest worker's id, clock, state.
    bool reported = false;
    clock_value report_clock = 0;
    std::uint32_t slowest = 0;
    clock_value slowest_clock = 0;
    bool slowest_connected = false;
  };
  /// What a received message asks of the shell: fail the link with `error`, close the
  /// connection of a link the message failed, wake the clock loop.
  struct message_outcome {
    std::error_code error{};
    bool wake = false;
    bool closed = false;
  };

  /// `opts`, `model` and `alloc` outlive the core. Precondition: `opts.servers` not empty.
  worker_protocol(Model& model, const worker_options<Endpoint>& opts, Alloc& alloc, part_type part)
      : model_(model), opts_(opts), alloc_(alloc), recovery_(std::move(part)),
        cache_(model.tables(), static_cast<std::uint32_t>(opts.servers.size())) {
    const auto shards = static_cast<std::uint32_t>(opts_.servers.size());
    const auto tables = static_cast<std::uint32_t>(cache_.tables().size());
    snapshot_.assign(cache_.values().size(), 0.0f);
    links_.reserve(shards);
    for (std::uint32_t s = 0; s < shards; ++s) links_.emplace_back().shard = s;
    replies_.resize(shards);
    rejoin_parts_.reserve(tables);
    // Whether the worker waits for its clocks' acks itself: VAP, a push window at every clock,
    // or a policy that never bounds staleness (ASP: the default push window at every clock).
    const bool waits_for_acks = value_bounded || (opts_.push_window && *opts_.push_window > 0) ||
                                policy_.min_server_clock(protocol::max_clock) == no_clock;
    worker_hooks::on_start(recovery_, worker_setup{shards, tables, waits_for_acks});
  }

  link& link_of(std::uint32_t s) noexcept { return links_[s]; }
  std::vector<link>& links() noexcept { return links_; }
  const worker_cache<sparse_reads>& cache() const noexcept { return cache_; }
  /// The parameters the model computes its gradient on: the cache as of the last compute step
  /// (its snapshot: each table in the snapshot buffer, or in a payload it shares; see
  /// `worker_cache::refresh_snapshot`). Valid from the first compute step until the next.
  parameter_view parameters() const noexcept {
    return parameter_view(cache_.tables(), cache_.snapshot_tables());
  }
  /// What the snapshot refreshes copied (or skipped) so far.
  const snapshot_counts& snapshot_stats() const noexcept { return cache_.snapshot_stats(); }
  Consistency& consistency() noexcept { return policy_; }
  const Consistency& consistency() const noexcept { return policy_; }
  part_type& recovery() noexcept { return recovery_; }
  const part_type& recovery() const noexcept { return recovery_; }
  worker_stats& stats() noexcept { return stats_; }
  const worker_stats& stats() const noexcept { return stats_; }
  /// Drops the own pushes kept for read-my-writes (at the end of a run), after applying those
  /// the cache does not have yet (so the cache has every push of the run).
  void clear_local() noexcept {
    for (const auto& l : links_) cache_.clear_local(l.shard);
  }
  const staleness_histogram& staleness() const noexcept { return staleness_; }
  clock_value clock() const noexcept { return clock_; }
  bool all_up() const noexcept {
    return std::all_of(links_.begin(), links_.end(), [](const link& l) { return l.up; });
  }
  void log(const std::string& line) const {
    emit(opts_.log, "asyncps worker " + std::to_string(opts_.id) + ": " + line);
  }
  const Endpoint& endpoint_of(const link& l) const {
    return l.endpoint == 0 ? opts_.servers[l.shard] : opts_.replicas[l.shard][l.endpoint - 1];
  }
  /// "server 0 at 127.0.0.1:7000" (the endpoint the link uses now).
  std::string server_name(const link& l) const {
    return "server " + std::to_string(l.shard) + " at " + endpoint_string(endpoint_of(l));
  }
  /// Moves `l` on to the shard's next server (`worker_options::replicas`, tried in turn).
  void next_endpoint(link& l) const {
    const std::size_t n = l.shard < opts_.replicas.size() ? opts_.replicas[l.shard].size() : 0;
    l.endpoint = n == 0 ? 0 : static_cast<std::uint32_t>((l.endpoint + 1) % (n + 1));
  }

  /// The hello for link `s`: policy fingerprint, the clock the recovery policy rejoins at,
  /// and the layout (rows, width per table).
  message hello(std::uint32_t s) {
    const auto tables = cache_.tables();
    links_[s].hello_clock = worker_hooks::hello_clock(recovery_, s, clock_);
    links_[s].refusal = refusal_action::fail;  // until a refusal of this hello says otherwise
    protocol::hello h{.worker = opts_.id,
                      .clock = links_[s].hello_clock,
                      .fingerprint = policy_fingerprint<Consistency, Recovery>(),
                      .incarnation = incarnation_,
                      .layout = {}};
    h.layout.reserve(tables.size());
    for (const auto& t : tables) h.layout.push_back({t.rows, t.width});
    message m = protocol::encode(h, [this](std::size_t n) { return alloc_.allocate(n); });
    m.header.flags = worker_hooks::hello_flags(recovery_, s);
    return m;
  }

  /// The reply to link `s`'s hello. A welcome sets the read-my-writes step, moves the clock
  /// up to the server's record, and realigns the push counts with what the server applied
  /// (the recovery policy says what became of pushes it lacks). Errors (the shell closes the
  /// connection): the refusal's code (what the shell does next is in `l.refusal`, the policy's
  /// `on_refused`: try the next server, give up, or fail), or `errc::unexpected_message`, or
  /// `errc::server_lost` (the policy gives up).
  std::error_code on_handshake_reply(std::uint32_t s, const message& m) {
    link& l = links_[s];
    const auto tables = cache_.tables();
    std::string why;
    if (m.header.type == message_type::error) {
      protocol::error e;
      const bool decoded = !protocol::decode(m, e, why);
      const std::optional<std::error_code> code =
          decoded ? code_of(e) : std::optional<std::error_code>();
      if (!code) {
        log(server_name(l) + " refused the connection: " +
            (decoded ? peer_text(e.reason) : "(a malformed error" + why + ")"));
        return errc::unexpected_message;
      }
      l.refusal = worker_hooks::on_refused(recovery_, s, *code);
      if (l.refusal == refusal_action::next_server) return *code;  // routine: not logged
      log(server_name(l) + " refused the connection: " + peer_text(e.reason));
      if (l.refusal == refusal_action::lost) count_all_lost(s);
      return *code;
    }
    protocol::welcome& w = welcome_;  // reused: a reconnect decodes into the same vectors
    if (protocol::decode(m, w, why) || w.shard != s || w.num_shards != links_.size() ||
        w.tables.size() != tables.size() || w.worker_clock < 0) {
      log(server_name(l) + " sent an unexpected handshake reply" + why);
      return errc::unexpected_message;
    }
    const float server_step = w.local_step;
    if (!std::isfinite(server_step)) {
      log(server_name(l) + " sent a non-finite local step in its welcome");
      return errc::unexpected_message;
    }
    cache_.set_step(s, opts_.local_step.value_or(server_step));
    clock_ = std::max(clock_, w.worker_clock);
    // Number the next messages above what the server applied from this id (a restarted
    // worker would otherwise reuse its earlier incarnation's numbers: dropped as duplicates).
    l.seq = std::max(l.seq, w.last_seq);
    auto& parts = cache_.parts(s);
    for (table_id t = 0; t < tables.size(); ++t) {
      auto& p = parts[t];
      const auto applied = w.tables[t].applied;
      const welcome_action act = worker_hooks::on_welcome(
          recovery_, welcome_part{s, t, applied, p.pushed, w.policy_bit, p.clock, p.local});
      if (act == welcome_action::give_up && applied < p.pushed) {
        log("server " + std::to_string(s) + " came back without " +
            std::to_string(p.pushed - applied) + " of this worker's pushes; recovery policy '" +
            std::string(Recovery::name) + "' gives up");
        return errc::server_lost;
      }
      if (act != welcome_action::resend) {
        if (act == welcome_action::count_lost && applied < p.pushed)
          stats_.lost_pushes += p.pushed - applied;
        p.pushed = applied;
      }
      cache_.clear_local(s, t);
      p.pulling = false;
    }
    l.welcome_policy_bit = w.policy_bit;
    return {};
  }

  /// Link `s`'s server refused this worker with a code the recovery policy answers
  /// `refusal_action::lost`: the shard's state is gone, so every push of this worker to it is
  /// lost (those acknowledged included). Counts them once in `worker_stats::lost_pushes` (and
  /// `lost_acknowledged`) and logs the count with the shard's last known server clock.
  void count_all_lost(std::uint32_t s) {
    std::uint64_t lost = 0;
    clock_value last = no_clock;
    cache_.clear_local(s);
    for (auto& p : cache_.parts(s)) {
      lost += p.pushed;
      p.pushed = 0;
      if (p.clock != no_clock) last = std::max(last, p.clock);
    }
    const bool acks = (worker_hooks::push_flags(recovery_) & frame_flags::want_ack) != 0;
    const std::uint64_t acked =
        acks ? lost - std::min(lost, worker_hooks::unacknowledged(recovery_, s)) : 0;
    stats_.lost_pushes += lost;
    stats_.lost_acknowledged += acked;
    ++stats_.shards_lost;
    log("shard " + std::to_string(s) + " is lost: " + std::to_string(lost) +
        " of this worker's pushes to it are gone" +
        (acks ? " (" + std::to_string(acked) + " of them acknowledged)" : std::string()) +
        "; its rows were last read at server clock " +
        (last == no_clock ? std::string("(none)") : std::to_string(last)) +
        ", this worker is at clock " + std::to_string(clock_));
  }

  /// Link `s` failed with `ec` (no-op when it is already down); returns whether it was up
  /// (the shell then closes its connection and wakes the clock loop).
  bool fail(std::uint32_t s, std::error_code ec, std::string reason) {
    link& l = links_[s];
    if (!l.up) return false;
    l.up = false;
    l.failure = ec;
    l.reason = std::move(reason);
    // VAP: what the lost server had not acknowledged is lost with it or travels through the
    // recovery policy; it no longer counts as in transit.
    while (!l.in_transit.empty()) l.in_transit.pop_front();
    l.visibility_rows = 0;  // a new connection counts from 0 (so does its server session)
    return true;
  }

  /// Whether the worker waits for something from link `s`: a pull of one of its parts.
  bool waits_on(std::uint32_t s) const {
    const auto& parts = cache_.parts(s);
    return std::any_of(parts.begin(), parts.end(), [](const auto& p) { return p.pulling; });
  }
  /// A message received on link `s` (rows, ack, heartbeat, error, bye). An `error` frame or
  /// `bye` fails the link here; a malformed message returns the error to fail it with.
  message_outcome on_message(std::uint32_t s, message& m) {
    link& l = links_[s];
    const auto& h = m.header;
    switch (h.type) {
      case message_type::rows: {
        if (auto err = cache_.check_shape(h)) return {err, false};
        ++stats_.rows_messages;
        if (h.has(frame_flags::eager)) ++stats_.eager_messages;
        if (auto err = cache_.install(s, m)) return {err, false};
        if constexpr (value_bounded) {
          // VAP: rows that make another worker's clock visible once this reader has them; the
          // server acknowledges that clock to its writer when every such reader has answered.
          if (h.has(frame_flags::eager) && h.has(frame_flags::want_ack)) {
            message a;
            a.header.type = message_type::ack;
            a.header.sender = opts_.id;
            a.header.seq = ++l.visibility_rows;
            replies_[s].push_back(std::move(a));
          }
        }
        return {{}, true};
      }
      case message_type::ack: {
        // An ack may carry the recovery policy's bytes (flag `policy`, e.g. replica_log's
        // apply-first order): the part takes them first, then the ack is an ack.
        if (h.has(frame_flags::policy)) {
          if (auto err = worker_hooks::on_server_message(recovery_, s, m, replies_[s]))
            return {err, false};
        } else if (!m.payload.empty()) {
          return {make_error_code(errc::payload_size_mismatch), false};
        }
        const bool wake = worker_hooks::on_ack(recovery_, s, h.seq);
        // VAP: clocks now visible; otherwise the push window's clocks now applied.
        bool acked_clock = false;
        while (!l.in_transit.empty() && l.in_transit.front().seq <= h.seq) {
          l.in_transit.pop_front();
          acked_clock = true;
        }
        if constexpr (value_bounded) return {{}, true};
        return {{}, wake || acked_clock};
      }
      case message_type::heartbeat: return {};
      case message_type::report: {
        protocol::report r;
        std::string why;
        if (auto err = protocol::decode(m, r, why)) return {err, false};
        l.reported = true;
        l.report_clock = r.server_clock;
        l.slowest = r.slowest;
        l.slowest_clock = r.slowest_clock;
        l.slowest_connected = r.slowest_connected;
        return {};
      }
      case message_type::error: {
        protocol::error e;
        std::string why;
        if (auto err = protocol::decode(m, e, why)) return {err, false};
        std::string reason = peer_text(e.reason);
        log(server_name(l) + " closed the connection: " + reason);
        const std::optional<std::error_code> code = code_of(e);
        // A refusal of what this worker sent (a NaN push, a bad header...): the link fails
        // with its code, and when the recovery policy gives up the run ends with that code
        // (not server_lost). A routine refusal (the policy's `on_refused` answers
        // `next_server`), or no valid code: a plain failure of the link.
        const bool refusal =
            code && worker_hooks::on_refused(recovery_, s, *code) != refusal_action::next_server;
        const bool was_up =
            fail(s, refusal ? *code : make_error_code(errc::unexpected_message), std::move(reason));
        l.refused = refusal;
        // Another connection took this worker's id over (a newer process with the same id):
        // taking it back would only start a tug of war, so this worker stops with the code.
        if (code == errc::duplicate_worker) l.gave_up = true;
        return {{}, was_up, was_up};
      }
      case message_type::bye: {
        const bool was_up = fail(s, errc::connection_closed, "");
        return {{}, was_up, was_up};
      }
      default:
        // e.g. recovery::replica_log's order and state messages; replies go to `replies(s)`
        if (auto err = worker_hooks::on_server_message(recovery_, s, m, replies_[s]))
          return {err, false};
        return {{}, true};
    }
  }
  message_outcome on_message(std::uint32_t s, message&& m) { return on_message(s, m); }
  /// The code a server's error frame `e` names: an `errc`, or the recovery policy's own code
  /// (`recovery_policy`, `R::error_enum`); `std::nullopt` when it names none this worker knows.
  static std::optional<std::error_code> code_of(const protocol::error& e) noexcept {
    if (e.code) return make_error_code(*e.code);
    return policy_error_from_wire<Recovery>(e.policy_code);
  }
  /// Messages the recovery part queued in reply to link `s`'s messages (the shell sends them
  /// in order and clears the vector).
  std::vector<message>& replies(std::uint32_t s) noexcept { return replies_[s]; }

  /// Queues what link `s` sends before it is up again (the recovery policy's `on_rejoin`).
  void queue_rejoin(std::uint32_t s, std::vector<rejoin_message>& out) {
    rejoin_parts_.clear();
    cache_.apply_local(s);  // the state sent has every push of this worker
    const auto& parts = cache_.parts(s);
    for (table_id t = 0; t < parts.size(); ++t)
      rejoin_parts_.push_back(rejoin_part{parts[t].range, cache_.tables()[t].width, parts[t].have,
                                          cache_.values().data() + cache_.part_offset(s, t)});
    out.clear();
    rejoin_context r(
        s, opts_.id, links_[s].hello_clock, clock_, links_[s].welcome_policy_bit, rejoin_parts_,
        [](void* a, std::size_t n) { return static_cast<Alloc*>(a)->allocate(n); }, &alloc_, out);
    worker_hooks::on_rejoin(recovery_, r);
  }
  /// A queued rejoin message with header `h` went out on link `s` (its bytes were counted).
  void rejoin_sent(std::uint32_t s, const frame_header& h) {
    worker_hooks::on_rejoin_sent(recovery_, s, h);
  }
  /// Link `s` is up again: its cached rows are from before the outage (fetch them anew and,
  /// for ESSP, resubscribe).
  void rejoined(std::uint32_t s) {
    cache_.forget(s);
    ++stats_.reconnects;
    links_[s].up = true;
    links_[s].unsent = false;
    links_[s].refused = false;
    log("rejoined server " + std::to_string(s) + " at clock " + std::to_string(clock_));
  }

 protected:
  Model& model_;
  const worker_options<Endpoint>& opts_;
  Alloc& alloc_;
  [[no_unique_address]] Consistency policy_{};
  [[no_unique_address]] part_type recovery_{};
  worker_cache<sparse_reads> cache_;
  std::vector<float> snapshot_;
  std::vector<link> links_;
  std::vector<rejoin_part> rejoin_parts_;      // scratch (no allocation once warm)
  std::vector<std::vector<message>> replies_;  // per link: the recovery part's replies
  protocol::welcome welcome_{};                // the last welcome decoded (reused)
  std::uint64_t incarnation_ = draw_incarnation(opts_.incarnation);  // in every hello
  clock_value clock_ = 0;
  staleness_histogram staleness_{};
  worker_stats stats_{};
};

}  // namespace detail
}  // namespace asyncps

#if !defined(ASYNCPS_SEPARATE_COMPILATION)
#include "asyncps/detail/worker/protocol.ipp"
#endif
