// asyncps — recovery::checkpoint: the directory of checkpoint files (names, listing, pruning,
// the restore scan). The file format itself is recovery/checkpoint/file.hpp's.
//
// Files of a directory are named `shard-<shard>-clock-<clock, 12 digits zero-padded>.ckpt`;
// writes go to `<name>.tmp` first, which is fsync'ed and then renamed over `<name>`, so a
// crash leaves either the old set of files or the new one, plus at most a stale `.tmp`.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "asyncps/layout.hpp"
#include "asyncps/recovery/checkpoint/file.hpp"
#include "asyncps/recovery/checkpoint/options.hpp"
#include "asyncps/result.hpp"
#include "asyncps/shard_state.hpp"

namespace asyncps::recovery {

/// One checkpoint file found in a directory.
struct checkpoint_file {
  std::filesystem::path path;  ///< full path of the file
  clock_value clock = 0;       ///< the server clock in its name
};

/// Helpers of this header (not part of the interface).
namespace checkpoint_detail {
/// "shard-<shard>-clock-": how every file name of `shard` starts.
inline std::string shard_prefix(std::uint32_t shard) {
  return "shard-" + std::to_string(shard) + "-clock-";
}

/// Calls `f(path)` for every entry of `dir`; a missing directory has no entries.
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
}  // namespace checkpoint_detail

/// The name of shard `shard`'s checkpoint at server clock `clock`:
/// `shard-<shard>-clock-<clock, zero-padded to 12 digits>.ckpt`. Precondition: `clock >= 0`.
inline std::string checkpoint_file_name(std::uint32_t shard, clock_value clock) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%012lld", static_cast<long long>(clock));
  return checkpoint_detail::shard_prefix(shard) + digits + ".ckpt";
}

/// The clock in `name` when it is a checkpoint file name of shard `shard` (see
/// `checkpoint_file_name`; at least 12 digits), else nothing. `.tmp` files do not match.
inline std::optional<clock_value> parse_checkpoint_file_name(std::string_view name,
                                                             std::uint32_t shard) {
  const std::string prefix = checkpoint_detail::shard_prefix(shard);
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

/// The checkpoint files of shard `shard` in `dir`, newest (highest clock) first. Files whose
/// names do not match `checkpoint_file_name` (including `.tmp` files) are ignored; the files
/// are not opened. A missing directory yields an empty list. Errors: a system error when the
/// directory cannot be read.
inline result<std::vector<checkpoint_file>> list_checkpoints(const std::filesystem::path& dir,
                                                             std::uint32_t shard) {
  std::vector<checkpoint_file> files;
  if (auto ec = checkpoint_detail::for_each_file(dir, [&](const std::filesystem::path& path) {
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
  if (auto ec = checkpoint_detail::for_each_file(dir, [&](const std::filesystem::path& path) {
        std::string name = path.filename().string();
        if (!name.ends_with(".tmp")) return;
        name.resize(name.size() - 4);
        if (parse_checkpoint_file_name(name, shard)) files.push_back(path);
      }))
    return ec;
  return files;
}

/// What a persist or a restore scan reports: an error (empty: none) and a line that names the
/// file and the reason.
struct checkpoint_outcome {
  std::error_code error{};
  std::string why;
};

/// One shard's checkpoints in one directory: writes them (through the configured writer) and
/// prunes, and finds the newest one that restores. Holds no open file; `persist` and
/// `restore` touch only this shard's files, so stores of different shards may share a
/// directory. Thread safety: `persist` may run on another thread than `restore`, never at the
/// same time as it (the server part guarantees this).
class checkpoint_store {
 public:
  /// A store for shard `shard` in `directory`, keeping the newest `keep` files (0: all),
  /// writing with `writer` (empty: `detail::write_checkpoint`).
  checkpoint_store(std::filesystem::path directory, std::uint32_t shard, std::uint32_t keep,
                   checkpoint_writer writer)
      : dir_(std::move(directory)), shard_(shard), keep_(keep), writer_(std::move(writer)) {}

  /// The directory.
  const std::filesystem::path& directory() const noexcept { return dir_; }
  /// The shard whose files this store handles.
  std::uint32_t shard() const noexcept { return shard_; }
  /// Sets the shard (the server part learns it in `on_start`).
  void set_shard(std::uint32_t shard) noexcept { shard_ = shard; }
  /// The path of this shard's checkpoint at `clock`.
  std::filesystem::path file_of(clock_value clock) const {
    return dir_ / checkpoint_file_name(shard_, clock);
  }

  /// Writes `st` as the checkpoint at `clock` (shard `st.shard`), then prunes to `keep` files.
  /// Returns true when the file was written; `out` receives a failure (of the write, or of the
  /// pruning after a successful write) with a line naming the file. Called on the persist
  /// thread.
  bool persist(clock_value clock, const shard_state& st, checkpoint_outcome& out) const {
    const std::filesystem::path file = dir_ / checkpoint_file_name(st.shard, clock);
    result<void> r = writer_ ? writer_(file, st) : detail::write_checkpoint(file, st, &out.why);
    if (r.has_error()) {
      out.error = r.error();
      if (out.why.empty()) out.why = "checkpoint " + file.string() + ": " + out.error.message();
      return false;
    }
    auto pruned = prune_checkpoints(dir_, st.shard, keep_);
    if (pruned.has_error()) {
      out.error = pruned.error();
      out.why = "checkpoint " + file.string() + " written, but pruning old checkpoints in " +
                dir_.string() + " failed: " + out.error.message();
    }
    return true;
  }

  /// The restore scan: creates the directory, removes this shard's unfinished `.tmp` files,
  /// then tries this shard's files newest first: each is read into `buffer`
  /// (`detail::read_checkpoint`) and offered to `install(const shard_state&) ->
  /// std::error_code`; a file that does not read back valid, or that `install` refuses, is
  /// logged with its reason through `log(std::string_view)` and the next older one is tried.
  /// Returns the restored clock (-1: none), or nothing when the scan could not run (the
  /// directory cannot be created or listed; `failure` then says why). Called on the server's
  /// executor.
  template <class Install, class Log>
  std::optional<clock_value> restore(shard_state& buffer, Install&& install, Log&& log,
                                     checkpoint_outcome& failure) const {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) {
      failure = {ec, "cannot create checkpoint directory " + dir_.string() + ": " + ec.message()};
      return std::nullopt;
    }
    if (auto tmps = list_stale_checkpoint_tmps(dir_, shard_); tmps.has_value()) {
      for (const auto& t : tmps.value()) {
        std::filesystem::remove(t, ec);
        log("removed unfinished checkpoint " + t.string() + " (a persist was interrupted)" +
            (ec ? " failed: " + ec.message() : std::string()));
      }
    }
    auto files = list_checkpoints(dir_, shard_);
    if (files.has_error()) {
      failure = {files.error(), "cannot list checkpoint directory " + dir_.string() + ": " +
                                    files.error().message()};
      return std::nullopt;
    }
    for (const auto& f : files.value()) {
      std::string why;
      if (auto r = detail::read_checkpoint(f.path, buffer, &why); r.has_error()) {
        log("rejected " + why + "; trying an older checkpoint");
        continue;
      }
      if (std::error_code rec = install(buffer)) {
        log("rejected checkpoint " + f.path.string() + ": it does not fit this server (" +
            rec.message() + "); trying an older checkpoint");
        continue;
      }
      log("restored from " + f.path.string() + " (server clock " +
          std::to_string(buffer.server_clock) + ")");
      return buffer.server_clock;
    }
    log(files.value().empty()
            ? "no checkpoint of this shard in " + dir_.string() + "; starting fresh"
            : "no valid checkpoint of this shard in " + dir_.string() + "; starting fresh");
    return clock_value{-1};
  }

 private:
  std::filesystem::path dir_;
  std::uint32_t shard_;
  std::uint32_t keep_;
  checkpoint_writer writer_;
};

}  // namespace asyncps::recovery
