// asyncps — the checkpoint file format of recovery::checkpoint (internal, namespace detail): one
// `shard_state` per file, written atomically.
//
// A file is a framing around the one encoding of `shard_state` (detail/codec/shard_state.hpp,
// the same record a chain state transfer carries). Little-endian. Format version 2:
//
//   offset size  field         meaning
//   0      8     magic         "APSCKPT1"
//   8      4     version       checkpoint_format_version (2)
//   12     4     header_bytes  24
//   16     8     file_bytes    size of the whole file, checksum included
//   24     ..    record        the shard_state encoding (file_bytes - 32 bytes)
//   end-8  8     checksum      XXH3-64 of every byte before it
//
// Version 1 (asyncps before issue 12) had its own 64-byte header and record layout and did not
// store `last_seq`; its files are rejected as `unsupported format version 1`.
//
// Readers check, in this order: the file size against the 32-byte minimum, magic, version,
// header_bytes, file_bytes against the real size, the checksum, then the record: every count
// against the bytes left before anything is allocated, the record ends exactly at the
// checksum, and the counts agree with each other (`state_inconsistency`). A file that fails
// any check is `errc::bad_file` with a reason naming the file.
//
// Names, listing, pruning and the restore scan are recovery/checkpoint/store.hpp's.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

#include <sys/stat.h>

#define XXH_INLINE_ALL
#include <xxhash.h>
#undef XXH_INLINE_ALL

#include "asyncps/detail/codec/shard_state.hpp"
#include "asyncps/detail/endian.hpp"
#include "asyncps/error.hpp"
#include "asyncps/recovery/checkpoint/posix_file.hpp"
#include "asyncps/result.hpp"
#include "asyncps/shard_state.hpp"

namespace asyncps::detail {

static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559,
              "asyncps: checkpoint files hold IEEE-754 binary32 floats");

/// The 8 bytes every checkpoint file starts with.
inline constexpr std::array<char, 8> checkpoint_magic{'A', 'P', 'S', 'C', 'K', 'P', 'T', '1'};
/// The checkpoint format version this library writes and reads.
inline constexpr std::uint32_t checkpoint_format_version = 2;
/// Bytes of the fixed file header (magic, version, header_bytes, file_bytes).
inline constexpr std::size_t checkpoint_header_bytes = 24;
/// Bytes of the trailing checksum.
inline constexpr std::size_t checkpoint_checksum_bytes = 8;

namespace ckpt {

inline void set_why(std::string* why, const std::filesystem::path& file, std::string_view what) {
  if (why != nullptr) *why = "checkpoint " + file.string() + ": " + std::string(what);
}

// A `state_sink` that buffers small fields, passes float arrays straight to write(2), and
// hashes everything; `finish` appends the checksum.
class hashing_writer {
 public:
  explicit hashing_writer(int fd) noexcept : fd_(fd) {
    XXH3_INITSTATE(&state_);  // (a macro ending in a block)
    XXH3_64bits_reset(&state_);
  }
  template <class T>
  void put(T v) noexcept {
    if (used_ + sizeof(T) > buf_.size()) flush();
    store_le(buf_.data() + used_, v);
    used_ += sizeof(T);
  }
  void put_floats(std::span<const float> v) noexcept {
    if (v.empty() || ec_) return;
    flush();
    XXH3_64bits_update(&state_, v.data(), v.size_bytes());
    if (!ec_) ec_ = write_all(fd_, v.data(), v.size_bytes());
  }
  void flush() noexcept {
    if (used_ == 0) return;
    XXH3_64bits_update(&state_, buf_.data(), used_);
    if (!ec_) ec_ = write_all(fd_, buf_.data(), used_);
    used_ = 0;
  }
  // Flushes and appends the checksum of everything written (not itself hashed).
  std::error_code finish() noexcept {
    flush();
    std::array<std::byte, 8> sum{};
    store_le(sum.data(), static_cast<std::uint64_t>(XXH3_64bits_digest(&state_)));
    if (!ec_) ec_ = write_all(fd_, sum.data(), sum.size());
    return ec_;
  }

 private:
  int fd_;
  XXH3_state_t state_;
  std::array<std::byte, 4096> buf_{};
  std::size_t used_ = 0;
  std::error_code ec_;
};

// A `state_source` over bytes [pos, end) of a file: small fields through a buffer, float
// arrays straight into their vectors. A read error ends the stream; `error()` tells it apart
// from a count that does not fit.
class file_source {
 public:
  file_source(int fd, std::uint64_t pos, std::uint64_t end) noexcept
      : fd_(fd), pos_(pos), end_(end) {}
  template <class T>
  bool take(T& v) noexcept {
    if (left() < sizeof(T) || ec_) return false;
    if (avail_ - used_ < sizeof(T) && !refill()) return false;
    v = load_le<T>(buf_.data() + used_);
    used_ += sizeof(T);
    return true;
  }
  bool take_floats(std::span<float> v) noexcept {
    if (v.size_bytes() > left() || ec_) return false;
    auto* p = reinterpret_cast<std::byte*>(v.data());
    const std::size_t buffered = std::min(avail_ - used_, v.size_bytes());
    if (buffered != 0) std::memcpy(p, buf_.data() + used_, buffered);
    used_ += buffered;
    const std::size_t rest = v.size_bytes() - buffered;
    if (rest == 0) return true;
    if ((ec_ = read_at(fd_, pos_, p + buffered, rest))) return false;
    pos_ += rest;
    return true;
  }
  std::uint64_t left() const noexcept { return end_ - pos_ + (avail_ - used_); }
  std::error_code error() const noexcept { return ec_; }

 private:
  bool refill() noexcept {
    const std::size_t keep = avail_ - used_;
    std::memmove(buf_.data(), buf_.data() + used_, keep);
    const auto n =
        static_cast<std::size_t>(std::min<std::uint64_t>(buf_.size() - keep, end_ - pos_));
    if ((ec_ = read_at(fd_, pos_, buf_.data() + keep, n))) return false;
    pos_ += n;
    used_ = 0;
    avail_ = keep + n;
    return true;
  }
  int fd_;
  std::uint64_t pos_;  // file offset of the first byte not in the buffer
  std::uint64_t end_;
  std::array<std::byte, 4096> buf_{};
  std::size_t used_ = 0, avail_ = 0;
  std::error_code ec_;
};

}  // namespace ckpt

/// Writes `st` to `file` atomically and durably (`replace_file_atomically`: `<file>.tmp`,
/// fsync, rename, fsync of the directory). Cost: one sequential write of
/// `encoded_state_size(st)` + 32 bytes, one XXH3 pass, two fsyncs; no allocation beyond the
/// error message.
///
/// Errors: `errc::invalid_argument` when `st` is inconsistent (`state_inconsistency`); a
/// system error from open/write/fsync/rename (e.g. `std::errc::no_space_on_device`). On error
/// the `.tmp` file is removed and `file` is unchanged. When `why` is not null it receives a
/// one-line reason that names the file. The directory must exist. Thread safety: distinct
/// files may be written concurrently.
inline result<void> write_checkpoint(const std::filesystem::path& file, const shard_state& st,
                                     std::string* why = nullptr) {
  if (const std::string bad = state_inconsistency(st); !bad.empty()) {
    ckpt::set_why(why, file, "not written: the state is inconsistent (" + bad + ")");
    return make_error_code(errc::invalid_argument);
  }
  std::string what;
  const auto ec = replace_file_atomically(
      file,
      [&st](int fd) {
        ckpt::hashing_writer w(fd);
        for (char c : checkpoint_magic) w.put(c);
        w.put(checkpoint_format_version);
        w.put(static_cast<std::uint32_t>(checkpoint_header_bytes));
        w.put(static_cast<std::uint64_t>(checkpoint_header_bytes + encoded_state_size(st) +
                                         checkpoint_checksum_bytes));
        encode_state(st, w);
        return w.finish();
      },
      what);
  if (ec) {
    ckpt::set_why(why, file, what);
    return ec;
  }
  return BOOST_OUTCOME_V2_NAMESPACE::success();
}

/// Reads the checkpoint `file` into `out` (reusing its vectors' capacity) after validating it
/// completely (see the format comment at the top of this header). Allocates at most the sizes
/// the file holds, never more than the file's size: a corrupt count cannot cause a huge
/// allocation. Cost: two sequential reads of the file (checksum pass, then decode).
///
/// Errors: `errc::bad_file` when the file is truncated, corrupt (checksum), has the wrong
/// magic or an unsupported version (e.g. a version 1 file of an older asyncps), or
/// inconsistent counts; a system error when it cannot be opened or read
/// (`std::errc::no_such_file_or_directory`, ...). When `why` is not null it receives a one-line
/// reason naming the file and what was wrong. On error `out` holds unspecified (but valid)
/// contents. Thread safety: distinct `out` objects may be filled concurrently.
inline result<void> read_checkpoint(const std::filesystem::path& file, shard_state& out,
                                    std::string* why = nullptr) {
  auto bad = [&](const std::string& what) {
    ckpt::set_why(why, file, what);
    return make_error_code(errc::bad_file);
  };
  fd_guard fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    const auto ec = last_errno();
    ckpt::set_why(why, file, "cannot open: " + ec.message());
    return ec;
  }
  struct ::stat sb{};
  if (::fstat(fd.get(), &sb) != 0) {
    const auto ec = last_errno();
    ckpt::set_why(why, file, "cannot stat: " + ec.message());
    return ec;
  }
  if (!S_ISREG(sb.st_mode)) return bad("not a regular file");
  const auto size = static_cast<std::uint64_t>(sb.st_size);
  constexpr std::uint64_t min_size = checkpoint_header_bytes + checkpoint_checksum_bytes;
  if (size < min_size)
    return bad("truncated: " + std::to_string(size) + " bytes, smaller than the " +
               std::to_string(min_size) + "-byte minimum");
  auto io_error = [&](std::error_code ec, std::string_view what) {
    if (ec == errc::bad_file) return bad("truncated while reading " + std::string(what));
    ckpt::set_why(why, file, "cannot read " + std::string(what) + ": " + ec.message());
    return ec;
  };

  // 1. Fixed header.
  std::array<std::byte, checkpoint_header_bytes> h{};
  if (auto ec = read_at(fd.get(), 0, h.data(), h.size())) return io_error(ec, "the header");
  if (std::memcmp(h.data(), checkpoint_magic.data(), checkpoint_magic.size()) != 0)
    return bad("bad magic (not an asyncps checkpoint file)");
  if (const auto v = load_le<std::uint32_t>(h.data() + 8); v != checkpoint_format_version)
    return bad("unsupported format version " + std::to_string(v) + " (this library reads " +
               std::to_string(checkpoint_format_version) + "; the file was written by " +
               (v < checkpoint_format_version ? "an older" : "a newer") + " asyncps)");
  if (const auto hb = load_le<std::uint32_t>(h.data() + 12); hb != checkpoint_header_bytes)
    return bad("bad header_bytes " + std::to_string(hb));
  if (const auto fb = load_le<std::uint64_t>(h.data() + 16); fb != size)
    return bad((size < fb ? "truncated: the header says " : "trailing bytes: the header says ") +
               std::to_string(fb) + " bytes, the file has " + std::to_string(size));

  // 2. Checksum of everything before the trailer.
  const std::uint64_t end = size - checkpoint_checksum_bytes;
  {
    std::array<std::byte, 8> stored{};
    if (auto ec = read_at(fd.get(), end, stored.data(), stored.size()))
      return io_error(ec, "the checksum");
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    const std::size_t chunk = static_cast<std::size_t>(std::min<std::uint64_t>(end, 1u << 20));
    std::unique_ptr<std::byte[]> buf(new std::byte[chunk]);
    for (std::uint64_t off = 0; off < end;) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, end - off));
      if (auto ec = read_at(fd.get(), off, buf.get(), n)) return io_error(ec, "the body");
      XXH3_64bits_update(&st, buf.get(), n);
      off += n;
    }
    const std::uint64_t computed = XXH3_64bits_digest(&st);
    if (computed != load_le<std::uint64_t>(stored.data())) {
      char msg[128];
      std::snprintf(msg, sizeof msg, "checksum mismatch (stored %016llx, computed %016llx)",
                    static_cast<unsigned long long>(load_le<std::uint64_t>(stored.data())),
                    static_cast<unsigned long long>(computed));
      return bad(std::string(msg) + ": the file is corrupt");
    }
  }

  // 3. The record: counts against the bytes left (before allocating), then their agreement.
  ckpt::file_source source(fd.get(), checkpoint_header_bytes, end);
  const std::string wrong = decode_state(source, out);
  if (auto ec = source.error()) return io_error(ec, "the record");
  if (!wrong.empty()) return bad(wrong);
  if (source.left() != 0)
    return bad(std::to_string(source.left()) + " unexpected bytes after the last table record");
  if (const std::string bad_counts = state_inconsistency(out); !bad_counts.empty())
    return bad(bad_counts);
  return BOOST_OUTCOME_V2_NAMESPACE::success();
}

}  // namespace asyncps::detail
