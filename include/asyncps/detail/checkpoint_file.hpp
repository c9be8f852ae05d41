// asyncps — the checkpoint file format: one `shard_state` per file, written atomically.
//
// Used by `recovery::checkpoint` (recovery/checkpoint.hpp); usable on its own. All integers are
// little-endian, floats are IEEE-754 binary32 (the host must be little-endian, like the wire
// format). Format version 1:
//
//   offset size  field            meaning
//   0      8     magic            "APSCKPT1"
//   8      4     version          checkpoint_format_version (1)
//   12     4     header_bytes     64
//   16     8     file_bytes       size of the whole file, checksum included
//   24     4     shard            shard_state::shard
//   28     4     num_shards       shard_state::num_shards
//   32     4     num_workers      shard_state::num_workers (W)
//   36     4     state_per_param  shard_state::state_per_param (P)
//   40     4     table_count      shard_state::tables.size() (T)
//   44     4     reserved         0
//   48     8     server_clock     shard_state::server_clock (i64)
//   56     8     reserved         0
//   64     8W    worker_clocks    W x i64
//   ..     8WT   applied          W x T x u64 (applied[w * T + t])
//   ..           tables           T records, each:
//                  48 bytes: id u32, rows u32, width u32, init_scale f32, range.begin u32,
//                            range.end u32, step u64, value_count u64 (V), state_count u64
//                  4V bytes: values (f32)
//                  4PV bytes: optimizer_state (f32)
//   end-8  8     checksum         XXH3-64 of every byte before it
//
// Readers check, in this order: the file size against the 72-byte minimum, magic, version,
// header_bytes, file_bytes against the real size, the checksum, then every count against the
// bytes left in the file before anything is allocated, and the consistency of the counts
// (V = (range.end - range.begin) x width, state_count = P x V, the record ends exactly at the
// checksum). A file that fails any check is `errc::bad_file` with a reason naming the file.
//
// Files of a directory are named `shard-<shard>-clock-<clock, 12 digits zero-padded>.ckpt`;
// writes go to `<name>.tmp` first, which is fsync'ed and then renamed over `<name>`, so a
// crash leaves either the old set of files or the new one, plus at most a stale `.tmp`.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>
#undef XXH_INLINE_ALL

#include "asyncps/detail/endian.hpp"
#include "asyncps/error.hpp"
#include "asyncps/result.hpp"
#include "asyncps/shard_state.hpp"
#include "asyncps/table.hpp"

namespace asyncps::detail {

static_assert(std::endian::native == std::endian::little,
              "asyncps: checkpoint files are little-endian; big-endian hosts are not supported");
static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559,
              "asyncps: checkpoint files hold IEEE-754 binary32 floats");

/// The 8 bytes every checkpoint file starts with.
inline constexpr std::array<char, 8> checkpoint_magic{'A', 'P', 'S', 'C', 'K', 'P', 'T', '1'};
/// The checkpoint format version this library writes and reads.
inline constexpr std::uint32_t checkpoint_format_version = 1;
/// Bytes of the fixed file header.
inline constexpr std::size_t checkpoint_header_bytes = 64;
/// Bytes of the fixed part of each table record.
inline constexpr std::size_t checkpoint_table_record_bytes = 48;
/// Bytes of the trailing checksum.
inline constexpr std::size_t checkpoint_checksum_bytes = 8;

/// One checkpoint file found in a directory.
struct checkpoint_file {
  std::filesystem::path path;  ///< full path of the file
  clock_value clock = 0;       ///< the server clock in its name
};

namespace ckpt {

using detail::load_le;
using detail::store_le;

inline std::error_code last_errno() noexcept { return {errno, std::system_category()}; }

inline void set_why(std::string* why, const std::filesystem::path& file, std::string_view what) {
  if (why != nullptr) *why = "checkpoint " + file.string() + ": " + std::string(what);
}

// Closes a descriptor on scope exit unless released.
class fd_guard {
 public:
  explicit fd_guard(int fd) noexcept : fd_(fd) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const noexcept { return fd_; }
  // Closes now and reports close()'s error (a deferred write error on some file systems).
  std::error_code close() noexcept {
    const int fd = fd_;
    fd_ = -1;
    if (fd >= 0 && ::close(fd) != 0 && errno != EINTR) return last_errno();
    return {};
  }

 private:
  int fd_;
};

// Writes all `n` bytes (retries partial writes and EINTR).
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

// Reads exactly `n` bytes at `offset`; a short file is `errc::bad_file`.
inline std::error_code read_at(int fd, std::uint64_t offset, void* data, std::size_t n) noexcept {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ::ssize_t r = ::pread(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30),
                                static_cast<::off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return last_errno();
    }
    if (r == 0) return errc::bad_file;  // shrank while we read it
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
  return {};
}

// Buffers small fields, passes large arrays straight to write(2), and hashes everything.
class hashing_writer {
 public:
  explicit hashing_writer(int fd) noexcept : fd_(fd) {
    XXH3_INITSTATE(&state_);  // (a macro ending in a block)
    XXH3_64bits_reset(&state_);
  }
  template <class T>
  void value(T v) noexcept {
    if (used_ + sizeof(T) > buf_.size()) flush();
    store_le(buf_.data() + used_, v);
    used_ += sizeof(T);
  }
  void bytes(const void* p, std::size_t n) noexcept {
    if (n == 0 || ec_) return;
    flush();
    XXH3_64bits_update(&state_, p, n);
    if (!ec_) ec_ = write_all(fd_, p, n);
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

// "" when `st` can be written; else why not.
inline std::string check_state(const shard_state& st) {
  const std::uint64_t tables = st.tables.size();
  if (st.worker_clocks.size() != st.num_workers)
    return "worker_clocks has " + std::to_string(st.worker_clocks.size()) +
           " entries, num_workers is " + std::to_string(st.num_workers);
  if (st.applied.size() != std::uint64_t{st.num_workers} * tables)
    return "applied has " + std::to_string(st.applied.size()) + " entries, expected " +
           std::to_string(std::uint64_t{st.num_workers} * tables);
  for (std::size_t i = 0; i < st.tables.size(); ++i) {
    const auto& t = st.tables[i];
    const std::uint64_t v = std::uint64_t{t.range.size()} * t.spec.width;
    if (t.range.end < t.range.begin || t.values.size() != v)
      return "table " + std::to_string(i) + " has " + std::to_string(t.values.size()) +
             " values, its range and width need " + std::to_string(v);
    if (t.optimizer_state.size() != v * st.state_per_param)
      return "table " + std::to_string(i) + " has " + std::to_string(t.optimizer_state.size()) +
             " optimizer values, state_per_param needs " + std::to_string(v * st.state_per_param);
  }
  return {};
}

inline std::uint64_t file_size_of(const shard_state& st) noexcept {
  std::uint64_t n = checkpoint_header_bytes + st.worker_clocks.size() * 8 + st.applied.size() * 8 +
                    checkpoint_checksum_bytes;
  for (const auto& t : st.tables)
    n += checkpoint_table_record_bytes + (t.values.size() + t.optimizer_state.size()) * 4;
  return n;
}

inline std::filesystem::path tmp_path(const std::filesystem::path& file) {
  std::filesystem::path tmp = file;
  tmp += ".tmp";
  return tmp;
}

inline std::string shard_prefix(std::uint32_t shard) {
  return "shard-" + std::to_string(shard) + "-clock-";
}

}  // namespace ckpt

/// The name of shard `shard`'s checkpoint at server clock `clock`:
/// `shard-<shard>-clock-<clock, zero-padded to 12 digits>.ckpt`. Precondition: `clock >= 0`.
inline std::string checkpoint_file_name(std::uint32_t shard, clock_value clock) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%012lld", static_cast<long long>(clock));
  return ckpt::shard_prefix(shard) + digits + ".ckpt";
}

/// The clock in `name` when it is a checkpoint file name of shard `shard` (see
/// `checkpoint_file_name`; at least 12 digits), else nothing. `.tmp` files do not match.
inline std::optional<clock_value> parse_checkpoint_file_name(std::string_view name,
                                                             std::uint32_t shard) {
  const std::string prefix = ckpt::shard_prefix(shard);
  constexpr std::string_view suffix = ".ckpt";
  if (name.size() < prefix.size() + 12 + suffix.size() || !name.starts_with(prefix) ||
      !name.ends_with(suffix))
    return std::nullopt;
  const std::string_view digits =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  clock_value c = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), c);
  if (ec != std::errc{} || end != digits.data() + digits.size()) return std::nullopt;
  return c;
}

/// Writes `st` to `file` atomically and durably: to `file` + ".tmp" (created or truncated,
/// mode 0644), fsync, rename over `file`, fsync of the directory. Cost: one sequential write
/// of `shard_state::data_bytes()` plus a few KiB, one XXH3 pass, two fsyncs.
///
/// Errors: `errc::invalid_argument` when `st` is inconsistent (vector sizes that disagree with
/// its counts); a system error from open/write/fsync/rename (e.g. `std::errc::no_space_on_device`).
/// On error the `.tmp` file is removed and `file` is unchanged. When `why` is not null it
/// receives a one-line reason that names the file. The directory must exist.
/// Thread safety: distinct files may be written concurrently.
inline result<void> write_checkpoint(const std::filesystem::path& file, const shard_state& st,
                                     std::string* why = nullptr) {
  if (const std::string bad = ckpt::check_state(st); !bad.empty()) {
    ckpt::set_why(why, file, "not written: the state is inconsistent (" + bad + ")");
    return make_error_code(errc::invalid_argument);
  }
  const std::filesystem::path tmp = ckpt::tmp_path(file);
  ckpt::fd_guard fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    const auto ec = ckpt::last_errno();
    ckpt::set_why(why, file, "cannot create " + tmp.string() + ": " + ec.message());
    return ec;
  }
  auto fail = [&](std::string_view what, std::error_code ec) {
    fd.close();
    ::unlink(tmp.c_str());
    ckpt::set_why(why, file, std::string(what) + ": " + ec.message());
    return ec;
  };

  {
    ckpt::hashing_writer writer(fd.get());
    auto* w = &writer;
    for (char c : checkpoint_magic) w->value(c);
    w->value(checkpoint_format_version);
    w->value(static_cast<std::uint32_t>(checkpoint_header_bytes));
    w->value(ckpt::file_size_of(st));
    w->value(st.shard);
    w->value(st.num_shards);
    w->value(st.num_workers);
    w->value(st.state_per_param);
    w->value(static_cast<std::uint32_t>(st.tables.size()));
    w->value(std::uint32_t{0});
    w->value(static_cast<std::int64_t>(st.server_clock));
    w->value(std::uint64_t{0});
    w->bytes(st.worker_clocks.data(), st.worker_clocks.size() * sizeof(clock_value));
    w->bytes(st.applied.data(), st.applied.size() * sizeof(std::uint64_t));
    for (const auto& t : st.tables) {
      w->value(t.spec.id);
      w->value(t.spec.rows);
      w->value(t.spec.width);
      w->value(t.spec.init_scale);
      w->value(t.range.begin);
      w->value(t.range.end);
      w->value(t.step);
      w->value(static_cast<std::uint64_t>(t.values.size()));
      w->value(static_cast<std::uint64_t>(t.optimizer_state.size()));
      w->bytes(t.values.data(), t.values.size() * sizeof(float));
      w->bytes(t.optimizer_state.data(), t.optimizer_state.size() * sizeof(float));
    }
    if (auto ec = w->finish()) return fail("cannot write " + tmp.string(), ec);
  }
  while (::fsync(fd.get()) != 0) {
    if (errno != EINTR) return fail("cannot fsync " + tmp.string(), ckpt::last_errno());
  }
  if (auto ec = fd.close()) return fail("cannot close " + tmp.string(), ec);
  if (::rename(tmp.c_str(), file.c_str()) != 0)
    return fail("cannot rename " + tmp.string() + " over it", ckpt::last_errno());
  // Make the rename durable. A directory that cannot be opened or fsync'ed (some file systems
  // refuse) is reported: the new file exists but might not survive a power loss.
  std::filesystem::path dir = file.parent_path();
  if (dir.empty()) dir = ".";
  ckpt::fd_guard dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) {
    const auto ec = ckpt::last_errno();
    ckpt::set_why(why, file, "written, but cannot open its directory to fsync: " + ec.message());
    return ec;
  }
  while (::fsync(dfd.get()) != 0) {
    if (errno == EINTR) continue;
    if (errno == EINVAL || errno == EROFS) break;  // directories without fsync support
    const auto ec = ckpt::last_errno();
    ckpt::set_why(why, file, "written, but cannot fsync its directory: " + ec.message());
    return ec;
  }
  return BOOST_OUTCOME_V2_NAMESPACE::success();
}

/// Reads the checkpoint `file` into `out` (reusing its vectors' capacity) after validating it
/// completely (see the format comment at the top of this header). Allocates at most the sizes
/// the file holds, never more than the file's size: a corrupt count cannot cause a huge
/// allocation. Cost: two sequential reads of the file (checksum pass, then parse).
///
/// Errors: `errc::bad_file` when the file is truncated, corrupt (checksum), has the wrong
/// magic or version, or inconsistent counts; a system error when it cannot be opened or read
/// (`std::errc::no_such_file_or_directory`, ...). When `why` is not null it receives a one-line
/// reason naming the file and what was wrong. On error `out` holds unspecified (but valid)
/// contents. Thread safety: distinct `out` objects may be filled concurrently.
inline result<void> read_checkpoint(const std::filesystem::path& file, shard_state& out,
                                    std::string* why = nullptr) {
  namespace c = ckpt;
  auto bad = [&](const std::string& what) {
    c::set_why(why, file, what);
    return make_error_code(errc::bad_file);
  };
  c::fd_guard fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    const auto ec = c::last_errno();
    c::set_why(why, file, "cannot open: " + ec.message());
    return ec;
  }
  struct ::stat sb{};
  if (::fstat(fd.get(), &sb) != 0) {
    const auto ec = c::last_errno();
    c::set_why(why, file, "cannot stat: " + ec.message());
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
    c::set_why(why, file, "cannot read " + std::string(what) + ": " + ec.message());
    return ec;
  };

  // 1. Fixed header.
  std::array<std::byte, checkpoint_header_bytes> h{};
  if (auto ec = c::read_at(fd.get(), 0, h.data(), h.size())) return io_error(ec, "the header");
  if (std::memcmp(h.data(), checkpoint_magic.data(), checkpoint_magic.size()) != 0)
    return bad("bad magic (not an asyncps checkpoint file)");
  if (const auto v = c::load_le<std::uint32_t>(h.data() + 8); v != checkpoint_format_version)
    return bad("unsupported format version " + std::to_string(v) + " (this library reads " +
               std::to_string(checkpoint_format_version) + ")");
  if (const auto hb = c::load_le<std::uint32_t>(h.data() + 12); hb != checkpoint_header_bytes)
    return bad("bad header_bytes " + std::to_string(hb));
  if (const auto fb = c::load_le<std::uint64_t>(h.data() + 16); fb != size)
    return bad((size < fb ? "truncated: the header says " : "trailing bytes: the header says ") +
               std::to_string(fb) + " bytes, the file has " + std::to_string(size));

  // 2. Checksum of everything before the trailer.
  {
    const std::uint64_t body = size - checkpoint_checksum_bytes;
    std::array<std::byte, 8> stored{};
    if (auto ec = c::read_at(fd.get(), body, stored.data(), stored.size()))
      return io_error(ec, "the checksum");
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    const std::size_t chunk = static_cast<std::size_t>(std::min<std::uint64_t>(body, 1u << 20));
    std::unique_ptr<std::byte[]> buf(new std::byte[chunk]);
    for (std::uint64_t off = 0; off < body;) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, body - off));
      if (auto ec = c::read_at(fd.get(), off, buf.get(), n)) return io_error(ec, "the body");
      XXH3_64bits_update(&st, buf.get(), n);
      off += n;
    }
    const std::uint64_t computed = XXH3_64bits_digest(&st);
    if (computed != c::load_le<std::uint64_t>(stored.data())) {
      char msg[128];
      std::snprintf(msg, sizeof msg, "checksum mismatch (stored %016llx, computed %016llx)",
                    static_cast<unsigned long long>(c::load_le<std::uint64_t>(stored.data())),
                    static_cast<unsigned long long>(computed));
      return bad(std::string(msg) + ": the file is corrupt");
    }
  }

  // 3. Parse, checking every count against the bytes left before allocating.
  const std::uint64_t end = size - checkpoint_checksum_bytes;
  std::uint64_t pos = checkpoint_header_bytes;
  auto fits = [&](std::uint64_t count, std::uint64_t elem) { return count <= (end - pos) / elem; };
  out.shard = c::load_le<std::uint32_t>(h.data() + 24);
  out.num_shards = c::load_le<std::uint32_t>(h.data() + 28);
  out.num_workers = c::load_le<std::uint32_t>(h.data() + 32);
  out.state_per_param = c::load_le<std::uint32_t>(h.data() + 36);
  const std::uint32_t tables = c::load_le<std::uint32_t>(h.data() + 40);
  out.server_clock = c::load_le<std::int64_t>(h.data() + 48);
  if (out.num_shards == 0 || out.shard >= out.num_shards)
    return bad("shard " + std::to_string(out.shard) + " is not below num_shards " +
               std::to_string(out.num_shards));
  if (!fits(out.num_workers, 8))
    return bad("num_workers " + std::to_string(out.num_workers) + " exceeds the file size");
  out.worker_clocks.resize(out.num_workers);
  if (auto ec = c::read_at(fd.get(), pos, out.worker_clocks.data(), out.num_workers * 8ull))
    return io_error(ec, "worker_clocks");
  pos += out.num_workers * 8ull;
  const std::uint64_t applied = std::uint64_t{out.num_workers} * tables;
  if (!fits(applied, 8) || !fits(tables, checkpoint_table_record_bytes))
    return bad("table_count " + std::to_string(tables) + " exceeds the file size");
  out.applied.resize(static_cast<std::size_t>(applied));
  if (auto ec = c::read_at(fd.get(), pos, out.applied.data(), applied * 8))
    return io_error(ec, "applied");
  pos += applied * 8;
  out.tables.resize(tables);
  for (std::uint32_t i = 0; i < tables; ++i) {
    const std::string which = "table " + std::to_string(i);
    if (!fits(1, checkpoint_table_record_bytes)) return bad(which + " record is truncated");
    std::array<std::byte, checkpoint_table_record_bytes> r{};
    if (auto ec = c::read_at(fd.get(), pos, r.data(), r.size())) return io_error(ec, which);
    pos += r.size();
    auto& t = out.tables[i];
    t.spec.id = c::load_le<std::uint32_t>(r.data());
    t.spec.rows = c::load_le<std::uint32_t>(r.data() + 4);
    t.spec.width = c::load_le<std::uint32_t>(r.data() + 8);
    t.spec.init_scale = c::load_le<float>(r.data() + 12);
    t.range.begin = c::load_le<std::uint32_t>(r.data() + 16);
    t.range.end = c::load_le<std::uint32_t>(r.data() + 20);
    t.step = c::load_le<std::uint64_t>(r.data() + 24);
    const auto nv = c::load_le<std::uint64_t>(r.data() + 32);
    const auto ns = c::load_le<std::uint64_t>(r.data() + 40);
    if (t.range.end < t.range.begin)
      return bad(which + " has an inverted row range [" + std::to_string(t.range.begin) + ", " +
                 std::to_string(t.range.end) + ")");
    if (nv != std::uint64_t{t.range.size()} * t.spec.width)
      return bad(which + " value_count " + std::to_string(nv) + " differs from rows x width " +
                 std::to_string(std::uint64_t{t.range.size()} * t.spec.width));
    if (!fits(nv, 4))
      return bad(which + " value_count " + std::to_string(nv) + " exceeds the file");
    const std::uint32_t p = out.state_per_param;
    if (p == 0 ? ns != 0 : (ns % p != 0 || ns / p != nv))  // (nv * p could overflow)
      return bad(which + " state_count " + std::to_string(ns) + " is not state_per_param (" +
                 std::to_string(p) + ") x value_count (" + std::to_string(nv) + ")");
    if (!fits(ns, 4) || nv + ns > (end - pos) / 4)
      return bad(which + " state_count " + std::to_string(ns) + " exceeds the file");
    t.values.resize(static_cast<std::size_t>(nv));
    if (auto ec = c::read_at(fd.get(), pos, t.values.data(), nv * 4)) return io_error(ec, which);
    pos += nv * 4;
    t.optimizer_state.resize(static_cast<std::size_t>(ns));
    if (auto ec = c::read_at(fd.get(), pos, t.optimizer_state.data(), ns * 4))
      return io_error(ec, which);
    pos += ns * 4;
  }
  if (pos != end)
    return bad(std::to_string(end - pos) + " unexpected bytes after the last table record");
  return BOOST_OUTCOME_V2_NAMESPACE::success();
}

namespace ckpt {
// Calls `f(path)` for every entry of `dir`; a missing directory has no entries.
template <class F>
std::error_code for_each_file(const std::filesystem::path& dir, F&& f) {
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return ec == std::errc::no_such_file_or_directory ? std::error_code{} : ec;
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (ec) return ec;
    f(it->path());
  }
  return ec;
}
}  // namespace ckpt

/// The checkpoint files of shard `shard` in `dir`, newest (highest clock) first. Files whose
/// names do not match `checkpoint_file_name` (including `.tmp` files) are ignored; the files
/// are not opened. A missing directory yields an empty list. Errors: a system error when the
/// directory cannot be read.
inline result<std::vector<checkpoint_file>> list_checkpoints(const std::filesystem::path& dir,
                                                             std::uint32_t shard) {
  std::vector<checkpoint_file> files;
  if (auto ec = ckpt::for_each_file(dir, [&](const std::filesystem::path& path) {
        if (auto clock = parse_checkpoint_file_name(path.filename().string(), shard))
          files.push_back(checkpoint_file{path, *clock});
      }))
    return ec;
  std::sort(files.begin(), files.end(),
            [](const checkpoint_file& a, const checkpoint_file& b) { return a.clock > b.clock; });
  return files;
}

/// Deletes all but the newest `keep` checkpoint files of shard `shard` in `dir`; `keep == 0`
/// deletes nothing. Returns the number of files deleted. Errors: a system error when the
/// directory cannot be read or a file cannot be removed (files after it are then kept).
inline result<std::size_t> prune_checkpoints(const std::filesystem::path& dir, std::uint32_t shard,
                                             std::uint32_t keep) {
  if (keep == 0) return std::size_t{0};
  auto files = list_checkpoints(dir, shard);
  if (files.has_error()) return files.error();
  std::size_t removed = 0;
  for (std::size_t i = keep; i < files.value().size(); ++i) {
    std::error_code ec;
    std::filesystem::remove(files.value()[i].path, ec);
    if (ec) return ec;
    ++removed;
  }
  return removed;
}

/// Unfinished writes (`shard-<shard>-clock-*.ckpt.tmp`, left by a crash during a persist) of
/// shard `shard` in `dir`. A missing directory yields an empty list.
inline result<std::vector<std::filesystem::path>>
list_stale_checkpoint_tmps(const std::filesystem::path& dir, std::uint32_t shard) {
  std::vector<std::filesystem::path> files;
  if (auto ec = ckpt::for_each_file(dir, [&](const std::filesystem::path& path) {
        std::string name = path.filename().string();
        if (!name.ends_with(".tmp")) return;
        name.resize(name.size() - 4);
        if (parse_checkpoint_file_name(name, shard)) files.push_back(path);
      }))
    return ec;
  return files;
}

}  // namespace asyncps::detail
