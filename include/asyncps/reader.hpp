// asyncps — async_read_model: read the parameters the server shards hold now, as a *reader*
// (`protocol::reader_id`): a session that takes no part in the clocks, for evaluating or
// monitoring the servers' model while workers train (docs/wire-format.md, "Readers").
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <asio/awaitable.hpp>
#include <asio/experimental/awaitable_operators.hpp>

#include "asyncps/detail/asio_compat.hpp"
#include "asyncps/detail/codec/rendezvous_messages.hpp"
#include "asyncps/detail/text.hpp"
#include "asyncps/detail/transport_time.hpp"
#include "asyncps/error.hpp"
#include "asyncps/log.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/table.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

namespace detail {

// A server's `error` frame `m` (its refusal): sets `what` to "refused: <its reason>" and
// returns its code: an `errc`; `errc::policy_refusal` for a recovery policy's own code (a
// reader runs no policy; the reason names it); `errc::unexpected_message` when the frame is
// malformed or names none.
inline std::error_code refusal(const message& m, std::string& what) {
  protocol::error e;
  std::string why;
  if (protocol::decode(m, e, why)) {
    what = "the server's refusal is malformed" + why;
    return make_error_code(errc::unexpected_message);
  }
  what = "refused: " + peer_text(e.reason);
  if (e.code) return make_error_code(*e.code);
  return make_error_code(e.policy_code != 0 ? errc::policy_refusal : errc::unexpected_message);
}

// Reads shard `shard`'s part of every table of `layout` from the server at `ep` into `out`
// (the whole model, tables in order): hello as a reader, welcome, one ranged pull per table,
// bye. `conn` is the caller's, so that a deadline can close it. `what` is set to what failed.
// `at` is set to the server clock its welcome gave; when that is below `min_clock`, nothing is
// pulled (bye, and success: the caller asks again later).
template <class Transport>
asio::awaitable<std::error_code>
read_shard(Transport& t, typename Transport::endpoint_type ep, std::uint32_t shard,
           std::uint32_t num_shards, std::span<const table_spec> layout, std::span<float> out,
           clock_value min_clock, clock_value& at, typename Transport::connection_type& conn,
           std::string& what) {
  auto [cec, c] = co_await t.async_connect(ep);
  if (cec) {
    what = "connect";
    co_return cec;
  }
  conn = std::move(c);
  protocol::hello h;
  h.worker = protocol::reader_id;
  for (const auto& s : layout) h.layout.push_back({s.rows, s.width});
  if (auto ec = co_await conn.async_send(
          protocol::encode(h, [&t](std::size_t n) { return t.allocate(n); }))) {
    what = "send hello";
    co_return ec;
  }
  auto [wec, wm] = co_await conn.async_receive();
  if (wec) {
    what = "receive welcome";
    co_return wec;
  }
  if (wm.header.type == message_type::error) co_return refusal(wm, what);
  protocol::welcome w;
  if (std::string why; protocol::decode(wm, w, why)) {
    what = "welcome" + why;
    co_return make_error_code(errc::unexpected_message);
  }
  if (w.shard != shard || w.num_shards != num_shards) {
    what = "it serves shard " + std::to_string(w.shard) + " of " + std::to_string(w.num_shards) +
           ", expected shard " + std::to_string(shard) + " of " + std::to_string(num_shards);
    co_return make_error_code(errc::unexpected_message);
  }
  at = w.server_clock;
  if (at < min_clock) {  // not there yet: the caller asks again
    message bye;
    bye.header.type = message_type::bye;
    bye.header.sender = protocol::reader_id;
    (void)co_await conn.async_send(std::move(bye));
    conn.close();
    co_return std::error_code{};
  }
  std::size_t offset = 0;  // of the table in `out`
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const auto& spec = layout[i];
    const key_range r = shard_range(spec.rows, shard, num_shards);
    if (!r.empty()) {
      message pull;
      pull.header.type = message_type::pull;
      pull.header.flags = frame_flags::range;
      pull.header.sender = protocol::reader_id;
      pull.header.table = static_cast<table_id>(i);
      pull.header.first_row = r.begin;
      pull.header.row_count = r.size();
      pull.header.width = spec.width;
      if (auto ec = co_await conn.async_send(std::move(pull))) {
        what = "send pull";
        co_return ec;
      }
      auto [rec, rows] = co_await conn.async_receive();
      if (rec) {
        what = "receive rows";
        co_return rec;
      }
      // e.g. errc::recovering: the shard rebuilds its state after a restart
      if (rows.header.type == message_type::error) co_return refusal(rows, what);
      const std::size_t n = std::size_t{r.size()} * spec.width;
      if (rows.header.type != message_type::rows || rows.header.table != i ||
          !rows.header.has(frame_flags::range) || rows.header.first_row != r.begin ||
          rows.header.row_count != r.size() || rows.payload.size() != n * sizeof(float)) {
        what = "the reply to the pull of table " + std::to_string(i) +
               " is not its rows (message type " +
               std::to_string(static_cast<int>(rows.header.type)) + ", " +
               std::to_string(rows.payload.size()) + " bytes)";
        co_return make_error_code(errc::unexpected_message);
      }
      std::memcpy(out.data() + offset + std::size_t{r.begin} * spec.width, rows.payload.data(),
                  n * sizeof(float));
    }
    offset += spec.size();
  }
  message bye;
  bye.header.type = message_type::bye;
  bye.header.sender = protocol::reader_id;
  (void)co_await conn.async_send(std::move(bye));  // the rows are in; a lost bye is harmless
  conn.close();
  co_return std::error_code{};
}

}  // namespace detail

/// How often `async_read_model` asks a shard again while its server clock is below the
/// `min_clock` it waits for.
inline constexpr std::chrono::milliseconds read_model_poll{50};

/// Reads the parameters the server shards hold now into `out`: the whole model of `layout`
/// (`layout_size(layout)` floats: tables in order, rows in order, as `parameter_view` lays
/// them out). Shard `i` of `servers.size()` is served at `servers[i]`; the shards are read one
/// after another, so the result is each shard's state at the moment it answered (shards may
/// differ by the clocks that passed meanwhile). Each server sees a *reader*
/// (`protocol::reader_id`): it is not a worker, holds no clock, and never delays training; it
/// gets the same shared secret / TLS checks as any peer through `t`. In a chain, a backup
/// answers with its own (possibly lagging) copy: list the heads.
///
/// `timeout` (> 0) bounds the whole read; no connect is retried. Completes with success, or:
/// `errc::invalid_argument` (no servers, `out` of the wrong size, `timeout` <= 0; nothing is
/// sent); a connect or connection error; `errc::timeout`; the code of a server's refusal
/// (e.g. `layout_mismatch`); `errc::unexpected_message` when a reply is malformed or a server
/// serves another shard than its position says. On failure `out` is partly written. Each
/// failure is logged on `log` (empty: stderr) naming the server and what failed.
///
/// A shard that refuses a pull with `errc::recovering` (it rebuilds its state after a
/// restart: recovery::stateless, recovery::replica_log) is asked again, as below, until the
/// deadline. `min_clock` > 0 waits for a point in training: each shard is read only once its server
/// clock (the minimum over its workers' clocks) has reached `min_clock`, so the rows hold every
/// worker's updates of clocks `< min_clock` to that shard. A shard that answers with an earlier
/// clock is asked again, in a new reader session every `read_model_poll` (each counted in
/// `server_stats::readers`), until the deadline: then `errc::timeout`, logged with the clock
/// the shard had reached. E.g. once every worker has run `min_clock` clocks and stopped
/// pushing, the result is the final model.
///
/// Thread safety: runs on `t`'s executor; `t`, `servers`, `layout` and `out` outlive the
/// operation. Cost: one connection and one pull per table per shard (plus one connection per
/// poll while a shard is below `min_clock`); the rows are copied once, into `out`.
template <transport Transport>
asio::awaitable<std::error_code>
async_read_model(Transport& t, std::span<const typename Transport::endpoint_type> servers,
                 std::span<const table_spec> layout, std::span<float> out,
                 std::chrono::milliseconds timeout, const log_function& log = {},
                 clock_value min_clock = 0) {
  using namespace asio::experimental::awaitable_operators;
  if (servers.empty() || out.size() != layout_size(layout) || timeout.count() <= 0 ||
      servers.size() >= protocol::no_worker_id) {
    detail::emit(log, "asyncps: read model: invalid argument (" + std::to_string(servers.size()) +
                          " servers, " + std::to_string(out.size()) + " floats for a layout of " +
                          std::to_string(layout_size(layout)) + ", timeout " +
                          std::to_string(timeout.count()) + " ms)");
    co_return make_error_code(errc::invalid_argument);
  }
  using clock_type = detail::transport_clock_t<Transport>;
  const auto n = static_cast<std::uint32_t>(servers.size());
  const auto deadline = clock_type::now() + timeout;
  detail::transport_timer_t<Transport> timer(t.get_executor());
  timer.expires_at(deadline);
  detail::transport_timer_t<Transport> poll(t.get_executor());  // min_clock: between tries
  for (std::uint32_t i = 0; i < n; ++i) {
    for (;;) {
      typename Transport::connection_type conn;
      std::string what;
      clock_value at = 0;
      auto r = co_await (
          detail::read_shard(t, servers[i], i, n, layout, out, min_clock, at, conn, what) ||
          detail::close_at_deadline(timer, conn));
      conn.close();
      std::error_code ec = r.index() == 1 ? make_error_code(errc::timeout) : std::get<0>(r);
      const bool rebuilding = ec == errc::recovering;  // transient: ask again, as below
      if (ec && !rebuilding) {
        detail::emit(log, "asyncps: read model: server " + std::to_string(i) + " at " +
                              detail::endpoint_string(servers[i]) + ": " +
                              (r.index() == 1
                                   ? "no answer within " + std::to_string(timeout.count()) + " ms"
                                   : what + ": " + ec.message()));
        co_return ec;
      }
      if (!rebuilding && at >= min_clock) break;
      // Below min_clock, or rebuilding: ask again after a poll interval, within the deadline.
      const auto now = clock_type::now();
      if (now < deadline) {
        poll.expires_at(std::min(deadline, now + read_model_poll));
        co_await poll.async_wait(detail::use_tuple);
      }
      if (clock_type::now() >= deadline) {
        detail::emit(log, "asyncps: read model: server " + std::to_string(i) + " at " +
                              detail::endpoint_string(servers[i]) + ": " +
                              (rebuilding
                                   ? std::string("still rebuilding its state after a "
                                                 "restart (errc::recovering)")
                                   : "its server clock " + std::to_string(at) +
                                         " did not reach min_clock " + std::to_string(min_clock)) +
                              " within " + std::to_string(timeout.count()) + " ms");
        co_return make_error_code(errc::timeout);
      }
    }
  }
  co_return std::error_code{};
}

}  // namespace asyncps
