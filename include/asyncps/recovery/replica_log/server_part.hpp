// asyncps — recovery::replica_log (SWIFT), server part: orders every update, applies it only
// once its worker has logged the order, sends state replicas to the workers, and rebuilds a
// restarted shard from the newest replica plus the workers' logs replayed in the original
// order. See recovery/replica_log.hpp and docs/recovery/swift.md.
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

#include <asio/awaitable.hpp>

#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/log_limiter.hpp"
#include "asyncps/detail/ring.hpp"
#include "asyncps/detail/server_hooks.hpp"
#include "asyncps/detail/shard_state_codec.hpp"
#include "asyncps/error.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery/replica_log/options.hpp"
#include "asyncps/shard_state.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::recovery {

/// Counters of a `replica_log` server part (`basic_server::recovery().stats()`, read on the
/// server's executor).
struct replica_log_stats {
  std::uint64_t ordered = 0;          ///< push and clock messages given an apply position
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
  std::uint64_t voided = 0;  ///< ordered, never confirmed, dropped (see `void_timeout`)
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
    f("replicas_sent", replicas_sent);
    f("replicas_stored", replicas_stored);
    f("replica_bytes", replica_bytes);
    f("recoveries", recoveries);
    f("replayed", replayed);
    f("missing_positions", missing_positions);
    f("incomplete_recoveries", incomplete_recoveries);
    f("voided", voided);
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

  /// The first hello decides: a worker that holds a log for this shard (hello flag `state`)
  /// meets a shard without state, so the shard restarted and rebuilds before serving.
  /// A later hello with a log from a worker this server never met, once it serves, is
  /// refused (`errc::server_lost`): its log belongs to a server this one did not rebuild.
  template <class Ctx>
  std::error_code on_hello(Ctx ctx, const frame_header& hello, std::string& detail) {
    size_for(ctx);
    if (rt_.value.mode_ == mode::undecided) {
      if (hello.has(frame_flags::state) && !ctx.has_state()) {
        start_recovery(ctx);
      } else {
        rt_.value.mode_ = mode::serving;
      }
    }
    const std::uint32_t w = hello.sender;
    if (rt_.value.mode_ == mode::serving && hello.has(frame_flags::state) && !rt_.value.met_[w]) {
      detail = " (worker " + std::to_string(w) +
               " holds a replica log of an earlier server of this shard, which this one did "
               "not rebuild from)";
      return errc::server_lost;
    }
    rt_.value.met_[w] = 1;
    if (rt_.value.mode_ == mode::recovering && !hello.has(frame_flags::state))
      rt_.value.done_[w] = 1;
    return {};
  }
  /// A rebuilding shard asks for replicas and logs.
  template <class Ctx>
  std::uint8_t welcome_flags(Ctx, const frame_header&) const noexcept {
    return rt_.value.mode_ == mode::recovering ? frame_flags::state : std::uint8_t{0};
  }

  /// Every message of a worker: orders pushes and clock messages, holds them until confirmed,
  /// and holds whatever the worker sends after them (a pull is answered after the worker's
  /// earlier pushes are applied); takes commits, replays and replicas. Errors (the worker's
  /// connection is refused): `errc::bad_position` for a commit, replay or replica naming a
  /// position above `protocol::max_seq`; `errc::unexpected_message` for a replica while not
  /// rebuilding, a replay announcing position 0; those of a push (`check_rows`, finiteness).
  template <class Ctx>
  std::optional<std::error_code> on_worker_message(Ctx ctx, detail::session_base& s, message& m,
                                                   std::string& detail) {
    const auto& h = m.header;
    const std::uint32_t w = s.worker;
    // Every position a worker names (a commit, a replay announcement or end, a replica's) is
    // one a server can have issued: at most protocol::max_seq, so that no counter derived
    // from it (the next position, `missing_positions`) wraps.
    if ((h.type == message_type::commit || h.type == message_type::replay ||
         h.type == message_type::state) &&
        h.seq > protocol::max_seq) {
      detail = " (worker " + std::to_string(w) + "'s " +
               (h.type == message_type::commit   ? "commit"
                : h.type == message_type::replay ? "replay"
                                                 : "state replica") +
               " names position " + std::to_string(h.seq) + "; positions lie in [0, " +
               std::to_string(protocol::max_seq) + "])";
      return make_error_code(errc::bad_position);
    }
    switch (h.type) {
      case message_type::commit:
        if (h.has(frame_flags::state)) {
          if (rt_.value.replica_pending_ != 0 && h.seq == rt_.value.replica_pending_ &&
              w == rt_.value.replica_holder_) {
            rt_.value.stable_ = rt_.value.replica_pending_;
            rt_.value.stats_.stable = rt_.value.stable_;
            rt_.value.replica_pending_ = 0;
            ++rt_.value.stats_.replicas_stored;
          }
          return std::error_code{};
        }
        confirm(w, h.seq);
        release(ctx);
        return std::error_code{};
      case message_type::replay:
        if (rt_.value.mode_ == mode::recovering) return on_replay(ctx, w, h);
        if (h.has(frame_flags::state)) {  // a rejoin's end: its unconfirmed orders are void
          void_unconfirmed(ctx, w);
          // What it pushed and this server applied may have lost its ack with the connection.
          if (ctx.last_seq(w) != 0) ctx.ack(s, ctx.last_seq(w));
          release(ctx);
        }
        return std::error_code{};
      case message_type::state:
        if (rt_.value.mode_ != mode::recovering) {
          detail = " (a state replica while the shard is not rebuilding)";
          return make_error_code(errc::unexpected_message);
        }
        // Each worker's newest replica is kept (one per worker): which one is installed is
        // decided when every log has arrived (see `choose_replica`).
        rt_.value.replicas_[w] = message{h, std::move(m.payload)};
        return std::error_code{};
      case message_type::push:
      case message_type::clock: {
        if (h.sender != w) return make_error_code(errc::bad_sender);
        if (h.type == message_type::push) {
          if (h.has(frame_flags::state) || h.has(frame_flags::backlog)) {
            detail = " (replica or backlog push, but recovery policy 'replica-log' does not "
                     "take them)";
            return make_error_code(errc::unexpected_message);
          }
          if (auto ec = ctx.check_rows(m, detail)) return ec;
          if (!ctx.all_finite(payload_floats(m))) return make_error_code(errc::non_finite_value);
        }
        if (rt_.value.mode_ == mode::recovering) {
          if (rt_.value.expect_[w] != 0) {  // the entry a replay announced
            rt_.value.entries_.push_back(entry{rt_.value.expect_[w], w, std::move(m)});
            rt_.value.expect_[w] = 0;
          } else {
            hold(ctx, &s, w, std::move(m), false);
          }
          return std::error_code{};
        }
        if (h.seq <= ctx.last_seq(w)) return std::error_code{};  // applied before
        hold(ctx, &s, w, std::move(m), true);
        return std::error_code{};
      }
      default:
        if (rt_.value.mode_ != mode::recovering && rt_.value.held_.empty())
          return std::nullopt;  // nothing waits
        hold(ctx, &s, w, std::move(m), false);
        return std::error_code{};
    }
  }

  /// Clock messages are acknowledged here (pushes by the server).
  template <class Ctx>
  bool on_applied(Ctx ctx, detail::session_base& s, const message& m) {
    if (m.header.type == message_type::clock && m.header.has(frame_flags::want_ack))
      ctx.ack(s, m.header.seq);
    return false;
  }

  /// A worker's connection ended: what it ordered stays (its entries are applied without it),
  /// the rest it sent is dropped; a replica it had not stored yet is sent again later.
  template <class Ctx>
  void on_session_closed(Ctx ctx, detail::session_base& s) {
    if (!s.is_worker()) return;
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

  template <class Ctx>
  void size_for(Ctx ctx) {
    const std::uint32_t n = ctx.options().num_workers;
    if (rt_.value.met_.size() == n) return;
    rt_.value.met_.assign(n, 0);
    rt_.value.done_.assign(n, 0);
    rt_.value.expect_.assign(n, 0);
    rt_.value.replicas_.clear();
    rt_.value.replicas_.resize(n);
  }

  // Holds `m`; an ordered one gets the next position and its worker the order.
  template <class Ctx>
  void hold(Ctx ctx, detail::session_base* s, std::uint32_t w, message m, bool order) {
    held it{w, s, std::move(m), 0, false};
    if (order) {
      it.position = rt_.value.next_++;
      ++rt_.value.stats_.ordered;
      ctx.send_worker(w, protocol::encode(protocol::order{.shard = ctx.options().shard,
                                                          .seq = it.m.header.seq,
                                                          .position = it.position,
                                                          .stable = rt_.value.stable_},
                                          [&](std::size_t n) { return ctx.allocate(n); }));
    }
    rt_.value.held_.push_back(std::move(it));
    rt_.value.stats_.max_held =
        std::max<std::uint64_t>(rt_.value.stats_.max_held, rt_.value.held_.size());
  }

  // A held or replayed message `m` of worker `w` at position `position` (0: not ordered) was
  // refused with `ec` when dispatched: counted in stats().dropped, logged rate-limited.
  template <class Ctx>
  void count_drop(Ctx ctx, const char* what, std::uint32_t w, std::uint64_t position,
                  const message& m, std::error_code ec) {
    ++rt_.value.stats_.dropped;
    (void)ctx.log_limited(detail::log_kind::dropped_message,
                          std::string("dropped a ") + what + " message of worker " +
                              std::to_string(w) + " (type " +
                              std::to_string(static_cast<int>(m.header.type)) + ", clock " +
                              std::to_string(m.header.clock) + ", position " +
                              std::to_string(position) + "): " + ec.message() + " (" +
                              std::to_string(rt_.value.stats_.dropped) + " dropped so far)");
  }

  // Worker `w` logged position `p`.
  void confirm(std::uint32_t w, std::uint64_t p) {
    for (std::size_t i = 0; i < rt_.value.held_.size(); ++i) {
      auto& it = rt_.value.held_[i];
      if (it.position == p) {
        if (it.worker == w) it.confirmed = true;
        return;
      }
      if (it.position > p) return;
    }
  }

  // Dispatches held messages from the front while they may go: in position order, each
  // ordered one only once its worker logged it (the write-ahead rule: no update is applied
  // before its position is in its worker's log).
  template <class Ctx>
  void release(Ctx ctx) {
    if (rt_.value.releasing_) return;  // dispatching may close a session, which releases again
    rt_.value.releasing_ = true;
    while (!rt_.value.held_.empty()) {
      auto& f = rt_.value.held_.front();
      if (f.position != 0 && !f.confirmed) break;
      held it = std::move(f);
      rt_.value.held_.pop_front();
      if (it.position != 0) {
        rt_.value.position_ = it.position;
        rt_.value.stats_.position = rt_.value.position_;
        catch_up(ctx, it.worker, it.m);
        if (auto ec = ctx.dispatch_of(it.worker, it.m))
          count_drop(ctx, "held", it.worker, it.position, it.m, ec);
      } else if (it.session != nullptr && it.session->open) {
        if (auto ec = ctx.dispatch(*it.session, it.m))
          count_drop(ctx, "held", it.worker, 0, it.m, ec);
      }
    }
    rt_.value.releasing_ = false;
    maybe_replicate(ctx);
  }

  // After a rebuild that was not exact, worker `w`'s next update may be for a later clock
  // than the rebuilt shard has for it (its updates in between are lost, counted): its clock
  // moves up first. An exact rebuild never needs it.
  template <class Ctx>
  void catch_up(Ctx ctx, std::uint32_t w, const message& m) {
    if (m.header.clock <= ctx.worker_clock(w)) return;
    rt_.value.stats_.skipped_clocks +=
        static_cast<std::uint64_t>(m.header.clock - ctx.worker_clock(w));
    ctx.advance(w, m.header.clock);
  }

  // Every `replica_interval` server clocks, the whole state goes to the next worker.
  template <class Ctx>
  void maybe_replicate(Ctx ctx) {
    if (rt_.value.mode_ != mode::serving || rt_.value.replica_pending_ != 0 ||
        rt_.value.position_ <= rt_.value.stable_ ||
        ctx.clock() < rt_.value.replica_clock_ + std::max<clock_value>(options.replica_interval, 1))
      return;
    const std::uint32_t n = ctx.options().num_workers;
    for (std::uint32_t i = 0; i < n; ++i) {
      const std::uint32_t w = (rt_.value.holder_next_ + i) % n;
      if (!ctx.worker_connected(w)) continue;
      rt_.value.holder_next_ = w + 1;
      ctx.save_state(rt_.value.scratch_);
      buffer b = ctx.allocate(detail::encoded_state_size(rt_.value.scratch_));
      detail::encode_state(rt_.value.scratch_, std::span<std::byte>(b.data(), b.size()));
      message m;
      m.header.type = message_type::state;
      m.header.sender = ctx.options().shard;
      m.header.clock = ctx.clock();
      m.header.seq = rt_.value.position_;
      rt_.value.stats_.replica_bytes = b.size();
      m.payload = std::move(b);
      ctx.send_worker(w, std::move(m));
      rt_.value.replica_pending_ = rt_.value.position_;
      rt_.value.replica_holder_ = w;
      rt_.value.replica_clock_ = ctx.clock();
      ++rt_.value.stats_.replicas_sent;
      return;
    }
  }

  // Drops worker `w`'s ordered messages it never confirmed (it did not log their positions,
  // and resends them), and anything else of it held from a closed connection.
  template <class Ctx>
  void void_unconfirmed(Ctx, std::uint32_t w) {
    detail::ring<held> keep;
    while (!rt_.value.held_.empty()) {
      held it = std::move(rt_.value.held_.front());
      rt_.value.held_.pop_front();
      const bool stale = it.worker == w && ((it.position != 0 && !it.confirmed) ||
                                            (it.position == 0 && it.session == nullptr));
      if (stale) {
        if (it.position != 0) ++rt_.value.stats_.voided;
        continue;
      }
      keep.push_back(std::move(it));
    }
    rt_.value.held_ = std::move(keep);
  }

  // ---- rebuilding ----

  template <class Ctx>
  void start_recovery(Ctx ctx) {
    rt_.value.mode_ = mode::recovering;
    ++rt_.value.stats_.recoveries;
    ctx.save_state(rt_.value.initial_);  // position 0: the seeded initial state
    ctx.log("rebuilding from the workers' replicas and logs (replica-log)");
    rt_.value.recovery_started_ = std::chrono::steady_clock::now();
    watch(ctx);
  }

  template <class Ctx>
  std::optional<std::error_code> on_replay(Ctx ctx, std::uint32_t w, const frame_header& h) {
    if (!h.has(frame_flags::state)) {
      if (h.seq == 0) return make_error_code(errc::unexpected_message);  // 0: no position
      rt_.value.expect_[w] = h.seq;  // the next push or clock message is the entry of position seq
      return std::error_code{};
    }
    rt_.value.done_[w] = 1;
    rt_.value.newest_stable_ = std::max(rt_.value.newest_stable_, h.seq);
    if (std::all_of(rt_.value.done_.begin(), rt_.value.done_.end(), [](char c) { return c != 0; }))
      finish_recovery(ctx, false);
    return std::error_code{};
  }

  // Whether the logged entries (sorted by position) hold every position in (lo, hi].
  bool logs_cover(std::uint64_t lo, std::uint64_t hi) const noexcept {
    if (hi <= lo) return true;
    std::uint64_t next = lo + 1;  // the next position to find
    for (const auto& e : rt_.value.entries_) {
      if (e.position < next) continue;
      if (e.position != next) return false;
      if (next == hi) return true;
      ++next;
    }
    return false;
  }

  // The order in which the workers' replicas are tried (indices into replicas_): first the
  // ones the logs back, newest first: at or above the newest stable position any worker
  // reported, with every position between it and theirs logged (a replica above the stable
  // position holds updates the dead server applied, each logged by its worker before it was
  // applied and not yet truncated). Then the ones at or below the newest stable position,
  // newest first (the rebuild is then not exact). A replica above the stable position with a
  // position no log holds is never installed: it claims updates nobody logged (a forged
  // replica, or one whose gaps were voided orders: the rebuild then starts lower).
  std::vector<std::uint32_t> choose_replica() const {
    const std::uint64_t stable = rt_.value.newest_stable_;
    std::vector<std::uint32_t> backed, older;
    for (std::uint32_t w = 0; w < rt_.value.replicas_.size(); ++w) {
      const auto& r = rt_.value.replicas_[w];
      if (!r) continue;
      const std::uint64_t p = r->header.seq;
      if (p >= stable && logs_cover(stable, p))
        backed.push_back(w);
      else if (p <= stable)
        older.push_back(w);
    }
    const auto newest_first = [this](std::uint32_t a, std::uint32_t b) {
      return rt_.value.replicas_[a]->header.seq > rt_.value.replicas_[b]->header.seq;
    };
    std::stable_sort(backed.begin(), backed.end(), newest_first);
    std::stable_sort(older.begin(), older.end(), newest_first);
    backed.insert(backed.end(), older.begin(), older.end());
    return backed;
  }

  // Installs the newest replica the logs back (or the initial state) and applies every logged
  // entry after it in position order; then serves what was held meanwhile.
  template <class Ctx>
  void finish_recovery(Ctx ctx, bool timed_out) {
    std::uint64_t base = 0;
    std::string why;
    bool installed = false;
    std::sort(rt_.value.entries_.begin(), rt_.value.entries_.end(),
              [](const entry& a, const entry& b) { return a.position < b.position; });
    std::uint32_t skipped = 0;  // replicas present but never tried (not backed by the logs)
    for (const auto& r : rt_.value.replicas_) skipped += r ? 1 : 0;
    for (const std::uint32_t w : choose_replica()) {
      --skipped;
      const message& r = *rt_.value.replicas_[w];
      why.clear();
      if (auto ec = detail::decode_state(r.payload.bytes(), rt_.value.scratch_, why)) {
        ctx.log("the state replica of position " + std::to_string(r.header.seq) + " from worker " +
                std::to_string(w) + " is invalid" + why);
      } else if (auto ec2 = ctx.restore_state(rt_.value.scratch_)) {
        ctx.log("the state replica of position " + std::to_string(r.header.seq) + " from worker " +
                std::to_string(w) + " cannot be installed (" + ec2.message() + ")");
      } else {
        base = r.header.seq;
        installed = true;
        break;
      }
    }
    if (skipped != 0)
      ctx.log(std::to_string(skipped) + " state replica(s) above the newest stable position " +
              std::to_string(rt_.value.newest_stable_) +
              " claim positions no worker logged: not installed");
    if (!installed) (void)ctx.restore_state(rt_.value.initial_);
    if (on_replayed) on_replayed(base);
    // Every position is at most protocol::max_seq = 2^62 (checked as it arrived), so neither
    // `expected` nor `missing` (at most the highest position) can wrap.
    std::uint64_t expected = base + 1;
    std::uint64_t missing = 0;
    for (auto& e : rt_.value.entries_) {
      if (e.position < expected) continue;  // in the replica, or a duplicate
      missing += e.position - expected;
      catch_up(ctx, e.worker, e.m);
      if (auto ec = ctx.dispatch_of(e.worker, e.m))
        count_drop(ctx, "replayed", e.worker, e.position, e.m, ec);
      ++rt_.value.stats_.replayed;
      expected = e.position + 1;
      rt_.value.position_ = e.position;
      if (on_replayed) on_replayed(e.position);
    }
    rt_.value.position_ = std::max(rt_.value.position_, base);
    if (rt_.value.newest_stable_ > base)
      missing += rt_.value.newest_stable_ - base;  // truncated from the logs
    rt_.value.stats_.missing_positions += missing;
    // Every worker's log arrived and the newest stable replica was installed: every position
    // the dead server applied was committed, hence logged, hence replayed. A position without
    // an entry then had its order lost on the way (the server could apply nothing after it):
    // not applied, and its push is resent. A replica above the newest stable position is
    // installed only when the logs hold every position up to it (choose_replica): exactness
    // is never taken on a replica's word.
    const bool exact = !timed_out && rt_.value.newest_stable_ <= base &&
                       (!installed || logs_cover(rt_.value.newest_stable_, base));
    if (!exact) ++rt_.value.stats_.incomplete_recoveries;
    rt_.value.stable_ = base;
    rt_.value.stats_.stable = rt_.value.stable_;
    rt_.value.stats_.position = rt_.value.position_;
    rt_.value.next_ =
        std::max({rt_.value.next_, rt_.value.position_ + 1, rt_.value.newest_stable_ + 1});
    rt_.value.stats_.last_recovery_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                      rt_.value.recovery_started_)
            .count();
    std::string missing_workers;
    for (std::uint32_t w = 0; w < rt_.value.done_.size(); ++w)
      if (!rt_.value.done_[w])
        missing_workers += (missing_workers.empty() ? "" : ", ") + std::to_string(w);
    ctx.log(
        "rebuilt from " +
        (installed ? "the replica of position " + std::to_string(base)
                   : std::string("the initial state")) +
        " and " + std::to_string(rt_.value.stats_.replayed) + " logged entries to position " +
        std::to_string(rt_.value.position_) +
        (exact ? " (exact" + (missing == 0 ? std::string(")")
                                           : "; " + std::to_string(missing) +
                                                 " positions whose orders were lost: not applied, "
                                                 "resent)")
               : " (NOT exact: " + std::to_string(missing) + " positions missing" +
                     (missing_workers.empty() ? std::string()
                                              : ", no log from worker(s) " + missing_workers) +
                     ")"));
    rt_.value.entries_.clear();
    for (auto& r : rt_.value.replicas_) r.reset();
    rt_.value.mode_ = mode::serving;
    if (on_rebuilt) on_rebuilt();
    rt_.value.replica_clock_ = ctx.clock();
    // What the workers sent meanwhile arrives now, in its order: pushes get positions.
    detail::ring<held> waiting = std::move(rt_.value.held_);
    rt_.value.held_ = detail::ring<held>{};
    while (!waiting.empty()) {
      held it = std::move(waiting.front());
      waiting.pop_front();
      const auto t = it.m.header.type;
      if ((t == message_type::push || t == message_type::clock) &&
          it.m.header.seq > ctx.last_seq(it.worker))
        hold(ctx, it.session, it.worker, std::move(it.m), true);
      else if (t != message_type::push && t != message_type::clock)
        rt_.value.held_.push_back(std::move(it));
    }
    release(ctx);
  }

  // Ticks while a rebuild waits for the workers or a closed connection's orders wait for
  // confirmation: finishes the rebuild at `recovery_timeout`, voids at `void_timeout`.
  template <class Ctx>
  void watch(Ctx ctx) {
    if (rt_.value.watching_) return;
    rt_.value.watching_ = true;
    ctx.spawn(watch_loop(ctx));
  }
  template <class Ctx>
  asio::awaitable<void> watch_loop(Ctx ctx) {
    typename Ctx::timer_type timer(ctx.executor());
    const auto tick = std::chrono::milliseconds(50);
    std::chrono::milliseconds recovering_for{0}, orphaned_for{0};
    while (!ctx.stopped()) {
      const bool orphans = has_orphans();
      if (rt_.value.mode_ != mode::recovering && !orphans) break;
      timer.expires_after(tick);
      co_await timer.async_wait(detail::use_tuple);
      if (ctx.stopped()) break;
      if (rt_.value.mode_ == mode::recovering) {
        recovering_for += tick;
        if (recovering_for >= options.recovery_timeout) finish_recovery(ctx, true);
      }
      if (has_orphans()) {
        orphaned_for += tick;
        if (orphaned_for >= options.void_timeout) {
          for (std::uint32_t w = 0; w < rt_.value.met_.size(); ++w)
            if (!ctx.worker_connected(w)) void_unconfirmed(ctx, w);
          ctx.log("dropped the unconfirmed updates of disconnected workers after " +
                  std::to_string(options.void_timeout.count()) + " ms");
          release(ctx);
          orphaned_for = std::chrono::milliseconds{0};
        }
      } else {
        orphaned_for = std::chrono::milliseconds{0};
      }
    }
    rt_.value.watching_ = false;
  }
  bool has_orphans() const noexcept {
    for (std::size_t i = 0; i < rt_.value.held_.size(); ++i)
      if (rt_.value.held_[i].position != 0 && !rt_.value.held_[i].confirmed &&
          rt_.value.held_[i].session == nullptr)
        return true;
    return false;
  }

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
    detail::ring<held> held_;
    std::vector<char> met_, done_;
    std::vector<std::uint64_t> expect_;
    std::vector<entry> entries_;
    std::vector<std::optional<message>> replicas_;  // per worker: its newest replica
    std::uint64_t newest_stable_ = 0;
    shard_state initial_{}, scratch_{};
    std::chrono::steady_clock::time_point recovery_started_{};
    replica_log_stats stats_{};
  };
  detail::fresh_on_copy<runtime> rt_;
};

}  // namespace asyncps::recovery
