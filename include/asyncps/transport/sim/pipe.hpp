// asyncps — the state of the simulated network's connections and listeners: messages in
// flight, arrived and awaited on each direction of a connection (internal; the mechanics that
// move them are simulated_network's, transport/sim/connections.ipp).
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <system_error>
#include <utility>

#include <asio/execution_context.hpp>

#include "asyncps/transport/sim/handlers.hpp"
#include "asyncps/transport/simulation_options.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

class simulated_network;

namespace detail {

using sim_time = simulated_clock::time_point;
using sim_event_key = std::pair<sim_time, std::uint64_t>;

/// A message (or the sender's close, `eof`) on its way.
struct sim_flight {
  sim_time at;
  message m;
  bool eof = false;
};

/// A send waiting for room in its direction's send buffer (`simulation_options::
/// send_buffer_bytes`): it completes once the receiver has taken `until` bytes.
struct sim_send_wait {
  std::uint64_t until = 0;
  sim_completion<std::error_code> done;
};

/// One direction of a simulated connection.
struct sim_direction {
  std::deque<sim_flight> flight;                      // sent, not arrived (non-decreasing `at`)
  std::deque<message> arrived;                        // arrived, not received yet
  sim_completion<std::error_code, message> receiver;  // the outstanding receive
  sim_time last{};                                    // arrival time of the newest message
  sim_event_key event{};                              // the next delivery, when `scheduled`
  bool scheduled = false;
  bool eof = false;            // the sender's close arrived (after `arrived`)
  bool reader_closed = false;  // the receiving side closed: sends fail
  // Flow control: bytes (64-byte headers included) ever sent on this direction, and ever
  // taken by the receiver (received by its owner, or dropped); `sent - taken` are queued.
  std::uint64_t sent = 0;
  std::uint64_t taken = 0;
  std::deque<sim_send_wait> senders;  // sends waiting for room, non-decreasing `until`
};

/// A connection between two nodes: dir[0] carries side 0's (the connector's) messages to side 1
/// (the acceptor's), dir[1] the other way.
struct sim_pipe {
  sim_direction dir[2];
  std::uint32_t node[2] = {0, 0};
  std::error_code broken{};  // a fault reset the connection
  int refs = 2;              // connection objects (or pending setups) still using it
  std::list<sim_pipe>::iterator self;
};

/// A listening name.
struct sim_listener {
  std::uint32_t node = 0;
  std::deque<sim_pipe*> backlog;                         // connections not accepted yet
  sim_completion<std::error_code, sim_pipe*> accepting;  // the outstanding accept
};

/// Finds the `simulated_network` from one of its executors (see `network_of`).
class sim_service final : public asio::execution_context::service {
 public:
  static inline asio::execution_context::id id;
  explicit sim_service(asio::execution_context& ctx) : service(ctx) {}
  sim_service(asio::execution_context& ctx, simulated_network* n) : service(ctx), net(n) {}
  simulated_network* net = nullptr;

 private:
  void shutdown() override {}
};

}  // namespace detail

}  // namespace asyncps
