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
  /// (`errc::member_id_in_use`, `chain_options::link_silence`).
  std::uint64_t claims_refused = 0;
};

}  // namespace asyncps::recovery
