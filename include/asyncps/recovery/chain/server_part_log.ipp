// asyncps — recovery::chain_replication, server part: the log. Entries and state transfers from
// the predecessor (applied, logged, passed on), bringing a successor up to date (the entries it
// lacks, or the whole state), appending an entry to the log, and commits: log positions the tail
// has, acknowledged up the chain and to the workers.
//
// Out-of-line definitions of members of chain_server_part, declared in
// asyncps/recovery/chain/server_part.hpp. Not a header to include on its own: server_part.hpp
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
#include "asyncps/detail/server/hooks.hpp"
#include "asyncps/error.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery/chain/messages.hpp"
#include "asyncps/recovery/chain/server_state.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::recovery {

template <chain_mode Mode>
template <class Ctx>
std::error_code chain_server_part<Mode>::apply_entry(Ctx ctx, detail::session_base& s, message& m,
                                                     std::string& detail) {
  const auto& h = m.header;
  auto& r = rt_.value;
  if (h.type == protocol::chain_state_type) return install_state(ctx, s, m, detail);
  if (r.fresh || !strict || (h.type != message_type::push && h.type != message_type::clock)) {
    detail = r.fresh ? " (an entry before the state transfer)" : " (not a chain entry)";
    return errc::unexpected_message;
  }
  if (h.sender >= ctx.options().num_workers) return errc::bad_sender;
  if (h.clock != ctx.worker_clock(h.sender)) {
    detail = " (chain entry for clock " + std::to_string(h.clock) + " of worker " +
             std::to_string(h.sender) + ", which is at " +
             std::to_string(ctx.worker_clock(h.sender)) + " here)";
    return errc::unexpected_message;
  }
  if (h.type == message_type::push) {
    if (auto ec = ctx.check_rows(m, detail)) return ec;
    if (h.has(frame_flags::policy) || h.has(frame_flags::prefixed) ||
        !ctx.all_finite(payload_floats(m)))
      return errc::non_finite_value;
    // The head applied it, so a backup in the same state accepts it too; a refusal here
    // means the chain's states diverged: refuse the link rather than skip the entry.
    if (auto ec = ctx.apply_push(m)) {
      detail = " (chain entry of worker " + std::to_string(h.sender) + ")";
      return ec;
    }
  }
  ctx.last_seq(h.sender) = std::max(ctx.last_seq(h.sender), h.seq);
  append_entry(ctx, m);
  if (h.ends_clock()) ctx.advance(h.sender, h.clock + 1);
  return {};
}

template <chain_mode Mode>
template <class Ctx>
std::error_code chain_server_part<Mode>::install_state(Ctx ctx, detail::session_base& s, message& m,
                                                       std::string& detail) {
  auto& r = rt_.value;
  std::string why;
  if (auto ec = detail::decode_state(m.payload.bytes(), r.incoming, why)) {
    detail = why;
    return ec;
  }
  if (m.header.seq > protocol::max_seq) {
    detail = " (state transfer from the predecessor at log position " +
             std::to_string(m.header.seq) + "; positions lie in [0, " +
             std::to_string(protocol::max_seq) + "])";
    return errc::bad_position;
  }
  if (auto ec = ctx.restore_state(r.incoming)) {
    detail = " (state transfer from the predecessor)";
    return ec;
  }
  r.log_index = m.header.seq;
  r.fresh = false;
  r.lost = false;  // a member that held the state passed it on
  ++r.stats.states_installed;
  wake_successor_link(ctx);  // it may now feed a successor
  if (r.stats.states_installed == 1 || strict)
    ctx.log("installed a state transfer at log position " + std::to_string(r.log_index) +
            " (server clock " + std::to_string(ctx.clock()) + ")");
  if constexpr (strict) {
    r.sent.clear();
    r.committed = 0;
    if (r.succ_member == no_member) {
      commit(ctx, r.log_index);
    } else if (r.succ != nullptr && r.succ->ready) {
      send_state(ctx, *r.succ);
    }
  } else {
    // Relaxed: pass the same copy on (no re-encoding), acknowledge to the predecessor only.
    if (r.succ != nullptr && r.succ->ready) {
      message f;
      f.header = m.header;
      f.payload = m.payload.share();
      ctx.send_peer(*r.succ, std::move(f));
    }
    ctx.send_peer(s, chain_message(ctx, message_type::ack, r.log_index));
  }
  return {};
}

template <chain_mode Mode>
template <class Ctx>
void chain_server_part<Mode>::successor_ready(Ctx ctx, detail::session_base& s,
                                              std::uint64_t their_index, bool needs_state) {
  auto& r = rt_.value;
  s.ready = true;
  if constexpr (!strict) {
    send_state(ctx, s);
  } else {
    const bool gap =
        their_index < r.log_index && (r.sent.empty() || their_index + 1 < r.sent_first);
    if (needs_state || their_index > r.log_index || gap) {
      send_state(ctx, s);  // entries after it follow as they are applied
      return;
    }
    for (std::uint64_t i = their_index + 1; i <= r.log_index; ++i) {
      const message& e = r.sent[static_cast<std::size_t>(i - r.sent_first)];
      message f;
      f.header = e.header;
      f.payload = e.payload.share();
      ctx.send_peer(s, std::move(f));
      ++r.stats.resent;
    }
  }
}

template <chain_mode Mode>
template <class Ctx>
void chain_server_part<Mode>::send_state(Ctx ctx, detail::session_base& s) {
  auto& r = rt_.value;
  ctx.save_state(r.outgoing);
  const std::size_t bytes = detail::encoded_state_size(r.outgoing);
  if (bytes > ctx.max_frame_bytes()) {
    // The successor would reject the frame (frame_too_large) and we would resend it forever.
    ctx.log("cannot transfer this shard's state (" + std::to_string(bytes) +
            " bytes) to its successor: above wire_limits::max_frame_bytes (" +
            std::to_string(ctx.max_frame_bytes()) + ")");
    ctx.close(s);
    return;
  }
  buffer b = ctx.allocate(bytes);
  detail::encode_state(r.outgoing, std::span<std::byte>(b.data(), b.size()));
  message m = chain_message(ctx, protocol::chain_state_type, r.log_index);
  m.header.clock = ctx.clock();
  m.payload = std::move(b);
  ctx.send_peer(s, std::move(m));
  ++r.stats.states_sent;
  r.since_copy = 0;
}

template <chain_mode Mode>
template <class Ctx>
void chain_server_part<Mode>::append_entry(Ctx ctx, const message& m) {
  auto& r = rt_.value;
  ++r.log_index;
  ++r.stats.entries;
  if (r.succ_member == no_member) {  // the tail: committed once applied
    commit(ctx, r.log_index);
    return;
  }
  message f;
  f.header = m.header;
  f.payload = m.payload.share();
  if (r.succ != nullptr && r.succ->ready) {
    message g;
    g.header = f.header;
    g.payload = f.payload.share();
    ctx.send_peer(*r.succ, std::move(g));
  }
  if (r.sent.empty()) r.sent_first = r.log_index;
  r.sent.push_back(std::move(f));
}

template <chain_mode Mode>
template <class Ctx>
void chain_server_part<Mode>::commit(Ctx ctx, std::uint64_t index) {
  auto& r = rt_.value;
  if (index <= r.committed) return;
  r.committed = index;
  while (!r.sent.empty() && r.sent_first <= index) {
    r.sent.pop_front();
    ++r.sent_first;
  }
  if (r.pred != nullptr) ctx.send_peer(*r.pred, chain_message(ctx, message_type::ack, index));
  release_acks(ctx);
}

template <chain_mode Mode>
template <class Ctx>
void chain_server_part<Mode>::release_acks(Ctx ctx) {
  auto& r = rt_.value;
  while (!r.pending_acks.empty() && r.pending_acks.front().index <= r.committed) {
    const auto& p = r.pending_acks.front();
    ctx.ack_worker(p.worker, p.seq);
    r.pending_acks.pop_front();
  }
}

}  // namespace asyncps::recovery
