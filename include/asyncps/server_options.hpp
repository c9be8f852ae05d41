// asyncps — the configuration and the counters of one parameter-server shard
// (`basic_server`, server.hpp), and the layout check of its options against a model.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "asyncps/detail/text.hpp"
#include "asyncps/layout.hpp"
#include "asyncps/log.hpp"

namespace asyncps {

/// Elastic membership of the workers (`server_options::elastic`): workers join and leave a
/// running job, and the server clock, hence every BSP/SSP/ESSP bound, is the minimum clock over
/// the live members only. A worker joins with its hello (a new id, or an id that left before:
/// it starts at the server clock, never behind it, and the welcome tells it so); it leaves by
/// saying `bye` (its run ended) or when its connection has been gone for `grace` (killed, or
/// its host lost), unless it said hello again within it (then it keeps its place and clock).
struct membership_options {
  /// The server clock does not advance until this many workers have joined (a start barrier,
  /// so that the first worker to connect does not train alone; 0 or 1: none). Afterwards any
  /// number of live members trains.
  std::uint32_t start_members = 1;
  /// How long a member's connection may be gone before it leaves (a reconnect within it keeps
  /// its place). Checked by the server's sweeper timer, at most 1/8 of it late.
  std::chrono::milliseconds grace{std::chrono::seconds(3)};
};

/// Configuration of one server shard.
struct server_options {
  std::uint32_t shard = 0;           ///< this shard's index, < num_shards
  std::uint32_t num_shards = 1;      ///< servers sharing the tables
  std::uint32_t num_workers = 1;     ///< workers in the vector clock (ids 0..num_workers-1)
  std::vector<table_spec> tables{};  ///< the model layout (every shard and worker has the same)
  std::uint64_t seed = 42;           ///< initial-value seed (see table_spec::init_scale)
  /// Pulls one connection may have waiting for the server clock; one more is a protocol
  /// violation (`errc::too_many_requests`) that closes that connection.
  std::uint32_t max_pending_pulls = 256;
  /// Messages queued to one connection that it has not read yet; beyond this the peer is too
  /// slow (or not reading) and its connection is closed, so it cannot grow server memory.
  std::uint32_t max_queued_messages = 4096;
  std::uint64_t max_queued_bytes = std::uint64_t{256} << 20;  ///< same, in payload bytes
  /// Server-wide budget of queued outgoing payload bytes: the sum over all connections of the
  /// messages queued and not yet written (replies, acks, eager rows, errors; recovery links'
  /// messages count too). When queuing a message to a worker or an unidentified connection
  /// would exceed it, the connection holding the largest queue (it is the one not reading; a
  /// recovery peer's is never chosen) is closed at once, logged with its address and the
  /// figures and counted in `server_stats::over_budget_closes`, until the message fits; a
  /// message larger than the whole budget closes its own connection. A message is never
  /// dropped for a connection that stays open. Size it above `num_workers` x the largest
  /// reply when every worker may wait for the same clock (BSP): their replies are queued
  /// together when the clock advances. docs/security.md, "Resource budget".
  std::uint64_t max_total_queued_bytes = std::uint64_t{1} << 30;
  /// Server-wide bound on the key bytes of the sparse pulls waiting for the server clock, over
  /// all connections (a ranged pull has no keys and counts 0). A pull that would exceed it is
  /// refused with `errc::too_many_requests`, naming the figures, and its connection closed,
  /// as for `max_pending_pulls`. A worker waits for at most one clock with a handful of pulls,
  /// so a real run stays far below it. docs/security.md, "Resource budget".
  std::uint64_t max_total_pending_pull_bytes = std::uint64_t{256} << 20;
  /// How long a connection may take from its accept to a valid first message: a worker's
  /// `hello`, or a recovery peer's first message (the transport's authentication handshake
  /// counts in it, see `tcp_options::auth_timeout`). Past it the connection is refused with
  /// `errc::timeout` (logged with its address, counted in `server_stats::rejected`). 0: no
  /// limit. Checked by one timer per server, armed only while a connection waits for its
  /// first message or a write is in progress; a connection is closed at most 1/8 of the
  /// smaller timeout late.
  std::chrono::milliseconds hello_timeout{std::chrono::seconds(10)};
  /// Who keeps a worker id when a second hello names it while a connection holds it. The
  /// newcomer takes the id over (the old connection gets `errc::duplicate_worker` and is
  /// closed) when it is the same worker process (the same hello `incarnation`: its old
  /// connection is half-open) or when the holder has sent nothing for this long (its process
  /// or host is gone); otherwise the newcomer is refused with the transient
  /// `errc::worker_id_in_use` and the live worker trains on (a worker retries such a
  /// refusal). So one hello cannot end a live worker's run. A worker that waits for a pull
  /// or computes longer than this sends nothing meanwhile: keep it above
  /// `worker_options::wait_timeout` (60 s) and the longest clock. 0: any hello takes over.
  std::chrono::milliseconds takeover_silence{std::chrono::seconds(60)};
  /// How long one message's write to a worker or an unidentified connection may take: a peer
  /// that has stopped reading (its receive window stays closed) is closed at once when a write
  /// has not completed for this long (logged with its address and its queue, counted in
  /// `server_stats::rejected`). Time between messages does not count: a worker may compute
  /// for minutes between requests. A worker that computes on its I/O thread (no compute
  /// executor) longer than this while the server has more than a socket buffer of messages
  /// for it (ESSP eager rows, heartbeat reports) is closed too. Not armed on a transport whose
  /// sends complete at once (the simulated transport, docs/concepts/transport.md). 0: no
  /// limit.
  std::chrono::milliseconds send_timeout{std::chrono::seconds(60)};
  log_function log{};  ///< connection events and rejected frames
  /// Called on the server's executor each time the server clock advances, with the new
  /// clock (progress, evaluation, a group server's central link). May be empty.
  std::function<void(clock_value)> on_clock{};
  /// How often the server's watchdog reports what blocks progress (0: never): workers that
  /// have not connected yet ("waiting for workers 2, 3 to connect (2 of 4 connected)"), and,
  /// when a pull has waited this long for the server clock, the worker that holds the clock
  /// back (logged, and sent to every waiting worker as a heartbeat report, see
  /// `protocol::report`). One timer per server, none per pull; it stops ticking while nothing
  /// waits (so a simulation still becomes quiescent).
  std::chrono::milliseconds watchdog_interval{std::chrono::seconds(5)};
  /// How often the server gives back to the heap the pooled buffers its transport keeps
  /// cached beyond what the last interval used (transports with `trim_pools()`, such as
  /// `tcp_transport`; `buffer_pool::trim`): a burst (an attack's frames, a one-off large
  /// message) is returned within two intervals, a steady working set stays cached. One timer
  /// per server. 0: never (the pools' budgets still bound what they keep).
  std::chrono::milliseconds pool_trim_interval{std::chrono::seconds(10)};
  /// Elastic membership (see `membership_options`). Unset (the default): every id in
  /// [0, num_workers) is a member from the start and for good, and the server clock waits for
  /// each (a dead worker stalls BSP/SSP until it comes back). Set: `num_workers` is the
  /// capacity (the ids accepted); the members are the workers that said hello and have not
  /// left. Elastic membership needs recovery policy `none` (the constructor throws
  /// `std::invalid_argument` otherwise): the other policies' state transfers and replays carry
  /// a fixed membership.
  std::optional<membership_options> elastic{};
  /// Defence against a faulty or hostile worker: the largest L2 norm of one push's payload
  /// (the gradient as the worker sent it, before the optimizer's learning rate; a stateless
  /// backlog's delta after its merge scale), over the push's whole payload. A push above it is
  /// refused whole with `errc::update_too_large` (nothing applied, the connection closed), so
  /// finite but huge updates (in issue 32, 17 finite pushes put every parameter at 2.89e38,
  /// after which every worker computed NaN) cannot reach the parameters. Deterministic: every chain
  /// member and replica-log replay refuses the same pushes. 0 (the default): no bound. Cost: one
  /// pass over each push's floats, in double precision. Size it well above the norms a healthy run
  /// pushes (e.g. 100x the largest seen in a trial run): a clipped honest push ends its
  /// worker's run.
  double max_update_norm = 0;
  /// Defence against a faulty or hostile worker, second line: after every applied update the
  /// values of the rows it touched are clipped to [-max_parameter_value,
  /// max_parameter_value] (parameter clipping; counted in `server_stats::clipped_values`), so
  /// that no sequence of accepted pushes can take a parameter beyond it, whatever their
  /// norms. Applies to every optimizer (the optimizer's state is not clipped).
  /// Deterministic: chain members and replica-log replays clip the same values. 0 (the
  /// default): no clipping. Cost: one pass over the updated rows' values. Size it well above
  /// the values a healthy model holds: a clipped honest parameter changes training.
  float max_parameter_value = 0;
};

/// Counters of a server (read on its executor).
struct server_stats {
  std::uint64_t connections = 0;  ///< connections accepted
  /// Connections refused or closed for misbehaving: a protocol violation, a failed
  /// authentication, no first message within `hello_timeout`, a write stalled past
  /// `send_timeout`.
  std::uint64_t rejected = 0;
  std::uint64_t pushes = 0;          ///< push messages applied
  std::uint64_t pulls = 0;           ///< pull requests answered
  std::uint64_t deferred_pulls = 0;  ///< pulls that had to wait for the clock
  std::uint64_t eager_messages = 0;  ///< rows messages pushed unrequested (ESSP)
  std::uint64_t bytes_in = 0;        ///< payload bytes received
  std::uint64_t bytes_out = 0;       ///< payload bytes sent
  std::uint64_t rejoins = 0;         ///< hellos from workers ahead of their clock here
  /// Hellos that took a worker id over from another connection (the same worker process
  /// reconnecting while its old connection was not yet seen to be dead, or any hello once the
  /// holder was silent for `takeover_silence`); the old one is closed. A hello refused with
  /// `errc::worker_id_in_use` instead counts in `rejected`.
  std::uint64_t takeovers = 0;
  /// Connections closed because queuing a message would have exceeded
  /// `server_options::max_total_queued_bytes` (see there).
  std::uint64_t over_budget_closes = 0;
  /// Parameter values clipped to `server_options::max_parameter_value` (see there).
  std::uint64_t clipped_values = 0;
  /// Elastic membership: workers that became members (a first hello, or a hello after they
  /// left), and members that left (a `bye`, or their connection gone for `grace`).
  std::uint64_t joins = 0;
  std::uint64_t departures = 0;
  /// Reader sessions greeted (`protocol::reader_id`), and the pulls they made (not counted in
  /// `pulls`).
  std::uint64_t readers = 0;
  std::uint64_t reader_pulls = 0;
  // The recovery policy's counters are in its server part: `basic_server::recovery().stats()`.
};

namespace detail {

/// Fills `o.tables` from a model's `layout` when it is empty, or checks that it equals it.
/// Throws `std::invalid_argument` naming each differing table (both sides' rows x width).
inline server_options with_layout(std::span<const table_spec> layout, server_options o) {
  if (o.tables.empty()) {
    o.tables.assign(layout.begin(), layout.end());
    return o;
  }
  std::string diff = layout_difference(o.tables, "server_options", layout, "model");
  if (diff.empty()) {
    for (std::size_t i = 0; i < layout.size(); ++i)
      if (!(o.tables[i] == layout[i]))
        diff += (diff.empty() ? "" : "; ") + std::string("table ") + std::to_string(i) +
                ": id or init_scale differ";
  }
  if (!diff.empty())
    throw std::invalid_argument(
        "asyncps::basic_server: server_options::tables differs from the model's layout (" + diff +
        ")");
  return o;
}

}  // namespace detail
}  // namespace asyncps
