// fashion_mnist — the one place the trainer names a concrete recovery policy (train_*.cpp
// only pick the type a --recovery flag runs). For each policy, `recovery_flags<Recovery>` maps
// the command line onto its parts and says what the trainer does differently for it;
// trainer.hpp uses the same members for every policy:
//
//   server_part(c, shard), worker_part(c)  the policy's parts, configured from the flags
//   servers_per_shard(c)     servers per shard (--connect lists them shard-major)
//   counts_acknowledged      whether the workers count how many of the pushes lost with a
//                            shard had been acknowledged (worker_stats::lost_acknowledged)
//   holds_final_model(part)  whether the server with that part holds the final model
//   server_extras<Server>    the run's companion of this process's servers, constructed from
//                            the config: `starts_servers` (constexpr): true: `start(setup,
//                            optimizer)` starts them (false: cannot); false: the trainer starts
//                            them, calling `prepare(part)` (returns the tick for
//                            serve_until_done, may be empty) before constructing each and
//                            `attach(server)` after; `stop()` once every worker is done,
//                            before the servers stop
//   reports                  whether the run ends with a recovery summary (none: no)
//   report(r, servers, workers, summary)  prints the policy's own summary line and adds its
//                            keys to the JSON summary; false: it has none, and the trainer
//                            prints the line every policy shares
//
// The policies' counters need no entry here: the trainer sums and lists them generically
// (the stats' `operator+=` and `for_each_counter`).
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>
#include <string_view>
#include <utility>

#include "asyncps/asyncps.hpp"
#include "asyncps/recovery/replica_log.hpp"
#include "chain_servers.hpp"
#include "config.hpp"
#include "replica_log_report.hpp"
#include "server_setup.hpp"

namespace fashion {

/// What a policy's `report` is given besides the servers and workers of this process.
struct report_context {
  const config& c;
  std::string_view name;                 ///< the policy's name (`Recovery::name`)
  const asyncps::worker_stats& workers;  ///< the counters of this process's workers, summed
  double busy;                           ///< percent of the workers' time spent computing
};

/// `server_extras` of a policy whose servers the trainer starts with nothing around them.
template <class Server>
struct no_server_extras {
  static constexpr bool starts_servers = false;
  explicit no_server_extras(const config&) {}
  std::function<void(bool)> prepare(typename Server::recovery_type::server_part&) { return {}; }
  void attach(const Server&) {}
  void stop() {}
};

/// What every policy gets unless its `recovery_flags` says otherwise (see the top of the file).
template <class Recovery>
struct recovery_flag_defaults {
  static typename Recovery::server_part server_part(const config&, std::uint32_t /*shard*/) {
    return {};
  }
  static typename Recovery::worker_part worker_part(const config&) { return {}; }
  static std::uint32_t servers_per_shard(const config&) { return 1; }
  static constexpr bool counts_acknowledged = false;
  static bool holds_final_model(const typename Recovery::server_part&) { return true; }
  template <class Server>
  using server_extras = no_server_extras<Server>;
  static constexpr bool reports = true;
  template <class Servers, class Workers>
  static bool report(const report_context&, const Servers&, const Workers&, nlohmann::json&) {
    return false;
  }
};

/// A policy's flags (the defaults unless specialized below).
template <class Recovery>
struct recovery_flags : recovery_flag_defaults<Recovery> {};

/// --reconnect-timeout (seconds): how long a worker tries to reach a lost server again.
inline std::chrono::milliseconds reconnect_timeout(const config& c) {
  return std::chrono::milliseconds(static_cast<long long>(c.reconnect_timeout * 1000));
}

/// --recovery none: nothing to configure, nothing to report.
template <>
struct recovery_flags<asyncps::recovery::none> : recovery_flag_defaults<asyncps::recovery::none> {
  static constexpr bool reports = false;
};

/// --recovery checkpoint: --checkpoint-dir, --checkpoint-every (clocks), --checkpoint-seconds,
/// --checkpoint-overhead (the adaptive interval's target, when neither of the two is set);
/// the server part logs on stderr. Workers: --reconnect-timeout.
template <>
struct recovery_flags<asyncps::recovery::checkpoint>
    : recovery_flag_defaults<asyncps::recovery::checkpoint> {
  using policy = asyncps::recovery::checkpoint;
  static policy::server_part server_part(const config& c, std::uint32_t shard) {
    asyncps::recovery::checkpoint_options o;
    o.directory = c.checkpoint_dir;
    o.every_clocks = c.checkpoint_every;
    o.every_seconds = c.checkpoint_seconds;
    if (c.checkpoint_every == 0 && c.checkpoint_seconds <= 0)
      o.max_overhead = c.checkpoint_overhead;
    o.log = [shard](std::string_view line) {
      std::cerr << "server " << shard << ": " << line << '\n';
    };
    return policy::server_part(std::move(o));
  }
  static policy::worker_part worker_part(const config& c) {
    return policy::worker_part(reconnect_timeout(c));
  }
};

/// --recovery stateless: --merge (how a backlog is scaled when merged). Workers:
/// --reconnect-timeout.
template <>
struct recovery_flags<asyncps::recovery::stateless>
    : recovery_flag_defaults<asyncps::recovery::stateless> {
  using policy = asyncps::recovery::stateless;
  static policy::server_part server_part(const config& c, std::uint32_t /*shard*/) {
    policy::server_part p;
    using asyncps::recovery::merge_rule;
    p.options.rule = c.merge == "sum"               ? merge_rule::sum
                     : c.merge == "mean"            ? merge_rule::mean
                     : c.merge == "staleness-aware" ? merge_rule::staleness_aware
                                                    : merge_rule::lr_scaled;
    return p;
  }
  static policy::worker_part worker_part(const config& c) {
    policy::worker_part p;
    p.options.reconnect_timeout = reconnect_timeout(c);
    return p;
  }
};

/// --recovery chain and chain-relaxed: --replicas servers per shard, started by
/// `chain_servers` with a chain master; --replicate-every (relaxed: pushes between state
/// copies). The final model is the heads'. Strict mode counts acknowledged pushes lost with a
/// shard. Workers: --reconnect-timeout.
template <asyncps::recovery::chain_mode Mode>
struct recovery_flags<asyncps::recovery::chain_replication<Mode>>
    : recovery_flag_defaults<asyncps::recovery::chain_replication<Mode>> {
  using policy = asyncps::recovery::chain_replication<Mode>;
  static typename policy::server_part server_part(const config& c, std::uint32_t /*shard*/) {
    typename policy::server_part p;
    p.options.replicate_every = c.replicate_every;
    return p;
  }
  static typename policy::worker_part worker_part(const config& c) {
    typename policy::worker_part p;
    p.options.reconnect_timeout = reconnect_timeout(c);
    return p;
  }
  static std::uint32_t servers_per_shard(const config& c) { return c.replicas; }
  static constexpr bool counts_acknowledged = Mode == asyncps::recovery::chain_mode::strict;
  static bool holds_final_model(const typename policy::server_part& p) { return p.is_head(); }
  template <class Server>
  using server_extras = chain_servers<Server>;
};

/// --recovery replica-log: --replica-interval (clocks between state replicas),
/// --replica-ordering (write-ahead or apply-first), --replica-log-budget (shard states per
/// worker's log), --replica-ack-delay (ms, apply-first); --role server
/// --server-report FILE: the server reports its rebuilds (`replica_log_servers`). Its summary
/// line is its own (`report_replica_log`). Workers: --reconnect-timeout.
template <>
struct recovery_flags<asyncps::recovery::replica_log>
    : recovery_flag_defaults<asyncps::recovery::replica_log> {
  using policy = asyncps::recovery::replica_log;
  static policy::server_part server_part(const config& c, std::uint32_t /*shard*/) {
    policy::server_part p;
    p.options.replica_interval = static_cast<asyncps::clock_value>(c.replica_interval);
    p.options.ordering = ordering(c);
    p.options.log_budget = c.replica_log_budget;
    p.options.ack_delay = std::chrono::milliseconds(c.replica_ack_delay_ms);
    return p;
  }
  static policy::worker_part worker_part(const config& c) {
    policy::worker_part p;
    p.options.reconnect_timeout = reconnect_timeout(c);
    p.options.ordering = ordering(c);  // both parts take the same ordering and ack delay
    p.options.ack_delay = std::chrono::milliseconds(c.replica_ack_delay_ms);
    return p;
  }
  static asyncps::recovery::replica_log_ordering ordering(const config& c) {
    return c.replica_ordering == "apply-first"
               ? asyncps::recovery::replica_log_ordering::apply_first
               : asyncps::recovery::replica_log_ordering::write_ahead;
  }
  template <class Server>
  using server_extras = replica_log_servers<Server>;
  template <class Servers, class Workers>
  static bool report(const report_context& r, const Servers& servers, const Workers& workers,
                     nlohmann::json& summary) {
    report_replica_log(r.c, r.name, r.workers, r.busy, servers, workers, summary);
    return true;
  }
};

}  // namespace fashion
