// asyncps — worker_shell's coroutines: the clock loop (`async_run`), connecting and the
// handshake, each link's read loop, the recovery part's replies, reconnects, rejoins and the
// shutdown.
//
// Out-of-line definitions of members declared in detail/worker/shell.hpp: defined outside the
// class, they are not inline, so an `extern template` declaration of a shell (asyncps/worker.hpp
// under separate compilation) keeps them out of the translation units that use it. Not a header
// to include on its own: shell.hpp includes it at its end.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/use_awaitable.hpp>

#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/worker/shell_support.hpp"
#include "asyncps/error.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/transport.hpp"

namespace asyncps::detail {

template <checked_model Model, transport Transport, consistency_policy Consistency,
          recovery_policy Recovery>
asio::awaitable<std::error_code>
worker_shell<Model, Transport, Consistency, Recovery>::async_run(std::uint64_t clocks) {
  std::error_code ec;
  try {
    ec = co_await connect_all();
  } catch (...) {  // the first resume ends the run
    rethrow_unless_no_memory();
    core_.out_of_memory("connecting to the servers");
  }
  core_.start(clocks, ec);
  // The whole clock loop runs in this one coroutine frame, executing the core's steps: a
  // coroutine call per clock would allocate a frame per clock (too large for Asio's frame
  // recycling).
  for (;;) {
    if (stop_requested_) {  // stop(): no further step; shutdown() says bye
      ec = make_error_code(errc::stopped);
      break;
    }
    const char* doing = "building the next message";
    try {
      auto a = core_.resume(clock_type::now());
      if (a.kind == step::done) {
        ec = a.ec;
        break;
      }
      switch (a.kind) {
        case step::join:
          doing = "rejoining a server";
          co_await join_links();
          break;
        case step::send: {
          doing = "sending a message";
          if constexpr (replies) {
            // A read loop may be sending the recovery part's replies on this link.
            if (sending_[a.shard]) {
              send_queue_[a.shard].push_back(std::move(a.msg));
              break;
            }
          }
          send_turn turn(sending_, a.shard);
          if (auto err = co_await conns_[a.shard].async_send(std::move(a.msg))) {
            if constexpr (replies) send_queue_[a.shard].clear();
            fail(a.shard, err, "");
          }
          if constexpr (replies) {
            if (auto err = co_await drain(a.shard)) fail(a.shard, err, "");
          }
          break;
        }
        case step::reconnect:
          doing = "starting a reconnect";
          spawn(reconnect(a.shard));
          break;
        case step::wait:
          doing = "waiting";
          if (auto wait = silence_check(a.wait)) {
            wake_.expires_after(*wait);
            co_await wake_.async_wait(use_tuple);
          }
          break;
        case step::compute: {
          doing = "computing a gradient";
          buffer grad = transport_.allocate(core_.cache().size() * sizeof(float));
          const auto tables = core_.cache().tables();
          const parameter_view params = core_.parameters();
          gradient_view gview(tables, reinterpret_cast<float*>(grad.data()));
          if (opts_.check_gradients) fill_bits(grad, unwritten_gradient_bits);
          float loss = 0;
          if constexpr (async_gradient_source<Model>) {
            loss = co_await model_.async_compute_gradient(params, gview);
          } else if (compute_) {
            loss = co_await asio::co_spawn(
                *compute_,
                [&]() -> asio::awaitable<float> {
                  co_return model_.compute_gradient(params, gview);
                },
                asio::use_awaitable);
          } else {
            loss = model_.compute_gradient(params, gview);
          }
          core_.computed(std::move(grad), loss, clock_type::now());
          break;
        }
        case step::done: break;  // (above)
      }
    } catch (...) {  // the next resume ends the run
      rethrow_unless_no_memory();
      core_.out_of_memory(doing);
    }
  }
  co_await shutdown();
  // One that came after the last step (a read loop's, during the shutdown) ends it too.
  if (!ec && core_.stats().out_of_memory > 0) ec = make_error_code(errc::resource_exhausted);
  co_return ec;
}

template <checked_model Model, transport Transport, consistency_policy Consistency,
          recovery_policy Recovery>
asio::awaitable<std::error_code>
worker_shell<Model, Transport, Consistency, Recovery>::connect_all() {
  for (auto& l : core_.links()) {
    const auto deadline = clock_type::now() + opts_.connect_timeout;
    std::chrono::milliseconds backoff{20};
    bool logged = false;
    for (;;) {
      if (stop_requested_) co_return make_error_code(errc::stopped);
      auto [ec, conn] = co_await transport_.async_connect(core_.endpoint_of(l));
      bool routine = false;  // a refusal the recovery policy answers `next_server`
      if (!ec) {
        conns_[l.shard] = std::move(conn);
        ec = co_await handshake(l.shard);
        if (!ec) break;
        // A routine refusal: the shard's next server (e.g. a chain's head); worker_id_in_use:
        // a live connection holds this id (e.g. this worker's previous process, not yet seen
        // to be gone): retry.
        routine = l.refusal == refusal_action::next_server;
        if (!routine && ec != errc::worker_id_in_use) co_return ec;
      } else if (is_final_connect_error(ec)) {  // e.g. a wrong secret: no retry helps
        core_.log("cannot connect to " + core_.server_name(l) + ": " + ec.message());
        co_return ec;
      }
      const auto now = clock_type::now();
      if (now >= deadline) {
        core_.log("cannot connect to " + core_.server_name(l) + ": " + ec.message());
        co_return ec;
      }
      if (!logged && !routine) {  // say so now, not after connect_timeout
        logged = true;
        core_.log("cannot connect to " + core_.server_name(l) + " (" + ec.message() +
                  "); retrying for " + duration_text(opts_.connect_timeout));
      }
      core_.next_endpoint(l);
      if (l.endpoint != 0) continue;  // try the shard's other servers before backing off
      // Checked again here: a stop() that came during the connect above found no wait to cancel.
      if (stop_requested_) co_return make_error_code(errc::stopped);
      // The last wait is cut to the deadline, so the worker tries until the timeout ends.
      wake_.expires_after(std::min<typename clock_type::duration>(backoff, deadline - now));
      co_await wake_.async_wait(use_tuple);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
    l.up = true;
  }
  for (auto& l : core_.links()) start_reading(l.shard);
  co_return std::error_code{};
}

template <checked_model Model, transport Transport, consistency_policy Consistency,
          recovery_policy Recovery>
asio::awaitable<std::error_code>
worker_shell<Model, Transport, Consistency, Recovery>::handshake(std::uint32_t s) {
  if (auto ec = co_await conns_[s].async_send(core_.hello(s))) co_return ec;
  auto [ec, m] = co_await conns_[s].async_receive();
  if (ec) co_return ec;
  heard_[s] = clock_type::now();
  if (auto err = core_.on_handshake_reply(s, m)) {
    conns_[s].close();
    co_return err;
  }
  co_return std::error_code{};
}

template <checked_model Model, transport Transport, consistency_policy Consistency,
          recovery_policy Recovery>
asio::awaitable<void>
worker_shell<Model, Transport, Consistency, Recovery>::read_loop(std::uint32_t s) {
  while (core_.link_of(s).up) {
    try {
      auto [ec, m] = co_await conns_[s].async_receive();
      if (ec) {
        fail(s, ec, "");
        break;
      }
      core_.stats().bytes_in += m.payload.size();
      heard_[s] = clock_type::now();
      const auto out = core_.on_message(s, m);
      if (out.error) {
        fail(s, out.error, "");
        break;
      }
      if constexpr (replies) {
        if (auto err = co_await send_replies(s)) {
          fail(s, err, "");
          break;
        }
      }
      if (out.closed) conns_[s].close();
      if (out.wake) wake_.cancel();
    } catch (...) {
      rethrow_unless_no_memory();
      core_.out_of_memory("receiving from", s);
      fail(s, make_error_code(errc::resource_exhausted), "out of memory");
      break;
    }
  }
  core_.link_of(s).reading = false;
  wake_.cancel();
  tasks_.done();
}

template <checked_model Model, transport Transport, consistency_policy Consistency,
          recovery_policy Recovery>
asio::awaitable<std::error_code>
worker_shell<Model, Transport, Consistency, Recovery>::send_replies(std::uint32_t s) {
  auto& r = core_.replies(s);
  if (r.empty()) co_return std::error_code{};
  for (auto& m : r) send_queue_[s].push_back(std::move(m));
  r.clear();
  if (sending_[s]) co_return std::error_code{};
  send_turn turn(sending_, s);
  co_return co_await drain(s);
}

template <checked_model Model, transport Transport, consistency_policy Consistency,
          recovery_policy Recovery>
asio::awaitable<std::error_code>
worker_shell<Model, Transport, Consistency, Recovery>::drain(std::uint32_t s) {
  auto& q = send_queue_[s];
  std::error_code ec;
  while (!ec && !q.empty()) {
    message m = std::move(q.front());
    q.pop_front();
    ec = co_await conns_[s].async_send(std::move(m));
  }
  if (ec) q.clear();
  co_return ec;
}

template <checked_model Model, transport Transport, consistency_policy Consistency,
          recovery_policy Recovery>
asio::awaitable<void>
worker_shell<Model, Transport, Consistency, Recovery>::reconnect(std::uint32_t s) {
  auto& l = core_.link_of(s);
  try {
    co_await reconnect_attempts(s);
  } catch (...) {
    rethrow_unless_no_memory();
    core_.out_of_memory("reconnecting to", s);
    conns_[s].close();
    l.gave_up = true;
    l.refused = true;
    l.failure = make_error_code(errc::resource_exhausted);
  }
  l.reconnecting = false;
  wake_.cancel();
  tasks_.done();
}

template <checked_model Model, transport Transport, consistency_policy Consistency,
          recovery_policy Recovery>
asio::awaitable<void>
worker_shell<Model, Transport, Consistency, Recovery>::reconnect_attempts(std::uint32_t s) {
  auto& l = core_.link_of(s);
  timer_type timer(transport_.get_executor());
  const slot_registration<timer_type> registered(backoff_waits_, s, timer);  // for stop()
  const auto timeout = std::chrono::milliseconds(core_.recovery().reconnect_timeout());
  const auto deadline = clock_type::now() + timeout;
  std::chrono::milliseconds backoff{20};
  while (!stopping_ && !stop_requested_) {
    if (!l.reading) {  // the old read loop is done with the old connection
      auto [ec, conn] = co_await transport_.async_connect(core_.endpoint_of(l));
      if (ec && is_final_connect_error(ec)) {  // e.g. a wrong secret: no retry helps
        core_.log("cannot reconnect to server " + std::to_string(s) + ": " + ec.message() +
                  "; giving up");
        l.gave_up = true;
        l.refused = true;
        l.failure = ec;
        break;
      }
      if (!ec && !stopping_) {
        conns_[s] = std::move(conn);
        ec = co_await handshake(s);
        if (!ec && !stopping_) {
          l.joining = true;
          break;
        }
        conns_[s].close();
        if (ec == errc::layout_mismatch || ec == errc::server_lost ||
            l.refusal == refusal_action::lost || ec == condition::protocol_violation) {
          l.gave_up = true;  // a different server answers there: retrying will not help
          l.refused = ec != errc::server_lost;
          l.failure = ec;
          break;
        }
      }
      core_.next_endpoint(l);         // the next server may serve the shard (replicas)
      if (l.endpoint != 0) continue;  // back off only after trying every server once
    }
    const auto now = clock_type::now();
    if (now >= deadline) {
      core_.log("server " + std::to_string(s) + " still unreachable after " +
                std::to_string(timeout.count()) + " ms; giving up");
      l.gave_up = true;
      l.refused = false;  // lost, whatever refusal started the outage
      break;
    }
    // The last wait is cut to the deadline, so the worker tries until the timeout ends.
    timer.expires_after(std::min<typename clock_type::duration>(backoff, deadline - now));
    co_await timer.async_wait(use_tuple);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

template <checked_model Model, transport Transport, consistency_policy Consistency,
          recovery_policy Recovery>
asio::awaitable<void> worker_shell<Model, Transport, Consistency, Recovery>::join_links() {
  for (auto& l : core_.links()) {
    if (!l.joining) continue;
    l.joining = false;
    core_.queue_rejoin(l.shard, rejoin_out_);
    std::error_code ec;
    for (auto& q : rejoin_out_) {
      core_.stats().bytes_out += q.counted_bytes;
      const frame_header h = q.msg.header;
      if ((ec = co_await conns_[l.shard].async_send(std::move(q.msg)))) break;
      core_.rejoin_sent(l.shard, h);
    }
    rejoin_out_.clear();
    if (ec) {
      l.failure = ec;
      conns_[l.shard].close();
      continue;  // still down: the clock loop's check starts over
    }
    core_.rejoined(l.shard);
    start_reading(l.shard);
  }
}

template <checked_model Model, transport Transport, consistency_policy Consistency,
          recovery_policy Recovery>
asio::awaitable<void> worker_shell<Model, Transport, Consistency, Recovery>::shutdown() {
  stopping_ = true;
  for (auto& l : core_.links()) {
    if (!l.up) continue;
    try {
      message bye;
      bye.header.type = message_type::bye;
      bye.header.sender = opts_.id;
      if constexpr (replies) {
        // A read loop may be sending replies: the bye goes after them.
        send_queue_[l.shard].push_back(std::move(bye));
        if (sending_[l.shard]) continue;
        send_turn turn(sending_, l.shard);
        (void)co_await drain(l.shard);
      } else {
        (void)co_await conns_[l.shard].async_send(std::move(bye));
      }
    } catch (...) {
      rethrow_unless_no_memory();  // (the close below goes on)
    }
  }
  // Graceful close: a server answers `bye` by closing once it has sent what it queued.
  // Closing first could reset a TCP connection that still has rows arriving (ESSP, VAP), and
  // a reset may drop this worker's last pushes before the server has read them. (A bounded
  // poll rather than tasks_: this wait ends after 2 s whatever is still open.)
  try {
    const auto deadline = clock_type::now() + std::chrono::seconds(2);
    while (clock_type::now() < deadline &&
           std::any_of(core_.links().begin(), core_.links().end(),
                       [](const auto& l) { return l.up && l.reading; })) {
      wake_.expires_after(std::chrono::milliseconds(10));
      co_await wake_.async_wait(use_tuple);
    }
  } catch (...) {
    rethrow_unless_no_memory();  // (the close below goes on)
  }
  for (auto& l : core_.links()) {
    l.up = false;
    conns_[l.shard].close();
  }
  // Every read loop and reconnect has ended (they must, before the worker may go: a wait
  // that cannot be allocated is tried again).
  while (tasks_.count() > 0) {
    try {
      co_await tasks_.async_wait();
    } catch (...) {
      rethrow_unless_no_memory();
    }
  }
  rejoin_out_.clear();
  core_.clear_local();
}

}  // namespace asyncps::detail
