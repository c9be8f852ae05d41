// asyncps — simulated_network's connection mechanics (internal): delivery of the messages in
// flight, receive, send (and its flow control), close, reset by a fault, connect (SYN, SYN-ACK)
// and accept; and its teardown. Out-of-line definitions of members declared in
// asyncps/transport/simulated_network.hpp.
//
// Not a header to include on its own: simulated_network.hpp includes it at its end, after the
// class it defines members of (so this file does not include simulated_network.hpp back).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "asyncps/error.hpp"
#include "asyncps/transport/sim/handlers.hpp"
#include "asyncps/transport/sim/pipe.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

inline void simulated_network::schedule_delivery(detail::sim_pipe& p, int d) {
  auto& dir = p.dir[d];
  dir.event = schedule(dir.flight.front().at, detail::sim_action([this, &p, d] { deliver(p, d); }));
  dir.scheduled = true;
}

inline void simulated_network::unschedule_delivery(detail::sim_direction& dir) {
  if (dir.scheduled) unschedule(dir.event);
  dir.scheduled = false;
}

inline void simulated_network::deliver(detail::sim_pipe& p, int d) {
  auto& dir = p.dir[d];
  dir.scheduled = false;
  while (!dir.flight.empty() && dir.flight.front().at <= now_) {
    auto& f = dir.flight.front();
    if (f.eof) {
      dir.eof = true;
    } else {
      ++stats_.messages;
      stats_.bytes += header_size + f.m.payload.size();
      dir.arrived.push_back(std::move(f.m));
    }
    dir.flight.pop_front();
  }
  if (!dir.flight.empty()) schedule_delivery(p, d);
  try_receive(p, d);
}

inline void simulated_network::try_receive(detail::sim_pipe& p, int d) {
  auto& dir = p.dir[d];
  if (!dir.receiver) return;
  if (p.broken) {
    complete(dir.receiver, p.broken, message{});
  } else if (!dir.arrived.empty()) {
    message m = std::move(dir.arrived.front());
    dir.arrived.pop_front();
    dir.taken += header_size + m.payload.size();
    complete(dir.receiver, std::error_code{}, std::move(m));
    wake_senders(dir);
  } else if (dir.eof || dir.reader_closed) {
    complete(dir.receiver, make_error_code(errc::connection_closed), message{});
  }
}

inline std::error_code simulated_network::transmit(detail::sim_pipe& p, int side, message m,
                                                   std::uint64_t& wait_until) {
  wait_until = 0;
  if (p.broken) return p.broken;
  auto& dir = p.dir[side];
  // The peer closed: as with TCP before the peer's reset comes back, the send succeeds and
  // the bytes are dropped; this side learns of the close from the peer's FIN (`eof`).
  if (dir.reader_closed) return {};
  const std::uint64_t bytes = header_size + m.payload.size();
  const time_point at = arrival(p.node[side], bytes, dir.last);
  dir.last = at;
  dir.flight.push_back(detail::sim_flight{at, std::move(m), false});
  if (!dir.scheduled) schedule_delivery(p, side);
  // Flow control (simulation_options::send_buffer_bytes): the send completes once the bytes
  // queued, its own included, are within the bound, or once nothing is queued ahead of it.
  const std::uint64_t start = dir.sent;
  dir.sent += bytes;
  stats_.max_queued_bytes = std::max<std::uint64_t>(stats_.max_queued_bytes, dir.sent - dir.taken);
  const std::uint64_t bound = opts_.send_buffer_bytes;
  if (bound > 0 && dir.sent - dir.taken > bound && dir.taken < start) {
    wait_until = std::min(start, dir.sent - bound);
    ++stats_.send_waits;
  }
  return {};
}

inline void simulated_network::start_send_wait(detail::sim_pipe& p, int side, std::uint64_t until,
                                               detail::sim_completion<std::error_code> c) {
  auto& dir = p.dir[side];
  if (p.broken) {
    complete(c, p.broken);
  } else if (dir.taken >= until) {
    complete(c, std::error_code{});
  } else {
    dir.senders.push_back(detail::sim_send_wait{until, std::move(c)});
  }
}

inline void simulated_network::wake_senders(detail::sim_direction& dir) {
  while (!dir.senders.empty() && dir.senders.front().until <= dir.taken) {
    auto w = std::move(dir.senders.front());
    dir.senders.pop_front();
    complete(w.done, std::error_code{});
  }
}

inline void simulated_network::fail_senders(detail::sim_direction& dir, std::error_code ec) {
  auto waits = std::move(dir.senders);
  dir.senders.clear();
  for (auto& w : waits) complete(w.done, ec);
}

inline void simulated_network::break_pipe(detail::sim_pipe& p, std::error_code ec) {
  if (p.broken) return;
  p.broken = ec;
  ++stats_.broken;
  for (int d = 0; d < 2; ++d) {
    auto& dir = p.dir[d];
    unschedule_delivery(dir);
    dir.flight.clear();
    dir.arrived.clear();
    dir.taken = dir.sent;
    complete(dir.receiver, ec, message{});
    fail_senders(dir, ec);
  }
}

// Side `side` closes: its receive completes; the peer receives connection_closed after the
// messages already on their way to it (what the peer sends from now on is dropped).
inline void simulated_network::close_side(detail::sim_pipe& p, int side) {
  auto& in = p.dir[1 - side];
  auto& out = p.dir[side];
  in.reader_closed = true;
  if (shutting_down_) return;
  unschedule_delivery(in);
  in.flight.clear();
  in.arrived.clear();
  in.taken = in.sent;
  complete(in.receiver, make_error_code(errc::connection_closed), message{});
  // The peer's sends waiting for room succeed (their bytes are dropped, as later ones are);
  // this side's own waiting sends fail.
  wake_senders(in);
  fail_senders(out, make_error_code(errc::connection_closed));
  if (!p.broken && !out.reader_closed) {
    out.last = arrival(p.node[side], 0, out.last);
    out.flight.push_back(detail::sim_flight{out.last, message{}, true});
    if (!out.scheduled) schedule_delivery(p, side);
  }
}

inline void simulated_network::release(detail::sim_pipe& p) {
  if (--p.refs > 0) return;
  for (auto& d : p.dir) unschedule_delivery(d);
  pipes_.erase(p.self);
}

inline void simulated_network::start_receive(detail::sim_pipe& p, int d,
                                             detail::sim_completion<std::error_code, message> c) {
  p.dir[d].receiver = std::move(c);
  try_receive(p, d);
}

inline void
simulated_network::start_connect(std::uint32_t from, std::string name,
                                 detail::sim_completion<std::error_code, detail::sim_pipe*> c) {
  schedule(now_ + latency_sample(),
           detail::sim_action([this, from, name = std::move(name), c = std::move(c)]() mutable {
             on_syn(from, name, std::move(c));
           }));
}

inline void
simulated_network::on_syn(std::uint32_t from, const std::string& name,
                          detail::sim_completion<std::error_code, detail::sim_pipe*> c) {
  const auto it = listeners_.find(name);
  if (it == listeners_.end() || !reachable(from, it->second->node)) {
    schedule(now_ + latency_sample(), detail::sim_action([this, c = std::move(c)]() mutable {
               complete(c, std::make_error_code(std::errc::connection_refused),
                        static_cast<detail::sim_pipe*>(nullptr));
             }));
    return;
  }
  auto& l = *it->second;
  auto& p = pipes_.emplace_back();
  p.self = std::prev(pipes_.end());
  p.node[0] = from;
  p.node[1] = l.node;
  ++stats_.connections;
  if (l.accepting) {
    complete(l.accepting, std::error_code{}, &p);
  } else {
    l.backlog.push_back(&p);
  }
  schedule(now_ + latency_sample(), detail::sim_action([this, &p, c = std::move(c)]() mutable {
             if (p.broken) {
               const auto ec = p.broken;
               release(p);
               complete(c, ec, static_cast<detail::sim_pipe*>(nullptr));
             } else {
               complete(c, std::error_code{}, &p);
             }
           }));
}

inline void
simulated_network::start_accept(detail::sim_listener& l,
                                detail::sim_completion<std::error_code, detail::sim_pipe*> c) {
  if (!l.backlog.empty()) {
    detail::sim_pipe* p = l.backlog.front();
    l.backlog.pop_front();
    complete(c, std::error_code{}, p);
  } else {
    l.accepting = std::move(c);
  }
}

inline void simulated_network::close_listener(detail::sim_listener* l, const std::string& name) {
  const auto it = listeners_.find(name);
  if (it == listeners_.end() || it->second.get() != l) return;
  auto owned = std::move(it->second);
  listeners_.erase(it);
  complete(owned->accepting, make_error_code(errc::stopped),
           static_cast<detail::sim_pipe*>(nullptr));
  for (detail::sim_pipe* p : owned->backlog) {
    close_side(*p, 1);
    release(*p);
  }
}

inline void simulated_network::drop_pending() {
  for (bool any = true; any;) {
    any = false;
    {
      auto events = std::move(events_);
      events_.clear();
      any = any || !events.empty();
    }
    while (!timers_.empty()) {
      simulated_timer* t = *timers_.begin();
      timers_.erase(timers_.begin());
      auto waits = std::move(t->waits_);
      t->waits_.clear();
      any = true;
    }
    std::vector<detail::sim_completion<std::error_code, message>> receivers;
    std::vector<detail::sim_send_wait> senders;
    for (auto& p : pipes_)
      for (auto& d : p.dir) {
        if (d.receiver) receivers.push_back(std::move(d.receiver));
        for (auto& w : d.senders) senders.push_back(std::move(w));
        d.senders.clear();
      }
    std::vector<detail::sim_completion<std::error_code, detail::sim_pipe*>> accepts;
    for (auto& [name, l] : listeners_)
      if (l->accepting) accepts.push_back(std::move(l->accepting));
    any = any || !receivers.empty() || !senders.empty() || !accepts.empty();
  }
}

inline simulated_network::~simulated_network() {
  shutting_down_ = true;
  drop_pending();
  work_.reset();
  io_.reset();  // destroys the handlers posted but not run (and their coroutines)
  drop_pending();
}

}  // namespace asyncps
