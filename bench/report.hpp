// asyncps bench — result rows: medians, the stdout table and the JSON file.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

namespace asyncps::bench {

/// The 1-minute load average (Linux), to show how busy the machine was; -1 when unknown.
inline double load_average() {
  double load = -1.0;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1.0;
    std::fclose(f);
  }
  return load;
}

/// CPU seconds the calling thread has used (user + system, CLOCK_THREAD_CPUTIME_ID).
inline double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

/// Pins the calling thread to CPU `cpu` (`--cpu` lists); a negative `cpu` does nothing.
/// Returns false (and prints why) when the kernel refuses, e.g. a CPU outside the cpuset.
inline bool pin_current_thread(int cpu) {
  if (cpu < 0) return true;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (const int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set); rc != 0) {
    std::fprintf(stderr, "cannot pin a thread to CPU %d (error %d)\n", cpu, rc);
    return false;
  }
  return true;
}

/// The `q`-quantile (0..1, nearest rank) of `v`; 0 when empty.
inline double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  const double rank = std::ceil(q * static_cast<double>(v.size()));  // 1-based
  const auto k =
      static_cast<std::size_t>(std::clamp(rank - 1.0, 0.0, static_cast<double>(v.size() - 1)));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

/// Median of `v` (mean of the two middle values for an even count); 0 when empty.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  if (v.size() % 2 == 1) return *mid;
  const double hi = *mid;
  const double lo = *std::max_element(v.begin(), mid);
  return (lo + hi) / 2.0;
}

/// Medians and spread of one measured configuration over its repetitions.
struct summary {
  double median = 0.0;
  double min = 0.0;
  double max = 0.0;
};

inline summary summarize(const std::vector<double>& reps) {
  if (reps.empty()) return {};
  return {median(reps), *std::min_element(reps.begin(), reps.end()),
          *std::max_element(reps.begin(), reps.end())};
}

/// One line of the report.
struct row {
  std::string transport;  ///< "raw-tcp", "tcp", "in-process"
  /// push, pull, push+pull, push-rtt, pull-rtt (protocol client); clock, clock-rtt (through
  /// basic_worker); one-way, req-reply, exchange, rtt, exchange-rtt (raw sockets)
  std::string op;
  std::size_t size = 0;          ///< payload bytes per message
  unsigned window = 0;           ///< requests in flight per connection
  unsigned workers = 0;          ///< concurrent client connections
  std::string unit;              ///< "MB/s" (1e6 bytes/s, payload only) or "us" (median round trip)
  summary value;                 ///< over the repetitions
  double ratio = 0.0;            ///< value.median / the raw baseline of the same size and unit
  std::string api = "protocol";  ///< "protocol" (bench/client.hpp), "worker" (basic_worker), "raw"
  double p99 = 0.0;              ///< "us" rows: 99th percentile over every sample (0: none)
  /// "MB/s" rows: requests (protocol), clocks (worker) or messages (raw) per second, median.
  double ops_per_s = 0.0;
  /// CPU time of the server's and the client's (worker's) thread per payload byte moved, ns;
  /// 0: not measured.
  double server_ns_per_byte = 0.0;
  double client_ns_per_byte = 0.0;
};

inline std::string size_text(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 20) && bytes % (std::size_t{1} << 20) == 0)
    return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

inline void print_table_header() {
  std::printf("%-8s %-12s %-12s %7s %6s %7s %10s %-4s %7s %8s %11s   %s\n", "api", "transport",
              "op", "size", "window", "workers", "median", "unit", "vs raw", "p99|ops",
              "cpu ns/B s+c", "min..max");
  std::printf("%s\n", std::string(120, '-').c_str());
}

inline void print_row(const row& r) {
  char ratio[32] = "-";
  if (r.ratio > 0.0) std::snprintf(ratio, sizeof ratio, "%.2fx", r.ratio);
  char p99[32] = "-";  // p99 for round trips; operations per second for throughput rows
  if (r.p99 > 0.0) std::snprintf(p99, sizeof p99, "%.1f", r.p99);
  if (r.ops_per_s > 0.0) std::snprintf(p99, sizeof p99, "%.0f/s", r.ops_per_s);
  char cpu[48] = "-";
  if (r.server_ns_per_byte > 0.0 || r.client_ns_per_byte > 0.0)
    std::snprintf(cpu, sizeof cpu, "%.2f+%.2f", r.server_ns_per_byte, r.client_ns_per_byte);
  const char* fmt = r.unit == "us"
                        ? "%-8s %-12s %-12s %7s %6u %7u %10.1f %-4s %7s %8s %11s   %.1f..%.1f\n"
                        : "%-8s %-12s %-12s %7s %6u %7u %10.0f %-4s %7s %8s %11s   %.0f..%.0f\n";
  std::printf(fmt, r.api.c_str(), r.transport.c_str(), r.op.c_str(), size_text(r.size).c_str(),
              r.window, r.workers, r.value.median, r.unit.c_str(), ratio, p99, cpu, r.value.min,
              r.value.max);
  std::fflush(stdout);
}

/// Writes `rows` as a JSON array of objects. Returns false when the file cannot be written.
inline bool write_json(const std::string& path, const std::vector<row>& rows,
                       const std::string& meta) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  std::fprintf(f, "{\n  \"meta\": %s,\n  \"rows\": [\n", meta.c_str());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    std::fprintf(f,
                 "    {\"api\": \"%s\", \"transport\": \"%s\", \"op\": \"%s\", \"size\": %zu, "
                 "\"window\": %u, \"workers\": %u, \"unit\": \"%s\", \"median\": %.3f, "
                 "\"min\": %.3f, \"max\": %.3f, \"p99\": %.3f, \"ops_per_s\": %.1f, "
                 "\"ratio_to_raw\": %.4f, "
                 "\"server_cpu_ns_per_byte\": %.4f, \"client_cpu_ns_per_byte\": %.4f}%s\n",
                 r.api.c_str(), r.transport.c_str(), r.op.c_str(), r.size, r.window, r.workers,
                 r.unit.c_str(), r.value.median, r.value.min, r.value.max, r.p99, r.ops_per_s,
                 r.ratio, r.server_ns_per_byte, r.client_ns_per_byte,
                 i + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  return std::fclose(f) == 0;
}

}  // namespace asyncps::bench
