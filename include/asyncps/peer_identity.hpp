// asyncps — peer identities: the roles and ids a TLS certificate names (URI subject alternative
// names `asyncps://<role>/<id>`), parsed by the TCP transport after the TLS handshake and checked
// where ids enter (a shard server's hello, a chain_hello at the chain master and at a chain
// member, the rendezvous' announce and lookup). docs/security.md, "Identities".
//
// Apart from tls.hpp because the servers check identities over any transport and must not
// need OpenSSL for it; the checks' helpers are in namespace detail. Pure code: no I/O, no
// OpenSSL.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace asyncps {

/// A role a certificate can name. `worker`: a worker process (id: its worker id); `server`: a
/// shard server as the rendezvous sees it (id: its shard); `chain`: a chain-replication member
/// (ids: shard and member id); `master`, `rendezvous`: those services (not checked by anyone
/// yet: reserved so that a deployment can name every certificate); `reader`: a read-only
/// client of the shard servers (`protocol::reader_id`; its id is not checked).
enum class peer_role : std::uint8_t { worker, server, chain, master, rendezvous, reader };

/// One name of a certificate: `asyncps://<role>/<id>` (`asyncps://chain/<shard>/<member>` for
/// `chain`), each id decimal in [0, 2^32 - 2] or `*` ("any id of this role", stored as `any`).
struct peer_name {
  static constexpr std::uint32_t any = 0xffffffffu;  ///< `*`: every id
  peer_role role = peer_role::worker;
  std::uint32_t id = any;      ///< the worker id, the shard (server, chain), or unchecked
  std::uint32_t member = any;  ///< chain: the member id; other roles: `any`
  friend bool operator==(const peer_name&, const peer_name&) = default;
};

/// The names a verified peer certificate holds (one per asyncps URI SAN, in certificate order;
/// never empty when the transport hands one out). A connection whose certificate names no
/// asyncps identity has none at all (a null pointer), which the checks treat as "any member",
/// as before identities existed (unless `tls_options::require_identity` refused it).
/// Thread safety: immutable once made (shared between a connection and its session).
struct peer_identity {
  std::vector<peer_name> names;

  /// Whether some name is of role `r` (any id).
  bool has_role(peer_role r) const noexcept {
    return std::any_of(names.begin(), names.end(), [r](const peer_name& n) { return n.role == r; });
  }
  /// Whether some name of role `r` covers `id` (and, for `chain`, `member`): equal, or `*`.
  bool allows(peer_role r, std::uint32_t id, std::uint32_t member = peer_name::any) const noexcept {
    const auto covers = [](std::uint32_t mine, std::uint32_t claimed) {
      return mine == peer_name::any || mine == claimed;
    };
    return std::any_of(names.begin(), names.end(), [&](const peer_name& n) {
      return n.role == r && covers(n.id, id) && (r != peer_role::chain || covers(n.member, member));
    });
  }
};

/// The URI text of role `r` ("worker", "server", "chain", "master", "rendezvous", "reader").
inline std::string_view role_name(peer_role r) noexcept {
  switch (r) {
    case peer_role::worker: return "worker";
    case peer_role::server: return "server";
    case peer_role::chain: return "chain";
    case peer_role::master: return "master";
    case peer_role::rendezvous: return "rendezvous";
    case peer_role::reader: return "reader";
  }
  return "?";
}

/// `n` as its URI, e.g. "asyncps://worker/1", "asyncps://chain/0/*".
inline std::string to_string(const peer_name& n) {
  const auto id = [](std::uint32_t v) { return v == peer_name::any ? "*" : std::to_string(v); };
  std::string out = "asyncps://" + std::string(role_name(n.role)) + "/" + id(n.id);
  if (n.role == peer_role::chain) out += "/" + id(n.member);
  return out;
}

/// Every name of `p`, comma-separated (for log lines and refusals).
inline std::string to_string(const peer_identity& p) {
  std::string out;
  for (const auto& n : p.names) out += (out.empty() ? "" : ", ") + to_string(n);
  return out;
}

/// Whether `uri` is meant as an asyncps identity: it starts with "asyncps:" in any case (so a
/// misspelt identity is refused, not ignored).
inline bool is_identity_uri(std::string_view uri) noexcept {
  constexpr std::string_view scheme = "asyncps:";
  if (uri.size() < scheme.size()) return false;
  for (std::size_t i = 0; i < scheme.size(); ++i) {
    char c = uri[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != scheme[i]) return false;
  }
  return true;
}

/// Parses one identity URI: exactly "asyncps://<role>/<id>" (role lower case, one of
/// `peer_role`'s names) or "asyncps://chain/<shard>/<member>"; each id decimal in
/// [0, 4294967294] or "*". nullopt for anything else (another scheme, upper case, an empty or
/// extra component, a sign, a query, a number too large). Thread safety: pure.
inline std::optional<peer_name> parse_peer_name(std::string_view uri) {
  constexpr std::string_view scheme = "asyncps://";
  if (uri.substr(0, scheme.size()) != scheme) return std::nullopt;
  uri.remove_prefix(scheme.size());
  std::vector<std::string_view> parts;
  for (;;) {
    const auto slash = uri.find('/');
    parts.push_back(uri.substr(0, slash));
    if (slash == std::string_view::npos) break;
    uri.remove_prefix(slash + 1);
  }
  static constexpr peer_role roles[] = {peer_role::worker,     peer_role::server,
                                        peer_role::chain,      peer_role::master,
                                        peer_role::rendezvous, peer_role::reader};
  peer_name n;
  const auto* r = std::find_if(std::begin(roles), std::end(roles),
                               [&](peer_role x) { return role_name(x) == parts[0]; });
  if (r == std::end(roles)) return std::nullopt;
  n.role = *r;
  if (parts.size() != (n.role == peer_role::chain ? 3u : 2u)) return std::nullopt;
  const auto number = [](std::string_view t, std::uint32_t& out) {
    if (t == "*") {
      out = peer_name::any;
      return true;
    }
    if (t.empty() || t.size() > 10) return false;
    std::uint64_t v = 0;
    for (char c : t) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + static_cast<std::uint64_t>(c - '0');
    }
    if (v >= peer_name::any) return false;
    out = static_cast<std::uint32_t>(v);
    return true;
  };
  if (!number(parts[1], n.id)) return std::nullopt;
  if (n.role == peer_role::chain && !number(parts[2], n.member)) return std::nullopt;
  return n;
}

namespace detail {

/// The identity of `c`'s peer when the transport knows one (`c.identity()`, the TCP transport
/// under TLS), else null (every other transport, and a certificate naming none).
template <class C>
std::shared_ptr<const peer_identity> identity_of(const C& c) {
  if constexpr (requires {
                  { c.identity() } -> std::convertible_to<std::shared_ptr<const peer_identity>>;
                }) {
    return c.identity();
  } else {
    return nullptr;
  }
}

/// "" when `p` is null (no identity: any id) or `p` names `what` (`allows(r, id, member)`);
/// else the refusal's text: "WHO, but this connection's certificate names NAMES", with `who`
/// describing the claim (e.g. "a hello as worker 0").
inline std::string identity_refusal(const peer_identity* p, std::string_view who, peer_role r,
                                    std::uint32_t id, std::uint32_t member = peer_name::any) {
  if (p == nullptr || p->allows(r, id, member)) return {};
  return std::string(who) + ", but this connection's certificate names " + to_string(*p);
}

}  // namespace detail
}  // namespace asyncps
