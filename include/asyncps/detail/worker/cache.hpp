// asyncps — detail::worker_cache: a worker's cached copy of every table, sans-io.
//
// The cache holds all tables (table-major, as `parameter_view` lays them out), split into
// parts: the rows of one table that one shard owns. It installs `rows` messages, stamps each
// part (each row, for models with sparse reads) with the server clock it reflects, re-applies
// the worker's own pushes the server had not applied yet (read-my-writes), and decides per
// part, through the consistency policy, whether a read may go on or needs a pull. It touches
// no socket, timer or executor: `basic_worker` feeds it messages and sends what it returns,
// and tests/unit/worker_core_test.cpp steps it message by message.
//
// Read-my-writes is lazy: a push is kept (`note_push`) and applied to the cache when the cache
// is next read (`refresh_snapshot`, `apply_local`), not when it is sent. When rows of the
// whole part arrive in between and reflect the push (a BSP clock: push, then pull), the push
// is never applied at all, which saves a pass over the part per clock. The operations and
// their order per row are those of applying each push when sent, so the bits are the same.
//
// Rows of a whole part are installed by reference: the part keeps the message's payload (a
// pooled buffer, shared, not copied) as its rows until something writes into the part
// (read-my-writes, rows of part of it) or reads the cache's values, which copies them in
// (`materialize`). A refresh of the snapshot copies a held part from the payload, so in a BSP
// clock the pulled rows are copied once, into the snapshot, instead of twice.
//
// It also keeps the compute snapshot current (`refresh_snapshot`): every write to the cache
// marks its rows changed, and a refresh copies only those rows, or nothing, or (when many
// rows changed) the whole cache in one copy. A table whose rows are all one held part (one
// shard owns the table) is not copied at all: the snapshot shares that payload, which nothing
// writes while it is shared (`snapshot_tables`).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <system_error>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "asyncps/consistency.hpp"
#include "asyncps/detail/worker/hooks.hpp"
#include "asyncps/error.hpp"
#include "asyncps/layout.hpp"
#include "asyncps/staleness.hpp"
#include "asyncps/table.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::detail {

/// One part of a worker's cache: the rows `range` of one table that one shard owns.
struct cache_part {
  key_range range{};
  bool have = false;                  ///< every row of the part is cached
  clock_value clock = no_clock;       ///< server clock of the cached rows (sparse reads: of the
                                      ///< rows read at the last clock)
  bool pulling = false;               ///< a pull is outstanding
  std::uint64_t pushed = 0;           ///< pushes of this part the server counts (applied + sent)
  std::vector<unapplied_push> local;  ///< own pushes not yet reflected in `have` rows
  /// Rows of the whole part installed by reference: the rows' bytes of the payload that holds
  /// them (non-empty when held); the cache's `values()` of the part are stale until
  /// `worker_cache::materialize` copies them in. Mutable: a const read materializes.
  mutable buffer held;
  /// How many of `local` (the first ones) are applied to every row of the part; the rest are
  /// applied at the next read (`worker_cache::apply_local`).
  std::size_t local_applied = 0;
  /// Sparse reads: the server clock of each cached row (no_clock: not cached), how many rows
  /// are cached, and the rows of this part the model reads at this clock (a subrange of the
  /// model's `rows_to_read`, valid until its next compute_gradient).
  std::vector<clock_value> row_clock;
  std::uint32_t rows_cached = 0;
  std::span<const row_id> want;
};

/// What `worker_cache::refresh_snapshot` did, counted since the cache was made.
struct snapshot_counts {
  /// Refreshes with no row changed: nothing copied, except a table the refresh before shared
  /// that is no longer held whole (e.g. its values were read): copied whole, its rows unchanged.
  std::uint64_t skipped = 0;
  std::uint64_t whole = 0;    ///< refreshes that copied the whole cache
  std::uint64_t partial = 0;  ///< refreshes that copied the changed rows only
  std::uint64_t rows = 0;     ///< rows copied by the partial refreshes
  std::uint64_t shared = 0;   ///< tables read from a held payload instead of copied (summed)
};

/// A worker's cache of all tables over `shards` shards. `SparseReads`: the model names the
/// rows it reads (`sparse_read_source`), so freshness is tracked per row.
/// Thread safety: one thread at a time (the worker's executor).
template <bool SparseReads>
class worker_cache {
 public:
  /// Zero-filled cache of `tables` (a model's layout) split over `shards` shards.
  worker_cache(std::span<const table_spec> tables, std::uint32_t shards)
      : tables_(tables.begin(), tables.end()), steps_(shards, 0.0f) {
    std::size_t off = 0;
    std::size_t rows = 0;
    for (const auto& t : tables_) {
      offsets_.push_back(off);
      row_base_.push_back(rows);
      off += t.size();
      rows += t.rows;
    }
    values_.assign(off, 0.0f);
    snapshot_refs_.resize(tables_.size());
    snapshot_tables_.assign(tables_.size(), nullptr);
    row_changed_.assign(rows, 0);
    changed_rows_.reserve(std::min(rows, max_changed_rows));
    parts_.resize(shards);
    for (std::uint32_t s = 0; s < shards; ++s) {
      for (const auto& t : tables_) {
        cache_part p;
        p.range = shard_range(t.rows, s, shards);
        if constexpr (SparseReads) p.row_clock.assign(p.range.size(), no_clock);
        parts_[s].push_back(std::move(p));
      }
    }
  }

  std::span<const table_spec> tables() const noexcept { return tables_; }
  /// Offset (in floats) of table `t` in `values()`.
  std::size_t offset(table_id t) const noexcept { return offsets_[t]; }
  /// Every table's values, table-major (`layout_size(tables())` floats). Read-only: the cache
  /// writes them itself (`install`, `local_apply`), so that it knows which rows changed.
  /// Copies in the rows of parts installed by reference first (`materialize`), so the values
  /// are current; the span stays valid, and current, until the next install.
  std::span<const float> values() const noexcept {
    materialize();
    return values_;
  }
  /// Floats in `values()` (no materialization).
  std::size_t size() const noexcept { return values_.size(); }

  /// Copies the rows of part (`s`, `t`), when it holds them by reference, into `values()` and
  /// drops the reference. No allocation.
  void materialize(std::uint32_t s, table_id t) const noexcept {
    const cache_part& p = parts_[s][t];
    if (p.held.empty()) return;
    std::memcpy(values_.data() + part_offset(s, t), p.held.data(), p.held.size());
    p.held.reset();
    --held_parts_;
  }
  /// `materialize` for every part.
  void materialize() const noexcept {
    for (std::uint32_t s = 0; held_parts_ > 0 && s < parts_.size(); ++s)
      for (table_id t = 0; t < parts_[s].size(); ++t) materialize(s, t);
  }
  /// How many parts hold their rows by reference (see `install`).
  std::size_t held_parts() const noexcept { return held_parts_; }

  /// Brings the compute snapshot up to date with the cache. A table whose rows are all one
  /// part held by reference (one shard owns the whole table) is shared, not copied: the
  /// snapshot keeps a reference to that payload, which nothing writes while it is referenced
  /// (a pooled receive buffer, or in-process the server's table block, which the server
  /// replaces rather than writes while a reference is out). Every other table is in
  /// `snapshot` (`size()` floats, table-major): the refresh copies the rows written since the
  /// last one, nothing when none was, the whole cache in one copy when it is the first refresh
  /// or more than a quarter of the floats (or more than `max_changed_rows` rows) changed, and
  /// a whole table that the last refresh shared. Where each table is now:
  /// `snapshot_tables()`, valid, and unchanged, until the next refresh. Precondition:
  /// `snapshot` is the same buffer at every call and nothing else writes into it. No
  /// allocation. Counted in `snapshot_stats()`.
  ///
  /// It first applies the own pushes not applied yet (`apply_local`): a refresh is a read.
  void refresh_snapshot(std::span<float> snapshot) noexcept {
    for (std::uint32_t s = 0; s < parts_.size(); ++s) apply_local(s);
    for (table_id t = 0; t < tables_.size(); ++t) {
      const bool was_shared = !snapshot_refs_[t].empty();
      if (const buffer* held = whole_table_held(t)) {
        snapshot_refs_[t] = held->share();
        snapshot_tables_[t] = std::as_const(snapshot_refs_[t]).floats().data();
        ++snapshots_.shared;
      } else {
        snapshot_refs_[t].reset();
        snapshot_tables_[t] = snapshot.data() + offsets_[t];
        // The last refresh shared it: the buffer holds older rows of it, so it is copied whole
        // (below too when every row changed).
        if (was_shared && !all_changed_) copy_table(t, snapshot);
      }
    }
    const auto shared = [&](table_id t) { return !snapshot_refs_[t].empty(); };
    if (all_changed_) {
      if (held_parts_ == 0) {  // (then no table is shared)
        std::memcpy(snapshot.data(), values_.data(), values_.size() * sizeof(float));
      } else {  // table by table, part by part, each from where its rows are
        for (table_id t = 0; t < tables_.size(); ++t)
          if (!shared(t)) copy_table(t, snapshot);
      }
      ++snapshots_.whole;
    } else if (changed_rows_.empty()) {
      ++snapshots_.skipped;
    } else {
      for (const std::size_t g : changed_rows_) {
        row_changed_[g] = 0;
        const auto t = static_cast<table_id>(
            std::upper_bound(row_base_.begin(), row_base_.end(), g) - row_base_.begin() - 1);
        if (shared(t)) continue;
        const std::uint32_t w = tables_[t].width;
        const auto k = static_cast<row_id>(g - row_base_[t]);
        const std::size_t off = offsets_[t] + std::size_t{k} * w;
        std::memcpy(snapshot.data() + off, row_source(t, k, off), w * sizeof(float));
      }
      ++snapshots_.partial;
      snapshots_.rows += changed_rows_.size();
    }
    changed_rows_.clear();
    changed_floats_ = 0;
    if (all_changed_) {
      std::fill(row_changed_.begin(), row_changed_.end(), std::uint8_t{0});
      all_changed_ = false;
    }
  }
  /// Where each table of the compute snapshot is, as of the last `refresh_snapshot` (one
  /// pointer per table, `tables()[t].size()` floats each; null before the first refresh):
  /// in the snapshot buffer, or in a payload the snapshot shares. Valid until the next refresh.
  std::span<const float* const> snapshot_tables() const noexcept { return snapshot_tables_; }
  /// What the snapshot refreshes did so far.
  const snapshot_counts& snapshot_stats() const noexcept { return snapshots_; }
  /// The most changed rows a refresh copies one by one (more: the whole cache).
  static constexpr std::size_t max_changed_rows = std::size_t{1} << 16;
  /// The parts of shard `s`, one per table.
  std::vector<cache_part>& parts(std::uint32_t s) noexcept { return parts_[s]; }
  const std::vector<cache_part>& parts(std::uint32_t s) const noexcept { return parts_[s]; }
  /// The read-my-writes step of shard `s` (0: off).
  float step(std::uint32_t s) const noexcept { return steps_[s]; }
  /// Sets shard `s`'s read-my-writes step; its pushes kept so far are applied first, with the
  /// step they were sent under.
  void set_step(std::uint32_t s, float step) noexcept {
    apply_local(s);
    steps_[s] = step > 0 ? step : 0.0f;
  }
  /// Offset (in floats) of part (`s`, `t`)'s first value in `values()`.
  std::size_t part_offset(std::uint32_t s, table_id t) const noexcept {
    return offsets_[t] + std::size_t{parts_[s][t].range.begin} * tables_[t].width;
  }
  /// Floats of part (`s`, `t`).
  std::size_t part_floats(std::uint32_t s, table_id t) const noexcept {
    return std::size_t{parts_[s][t].range.size()} * tables_[t].width;
  }

  /// `errc::bad_table` or `errc::bad_width` when a rows message's header cannot be for this
  /// cache's layout.
  std::error_code check_shape(const frame_header& h) const noexcept {
    if (h.table >= tables_.size()) return errc::bad_table;
    if (h.width != tables_[h.table].width) return errc::bad_width;
    return {};
  }

  /// Installs rows message `m` from shard `s` (precondition: `check_shape(m.header)` is ok):
  /// copies the rows, drops this worker's pushes the rows reflect (index <= `m.header.seq`)
  /// and keeps the others for read-my-writes (re-applied to the rows now, or, when the rows
  /// are the whole part, at the next read), stamps the part (or rows) with `m.header.clock`,
  /// and ends the outstanding pull unless the rows were pushed eagerly.
  /// `errc::bad_row_range` when a row is outside the shard's part (the cache may then be
  /// partly written).
  std::error_code install(std::uint32_t s, const message& m) {
    const auto& h = m.header;
    auto& p = parts_[s][h.table];
    const auto& t = tables_[h.table];
    float* base = values_.data() + offsets_[h.table];
    const auto vals = payload_floats(m);
    const bool ranged = h.has(frame_flags::range);
    const auto keys = payload_keys(m);
    if (ranged) {
      if (h.first_row < p.range.begin || h.first_row > p.range.end ||
          h.row_count > p.range.end - h.first_row)
        return errc::bad_row_range;
    } else {
      for (const row_id k : keys)
        if (!p.range.contains(k)) return errc::bad_row_range;
    }
    // Rows of the whole part replace every row: the pushes they do not reflect stay pending
    // for the next read. Otherwise the rows not in `m` need every kept push: apply them now.
    const bool whole = ranged && h.first_row == p.range.begin && h.row_count == p.range.size();
    if (!whole) apply_local(s, h.table);
    if (whole && h.row_count > 0) {
      // By reference: the part's rows are the payload's until something writes the part.
      if (p.held.empty()) ++held_parts_;
      p.held =
          m.payload.share(static_cast<std::size_t>(reinterpret_cast<const std::byte*>(vals.data()) -
                                                   m.payload.data()),
                          vals.size_bytes());
      mark_changed(h.table, p.range);
    } else if (ranged) {
      materialize(s, h.table);
      std::memcpy(base + h.first_row * t.width, vals.data(), vals.size_bytes());
      mark_changed(h.table, key_range{static_cast<row_id>(h.first_row),
                                      static_cast<row_id>(h.first_row + h.row_count)});
    } else {
      materialize(s, h.table);
      for (std::uint32_t i = 0; i < h.row_count; ++i) {
        std::memcpy(base + std::size_t{keys[i]} * t.width, vals.data() + std::size_t{i} * t.width,
                    t.width * sizeof(float));
        mark_changed(h.table, key_range{keys[i], keys[i] + 1});
      }
    }
    // Own pushes the server had not applied when it sent these rows: kept. Whole part: none
    // is in the cache now (applied at the next read). Otherwise every other cached row has
    // them (applied above): re-apply them to the rows just overwritten.
    std::erase_if(p.local, [&](const unapplied_push& u) { return u.index <= h.seq; });
    p.local_applied = whole ? 0 : p.local.size();
    if (const float step = steps_[s]; step > 0 && !whole) {
      for (const auto& u : p.local) {
        const auto g = u.grad.floats();
        if (ranged) {
          const auto first = static_cast<row_id>(h.first_row);
          local_apply(step, h.table, key_range{first, first + h.row_count},
                      g.subspan(std::size_t{first - p.range.begin} * t.width,
                                std::size_t{h.row_count} * t.width));
        } else {
          for (const row_id k : keys)
            local_apply(step, h.table, key_range{k, k + 1},
                        g.subspan(std::size_t{k - p.range.begin} * t.width, t.width));
        }
      }
    }
    // Eager rows carry only the subscribed rows that changed: every other row this worker
    // caches (all of them subscribed, under the policies that push rows) is unchanged as of
    // h.clock, so the whole part is re-stamped.
    const bool eager = h.has(frame_flags::eager);
    if constexpr (SparseReads) {
      if (ranged) {
        for (std::uint32_t i = 0; i < h.row_count; ++i)
          note_row(p, static_cast<row_id>(h.first_row) + i, h.clock);
      } else {
        for (const row_id k : keys) note_row(p, k, h.clock);
      }
      if (eager)
        for (clock_value& rc : p.row_clock)
          if (rc != no_clock) rc = std::max(rc, h.clock);
    } else if (whole || (eager && p.have)) {
      p.have = true;
      p.clock = std::max(p.clock, h.clock);
    }
    if (!eager) p.pulling = false;
    return {};
  }

  /// Read-my-writes: applies gradient `g` (rows `r` of table `t`) to the cache with learning
  /// rate `step`, now (the worker's pushes kept by `note_push` should be applied first:
  /// `apply_local`). No allocation.
  void local_apply(float step, table_id t, key_range r, std::span<const float> g) noexcept {
    if (held_parts_ > 0 && !r.empty())
      materialize(shard_of(tables_[t].rows, r.begin, static_cast<std::uint32_t>(parts_.size())), t);
    const std::uint32_t w = tables_[t].width;
    Eigen::Map<Eigen::ArrayXf> c(values_.data() + offsets_[t] + std::size_t{r.begin} * w,
                                 static_cast<Eigen::Index>(std::size_t{r.size()} * w));
    c -= step * Eigen::Map<const Eigen::ArrayXf>(g.data(), static_cast<Eigen::Index>(g.size()));
    mark_changed(t, r);
  }

  /// Counts a push of part (`s`, `t`) of gradient `grad`; with read-my-writes on, keeps the
  /// part's dense slice of it (shared, not copied) until rows reflect it, to be applied to the
  /// cache at the next read (`apply_local`) unless rows of the whole part that reflect it
  /// arrive first.
  void note_push(std::uint32_t s, table_id t, const buffer& grad) {
    auto& p = parts_[s][t];
    ++p.pushed;
    if (steps_[s] > 0)
      p.local.push_back(unapplied_push{p.pushed, grad.share(part_offset(s, t) * sizeof(float),
                                                            part_floats(s, t) * sizeof(float))});
  }

  /// Applies part (`s`, `t`)'s kept own pushes that the cache does not have yet, in the order
  /// they were sent (read-my-writes; see `note_push`). No allocation.
  void apply_local(std::uint32_t s, table_id t) noexcept {
    auto& p = parts_[s][t];
    if (const float step = steps_[s]; step > 0)
      for (std::size_t i = p.local_applied; i < p.local.size(); ++i)
        local_apply(step, t, p.range, p.local[i].grad.floats());
    p.local_applied = p.local.size();
  }
  /// `apply_local` for every part of shard `s`: called before the cache is read (the
  /// snapshot, a rejoin's state, the end of a run) or its kept pushes are dropped.
  void apply_local(std::uint32_t s) noexcept {
    for (table_id t = 0; t < parts_[s].size(); ++t) apply_local(s, t);
  }
  /// Drops part (`s`, `t`)'s kept own pushes, after applying those the cache does not have
  /// yet.
  void clear_local(std::uint32_t s, table_id t) noexcept {
    apply_local(s, t);
    parts_[s][t].local.clear();
    parts_[s][t].local_applied = 0;
  }
  /// `clear_local` for every part of shard `s`.
  void clear_local(std::uint32_t s) noexcept {
    for (table_id t = 0; t < parts_[s].size(); ++t) clear_local(s, t);
  }

  /// Whether the rows a read of part `p` needs are cached, and the oldest server clock among
  /// them: the whole part, or (sparse reads) the rows the model reads at this clock.
  std::pair<bool, clock_value> read_state(const cache_part& p) const noexcept {
    if constexpr (SparseReads) {
      clock_value oldest = std::numeric_limits<clock_value>::max();
      for (const row_id k : p.want) {
        const clock_value rc = p.row_clock[k - p.range.begin];
        if (rc == no_clock) return {false, no_clock};
        oldest = std::min(oldest, rc);
      }
      return {true, oldest};
    } else {
      return {p.have, p.clock};
    }
  }

  /// Whether part `p` takes part in this clock's read (owns rows; sparse reads: the model
  /// reads some of them).
  static bool read_now(const cache_part& p) noexcept {
    if (p.range.empty()) return false;
    if constexpr (SparseReads) return !p.want.empty();
    return true;
  }

  /// The clock a pull of part (`s`, `t`) must ask for before a read at clock `c` (`need`:
  /// the policy's `min_server_clock(c)`): `need` (fetch), `no_clock` (a refresh alongside the
  /// read), or nothing. With `fetch_only`, only a pull the read cannot go on without.
  template <class Policy>
  std::optional<clock_value> pull_clock(const Policy& policy, std::uint32_t s, table_id t,
                                        clock_value c, clock_value need,
                                        bool fetch_only = false) const {
    const auto& p = parts_[s][t];
    if (p.pulling || !read_now(p)) return std::nullopt;
    const auto [have, cached] = read_state(p);
    const auto action = policy.on_read(c, cached, have);
    if (action != read_action::fetch && (fetch_only || action != read_action::read_and_refresh))
      return std::nullopt;
    return action == read_action::fetch ? need : no_clock;
  }

  /// The pull of part (`s`, `t`) for rows of server clock >= `need` (no_clock: a refresh of
  /// every row read), numbered `++seq`; marks the part as pulling. Sparse reads: a keyed pull
  /// of the rows read that are stale, in a buffer from `allocate(bytes)`, when that is smaller
  /// on the wire than the whole part.
  template <class Allocate>
  message pull(std::uint32_t s, table_id t, clock_value need, std::uint32_t sender,
               std::uint64_t& seq, Allocate&& allocate) {
    auto& p = parts_[s][t];
    message m;
    m.header.type = message_type::pull;
    m.header.sender = sender;
    m.header.table = t;
    m.header.clock = need;
    m.header.seq = ++seq;
    m.header.width = tables_[t].width;
    p.pulling = true;
    if constexpr (SparseReads) {
      const auto stale = [&](row_id k) {
        const clock_value rc = p.row_clock[k - p.range.begin];
        return rc == no_clock || rc < need;
      };
      auto n = static_cast<std::uint32_t>(std::count_if(p.want.begin(), p.want.end(), stale));
      const bool refresh = n == 0;  // read_and_refresh: every row is cached; refresh them all
      if (refresh) n = static_cast<std::uint32_t>(p.want.size());
      const std::uint32_t w = tables_[t].width;
      if (key_bytes(n) + std::uint64_t{n} * w * 4 < std::uint64_t{p.range.size()} * w * 4) {
        m.header.row_count = n;
        m.payload = allocate(key_bytes(n));
        std::memset(m.payload.data(), 0, m.payload.size());
        auto* out = reinterpret_cast<row_id*>(m.payload.data());
        for (const row_id k : p.want)
          if (refresh || stale(k)) *out++ = k;
        return m;
      }
    }
    m.header.flags = frame_flags::range;
    m.header.first_row = p.range.begin;
    m.header.row_count = p.range.size();
    return m;
  }

  /// Whether shard `s`'s parts may be read at server clock `need`: cached and fresh enough
  /// while it is `up`; while it is down, cached when the worker `trains_away`.
  bool ready(std::uint32_t s, clock_value need, bool up, bool trains_away) const noexcept {
    for (const auto& p : parts_[s]) {
      if (!read_now(p)) continue;
      const auto [have, cached] = read_state(p);
      if (!up && trains_away) {
        if (!have) return false;  // nothing cached to train on yet
        continue;
      }
      if (!(up && have && cached >= need)) return false;
    }
    return true;
  }

  /// Whether some part of shard `s` read now is missing or older than `need`.
  bool stale(std::uint32_t s, clock_value need) const noexcept {
    for (const auto& p : parts_[s]) {
      if (!read_now(p)) continue;
      const auto [have, cached] = read_state(p);
      if (!have || cached < need) return true;
    }
    return false;
  }

  /// Records the staleness of shard `s`'s reads at clock `c`: one sample per row read, `c -`
  /// the row's server clock (every row of a part, or, sparse reads, the rows the model reads
  /// at this clock, each with its own clock). Sparse reads: also stamps each part with the
  /// oldest clock its read reflects.
  void record_staleness(std::uint32_t s, clock_value c, staleness_histogram& h) noexcept {
    for (auto& p : parts_[s]) {
      if (p.range.empty()) continue;
      if constexpr (SparseReads) {
        if (p.want.empty()) continue;
        clock_value oldest = std::numeric_limits<clock_value>::max();
        for (const row_id k : p.want) {
          const clock_value rc = p.row_clock[k - p.range.begin];
          h.record(c - rc);
          oldest = std::min(oldest, rc);
        }
        p.clock = oldest;  // the oldest clock this read's gradient is computed on
      } else {
        h.record(c - p.clock, p.range.size());
      }
    }
  }

  /// Sparse reads: narrows the rows `rows_to_read(t)` returns (sorted) to each part (no copy).
  template <class RowsToRead>
  void select_rows(RowsToRead&& rows_to_read) {
    for (table_id t = 0; t < tables_.size(); ++t) {
      const std::span<const row_id> rows = rows_to_read(t);
      for (auto& sp : parts_) {
        auto& p = sp[t];
        const auto lo = std::lower_bound(rows.begin(), rows.end(), p.range.begin);
        const auto hi = std::lower_bound(lo, rows.end(), p.range.end);
        p.want = rows.subspan(static_cast<std::size_t>(lo - rows.begin()),
                              static_cast<std::size_t>(hi - lo));
      }
    }
  }

  /// After a reconnect: shard `s`'s cached rows are from before the outage (fetch them anew).
  void forget(std::uint32_t s) noexcept {
    for (auto& p : parts_[s]) {
      p.have = false;
      if constexpr (SparseReads) {
        std::fill(p.row_clock.begin(), p.row_clock.end(), no_clock);
        p.rows_cached = 0;
      }
    }
  }

 private:
  // Where the rows of part (`s`, `t`) are: in the payload it holds them by reference in, else
  // in `values_`.
  const float* part_rows(std::uint32_t s, table_id t) const noexcept {
    const buffer& held = parts_[s][t].held;
    return held.empty() ? values_.data() + part_offset(s, t) : held.floats().data();
  }
  // The held payload of table `t` when one part, held by reference, covers every row of it.
  const buffer* whole_table_held(table_id t) const noexcept {
    if (held_parts_ == 0) return nullptr;
    for (const auto& sp : parts_)
      if (sp[t].range.size() == tables_[t].rows && !sp[t].held.empty()) return &sp[t].held;
    return nullptr;
  }
  // Copies every row of table `t` into `snapshot`, part by part, from where its rows are.
  void copy_table(table_id t, std::span<float> snapshot) const noexcept {
    for (std::uint32_t s = 0; s < parts_.size(); ++s)
      std::memcpy(snapshot.data() + part_offset(s, t), part_rows(s, t),
                  part_floats(s, t) * sizeof(float));
  }
  // Where row `k` of table `t` (at float offset `off` of `values_`) is (see `part_rows`).
  const float* row_source(table_id t, row_id k, std::size_t off) const noexcept {
    if (held_parts_ == 0) return values_.data() + off;
    const auto s = shard_of(tables_[t].rows, k, static_cast<std::uint32_t>(parts_.size()));
    return part_rows(s, t) + std::size_t{k - parts_[s][t].range.begin} * tables_[t].width;
  }
  // Rows `r` of table `t` were written: remembered one by one for the next snapshot refresh,
  // or, past a quarter of the floats or `max_changed_rows` rows, as "all changed".
  void mark_changed(table_id t, key_range r) noexcept {
    if (all_changed_) return;
    const std::uint32_t w = tables_[t].width;
    if (changed_floats_ + std::size_t{r.size()} * w > values_.size() / 4 ||
        changed_rows_.size() + r.size() > max_changed_rows) {
      all_changed_ = true;
      return;
    }
    for (row_id k = r.begin; k < r.end; ++k) {
      const std::size_t g = row_base_[t] + k;
      if (row_changed_[g] != 0) continue;
      row_changed_[g] = 1;
      changed_rows_.push_back(g);  // within the capacity reserved: no allocation
      changed_floats_ += w;
    }
  }
  // Sparse reads: a row of part `p` arrived with server clock `c`.
  static void note_row(cache_part& p, row_id k, clock_value c) noexcept {
    clock_value& rc = p.row_clock[k - p.range.begin];
    if (rc == no_clock && ++p.rows_cached == p.range.size()) p.have = true;
    rc = std::max(rc, c);
  }

  std::vector<table_spec> tables_;
  std::vector<std::size_t> offsets_;
  mutable std::vector<float> values_;           // mutable: a const read materializes held parts
  mutable std::size_t held_parts_ = 0;          // parts holding their rows by reference
  std::vector<std::vector<cache_part>> parts_;  // [shard][table]
  std::vector<float> steps_;                    // per shard
  // Rows changed since the last snapshot refresh (see mark_changed): a row's index over all
  // tables is row_base_[t] + row; row_changed_ flags the rows in changed_rows_.
  std::vector<std::size_t> row_base_;
  std::vector<std::uint8_t> row_changed_;
  std::vector<std::size_t> changed_rows_;
  std::size_t changed_floats_ = 0;
  bool all_changed_ = true;  // the first refresh copies everything
  snapshot_counts snapshots_;
  // The compute snapshot's tables (refresh_snapshot): per table, the payload it shares (empty:
  // the table is in the snapshot buffer; while shared, the buffer's rows of it go stale), and
  // where the table is.
  std::vector<buffer> snapshot_refs_;
  std::vector<const float*> snapshot_tables_;
};

}  // namespace asyncps::detail
