// asyncps — detail::shard_core, the whole state: saved into a `shard_state`, restored from one,
// and checked (a state a run can reach) before it is installed.
//
// Out-of-line definitions of members declared in asyncps/detail/server/shard_core.hpp. Not a header
// to include on its own: shard_core.hpp includes it at its end, after the class it defines members
// of (so this file does not include shard_core.hpp back).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <system_error>
#include <utility>

#include "asyncps/buffer.hpp"
#include "asyncps/error.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/shard_state.hpp"
#include "asyncps/table.hpp"
#include "asyncps/wire.hpp"
namespace asyncps::detail {

template <optimizer_policy Optimizer, class Reader, class TimePoint>
void shard_core<Optimizer, Reader, TimePoint>::save_state(shard_state& out) const {
  out.shard = shard_;
  out.num_shards = num_shards_;
  out.num_workers = num_workers_;
  out.state_per_param = Optimizer::state_per_param;
  out.server_clock = server_clock_;
  out.worker_clocks.assign(clocks_.begin(), clocks_.end());
  out.last_seq.assign(last_seq_.begin(), last_seq_.end());
  out.applied.resize(std::size_t{num_workers_} * tables_.size());
  for (std::uint32_t w = 0; w < num_workers_; ++w)
    std::copy(applied_[w].begin(), applied_[w].end(), out.applied.begin() + w * tables_.size());
  out.tables.resize(tables_.size());
  for (std::size_t i = 0; i < tables_.size(); ++i) {
    auto& o = out.tables[i];
    o.spec = tables_[i].spec;
    o.range = tables_[i].range;
    o.step = tables_[i].step;
    o.values.assign(tables_[i].values.begin(), tables_[i].values.end());
    o.optimizer_state.assign(tables_[i].state.begin(), tables_[i].state.end());
  }
}

template <optimizer_policy Optimizer, class Reader, class TimePoint>
std::error_code shard_core<Optimizer, Reader, TimePoint>::restore_state(const shard_state& st,
                                                                        std::string& detail) {
  if (st.shard != shard_ || st.num_shards != num_shards_ || st.num_workers != num_workers_ ||
      st.state_per_param != Optimizer::state_per_param || st.tables.size() != tables_.size() ||
      st.worker_clocks.size() != clocks_.size() ||
      st.applied.size() != std::size_t{num_workers_} * tables_.size() ||
      (!st.last_seq.empty() && st.last_seq.size() != last_seq_.size())) {
    detail = " (shard " + std::to_string(st.shard) + " of " + std::to_string(st.num_shards) + ", " +
             std::to_string(st.num_workers) + " workers, " + std::to_string(st.tables.size()) +
             " tables, " + std::to_string(st.state_per_param) + " optimizer planes)";
    return errc::layout_mismatch;
  }
  for (std::size_t i = 0; i < tables_.size(); ++i) {
    const auto& t = st.tables[i];
    if (!(t.spec == tables_[i].spec) || !(t.range == tables_[i].range) ||
        t.values.size() != tables_[i].values.size() ||
        t.optimizer_state.size() != tables_[i].state.size()) {
      detail = " (table " + std::to_string(i) + ")";
      return errc::layout_mismatch;
    }
  }
  if (auto ec = check_state(st, detail)) return ec;
  for (std::size_t i = 0; i < tables_.size(); ++i) {
    tables_[i].step = st.tables[i].step;
    std::copy(st.tables[i].values.begin(), st.tables[i].values.end(), tables_[i].values.begin());
    std::copy(st.tables[i].optimizer_state.begin(), st.tables[i].optimizer_state.end(),
              tables_[i].state.begin());
    changed(tables_[i], tables_[i].range);
  }
  for (std::uint32_t w = 0; w < num_workers_; ++w) {
    clocks_[w] = st.worker_clocks[w];
    std::copy_n(st.applied.begin() + w * tables_.size(), tables_.size(), applied_[w].begin());
  }
  if (!st.last_seq.empty()) std::copy(st.last_seq.begin(), st.last_seq.end(), last_seq_.begin());
  // The restored clocks decide the server clock, also below 0 (settle_clock only raises
  // it); 0 when no member holds it (elastic, before any join).
  server_clock_ = std::numeric_limits<clock_value>::min();
  if (!settle_clock()) server_clock_ = 0;
  has_state_ = true;
  return {};
}

template <optimizer_policy Optimizer, class Reader, class TimePoint>
std::error_code shard_core<Optimizer, Reader, TimePoint>::check_state(const shard_state& st,
                                                                      std::string& detail) const {
  const auto bad = [&](const std::string& field, const std::string& value,
                       const std::string& range) {
    detail = " (field '" + field + "' is " + value + "; " + range + ")";
    return make_error_code(errc::bad_state);
  };
  for (std::size_t i = 0; i < st.tables.size(); ++i) {
    const auto& t = st.tables[i];
    if (!all_finite(t.values))
      return bad("tables[" + std::to_string(i) + "].values", "not all finite",
                 "a shard's values are finite");
    if (!all_finite(t.optimizer_state))
      return bad("tables[" + std::to_string(i) + "].optimizer_state", "not all finite",
                 "the optimizer's state is finite");
    if (t.step > protocol::max_seq)
      return bad("tables[" + std::to_string(i) + "].step", std::to_string(t.step),
                 "at most protocol::max_seq " + std::to_string(protocol::max_seq));
  }
  for (std::size_t w = 0; w < st.worker_clocks.size(); ++w) {
    const clock_value c = st.worker_clocks[w];
    if (c < 0 || c > protocol::max_clock)
      return bad("worker_clocks[" + std::to_string(w) + "]", std::to_string(c),
                 "clocks lie in [0, " + std::to_string(protocol::max_clock) + "]");
  }
  for (std::size_t i = 0; i < st.applied.size(); ++i)
    if (st.applied[i] > protocol::max_seq)
      return bad("applied[" + std::to_string(i) + "]", std::to_string(st.applied[i]),
                 "at most protocol::max_seq " + std::to_string(protocol::max_seq));
  for (std::size_t w = 0; w < st.last_seq.size(); ++w)
    if (st.last_seq[w] > protocol::max_seq)
      return bad("last_seq[" + std::to_string(w) + "]", std::to_string(st.last_seq[w]),
                 "at most protocol::max_seq " + std::to_string(protocol::max_seq));
  return {};
}

}  // namespace asyncps::detail
