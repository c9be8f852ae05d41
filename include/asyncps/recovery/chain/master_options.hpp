// asyncps — the chain master's configuration and counters (basic_chain_master,
// recovery/chain/master.hpp; its protocol: detail::chain_master_core, master_core.hpp).
#pragma once

#include <chrono>
#include <cstdint>

#include "asyncps/log.hpp"

namespace asyncps {

/// Configuration of a chain master.
struct chain_master_options {
  std::uint32_t num_shards = 1;  ///< shards (one chain each)
  /// Servers per chain at start: a shard's first configuration is sent once this many of its
  /// servers registered (ordered by member id: member 0 is the first head). Member ids lie
  /// in [0, members) (each server's `set_chain` lists that many endpoints): a `chain_hello`
  /// naming another id is refused (counted in `refused`, logged), so it never holds a place
  /// in a chain or blocks its start or a failover. Over TLS, a `chain_hello` from a
  /// certificate that names asyncps identities is refused the same way unless one of them is
  /// `asyncps://chain/<shard>/<member>` for its shard and member (or `*`; docs/security.md).
  std::uint32_t members = 2;
  /// A registered server silent for this long is declared failed (its connection is closed).
  /// Until then its member id is its own: a `chain_hello` naming the id of a live
  /// registration (open and heard from within this bound) is refused and the holder stays,
  /// so a peer with the secret cannot displace a live member. A restarted server gets in
  /// once its old registration is closed or silent this long (it retries its registration).
  std::chrono::milliseconds heartbeat_timeout{1000};
  /// A connection that has not registered (`chain_hello`) this long after its accept is
  /// closed, logged with its address (the transport's handshake counts in it). Checked by the
  /// heartbeat watchdog, so up to `heartbeat_timeout / 4` late. 0: no limit.
  std::chrono::milliseconds register_timeout{std::chrono::seconds(10)};
  /// Membership changes; empty: stderr. Failed accepts and refused connections are logged
  /// rate-limited (a few lines per peer host and kind every 10 s, then a count of the rest).
  log_function log{};
};

/// Counters of a chain master (read on its executor).
struct chain_master_stats {
  std::uint64_t registrations = 0;  ///< servers registered (initial and rejoining)
  std::uint64_t failures = 0;       ///< servers removed (connection lost or heartbeat timeout)
  std::uint64_t joins = 0;          ///< servers appended as a new tail
  std::uint64_t configs_sent = 0;   ///< chain_config messages sent
  /// Connections refused or closed before registering: a failed authentication, no valid
  /// `chain_hello` as their first message (a member id outside the chain, one the
  /// certificate does not name, one a live registration holds), none within
  /// `register_timeout`.
  std::uint64_t refused = 0;
  /// Connections closed because an allocation failed (`std::bad_alloc`, `std::length_error`)
  /// while their frame was received or handled, their messages were sent, or their session
  /// was started: no error frame (no memory for one), logged rate-limited ("out of memory"),
  /// and a registered member is removed as when its connection is lost. Every other
  /// connection is served on.
  std::uint64_t out_of_memory = 0;
};

}  // namespace asyncps
