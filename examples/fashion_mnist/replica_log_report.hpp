// fashion_mnist — recovery::replica_log's part of the trainer's report (through
// `recovery_flags<replica_log>`, policy_flags.hpp): its rebuilds, counted by the servers (read
// in this process, or from the reports of the server processes, --server-report), and the
// pushes lost or applied twice, read from the shards' final states.
#pragma once

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "asyncps/asyncps.hpp"
#include "asyncps/recovery/replica_log.hpp"
#include "config.hpp"

namespace fashion {

/// What the `recovery::replica_log` shards did: their rebuilds, summed over servers (or over
/// the incarnations of a restarted server process), and the pushes their final states hold.
struct replica_log_totals {
  std::uint64_t rebuilds = 0;        ///< replica_log_stats::recoveries
  std::uint64_t replayed = 0;        ///< logged entries applied by the rebuilds
  std::uint64_t missing = 0;         ///< replica_log_stats::missing_positions
  std::uint64_t incomplete = 0;      ///< replica_log_stats::incomplete_recoveries
  std::uint64_t reordered = 0;       ///< replica_log_stats::reordered_recoveries
  std::uint64_t skipped_clocks = 0;  ///< replica_log_stats::skipped_clocks
  double max_seconds = 0;            ///< the longest rebuild (first hello to serving again)
  bool known = false;                ///< false: the servers are processes that did not report
  /// Per shard that reported its end: pushes applied per (worker, table), `shard_state::applied`
  /// (`applied[w * tables + t]`).
  std::map<std::uint32_t, std::vector<std::uint64_t>> applied;

  /// Adds the rebuild counters of one server part.
  void add(const asyncps::recovery::replica_log_stats& s) {
    rebuilds += s.recoveries;
    replayed += s.replayed;
    missing += s.missing_positions;
    incomplete += s.incomplete_recoveries;
    reordered += s.reordered_recoveries;
    skipped_clocks += s.skipped_clocks;
    max_seconds = std::max(max_seconds, s.last_recovery_seconds);
    known = true;
  }
};

/// replica-log, --role server --server-report FILE: appends one JSON line to FILE for each
/// rebuild of `server` (from the part's `on_rebuilt`, as it ends: a process killed with
/// SIGKILL cannot report at its end), and one when it stops serving with the pushes its state
/// holds per (worker, table) (role all with --kill-at reads them, `read_replica_log_reports`).
/// On the server's executor.
template <class Server>
class replica_log_reporter {
 public:
  explicit replica_log_reporter(std::string path) : path_(std::move(path)) {}
  replica_log_reporter(const replica_log_reporter&) = delete;
  replica_log_reporter& operator=(const replica_log_reporter&) = delete;

  /// The server to report on (set once it is constructed).
  void attach(const Server& s) { server_ = &s; }
  /// For the server part's `on_rebuilt`: reports the rebuild that just ended.
  std::function<void()> rebuilt() {
    return [this] { report_rebuild(); };
  }
  /// A tick for `serve_until_done`: reports the end.
  std::function<void(bool)> tick() {
    return [this](bool ended) {
      if (ended) report_end();
    };
  }

 private:
  // Appends the counters the rebuilds since the last report added (a server process rebuilds
  // at most once, at its start).
  void report_rebuild() {
    if (server_ == nullptr) return;
    const auto& st = server_->recovery().stats();
    if (st.recoveries == last_.recoveries) return;
    append({{"shard", server_->options().shard},
            {"pid", ::getpid()},
            {"recoveries", st.recoveries - last_.recoveries},
            {"replayed", st.replayed - last_.replayed},
            {"missing_positions", st.missing_positions - last_.missing_positions},
            {"incomplete_recoveries", st.incomplete_recoveries - last_.incomplete_recoveries},
            {"reordered_recoveries", st.reordered_recoveries - last_.reordered_recoveries},
            {"skipped_clocks", st.skipped_clocks - last_.skipped_clocks},
            {"seconds", st.last_recovery_seconds},
            {"position", st.position},
            {"stable", st.stable}});
    last_ = st;
  }
  void report_end() {
    if (server_ == nullptr) return;
    asyncps::shard_state state;
    server_->save_state(state);
    append({{"end", true},
            {"shard", server_->options().shard},
            {"pid", ::getpid()},
            {"tables", state.tables.size()},
            {"applied", state.applied}});
  }
  void append(const nlohmann::json& j) {
    std::ofstream out(path_, std::ios::app);
    out << j.dump() << std::endl;
    if (!out)
      std::fprintf(stderr, "server %u: --server-report: cannot write %s\n",
                   static_cast<unsigned>(server_->options().shard), path_.c_str());
  }

  std::string path_;
  const Server* server_ = nullptr;
  asyncps::recovery::replica_log_stats last_{};
};

/// Reads the reports the server processes appended to `path` (`replica_log_reporter`): sums
/// the rebuilds, and takes each shard's end record. Waits up to `wait` for an end record of
/// each of `shards` shards (a server process reports its end once its workers are gone).
inline replica_log_totals read_replica_log_reports(const std::string& path, std::uint32_t shards,
                                                   std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    replica_log_totals t;
    t.known = true;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        std::cerr << "fashion_mnist: " << path << ": not a server report: " << line << '\n';
        continue;
      }
      if (j.value("end", false)) {
        t.applied[j.value("shard", 0u)] = j.value("applied", std::vector<std::uint64_t>{});
        continue;
      }
      t.rebuilds += j.value("recoveries", std::uint64_t{0});
      t.replayed += j.value("replayed", std::uint64_t{0});
      t.missing += j.value("missing_positions", std::uint64_t{0});
      t.incomplete += j.value("incomplete_recoveries", std::uint64_t{0});
      t.reordered += j.value("reordered_recoveries", std::uint64_t{0});
      t.skipped_clocks += j.value("skipped_clocks", std::uint64_t{0});
      t.max_seconds = std::max(t.max_seconds, j.value("seconds", 0.0));
    }
    if (t.applied.size() >= shards || std::chrono::steady_clock::now() >= deadline) return t;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

/// The trainer's companion of replica-log servers (see `server_extras` in policy_flags.hpp):
/// under --role server --server-report FILE, the server it starts reports its rebuilds and
/// its end to FILE (`replica_log_reporter`). The trainer starts the servers.
template <class Server>
class replica_log_servers {
 public:
  static constexpr bool starts_servers = false;
  explicit replica_log_servers(const config& c) : c_(c) {}
  /// Before the server that gets `part` is constructed: returns the tick for
  /// `serve_until_done` (empty: none).
  std::function<void(bool)> prepare(typename Server::recovery_type::server_part& part) {
    if (c_.role != "server" || c_.server_report.empty()) return {};
    reporter_ = std::make_unique<replica_log_reporter<Server>>(c_.server_report);
    part.on_rebuilt = reporter_->rebuilt();
    return reporter_->tick();
  }
  /// Once the server is constructed.
  void attach(const Server& s) {
    if (reporter_) reporter_->attach(s);
  }
  /// Once every worker of this process is done: nothing to stop.
  void stop() {}

 private:
  const config& c_;
  std::unique_ptr<replica_log_reporter<Server>> reporter_;  // --role server --server-report
};

/// replica-log's summary: prints its line (rebuilds, what the workers held, pushes lost or
/// applied twice; e2e_recovery.sh and bench/swift_experiment.py read it) and adds its keys to
/// `summary`, the run's JSON summary. `name`: the policy's name; `ws`: the workers' counters
/// summed; `busy`: the workers' busy percentage; `servers`, `workers`: those of this process
/// (unique_ptrs to basic_server and basic_worker of recovery::replica_log).
template <class Servers, class Workers>
void report_replica_log(const config& c, std::string_view name, const asyncps::worker_stats& ws,
                        double busy, const Servers& servers, const Workers& workers,
                        nlohmann::json& summary) {
  // The rebuilds are counted by the servers: read them here when they run in this
  // process, else from the reports of the server processes (role all with --kill-at).
  replica_log_totals rb;
  if (!servers.empty()) {
    for (auto& s : servers) {
      rb.add(s->recovery().stats());
      asyncps::shard_state state;
      s->save_state(state);
      rb.applied[s->options().shard] = state.applied;
    }
  } else if (!c.server_report.empty()) {
    rb = read_replica_log_reports(c.server_report, c.servers, std::chrono::seconds(10));
  }
  // Pushes lost or applied twice, from the final shard states (replica-log resends what a
  // rebuilt shard lacks, so worker_stats::lost_pushes counts nothing under it). Both models
  // are dense: each clock of worker w pushes once to every (shard, table), so a final state
  // holds as many pushes of w per table as w completed clocks. Needs every shard's final
  // state and every worker in this process.
  std::uint64_t lost = 0, twice = 0;
  const bool counted = rb.applied.size() == c.servers && workers.size() == c.workers;
  for (const auto& [shard, applied] : rb.applied) {
    if (!counted) break;
    const std::size_t tables = applied.size() / c.workers;
    for (std::size_t i = 0; i < applied.size(); ++i) {
      const std::uint64_t pushed = workers[i / tables]->stats().clocks;
      lost += pushed > applied[i] ? pushed - applied[i] : 0;
      twice += applied[i] > pushed ? applied[i] - pushed : 0;
      if (pushed != applied[i])
        std::fprintf(stderr, "shard %u, worker %zu, table %zu: %llu pushes, %llu applied\n",
                     static_cast<unsigned>(shard), i / tables, i % tables,
                     static_cast<unsigned long long>(pushed),
                     static_cast<unsigned long long>(applied[i]));
    }
  }
  asyncps::recovery::replica_log_worker_stats wl;  // max_* fields: the most of one worker
  for (auto& w : workers) wl += w->recovery().stats();
  const auto u = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  const std::string policy(name);
  if (rb.known)
    std::printf("recovery %s: %llu rebuilds, %llu entries replayed, %llu positions missing, "
                "%llu incomplete, %llu reordered, ",
                policy.c_str(), u(rb.rebuilds), u(rb.replayed), u(rb.missing), u(rb.incomplete),
                u(rb.reordered));
  else
    std::printf("recovery %s: rebuilds counted by the server processes (--server-report), ",
                policy.c_str());
  std::printf("%llu bytes max log per worker, %llu bytes max replica per worker, %llu replicas "
              "stored, %llu reconnects, ",
              u(wl.max_log_bytes), u(wl.max_replica_bytes), u(wl.replicas_stored),
              u(ws.reconnects));
  if (counted)
    std::printf("%llu pushes lost, %llu applied twice", u(lost), u(twice));
  else
    std::printf("pushes lost not counted (no final state of every shard here)");
  std::printf("; %llu gradients, workers busy %.0f%%\n", u(ws.clocks), busy);
  if (rb.known) {
    summary["rebuilds"] = rb.rebuilds;
    summary["replayed"] = rb.replayed;
    summary["missing_positions"] = rb.missing;
    summary["incomplete_rebuilds"] = rb.incomplete;
    summary["reordered_rebuilds"] = rb.reordered;
    summary["skipped_clocks"] = rb.skipped_clocks;
    summary["max_rebuild_s"] = rb.max_seconds;
  }
  if (counted) {
    summary["lost_pushes"] = lost;
    summary["pushes_applied_twice"] = twice;
  } else {
    summary.erase("lost_pushes");
  }
  summary["max_log_bytes"] = wl.max_log_bytes;
  summary["max_replica_bytes"] = wl.max_replica_bytes;
  summary["replicas_stored"] = wl.replicas_stored;
  summary["entries_resent"] = wl.replayed;
  summary["orders"] = wl.orders;
}

}  // namespace fashion
