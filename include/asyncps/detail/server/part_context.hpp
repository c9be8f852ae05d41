// asyncps — the sans-io half of what a recovery part's hooks may do with a server shard
// (recovery.hpp, server hooks): read and change the shard, talk to sessions, log, arm the
// part's timers (deadlines the server's sweeper fires). Everything here goes through
// `detail::server_protocol` alone, with no transport, executor or timer object, so a test can
// step a policy's server part message by message and tick by tick with its own shell
// (tests/unit/policy_steps_test.cpp). `basic_server::context` adds `connect` (the one action
// that needs the transport's address type) and the transport's limits on top of it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "asyncps/buffer.hpp"
#include "asyncps/consistency.hpp"
#include "asyncps/detail/server/session_base.hpp"
#include "asyncps/layout.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/server_options.hpp"
#include "asyncps/shard_state.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::detail {

/// What a recovery part's hooks may do with the shard of `Protocol` (a `server_protocol`):
/// a copyable handle, valid while the protocol lives; every call on the thread or executor
/// that runs the protocol. Sessions are seen as `session_base&` and must be sessions of this
/// protocol.
template <class Protocol>
class part_context {
 public:
  using protocol_type = Protocol;
  using session_type = typename Protocol::session_type;
  using core_type = typename Protocol::core_type;

  explicit part_context(Protocol& p) noexcept : p_(&p) {}

  const server_options& options() const noexcept { return p().options(); }
  /// The policy fingerprint workers and peers must send (protocol.hpp).
  static constexpr std::uint32_t fingerprint() noexcept {
    return policy_fingerprint<typename Protocol::consistency_type,
                              typename Protocol::recovery_type>();
  }
  static constexpr std::string_view policy_name() noexcept { return Protocol::recovery_type::name; }
  /// Whether the consistency policy bounds values (VAP): the server then acknowledges a
  /// writer's clock once it is visible to every reader, not when it is applied, so a part
  /// that returns false from `on_applied` leaves that ack to the server.
  static constexpr bool value_bounded = is_value_bounded_v<typename Protocol::consistency_type>;
  /// Logs one line as this server.
  void log(const std::string& line) const { p().log(line); }
  /// Logs `line` as this server unless lines of `kind` (a `detail::log_kind` constant or a
  /// literal: static storage) are over their rate (a few every 10 s, then a count of the
  /// rest, as the server's refusals; detail::log_limiter). Returns whether it was logged.
  bool log_limited(std::string_view kind, const std::string& line) const {
    if (!p().log_allowed(kind, "")) return false;
    p().log(line);
    return true;
  }

  // ---- sessions ----

  /// Makes `s` a peer session with tag `role`: its messages go to `on_peer_message`.
  static void claim(session_base& s, std::uint8_t role) noexcept {
    s.kind = session_base::kind_type::peer;
    s.role = role;
  }
  /// Queues `m` to peer `s` (not bounded by the per-worker queue limits).
  void send_peer(session_base& s, message m) const {
    p().enqueue(as_session(s), std::move(m), true);
  }
  /// Acknowledges push `seq` to worker session `s`, or to worker `w` when it is connected.
  void ack(session_base& s, std::uint64_t seq) const { p().send_ack(as_session(s), seq); }
  void ack_worker(std::uint32_t w, std::uint64_t seq) const {
    if (session_type* ws = p().worker_session(w)) p().send_ack(*ws, seq);
  }
  /// Queues `m` to worker `w` when it is connected (not bounded by the queue limits).
  void send_worker(std::uint32_t w, message m) const {
    if (session_type* ws = p().worker_session(w)) p().enqueue(*ws, std::move(m), true);
  }
  /// Whether worker `w` is connected now.
  bool worker_connected(std::uint32_t w) const { return p().worker_session(w) != nullptr; }
  /// Dispatches `m`, a message of worker session `s` that the part held (hook
  /// `on_worker_message`), as if it arrived now; an error refuses `s` and is returned.
  std::error_code dispatch(session_base& s, message& m) const {
    std::string detail;
    auto ec = p().dispatch(as_session(s), m, detail);
    if (ec) p().reject(as_session(s), ec, detail);
    return ec;
  }
  /// Dispatches `m`, a push or clock message of worker `w` that the part held, on the
  /// worker's session now, or without one when it is not connected (applied, not
  /// acknowledged); an error refuses the session and is returned.
  std::error_code dispatch_of(std::uint32_t w, message& m) const {
    std::string detail;
    session_type* ws = p().worker_session(w);
    auto ec = p().dispatch_held(w, ws, m, detail);
    if (ec && ws != nullptr) p().reject(*ws, ec, detail);
    return ec;
  }
  /// How long ago the last message arrived on `s` (its silence), in the transport clock's
  /// duration (from the clock's epoch when nothing has arrived on it yet).
  auto silent_for(const session_base& s) const {
    return p().now() - static_cast<const session_type&>(s).heard;
  }
  /// Closes `s` now / after its queued messages.
  void close(session_base& s) const { p().close(as_session(s)); }
  void close_after_flush(session_base& s) const { p().close_after_flush(as_session(s)); }
  /// Closes every session `pred(session)` selects, in the order they were opened.
  template <class Pred>
  void close_if(Pred pred) const {
    for (auto& s : p().sessions())
      if (pred(static_cast<const session_base&>(s))) p().close(s);
  }

  // ---- timers (the part's hook `on_timer`; fired by the server's sweeper) ----

  /// How many timers a part may arm: ids 0 .. timer_count - 1.
  static constexpr std::uint32_t timer_count = Protocol::part_timer_count;
  /// Arms timer `id` (< `timer_count`) to fire once, `after` (milliseconds) from now in the
  /// transport's clock (virtual time on the simulated transport): the part's
  /// `on_timer(ctx, id)` is then called on the server's executor. Arming an armed timer
  /// moves its deadline. Not fired after the server stops. Exceptions: `std::out_of_range`
  /// (naming the id) for an id >= `timer_count`.
  void arm_timer(std::uint32_t id, std::chrono::milliseconds after) const {
    p().arm_part_timer(id, after);
  }
  /// Disarms timer `id` (nothing when it is not armed, or `id` >= `timer_count`).
  void cancel_timer(std::uint32_t id) const noexcept { p().cancel_part_timer(id); }
  /// Whether timer `id` is armed (false for `id` >= `timer_count`).
  bool timer_armed(std::uint32_t id) const noexcept { return p().part_timer_armed(id); }

  // ---- the shard ----

  std::size_t num_tables() const noexcept { return p().core().num_tables(); }
  key_range range(table_id t) const noexcept { return p().core().table(t).range; }
  clock_value clock() const noexcept { return p().core().clock(); }
  clock_value worker_clock(std::uint32_t w) const noexcept { return p().core().worker_clock(w); }
  /// Highest push (or clock) sequence number applied per worker.
  std::uint64_t& last_seq(std::uint32_t w) const noexcept { return p().core().last_seq(w); }
  /// Whether the shard holds trained state (a push applied or a state restored).
  bool has_state() const noexcept { return p().core().has_state(); }
  /// Validates table, width and rows of push/pull `m` against this shard.
  std::error_code check_rows(const message& m, std::string& detail) const {
    return p().core().check_rows(m, detail);
  }
  static bool all_finite(std::span<const float> g) noexcept { return core_type::all_finite(g); }
  /// Applies checked push `m` of worker `m.header.sender` and counts it like a worker's.
  /// Errors: `errc::non_finite_update` when it would make a value or the optimizer's state
  /// non-finite (nothing applied or counted; deterministic, so every replica refuses it).
  [[nodiscard]] std::error_code apply_push(const message& m) const {
    std::string detail;
    if (auto ec = p().apply(m, detail)) return ec;
    p().core().count_push(m.header.sender, m.header.table);
    ++p().stats().pushes;
    return {};
  }
  /// Applies checked update `m` without counting it as a worker's push. Errors: as
  /// `apply_push`.
  [[nodiscard]] std::error_code apply_update(const message& m) const {
    std::string detail;
    return p().apply(m, detail);
  }
  /// Replaces table `t`'s values with `v` and clears its optimizer state.
  void install_replica(table_id t, std::span<const float> v) const {
    p().core().install_replica(t, v);
  }
  /// Moves worker `w`'s clock to `c` (answers pulls, pushes eager rows, ...).
  void advance(std::uint32_t w, clock_value c) const { p().advance(w, c); }
  /// A buffer of `n` bytes for a message (the transport's pool). Exceptions: `std::bad_alloc`.
  buffer allocate(std::size_t n) const { return p().allocate(n); }
  /// Copies the shard's whole state into `out` / installs `st` (see `server_protocol`).
  void save_state(shard_state& out) const { p().save_state(out); }
  std::error_code restore_state(const shard_state& st) const { return p().restore_state(st); }

 protected:
  static session_type& as_session(session_base& s) noexcept {
    return static_cast<session_type&>(s);
  }
  Protocol& p() const noexcept { return *p_; }

 private:
  Protocol* p_;
};

}  // namespace asyncps::detail
