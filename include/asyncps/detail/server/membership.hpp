// asyncps — when the absent members of an elastic shard leave (server_options::elastic).
//
// The shard's member flags and clocks live in shard_core; this keeps, per worker id, the time
// at which a member whose connection ended leaves unless it says hello again.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "asyncps/server_options.hpp"

namespace asyncps::detail {

/// Departure deadlines of absent members. Thread safety: the owning server's executor.
template <class TimePoint>
class membership {
 public:
  membership(const std::optional<membership_options>& o, std::uint32_t capacity)
      : leave_at_(o ? capacity : 0), grace_(o ? o->grace : std::chrono::milliseconds{}),
        elastic_(o.has_value()) {}

  /// Whether membership is elastic (`server_options::elastic` set).
  bool elastic() const noexcept { return elastic_; }
  /// Member `w`'s connection ended without `bye` at `now`: it leaves at `now + grace`.
  void absent(std::uint32_t w, TimePoint now) { leave_at_[w] = now + grace_; }
  /// `w` said hello (or left): nothing pending for it.
  void present(std::uint32_t w) { leave_at_[w].reset(); }
  /// Calls `f(w)` for every absent member whose grace ended by `now`, and forgets it.
  template <class F>
  void due(TimePoint now, F&& f) {
    for (std::uint32_t w = 0; w < leave_at_.size(); ++w) {
      if (leave_at_[w] && *leave_at_[w] <= now) {
        leave_at_[w].reset();
        f(w);
      }
    }
  }
  /// The earliest pending departure, if any.
  std::optional<TimePoint> next() const {
    std::optional<TimePoint> t;
    for (const auto& d : leave_at_)
      if (d && (!t || *d < *t)) t = d;
    return t;
  }
  /// The grace period (for log lines).
  std::chrono::milliseconds grace() const noexcept { return grace_; }

 private:
  std::vector<std::optional<TimePoint>> leave_at_;
  std::chrono::milliseconds grace_;
  bool elastic_;
};

}  // namespace asyncps::detail
