// Test helper: log lines collected from a `log_function`, and searching them.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace asyncps::test {

/// The lines a test's `log_function` collected, in order.
using log_lines = std::vector<std::string>;

/// Whether some line of `ls` contains `needle`.
inline bool any_line_has(const log_lines& ls, std::string_view needle) {
  return std::any_of(ls.begin(), ls.end(),
                     [&](const std::string& l) { return l.find(needle) != std::string::npos; });
}

/// The lines of `ls`, each ended by a newline (for a failure message).
inline std::string joined(const log_lines& ls) {
  std::string out;
  for (const auto& l : ls) out += l + "\n";
  return out;
}

}  // namespace asyncps::test
