// asyncps — detail::pipe_end: what the in-process and the simulated transports' connections
// share (internal).
//
// In both, a connection is one side of a pipe: two message queues between two connection
// objects of one process, dir[0] carrying side 0's (the connector's) messages to side 1 (the
// acceptor's) and dir[1] the other way, freed by its network once both sides let go. What the
// queues are differs, and so do sending, receiving and closing: Asio concurrent channels
// between threads (in_process.hpp) or virtual-time flights with scheduled deliveries
// (transport/sim/pipe.hpp, transport/sim/connections.ipp). The handle below is the common part.
#pragma once

#include <utility>

namespace asyncps::detail {

/// One side of a pipe owned by a network: the network, the pipe, the side (0: the connector's,
/// 1: the acceptor's) and whether the owner still has this side open.
///
/// `Network` must have `release(Pipe&)`, which gives back one of the pipe's two references
/// (the network frees the pipe after the second). The handle holds one reference: it releases
/// it when destroyed or assigned over. It never closes anything: the connection that holds it
/// closes its side (by its transport's rules) first, and then lets the handle go.
///
/// Move-only; a moved-from or default-constructed handle is empty (`pipe() == nullptr`, not
/// open). Thread safety: that of the connection that holds it.
template <class Network, class Pipe>
class pipe_end {
 public:
  /// An empty handle (a closed connection).
  pipe_end() noexcept = default;
  /// Side `side` (0 or 1) of `pipe`, open, holding one of its references.
  pipe_end(Network& net, Pipe& pipe, int side) noexcept
      : net_(&net), pipe_(&pipe), side_(side), open_(true) {}
  /// Takes over `o`'s reference (`o` is left empty).
  pipe_end(pipe_end&& o) noexcept
      : net_(std::exchange(o.net_, nullptr)), pipe_(std::exchange(o.pipe_, nullptr)),
        side_(o.side_), open_(std::exchange(o.open_, false)) {}
  /// Releases this handle's reference, then takes over `o`'s. Close this side first.
  pipe_end& operator=(pipe_end&& o) noexcept {
    if (this != &o) {
      release();
      net_ = std::exchange(o.net_, nullptr);
      pipe_ = std::exchange(o.pipe_, nullptr);
      side_ = o.side_;
      open_ = std::exchange(o.open_, false);
    }
    return *this;
  }
  pipe_end(const pipe_end&) = delete;
  pipe_end& operator=(const pipe_end&) = delete;
  /// Releases the reference (the owner closed its side before).
  ~pipe_end() { release(); }

  /// The network. Precondition: not empty.
  Network& network() const noexcept { return *net_; }
  /// The pipe; nullptr when empty.
  Pipe* pipe() const noexcept { return pipe_; }
  /// This side: the index of the direction it sends on.
  int side() const noexcept { return side_; }
  /// The other side: the index of the direction it receives on.
  int peer() const noexcept { return 1 - side_; }
  /// Whether the owner still has this side open (false once `mark_closed` was called).
  bool open() const noexcept { return open_; }
  /// Marks this side closed; returns whether it was open (the caller then does the closing).
  bool mark_closed() noexcept { return std::exchange(open_, false); }

 private:
  void release() noexcept {
    if (pipe_ != nullptr) net_->release(*pipe_);
    pipe_ = nullptr;
    open_ = false;
  }

  Network* net_ = nullptr;
  Pipe* pipe_ = nullptr;
  int side_ = 0;
  bool open_ = false;
};

}  // namespace asyncps::detail
