// asyncps — basic_rendezvous's requests and directory: routing a request, announces (which
// shard an address serves), lookups (held until every shard has announced) and the worker ids
// they are given; over TLS, the shard or worker id checked against the certificate's identity.
//
// Out-of-line definitions of members declared in asyncps/rendezvous.hpp. Not a header to
// include on its own: rendezvous.hpp includes it at its end, after the class it defines members
// of (so this file does not include rendezvous.hpp back).
#pragma once

#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "asyncps/detail/peer_address.hpp"
#include "asyncps/error.hpp"
#include "asyncps/peer_identity.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

template <transport Transport>
void basic_rendezvous<Transport>::handle(session& s, const message& m) {
  if (s.waiting) {
    refuse(s, errc::unexpected_message,
           "message type " + std::to_string(static_cast<int>(m.header.type)) +
               " while its lookup waits (one request at a time)");
    return;
  }
  switch (m.header.type) {
    case message_type::announce: on_announce(s, m); return;
    case message_type::lookup: on_lookup(s, m); return;
    case message_type::heartbeat: return;
    case message_type::bye:
      s.closing = true;  // nothing queued: the write loop closes the connection
      return;
    default:
      refuse(s, errc::unexpected_message,
             "unexpected message type " + std::to_string(static_cast<int>(m.header.type)) +
                 " (a rendezvous takes announce and lookup)");
  }
}

template <transport Transport>
std::string basic_rendezvous<Transport>::missing_shards() const {
  std::string out;
  std::size_t listed = 0;
  for (std::uint32_t i = 0; i < shards_.size(); ++i) {
    if (shards_[i].announced) continue;
    if (listed++ == 8) {
      out += ", ...";
      break;
    }
    out += (out.empty() ? "" : ", ") + std::to_string(i);
  }
  return out;
}

template <transport Transport>
std::string basic_rendezvous<Transport>::progress() const {
  return std::to_string(announced_) + " of " + std::to_string(opts_.num_servers) +
         " shards announced";
}

template <transport Transport>
void basic_rendezvous<Transport>::on_announce(session& s, const message& m) {
  protocol::announce a;
  std::string why;
  if (auto ec = protocol::decode(m, a, why)) {
    refuse(s, ec, "malformed announce" + why);
    return;
  }
  // Over TLS, a certificate that names identities announces only the shards it names as
  // `asyncps://server/<shard>` ("any shard": only `asyncps://server/*`).
  if (auto why = detail::identity_refusal(detail::identity_of(s.conn).get(),
                                          a.shard == protocol::any_id
                                              ? std::string("an announce of any shard")
                                              : "an announce of shard " + std::to_string(a.shard),
                                          peer_role::server, a.shard);
      !why.empty()) {
    refuse(s, errc::rendezvous_refused, why);
    return;
  }
  std::string host = a.host.empty() ? detail::peer_host(s.conn) : std::move(a.host);
  if (host.empty() || host.size() > max_host_bytes) {
    refuse(s, errc::rendezvous_refused,
           "an announce without a host, and the transport knows no address of the peer");
    return;
  }
  std::uint32_t shard = a.shard;
  if (shard == protocol::any_id) {
    // A server restarted at the same address gets its shard back; else the lowest free one.
    shard = opts_.num_servers;
    for (std::uint32_t i = 0; i < shards_.size() && shard == opts_.num_servers; ++i)
      if (shards_[i].announced && shards_[i].host == host && shards_[i].port == a.port) shard = i;
    for (std::uint32_t i = 0; i < shards_.size() && shard == opts_.num_servers; ++i)
      if (!shards_[i].announced) shard = i;
    if (shard == opts_.num_servers) {
      refuse(s, errc::rendezvous_refused,
             "an announce of any shard from " + host_port_string(host, a.port) + ": all " +
                 std::to_string(opts_.num_servers) +
                 " shards are announced (announce a shard index to replace one)");
      return;
    }
  } else if (shard >= opts_.num_servers) {
    refuse(s, errc::rendezvous_refused,
           "an announce of shard " + std::to_string(shard) + " outside [0, " +
               std::to_string(opts_.num_servers) + ") (num_servers " +
               std::to_string(opts_.num_servers) + ")");
    return;
  }
  auto& e = shards_[shard];
  const std::string address = host_port_string(host, a.port);
  const bool was_complete = complete();
  if (!e.announced) {
    ++announced_;
    log("shard " + std::to_string(shard) + " at " + address + " (" + progress() + ")");
  } else if (e.host != host || e.port != a.port) {
    ++stats_.replaced;
    log("shard " + std::to_string(shard) + " moved from " + host_port_string(e.host, e.port) +
        " to " + address);
  } else {
    log("shard " + std::to_string(shard) + " announced again at " + address);
  }
  e.host = std::move(host);
  e.port = a.port;
  e.announced = true;
  ++stats_.announces;
  ++s.requests;
  reply(s,
        encode(protocol::assigned{
            .shard = shard, .num_servers = opts_.num_servers, .num_workers = opts_.num_workers}));
  if (!was_complete && complete()) {
    log("every shard announced; answering " + std::to_string(waiting_.size()) +
        " waiting lookup(s)");
    auto waiting = std::move(waiting_);
    waiting_.clear();
    for (session* w : waiting) {
      w->waiting = false;
      // No memory for one directory closes that lookup's connection, not this announce's
      // nor the other lookups'.
      try {
        answer(*w);
      } catch (const std::bad_alloc&) {
        out_of_memory(*w, "no memory to answer its lookup");
      } catch (const std::length_error&) {
        out_of_memory(*w, "no memory to answer its lookup");
      }
    }
  }
}

template <transport Transport>
void basic_rendezvous<Transport>::on_lookup(session& s, const message& m) {
  protocol::lookup l;
  std::string why;
  if (auto ec = protocol::decode(m, l, why)) {
    refuse(s, ec, "malformed lookup" + why);
    return;
  }
  const std::uint32_t id = l.worker;
  if (id != protocol::any_id && id != protocol::no_worker_id && opts_.num_workers != 0 &&
      id >= opts_.num_workers) {
    refuse(s, errc::rendezvous_refused,
           "a lookup as worker " + std::to_string(id) + " outside [0, " +
               std::to_string(opts_.num_workers) + ") (num_workers " +
               std::to_string(opts_.num_workers) + ")");
    return;
  }
  // Over TLS, a certificate that names identities claims only the worker ids it names
  // ("any id": only `asyncps://worker/*`); a lookup taking no id (a reader, a server) is
  // not checked.
  if (id != protocol::no_worker_id) {
    if (auto why = detail::identity_refusal(detail::identity_of(s.conn).get(),
                                            id == protocol::any_id
                                                ? std::string("a lookup for any worker id")
                                                : "a lookup as worker " + std::to_string(id),
                                            peer_role::worker, id);
        !why.empty()) {
      refuse(s, errc::rendezvous_refused, why);
      return;
    }
  }
  ++s.requests;
  s.wanted = id;
  if (complete()) {
    answer(s);
    return;
  }
  if (waiting_.empty())
    log("a lookup" + detail::peer_address(s.conn) + " waits for shards " + missing_shards() + " (" +
        progress() + ")");
  s.waiting = true;
  waiting_.push_back(&s);
}

// Sends `s` the directory, assigning its worker id when it asked for any (in the order the
// lookups arrived: answer() runs for waiting lookups in that order).
template <transport Transport>
void basic_rendezvous<Transport>::answer(session& s) {
  std::uint32_t id = s.wanted;
  if (id == protocol::any_id) {
    const std::uint32_t limit = opts_.num_workers != 0 ? opts_.num_workers : protocol::no_worker_id;
    if (next_free_ >= limit) {
      refuse(s, errc::rendezvous_refused,
             "a lookup for any worker id: all " + std::to_string(limit) +
                 " worker ids are taken (num_workers " + std::to_string(opts_.num_workers) + ")");
      return;
    }
    id = next_free_;
  }
  if (id != protocol::no_worker_id) {
    taken_.insert(id);
    while (taken_.contains(next_free_)) ++next_free_;
  }
  protocol::directory d{.worker = id, .num_workers = opts_.num_workers, .servers = {}};
  d.servers.reserve(shards_.size());
  for (const auto& e : shards_) d.servers.push_back(protocol::server_address{e.host, e.port});
  ++stats_.lookups;
  s.last_seen = clock_type::now();
  reply(s, encode(d));
}

}  // namespace asyncps
