// asyncps — recovery::chain_replication, server part: its counters.
#pragma once

#include <cstdint>

namespace asyncps::recovery {

/// Counters of a chain replication server part (read on the server's executor).
struct chain_stats {
  std::uint64_t entries = 0;           ///< pushes and clocks appended to this server's log
  std::uint64_t duplicates = 0;        ///< resent pushes dropped because already applied
  std::uint64_t resent = 0;            ///< entries resent to a new successor
  std::uint64_t states_sent = 0;       ///< state transfers sent to a successor
  std::uint64_t states_installed = 0;  ///< state transfers installed from a predecessor
  std::uint64_t configs = 0;           ///< configurations received from the chain master
  /// `chain_hello`s refused because a live link holds the predecessor's member id
  /// (`chain_errc::member_id_in_use`, `chain_options::link_silence`). A `chain_hello` whose TLS
  /// certificate names another member (docs/security.md, identities) is refused as any
  /// misbehaving connection and counted in `server_stats::rejected`, not here.
  std::uint64_t claims_refused = 0;

  /// Calls `f(name, value)` for every counter above, in declaration order; `name` is the
  /// member's name (a `const char*`), `value` a `std::uint64_t` count. For reports that need
  /// no list of this policy's counters.
  template <class F>
  void for_each_counter(F&& f) const {
    f("entries", entries);
    f("duplicates", duplicates);
    f("resent", resent);
    f("states_sent", states_sent);
    f("states_installed", states_installed);
    f("configs", configs);
    f("claims_refused", claims_refused);
  }
  /// Adds `o`'s counters (the totals of several servers). Every counter is a count.
  chain_stats& operator+=(const chain_stats& o) noexcept {
    entries += o.entries;
    duplicates += o.duplicates;
    resent += o.resent;
    states_sent += o.states_sent;
    states_installed += o.states_installed;
    configs += o.configs;
    claims_refused += o.claims_refused;
    return *this;
  }
};

}  // namespace asyncps::recovery
