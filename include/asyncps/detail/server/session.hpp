// asyncps — detail::server_session: one connection of a server, its outbox and its queue
// limits.
//
// `server_session_state` is the sans-io part (what `server_protocol` reads and writes: the
// recovery part's view `session_base`, the queued messages, the reader's subscriptions, its
// waiting pulls, the times its hello and send deadlines count from); `server_session` adds the
// connection and the timer that wakes its write loop (`basic_server` runs the loops). Thread
// safety: the server's executor.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <string>
#include <utility>
#include <vector>

#include "asyncps/detail/server/hooks.hpp"
#include "asyncps/detail/server/shard_core.hpp"
#include "asyncps/wire.hpp"

namespace asyncps::detail {

/// How much one worker connection may have queued and not yet read (see
/// `server_options::max_queued_messages` and `max_queued_bytes`).
struct queue_limits {
  std::uint32_t messages = 4096;                   ///< messages queued
  std::uint64_t bytes = std::uint64_t{256} << 20;  ///< payload bytes queued
};

/// The sans-io state of one server connection (see the file comment). `TimePoint`: the
/// transport clock's time.
template <class TimePoint>
struct server_session_state : session_base {
  /// The peer's address as text (for log lines), taken when the session starts; empty when
  /// the connection has no `remote_endpoint()`.
  std::string address;
  std::vector<message> outbox;      ///< queued, not yet taken by the write loop
  std::vector<message> sending;     ///< taken by the write loop, being sent
  std::vector<subscription> subs;   ///< worker sessions: per table, rows for eager pushes
  std::uint32_t pending_pulls = 0;  ///< pulls of this session waiting in the shard core
  /// VAP: the eager rows messages sent to this reader that ask for its acknowledgement
  /// (`frame_flags::want_ack`), and how many of them it has acknowledged (cumulative counts;
  /// a writer's clock is visible once every reader it was sent to has acknowledged it).
  std::uint64_t visibility_sent = 0;
  std::uint64_t visibility_acked = 0;  ///< see `visibility_sent`
  /// VAP, as a reader: (the `visibility_sent` count to reach, the writer clock's id) per
  /// writer clock still waiting for this reader, oldest first.
  std::deque<std::pair<std::uint64_t, std::uint64_t>> visibility_owed;
  /// VAP, as a writer: the ids of this session's clocks not yet visible, oldest first.
  std::deque<std::uint64_t> visibility_clocks;
  std::uint64_t queued_bytes = 0;  ///< payload bytes in outbox + sending
  int running = 2;                 ///< loops still running (read_loop + write_loop)
  bool cut = false;  ///< closed at once (`server_protocol::close`): its queue no longer counts
  /// When the session started (`server_options::hello_timeout` counts from here).
  TimePoint opened{};
  /// When its last message arrived (`server_options::takeover_silence` counts from here).
  TimePoint heard{};
  /// A worker session whose hello moved its worker's clock up (a rejoin): the clock before
  /// (-1: its hello moved nothing). Undone when the session ends or is taken over before it
  /// trained (`trained`), so that a hello alone cannot leave an absurd clock behind.
  clock_value raised_from = -1;
  /// A worker session has had a push or clock message taken since its hello.
  bool trained = false;
  /// When the write in progress began (`server_options::send_timeout` counts from here);
  /// `TimePoint::max()` while no write is in progress.
  TimePoint send_since = TimePoint::max();

  /// Messages queued in all (outbox and being sent).
  std::size_t queued() const noexcept { return outbox.size() + sending.size(); }
  /// Whether one more message of `payload_bytes` would exceed `lim`.
  bool over(const queue_limits& lim, std::size_t payload_bytes) const noexcept {
    return queued() >= lim.messages || queued_bytes + payload_bytes > lim.bytes;
  }
  /// Queues `m` (no limit check; amortized allocation-free once the outbox has grown).
  void queue(message m) {
    queued_bytes += m.payload.size();
    outbox.push_back(std::move(m));
  }
};

/// One server connection: the sans-io state, the transport's connection `Connection` and the
/// timer `Timer` its write loop sleeps on (expires at `time_point::max()`, set once; queuing
/// a message cancels the wait). `self` is its position in the server's session list.
/// `TimePoint`: the transport clock's time.
template <class Connection, class Timer, class TimePoint>
struct server_session : server_session_state<TimePoint> {
  template <class Executor, class Never>
  server_session(Connection c, const Executor& ex, Never never)
      : conn(std::move(c)), wake(ex, never) {}
  Connection conn;
  Timer wake;
  typename std::list<server_session>::iterator self;
};

}  // namespace asyncps::detail
