// asyncps — detail::shard_core, the update path: a push checked (finite values, a finite
// update) and applied through the optimizer, in one pass over its bytes (`check_and_apply`),
// or checked without applying (`check_update`) and applied unchecked (`apply`).
//
// Out-of-line definitions of members declared in asyncps/detail/server/shard_core.hpp. Not a header
// to include on its own: shard_core.hpp includes it at its end, after the class it defines members
// of (so this file does not include shard_core.hpp back).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <system_error>
#include <utility>

#include "asyncps/error.hpp"
#include "asyncps/optimizer.hpp"
#include "asyncps/table.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::detail {

template <optimizer_policy Optimizer, class Reader, class TimePoint>
std::error_code shard_core<Optimizer, Reader, TimePoint>::check_update(const message& m,
                                                                       std::string& detail) {
  const auto& h = m.header;
  auto& t = tables_[h.table];
  const auto grad = payload_floats(m);
  const std::uint32_t w = t.spec.width;
  const std::uint64_t step = t.step + 1;  // the step `apply` would use
  const auto opt = push_optimizer(m);
  row_id bad = 0;
  std::error_code ec;
  // One chunk of `c` floats of the push at `g`, for values from `off`: finite, and so is
  // the update. Sets `ec` otherwise.
  const auto chunk_ok = [&](std::size_t off, std::size_t c, const float* g) {
    if (!all_finite(std::span<const float>(g, c))) {
      ec = errc::non_finite_value;
    } else if (!candidates_finite(opt, t, off, c, g, step)) {
      ec = errc::non_finite_update;
    }
    return !ec;
  };
  if (h.has(frame_flags::range)) {
    const auto first = static_cast<row_id>(h.first_row);
    const std::size_t off = std::size_t{first - t.range.begin} * w;
    const std::size_t n = std::size_t{h.row_count} * w;
    for (std::size_t done = 0; !ec && done < n; done += check_chunk) {
      if (!chunk_ok(off + done, std::min(check_chunk, n - done), grad.data() + done))
        bad = first + static_cast<row_id>(done / w);
    }
  } else {
    const auto keys = payload_keys(m);
    for (std::uint32_t i = 0; !ec && i < h.row_count; ++i) {
      const std::size_t off = std::size_t{keys[i] - t.range.begin} * w;
      for (std::size_t done = 0; !ec && done < w; done += check_chunk) {
        if (!chunk_ok(off + done, std::min<std::size_t>(check_chunk, w - done),
                      grad.data() + std::size_t{i} * w + done))
          bad = keys[i];
      }
    }
  }
  if (!ec) return {};
  detail = " (table " + std::to_string(h.table) + ", at or after row " + std::to_string(bad) + ")";
  return ec;
}

template <optimizer_policy Optimizer, class Reader, class TimePoint>
std::error_code shard_core<Optimizer, Reader, TimePoint>::check_and_apply(const message& m,
                                                                          std::string& detail) {
  constexpr std::size_t planes = Optimizer::state_per_param;
  const auto& h = m.header;
  auto& t = tables_[h.table];
  const auto grad = payload_floats(m);
  const std::uint32_t w = t.spec.width;
  const std::uint64_t step = t.step + 1;
  const auto opt = push_optimizer(m);
  const bool ranged = h.has(frame_flags::range);
  const auto keys = ranged ? std::span<const row_id>{} : payload_keys(m);
  const std::size_t total = grad.size();
  const auto plane = [&](std::size_t k, std::size_t off) {
    return t.state.data() + k * t.values.size() + off;
  };
  // Chunks end on addresses aligned for Eigen's packets, in the values and in every state
  // plane alike, so each element takes the packet or the scalar path that `apply(m)` (one call
  // over the whole range, or per keyed row) gives it: the same bits, also where the two paths
  // differ (Eigen's fast packet sqrt). Otherwise, or for an optimizer without `stays_finite`
  // (whose `apply` may not be element by element), check, then apply, as `apply(m)` does.
  const auto misalign = [](const float* p) { return reinterpret_cast<std::uintptr_t>(p) % align; };
  // Read access only until a write is decided: the non-const `data()` copies shared values.
  const float* const old_values = std::as_const(t.values).data();
  bool chunked = has_stays_finite;
  for (std::size_t k = 0; k < planes; ++k)
    chunked = chunked && misalign(plane(k, 0)) == misalign(old_values);
  if (!chunked) {
    if (auto ec = check_update(m, detail)) return ec;
    apply(m);
    return {};
  }
  // A push of the whole table (a dense model's worker pushes its whole slice) is written out
  // of place: each chunk's values are copied into a fresh block of the table's pool and
  // updated there, and the block becomes the values only once every chunk passed. The old
  // values need no undo copy, and a reply that still holds them keeps them without a
  // copy-on-write. Any other push (or a block that would not be aligned like the values)
  // updates the values in place, saving each chunk in the undo buffer first. The state
  // planes are always updated in place and saved.
  const bool whole = ranged && total > 0 && static_cast<row_id>(h.first_row) == t.range.begin &&
                     total == t.values.size();
  buffer next = whole ? t.values.fresh_block() : buffer{};
  float* const out = next.empty() ? nullptr : next.floats().data();
  const bool out_of_place = out != nullptr && misalign(out) == misalign(old_values);
  const std::size_t saved = out_of_place ? 0 : 1;  // value planes saved in undo_
  if (undo_.size() < total * (saved + planes)) undo_.resize(total * (saved + planes));
  // Calls f(off, n, u) for each chunk of a run of `len` floats at `off` in the table and `u0`
  // in the push, until f returns false: the first chunk ends at the first aligned address
  // plus `check_chunk` floats, the others `check_chunk` floats later.
  const auto run_chunks = [&](std::size_t off, std::size_t len, std::size_t u0, auto& f) {
    const std::size_t head = (align - misalign(old_values + off)) % align / sizeof(float);
    for (std::size_t d = 0, end = 0; d < len; d = end) {
      end = std::min(len, (d == 0 ? head : d) + check_chunk);
      if (!f(off + d, end - d, u0 + d)) return false;
    }
    return true;
  };
  // The chunks of the push, in push order: the range, or each keyed row.
  const auto for_chunks = [&](auto&& f) {
    if (ranged) {
      (void)run_chunks(std::size_t{static_cast<row_id>(h.first_row) - t.range.begin} * w, total, 0,
                       f);
    } else {
      for (std::uint32_t i = 0; i < h.row_count; ++i)
        if (!run_chunks(std::size_t{keys[i] - t.range.begin} * w, w, std::size_t{i} * w, f)) return;
    }
  };
  std::size_t done = 0;  // floats of the push applied (saved in undo_)
  std::size_t bad = 0;   // the failing chunk's first float in the push
  std::error_code ec;
  for_chunks([&](std::size_t off, std::size_t n, std::size_t u) {
    float* v = nullptr;
    if (out_of_place) {
      v = out + off;
      std::memcpy(v, old_values + off, n * sizeof(float));
    } else {
      v = t.values.data() + off;
      std::memcpy(undo_.data() + u, v, n * sizeof(float));
    }
    const float* g = grad.data() + u;
    optimizer_state<planes> st{};
    for (std::size_t k = 0; k < planes; ++k) {
      std::memcpy(undo_.data() + (k + saved) * total + u, plane(k, off), n * sizeof(float));
      st[k] = std::span<float>(plane(k, off), n);
    }
    opt.apply(std::span<float>(v, n), std::span<const float>(g, n), st, step);
    done = u + n;
    if (chunk_finite(g, v, st, n)) return true;
    ec =
        all_finite(std::span<const float>(g, n)) ? errc::non_finite_update : errc::non_finite_value;
    bad = u;
    return false;
  });
  if (!ec) {
    if (out_of_place) t.values.replace(std::move(next));
    t.step = step;
    if (ranged) {
      const auto first = static_cast<row_id>(h.first_row);
      changed(t, key_range{first, first + h.row_count});
    } else {
      ++t.version;
      for (const row_id k : keys) t.row_version[k - t.range.begin] = t.version;
    }
    has_state_ = true;
    return {};
  }
  for_chunks([&](std::size_t off, std::size_t n, std::size_t u) {  // undo
    if (u >= done) return false;
    if (!out_of_place) std::memcpy(t.values.data() + off, undo_.data() + u, n * sizeof(float));
    for (std::size_t k = 0; k < planes; ++k)
      std::memcpy(plane(k, off), undo_.data() + (k + saved) * total + u, n * sizeof(float));
    return true;
  });
  const std::size_t row = bad / w;
  detail = " (table " + std::to_string(h.table) + ", at or after row " +
           std::to_string(ranged ? static_cast<row_id>(h.first_row + row) : keys[row]) + ")";
  return ec;
}

template <optimizer_policy Optimizer, class Reader, class TimePoint>
void shard_core<Optimizer, Reader, TimePoint>::apply(const message& m) {
  const auto& h = m.header;
  auto& t = tables_[h.table];
  const auto grad = payload_floats(m);
  const std::uint32_t w = t.spec.width;
  const auto opt = push_optimizer(m);
  ++t.step;
  if (h.has(frame_flags::range)) {
    const auto first = static_cast<row_id>(h.first_row);
    apply_rows(opt, t, std::size_t{first - t.range.begin} * w, std::size_t{h.row_count} * w,
               grad.data());
    changed(t, key_range{first, first + h.row_count});
  } else {
    const auto keys = payload_keys(m);
    ++t.version;
    for (std::uint32_t i = 0; i < h.row_count; ++i) {
      apply_rows(opt, t, std::size_t{keys[i] - t.range.begin} * w, w,
                 grad.data() + std::size_t{i} * w);
      t.row_version[keys[i] - t.range.begin] = t.version;
    }
  }
  has_state_ = true;
}

template <optimizer_policy Optimizer, class Reader, class TimePoint>
bool shard_core<Optimizer, Reader, TimePoint>::candidates_finite(const step_optimizer& opt,
                                                                 const shard_table& t,
                                                                 std::size_t off, std::size_t n,
                                                                 const float* g,
                                                                 std::uint64_t step) {
  constexpr std::size_t planes = Optimizer::state_per_param;
  if constexpr (has_stays_finite) {
    optimizer_state<planes> st{};  // spans of float, as apply takes them; only read
    for (std::size_t k = 0; k < planes; ++k)
      st[k] = std::span<float>(const_cast<float*>(t.state.data()) + k * t.values.size() + off, n);
    return opt.stays_finite(std::span<const float>(t.values.data() + off, n),
                            std::span<const float>(g, n), st, step);
  }
  float* v = scratch_.data();
  std::memcpy(v, t.values.data() + off, n * sizeof(float));
  optimizer_state<planes> st{};
  for (std::size_t k = 0; k < planes; ++k) {
    float* sk = scratch_.data() + (k + 1) * check_chunk;
    std::memcpy(sk, t.state.data() + k * t.values.size() + off, n * sizeof(float));
    st[k] = std::span<float>(sk, n);
  }
  opt.apply(std::span<float>(v, n), std::span<const float>(g, n), st, step);
  if (!all_finite(std::span<const float>(v, n))) return false;
  for (std::size_t k = 0; k < planes; ++k)
    if (!all_finite(st[k])) return false;
  return true;
}

template <optimizer_policy Optimizer, class Reader, class TimePoint>
void shard_core<Optimizer, Reader, TimePoint>::apply_rows(const step_optimizer& opt, shard_table& t,
                                                          std::size_t off, std::size_t n,
                                                          const float* g) {
  optimizer_state<Optimizer::state_per_param> st{};
  for (std::size_t k = 0; k < Optimizer::state_per_param; ++k)
    st[k] = std::span<float>(t.state.data() + k * t.values.size() + off, n);
  opt.apply(std::span<float>(t.values.data() + off, n), std::span<const float>(g, n), st, t.step);
}

}  // namespace asyncps::detail
