// asyncps — detail::log_limiter: at most a few log lines per peer and kind in each interval;
// the lines held back are counted and reported in one summary line.
//
// A stranger can make a service log as fast as it can connect (a wrong secret, a port scan, a
// descriptor flood). Every line about such a peer goes through `admit` first: the first
// `limits::lines` lines of one kind about one peer host in a window of `limits::window` are
// written; later ones in that window only count, and once the window has ended the limiter
// writes "N more <kind> from <peer> suppressed in the last T s" instead of them. The peer is
// the host, not the port: a flood from one machine comes from many ports.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace asyncps::detail {

/// The kinds of rate-limited log lines the services write (the text names them in summaries).
namespace log_kind {
/// An accept failed with a transient error; the accept loop pauses and retries.
inline constexpr std::string_view failed_accept = "failed accepts";
/// A connection refused before it said who it is: a failed authentication or TLS handshake,
/// or no valid first message within the service's timeout.
inline constexpr std::string_view refused_connection = "refused connections";
/// A request refused by the protocol (an error frame naming why, then the connection closes).
inline constexpr std::string_view refused_request = "refused requests";
/// A message a recovery part held (or replayed) and dispatched later was refused, so it was
/// dropped (e.g. `recovery::replica_log`'s held pushes).
inline constexpr std::string_view dropped_message = "dropped messages";
}  // namespace log_kind

/// The host part of `address` as log lines print it: "10.0.0.7" of "10.0.0.7:51234", "::1" of
/// "[::1]:51234"; anything else (a name without a port, "") as is. Thread safety: pure.
inline std::string_view host_of(std::string_view address) noexcept {
  if (address.starts_with('[')) {
    const auto close = address.find(']');
    return close == std::string_view::npos ? address : address.substr(1, close - 1);
  }
  const auto colon = address.find(':');
  if (colon == std::string_view::npos || address.find(':', colon + 1) != std::string_view::npos)
    return address;  // no port, or a bare IPv6 address
  return address.substr(0, colon);
}

/// Rate limits log lines per (kind, peer) (see the file comment). `TimePoint` is the time the
/// owner passes in (its transport clock's, so that simulated time works too).
///
/// Memory: at most `limits::max_peers` (kind, peer) pairs are tracked, in one vector reserved
/// at the first line; a new pair when it is full evicts the least recently seen one (its
/// summary is written first when it held lines back). Past that first reservation, `admit`
/// allocates only to copy a peer name longer than the string's inline buffer into a slot that
/// never held one as long (an IPv6 address). Complexity: `admit` is O(tracked pairs).
/// Thread safety: none; the owner calls it on its executor.
template <class TimePoint = std::chrono::steady_clock::time_point>
class log_limiter {
 public:
  using time_point = TimePoint;

  /// How much is written.
  struct limits {
    std::uint32_t lines = 5;                   ///< lines per (kind, peer) per window
    std::chrono::milliseconds window{10'000};  ///< the interval
    std::size_t max_peers = 256;               ///< (kind, peer) pairs tracked at once
  };

  log_limiter() = default;
  explicit log_limiter(limits l) : limits_(l) {
    limits_.max_peers = std::max<std::size_t>(limits_.max_peers, 1);
  }

  /// Whether one more line of `kind` about `peer` may be written at `now`. `kind` must have
  /// static storage duration (a `log_kind` constant or a literal); `peer` is a host ("" when
  /// the transport knows none: all such lines share one count). Summaries that are due (their
  /// window has ended, or their pair is evicted) are passed to `sink` (called with a
  /// `const std::string&`) before this returns. `now` never goes back.
  template <class Sink>
  bool admit(std::string_view kind, std::string_view peer, time_point now, Sink&& sink) {
    flush(now, sink);
    entry* e = find(kind, peer);
    if (e != nullptr && now - e->start >= limits_.window) {
      summarize(*e, now, sink);
      e->start = now;
      e->lines = 0;
      e->suppressed = 0;
    }
    if (e == nullptr) e = &insert(kind, peer, now, sink);
    e->last = now;
    if (e->lines < limits_.lines) {
      ++e->lines;
      return true;
    }
    ++e->suppressed;
    ++suppressed_;
    const time_point end = e->start + limits_.window;
    if (!due_ || end < *due_) due_ = end;
    return false;
  }

  /// Writes to `sink` the summary of every window that has ended by `now` with lines held
  /// back, and forgets those pairs. Cheap (one comparison) while none is due: owners call it
  /// from a periodic timer so that a flood's count is reported even when the flood stops.
  template <class Sink>
  void flush(time_point now, Sink&& sink) {
    if (!due_ || now < *due_) return;
    due_.reset();
    for (std::size_t i = 0; i < entries_.size();) {
      entry& e = entries_[i];
      if (now - e.start >= limits_.window) {
        summarize(e, now, sink);
        remove(i);
        continue;
      }
      if (e.suppressed > 0) {
        const time_point end = e.start + limits_.window;
        if (!due_ || end < *due_) due_ = end;
      }
      ++i;
    }
  }

  /// Writes every pending summary to `sink` whether or not its window has ended (at `now`,
  /// e.g. when the owner stops), and forgets every pair.
  template <class Sink>
  void flush_all(time_point now, Sink&& sink) {
    for (auto& e : entries_) summarize(e, now, sink);
    entries_.clear();
    due_.reset();
  }

  /// Lines held back since construction (each counted in some summary).
  std::uint64_t suppressed() const noexcept { return suppressed_; }
  /// (kind, peer) pairs tracked now (at most `limits::max_peers`).
  std::size_t tracked() const noexcept { return entries_.size(); }

 private:
  struct entry {
    std::string_view kind;  // static storage (see admit)
    std::string peer;
    time_point start{};  // the window's start
    time_point last{};   // the last line, for eviction
    std::uint32_t lines = 0;
    std::uint64_t suppressed = 0;
  };

  entry* find(std::string_view kind, std::string_view peer) noexcept {
    for (auto& e : entries_)
      if (e.kind == kind && e.peer == peer) return &e;
    return nullptr;
  }

  template <class Sink>
  entry& insert(std::string_view kind, std::string_view peer, time_point now, Sink& sink) {
    if (entries_.capacity() < limits_.max_peers) entries_.reserve(limits_.max_peers);
    entry* slot = nullptr;
    if (entries_.size() < limits_.max_peers) {
      slot = &entries_.emplace_back();
    } else {
      slot = &*std::min_element(entries_.begin(), entries_.end(),
                                [](const entry& a, const entry& b) { return a.last < b.last; });
      summarize(*slot, now, sink);
    }
    slot->kind = kind;
    slot->peer.assign(peer);
    slot->start = now;
    slot->lines = 0;
    slot->suppressed = 0;
    return *slot;
  }

  void remove(std::size_t i) {
    if (i + 1 != entries_.size()) std::swap(entries_[i], entries_.back());
    entries_.pop_back();
  }

  // "N more <kind> from <peer> suppressed in the last T s", when `e` held lines back.
  template <class Sink>
  static void summarize(const entry& e, time_point now, Sink& sink) {
    if (e.suppressed == 0) return;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - e.start).count();
    const auto tenths = std::max<long long>((static_cast<long long>(ms) + 99) / 100, 1);
    std::string line = std::to_string(e.suppressed) + " more ";
    line += e.kind;
    if (!e.peer.empty()) line += " from " + e.peer;
    line += " suppressed in the last " + std::to_string(tenths / 10) + "." +
            std::to_string(tenths % 10) + " s";
    sink(std::as_const(line));
  }

  limits limits_{};
  std::vector<entry> entries_;
  std::optional<time_point> due_;  // the earliest end of a window with lines held back
  std::uint64_t suppressed_ = 0;
};

}  // namespace asyncps::detail
