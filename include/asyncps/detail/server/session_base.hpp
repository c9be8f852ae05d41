// asyncps — detail::session_base: one server connection as the recovery policy's server part
// sees it (what the peer is, its ids, whether it is open). The server's sessions derive from it
// (detail/server/session.hpp); the server hooks (asyncps/recovery.hpp) receive it.
#pragma once

#include <cstdint>
#include <memory>

#include "asyncps/peer_identity.hpp"

namespace asyncps::detail {

/// The policy-independent part of one server connection, as recovery parts see it.
///
/// A session is unknown until its first message: a worker's hello makes it a worker session;
/// a recovery part may claim it as a peer (`Ctx::claim`; a connection the part asked for with
/// `ctx.connect(role, endpoint)` arrives claimed, in hook `on_connected`). Thread safety: the
/// server's executor.
struct session_base {
  /// What the peer of a session is.
  /// `reader`: a read-only session (`protocol::reader_id`), greeted by the server itself.
  enum class kind_type : std::uint8_t { unknown, worker, peer, reader };
  static constexpr std::uint32_t none = 0xffffffffu;
  kind_type kind = kind_type::unknown;
  std::uint8_t role = 0;        ///< peer sessions: the recovery part's own tag
  bool open = true;             ///< false once closing (nothing more is sent or read)
  bool ready = false;           ///< peer sessions: the part's "handshake done" flag
  std::uint32_t worker = none;  ///< worker sessions: the worker id
  std::uint32_t peer = none;    ///< peer sessions: the part's peer id (e.g. a chain member)
  /// The identity the peer's certificate names (`peer_identity`), taken from the connection
  /// when its first message arrives (the handshake is over by then): the ids it may claim in a
  /// hello or chain_hello. Null: the transport names none (no TLS, another transport, a
  /// certificate without an asyncps identity): any id, as with a shared secret only.
  std::shared_ptr<const peer_identity> identity;

  bool is_worker() const noexcept { return kind == kind_type::worker; }
  bool is_peer() const noexcept { return kind == kind_type::peer; }
  bool is_reader() const noexcept { return kind == kind_type::reader; }
  /// Whether its first message has not been taken yet (no hello, no peer handshake).
  bool is_unknown() const noexcept { return kind == kind_type::unknown; }
};

}  // namespace asyncps::detail
