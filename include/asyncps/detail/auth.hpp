// asyncps — detail: the shared-secret handshake's messages and math (sans-io: no socket, no
// clock). The TCP transport runs it before any frame; a custom transport can reuse it.
//
// Mutual challenge-response over HMAC-SHA256 (docs/wire-format.md, "Authentication handshake";
// docs/security.md). Every message has a fixed size, so a peer that has not authenticated can
// make the listener read at most `prefix_bytes + response_bytes` bytes:
//
//   listener  -> connector  challenge: prefix(kind 1) | server nonce Ns (32)             40 bytes
//   connector -> listener   response:  prefix(kind 2) | client nonce Nc (32) | Mc (32)   72 bytes
//   listener  -> connector  verdict:   prefix(kind 3 accept / 4 refuse) | Ms (32)        40 bytes
//
//   prefix = magic "APSA" (u32 LE) | version u16 LE | kind u8 | reserved u8 (0)
//   Mc = HMAC-SHA256(secret, "asyncps auth v1 connector" | 0x00 | Ns | Nc)
//   Ms = HMAC-SHA256(secret, "asyncps auth v1 listener"  | 0x00 | Nc | Ns)   (zeros in a refusal)
//
// The different labels keep one side's proof from being replayed as the other's; fresh nonces
// on both sides keep a recorded handshake from being replayed. Comparisons use CRYPTO_memcmp.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <system_error>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "asyncps/detail/endian.hpp"
#include "asyncps/error.hpp"
#include "asyncps/secret.hpp"

namespace asyncps::detail::auth {

inline constexpr std::uint32_t magic = 0x41535041;  // bytes 'A' 'P' 'S' 'A'
inline constexpr std::uint16_t version = 1;
inline constexpr std::size_t prefix_bytes = 8;
inline constexpr std::size_t nonce_bytes = 32;
inline constexpr std::size_t mac_bytes = 32;
inline constexpr std::size_t challenge_bytes = prefix_bytes + nonce_bytes;
inline constexpr std::size_t response_bytes = prefix_bytes + nonce_bytes + mac_bytes;
inline constexpr std::size_t verdict_bytes = prefix_bytes + mac_bytes;

/// The `kind` byte of a handshake message. Two are bare prefixes (8 bytes) of the TLS listener:
/// `tls_ready`, sent inside TLS once the TLS handshake is done (under TLS 1.3 the connector's
/// handshake ends before the listener has checked the connector's certificate, so the connector
/// waits for it), and `tls_required`, sent in the clear to a peer whose first byte is not a TLS
/// record, before the listener closes (so that peer can say what is missing). A bare `refuse`
/// inside TLS, in place of `tls_ready`, says that the listener refused the connector's
/// certificate identity (`tls_options::require_identity`, or a malformed asyncps URI SAN).
enum class kind : std::uint8_t {
  challenge = 1,
  response = 2,
  accept = 3,
  refuse = 4,
  tls_ready = 5,
  tls_required = 6
};

using prefix_msg = std::array<std::byte, prefix_bytes>;

using nonce = std::array<std::byte, nonce_bytes>;
using mac = std::array<std::byte, mac_bytes>;
using challenge_msg = std::array<std::byte, challenge_bytes>;
using response_msg = std::array<std::byte, response_bytes>;
using verdict_msg = std::array<std::byte, verdict_bytes>;

inline constexpr std::string_view connector_label = "asyncps auth v1 connector";
inline constexpr std::string_view listener_label = "asyncps auth v1 listener";

/// A fresh random nonce (OpenSSL's CSPRNG). False when the CSPRNG fails.
inline bool make_nonce(nonce& out) noexcept {
  return RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(out.size())) ==
         1;
}

/// HMAC-SHA256(secret, label | 0x00 | first | second).
inline mac proof(const shared_secret& secret, std::string_view label, const nonce& first,
                 const nonce& second) noexcept {
  std::array<unsigned char, 64 + 2 * nonce_bytes> in{};
  static_assert(connector_label.size() < 64 && listener_label.size() < 64);
  std::size_t n = 0;
  for (char c : label) in[n++] = static_cast<unsigned char>(c);
  in[n++] = 0;
  for (auto b : first) in[n++] = static_cast<unsigned char>(b);
  for (auto b : second) in[n++] = static_cast<unsigned char>(b);
  mac out{};
  unsigned int len = 0;
  const auto key = secret.bytes();
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), in.data(), n,
       reinterpret_cast<unsigned char*>(out.data()), &len);
  return out;
}

/// Writes the prefix of a message of kind `k` at `p` (`prefix_bytes` bytes).
inline void encode_prefix(std::byte* p, kind k) noexcept {
  store_le(p, magic);
  store_le(p + 4, version);
  p[6] = static_cast<std::byte>(k);
  p[7] = std::byte{0};
}

/// Checks a received prefix. Errors: `errc::authentication_required` when the bytes are the
/// start of a frame (the peer runs without a secret); `errc::authentication_failed` for any
/// other magic, version or reserved byte; `errc::authentication_failed` when the kind is not
/// `expected` (for a verdict: accept or refuse, a refusal is checked by `check_verdict`).
inline std::error_code check_prefix(std::span<const std::byte, prefix_bytes> p,
                                    kind expected) noexcept {
  const auto m = load_le<std::uint32_t>(p.data());
  if (m != magic) {
    return make_error_code(m == 0x31535041 ? errc::authentication_required  // "APS1": a frame
                                           : errc::authentication_failed);
  }
  if (load_le<std::uint16_t>(p.data() + 4) != version || p[7] != std::byte{0})
    return make_error_code(errc::authentication_failed);
  const auto k = static_cast<kind>(p[6]);
  if (k == expected || (expected == kind::accept && k == kind::refuse)) return {};
  return make_error_code(errc::authentication_failed);
}

/// A bare prefix of kind `k` (`tls_ready`, `tls_required`).
inline prefix_msg encode_bare(kind k) noexcept {
  prefix_msg out{};
  encode_prefix(out.data(), k);
  return out;
}

/// The listener's challenge carrying `ns`.
inline challenge_msg encode_challenge(const nonce& ns) noexcept {
  challenge_msg out{};
  encode_prefix(out.data(), kind::challenge);
  std::copy(ns.begin(), ns.end(), out.begin() + prefix_bytes);
  return out;
}

/// Reads the listener's nonce out of a challenge. Errors: those of `check_prefix`.
inline std::error_code parse_challenge(const challenge_msg& in, nonce& ns) noexcept {
  if (auto ec = check_prefix(std::span<const std::byte, prefix_bytes>(in.data(), prefix_bytes),
                             kind::challenge))
    return ec;
  std::copy(in.begin() + prefix_bytes, in.end(), ns.begin());
  return {};
}

/// The connector's response to challenge nonce `ns`, with its own nonce `nc`.
inline response_msg encode_response(const shared_secret& secret, const nonce& ns,
                                    const nonce& nc) noexcept {
  response_msg out{};
  encode_prefix(out.data(), kind::response);
  std::copy(nc.begin(), nc.end(), out.begin() + prefix_bytes);
  const mac m = proof(secret, connector_label, ns, nc);
  std::copy(m.begin(), m.end(), out.begin() + prefix_bytes + nonce_bytes);
  return out;
}

/// Verifies a connector's response to `ns`; on success `nc` holds its nonce. Errors: those of
/// `check_prefix` (the prefix is the first `prefix_bytes` of `in`); `errc::authentication_failed`
/// when the proof is wrong.
inline std::error_code check_response(const shared_secret& secret, const nonce& ns,
                                      const response_msg& in, nonce& nc) noexcept {
  if (auto ec = check_prefix(std::span<const std::byte, prefix_bytes>(in.data(), prefix_bytes),
                             kind::response))
    return ec;
  std::copy(in.begin() + prefix_bytes, in.begin() + prefix_bytes + nonce_bytes, nc.begin());
  const mac want = proof(secret, connector_label, ns, nc);
  if (CRYPTO_memcmp(want.data(), in.data() + prefix_bytes + nonce_bytes, mac_bytes) != 0)
    return make_error_code(errc::authentication_failed);
  return {};
}

/// The listener's verdict: an acceptance carrying its own proof, or a refusal (proof zeros).
inline verdict_msg encode_verdict(const shared_secret& secret, const nonce& ns, const nonce& nc,
                                  bool accept) noexcept {
  verdict_msg out{};
  encode_prefix(out.data(), accept ? kind::accept : kind::refuse);
  if (accept) {
    const mac m = proof(secret, listener_label, nc, ns);
    std::copy(m.begin(), m.end(), out.begin() + prefix_bytes);
  }
  return out;
}

/// Verifies the listener's verdict. Errors: those of `check_prefix`;
/// `errc::authentication_failed` for a refusal or a wrong proof (a listener without the secret).
inline std::error_code check_verdict(const shared_secret& secret, const nonce& ns, const nonce& nc,
                                     const verdict_msg& in) noexcept {
  if (auto ec = check_prefix(std::span<const std::byte, prefix_bytes>(in.data(), prefix_bytes),
                             kind::accept))
    return ec;
  if (static_cast<kind>(in[6]) != kind::accept) return make_error_code(errc::authentication_failed);
  const mac want = proof(secret, listener_label, nc, ns);
  if (CRYPTO_memcmp(want.data(), in.data() + prefix_bytes, mac_bytes) != 0)
    return make_error_code(errc::authentication_failed);
  return {};
}

}  // namespace asyncps::detail::auth
