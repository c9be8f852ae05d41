// asyncps — detail: a connection's peer address (and TLS failure reason) for log lines, when
// its transport knows them.
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

/// The host part of `c.remote_endpoint()` as text, when the connection has one (TCP): an IPv4
/// address as "a.b.c.d" (also one that arrived IPv4-mapped on an IPv6 socket), an IPv6 address
/// without brackets. "" when the transport knows no peer address, or it is unspecified.
template <class C>
std::string peer_host(const C& c) {
  if constexpr (requires {
                  c.remote_endpoint().address().to_string();
                  c.remote_endpoint().address().is_unspecified();
                }) {
    const auto a = c.remote_endpoint().address();
    if (a.is_unspecified()) return {};
    if constexpr (requires {
                    a.is_v6();
                    a.to_v6().is_v4_mapped();
                    a.to_v6().to_bytes();
                  }) {
      if (a.is_v6() && a.to_v6().is_v4_mapped()) {
        const auto b = a.to_v6().to_bytes();
        return std::to_string(b[12]) + "." + std::to_string(b[13]) + "." + std::to_string(b[14]) +
               "." + std::to_string(b[15]);
      }
    }
    return a.to_string();
  } else {
    return {};
  }
}

/// " (TLS: REASON)" when `c.tls_failure()` exists and names a reason (a TLS handshake failure
/// of the TCP transport), else "". For the log line of a refused connection.
template <class C>
std::string tls_failure_note(const C& c) {
  if constexpr (requires { std::string(c.tls_failure()); }) {
    std::string reason(c.tls_failure());
    return reason.empty() ? std::string{} : " (TLS: " + reason + ")";
  } else {
    return {};
  }
}

}  // namespace asyncps::detail
