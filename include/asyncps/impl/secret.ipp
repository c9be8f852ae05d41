// asyncps — the definitions of secret.hpp's functions (a random secret, wiping, reading a
// secret file), which need OpenSSL and POSIX file calls.
//
// Not a header to include on its own: secret.hpp includes it (header-only, the default), or
// asyncps/src.hpp compiles it once (ASYNCPS_SEPARATE_COMPILATION defined; docs/build_time.md,
// "Separate compilation"). It does not include that header back (no include cycle): whoever
// includes this file has included the header first.
#pragma once

#include <cerrno>
#include <cstddef>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include "asyncps/detail/config.hpp"
#include "asyncps/error.hpp"
#include "asyncps/result.hpp"

namespace asyncps {

ASYNCPS_DECL result<shared_secret> shared_secret::random(std::size_t n) {
  if (n < min_secret_bytes) return make_error_code(errc::weak_secret);
  shared_secret s;
  s.bytes_.resize(n);
  if (RAND_bytes(reinterpret_cast<unsigned char*>(s.bytes_.data()), static_cast<int>(n)) != 1)
    return make_error_code(errc::invalid_argument);
  return s;
}

ASYNCPS_DECL void shared_secret::wipe() noexcept {
  if (!bytes_.empty()) OPENSSL_cleanse(bytes_.data(), bytes_.size());
  bytes_.clear();
}

ASYNCPS_DECL result<shared_secret> load_secret_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::error_code{errno, std::system_category()};
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } guard{fd};
  struct ::stat st{};
  if (::fstat(fd, &st) != 0) return std::error_code{errno, std::system_category()};
  if (!S_ISREG(st.st_mode)) return make_error_code(errc::bad_file);
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) return make_error_code(errc::insecure_secret_file);
  if (st.st_size > static_cast<::off_t>(max_secret_bytes)) return make_error_code(errc::bad_file);
  std::vector<std::byte> buf(max_secret_bytes + 1);
  std::size_t n = 0;
  while (n < buf.size()) {
    const ::ssize_t r = ::read(fd, buf.data() + n, buf.size() - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const std::error_code ec{errno, std::system_category()};
      OPENSSL_cleanse(buf.data(), buf.size());
      return ec;
    }
    if (r == 0) break;
    n += static_cast<std::size_t>(r);
  }
  shared_secret s(std::span<const std::byte>(buf.data(), n));
  OPENSSL_cleanse(buf.data(), buf.size());
  if (n > max_secret_bytes) return make_error_code(errc::bad_file);
  if (!s.valid()) return make_error_code(errc::weak_secret);
  return s;
}

}  // namespace asyncps
