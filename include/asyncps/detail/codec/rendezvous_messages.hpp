// asyncps — the rendezvous's messages on the wire (asyncps/rendezvous.hpp): announce,
// assigned, lookup and directory, the ids a request may name, and which hosts may be listed.
// Typed messages converted to and from frames, as the messages of asyncps/protocol.hpp (whose
// comment on encoders and decoders applies here).
//
// Declared in namespace asyncps::protocol; include asyncps/protocol.hpp, which includes this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/codec/message_frame.hpp"
#include "asyncps/detail/endian.hpp"
#include "asyncps/error.hpp"
#include "asyncps/layout.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::protocol {

/// Header `sender` of an `announce` (a `lookup`): the rendezvous assigns the shard (the worker
/// id).
inline constexpr std::uint32_t any_id = 0xffffffffu;
/// Header `sender` of a `lookup`, and `directory::worker`: the client takes no worker id (a
/// server or a tool that only wants the addresses).
inline constexpr std::uint32_t no_worker_id = 0xfffffffeu;

/// Whether `host` may be announced and listed: 1 to `max_host_bytes` bytes, each a letter, a
/// digit or one of `-._:%` (host names, IPv4 and IPv6 literals, an IPv6 zone after `%`; no
/// brackets, no spaces, nothing a log line or a resolver could misread). Thread safety: pure.
constexpr bool valid_host(std::string_view host) noexcept {
  if (host.empty() || host.size() > max_host_bytes) return false;
  for (char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '.' || c == '_' || c == ':' || c == '%';
    if (!ok) return false;
  }
  return true;
}

/// server -> rendezvous: "I serve shard `shard`, listening on `port` of `host`". Payload: port
/// u16, host length u16 (0: no host), host bytes. Decoding refuses port 0 and a host that is
/// not `valid_host`. Precondition of `encode`: `host` is empty or `valid_host`.
struct announce {
  std::uint32_t shard = any_id;  ///< header `sender`; `any_id`: the lowest free shard
  std::uint16_t port = 0;        ///< the port the server listens on (its real one, not 0)
  /// Where others reach it; empty: the address the rendezvous sees the connection come from.
  std::string host{};
};

/// rendezvous -> server, the reply to an announce. Payload: shard u32, num_servers u32,
/// num_workers u32 (0: unknown). Decoding refuses num_servers 0 or shard >= num_servers.
struct assigned {
  std::uint32_t shard = 0;        ///< the shard the server serves
  std::uint32_t num_servers = 0;  ///< shards of the job
  std::uint32_t num_workers = 0;  ///< workers of the job (0: the rendezvous was not told)
};

/// client -> rendezvous: send the directory once every shard is announced. No payload.
struct lookup {
  /// Header `sender`: the worker id the client claims, `any_id` (assign the lowest free one,
  /// in arrival order) or `no_worker_id` (take none).
  std::uint32_t worker = any_id;
};

/// One shard's address in a `directory`.
struct server_address {
  std::string host{};  ///< `valid_host`; an IPv6 literal without brackets
  std::uint16_t port = 0;
  friend bool operator==(const server_address&, const server_address&) = default;
};

/// rendezvous -> client, the reply to a lookup. Payload: worker u32, num_workers u32, shard
/// count N u32, then N entries in shard order: port u16, host length u8, host bytes (no
/// padding). Decoding checks N against `max_directory_servers` and every length against the
/// bytes left before it allocates, refuses N 0, port 0, a host that is not `valid_host`, a
/// worker id >= a known num_workers, and trailing bytes. Precondition of `encode`: at most
/// `max_directory_servers` entries, each host `valid_host`.
struct directory {
  std::uint32_t worker = no_worker_id;  ///< the id the client was given (or `no_worker_id`)
  std::uint32_t num_workers = 0;        ///< 0: unknown
  std::vector<server_address> servers{};
};

template <class Alloc>
message encode(const announce& a, Alloc&& alloc) {
  using asyncps::detail::store_le;
  buffer b = alloc(announce_min_bytes + a.host.size());
  store_le(b.data(), a.port);
  store_le(b.data() + 2, static_cast<std::uint16_t>(a.host.size()));
  if (!a.host.empty()) std::memcpy(b.data() + 4, a.host.data(), a.host.size());
  return detail_::frame(message_type::announce, a.shard, 0, std::move(b));
}

inline std::error_code decode(const message& m, announce& out, std::string& detail) {
  using asyncps::detail::load_le;
  const auto bytes = m.payload.bytes();
  if (m.header.type != message_type::announce) return detail_::bad(detail, "expected an announce");
  if (bytes.size() < announce_min_bytes)
    return detail_::bad(detail, "announce payload shorter than 4 bytes");
  const auto port = load_le<std::uint16_t>(bytes.data());
  const auto n = load_le<std::uint16_t>(bytes.data() + 2);
  if (n > max_host_bytes || bytes.size() != announce_min_bytes + n)
    return detail_::bad(detail, "announce of a " + std::to_string(n) + "-byte host has " +
                                    std::to_string(bytes.size()) + " payload bytes (hosts are " +
                                    "at most " + std::to_string(max_host_bytes) + " bytes)");
  if (port == 0) return detail_::bad(detail, "announce of port 0");
  const std::string_view host(reinterpret_cast<const char*>(bytes.data() + 4), n);
  if (n != 0 && !valid_host(host))
    return detail_::bad(detail, "announced host is not a host name or address");
  out.shard = m.header.sender;
  out.port = port;
  out.host.assign(host);
  return {};
}

template <class Alloc>
message encode(const assigned& a, Alloc&& alloc) {
  using asyncps::detail::store_le;
  buffer b = alloc(assigned_bytes);
  store_le(b.data(), a.shard);
  store_le(b.data() + 4, a.num_servers);
  store_le(b.data() + 8, a.num_workers);
  return detail_::frame(message_type::assigned, 0, 0, std::move(b));
}

inline std::error_code decode(const message& m, assigned& out, std::string& detail) {
  using asyncps::detail::load_le;
  const auto bytes = m.payload.bytes();
  if (m.header.type != message_type::assigned || bytes.size() != assigned_bytes)
    return detail_::bad(detail, "malformed assigned");
  out.shard = load_le<std::uint32_t>(bytes.data());
  out.num_servers = load_le<std::uint32_t>(bytes.data() + 4);
  out.num_workers = load_le<std::uint32_t>(bytes.data() + 8);
  if (out.num_servers == 0 || out.shard >= out.num_servers)
    return detail_::bad(detail, "assigned shard " + std::to_string(out.shard) + " of " +
                                    std::to_string(out.num_servers) + " shards");
  return {};
}

template <class Alloc>
message encode(const lookup& l, Alloc&& /*alloc: no payload*/) {
  return detail_::frame(message_type::lookup, l.worker, 0, buffer{});
}

inline std::error_code decode(const message& m, lookup& out, std::string& detail) {
  if (m.header.type != message_type::lookup || m.payload.size() != 0)
    return detail_::bad(detail, "malformed lookup");
  out.worker = m.header.sender;
  return {};
}

template <class Alloc>
message encode(const directory& d, Alloc&& alloc) {
  using asyncps::detail::store_le;
  std::size_t n = directory_min_bytes;
  for (const auto& s : d.servers) n += 3 + s.host.size();
  buffer b = alloc(n);
  std::byte* p = b.data();
  store_le(p, d.worker);
  store_le(p + 4, d.num_workers);
  store_le(p + 8, static_cast<std::uint32_t>(d.servers.size()));
  p += directory_min_bytes;
  for (const auto& s : d.servers) {
    store_le(p, s.port);
    store_le(p + 2, static_cast<std::uint8_t>(s.host.size()));
    std::memcpy(p + 3, s.host.data(), s.host.size());
    p += 3 + s.host.size();
  }
  return detail_::frame(message_type::directory, 0, 0, std::move(b));
}

inline std::error_code decode(const message& m, directory& out, std::string& detail) {
  using asyncps::detail::load_le;
  const auto bytes = m.payload.bytes();
  if (m.header.type != message_type::directory) return detail_::bad(detail, "expected a directory");
  if (bytes.size() < directory_min_bytes)
    return detail_::bad(detail, "directory payload shorter than 12 bytes");
  out.worker = load_le<std::uint32_t>(bytes.data());
  out.num_workers = load_le<std::uint32_t>(bytes.data() + 4);
  const auto n = load_le<std::uint32_t>(bytes.data() + 8);
  if (n == 0 || n > max_directory_servers)
    return detail_::bad(detail, "directory of " + std::to_string(n) + " shards (1 to " +
                                    std::to_string(max_directory_servers) + ")");
  // Every entry takes at least 4 bytes (a host has at least one): check before reserving.
  std::size_t at = directory_min_bytes;
  if ((bytes.size() - at) / 4 < n)
    return detail_::bad(detail, "directory of " + std::to_string(n) + " shards has " +
                                    std::to_string(bytes.size()) + " payload bytes");
  if (out.worker != no_worker_id && out.num_workers != 0 && out.worker >= out.num_workers)
    return detail_::bad(detail, "directory gives worker id " + std::to_string(out.worker) + " of " +
                                    std::to_string(out.num_workers) + " workers");
  out.servers.clear();
  out.servers.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    if (bytes.size() - at < 3)
      return detail_::bad(detail, "directory entry " + std::to_string(i) + " is cut short");
    const auto port = load_le<std::uint16_t>(bytes.data() + at);
    const auto len = load_le<std::uint8_t>(bytes.data() + at + 2);
    at += 3;
    if (bytes.size() - at < len)
      return detail_::bad(detail, "directory entry " + std::to_string(i) + " host of " +
                                      std::to_string(len) + " bytes exceeds the bytes left");
    const std::string_view host(reinterpret_cast<const char*>(bytes.data() + at), len);
    at += len;
    if (port == 0 || !valid_host(host))
      return detail_::bad(detail, "directory entry " + std::to_string(i) +
                                      " is not a host name or address with a port");
    out.servers.push_back(server_address{std::string(host), port});
  }
  if (at != bytes.size())
    return detail_::bad(detail,
                        "directory has " + std::to_string(bytes.size() - at) + " trailing bytes");
  return {};
}

}  // namespace asyncps::protocol
