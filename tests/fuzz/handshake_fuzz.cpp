// libFuzzer target `handshake`: the typed control messages of protocol.hpp. Input: frames as
// fuzz_support.hpp reads them; each frame that a transport would accept is given to every
// decoder (hello, welcome, error, report, chain_hello, chain_config, order, and the rendezvous's
// announce, assigned, lookup, directory).
//
// Invariants (abort on violation): a decoder accepts only its own message type; what it
// accepts re-encodes to the same payload bytes and the same header fields (type, sender where
// the message carries one, clock where it carries one, flags); decoded values respect the
// documented ranges.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "asyncps/protocol.hpp"
#include "asyncps/wire.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace asyncps;
using fuzz::require;

bool same_payload(const message& a, const message& b) {
  return a.payload.size() == b.payload.size() &&
         (a.payload.empty() ||
          std::memcmp(a.payload.data(), b.payload.data(), a.payload.size()) == 0);
}

// Decodes `m` as a `T`; when that succeeds, re-encodes it and compares.
template <class T>
void round_trip(const message& m, message_type type, bool carries_clock, bool carries_state,
                bool carries_sender = true) {
  T out{};
  std::string detail;
  if (protocol::decode(m, out, detail)) {
    require(!detail.empty(), "a refusal names what is wrong");
    return;
  }
  require(m.header.type == type, "a decoder accepts only its own message type");
  message back = protocol::encode(out, fuzz::allocate);
  require(back.header.type == type, "the encoder writes the type");
  if (carries_sender) require(back.header.sender == m.header.sender, "sender round-trips");
  if (carries_clock) require(back.header.clock == m.header.clock, "clock round-trips");
  if (carries_state)
    require(back.header.has(frame_flags::state) == m.header.has(frame_flags::state),
            "flag state round-trips");
  if constexpr (std::is_same_v<T, protocol::order>) {
    require(back.header.seq == m.header.seq, "an order's seq round-trips");
    require(out.position != 0 && out.stable < out.position, "order positions are ordered");
  }
  if constexpr (std::is_same_v<T, protocol::report>) {
    require(out.server_clock >= 0 && out.slowest_clock >= 0, "report clocks are not negative");
  }
  if constexpr (std::is_same_v<T, protocol::announce>) {
    require(out.port != 0 && out.host.size() <= max_host_bytes, "announce port and host bounds");
    require(out.host.empty() || protocol::valid_host(out.host), "an announced host is valid");
  }
  if constexpr (std::is_same_v<T, protocol::assigned>) {
    require(out.shard < out.num_servers, "an assigned shard is one of the shards");
  }
  if constexpr (std::is_same_v<T, protocol::directory>) {
    require(!out.servers.empty() && out.servers.size() <= max_directory_servers,
            "a directory lists 1 to max_directory_servers shards");
    for (const auto& s : out.servers)
      require(s.port != 0 && protocol::valid_host(s.host), "directory entries are addresses");
  }
  if constexpr (std::is_same_v<T, protocol::hello>) {
    require(out.layout.size() <= m.payload.size() / 8, "a hello's layout fits its payload");
  }
  if constexpr (std::is_same_v<T, protocol::error>) {
    // An unknown code decodes as none and re-encodes as 0: compare the rest.
    const auto code = asyncps::detail::load_le<std::uint32_t>(m.payload.data());
    require(out.code.has_value() == (errc_from_wire(code).has_value()), "error code mapping");
    require(back.payload.size() == m.payload.size(), "error payload size round-trips");
    require(std::memcmp(back.payload.data() + 4, m.payload.data() + 4, m.payload.size() - 4) == 0,
            "error reason round-trips");
    if (out.code) require(same_payload(back, m), "error payload round-trips");
    return;
  }
  if constexpr (std::is_same_v<T, protocol::chain_config>) {
    // The 4 padding bytes are written as zeros, whatever they were.
    require(back.payload.size() == m.payload.size(), "chain_config payload size round-trips");
    require(std::memcmp(back.payload.data(), m.payload.data(), 12) == 0 &&
                std::memcmp(back.payload.data() + 16, m.payload.data() + 16, 8) == 0,
            "chain_config payload round-trips");
    return;
  }
  if constexpr (std::is_same_v<T, protocol::welcome>) {
    // The 4 bytes after local_step are written as zeros, whatever they were.
    require(back.payload.size() == m.payload.size(), "welcome payload size round-trips");
    require(std::memcmp(back.payload.data(), m.payload.data(), m.payload.size() - 4) == 0,
            "welcome payload round-trips");
    return;
  }
  require(same_payload(back, m), "the payload round-trips");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz::byte_reader in(std::as_bytes(std::span(data, size)));
  const wire_limits limits{};
  while (in.left() != 0) {
    message m;
    const auto r = fuzz::read_frame(in, limits, m);
    if (r.truncated) break;
    if (r.ec) continue;  // the transport refuses it; no decoder sees it
    round_trip<protocol::hello>(m, message_type::hello, true, false);
    round_trip<protocol::welcome>(m, message_type::welcome, true, true);
    round_trip<protocol::error>(m, message_type::error, false, false);
    round_trip<protocol::report>(m, message_type::report, true, false);
    round_trip<protocol::chain_hello>(m, message_type::chain_hello, false, false);
    round_trip<protocol::chain_config>(m, message_type::chain_config, false, true);
    round_trip<protocol::order>(m, message_type::order, false, false);
    round_trip<protocol::announce>(m, message_type::announce, false, false);
    round_trip<protocol::assigned>(m, message_type::assigned, false, false, false);
    round_trip<protocol::lookup>(m, message_type::lookup, false, false);
    round_trip<protocol::directory>(m, message_type::directory, false, false, false);
  }
  return 0;
}
