// asyncps — detail: text for log lines and error details (endpoints, table layouts).
#pragma once

#include <algorithm>
#include <cstddef>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>

#include "asyncps/layout.hpp"

namespace asyncps {

namespace detail {
/// An endpoint as text for log lines: a string as is, a type with `operator<<` (e.g.
/// `asio::ip::tcp::endpoint`: "127.0.0.1:7000") as it prints, anything else as "endpoint".
template <class Endpoint>
std::string endpoint_string(const Endpoint& e) {
  if constexpr (std::is_convertible_v<const Endpoint&, std::string_view>) {
    return std::string(std::string_view(e));
  } else if constexpr (requires(std::ostream& os) { os << e; }) {
    std::ostringstream os;
    os << e;
    return os.str();
  } else {
    return "endpoint";
  }
}

/// Text a peer sent (an error frame's reason, ...) made safe for one log line: at most
/// `max_bytes` bytes of `s` are shown, every byte outside printable ASCII (control characters,
/// newlines, escape sequences, bytes >= 0x7f) and the backslash appear as `\xNN`, and a cut
/// text ends with "... (N bytes)" giving the full length. The result is at most
/// 4 x `max_bytes` + 32 bytes long, whatever `s` holds. Complexity: O(min(|s|, max_bytes)).
/// Thread safety: pure.
inline std::string peer_text(std::string_view s, std::size_t max_bytes = 200) {
  static constexpr char hex[] = "0123456789abcdef";
  const std::size_t n = std::min(s.size(), max_bytes);
  std::string out;
  out.reserve(n + 32);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 0xf];
    }
  }
  if (n < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

/// "N tables" (or "1 table") of a layout, for messages naming a layout difference.
inline std::string layout_string(std::span<const table_spec> l) {
  std::string out = std::to_string(l.size()) + (l.size() == 1 ? " table" : " tables");
  return out;
}

/// The differences between layouts `a` (called `a_name`) and `b` (`b_name`): the table counts
/// when they differ, then each table whose rows or width differ, with both sides' rows x
/// width, e.g. "table 1: worker 100 x 8, server 100 x 16". Empty when they are equal.
inline std::string layout_difference(std::span<const table_spec> a, const char* a_name,
                                     std::span<const table_spec> b, const char* b_name) {
  std::string out;
  const auto sep = [&] {
    if (!out.empty()) out += "; ";
  };
  if (a.size() != b.size()) {
    out = std::string(a_name) + " has " + layout_string(a) + ", " + b_name + " has " +
          layout_string(b);
  }
  for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const auto side = [](std::span<const table_spec> l, std::size_t t) {
      return t < l.size() ? std::to_string(l[t].rows) + " x " + std::to_string(l[t].width)
                          : std::string("none");
    };
    if (i < a.size() && i < b.size() && a[i].rows == b[i].rows && a[i].width == b[i].width)
      continue;
    sep();
    out += "table " + std::to_string(i) + ": " + a_name + " " + side(a, i) + ", " + b_name + " " +
           side(b, i);
  }
  return out;
}
}  // namespace detail

}  // namespace asyncps
