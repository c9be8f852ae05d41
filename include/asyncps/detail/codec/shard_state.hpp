// asyncps — detail: the one encoding of a `shard_state`, shared by chain replication's state
// transfer (the payload of a policy's state message: the chain's state transfer, the replica
// log's state replica) and checkpoint files (which only frame it with a
// header and a checksum, see recovery/checkpoint/file.hpp). Little-endian, no padding:
//
//   u32 shard, u32 num_shards, u32 num_workers, u32 state_per_param, u32 tables,
//   u32 has_last_seq (0/1), i64 server_clock,
//   num_workers x i64 worker clocks, num_workers*tables x u64 applied,
//   [num_workers x u64 last_seq when has_last_seq],
//   per table: u32 id, u32 rows, u32 width, f32 init_scale, u32 range.begin, u32 range.end,
//              u64 step, u64 values, u64 optimizer floats, values x f32, optimizer x f32.
//
// Integrity is the frame's (or the file's) checksum's job; decoding checks every count against
// the bytes left before it resizes anything. The encoder and decoder are written once, against
// a byte sink / source, so a span in memory and a file stream use the same code.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "asyncps/detail/endian.hpp"
#include "asyncps/error.hpp"
#include "asyncps/shard_state.hpp"

namespace asyncps::detail {

/// Bytes of the fixed fields before the worker clocks.
inline constexpr std::size_t state_header_bytes = 32;
/// Bytes of the fixed part of each table record (before its floats).
inline constexpr std::size_t state_table_record_bytes = 48;

/// Where `encode_state` writes: `put(v)` appends one little-endian scalar (u32, u64, i64),
/// `put_floats(span)` appends float32 values as they are in memory.
template <class S>
concept state_sink = requires(S& s, std::uint32_t u, std::span<const float> f) {
  s.put(u);
  s.put_floats(f);
};

/// Where `decode_state` reads from: `take(v)` reads one little-endian scalar (false when fewer
/// than `sizeof v` bytes are left), `take_floats(span)` fills the span (false when too few bytes
/// are left), `left()` is the number of bytes not read yet.
template <class S>
concept state_source = requires(S& s, std::uint32_t& u, std::span<float> f) {
  { s.take(u) } -> std::same_as<bool>;
  { s.take_floats(f) } -> std::same_as<bool>;
  { s.left() } -> std::convertible_to<std::uint64_t>;
};

/// Bytes `encode_state` writes for `st`.
inline std::size_t encoded_state_size(const shard_state& st) noexcept {
  std::size_t n = state_header_bytes + st.worker_clocks.size() * 8 + st.applied.size() * 8 +
                  st.last_seq.size() * 8;
  for (const auto& t : st.tables)
    n += state_table_record_bytes + (t.values.size() + t.optimizer_state.size()) * 4;
  return n;
}

/// "" when `st` is consistent (so that its encoding decodes back to it and a server can check
/// its layout); otherwise a one-line reason naming the field. `basic_server::save_state`
/// always fills a consistent state.
inline std::string state_inconsistency(const shard_state& st) {
  const std::uint64_t tables = st.tables.size();
  if (st.num_shards == 0 || st.shard >= st.num_shards)
    return "shard " + std::to_string(st.shard) + " is not below num_shards " +
           std::to_string(st.num_shards);
  if (st.worker_clocks.size() != st.num_workers)
    return "worker_clocks has " + std::to_string(st.worker_clocks.size()) +
           " entries, num_workers is " + std::to_string(st.num_workers);
  if (st.applied.size() != std::uint64_t{st.num_workers} * tables)
    return "applied has " + std::to_string(st.applied.size()) + " entries, expected " +
           std::to_string(std::uint64_t{st.num_workers} * tables);
  if (!st.last_seq.empty() && st.last_seq.size() != st.num_workers)
    return "last_seq has " + std::to_string(st.last_seq.size()) + " entries, expected 0 or " +
           std::to_string(st.num_workers);
  for (std::size_t i = 0; i < st.tables.size(); ++i) {
    const auto& t = st.tables[i];
    const std::string which = "table " + std::to_string(i);
    if (t.range.end < t.range.begin)
      return which + " has an inverted row range [" + std::to_string(t.range.begin) + ", " +
             std::to_string(t.range.end) + ")";
    const std::uint64_t v = std::uint64_t{t.range.size()} * t.spec.width;
    if (t.values.size() != v)
      return which + " value_count " + std::to_string(t.values.size()) +
             " differs from rows x width " + std::to_string(v);
    if (t.optimizer_state.size() != v * st.state_per_param)
      return which + " state_count " + std::to_string(t.optimizer_state.size()) +
             " (optimizer floats) is not state_per_param (" + std::to_string(st.state_per_param) +
             ") x value_count (" + std::to_string(v) + ")";
  }
  return {};
}

/// Writes the encoding of `st` to `out`. Precondition: `st` is consistent
/// (`state_inconsistency(st)` is empty; `basic_server::save_state` fills one so).
template <state_sink Sink>
void encode_state(const shard_state& st, Sink& out) {
  out.put(st.shard);
  out.put(st.num_shards);
  out.put(st.num_workers);
  out.put(st.state_per_param);
  out.put(static_cast<std::uint32_t>(st.tables.size()));
  out.put(static_cast<std::uint32_t>(st.last_seq.empty() ? 0 : 1));
  out.put(static_cast<std::int64_t>(st.server_clock));
  for (auto c : st.worker_clocks) out.put(static_cast<std::int64_t>(c));
  for (auto a : st.applied) out.put(a);
  for (auto s : st.last_seq) out.put(s);
  for (const auto& t : st.tables) {
    out.put(t.spec.id);
    out.put(t.spec.rows);
    out.put(t.spec.width);
    std::uint32_t scale_bits = 0;
    std::memcpy(&scale_bits, &t.spec.init_scale, 4);
    out.put(scale_bits);
    out.put(t.range.begin);
    out.put(t.range.end);
    out.put(t.step);
    out.put(static_cast<std::uint64_t>(t.values.size()));
    out.put(static_cast<std::uint64_t>(t.optimizer_state.size()));
    out.put_floats(std::span<const float>(t.values));
    out.put_floats(std::span<const float>(t.optimizer_state));
  }
}

/// Reads one encoded `shard_state` from `in` into `out`, reusing its vectors' capacity. Every
/// count is checked against `in.left()` before anything is resized, so a corrupt or hostile
/// count cannot cause a huge allocation. Returns "" on success, otherwise a one-line reason
/// naming the field (e.g. "num_workers 4294967295 exceeds the bytes left"); `out` then holds
/// unspecified (valid) contents. Only the structure is checked: whether the counts agree with
/// each other is `state_inconsistency`'s question, whether the state fits a server is
/// `basic_server::restore_state`'s. Bytes after the record are the caller's concern.
template <state_source Source>
std::string decode_state(Source& in, shard_state& out) {
  auto exceeds = [](const std::string& what, std::uint64_t n) {
    return what + " " + std::to_string(n) + " exceeds the bytes left";
  };
  std::uint32_t tables = 0, has_last_seq = 0;
  std::int64_t server_clock = 0;
  if (!in.take(out.shard) || !in.take(out.num_shards) || !in.take(out.num_workers) ||
      !in.take(out.state_per_param) || !in.take(tables) || !in.take(has_last_seq) ||
      !in.take(server_clock))
    return "the header is truncated";
  if (has_last_seq > 1) return "has_last_seq " + std::to_string(has_last_seq) + " is not 0 or 1";
  out.server_clock = server_clock;
  const std::uint64_t w = out.num_workers;
  // Bound each count by the bytes present before multiplying (no overflow, no huge resize).
  if (w > in.left() / 8) return exceeds("num_workers", w);
  if (tables > in.left() / state_table_record_bytes) return exceeds("table_count", tables);
  const std::uint64_t fixed = w * 8 + w * tables * 8 + (has_last_seq != 0 ? w * 8 : 0);
  if (fixed > in.left()) return exceeds("table_count", tables);
  out.worker_clocks.resize(w);
  for (auto& c : out.worker_clocks) {
    std::int64_t v = 0;
    in.take(v);
    c = v;
  }
  out.applied.resize(w * tables);
  for (auto& a : out.applied) in.take(a);
  out.last_seq.resize(has_last_seq != 0 ? w : 0);
  for (auto& s : out.last_seq) in.take(s);
  out.tables.resize(tables);
  for (std::uint32_t i = 0; i < tables; ++i) {
    auto& t = out.tables[i];
    const auto which = [i] { return "table " + std::to_string(i); };
    std::uint32_t scale_bits = 0;
    std::uint64_t nv = 0, ns = 0;
    if (!in.take(t.spec.id) || !in.take(t.spec.rows) || !in.take(t.spec.width) ||
        !in.take(scale_bits) || !in.take(t.range.begin) || !in.take(t.range.end) ||
        !in.take(t.step) || !in.take(nv) || !in.take(ns))
      return which() + " record is truncated";
    std::memcpy(&t.spec.init_scale, &scale_bits, 4);
    if (nv > in.left() / 4) return exceeds(which() + " value_count", nv);
    if (ns > in.left() / 4 || nv + ns > in.left() / 4) return exceeds(which() + " state_count", ns);
    t.values.resize(nv);
    t.optimizer_state.resize(ns);
    if (!in.take_floats(std::span<float>(t.values)) ||
        !in.take_floats(std::span<float>(t.optimizer_state)))
      return which() + " floats are truncated";
  }
  return {};
}

/// A `state_sink` over a span of exactly `encoded_state_size` bytes.
class span_state_sink {
 public:
  /// Writes into `out`, from its start.
  explicit span_state_sink(std::span<std::byte> out) noexcept : p_(out.data()) {}
  /// Appends `v`, little-endian.
  template <class T>
  void put(T v) noexcept {
    store_le(p_, v);
    p_ += sizeof(T);
  }
  /// Appends the floats' bytes.
  void put_floats(std::span<const float> v) noexcept {
    if (!v.empty()) std::memcpy(p_, v.data(), v.size_bytes());
    p_ += v.size_bytes();
  }

 private:
  std::byte* p_;
};

/// A `state_source` over a span of bytes in memory.
class span_state_source {
 public:
  /// Reads `in` from its start.
  explicit span_state_source(std::span<const std::byte> in) noexcept
      : p_(in.data()), left_(in.size()) {}
  /// Reads one `T`; false when fewer than `sizeof(T)` bytes are left.
  template <class T>
  bool take(T& v) noexcept {
    if (left_ < sizeof(T)) return false;
    v = load_le<T>(p_);
    p_ += sizeof(T);
    left_ -= sizeof(T);
    return true;
  }
  /// Fills `v`; false when too few bytes are left.
  bool take_floats(std::span<float> v) noexcept {
    if (v.size_bytes() > left_) return false;
    if (!v.empty()) std::memcpy(v.data(), p_, v.size_bytes());
    p_ += v.size_bytes();
    left_ -= v.size_bytes();
    return true;
  }
  /// Bytes not read yet.
  std::uint64_t left() const noexcept { return left_; }

 private:
  const std::byte* p_;
  std::size_t left_;
};

/// Writes `st` into `out` (exactly `encoded_state_size(st)` bytes): a state message's
/// payload. Precondition: `st` is consistent (as `basic_server::save_state` fills it).
inline void encode_state(const shard_state& st, std::span<std::byte> out) noexcept {
  span_state_sink sink(out);
  encode_state(st, sink);  // (allocates nothing: span_state_sink does not throw)
}

/// Decodes a state message's payload `in` into `out` (reusing its capacity). Errors:
/// `errc::payload_size_mismatch` with `why` set to " (state transfer: <reason>)" naming the
/// field when a count disagrees with the bytes present, or bytes are left over (nothing else
/// is checked here: `basic_server::restore_state` checks that the state fits the server).
inline std::error_code decode_state(std::span<const std::byte> in, shard_state& out,
                                    std::string& why) {
  span_state_source source(in);
  std::string bad = decode_state(source, out);
  if (bad.empty() && source.left() != 0)
    bad = std::to_string(source.left()) + " trailing bytes after the state";
  if (bad.empty()) return {};
  why = " (state transfer: " + bad + ")";
  return make_error_code(errc::payload_size_mismatch);
}

}  // namespace asyncps::detail
