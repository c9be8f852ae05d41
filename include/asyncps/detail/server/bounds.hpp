// asyncps — detail::server_bounds: the server-wide resource bounds of `server_protocol`,
// sans-io: the budget of queued outgoing bytes across sessions (`max_total_queued_bytes`:
// which session to close when a message would exceed it) and the deadlines of a session's
// first message (`hello_timeout`) and of a write in progress (`send_timeout`): which sessions
// are overdue, when to look next, and when the shell's one timer for them (the sweeper) may
// sleep. The protocol acts (logs, refuses, closes); this class only decides. Thread safety:
// one thread at a time (the server's executor).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>

#include "asyncps/server_options.hpp"

namespace asyncps::detail {

/// The bounds of one server over its sessions `Session` (a `server_session_state<TimePoint>`).
template <class Session, class TimePoint>
class server_bounds {
 public:
  explicit server_bounds(const server_options& o) noexcept
      : budget_(o.max_total_queued_bytes), hello_(o.hello_timeout), send_(o.send_timeout) {}

  // ---- the queue budget ----

  /// Payload bytes queued over all sessions not cut (closed at once).
  std::uint64_t queued_bytes() const noexcept { return total_; }
  /// `n` payload bytes were queued to a session.
  void on_queued(std::size_t n) noexcept { total_ += n; }
  /// A write of `n` payload bytes to `s` completed or was dropped: no write in progress.
  void on_sent(Session& s, std::size_t n) noexcept {
    s.send_since = TimePoint::max();
    s.queued_bytes -= n;
    if (!s.cut) total_ -= n;
  }
  /// `s` is closed at once: its queue no longer counts (the shell frees it as its write is
  /// aborted).
  void on_cut(Session& s) noexcept {
    if (s.cut) return;
    s.cut = true;
    total_ -= s.queued_bytes;
  }
  /// `s` ended: what it still had queued no longer counts.
  void on_finished(const Session& s) noexcept {
    if (!s.cut) total_ -= s.queued_bytes;
  }
  /// The session to close so that `bytes` more payload bytes for `s` fit the budget, or null
  /// when they fit: the largest queue among the sessions not cut that are workers or
  /// unidentified (a recovery peer's is never chosen); `s` itself when `bytes` alone exceed
  /// the budget or no other such session holds any. Cost: a pass over `sessions` when over.
  Session* over_budget(std::list<Session>& sessions, Session& s, std::size_t bytes) const {
    if (total_ + bytes <= budget_) return nullptr;
    if (bytes > budget_) return &s;
    Session* victim = nullptr;
    for (auto& o : sessions)
      if (!o.cut && !o.is_peer() && o.queued_bytes > 0 &&
          (victim == nullptr || o.queued_bytes > victim->queued_bytes))
        victim = &o;
    return victim != nullptr ? victim : &s;
  }

  // ---- the deadlines ----

  /// Whether `s` is watched for its first message (`hello_timeout`).
  bool awaits_hello(const Session& s) const noexcept {
    return hello_.count() > 0 && s.open && !s.cut && s.is_unknown();
  }
  /// Whether `s` is watched for its write in progress (`send_timeout`).
  bool awaits_write(const Session& s) const noexcept {
    return send_.count() > 0 && !s.cut && !s.is_peer() && s.send_since != TimePoint::max();
  }
  /// Session `s` started at `now`. Returns whether to wake the sweeper (see `watch`).
  [[nodiscard]] bool on_opened(Session& s, TimePoint now) noexcept {
    s.opened = now;
    return hello_.count() > 0 && watch(now + hello_);
  }
  /// The shell starts writing one message of `s` at `now`. Returns whether to wake the
  /// sweeper (see `watch`).
  [[nodiscard]] bool on_send_started(Session& s, TimePoint now) noexcept {
    s.send_since = now;
    return awaits_write(s) && watch(now + send_);
  }
  /// A session's deadline ended (greeted, claimed, refused, finished). Returns whether to wake
  /// the sweeper so that it disarms its timer now, not when it fires: nothing is watched any
  /// more (a simulation becomes quiescent at once). Cost: a pass over `sessions` while the
  /// sweeper's timer is armed.
  [[nodiscard]] bool settle(const std::list<Session>& sessions) noexcept {
    if (next_ == TimePoint::max()) return false;
    if (std::any_of(sessions.begin(), sessions.end(),
                    [this](const Session& s) { return awaits_hello(s) || awaits_write(s); }))
      return false;
    next_ = TimePoint::max();
    return true;
  }
  /// Calls `stalled(s)` for each session whose write has been in progress for `send_timeout`
  /// as of `now`, and `silent(s)` for each one without a first message `hello_timeout` after
  /// it started (both must end the session's deadline: close or refuse it). Returns when to
  /// call it next: the earliest deadline left, but at least 1/8 of the smaller timeout from
  /// `now` (so a flood of connections costs a few passes per timeout, not one per
  /// connection); none when nothing is watched (the sweeper then sleeps until woken).
  template <class Stalled, class Silent>
  std::optional<TimePoint> sweep(std::list<Session>& sessions, TimePoint now, Stalled stalled,
                                 Silent silent) {
    std::optional<TimePoint> next;
    const auto consider = [&](TimePoint due) { next = std::min(next.value_or(due), due); };
    for (auto& s : sessions) {
      if (awaits_write(s)) {
        if (s.send_since + send_ <= now) {
          stalled(s);
          continue;
        }
        consider(s.send_since + send_);
      }
      if (awaits_hello(s)) {
        if (s.opened + hello_ <= now) {
          silent(s);
          continue;
        }
        consider(s.opened + hello_);
      }
    }
    if (next) next = std::max(*next, now + granularity());
    next_ = next.value_or(TimePoint::max());
    return next;
  }

 private:
  // A deadline at `due` appeared: the sweeper must be woken when its timer is set later (it
  // then sweeps and re-arms for the earliest deadline).
  bool watch(TimePoint due) noexcept {
    if (due >= next_) return false;
    next_ = due;
    return true;
  }
  // How late the sweeper may close a session: 1/8 of the smaller timeout, at least 1 ms.
  std::chrono::milliseconds granularity() const noexcept {
    auto t = std::chrono::milliseconds::max();
    if (hello_.count() > 0) t = std::min(t, hello_);
    if (send_.count() > 0) t = std::min(t, send_);
    return std::max(t / 8, std::chrono::milliseconds(1));
  }

  std::uint64_t budget_;
  std::chrono::milliseconds hello_;
  std::chrono::milliseconds send_;
  std::uint64_t total_ = 0;  // queued payload bytes of the sessions not cut
  // When the sweeper's timer fires, as far as we know (max: it sleeps, or it will sleep).
  TimePoint next_ = TimePoint::max();
};

}  // namespace asyncps::detail
