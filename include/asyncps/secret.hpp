// asyncps — the shared secret that authenticates every connection (docs/security.md).
//
// Every node of a run (servers, workers, chain members, the chain master, group servers) holds
// the same secret; the TCP transport proves possession of it in a challenge-response handshake
// before any frame (detail/auth.hpp). Load it from a file only readable by its owner:
//
//   auto secret = asyncps::load_secret_file("/run/secrets/asyncps");
//   if (!secret) { /* print the path and secret.error().message() */ }
//   asyncps::tcp_transport t(ex, {.secret = std::move(secret).value()});
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "asyncps/detail/config.hpp"
#include "asyncps/error.hpp"
#include "asyncps/result.hpp"

namespace asyncps {

/// The fewest bytes a shared secret may have (128 bits).
inline constexpr std::size_t min_secret_bytes = 16;
/// The most bytes `load_secret_file` reads (a secret file is a key, not a data file).
inline constexpr std::size_t max_secret_bytes = 4096;

/// The bytes of a shared secret. Empty: no authentication. The bytes are wiped (OPENSSL_cleanse)
/// when the object is destroyed or assigned over. Thread safety: as a `std::vector`.
class shared_secret {
 public:
  /// No secret (connections are not authenticated).
  shared_secret() = default;
  /// Copies `bytes` (any length; `valid()` checks the length).
  explicit shared_secret(std::span<const std::byte> bytes) : bytes_(bytes.begin(), bytes.end()) {}
  shared_secret(const shared_secret&) = default;
  shared_secret(shared_secret&& o) noexcept : bytes_(std::move(o.bytes_)) { o.wipe(); }
  shared_secret& operator=(const shared_secret& o) {
    if (this != &o) {
      wipe();
      bytes_ = o.bytes_;
    }
    return *this;
  }
  shared_secret& operator=(shared_secret&& o) noexcept {
    if (this != &o) {
      wipe();
      bytes_ = std::move(o.bytes_);
      o.wipe();
    }
    return *this;
  }
  ~shared_secret() { wipe(); }

  /// `n` random bytes from OpenSSL's CSPRNG (an ephemeral secret for one run). Errors:
  /// `errc::weak_secret` when `n < min_secret_bytes`; `errc::invalid_argument` when the
  /// CSPRNG fails.
  ASYNCPS_DECL static result<shared_secret> random(std::size_t n = 32);

  /// Whether there is a secret (non-empty).
  bool empty() const noexcept { return bytes_.empty(); }
  /// Whether the secret is long enough to use (`min_secret_bytes`).
  bool valid() const noexcept { return bytes_.size() >= min_secret_bytes; }
  /// The secret's bytes (the HMAC key).
  std::span<const std::byte> bytes() const noexcept { return bytes_; }

 private:
  ASYNCPS_DECL void wipe() noexcept;
  std::vector<std::byte> bytes_;
};

/// Reads a shared secret from `path`: the file's bytes, as they are (a trailing newline is
/// part of the secret; `head -c 32 /dev/urandom > secret; chmod 600 secret` makes one).
/// `path` is a file name; a `std::filesystem::path` converts to it (this header does not
/// include `<filesystem>`, so that a translation unit which does not read files skips it).
///
/// Errors (the caller names `path` when it reports them): the system error of open(2) or
/// read(2) (e.g. no such file); `errc::insecure_secret_file` when the file's mode lets its group
/// or others read or write it (like ssh's private keys); `errc::bad_file` when it is not a
/// regular file or longer than `max_secret_bytes`; `errc::weak_secret` when it holds fewer than
/// `min_secret_bytes` bytes. Thread safety: any thread. Blocking file I/O: call it at startup,
/// not on an executor that serves connections.
ASYNCPS_DECL result<shared_secret> load_secret_file(const std::string& path);

}  // namespace asyncps

#if !defined(ASYNCPS_SEPARATE_COMPILATION)
#include "asyncps/impl/secret.ipp"
#endif
