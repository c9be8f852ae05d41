// asyncps bench — result rows: medians, the stdout table and the JSON file.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
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
  std::string op;         ///< push, pull, push+pull, push-rtt, pull-rtt, one-way, rtt
  std::size_t size = 0;   ///< payload bytes per message
  unsigned window = 0;    ///< requests in flight per connection
  unsigned workers = 0;   ///< concurrent client connections
  std::string unit;       ///< "MB/s" (1e6 bytes/s, payload only) or "us" (median round trip)
  summary value;          ///< over the repetitions
  double ratio = 0.0;     ///< value.median / the raw baseline of the same size and unit
};

inline std::string size_text(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 20) && bytes % (std::size_t{1} << 20) == 0)
    return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

inline void print_table_header() {
  std::printf("%-10s %-9s %7s %6s %7s %10s %-4s %7s   %s\n", "transport", "op", "size", "window",
              "workers", "median", "unit", "vs raw", "min..max");
  std::printf("%s\n", std::string(88, '-').c_str());
}

inline void print_row(const row& r) {
  char ratio[32] = "-";
  if (r.ratio > 0.0) std::snprintf(ratio, sizeof ratio, "%.2fx", r.ratio);
  const char* fmt = r.unit == "us" ? "%-10s %-9s %7s %6u %7u %10.1f %-4s %7s   %.1f..%.1f\n"
                                   : "%-10s %-9s %7s %6u %7u %10.0f %-4s %7s   %.0f..%.0f\n";
  std::printf(fmt, r.transport.c_str(), r.op.c_str(), size_text(r.size).c_str(), r.window,
              r.workers, r.value.median, r.unit.c_str(), ratio, r.value.min, r.value.max);
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
                 "    {\"transport\": \"%s\", \"op\": \"%s\", \"size\": %zu, \"window\": %u, "
                 "\"workers\": %u, \"unit\": \"%s\", \"median\": %.3f, \"min\": %.3f, "
                 "\"max\": %.3f, \"ratio_to_raw\": %.4f}%s\n",
                 r.transport.c_str(), r.op.c_str(), r.size, r.window, r.workers, r.unit.c_str(),
                 r.value.median, r.value.min, r.value.max, r.ratio, i + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  return std::fclose(f) == 0;
}

}  // namespace asyncps::bench
