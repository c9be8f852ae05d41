// asyncps — the log sink type shared by servers, workers, chain masters and recovery policies.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

namespace asyncps {

/// A log sink: receives one complete line (no trailing newline). Empty: write to stderr.
/// Called on the executor of the object that logs (never concurrently for one object).
using log_function = std::function<void(std::string_view)>;

namespace detail {
/// Sends `line` to `f`, or to stderr when `f` is empty.
inline void emit(const log_function& f, const std::string& line) {
  if (f) {
    f(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}
}  // namespace detail

}  // namespace asyncps
