// asyncps — recovery::replica_log (SWIFT), server part: orders every update, applies it only
// once its worker has logged the order (or at once, `replica_log_ordering::apply_first`), sends
// state replicas to the workers, and rebuilds a restarted shard from the newest replica plus the
// workers' logs replayed in the original order. See recovery/replica_log.hpp and
// docs/recovery/swift.md.
//
// This file holds the counters, the class, its hooks and its small helpers; the longer members
// are defined at its end, in server_part_order.ipp (holding and ordering worker messages, the
// write-ahead release, state replicas to the workers, voiding unconfirmed orders) and
// server_part_rebuild.ipp (rebuilding a restarted shard from the replicas and logs, and the
// watch that times a rebuild out and voids orphaned orders). Sans-io: no coroutine, timer or
// socket of its own; the watch is the server's part timer (`ctx.arm_timer`, hook `on_timer`).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "asyncps/detail/codec/shard_state.hpp"
#include "asyncps/detail/log_limiter.hpp"
#include "asyncps/detail/ring.hpp"
#include "asyncps/detail/server/hooks.hpp"
#include "asyncps/error.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery/replica_log/messages.hpp"
#include "asyncps/recovery/replica_log/options.hpp"
#include "asyncps/shard_state.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::recovery {

/// Counters of a `replica_log` server part (`basic_server::recovery().stats()`, read on the
/// server's executor).
struct replica_log_stats {
  std::uint64_t ordered = 0;  ///< push and clock messages given an apply position
  /// `order` messages sent: each carries the positions of a worker's messages of one clock
  /// (at most `protocol::max_order_entries`), so `ordered / orders_sent` is the batching.
  std::uint64_t orders_sent = 0;
  std::uint64_t replicas_sent = 0;    ///< state replicas sent to a worker
  std::uint64_t replicas_stored = 0;  ///< of those, stored (the stable position moved)
  std::uint64_t replica_bytes = 0;    ///< bytes of the last replica sent
  std::uint64_t recoveries = 0;       ///< rebuilds of this shard after a restart
  std::uint64_t replayed = 0;         ///< logged entries applied by rebuilds
  /// Positions a rebuild found no log entry for, between the replica it installed and the
  /// newest position replayed. In an exact rebuild (every worker's log arrived) each is a
  /// message whose order was lost with the connection: the dead server could not apply it
  /// (nor anything after it), and its worker resends it. In an incomplete rebuild each may be
  /// an update the dead server applied that is now lost (an upper bound).
  std::uint64_t missing_positions = 0;
  /// Rebuilds that could not be exact: a worker's log or the newest replica did not arrive
  /// within `recovery_timeout` (logged with what was missing).
  std::uint64_t incomplete_recoveries = 0;
  /// `replica_log_ordering::apply_first` only: rebuilds that were complete and exactly-once
  /// but not provably bit-exact, because some worker resent updates whose order it never got
  /// (the dead server may have applied them between replayed ones; they are applied after).
  std::uint64_t reordered_recoveries = 0;
  std::uint64_t voided = 0;  ///< ordered, never confirmed, dropped (see `void_timeout`)
  /// Orders of a worker's unfinished clock sent before its clock ended, because one of them
  /// kept later updates waiting for `commit_timeout`.
  std::uint64_t early_orders = 0;
  /// Workers that did not confirm an order within `commit_timeout` while later updates
  /// waited: the connection closed, or (reconnected) its closed connection's orders voided.
  std::uint64_t commit_timeouts = 0;
  /// Worker clocks whose updates an inexact rebuild lacked: a worker's clock moved up to its
  /// next update's (0 after exact rebuilds).
  std::uint64_t skipped_clocks = 0;
  std::uint64_t max_held = 0;  ///< most messages held at once
  /// Held or replayed messages dropped because the server refused them when they were
  /// dispatched (a push that fails the server's checks once its turn came, e.g. its values
  /// are not finite or too large, or its clock does not fit): their position is used, their
  /// update is not applied. Each is logged (rate-limited: a few lines every 10 s, then a
  /// count); the worker's session, when connected, is refused with the reason.
  std::uint64_t dropped = 0;
  std::uint64_t position = 0;        ///< the last position applied
  std::uint64_t stable = 0;          ///< the stable position (newest replica stored)
  double last_recovery_seconds = 0;  ///< first hello to serving again, last rebuild

  /// Calls `f(name, value)` for every member above, in declaration order; `name` is the
  /// member's name (a `const char*`), `value` a `std::uint64_t` (a count, a byte count, or
  /// a position) or, for `last_recovery_seconds`, a `double` in seconds. No `operator+=`:
  /// `position`, `stable`, `replica_bytes` and `last_recovery_seconds` describe one shard
  /// now and do not add up over shards.
  template <class F>
  void for_each_counter(F&& f) const {
    f("ordered", ordered);
    f("orders_sent", orders_sent);
    f("replicas_sent", replicas_sent);
    f("replicas_stored", replicas_stored);
    f("replica_bytes", replica_bytes);
    f("recoveries", recoveries);
    f("replayed", replayed);
    f("missing_positions", missing_positions);
    f("incomplete_recoveries", incomplete_recoveries);
    f("reordered_recoveries", reordered_recoveries);
    f("voided", voided);
    f("early_orders", early_orders);
    f("commit_timeouts", commit_timeouts);
    f("skipped_clocks", skipped_clocks);
    f("max_held", max_held);
    f("dropped", dropped);
    f("position", position);
    f("stable", stable);
    f("last_recovery_seconds", last_recovery_seconds);
  }
};

/// recovery::replica_log, server part (see recovery/replica_log.hpp). Thread safety: on the
/// server's executor.
struct replica_log_server_part {
  replica_log_options options{};

  /// The counters.
  const replica_log_stats& stats() const noexcept { return rt_.value.stats_; }
  /// Whether the shard is rebuilding (it holds every worker message until done).
  bool recovering() const noexcept { return rt_.value.mode_ == mode::recovering; }
  /// Whether the shard serves: it started fresh, or its rebuild is done.
  bool serving() const noexcept { return rt_.value.mode_ == mode::serving; }
  /// Called after each logged entry a rebuild applies, with its position, and once with the
  /// position of the installed replica before them (for tests and tracing; on the server's
  /// executor, which may call `basic_server::save_state`).
  std::function<void(std::uint64_t position)> on_replayed{};
  /// Called when a rebuild has ended, its counters in `stats()` final, just before the shard
  /// serves what it held (e.g. to report the rebuild at once: a process killed later cannot
  /// report at its end). On the server's executor.
  std::function<void()> on_rebuilt{};

  // ---- hooks (see recovery.hpp, server hooks) ----

  /// The first hello decides: a worker that holds a log for this shard (hello flag
  /// `protocol::holds_log_flag`) meets a shard without state, so the shard restarted and rebuilds
  /// before serving. A later hello with a log from a worker this server never met, once it serves,
  /// is refused (`errc::server_lost`): its log belongs to a server this one did not rebuild.
  template <class Ctx>
  std::error_code on_hello(Ctx ctx, const frame_header& hello, std::string& detail) {
    size_for(ctx);
    if (rt_.value.mode_ == mode::undecided) {
      if (hello.has(protocol::holds_log_flag) && !ctx.has_state()) {
        start_recovery(ctx);
      } else {
        rt_.value.mode_ = mode::serving;
      }
    }
    const std::uint32_t w = hello.sender;
    if (rt_.value.mode_ == mode::serving && hello.has(protocol::holds_log_flag) &&
        !rt_.value.met_[w]) {
      detail = " (worker " + std::to_string(w) +
               " holds a replica log of an earlier server of this shard, which this one did "
               "not rebuild from)";
      return errc::server_lost;
    }
    rt_.value.met_[w] = 1;
    if (rt_.value.mode_ == mode::recovering && !hello.has(protocol::holds_log_flag))
      rt_.value.done_[w] = 1;
    return {};
  }
  /// A rebuilding shard asks for replicas and logs.
  template <class Ctx>
  std::uint8_t welcome_flags(Ctx, const frame_header&) const noexcept {
    return rt_.value.mode_ == mode::recovering ? protocol::rebuilding_flag : std::uint8_t{0};
  }

  /// Every message of a worker: orders pushes and clock messages, holds them until confirmed,
  /// and holds whatever the worker sends after them (a pull is answered after the worker's
  /// earlier pushes are applied); takes commits, replays and replicas. Errors (the worker's
  /// connection is refused): `errc::bad_position` for a commit, replay or replica naming a
  /// position above `protocol::max_seq`; `errc::payload_size_mismatch` for a commit or replay
  /// with a payload; `errc::unexpected_message` for a replica while not
  /// rebuilding, a replay announcing position 0; those of a push's `check_rows` (a push
  /// refused when it is applied, e.g. not finite, is counted in `stats().dropped`).
  template <class Ctx>
  std::optional<std::error_code> on_worker_message(Ctx ctx, detail::session_base& s, message& m,
                                                   std::string& detail) {
    const auto& h = m.header;
    const std::uint32_t w = s.worker;
    const bool commit = h.type == protocol::commit_type, replay = h.type == protocol::replay_type;
    const char* const name = commit ? "commit" : replay ? "replay" : "state replica";
    // Every position a worker names (a commit, a replay announcement or end, a replica's) is
    // one a server can have issued: at most protocol::max_seq, so that no counter derived
    // from it (the next position, `missing_positions`) wraps.
    if ((commit || replay || h.type == protocol::replica_type) && h.seq > protocol::max_seq) {
      detail = " (worker " + std::to_string(w) + "'s " + name + " names position " +
               std::to_string(h.seq) + "; positions lie in [0, " +
               std::to_string(protocol::max_seq) + "])";
      return make_error_code(errc::bad_position);
    }
    // A commit and a replay are header-only (recovery/replica_log/messages.hpp): the frame
    // layer bounds a policy's message only by max_frame_bytes, so their size is checked here.
    if ((commit || replay) && !m.payload.empty()) {
      detail = " (worker " + std::to_string(w) + "'s " + name + " carries " +
               std::to_string(m.payload.size()) + " payload bytes; it has none)";
      return make_error_code(errc::payload_size_mismatch);
    }
    // The policy's own messages (types above the generic ones: no `case` of the enum).
    if (h.type == protocol::commit_type) {
      if (h.has(protocol::replica_stored_flag)) {
        if (rt_.value.replica_pending_ != 0 && h.seq == rt_.value.replica_pending_ &&
            w == rt_.value.replica_holder_) {
          rt_.value.stable_ = rt_.value.replica_pending_;
          rt_.value.stats_.stable = rt_.value.stable_;
          forget_logged(rt_.value.stable_);
          rt_.value.replica_pending_ = 0;
          ++rt_.value.stats_.replicas_stored;
        }
        return std::error_code{};
      }
      confirm(w, h.seq);
      release(ctx);
      return std::error_code{};
    }
    if (h.type == protocol::replay_type) {
      if (rt_.value.mode_ == mode::recovering) return on_replay(ctx, w, h);
      if (h.has(protocol::replay_end_flag)) {  // a rejoin's end: its unconfirmed orders are void
        void_unconfirmed(ctx, w);
        // What it pushed and this server applied may have lost its ack with the connection.
        if (ctx.last_seq(w) != 0) ctx.ack(s, ctx.last_seq(w));
        release(ctx);
      }
      return std::error_code{};
    }
    if (h.type == protocol::replica_type) {
      if (rt_.value.mode_ != mode::recovering) {
        detail = " (a state replica while the shard is not rebuilding)";
        return make_error_code(errc::unexpected_message);
      }
      // Every replica a worker sends is kept (a worker holds those it was sent since it last
      // learned the stable position; one per position, a resent one replaces it): which one
      // is installed is decided when every log has arrived (see `choose_replica`).
      auto& reps = rt_.value.replicas_;
      const auto same = std::find_if(reps.begin(), reps.end(), [&](const held_replica& r) {
        return r.worker == w && r.m.header.seq == h.seq;
      });
      if (same != reps.end()) {
        same->m = message{h, std::move(m.payload)};
      } else if (std::count_if(reps.begin(), reps.end(), [&](const held_replica& r) {
                   return r.worker == w;
                 }) >= static_cast<std::ptrdiff_t>(protocol::max_held_replicas)) {
        detail = " (worker " + std::to_string(w) + " sends more than " +
                 std::to_string(protocol::max_held_replicas) + " state replicas)";
        return make_error_code(errc::unexpected_message);
      } else {
        reps.push_back(held_replica{w, message{h, std::move(m.payload)}});
      }
      return std::error_code{};
    }
    switch (h.type) {
      case message_type::push:
      case message_type::clock: {
        if (h.sender != w) return make_error_code(errc::bad_sender);
        if (h.type == message_type::push) {
          // `policy` on a push is `protocol::ack_later_flag`, under apply-first only.
          if (h.has(frame_flags::prefixed) ||
              (h.has(frame_flags::policy) &&
               options.ordering != replica_log_ordering::apply_first)) {
            detail = " (a push flagged `policy` or `prefixed`, but recovery policy "
                     "'replica-log' takes neither here: `policy` means ack-later, under "
                     "apply-first only)";
            return make_error_code(errc::unexpected_message);
          }
          // Its values are checked finite when it is applied (`shard_core::check_and_apply`,
          // one pass fused with the apply): a push refused then has used its position and
          // is counted in `stats().dropped`, and a rebuild replaying it refuses it alike.
          if (auto ec = ctx.check_rows(m, detail)) return ec;
        }
        // `protocol::ack_later_flag` is this part's: taken off here, in every mode (the
        // server's push path reads `policy` on a push as a recovery policy's own push; a
        // rejoining worker resends its entries with it), remembered by seq for on_applied.
        const bool later = h.has(protocol::ack_later_flag) && options.holds_acks();
        m.header.flags &= static_cast<std::uint8_t>(~protocol::ack_later_flag);
        if (rt_.value.mode_ == mode::recovering) {
          if (rt_.value.expect_[w] != 0) {  // the entry a replay announced
            rt_.value.entries_.push_back(entry{rt_.value.expect_[w], w, std::move(m)});
            rt_.value.expect_[w] = 0;
          } else {
            hold(ctx, &s, w, std::move(m), false);
          }
          return std::error_code{};
        }
        if (h.seq <= ctx.last_seq(w)) {  // applied before (e.g. held by the replica)
          // The worker waits for its ack (its order, if any, was lost): acknowledge it.
          if (h.has(frame_flags::want_ack)) ctx.ack(s, ctx.last_seq(w));
          return std::error_code{};
        }
        const bool clock_end = h.ends_clock();
        if (later && clock_end) rt_.value.later_seq_[w] = m.header.seq;
        hold(ctx, &s, w, std::move(m), true);
        if (options.ordering == replica_log_ordering::apply_first) {
          release(ctx);  // applied now; its clock's last message sends the orders (on_applied)
          if (clock_end && !later) {
            flush_orders(ctx, w);  // e.g. when that message was refused
          } else if (clock_end && !ctx.timer_armed(ack_timer)) {
            ctx.arm_timer(ack_timer, options.ack_delay);  // the orders go within ack_delay
          }
        } else if (clock_end) {
          flush_orders(ctx, w);  // one order for the clock's messages, one commit back
        }
        return std::error_code{};
      }
      default:
        if (rt_.value.mode_ != mode::recovering && rt_.value.held_.empty())
          return std::nullopt;  // nothing waits
        flush_orders(ctx, w);   // it waits behind the worker's ordered messages: confirm them
        hold(ctx, &s, w, std::move(m), false);
        return std::error_code{};
    }
  }

  /// One ack per worker clock: a push that does not end its clock is not acknowledged (the
  /// worker's acks are cumulative: the clock's last message acknowledges it); the clock's last
  /// push is acknowledged by the server, a clock message here. Apply-first: the clock's
  /// orders ride on that ack (`protocol::carries_order_flag`), so the worker logs the
  /// positions as it sees them acknowledged, and one message goes back per clock; under VAP,
  /// whose server acknowledges a clock once it is visible, the order goes alone, first.
  template <class Ctx>
  bool on_applied(Ctx ctx, detail::session_base& s, const message& m) {
    const auto& h = m.header;
    const bool clock_end = h.ends_clock();
    if (clock_end && options.ordering == replica_log_ordering::apply_first) {
      if (h.has(frame_flags::want_ack) && !Ctx::value_bounded) {
        if (s.worker < rt_.value.later_seq_.size() && h.seq != 0 &&
            rt_.value.later_seq_[s.worker] == h.seq) {
          owe_ack(ctx, s, h.seq);  // flagged ack-later: the ack (and the orders) may wait
          return true;
        }
        ack_now(ctx, s, h.seq);
        return true;
      }
      flush_orders(ctx, s.worker);
    }
    if (!h.has(frame_flags::want_ack)) return false;
    if (!clock_end) return true;
    if (h.type == message_type::clock) ctx.ack(s, h.seq);
    return false;
  }

  /// A worker's connection ended: what it ordered stays (its entries are applied without it),
  /// the rest it sent is dropped; a replica it had not stored yet is sent again later.
  template <class Ctx>
  void on_session_closed(Ctx ctx, detail::session_base& s) {
    if (!s.is_worker()) return;
    // Orders not sent yet for this connection's messages are dropped: the worker resends
    // those messages without a position (write-ahead: they are voided; apply-first: applied
    // already, the resend is acknowledged and dropped).
    if (s.worker < rt_.value.pending_.size() && rt_.value.pending_from_[s.worker] == &s) {
      rt_.value.pending_[s.worker].clear();
      rt_.value.pending_from_[s.worker] = nullptr;
    }
    if (s.worker < rt_.value.owed_.size() && rt_.value.owed_[s.worker].session == &s)
      rt_.value.owed_[s.worker] = owed_ack{};
    bool waits = false;
    for (std::size_t i = 0; i < rt_.value.held_.size(); ++i) {
      auto& it = rt_.value.held_[i];
      if (it.session != &s) continue;
      it.session = nullptr;
      waits = waits || (it.position != 0 && !it.confirmed);
    }
    if (rt_.value.replica_pending_ != 0 && rt_.value.replica_holder_ == s.worker)
      rt_.value.replica_pending_ = 0;
    if (waits) watch(ctx);
    release(ctx);
  }

  /// The watch's tick (timer `watch_timer`, every `watch_tick` while a rebuild waits for the
  /// workers, a closed connection's orders wait for confirmation, or an unconfirmed order
  /// keeps later updates waiting): finishes the rebuild after `recovery_timeout`, voids the
  /// orphaned orders after `void_timeout`, acts on an order unconfirmed for `commit_timeout`.
  template <class Ctx>
  void on_timer(Ctx ctx, std::uint32_t timer);

 private:
  enum class mode : std::uint8_t { undecided, recovering, serving };

  // A message held until it may be dispatched: ordered ones (position > 0) once confirmed,
  // every other one once everything before it is dispatched.
  struct held {
    std::uint32_t worker = 0;
    detail::session_base* session = nullptr;  // null once its connection closed
    message m;
    std::uint64_t position = 0;
    bool confirmed = false;
  };
  // A logged entry a rebuild replays.
  struct entry {
    std::uint64_t position = 0;
    std::uint32_t worker = 0;
    message m;
  };
  // A state replica a worker sent a rebuild (header `seq`: its position).
  struct held_replica {
    std::uint32_t worker = 0;
    message m;
  };

  template <class Ctx>
  void size_for(Ctx ctx) {
    const std::uint32_t n = ctx.options().num_workers;
    if (rt_.value.met_.size() == n) return;
    rt_.value.met_.assign(n, 0);
    rt_.value.done_.assign(n, 0);
    rt_.value.expect_.assign(n, 0);
    rt_.value.replicas_.clear();
    rt_.value.logged_bytes_.assign(n, 0);
    rt_.value.pending_.clear();
    rt_.value.pending_.resize(n);
    rt_.value.sent_.assign(n, 0);
    rt_.value.pending_from_.assign(n, nullptr);
    rt_.value.owed_.assign(n, owed_ack{});
    rt_.value.later_seq_.assign(n, 0);
  }

  // ---- ordering and the write-ahead release (defined in server_part_order.ipp) ----

  // Holds `m`; an ordered one gets the next position, kept for its worker's next `order`
  // (flush_orders, at the end of the worker's clock).
  template <class Ctx>
  void hold(Ctx ctx, detail::session_base* s, std::uint32_t w, message m, bool order);

  // A held or replayed message `m` of worker `w` at position `position` (0: not ordered) was
  // refused with `ec` when dispatched: counted in stats().dropped, logged rate-limited.
  template <class Ctx>
  void count_drop(Ctx ctx, const char* what, std::uint32_t w, std::uint64_t position,
                  const message& m, std::error_code ec);

  // Sends worker `w` the orders not sent yet, as one `order` (nothing when there are none);
  // with `ack_seq` != 0 (apply-first), on the ack of that seq (`protocol::encode_on_ack`).
  // Whether a message went out.
  template <class Ctx>
  bool flush_orders(Ctx ctx, std::uint32_t w, std::uint64_t ack_seq = 0);

  // Apply-first: acknowledges `seq` on `s` now, with the orders not sent yet (and any ack
  // held back for the worker, which this one covers: acks are cumulative).
  template <class Ctx>
  void ack_now(Ctx ctx, detail::session_base& s, std::uint64_t seq);
  // Apply-first with ack_delay: holds back the ack of `seq` (flagged ack-later) on `s`; sent by
  // ack_now, when max_unacked / 2 of the worker's positions wait, or by timer `ack_timer`.
  template <class Ctx>
  void owe_ack(Ctx ctx, detail::session_base& s, std::uint64_t seq);
  // Timer `ack_timer`: sends every ack held back.
  template <class Ctx>
  void send_owed_acks(Ctx ctx);

  // Worker `w` logged every position up to `p` it was sent (a cumulative commit).
  void confirm(std::uint32_t w, std::uint64_t p);

  // Dispatches held messages from the front while they may go: in position order, each
  // ordered one only once its worker logged it (the write-ahead rule: no update is applied
  // before its position is in its worker's log).
  template <class Ctx>
  void release(Ctx ctx);

  // After a rebuild that was not exact, worker `w`'s next update may be for a later clock
  // than the rebuilt shard has for it (its updates in between are lost, counted): its clock
  // moves up first. An exact rebuild never needs it.
  template <class Ctx>
  void catch_up(Ctx ctx, std::uint32_t w, const message& m);

  // Every `replica_interval` server clocks, or once a worker's log outgrows `log_budget`,
  // the whole state goes to the next worker.
  template <class Ctx>
  void maybe_replicate(Ctx ctx);

  // `log_budget`: whether some worker's pushes ordered above the stable position hold more
  // than `log_budget` encoded shard states.
  template <class Ctx>
  bool over_budget(Ctx ctx);

  // `log_budget`: positions up to `stable` are in a stored replica; the workers drop them.
  void forget_logged(std::uint64_t stable);

  // Drops worker `w`'s ordered messages it never confirmed (it did not log their positions,
  // and resends them), and anything else of it held from a closed connection; with
  // `orphans_only`, only what it sent on connections that closed.
  template <class Ctx>
  void void_unconfirmed(Ctx, std::uint32_t w, bool orphans_only = false);

  // The held message every later one waits behind: the front, when it is ordered and its
  // worker has not confirmed it (write-ahead). Null when nothing waits.
  const held* blocking() const noexcept;

  // `commit_timeout`: the blocking message waited that long. Sends its clock's order early,
  // closes its worker's connection, or voids the orders of its worker's closed connection.
  template <class Ctx>
  void commit_timed_out(Ctx ctx);

  // ---- rebuilding (defined in server_part_rebuild.ipp) ----

  template <class Ctx>
  void start_recovery(Ctx ctx);

  template <class Ctx>
  std::optional<std::error_code> on_replay(Ctx ctx, std::uint32_t w, const frame_header& h);

  // Whether the logged entries (sorted by position) hold every position in (lo, hi].
  bool logs_cover(std::uint64_t lo, std::uint64_t hi) const noexcept;

  // The order in which the workers' replicas are tried (indices into replicas_): first the
  // ones the logs back, newest first: at or above the newest stable position any worker
  // reported, with every position between it and theirs logged (a replica above the stable
  // position holds updates the dead server applied, each logged by its worker before it was
  // applied and not yet truncated). Then the ones at or below the newest stable position,
  // newest first (the rebuild is then not exact). A replica above the stable position with a
  // position no log holds is never installed: it claims updates nobody logged (a forged
  // replica, or one whose gaps were voided orders: the rebuild then starts lower).
  std::vector<std::uint32_t> choose_replica() const;

  // Installs the newest replica the logs back (or the initial state) and applies every logged
  // entry after it in position order; then serves what was held meanwhile.
  template <class Ctx>
  void finish_recovery(Ctx ctx, bool timed_out);

  // Starts the watch (`on_timer`) unless it runs: it ticks while a rebuild waits for the
  // workers or a closed connection's orders wait for confirmation.
  template <class Ctx>
  void watch(Ctx ctx);
  static constexpr std::uint32_t watch_timer = 0;  // the part's timers (ctx.arm_timer)
  static constexpr std::uint32_t ack_timer = 1;
  // An ack held back for a worker (ack_delay): its connection and the seq; none when null.
  struct owed_ack {
    detail::session_base* session = nullptr;
    std::uint64_t seq = 0;
  };
  static constexpr std::chrono::milliseconds watch_tick{50};
  bool has_orphans() const noexcept;

  // Run-time state: a configured part copied into several servers starts fresh in each.
  struct runtime {
    mode mode_ = mode::undecided;
    std::uint64_t next_ = 1;      // the next position to give
    std::uint64_t position_ = 0;  // the last position applied
    std::uint64_t stable_ = 0;    // newest replica stored by a worker
    std::uint64_t replica_pending_ = 0;
    std::uint32_t replica_holder_ = 0;
    std::uint32_t holder_next_ = 0;
    clock_value replica_clock_ = 0;
    bool releasing_ = false;
    bool watching_ = false;
    std::chrono::milliseconds recovering_for_{0}, orphaned_for_{0};  // the watch's ticks
    std::uint64_t blocked_position_ = 0;        // the blocking message's position, seen last tick
    std::chrono::milliseconds blocked_for_{0};  // ... and for how many ticks
    detail::ring<held> held_;
    std::vector<char> met_, done_;
    std::vector<std::uint64_t> expect_;
    // Per worker: the orders not sent yet (flush_orders), the connection their messages came
    // on, and the newest position sent.
    std::vector<std::vector<protocol::order_entry>> pending_;
    std::vector<std::uint64_t> sent_;
    std::vector<const detail::session_base*> pending_from_;  // the connection they came on
    std::vector<owed_ack> owed_;            // per worker: the ack held back (ack_delay)
    std::vector<std::uint64_t> later_seq_;  // per worker: its last clock end flagged ack-later
    std::vector<entry> entries_;
    std::vector<held_replica> replicas_;  // the replicas the workers sent (rebuilding)
    std::uint64_t newest_stable_ = 0;
    std::uint64_t unordered_ = 0;  // a rebuild: entries the workers resend without a position
    // log_budget: the positions ordered above stable_ (oldest first) with their worker and
    // payload bytes, their sum per worker, and the bytes of one encoded shard state.
    struct logged {
      std::uint64_t position = 0;
      std::uint32_t worker = 0;
      std::uint64_t bytes = 0;
    };
    detail::ring<logged> logged_;
    std::vector<std::uint64_t> logged_bytes_;
    std::uint64_t state_bytes_ = 0;
    shard_state initial_{}, scratch_{};
    std::chrono::steady_clock::time_point recovery_started_{};
    replica_log_stats stats_{};
  };
  detail::fresh_on_copy<runtime> rt_;
};

}  // namespace asyncps::recovery

#include "asyncps/recovery/replica_log/server_part_order.ipp"
#include "asyncps/recovery/replica_log/server_part_rebuild.ipp"
