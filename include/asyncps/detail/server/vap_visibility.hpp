// asyncps — VAP visibility (value-bounded asynchronous parallel; Dai et al., AAAI 2015): a
// writer's clock is visible once every reader that was sent its rows has acknowledged them,
// and only then is the writer's push acknowledged (which is what bounds the writer's
// in-transit updates). The per-session counts live in server_session (`visibility_sent`,
// `visibility_acked`, `visibility_owed`, `visibility_clocks`); this keeps the writer clocks
// that are not acknowledged yet, and decides when each is.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <system_error>

#include "asyncps/error.hpp"

namespace asyncps::detail {

/// The writer clocks of a VAP shard that wait for their readers. `Session` has
/// server_session's visibility members. Every `ack` argument is callable as
/// `ack(Session& writer, std::uint64_t seq)` and sends the writer the acknowledgement of its
/// push `seq`. Thread safety: the owning server's executor.
template <class Session>
class vap_visibility {
 public:
  /// The id the next writer clock gets (`add`). Ids count up from 0.
  std::uint64_t next_id() const noexcept { return base_ + pending_.size(); }

  /// Reader `s` was sent one more eager rows message that asks for its acknowledgement, for
  /// writer clock `id` (`next_id()` before the `add` of that clock). Returns whether `s` is a
  /// new reader of that clock (its first such message for it).
  bool sent(Session& s, std::uint64_t id) {
    ++s.visibility_sent;
    if (!s.visibility_owed.empty() && s.visibility_owed.back().second == id) {
      s.visibility_owed.back().first = s.visibility_sent;  // a later table's message
      return false;
    }
    s.visibility_owed.emplace_back(s.visibility_sent, id);
    return true;
  }

  /// `writer`'s clock, whose push had sequence number `seq`, was sent to `readers` readers
  /// (each counted by `sent` with `next_id()`): acknowledged at once when there are none and
  /// no older clock of the writer waits, else once every reader has acknowledged, after the
  /// writer's older clocks.
  template <class Ack>
  void add(Session& writer, std::uint64_t seq, std::uint32_t readers, Ack&& ack) {
    if (readers == 0 && writer.visibility_clocks.empty()) {
      ack(writer, seq);
      return;
    }
    const std::uint64_t id = next_id();
    pending_.push_back(pending{&writer, seq, readers, false});
    writer.visibility_clocks.push_back(id);
    if (readers == 0) {  // visible already, but acknowledged after the older ones
      ++pending_.back().readers;
      reader_done(id, ack);
    }
  }

  /// Reader `s` acknowledges the messages that asked for it up to its `seq`-th (cumulative;
  /// connections are FIFO, so it has installed all of them). Errors:
  /// `errc::unexpected_message` (with `detail`) for a count that goes back or past the
  /// messages sent to it.
  template <class Ack>
  std::error_code on_ack(Session& s, std::uint64_t seq, std::string& detail, Ack&& ack) {
    if (seq < s.visibility_acked || seq > s.visibility_sent) {
      detail = " (visibility ack " + std::to_string(seq) + ", " +
               std::to_string(s.visibility_sent) + " rows messages asked for one, " +
               std::to_string(s.visibility_acked) + " acknowledged)";
      return errc::unexpected_message;
    }
    s.visibility_acked = seq;
    while (!s.visibility_owed.empty() && s.visibility_owed.front().first <= seq) {
      const std::uint64_t id = s.visibility_owed.front().second;
      s.visibility_owed.pop_front();
      reader_done(id, ack);
    }
    return {};
  }

  /// Session `s` ends: it is no longer waited for as a reader nor acknowledged as a writer.
  template <class Ack>
  void forget(Session& s, Ack&& ack) {
    for (const std::uint64_t id : s.visibility_clocks) {
      auto& p = pending_[id - base_];
      p.writer = nullptr;
      if (p.readers == 0) p.done = true;  // visible, waiting behind an older clock: dropped
    }
    s.visibility_clocks.clear();
    while (!s.visibility_owed.empty()) {
      const std::uint64_t id = s.visibility_owed.front().second;
      s.visibility_owed.pop_front();
      reader_done(id, ack);
    }
    trim();
  }

 private:
  // A writer clock not yet acknowledged: its writer's session (null once that ended), its
  // push's sequence number, the readers that have not acknowledged its rows yet, and whether
  // it is settled (acknowledged or dropped).
  struct pending {
    Session* writer = nullptr;
    std::uint64_t seq = 0;
    std::uint32_t readers = 0;
    bool done = false;
  };

  // One reader of writer clock `id` has its rows (or is gone); the last one makes the clock
  // visible, and the writer's visible clocks are acknowledged oldest first.
  template <class Ack>
  void reader_done(std::uint64_t id, Ack& ack) {
    auto& p = pending_[id - base_];
    if (--p.readers > 0) return;
    if (p.writer == nullptr) {  // the writer's session ended: nobody to tell
      p.done = true;
    } else {
      auto& order = p.writer->visibility_clocks;
      while (!order.empty() && pending_[order.front() - base_].readers == 0) {
        auto& q = pending_[order.front() - base_];
        ack(*q.writer, q.seq);
        q.done = true;
        order.pop_front();
      }
    }
    trim();
  }

  // Settled clocks leave from the front.
  void trim() {
    while (!pending_.empty() && pending_.front().done) {
      pending_.pop_front();
      ++base_;
    }
  }

  std::deque<pending> pending_;  // ids base_ .. base_ + size() - 1
  std::uint64_t base_ = 0;
};

}  // namespace asyncps::detail
