// asyncps — detail::shard_core: the state of one server shard, sans-io.
//
// Tables (values, optimizer state, change versions), the vector clock, pushes applied and the
// last sequence number per worker, subscriptions for eager rows, and pulls waiting for the
// server clock. It touches no socket, timer or executor: `basic_server` feeds it messages and
// sends what it returns; tests/unit/server_core_test.cpp steps it message by message.
//
// The types it keeps are in detail/server/shard_types.hpp; the update path (a push checked and
// applied) is defined in detail/server/shard_updates.ipp, the read path (pull replies,
// subscriptions, eager rows) in detail/server/shard_reads.ipp and the whole state (save,
// restore, check) in detail/server/shard_whole_state.ipp, all three included at the end.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/endian.hpp"
#include "asyncps/detail/server/shard_types.hpp"
#include "asyncps/detail/text.hpp"
#include "asyncps/error.hpp"
#include "asyncps/optimizer.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/shard_state.hpp"
#include "asyncps/table.hpp"
#include "asyncps/update_rule.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::detail {

/// The state of one shard and the rules that change it. `Reader` identifies a connection
/// (copyable, comparable; e.g. a session pointer), `TimePoint` the transport clock's time.
/// Thread safety: one thread at a time (the server's executor).
template <optimizer_policy Optimizer, class Reader, class TimePoint>
class shard_core {
  // The optimizer one push is applied with: `Optimizer`, or for
  // `optimizer::with_update_rule<Inner, Rule>` its `Inner` at the rule's rate for the push.
  using step_optimizer = push_optimizer_t<Optimizer>;
  decltype(auto) push_optimizer(const message& m) const noexcept {
    if constexpr (has_update_rule_v<Optimizer>)
      return optimizer_.for_push(context_of(m));
    else
      return (optimizer_);
  }

 public:
  using pending_type = pending_pull<Reader, TimePoint>;  ///< a waiting pull

  /// Builds shard `shard` of `num_shards` of `tables` (initial values from `seed`), the
  /// tables' values in blocks of a pool of its own: the pull replies it gives
  /// (`reply_payload`) must not outlive it. Throws `std::invalid_argument` naming the bad
  /// field (shard >= num_shards, no workers, empty layout, a table with 0 rows or width, ids
  /// out of order).
  shard_core(std::uint32_t shard, std::uint32_t num_shards, std::uint32_t num_workers,
             std::span<const table_spec> tables, std::uint64_t seed, Optimizer opt = {})
      : shard_core(shard, num_shards, num_workers, tables, seed, opt, own_pool_tag{}) {}
  /// As above, each table's values in a buffer from `alloc(bytes)` (a pooled `buffer`, e.g.
  /// the transport's: the copies copy-on-write makes come from the same pool, which must
  /// outlive the shard and its replies). Exceptions: also those of `alloc`.
  template <class Alloc>
  shard_core(std::uint32_t shard, std::uint32_t num_shards, std::uint32_t num_workers,
             std::span<const table_spec> tables, std::uint64_t seed, Optimizer opt, Alloc&& alloc)
      : shard_(shard), num_shards_(num_shards), num_workers_(num_workers), optimizer_(opt),
        clocks_(num_workers, 0), member_(num_workers, 1), applied_(num_workers),
        last_seq_(num_workers, 0) {
    if (num_shards == 0 || shard >= num_shards)
      throw std::invalid_argument("asyncps::server_options: shard must be < num_shards");
    if (num_workers == 0)
      throw std::invalid_argument("asyncps::server_options: num_workers must be > 0");
    if (tables.empty())
      throw std::invalid_argument("asyncps::server_options: tables must not be empty");
    tables_.reserve(tables.size());
    // Room for every worker's pull of every table twice over (a worker waits for one clock
    // with a pull per table): a pull deferred in the steady state does not grow the vector,
    // however the workers' timing interleaves (tests/unit/no_alloc_test.cpp). At most 4096.
    pending_.reserve(std::min<std::size_t>(std::size_t{num_workers} * tables.size() * 2, 4096));
    for (std::size_t i = 0; i < tables.size(); ++i) {
      const auto& spec = tables[i];
      if (spec.id != i || spec.rows == 0 || spec.width == 0)
        throw std::invalid_argument("asyncps::server_options: tables[" + std::to_string(i) +
                                    "] needs id == index, rows > 0 and width > 0");
      shard_table t;
      t.spec = spec;
      t.range = shard_range(spec.rows, shard, num_shards);
      const std::size_t n = std::size_t{t.range.size()} * spec.width;
      if constexpr (std::is_same_v<std::remove_cvref_t<Alloc>, own_pool_tag>) {
        if (!own_pool_) own_pool_ = std::make_unique<buffer_pool>();
        t.values = table_values(own_pool_->allocate(n * sizeof(float)));
      } else {
        t.values = table_values(alloc(n * sizeof(float)));
      }
      t.state.resize(t.values.size() * Optimizer::state_per_param, 0.0f);
      t.row_version.assign(t.range.size(), 0);
      init_table(t, seed);
      tables_.push_back(std::move(t));
    }
    for (auto& a : applied_) a.assign(tables_.size(), 0);
  }

  std::uint32_t shard() const noexcept { return shard_; }
  std::uint32_t num_workers() const noexcept { return num_workers_; }
  std::size_t num_tables() const noexcept { return tables_.size(); }
  const shard_table& table(table_id t) const noexcept { return tables_[t]; }
  /// The server clock: the minimum over the workers' clocks.
  clock_value clock() const noexcept { return server_clock_; }
  clock_value worker_clock(std::uint32_t w) const noexcept { return clocks_[w]; }
  const std::vector<clock_value>& worker_clocks() const noexcept { return clocks_; }
  /// Pushes of worker `w` applied to table `t`.
  std::uint64_t applied(std::uint32_t w, table_id t) const noexcept { return applied_[w][t]; }
  /// Highest push (or clock) sequence number applied per worker.
  std::uint64_t& last_seq(std::uint32_t w) noexcept { return last_seq_[w]; }
  /// Whether the shard holds trained state (a push applied or a state restored).
  bool has_state() const noexcept { return has_state_; }
  const Optimizer& optimizer() const noexcept { return optimizer_; }

  // ---- validation ----

  /// Whether a hello's `layout` is this shard's (rows and width per table).
  bool layout_matches(std::span<const protocol::layout_entry> layout) const {
    if (layout.size() != tables_.size()) return false;
    for (std::size_t i = 0; i < tables_.size(); ++i)
      if (layout[i].rows != tables_[i].spec.rows || layout[i].width != tables_[i].spec.width)
        return false;
    return true;
  }
  /// A hello's `layout` compared with this shard's: each differing table with both sides'
  /// rows x width, and the table counts when they differ.
  std::string layout_difference_from(std::span<const protocol::layout_entry> layout) const {
    std::vector<table_spec> theirs(layout.size());
    for (std::size_t i = 0; i < layout.size(); ++i) {
      theirs[i].id = static_cast<table_id>(i);
      theirs[i].rows = layout[i].rows;
      theirs[i].width = layout[i].width;
    }
    std::vector<table_spec> ours;
    ours.reserve(tables_.size());
    for (const auto& t : tables_) ours.push_back(t.spec);
    return layout_difference(theirs, "worker", ours, "server");
  }
  /// Validates table, width and rows of push/pull `m` against this shard; `detail` says why.
  std::error_code check_rows(const message& m, std::string& detail) const {
    const auto& h = m.header;
    if (h.table >= tables_.size()) {
      detail = " (got " + std::to_string(h.table) + ")";
      return errc::bad_table;
    }
    const auto& t = tables_[h.table];
    if (h.type != message_type::pull && h.width != t.spec.width) {
      detail = " (got " + std::to_string(h.width) + ", table " + std::to_string(h.table) + " has " +
               std::to_string(t.spec.width) + ")";
      return errc::bad_width;
    }
    if (h.has(frame_flags::range)) {
      if (h.first_row < t.range.begin || h.first_row > t.range.end ||
          h.row_count > t.range.end - h.first_row) {
        // first_row + row_count may wrap (both are the peer's): print them as sent.
        detail = " (first row " + std::to_string(h.first_row) + ", " + std::to_string(h.row_count) +
                 " rows, vs shard rows [" + std::to_string(t.range.begin) + ", " +
                 std::to_string(t.range.end) + "))";
        return errc::bad_row_range;
      }
    } else {
      // Strictly increasing keys (the order workers send, see model.hpp): a pull's reply is
      // then never larger than this shard's rows, and a push updates each row once.
      const auto keys = payload_keys(m);
      for (std::size_t i = 0; i < keys.size(); ++i) {
        const row_id k = keys[i];
        if (!t.range.contains(k)) {
          detail = " (row " + std::to_string(k) + " vs shard rows [" +
                   std::to_string(t.range.begin) + ", " + std::to_string(t.range.end) + "))";
          return errc::bad_row_range;
        }
        if (i > 0 && k <= keys[i - 1]) {
          detail = " (key " + std::to_string(i) + " is row " + std::to_string(k) + ", after row " +
                   std::to_string(keys[i - 1]) + ")";
          return errc::bad_key_order;
        }
      }
    }
    return {};
  }
  /// Whether checked push `m` holds only finite values and can be applied without making a
  /// value or the optimizer's state of its rows NaN or infinity, computed before anything is
  /// written, in chunks of `check_chunk` floats (each chunk of the push checked finite, then,
  /// while it is in L1, the update it makes): by the optimizer's read-only `stays_finite` (the
  /// shipped optimizers: one pass over the rows, nothing written) or else by `apply` on a copy
  /// in a small fixed scratch. No allocation. Errors: `errc::non_finite_value` (a NaN or
  /// infinite value in the push) or `errc::non_finite_update`, `detail` naming the table and
  /// row; then the push must not be applied. Deterministic: the same state and push give the
  /// same answer on every replica (chain backups, replica-log replays). The server itself
  /// uses `check_and_apply` (the same check, fused with the apply in one pass); this one is
  /// for callers that must know without applying.
  std::error_code check_update(const message& m, std::string& detail);
  /// Vectorised (Eigen 3.4's allFinite is a scalar loop): g - g is 0 for finite values and
  /// NaN for NaN or infinity, and NaN survives the sum.
  static bool all_finite(std::span<const float> g) noexcept {
    const Eigen::Map<const Eigen::ArrayXf> a(g.data(), static_cast<Eigen::Index>(g.size()));
    return std::isfinite((a - a).sum());
  }

  // ---- updates ----

  /// Checks push `m` (already through `check_rows`) and applies it, in one pass over its
  /// bytes: chunk by chunk (about `check_chunk` floats, ending on `align`ed addresses, within
  /// a row for keyed pushes), the chunk's values and optimizer state are saved into an undo
  /// buffer, the optimizer's `apply` updates them in place, and the chunk's gradient, values
  /// and state are checked finite while they are in L1. A push of the whole table (ranged,
  /// every row: a dense model's push) writes its values out of place instead: into a fresh
  /// block of the table's pool (`table_values::fresh_block`), which becomes the values once
  /// every chunk passed, so the old values need no undo copy and a reply still holding them
  /// needs no copy-on-write. When a chunk fails, every chunk applied so far is restored from
  /// the undo buffer (the fresh block is dropped): the push is applied whole or not at all
  /// (values, optimizer state, `step` and versions as before). Each element goes through the
  /// same operations, on the same (packet or scalar) path, as in `apply(m)`, so an accepted
  /// push gives the same bits as `check_update` then `apply`. For an optimizer without
  /// `stays_finite` (its `apply` may not work element by element), or when the state planes
  /// are not aligned like the values, it is `check_update` then `apply`.
  /// Errors (nothing written): `errc::non_finite_value` (a NaN or infinite value in the
  /// first failing chunk of the push) or `errc::non_finite_update` (its update would make a
  /// value or optimizer state non-finite), `detail` naming the table and the row. Does not
  /// count the push (see `count_push`). Allocation: the undo buffer grows to the largest push
  /// seen (`(1 + state_per_param)` floats per pushed float, `state_per_param` for a whole-table
  /// push), then none; a whole-table push writes into the table's spare block (the one it
  /// replaced last time) and takes one from the pool only while a reply still holds the
  /// spare. Deterministic, as `check_update`.
  std::error_code check_and_apply(const message& m, std::string& detail);
  /// Clips the values of the rows push `m` touched (checked, applied) to [-bound, bound];
  /// returns how many values it changed. The rows are already marked changed by the apply.
  /// Cost: one pass over those rows' values. Precondition: bound > 0.
  std::uint64_t clip_rows(const message& m, float bound) noexcept {
    const auto& h = m.header;
    auto& t = tables_[h.table];
    const std::size_t w = t.spec.width;
    std::uint64_t clipped = 0;
    const auto clip = [&](float* v, std::size_t n) {
      for (std::size_t i = 0; i < n; ++i) {
        const float c = std::clamp(v[i], -bound, bound);
        clipped += c != v[i] ? 1 : 0;
        v[i] = c;
      }
    };
    if (h.has(frame_flags::range)) {
      clip(t.values.data() + std::size_t{static_cast<row_id>(h.first_row) - t.range.begin} * w,
           std::size_t{h.row_count} * w);
    } else {
      for (const row_id k : payload_keys(m))
        clip(t.values.data() + std::size_t{k - t.range.begin} * w, w);
    }
    return clipped;
  }
  /// Applies push `m` to its table through the optimizer (versions updated), unchecked: the
  /// caller ran `check_update` (or use `check_and_apply`). Does not count it (see
  /// `count_push`).
  void apply(const message& m);
  /// Counts an applied push of worker `w` to table `t`.
  void count_push(std::uint32_t w, table_id t) noexcept { ++applied_[w][t]; }
  /// Replaces table `t`'s values (size and finiteness checked by the caller).
  void set_values(table_id t, std::span<const float> v) {
    std::copy(v.begin(), v.end(), tables_[t].values.begin());
    changed(tables_[t], tables_[t].range);
    has_state_ = true;
  }
  /// Replaces table `t`'s values with a replica and clears its optimizer state.
  void install_replica(table_id t, std::span<const float> v) {
    auto& ts = tables_[t];
    std::copy(v.begin(), v.end(), ts.values.begin());
    std::fill(ts.state.begin(), ts.state.end(), 0.0f);
    changed(ts, ts.range);
    has_state_ = true;
  }
  /// Moves worker `w`'s clock to `c`. Returns whether the server clock advanced (the caller
  /// then answers ready pulls and pushes eager rows).
  bool advance(std::uint32_t w, clock_value c) {
    clocks_[w] = c;
    return settle_clock();
  }

  /// Sets worker `w`'s clock to `c`, also lower than it is (a rejoin's jump undone), without
  /// moving the server clock (the caller checks `c >= clock()`).
  void set_worker_clock(std::uint32_t w, clock_value c) noexcept { clocks_[w] = c; }

  // ---- membership (server_options::elastic) ----

  /// Elastic membership: no worker is a member until it joins, and the server clock stays
  /// until `start_members` have joined. (Fixed membership, the default: all are, from the
  /// start.)
  void set_elastic(std::uint32_t start_members) {
    std::fill(member_.begin(), member_.end(), std::uint8_t{0});
    start_members_ = start_members;
  }
  bool is_member(std::uint32_t w) const noexcept { return member_[w] != 0; }
  std::uint32_t members() const noexcept {
    return static_cast<std::uint32_t>(std::count(member_.begin(), member_.end(), 1));
  }
  /// Worker `w` becomes a member, at its clock or at the server clock if that is later (a
  /// joiner never holds the others back). Returns whether the server clock advanced.
  bool join(std::uint32_t w) {
    if (member_[w] == 0) {
      member_[w] = 1;
      ++joined_;
      clocks_[w] = std::max(clocks_[w], server_clock_);
    }
    return settle_clock();
  }
  /// Member `w` leaves: its clock no longer bounds the server clock. Returns whether the
  /// server clock advanced.
  bool leave(std::uint32_t w) {
    member_[w] = 0;
    return settle_clock();
  }
  /// The member with the lowest clock (the one holding the server clock back); `num_workers()`
  /// when there is none.
  std::uint32_t slowest_member() const noexcept {
    std::uint32_t slowest = num_workers_;
    for (std::uint32_t w = 0; w < num_workers_; ++w)
      if (member_[w] != 0 && (slowest == num_workers_ || clocks_[w] < clocks_[slowest]))
        slowest = w;
    return slowest;
  }

  // ---- reads ----

  /// Fills a welcome to `worker` with this shard's tables (rows, width, pushes of `worker`
  /// applied) and the optimizer's `local_step()` (the worker's read-my-writes step).
  void welcome_tables(std::uint32_t worker, protocol::welcome& w) const {
    w.tables.clear();
    w.tables.reserve(tables_.size());
    for (std::size_t i = 0; i < tables_.size(); ++i)
      w.tables.push_back({tables_[i].spec.rows, tables_[i].spec.width,
                          worker < applied_.size() ? applied_[worker][i] : 0});
    w.local_step = static_cast<float>(optimizer_.local_step());
    if constexpr (has_update_rule_v<Optimizer>) {  // a fresh push of `worker` now
      const push_context ctx{.worker = worker,
                             .workers = std::max<std::uint32_t>(members(), 1),
                             .clock = server_clock_,
                             .server_clock = server_clock_,
                             .staleness = 0};
      w.local_step *= static_cast<float>(optimizer_.rule.scale(ctx));
    }
  }
  /// The context of push `m` as its update rule sees it (`push_context`), from the vector
  /// clock as it stands: deterministic, so every replica computes the same.
  push_context context_of(const message& m) const noexcept {
    const auto& h = m.header;
    push_context c{.worker = h.sender,
                   .workers = std::max<std::uint32_t>(members(), 1),
                   .clock = h.clock,
                   .server_clock = server_clock_,
                   .staleness = 0};
    for (std::uint32_t v = 0; v < num_workers_; ++v)
      if (v != h.sender && member_[v] != 0 && clocks_[v] > h.clock)
        c.staleness += static_cast<std::uint64_t>(clocks_[v] - h.clock);
    return c;
  }
  /// The payload of the reply to pull `req` (through `check_rows`). A range of at least half
  /// of this shard's rows of the table (dense reads) is the table's own bytes, shared without
  /// a copy: while the reply holds them, the next write to the table (a push, a restore, new
  /// values) first moves the table to a fresh block of the same pool (`table_values`), so
  /// the reply carries every row as it was when the pull was answered, never a torn one.
  /// Keyed rows and shorter ranges (where copying the whole table at the next push would cost
  /// more than copying the rows now) are a snapshot in a buffer from `alloc`
  /// (`rows_payload`). Cost: one atomic add when shared.
  template <class Alloc>
  buffer reply_payload(const message& req, Alloc&& alloc) const {
    const auto& h = req.header;
    const auto& t = tables_[h.table];
    if (h.has(frame_flags::range) && h.row_count > 0 &&
        std::size_t{h.row_count} * 2 >= t.range.size())
      return t.values.share(std::size_t{static_cast<row_id>(h.first_row) - t.range.begin} *
                                t.spec.width,
                            std::size_t{h.row_count} * t.spec.width);
    return rows_payload(h.table, h.has(frame_flags::range), h.first_row, h.row_count,
                        payload_keys(req), alloc);
  }
  /// Copies copy-on-write made so far: writes to a table whose values a reply still held.
  std::uint64_t cow_copies() const noexcept {
    std::uint64_t n = 0;
    for (const auto& t : tables_) n += t.values.copies();
    return n;
  }
  /// A snapshot of rows of table `tid` (keys first when sparse), in a buffer from `alloc`.
  template <class Alloc>
  buffer rows_payload(table_id tid, bool ranged, std::uint64_t first, std::uint32_t count,
                      std::span<const row_id> keys, Alloc&& alloc) const;
  /// Adds the rows of pull `req` to subscription `sub` (each row once; amortized O(1) per
  /// row). Keyed rows that come to cover the whole shard become a range subscription.
  void subscribe(subscription& sub, const message& req) const;
  /// The eager rows of table `t` for a reader subscribed by `sub` (non-empty): the subscribed
  /// rows changed since `sub.synced`, possibly none; marks `sub` synced. When every row of the
  /// shard changed and is subscribed, the whole shard as a range, snapshot once into `whole`
  /// (shared between the readers of one round).
  template <class Alloc>
  eager_rows eager_rows_for(table_id t, subscription& sub, buffer& whole, Alloc&& alloc) const;

  // ---- pulls waiting for the server clock ----

  /// Keeps pull `req` of `reader` until the server clock reaches `req.header.clock`.
  void defer(Reader reader, message req, TimePoint now) {
    pending_bytes_ += req.payload.size();
    pending_.push_back(pending_pull<Reader, TimePoint>{reader, std::move(req), now});
  }
  /// The waiting pulls, oldest first.
  const std::vector<pending_pull<Reader, TimePoint>>& pending() const noexcept { return pending_; }
  /// Payload bytes (sparse keys) of the waiting pulls.
  std::uint64_t pending_bytes() const noexcept { return pending_bytes_; }
  /// Forgets the pulls of `reader`.
  void drop(Reader reader) {
    std::erase_if(pending_, [&](const auto& p) {
      if (p.reader != reader) return false;
      pending_bytes_ -= p.request.payload.size();
      return true;
    });
  }
  /// Calls `answer(reader, request)` for each pull the server clock now satisfies, in arrival
  /// order, and forgets it; pulls whose reader is not `alive(reader)` are dropped.
  template <class Alive, class Answer>
  void take_ready(Alive&& alive, Answer&& answer) {
    std::size_t keep = 0;
    for (std::size_t i = 0; i < pending_.size(); ++i) {
      auto& p = pending_[i];
      if (server_clock_ >= p.request.header.clock && alive(p.reader)) {
        answer(p.reader, p.request);
      } else if (alive(p.reader)) {
        if (keep != i) pending_[keep] = std::move(p);
        ++keep;
        continue;
      }
      pending_bytes_ -= pending_[i].request.payload.size();
    }
    pending_.resize(keep);
  }

  // ---- whole state ----

  /// Copies the shard's whole state into `out`, reusing its capacity (allocation-free after
  /// the first call with the same `out`).
  void save_state(shard_state& out) const;
  /// Installs `st`. Errors (nothing is changed then; the caller answers the pulls a success
  /// satisfies): `errc::layout_mismatch` when it was taken from another shard, shard count,
  /// worker count, optimizer or layout, or its `last_seq` has neither 0 nor `num_workers`
  /// entries; `errc::bad_state` when it fits but no run can reach it (see `check_state`).
  std::error_code restore_state(const shard_state& st) {
    std::string detail;
    return restore_state(st, detail);
  }
  /// As `restore_state(st)`; `detail` says what was wrong (the field and its value).
  std::error_code restore_state(const shard_state& st, std::string& detail);

  /// Whether `st`, whose layout fits this shard, is a state a run can reach: every value and
  /// optimizer-state float finite, every worker clock in [0, `protocol::max_clock`] (the
  /// range a hello may claim), and every table's optimizer `step`, every `applied` count and
  /// every `last_seq` at most `protocol::max_seq` (a `last_seq` of 2^64 - 1 would make the
  /// shard drop every later message of its worker as a duplicate, a step near 2^64 would wrap
  /// the optimizer's bias correction). Error: `errc::bad_state`, `detail` naming the field,
  /// its index and value. Cost: one pass over the state's floats.
  std::error_code check_state(const shard_state& st, std::string& detail) const;

 private:
  // The server clock moves up to the lowest member clock (never down; not before the start
  // barrier; not without members). Returns whether it moved.
  bool settle_clock() noexcept {
    if (joined_ < start_members_) return false;
    clock_value m = std::numeric_limits<clock_value>::max();
    bool any = false;
    for (std::uint32_t w = 0; w < num_workers_; ++w)
      if (member_[w] != 0) {
        m = std::min(m, clocks_[w]);
        any = true;
      }
    if (!any || m <= server_clock_) return false;
    server_clock_ = m;
    return true;
  }
  void init_table(shard_table& t, std::uint64_t seed) {
    initial_values(t.spec, t.range, seed, std::span<float>(t.values.data(), t.values.size()));
  }
  // Rows `r` of table `t` changed (for eager rows: see eager_rows_for).
  static void changed(shard_table& t, key_range r) noexcept {
    ++t.version;
    if (r == t.range) {
      t.all_changed = t.version;  // no need to stamp each row: see eager_rows_for
    } else {
      std::fill_n(t.row_version.begin() + (r.begin - t.range.begin), r.size(), t.version);
    }
  }
  // Whether the optimizer's update of values [off, off + n) of `t` (n <= check_chunk) with
  // gradient `g` at step `step` leaves every value and state finite: the optimizer's own
  // read-only check when it has one (`stays_finite`), otherwise `apply` on a copy in `scratch_`.
  bool candidates_finite(const step_optimizer& opt, const shard_table& t, std::size_t off,
                         std::size_t n, const float* g, std::uint64_t step);
  // Whether gradient `g`, values `v` and state planes `st` (n floats each) are all finite: one
  // vectorised sum of x * 0 (0 for a finite x, NaN otherwise) over every plane.
  static bool chunk_finite(const float* g, const float* v,
                           const optimizer_state<Optimizer::state_per_param>& st,
                           std::size_t n) noexcept {
    using cmap = Eigen::Map<const Eigen::ArrayXf>;
    const auto len = static_cast<Eigen::Index>(n);
    return [&]<std::size_t... K>(std::index_sequence<K...>) {
      return std::isfinite(
          ((cmap(g, len) * 0.0f + cmap(v, len) * 0.0f) + ... + (cmap(st[K].data(), len) * 0.0f))
              .sum());
    }(std::make_index_sequence<Optimizer::state_per_param>{});
  }
  void apply_rows(const step_optimizer& opt, shard_table& t, std::size_t off, std::size_t n,
                  const float* g);

  std::uint32_t shard_;
  std::uint32_t num_shards_;
  std::uint32_t num_workers_;
  [[no_unique_address]] Optimizer optimizer_;
  struct own_pool_tag {};
  // The tables' blocks when no allocator was given (declared before tables_: outlives them).
  std::unique_ptr<buffer_pool> own_pool_;
  std::vector<shard_table> tables_;
  std::vector<clock_value> clocks_;
  std::vector<std::uint8_t> member_;  // 1: the worker's clock bounds the server clock
  std::uint32_t start_members_ = 0;   // elastic: joins needed before the clock moves
  std::uint32_t joined_ = 0;          // elastic: joins so far
  std::vector<std::vector<std::uint64_t>> applied_;  // [worker][table] pushes applied
  std::vector<std::uint64_t> last_seq_;
  clock_value server_clock_ = 0;
  bool has_state_ = false;
  std::vector<pending_pull<Reader, TimePoint>> pending_;
  std::uint64_t pending_bytes_ = 0;  // payload bytes of pending_
  // check_and_apply's undo buffer: the values, then each optimizer state plane, of the chunks
  // of the push being applied (grown to the largest push, then reused).
  std::vector<float> undo_;

 public:
  /// Floats per chunk of `check_update` (per value plane and optimizer state plane).
  static constexpr std::size_t check_chunk = 1024;
  /// The alignment (bytes) `check_and_apply` ends its chunks on: Eigen's largest packet's.
  static constexpr std::size_t align = EIGEN_MAX_ALIGN_BYTES > 0 ? EIGEN_MAX_ALIGN_BYTES : 4;
  /// Whether the optimizer checks an update itself, read-only: `o.stays_finite(params, grad,
  /// state, step)`, the arguments of `apply` (params and grad as spans of const float),
  /// returning whether `apply` would leave every value and state finite. The shipped
  /// optimizers have it; for one without it, `check_update` runs `apply` on a copy.
  static constexpr bool has_stays_finite =
      requires(const step_optimizer& o, std::span<const float> p, std::span<const float> g,
               const optimizer_state<Optimizer::state_per_param>& s, std::uint64_t step) {
        { o.stays_finite(p, g, s, step) } -> std::convertible_to<bool>;
      };

 private:
  // check_update's candidates: the values, then each optimizer state plane, check_chunk each.
  alignas(64) std::array<float, check_chunk * (1 + Optimizer::state_per_param)> scratch_{};
};

}  // namespace asyncps::detail

#include "asyncps/detail/server/shard_reads.ipp"
#include "asyncps/detail/server/shard_updates.ipp"
#include "asyncps/detail/server/shard_whole_state.ipp"
