// asyncps — recovery::chain_replication, server part: the chain protocol of one member.
#pragma once

#include "asyncps/recovery/chain/options.hpp"

namespace asyncps::recovery {

/// recovery::chain_replication, server part: options and counters. Thread safety: on the server's
/// executor.
template <chain_mode Mode>
struct chain_server_part {
  chain_options options{};
};

}  // namespace asyncps::recovery
