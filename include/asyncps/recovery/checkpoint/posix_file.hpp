// asyncps — detail: the few POSIX file operations checkpoint files need: a descriptor guard,
// complete writes and positioned reads (retrying partial transfers and EINTR), and an atomic,
// durable replace (write `<file>.tmp`, fsync, rename over `<file>`, fsync the directory).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "asyncps/error.hpp"

namespace asyncps::detail {

/// `errno` as a `std::error_code` (system category).
inline std::error_code last_errno() noexcept { return {errno, std::system_category()}; }

/// Owns a file descriptor: closes it on scope exit. Not copyable.
class fd_guard {
 public:
  /// Takes `fd` (a negative value: owns nothing).
  explicit fd_guard(int fd) noexcept : fd_(fd) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() {
    if (fd_ >= 0) ::close(fd_);
  }
  /// The descriptor (negative when none).
  int get() const noexcept { return fd_; }
  /// Closes now and reports close()'s error (a deferred write error on some file systems).
  std::error_code close() noexcept {
    const int fd = std::exchange(fd_, -1);
    if (fd >= 0 && ::close(fd) != 0 && errno != EINTR) return last_errno();
    return {};
  }

 private:
  int fd_;
};

/// Writes all `n` bytes of `data` to `fd` (retries partial writes and EINTR). Errors: the
/// system error of write(2); `std::errc::io_error` when write(2) makes no progress.
inline std::error_code write_all(int fd, const void* data, std::size_t n) noexcept {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ::ssize_t w = ::write(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return last_errno();
    }
    if (w == 0) return std::make_error_code(std::errc::io_error);
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return {};
}

/// Reads exactly `n` bytes at `offset` of `fd` into `data` (retries partial reads and EINTR).
/// Errors: `errc::bad_file` when the file ends first (it shrank while being read); the system
/// error of pread(2).
inline std::error_code read_at(int fd, std::uint64_t offset, void* data, std::size_t n) noexcept {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ::ssize_t r = ::pread(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30),
                                static_cast<::off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return last_errno();
    }
    if (r == 0) return errc::bad_file;
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
  return {};
}

/// `file` + ".tmp": where `replace_file_atomically` writes before renaming.
inline std::filesystem::path tmp_path_of(const std::filesystem::path& file) {
  std::filesystem::path tmp = file;
  tmp += ".tmp";
  return tmp;
}

/// Replaces `file` atomically and durably: creates or truncates `<file>.tmp` (mode 0644),
/// calls `write(fd)` (returns a `std::error_code`) to fill it, fsyncs it, renames it over
/// `file` and fsyncs the directory, so a crash leaves either the old `file` or the new one
/// (plus at most a stale `.tmp`). On error `what` receives a reason without the file's name
/// in front (e.g. "cannot fsync /d/x.tmp: ..."), the `.tmp` is removed unless the rename
/// already happened, and the error is returned. A directory that cannot be opened or fsync'ed
/// after the rename is reported too: the new file exists but might not survive a power loss
/// (file systems without directory fsync, EINVAL/EROFS, are accepted). The directory must
/// exist. Thread safety: distinct files may be replaced concurrently.
template <class Write>
std::error_code replace_file_atomically(const std::filesystem::path& file, Write&& write,
                                        std::string& what) {
  const std::filesystem::path tmp = tmp_path_of(file);
  fd_guard fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    const auto ec = last_errno();
    what = "cannot create " + tmp.string() + ": " + ec.message();
    return ec;
  }
  auto fail = [&](const std::string& doing, std::error_code ec) {
    fd.close();
    ::unlink(tmp.c_str());
    what = doing + ": " + ec.message();
    return ec;
  };
  if (std::error_code ec = write(fd.get())) return fail("cannot write " + tmp.string(), ec);
  while (::fsync(fd.get()) != 0) {
    if (errno != EINTR) return fail("cannot fsync " + tmp.string(), last_errno());
  }
  if (auto ec = fd.close()) return fail("cannot close " + tmp.string(), ec);
  if (::rename(tmp.c_str(), file.c_str()) != 0)
    return fail("cannot rename " + tmp.string() + " over it", last_errno());
  std::filesystem::path dir = file.parent_path();
  if (dir.empty()) dir = ".";
  fd_guard dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) {
    const auto ec = last_errno();
    what = "written, but cannot open its directory to fsync: " + ec.message();
    return ec;
  }
  while (::fsync(dfd.get()) != 0) {
    if (errno == EINTR) continue;
    if (errno == EINVAL || errno == EROFS) break;  // directories without fsync support
    const auto ec = last_errno();
    what = "written, but cannot fsync its directory: " + ec.message();
    return ec;
  }
  return {};
}

}  // namespace asyncps::detail
