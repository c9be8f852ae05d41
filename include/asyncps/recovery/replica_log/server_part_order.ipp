// asyncps — recovery::replica_log (SWIFT), server part: ordering. Holding a worker's messages
// and giving its pushes and clocks positions (the orders it logs), the write-ahead release (an
// ordered update is applied only once its worker confirmed it), counting what is dropped when
// dispatched, a worker's clock caught up after an inexact rebuild, state replicas sent to the
// workers, voiding orders a worker never confirmed, and what the shard does when an order stays
// unconfirmed for `commit_timeout`.
//
// Out-of-line definitions of members of replica_log_server_part, declared in
// asyncps/recovery/replica_log/server_part.hpp. Not a header to include on its own: server_part.hpp
// includes it at its end, after the class it defines members of (so this file does not include
// server_part.hpp back).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <utility>

#include "asyncps/detail/codec/shard_state.hpp"
#include "asyncps/detail/log_limiter.hpp"
#include "asyncps/detail/ring.hpp"
#include "asyncps/detail/server/hooks.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery/replica_log/messages.hpp"
#include "asyncps/recovery/replica_log/options.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::recovery {

template <class Ctx>
void replica_log_server_part::hold(Ctx ctx, detail::session_base* s, std::uint32_t w, message m,
                                   bool order) {
  held it{w, s, std::move(m), 0, false};
  if (order) {
    // Apply-first: released as soon as it reaches the front (its order goes out with the
    // worker's clock, before the clock's ack on the same connection, so the worker logs the
    // positions before it sees its updates acknowledged). Write-ahead: released once the
    // worker confirms the order (`commit`).
    it.confirmed = options.ordering == replica_log_ordering::apply_first;
    it.position = rt_.value.next_++;
    ++rt_.value.stats_.ordered;
    if (options.log_budget > 0 && w < rt_.value.logged_bytes_.size()) {
      rt_.value.logged_.push_back({it.position, w, it.m.payload.size()});
      rt_.value.logged_bytes_[w] += it.m.payload.size();
    }
    if (w < rt_.value.pending_.size()) {
      auto& p = rt_.value.pending_[w];
      if (rt_.value.pending_from_[w] != s) {  // another connection's orders are never sent
        p.clear();
        rt_.value.pending_from_[w] = s;
      }
      p.push_back(protocol::order_entry{it.m.header.seq, it.position});
      if (p.size() >= protocol::max_order_entries) flush_orders(ctx, w);
    }
  }
  const bool waits = it.position != 0 && !it.confirmed;
  rt_.value.held_.push_back(std::move(it));
  rt_.value.stats_.max_held =
      std::max<std::uint64_t>(rt_.value.stats_.max_held, rt_.value.held_.size());
  // Write-ahead: the watch times how long an unconfirmed order keeps later updates waiting.
  if (waits && options.commit_timeout.count() > 0) watch(ctx);
}

template <class Ctx>
bool replica_log_server_part::flush_orders(Ctx ctx, std::uint32_t w, std::uint64_t ack_seq) {
  if (w >= rt_.value.pending_.size() || rt_.value.pending_[w].empty()) return false;
  auto& p = rt_.value.pending_[w];
  const detail::session_base* from = rt_.value.pending_from_[w];
  if (from == nullptr || !from->open || !ctx.worker_connected(w)) {  // its connection is gone
    p.clear();
    return false;
  }
  // Apply-first: a replica taken after these were applied may be stored before they are sent,
  // so the stable position may reach them; the order carries it all the same (a replica holds
  // them). A stable position an order carries is always a stored replica's: a rebuild starts
  // from the newest any worker learned, and that replica's holder keeps it (worker part).
  const protocol::order o{.shard = ctx.options().shard,
                          .stable = rt_.value.stable_,
                          .applied = options.ordering == replica_log_ordering::apply_first,
                          .entries = p};
  const auto alloc = [&](std::size_t n) { return ctx.allocate(n); };
  ctx.send_worker(w, ack_seq != 0 && o.applied ? protocol::encode_on_ack(o, ack_seq, alloc)
                                               : protocol::encode(o, alloc));
  ++rt_.value.stats_.orders_sent;
  rt_.value.sent_[w] = p.back().position;
  p.clear();
  return true;
}

template <class Ctx>
void replica_log_server_part::ack_now(Ctx ctx, detail::session_base& s, std::uint64_t seq) {
  const std::uint32_t w = s.worker;
  if (w < rt_.value.owed_.size()) rt_.value.owed_[w] = owed_ack{};  // covered: acks are cumulative
  if (!flush_orders(ctx, w, seq)) ctx.ack(s, seq);
}

template <class Ctx>
void replica_log_server_part::owe_ack(Ctx ctx, detail::session_base& s, std::uint64_t seq) {
  const std::uint32_t w = s.worker;
  // Sent at once when the worker's positions waiting reach half of what its flow control
  // allows (it asks for a prompt ack then too): it never blocks on an ack held back here.
  const std::size_t half =
      std::max<std::size_t>(std::max<std::uint32_t>(options.max_unacked, 1) / 2, 1);
  if (w >= rt_.value.owed_.size() || rt_.value.pending_[w].size() >= half) {
    ack_now(ctx, s, seq);
    return;
  }
  rt_.value.owed_[w] = owed_ack{&s, seq};
  if (!ctx.timer_armed(ack_timer)) ctx.arm_timer(ack_timer, options.ack_delay);
}

template <class Ctx>
void replica_log_server_part::send_owed_acks(Ctx ctx) {
  for (std::uint32_t w = 0; w < rt_.value.owed_.size(); ++w) {
    const owed_ack o = rt_.value.owed_[w];
    if (o.session != nullptr && o.session->open) {
      ack_now(ctx, *o.session, o.seq);
    } else {
      rt_.value.owed_[w] = owed_ack{};
      flush_orders(ctx, w);  // orders of a refused clock end (no ack owed): sent alone
    }
  }
}

template <class Ctx>
void replica_log_server_part::count_drop(Ctx ctx, const char* what, std::uint32_t w,
                                         std::uint64_t position, const message& m,
                                         std::error_code ec) {
  ++rt_.value.stats_.dropped;
  (void)ctx.log_limited(detail::log_kind::dropped_message,
                        std::string("dropped a ") + what + " message of worker " +
                            std::to_string(w) + " (type " +
                            std::to_string(static_cast<int>(m.header.type)) + ", clock " +
                            std::to_string(m.header.clock) + ", position " +
                            std::to_string(position) + "): " + ec.message() + " (" +
                            std::to_string(rt_.value.stats_.dropped) + " dropped so far)");
}

inline void replica_log_server_part::confirm(std::uint32_t w, std::uint64_t p) {
  // Cumulative: the worker got its orders in position order on one connection, so a commit of
  // `p` says every earlier position given to it is logged too. Never beyond the positions sent
  // to it (a commit naming one it was not sent confirms nothing more).
  if (w < rt_.value.sent_.size()) p = std::min(p, rt_.value.sent_[w]);
  for (std::size_t i = 0; i < rt_.value.held_.size(); ++i) {
    auto& it = rt_.value.held_[i];
    if (it.position > p) return;
    if (it.position != 0 && it.worker == w) it.confirmed = true;
  }
}

template <class Ctx>
void replica_log_server_part::release(Ctx ctx) {
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

template <class Ctx>
void replica_log_server_part::catch_up(Ctx ctx, std::uint32_t w, const message& m) {
  if (m.header.clock <= ctx.worker_clock(w)) return;
  rt_.value.stats_.skipped_clocks +=
      static_cast<std::uint64_t>(m.header.clock - ctx.worker_clock(w));
  ctx.advance(w, m.header.clock);
}

template <class Ctx>
void replica_log_server_part::maybe_replicate(Ctx ctx) {
  if (rt_.value.mode_ != mode::serving || rt_.value.replica_pending_ != 0 ||
      rt_.value.position_ <= rt_.value.stable_)
    return;
  if (ctx.clock() < rt_.value.replica_clock_ + std::max<clock_value>(options.replica_interval, 1) &&
      !over_budget(ctx))
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
    m.header.type = protocol::replica_type;
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

template <class Ctx>
bool replica_log_server_part::over_budget(Ctx ctx) {
  if (!(options.log_budget > 0)) return false;
  const auto& b = rt_.value.logged_bytes_;
  const std::uint64_t most = b.empty() ? 0 : *std::max_element(b.begin(), b.end());
  if (most == 0) return false;
  if (rt_.value.state_bytes_ == 0) {  // once: the size of the shard's encoded state
    ctx.save_state(rt_.value.scratch_);
    rt_.value.state_bytes_ = detail::encoded_state_size(rt_.value.scratch_);
  }
  return static_cast<double>(most) >
         options.log_budget * static_cast<double>(rt_.value.state_bytes_);
}

inline void replica_log_server_part::forget_logged(std::uint64_t stable) {
  auto& l = rt_.value.logged_;
  while (!l.empty() && l.front().position <= stable) {
    rt_.value.logged_bytes_[l.front().worker] -= l.front().bytes;
    l.pop_front();
  }
}

template <class Ctx>
void replica_log_server_part::void_unconfirmed(Ctx, std::uint32_t w, bool orphans_only) {
  // Never sent: voided below (their connection's, when only orphans go; the worker's current
  // connection's pending orders belong to messages of that connection, which stay).
  if (w < rt_.value.pending_.size() && (!orphans_only || rt_.value.pending_from_[w] == nullptr))
    rt_.value.pending_[w].clear();
  detail::ring<held> keep;
  while (!rt_.value.held_.empty()) {
    held it = std::move(rt_.value.held_.front());
    rt_.value.held_.pop_front();
    const bool stale =
        it.worker == w && (!orphans_only || it.session == nullptr) &&
        ((it.position != 0 && !it.confirmed) || (it.position == 0 && it.session == nullptr));
    if (stale) {
      if (it.position != 0) ++rt_.value.stats_.voided;
      continue;
    }
    keep.push_back(std::move(it));
  }
  rt_.value.held_ = std::move(keep);
}

inline const replica_log_server_part::held* replica_log_server_part::blocking() const noexcept {
  if (rt_.value.held_.empty()) return nullptr;
  const held& f = rt_.value.held_.front();
  return f.position != 0 && !f.confirmed ? &f : nullptr;
}

template <class Ctx>
void replica_log_server_part::commit_timed_out(Ctx ctx) {
  const held* b = blocking();
  if (b == nullptr) return;
  const std::uint32_t w = b->worker;
  const std::uint64_t position = b->position;
  const std::string waited = std::to_string(options.commit_timeout.count()) + " ms";
  if (b->session != nullptr) {
    if (!b->session->open) return;  // closing: its messages become orphans when it ends
    if (w < rt_.value.pending_.size() && position > rt_.value.sent_[w] &&
        !rt_.value.pending_[w].empty() && rt_.value.pending_from_[w] == b->session) {
      // Its order has not gone out: the worker's clock has not ended (an honest worker
      // pushing slowly). The order goes now; the worker confirms it as any other. (An order
      // that can no longer go, its connection taken over, is not waited for: closed below.)
      ++rt_.value.stats_.early_orders;
      flush_orders(ctx, w);
      return;
    }
    ++rt_.value.stats_.commit_timeouts;
    ctx.log("worker " + std::to_string(w) + " did not confirm position " +
            std::to_string(position) + " within " + waited +
            " of its order while later updates waited: closed its connection (a worker that "
            "reconnects confirms what it logged; the rest is voided)");
    ctx.close(*b->session);  // on_session_closed: its held messages become orphans
    return;
  }
  if (!ctx.worker_connected(w)) return;  // away: void_timeout decides
  // It reconnected but did not confirm its closed connection's orders (an honest worker
  // confirms them as its rejoin begins): they are voided, and it resends what it did not log.
  ++rt_.value.stats_.commit_timeouts;
  const std::uint64_t voided = rt_.value.stats_.voided;
  void_unconfirmed(ctx, w, true);
  ctx.log("worker " + std::to_string(w) + " reconnected but did not confirm position " +
          std::to_string(position) + ", ordered on its closed connection, within " + waited +
          ": dropped " + std::to_string(rt_.value.stats_.voided - voided) +
          " unconfirmed updates of that connection");
  release(ctx);
}

}  // namespace asyncps::recovery
