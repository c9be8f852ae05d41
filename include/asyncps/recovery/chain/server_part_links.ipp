// asyncps — recovery::chain_replication, server part: the links and the configuration. The link
// to the chain master (registering, heartbeats, registering again) and the link to the
// configured successor, both schedules on the part's timers and connects (sans-io); the
// master's chain_config (predecessor, successor, head, a lost shard); leaving the chain to
// rejoin from a state transfer; and a predecessor's chain_hello claiming its session (its member
// id checked against the chain and the certificate's identity).
//
// Out-of-line definitions of members of chain_server_part, declared in
// asyncps/recovery/chain/server_part.hpp. Not a header to include on its own: server_part.hpp
// includes it at its end, after the class it defines members of (so this file does not include
// server_part.hpp back).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <system_error>
#include <utility>

#include "asyncps/detail/server/hooks.hpp"
#include "asyncps/error.hpp"
#include "asyncps/peer_identity.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/recovery/chain/messages.hpp"
#include "asyncps/recovery/chain/options.hpp"
#include "asyncps/recovery/chain/server_state.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::recovery {

template <chain_mode Mode>
template <class Ctx>
void chain_server_part<Mode>::connect_master(Ctx ctx) {
  auto& r = rt_.value;
  if (r.master_connecting || r.master != nullptr) return;
  r.master_connecting = true;
  ctx.connect(role_master, endpoints<Ctx>()->master);
}

template <chain_mode Mode>
template <class Ctx>
void chain_server_part<Mode>::successor_link_step(Ctx ctx) {
  auto& r = rt_.value;
  if (r.succ_member == no_member) {  // no successor configured (any more): the link ends
    r.succ_linking = false;
    ctx.cancel_timer(successor_timer);
    return;
  }
  if (r.succ_connecting) return;  // its completion takes the next step
  // Without the shard's state nothing can feed a successor: the link waits, with no timer,
  // for the state transfer (install_state wakes it).
  if (r.succ == nullptr && r.fresh) return;
  if (r.succ == nullptr) {
    r.succ_connecting = true;
    r.succ_target = r.succ_member;
    ctx.connect(role_successor, endpoints<Ctx>()->members[r.succ_target]);
    return;
  }
  if (r.succ != nullptr && r.succ->ready) {
    r.succ_backoff = std::chrono::milliseconds(1);
    // Tells the successor this link is live (chain_options::link_silence).
    ctx.send_peer(*r.succ, chain_message(ctx, message_type::heartbeat, 0));
  }
  ctx.arm_timer(successor_timer, r.succ == nullptr ? r.succ_backoff : options.heartbeat_interval);
}

template <chain_mode Mode>
template <class Ctx>
void chain_server_part<Mode>::wake_successor_link(Ctx ctx) {
  auto& r = rt_.value;
  if (r.succ_linking && !r.succ_connecting) ctx.arm_timer(successor_timer, {});
}

template <chain_mode Mode>
template <class Ctx>
void chain_server_part<Mode>::on_timer(Ctx ctx, std::uint32_t timer) {
  auto& r = rt_.value;
  if (timer == master_timer) {
    if (r.master == nullptr) {
      connect_master(ctx);
    } else {
      ctx.send_peer(*r.master, chain_message(ctx, message_type::heartbeat, 0));
      ctx.arm_timer(master_timer, options.heartbeat_interval);
    }
  } else if (timer == successor_timer && r.succ_linking) {
    successor_link_step(ctx);
  }
}

template <chain_mode Mode>
template <class Ctx>
void chain_server_part<Mode>::on_connected(Ctx ctx, detail::session_base& s) {
  auto& r = rt_.value;
  if (s.role == role_master) {
    r.master_connecting = false;
    r.master = &s;
    r.first_config = true;
    ctx.send_peer(s, chain_hello(ctx));
    r.master_backoff = std::chrono::milliseconds(10);
    ctx.arm_timer(master_timer, options.heartbeat_interval);
  } else if (s.role == role_successor) {
    r.succ_connecting = false;
    if (r.succ_member == r.succ_target && r.succ == nullptr && !r.fresh) {
      r.succ = &s;
      s.peer = r.succ_target;
      ctx.send_peer(s, chain_hello(ctx));
    } else {
      ctx.close(s);  // the configuration moved on while it connected
    }
    // Until the link is synced (a refused or failed attempt: e.g. the successor has not got
    // its configuration yet) attempts back off; a synced link resets it.
    r.succ_backoff = std::min(r.succ_backoff * 2, std::chrono::milliseconds(200));
    if (r.succ_linking) {
      ctx.arm_timer(successor_timer,
                    r.succ == nullptr ? r.succ_backoff : options.heartbeat_interval);
    }
  } else {
    ctx.close(s);
  }
}

template <chain_mode Mode>
template <class Ctx>
void chain_server_part<Mode>::on_connect_failed(Ctx ctx, std::uint8_t role, std::error_code) {
  auto& r = rt_.value;
  if (role == role_master) {
    r.master_connecting = false;
    r.master_backoff = std::min(r.master_backoff * 2, std::chrono::milliseconds(500));
    ctx.arm_timer(master_timer, r.master_backoff);
  } else if (role == role_successor) {
    r.succ_connecting = false;
    r.succ_backoff = std::min(r.succ_backoff * 2, std::chrono::milliseconds(200));
    if (r.succ_linking) ctx.arm_timer(successor_timer, r.succ_backoff);
  }
}

template <chain_mode Mode>
template <class Ctx>
void chain_server_part<Mode>::leave_chain(Ctx ctx) {
  auto& r = rt_.value;
  ctx.close_if([](const detail::session_base& s) {
    return s.is_worker() ||
           (s.is_peer() && (s.role == role_predecessor || s.role == role_successor));
  });
  r.pred = r.succ = nullptr;
  r.head = false;
  r.fresh = true;
  r.sent.clear();
  r.pending_acks.clear();
  r.committed = 0;
  r.pred_member = r.succ_member = no_member;
}

template <chain_mode Mode>
template <class Ctx>
void chain_server_part<Mode>::on_config(Ctx ctx, const protocol::chain_config& h) {
  auto& r = rt_.value;
  ++r.stats.configs;
  const auto pred = h.predecessor;
  const auto succ = h.successor;
  const auto known = [this](std::uint64_t m) { return m == no_member || m < members_; };
  if (!known(pred) || !known(succ)) {
    // The master's member ids and this server's set_chain list disagree: a configuration
    // error, reported instead of connecting to an endpoint this server does not know.
    ctx.log("chain master names member " + std::to_string(pred) + " / " + std::to_string(succ) +
            ", but set_chain lists " + std::to_string(members_) +
            " members; ignoring the configuration");
    return;
  }
  if (h.joining && r.first_config) {
    // Registered anew with a running chain: whatever this server holds may be stale.
    if (r.serving) ctx.log("rejoining the chain: dropping this server's state and connections");
    leave_chain(ctx);
  }
  r.first_config = false;
  r.serving = true;
  r.epoch = h.epoch;
  if (r.pred != nullptr && r.pred->peer != pred) {
    ctx.close(*r.pred);
    r.pred = nullptr;
  }
  r.pred_member = pred;
  const bool was_head = r.head;
  r.head = pred == no_member;
  if (r.head && r.fresh && !r.lost) {
    // Fresh (it registered with a running chain and has no state transfer yet) and head:
    // every server that held the shard's state failed. Its initial values are not the
    // shard's state, so it serves none: it stays fresh (it neither feeds a successor nor
    // takes entries) and refuses workers with shard_lost.
    r.lost = true;
    r.lost_epoch = h.epoch;
    ctx.log("shard " + std::to_string(ctx.options().shard) +
            " is lost: every server of its chain that held its state failed before this "
            "server got a state transfer (chain epoch " +
            std::to_string(h.epoch) +
            "). Refusing workers with shard_lost instead of serving its initial values");
  }
  if (was_head && !r.head)
    ctx.close_if([](const detail::session_base& s) { return s.is_worker(); });
  if (succ != r.succ_member) {
    if (r.succ != nullptr) {
      ctx.close(*r.succ);
      r.succ = nullptr;
    }
    r.succ_member = succ;
    if (succ == no_member) {
      wake_successor_link(ctx);  // it ends
      if constexpr (strict) {
        r.sent.clear();
        if (!r.fresh) commit(ctx, r.log_index);  // the tail commits what it applies
      }
    } else if (!r.succ_linking) {
      r.succ_linking = true;
      r.succ_backoff = std::chrono::milliseconds(1);
      ctx.arm_timer(successor_timer, {});  // its first step, soon
    } else {
      wake_successor_link(ctx);
    }
  }
  ctx.log("chain epoch " + std::to_string(r.epoch) + ": predecessor " + member_name(pred) +
          ", successor " + member_name(succ) + (r.head ? " (head)" : "") +
          (succ == no_member ? " (tail)" : "") +
          (r.lost    ? ", without the shard's state (lost)"
           : r.fresh ? ", waiting for a state transfer"
                     : ""));
}

template <chain_mode Mode>
template <class Ctx>
std::error_code chain_server_part<Mode>::greet_predecessor(Ctx ctx, detail::session_base& s,
                                                           const message& m, std::string& detail) {
  auto& r = rt_.value;
  protocol::chain_hello h;
  if (auto ec = protocol::decode(m, h, detail)) return ec;
  if (h.fingerprint != ctx.fingerprint()) {
    detail = std::string(" (chain peer; this server runs recovery '") +
             std::string(ctx.policy_name()) + "')";
    return errc::policy_mismatch;
  }
  if (h.member >= members_) {
    detail = " (chain_hello from server " + std::to_string(h.member) + " of shard " +
             std::to_string(h.shard) + "; member ids of this chain lie in [0, " +
             std::to_string(members_) + "), as set_chain lists them)";
    return errc::unexpected_message;
  }
  // Over TLS, a certificate that names identities links only as the member it names.
  if (auto why = detail::identity_refusal(s.identity.get(),
                                          "chain_hello from server " + std::to_string(h.member) +
                                              " of shard " + std::to_string(h.shard),
                                          peer_role::chain, h.shard, h.member);
      !why.empty()) {
    detail = " (" + why + ")";  // counted in the server's `rejected`, logged rate-limited
    return errc::bad_sender;
  }
  if (!r.serving || h.shard != ctx.options().shard || r.pred_member == no_member ||
      h.member != r.pred_member) {
    detail = " (chain_hello from server " + std::to_string(h.member) + " of shard " +
             std::to_string(h.shard) + "; this server's predecessor in epoch " +
             std::to_string(r.epoch) + " is " + member_name(r.pred_member) + ")";
    return errc::unexpected_message;
  }
  if (r.pred != nullptr && r.pred != &s && r.pred->open) {
    // A second claim of the live predecessor's id: the real predecessor reconnecting before
    // this server saw its old link end, or a peer with the secret posing as it. The live
    // link stays unless it has been silent for link_silence (its predecessor heartbeats).
    const auto silent =
        std::chrono::duration_cast<std::chrono::milliseconds>(ctx.silent_for(*r.pred));
    if (silent < options.link_silence) {
      detail = " (chain_hello from server " + std::to_string(h.member) + " of shard " +
               std::to_string(h.shard) + ": the live link of predecessor " +
               std::to_string(h.member) + " was heard from " + std::to_string(silent.count()) +
               " ms ago; it is replaced once closed or silent for link_silence " +
               std::to_string(options.link_silence.count()) + " ms)";
      ++r.stats.claims_refused;
      return chain_errc::member_id_in_use;
    }
    ctx.log("chain predecessor " + std::to_string(h.member) + ": a new link replaces one " +
            "silent for " + std::to_string(silent.count()) + " ms");
  }
  if (r.pred != nullptr) ctx.close(*r.pred);
  r.pred = &s;
  ctx.claim(s, role_predecessor);
  s.peer = h.member;
  message a = chain_message(ctx, message_type::ack, r.log_index);
  if (r.fresh) a.header.flags = protocol::chain_needs_state_flag;
  ctx.send_peer(s, std::move(a));
  return {};
}

}  // namespace asyncps::recovery
