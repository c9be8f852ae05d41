// asyncps — recovery::stateless: workers train through a server outage (paper A).
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>
#include <system_error>

#include "asyncps/recovery.hpp"
#include "asyncps/recovery/stateless/options.hpp"
#include "asyncps/recovery/stateless/server_part.hpp"
#include "asyncps/recovery/stateless/worker_part.hpp"

namespace asyncps::recovery {

/// The *stateless parameter server* of Cao et al., "Training Through Failure" (paper A):
/// the server's state can always be rebuilt from the workers.
///
/// * While a shard is unreachable a worker keeps computing on its cached rows, applies its
///   own updates to them (`worker_options::local_step`), and adds each clock's gradient to
///   one backlog buffer per row range (memory stays bounded however long the outage). It is
///   never idle: the other shards keep being pushed and pulled as usual.
/// * It reconnects with backoff. A server that comes back *without state* (a fresh process:
///   it has applied nothing but meets a worker whose clock is > 0) asks for replicas in its
///   welcome; the first worker's cached rows rebuild each table, and that worker's backlog is
///   already part of them. A server that comes back *with state* (restored by the user, e.g.
///   from its own checkpoint via `basic_server::restore_state`) rebuilds nothing.
/// * Every other backlog is merged once, with `stateless_options::rule`.
/// * A server that kept its state but misses pushes that were on the wire when the link
///   dropped (its welcome's applied counts say so) gets their gradients in the backlog.
///
/// Promise: every delta a worker computes while a shard is down is applied exactly once (a
/// worker finishing its run during an outage waits, within `reconnect_timeout`, to deliver
/// it). A server rebuilt *without state* lacks the pushes the dead server applied after the
/// installed replica's last read of them: at most s+1 clocks per other worker under SSP(s)
/// (tests/unit/recovery_test.cpp measures this). Cost: one float per parameter of backlog
/// memory per worker during an outage, one replica message per table on restart.
/// Optimizer state (momentum, Adam moments) is not replicated and restarts at zero.
struct stateless {
  static constexpr std::string_view name = "stateless";

  using server_part = stateless_server_part;
  using worker_part = stateless_worker_part;
};

static_assert(recovery_policy<stateless>);

}  // namespace asyncps::recovery
