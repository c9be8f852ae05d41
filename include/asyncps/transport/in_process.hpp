// asyncps — in-process transport: connections are pairs of bounded channels that move
// `message`s (and so their pooled buffers) between coroutines of one process. No bytes are
// copied and no checksum is computed (nothing can corrupt a moved buffer); headers are still
// validated against the limits so behaviour matches the TCP transport.
#pragma once

#include <atomic>
#include <cstddef>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/experimental/concurrent_channel.hpp>
#include <asio/io_context.hpp>

#include "asyncps/buffer.hpp"
#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/pipe_connection.hpp"
#include "asyncps/error.hpp"
#include "asyncps/options.hpp"
#include "asyncps/result.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

/// The shared "network" of in-process transports: a registry of listening names, the pipes
/// between connected pairs, and the buffer pool every in-process message uses.
///
/// Object lifetimes: the network outlives every `in_process_transport`, connection, acceptor
/// and buffer made from it. It owns every channel of every pipe and listener, and creates them
/// on a private `asio::io_context` of its own that is never run (it only anchors the channels'
/// service, so it lives exactly as long as they do). A connection or acceptor therefore does
/// not depend on the `io_context` of the transport that made it: a worker's context may be
/// destroyed while a server still holds, reads, writes or closes that worker's connection.
/// Completions never run on the private context: Asio's channel operations post their
/// completion to the awaiting coroutine's executor. Hence the one rule left: do not destroy an
/// `io_context` while one of its coroutines still waits in an in-process operation; close (or
/// destroy) the connections and acceptors it awaits first (their operations then complete
/// with an error, queued on that context), or let the coroutines finish.
///
/// Thread safety: all members may be used concurrently from any threads.
class in_process_network {
 public:
  /// `channel_capacity`: messages buffered per direction before a send waits (backpressure).
  explicit in_process_network(std::size_t channel_capacity = 64,
                              std::size_t pool_cache_bytes = std::size_t{1} << 30)
      : capacity_(channel_capacity), pool_(pool_cache_bytes) {}
  /// Preconditions: every connection and acceptor made from this network was destroyed.
  in_process_network(const in_process_network&) = delete;
  in_process_network& operator=(const in_process_network&) = delete;

  buffer_pool& pool() noexcept { return pool_; }

 private:
  friend class in_process_transport;
  template <class, class>
  friend class detail::pipe_end;  // calls `release`
  using channel = asio::experimental::concurrent_channel<void(std::error_code, message)>;
  using accept_channel = asio::experimental::concurrent_channel<void(std::error_code, void*)>;

  // Both ends of a connection; created on `channel_context_`, owned by `pipes_`.
  //
  // Closing a direction: Asio 1.22's `channel::close()` completes the receives waiting on it
  // but not a send waiting for room (a full channel): that send would wait forever, and so
  // would whatever waits for its coroutine (a server's write loop, then `async_serve`). So a
  // direction is only ever closed by `shut`, which first cancels what waits on it (cancel
  // must come first: on a closed channel Asio takes waiting sends for receives). `async_send`
  // starts a send under the same per-direction mutex, so no send can start to wait between
  // the cancel and the close (the peer's sends run on the peer's threads).
  struct pipe {
    pipe(const asio::any_io_executor& ex, std::size_t cap)
        : dir{channel(ex, cap), channel(ex, cap)} {}

    // Sends `m` on direction `d`; completes with `void(std::error_code)` (an error once the
    // direction is shut, and for a send waiting when it is shut). Locks `shut_mutex[d]` only
    // while the send starts (Asio posts every channel completion: none runs inside).
    template <class Token>
    auto async_send(int d, message m, Token&& token) {
      return asio::async_initiate<Token, void(std::error_code)>(
          [this, d](auto handler, message msg) {
            std::lock_guard lock(shut_mutex[d]);
            dir[d].async_send(std::error_code{}, std::move(msg), std::move(handler));
          },
          token, std::move(m));
    }
    // Closes direction `d` for good: waiting sends and receives complete with an error, later
    // ones at once; what it buffered is dropped. Any thread; idempotent.
    void shut(int d) noexcept {
      std::lock_guard lock(shut_mutex[d]);
      dir[d].cancel();
      dir[d].close();
    }

    channel dir[2];            // dir[0]: connector -> acceptor, dir[1]: acceptor -> connector
    std::mutex shut_mutex[2];  // per direction: starting a send vs `shut`
    std::atomic<int> alive{2};
    std::list<pipe>::iterator self;
  };
  // A listening name's queue of connections; created on `channel_context_`, owned by the
  // acceptor.
  struct listener {
    listener(const asio::any_io_executor& ex, std::size_t cap) : pending(ex, cap) {}
    accept_channel pending;
  };

  pipe* make_pipe() {
    std::lock_guard lock(mutex_);
    auto it = pipes_.emplace(pipes_.end(), channel_context_.get_executor(), capacity_);
    it->self = it;
    return &*it;
  }
  // Gives back one of `p`'s two references (see `detail::pipe_end`); frees it after both.
  void release(pipe& p) noexcept {
    if (p.alive.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lock(mutex_);
      pipes_.erase(p.self);
    }
  }

  std::unique_ptr<listener> make_listener() {
    return std::make_unique<listener>(channel_context_.get_executor(), capacity_);
  }

  // The channels' I/O context, never run: declared before `pipes_` (and, by the network's
  // precondition, outliving every acceptor's listener) so that its channel service outlives
  // every channel. The guard keeps its outstanding-work count above zero, so that the work
  // each channel operation counts while it waits never "stops" the context (a mutex lock).
  asio::io_context channel_context_;
  asio::executor_work_guard<asio::io_context::executor_type> channel_context_work_{
      channel_context_.get_executor()};
  std::size_t capacity_;
  buffer_pool pool_;
  std::mutex mutex_;
  std::list<pipe> pipes_;
  std::map<std::string, listener*, std::less<>> listeners_;
};

/// One node's endpoint on an `in_process_network`. Models `asyncps::transport`; endpoints
/// are names (`std::string`).
///
/// Object lifetimes: the network outlives the transport; the transport outlives its acceptors
/// (not its connections). Connections and acceptors do not use the transport's executor (their
/// channels live on the network), so they may outlive the transport's `io_context`; only the
/// coroutines awaiting them need a running executor. Thread safety: `listen`,
/// `async_connect` and `allocate` may be called from any thread.
class in_process_transport {
 public:
  using executor_type = asio::any_io_executor;
  using endpoint_type = std::string;

  /// One end of an in-process pipe. Models `asyncps::connection`.
  ///
  /// Object lifetimes: needs only its `in_process_network` alive (not the transport, nor any
  /// `io_context`); the pipe is freed when both ends are destroyed. Completions run on the
  /// awaiting coroutine's executor. Thread safety: one send and one receive may be
  /// outstanding at once; `close()` on the owner's executor.
  class connection {
   public:
    connection() = default;
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

    /// Moves `m` into the peer's queue (waits while it is full). Errors:
    /// `errc::connection_closed` when either side closed.
    asio::awaitable<std::error_code> async_send(message m) {
      std::error_code out = make_error_code(errc::connection_closed);
      if (end_.open()) {
        m.header.payload_bytes = m.payload.size();
        auto [ec] = co_await end_.pipe()->async_send(end_.side(), std::move(m), detail::use_tuple);
        if (ec) {
          close();
        } else {
          out = {};
        }
      }
      co_return out;
    }

    /// The next message. Errors: `errc::connection_closed`, or a `validate_header` error.
    asio::awaitable<std::tuple<std::error_code, message>> async_receive() {
      std::tuple<std::error_code, message> out{make_error_code(errc::connection_closed), message{}};
      if (end_.open()) {
        auto [ec, m] = co_await end_.pipe()->dir[end_.peer()].async_receive(detail::use_tuple);
        if (ec) {
          close();
        } else if (auto v = validate_header(m.header, limits_)) {
          std::get<0>(out) = v;  // the owner decides to close (as with TCP)
        } else {
          out = {std::error_code{}, std::move(m)};
        }
      }
      co_return out;
    }

    /// Closes both directions: the peer receives `connection_closed` after the messages
    /// already queued to it (all of them dropped instead when its queue is full); outstanding
    /// operations complete with `connection_closed`, this side's and the peer's sends that
    /// wait for room included.
    void close() noexcept {
      if (!end_.mark_closed()) return;
      // Tell the peer (after what is already queued), then stop listening.
      auto& p = *end_.pipe();
      if (!p.dir[end_.side()].try_send(make_error_code(errc::connection_closed), message{}))
        p.shut(end_.side());  // full (our send may wait there) or shut by the peer
      p.shut(end_.peer());    // the peer's send may wait there
    }
    bool is_open() const noexcept { return end_.open(); }

   private:
    friend class in_process_transport;
    connection(in_process_network& n, in_process_network::pipe& p, int side, wire_limits lim)
        : end_(n, p, side), limits_(lim) {}
    detail::pipe_end<in_process_network, in_process_network::pipe> end_;
    wire_limits limits_{};
  };

  /// A listening name. Models `asyncps::acceptor<connection>`.
  ///
  /// Object lifetimes: its transport and network outlive it (it may outlive the transport's
  /// `io_context`). Connections it accepted are independent of it.
  class acceptor {
   public:
    acceptor(acceptor&& o) noexcept = default;
    acceptor& operator=(acceptor&& o) noexcept = default;
    ~acceptor() { close(); }

    asio::awaitable<std::tuple<std::error_code, connection>> async_accept() {
      if (!listener_) co_return std::tuple{make_error_code(errc::stopped), connection{}};
      auto [ec, p] = co_await listener_->pending.async_receive(detail::use_tuple);
      if (ec) co_return std::tuple{make_error_code(errc::stopped), connection{}};
      co_return std::tuple{std::error_code{},
                           connection{*transport_->net_, *static_cast<in_process_network::pipe*>(p),
                                      1, transport_->limits_}};
    }
    /// Unregisters the name; later connects fail with `connection_refused`. Connections that
    /// were queued but never accepted are closed: their connectors' operations fail with
    /// `connection_closed`. An outstanding `async_accept` completes with `errc::stopped`.
    void close() noexcept {
      if (!listener_) return;
      {
        std::lock_guard lock(transport_->net_->mutex_);
        transport_->net_->listeners_.erase(name_);
      }
      // No connect can queue any more (the name is gone). Drain before closing: a closed Asio
      // channel drops what it buffered, and those pipes would stay open with nobody reading.
      while (listener_->pending.try_receive([this](std::error_code, void* p) {
        auto* pp = static_cast<in_process_network::pipe*>(p);
        pp->shut(0);  // the connector may already wait to send
        pp->shut(1);
        transport_->net_->release(*pp);
      })) {}
      listener_->pending.close();
      listener_.reset();
    }

   private:
    friend class in_process_transport;
    acceptor(in_process_transport& t, std::string name,
             std::unique_ptr<in_process_network::listener> l)
        : transport_(&t), name_(std::move(name)), listener_(std::move(l)) {}
    in_process_transport* transport_;
    std::string name_;
    std::unique_ptr<in_process_network::listener> listener_;
  };

  using connection_type = connection;
  using acceptor_type = acceptor;

  in_process_transport(executor_type ex, in_process_network& net, wire_limits limits = {})
      : executor_(std::move(ex)), net_(&net), limits_(limits) {}
  in_process_transport(const in_process_transport&) = delete;
  in_process_transport& operator=(const in_process_transport&) = delete;

  executor_type get_executor() const noexcept { return executor_; }
  const wire_limits& limits() const noexcept { return limits_; }

  /// Registers `name`. Errors: `std::errc::address_in_use` when it is taken.
  result<acceptor> listen(const endpoint_type& name) {
    auto l = net_->make_listener();
    std::lock_guard lock(net_->mutex_);
    if (!net_->listeners_.emplace(name, l.get()).second)
      return std::make_error_code(std::errc::address_in_use);
    return acceptor{*this, name, std::move(l)};
  }

  /// Connects to `name`. Errors: `std::errc::connection_refused` when nobody listens.
  asio::awaitable<std::tuple<std::error_code, connection>> async_connect(endpoint_type name) {
    in_process_network::pipe* p = net_->make_pipe();
    std::error_code ec = std::make_error_code(std::errc::connection_refused);
    {
      std::lock_guard lock(net_->mutex_);
      auto it = net_->listeners_.find(name);
      if (it != net_->listeners_.end() &&
          it->second->pending.try_send(std::error_code{}, static_cast<void*>(p)))
        ec = {};
    }
    if (ec) {
      net_->release(*p);
      net_->release(*p);
      co_return std::tuple{ec, connection{}};
    }
    co_return std::tuple{std::error_code{}, connection{*net_, *p, 0, limits_}};
  }

  /// A buffer from the network's pool. Thread safety: any thread.
  buffer allocate(std::size_t bytes) { return net_->pool().allocate(bytes); }

 private:
  executor_type executor_;
  in_process_network* net_;
  wire_limits limits_;
};

static_assert(transport<in_process_transport>);

}  // namespace asyncps
