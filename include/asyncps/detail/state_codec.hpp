// asyncps — detail: the in-memory encoding of a `shard_state` carried by a `state` message
// (chain replication's state transfer). Little-endian, no padding:
//
//   u32 shard, u32 num_shards, u32 num_workers, u32 state_per_param, u32 tables,
//   u32 has_last_seq (0/1), i64 server_clock,
//   num_workers x i64 worker clocks, num_workers*tables x u64 applied,
//   [num_workers x u64 last_seq when has_last_seq],
//   per table: u32 id, u32 rows, u32 width, f32 init_scale, u32 range.begin, u32 range.end,
//              u64 step, u64 values, u64 optimizer floats, values x f32, optimizer x f32.
//
// Integrity is the frame checksum's job; decoding checks every count against the bytes left.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <system_error>

#include "asyncps/detail/endian.hpp"
#include "asyncps/error.hpp"
#include "asyncps/shard_state.hpp"

namespace asyncps::detail {

/// Bytes `encode_state` writes for `st`.
inline std::size_t encoded_state_size(const shard_state& st) noexcept {
  std::size_t n = 32 + st.worker_clocks.size() * 8 + st.applied.size() * 8 + st.last_seq.size() * 8;
  for (const auto& t : st.tables) n += 48 + (t.values.size() + t.optimizer_state.size()) * 4;
  return n;
}

/// Writes `st` into `out` (exactly `encoded_state_size(st)` bytes). Precondition: `st` is
/// consistent (as `basic_server::save_state` fills it).
inline void encode_state(const shard_state& st, std::span<std::byte> out) noexcept {
  std::byte* p = out.data();
  auto put = [&p](auto v) {
    store_le(p, v);
    p += sizeof(v);
  };
  auto put_floats = [&p](const std::vector<float>& v) {
    if (!v.empty()) std::memcpy(p, v.data(), v.size() * sizeof(float));
    p += v.size() * sizeof(float);
  };
  put(st.shard);
  put(st.num_shards);
  put(st.num_workers);
  put(st.state_per_param);
  put(static_cast<std::uint32_t>(st.tables.size()));
  put(static_cast<std::uint32_t>(st.last_seq.empty() ? 0 : 1));
  put(static_cast<std::int64_t>(st.server_clock));
  for (auto c : st.worker_clocks) put(static_cast<std::int64_t>(c));
  for (auto a : st.applied) put(a);
  for (auto s : st.last_seq) put(s);
  for (const auto& t : st.tables) {
    put(t.spec.id);
    put(t.spec.rows);
    put(t.spec.width);
    std::uint32_t scale_bits = 0;
    std::memcpy(&scale_bits, &t.spec.init_scale, 4);
    put(scale_bits);
    put(t.range.begin);
    put(t.range.end);
    put(t.step);
    put(static_cast<std::uint64_t>(t.values.size()));
    put(static_cast<std::uint64_t>(t.optimizer_state.size()));
    put_floats(t.values);
    put_floats(t.optimizer_state);
  }
}

/// Decodes `in` into `out` (reusing its capacity). Errors: `errc::payload_size_mismatch` with
/// `why` naming the field when a count disagrees with the bytes present (nothing else is
/// checked here: `basic_server::restore_state` checks that the state fits the server).
inline std::error_code decode_state(std::span<const std::byte> in, shard_state& out,
                                    std::string& why) {
  const std::byte* p = in.data();
  std::size_t left = in.size();
  auto fail = [&why](const char* what) {
    why = std::string(" (state transfer: ") + what + " does not fit the payload)";
    return make_error_code(errc::payload_size_mismatch);
  };
  auto take = [&p, &left]<class T>(T& v) {
    if (left < sizeof(T)) return false;
    v = load_le<T>(p);
    p += sizeof(T);
    left -= sizeof(T);
    return true;
  };
  std::uint32_t tables = 0, has_last_seq = 0;
  std::int64_t server_clock = 0;
  if (!take(out.shard) || !take(out.num_shards) || !take(out.num_workers) ||
      !take(out.state_per_param) || !take(tables) || !take(has_last_seq) || !take(server_clock))
    return fail("header");
  out.server_clock = server_clock;
  const std::uint64_t w = out.num_workers;
  // Bound each count by the bytes present before multiplying (no overflow, no huge resize).
  if (w > left / 8 || tables > left / 48) return fail("worker and table counts");
  const std::uint64_t fixed = w * 8 + w * tables * 8 + (has_last_seq != 0 ? w * 8 : 0);
  if (fixed > left) return fail("worker and table counts");
  out.worker_clocks.resize(w);
  for (auto& c : out.worker_clocks) {
    std::int64_t v = 0;
    take(v);
    c = v;
  }
  out.applied.resize(w * tables);
  for (auto& a : out.applied) take(a);
  out.last_seq.resize(has_last_seq != 0 ? w : 0);
  for (auto& s : out.last_seq) take(s);
  out.tables.resize(tables);
  for (auto& t : out.tables) {
    std::uint32_t scale_bits = 0;
    std::uint64_t nv = 0, ns = 0;
    if (!take(t.spec.id) || !take(t.spec.rows) || !take(t.spec.width) || !take(scale_bits) ||
        !take(t.range.begin) || !take(t.range.end) || !take(t.step) || !take(nv) || !take(ns))
      return fail("a table record");
    std::memcpy(&t.spec.init_scale, &scale_bits, 4);
    if (nv > left / 4 || ns > left / 4 || (nv + ns) * 4 > left) return fail("a table's floats");
    t.values.resize(nv);
    if (nv != 0) std::memcpy(t.values.data(), p, nv * 4);
    p += nv * 4;
    t.optimizer_state.resize(ns);
    if (ns != 0) std::memcpy(t.optimizer_state.data(), p + 0, ns * 4);
    p += ns * 4;
    left -= (nv + ns) * 4;
  }
  if (left != 0) return fail("trailing bytes");
  return {};
}

}  // namespace asyncps::detail
