// asyncps — detail: a connection's peer address for log lines, when its transport knows one.
#pragma once

#include <string>

namespace asyncps::detail {

/// " (from HOST:PORT)" when `c.remote_endpoint()` exists and yields an address with a port
/// (TCP), else "". Used to name unauthenticated or unidentified peers in logs.
template <class C>
std::string peer_address(const C& c) {
  if constexpr (requires {
                  c.remote_endpoint().address().to_string();
                  c.remote_endpoint().port();
                }) {
    const auto ep = c.remote_endpoint();
    return " (from " + ep.address().to_string() + ":" + std::to_string(ep.port()) + ")";
  } else {
    return {};
  }
}

}  // namespace asyncps::detail
