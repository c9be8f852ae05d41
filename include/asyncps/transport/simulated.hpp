// asyncps — simulated transport: the unchanged `basic_server` and `basic_worker` on a simulated
// network with a virtual clock, all in one thread.
//
// A `simulated_network` owns an `asio::io_context` (run only through `simulated_network::run`),
// the virtual clock and an event queue ordered by (virtual time, sequence number). Message
// delivery comes from a latency model, worker compute time from a per-worker speed profile
// (pass `compute_executor(worker)` as `basic_worker`'s `compute` argument), a sender's pace
// from its connection's send buffer (`simulation_options::send_buffer_bytes`), failures and
// partitions from a fault schedule, and every random choice from one seeded generator, so a
// run is reproducible from its seed. `run()` alternates "run every ready handler" and "jump
// the clock to the next event"; nothing ever sleeps, and the real CPU only does the math.
// Guide: docs/concepts/simulation.md.
//
// This header (the one to include) defines `simulated_transport`; the network, its timer and
// compute executor are in simulated_network.hpp, the options, models, counters and clock in
// simulation_options.hpp, and the internals in transport/sim/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/pipe_connection.hpp"
#include "asyncps/error.hpp"
#include "asyncps/options.hpp"
#include "asyncps/result.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/transport/sim/handlers.hpp"
#include "asyncps/transport/sim/pipe.hpp"
#include "asyncps/transport/simulated_network.hpp"
#include "asyncps/transport/simulation_options.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

/// One node's endpoint on a `simulated_network`. Models `asyncps::transport`, with the
/// optional time part (`timer_type`, `clock_type`: the network's virtual time). Endpoints are
/// names (`std::string`); the node is named at construction (several transports may share a
/// node, e.g. a server restarted on the same machine).
///
/// Thread safety: the network's thread. Object lifetime: the network outlives it; it outlives
/// its acceptors (connections only need the network).
class simulated_transport {
 public:
  using executor_type = asio::any_io_executor;
  using endpoint_type = std::string;
  using clock_type = simulated_clock;
  using timer_type = simulated_timer;

  /// One end of a simulated connection. Models `asyncps::connection`.
  class connection {
   public:
    /// A closed connection (placeholder before connecting).
    connection() = default;
    /// Takes over `o`'s end (`o` is left closed).
    connection(connection&& o) noexcept = default;
    connection& operator=(connection&& o) noexcept {
      if (this != &o) {
        close();
        end_ = std::move(o.end_);  // releases this side's pipe
        limits_ = o.limits_;
      }
      return *this;
    }
    ~connection() { close(); }  // then `end_` releases the pipe

    /// True although `async_send` may wait for room in the simulated send buffer
    /// (`simulation_options::send_buffer_bytes`): `basic_server` arms no send deadline
    /// (`server_options::send_timeout`) for its writes, which saves the sweeper's wake-ups per
    /// write in a simulation. A simulated peer that stops reading without closing therefore
    /// holds a server's write (to it only) until the connection closes or a fault resets it.
    static constexpr bool sends_complete_at_once = true;

    /// Puts `m` on the wire; it arrives after the latency model's delay (FIFO per connection).
    /// Completes once the bytes queued on this direction (sent, not yet received by the peer;
    /// `m` included) are at most `simulation_options::send_buffer_bytes`, or nothing is queued
    /// ahead of `m`: at once while the peer keeps up; in virtual time as the peer receives
    /// when this side outruns its link or its reader (0: always at once). Errors:
    /// `errc::connection_closed` when this side closed (also while waiting for room),
    /// `std::errc::connection_reset` after a fault (also while waiting). After the peer
    /// closed, sends succeed and the messages are dropped (as TCP's do until the peer's reset
    /// arrives), a waiting one included; the peer's close arrives here as `connection_closed`
    /// from `async_receive`.
    asio::awaitable<std::error_code> async_send(message m) {
      std::error_code ec = make_error_code(errc::connection_closed);
      if (end_.open()) {
        m.header.payload_bytes = m.payload.size();
        std::uint64_t until = 0;
        ec = end_.network().transmit(*end_.pipe(), end_.side(), std::move(m), until);
        if (!ec && until > 0) {
          auto [waited] =
              co_await asio::async_initiate<decltype(detail::use_tuple), void(std::error_code)>(
                  [this, until](auto handler) {
                    auto& net = end_.network();
                    net.start_send_wait(*end_.pipe(), end_.side(), until,
                                        detail::sim_completion<std::error_code>(
                                            std::move(handler), net.get_executor()));
                  },
                  detail::use_tuple);
          ec = waited;
        }
        if (ec) close();
      }
      co_return ec;
    }

    /// The next message. Errors: `errc::connection_closed` (either side closed; after the
    /// messages already sent), `std::errc::connection_reset` (a fault), or a
    /// `validate_header` error (the connection stays open: the owner decides).
    asio::awaitable<std::tuple<std::error_code, message>> async_receive() {
      std::tuple<std::error_code, message> out{make_error_code(errc::connection_closed), message{}};
      if (end_.open()) {
        auto [ec, m] = co_await asio::async_initiate<decltype(detail::use_tuple),
                                                     void(std::error_code, message)>(
            [this](auto handler) {
              auto& net = end_.network();
              net.start_receive(*end_.pipe(), end_.peer(),
                                detail::sim_completion<std::error_code, message>(
                                    std::move(handler), net.get_executor()));
            },
            detail::use_tuple);
        if (ec) {
          close();
          std::get<0>(out) = ec;
        } else if (auto v = validate_header(m.header, limits_)) {
          std::get<0>(out) = v;
        } else {
          out = {std::error_code{}, std::move(m)};
        }
      }
      co_return out;
    }

    /// Closes both directions: the peer receives `connection_closed` after the messages
    /// already on their way; an outstanding receive here completes with `connection_closed`.
    void close() noexcept {
      if (end_.mark_closed()) end_.network().close_side(*end_.pipe(), end_.side());
    }
    /// False after `close()`, a failed operation, or a fault that reset the connection.
    bool is_open() const noexcept { return end_.open() && !end_.pipe()->broken; }

   private:
    friend class simulated_transport;
    connection(simulated_network& n, detail::sim_pipe* p, int side, wire_limits lim)
        : end_(n, *p, side), limits_(lim) {}
    detail::pipe_end<simulated_network, detail::sim_pipe> end_;
    wire_limits limits_{};
  };

  /// A listening name. Models `asyncps::acceptor<connection>`.
  class acceptor {
   public:
    /// Takes over `o`'s name (`o` is left closed).
    acceptor(acceptor&& o) noexcept
        : transport_(o.transport_), name_(std::move(o.name_)),
          listener_(std::exchange(o.listener_, nullptr)) {}
    acceptor& operator=(acceptor&& o) noexcept {
      if (this != &o) {
        close();
        transport_ = o.transport_;
        name_ = std::move(o.name_);
        listener_ = std::exchange(o.listener_, nullptr);
      }
      return *this;
    }
    ~acceptor() { close(); }

    /// The next connection. Errors: `errc::stopped` once closed.
    asio::awaitable<std::tuple<std::error_code, connection>> async_accept() {
      if (listener_ == nullptr) co_return std::tuple{make_error_code(errc::stopped), connection{}};
      simulated_network& net = *transport_->net_;
      auto [ec, p] = co_await asio::async_initiate<decltype(detail::use_tuple),
                                                   void(std::error_code, detail::sim_pipe*)>(
          [this, &net](auto handler) {
            net.start_accept(*listener_, detail::sim_completion<std::error_code, detail::sim_pipe*>(
                                             std::move(handler), net.get_executor()));
          },
          detail::use_tuple);
      if (ec || p == nullptr) co_return std::tuple{make_error_code(errc::stopped), connection{}};
      co_return std::tuple{std::error_code{}, connection{net, p, 1, transport_->limits_}};
    }
    /// Unregisters the name (later connects are refused); an outstanding accept completes
    /// with `errc::stopped`; connections not accepted yet are closed.
    void close() noexcept {
      if (listener_ == nullptr) return;
      transport_->net_->close_listener(std::exchange(listener_, nullptr), name_);
    }

   private:
    friend class simulated_transport;
    acceptor(simulated_transport& t, std::string name, detail::sim_listener* l)
        : transport_(&t), name_(std::move(name)), listener_(l) {}
    simulated_transport* transport_;
    std::string name_;
    detail::sim_listener* listener_;
  };

  using connection_type = connection;
  using acceptor_type = acceptor;

  /// The endpoint of node `node` (created on first use) on `net`; `limits` validate the
  /// frames it receives.
  simulated_transport(simulated_network& net, std::string_view node, wire_limits limits = {})
      : net_(&net), node_(net.node_id(node)), limits_(limits) {}
  simulated_transport(const simulated_transport&) = delete;
  simulated_transport& operator=(const simulated_transport&) = delete;

  /// The network's executor (every node's coroutines run on the simulation's one thread).
  executor_type get_executor() const { return net_->get_executor(); }
  /// Validation limits for received frames.
  const wire_limits& limits() const noexcept { return limits_; }
  /// This transport's node id (see `simulated_network::node_id`).
  std::uint32_t node() const noexcept { return node_; }
  simulated_network& network() const noexcept { return *net_; }

  /// Registers `name` on this node. Errors: `std::errc::address_in_use` when it is taken.
  result<acceptor> listen(const endpoint_type& name) {
    auto [it, fresh] = net_->listeners_.try_emplace(name);
    if (!fresh) return std::make_error_code(std::errc::address_in_use);
    it->second = std::make_unique<detail::sim_listener>();
    it->second->node = node_;
    return acceptor{*this, name, it->second.get()};
  }

  /// Connects to `name` after a simulated round trip. Errors: `std::errc::connection_refused`
  /// when nobody listens there or a fault separates the nodes, `std::errc::connection_reset`
  /// when a fault began during the setup.
  asio::awaitable<std::tuple<std::error_code, connection>> async_connect(endpoint_type name) {
    auto [ec, p] = co_await asio::async_initiate<decltype(detail::use_tuple),
                                                 void(std::error_code, detail::sim_pipe*)>(
        [this](auto handler, std::string n) {
          net_->start_connect(node_, std::move(n),
                              detail::sim_completion<std::error_code, detail::sim_pipe*>(
                                  std::move(handler), net_->get_executor()));
        },
        detail::use_tuple, std::move(name));
    if (ec || p == nullptr) co_return std::tuple{ec, connection{}};
    co_return std::tuple{std::error_code{}, connection{*net_, p, 0, limits_}};
  }

  /// A buffer from the network's pool.
  buffer allocate(std::size_t bytes) { return net_->pool().allocate(bytes); }

 private:
  simulated_network* net_;
  std::uint32_t node_;
  wire_limits limits_;
};

static_assert(transport<simulated_transport>);

}  // namespace asyncps
