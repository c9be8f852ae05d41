// asyncps — the vocabulary of a recovery policy's worker part: the types its hooks take and
// return (`worker_setup`, `refusal_action`, `welcome_part`, `welcome_action`, `away_slice`,
// `rejoin_context`, ...) and `check_worker_part<Part>()`, which stops the build when a part
// declares a hook with a signature the worker does not call.
//
// `basic_worker` never asks which recovery policy it has: every policy-specific step is a hook
// of `Recovery::worker_part`, detected with `requires`, and a part that lacks a hook gets its
// default (asyncps/detail/worker/hooks.hpp holds the detection and the defaults). The hooks are
// sans-io: they touch no socket, timer or executor; what a part wants sent it queues
// (`rejoin_context`), and the worker sends it. docs/concepts/recovery.md ("Worker hooks") lists
// them with the order the worker calls them in.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <system_error>
#include <utility>
#include <vector>

#include "asyncps/buffer.hpp"
#include "asyncps/error.hpp"
#include "asyncps/layout.hpp"
#include "asyncps/protocol.hpp"
#include "asyncps/wire.hpp"

namespace asyncps {

/// What a worker part learns once, when the worker is built (hook `on_start`).
struct worker_setup {
  std::uint32_t shards = 0;  ///< links, one per shard (index = shard id)
  std::uint32_t tables = 0;  ///< tables of the model (parts per link)
  /// The worker itself waits for the acks of its clocks: VAP (an update in transit until
  /// acknowledged) or a push window (ASP by default, `worker_options::push_window`).
  bool waits_for_acks = false;
};

/// What the worker does about a server's refusal: an error frame answering its hello, or one
/// that closes a link mid-run (hook `on_refused`, given the refusal's code).
enum class refusal_action {
  fail,         ///< the link fails with the refusal's code, logged (the default)
  next_server,  ///< routine, not logged: try the shard's next server (`worker_options::replicas`,
                ///< e.g. a chain member that is not the head); mid-run: a plain loss of the link
  lost,         ///< the shard's state is gone for good: every push of this worker to it counts
                ///< as lost (`worker_stats::lost_pushes`), and the link gives up with the code
};

/// One of this worker's pushes of a part that the cached rows do not reflect yet (kept for
/// read-my-writes): its 1-based index among the part's pushes, and the part's dense slice of
/// the gradient (`rows x width` floats, shared with the push, never copied).
struct unapplied_push {
  std::uint64_t index = 0;
  buffer grad;
};

/// One part (a table's rows on one shard) as a server's `welcome` describes it (hook
/// `on_welcome`, called for every part of the link, in table order).
struct welcome_part {
  std::uint32_t shard = 0;
  table_id table = 0;
  std::uint64_t applied = 0;  ///< this worker's pushes of the part the server has applied
  std::uint64_t pushed = 0;   ///< this worker's pushes of the part it counts as sent
  /// The welcome has flag `frame_flags::policy`; what it means is the policy's (e.g.
  /// recovery::stateless's `protocol::wants_replicas_flag`).
  bool welcome_policy_bit = false;
  clock_value rows_clock = 0;                 ///< server clock of the part's cached rows
  std::span<const unapplied_push> unapplied;  ///< valid during the call
};

/// What the worker does about the pushes a server lacks (`applied < pushed`), from `on_welcome`.
enum class welcome_action {
  count_lost,  ///< they are lost: `worker_stats::lost_pushes` counts them (the default)
  recovered,   ///< the part delivers them itself (e.g. in a backlog): not counted as lost
  resend,      ///< the part resends them (`on_rejoin`): the worker keeps its push count
  give_up,     ///< end the run with `errc::server_lost` (the worker logs why)
};

/// One table's slice of a clock's gradient for a shard that is down (hook `while_away`): the
/// rows the shard owns, the server clock of the cached rows it was computed on, and the
/// gradient (`rows.size() * width` floats, valid during the call).
struct away_slice {
  table_id table = 0;
  key_range rows{};
  clock_value rows_clock = 0;
  std::span<const float> grad;
};

/// A message a part queues while a link rejoins, and the payload bytes `worker_stats::
/// bytes_out` counts when the worker sends it.
struct rejoin_message {
  message msg;
  std::size_t counted_bytes = 0;
};

/// One part of a rejoining link as `on_rejoin` sees it.
struct rejoin_part {
  key_range range{};
  std::uint32_t width = 0;
  bool have = false;            ///< every row of the part is cached
  const float* rows = nullptr;  ///< the cached rows (`range.size() * width` floats)
};

/// What `on_rejoin` may read and queue: the link that reconnected, and an outbox the worker
/// sends in order before the link is up again (nothing else is sent on it meanwhile). After
/// each message that went out, the worker calls `on_rejoin_sent(shard, header)`.
/// Thread safety: the worker's executor, during the call only.
class rejoin_context {
 public:
  /// `allocate(state, bytes)` returns a pooled buffer of `bytes` bytes (the transport's).
  rejoin_context(std::uint32_t shard, std::uint32_t sender, clock_value hello_clock,
                 clock_value clock, bool welcome_policy_bit, std::span<const rejoin_part> parts,
                 buffer (*allocate)(void*, std::size_t), void* state,
                 std::vector<rejoin_message>& out) noexcept
      : shard(shard), sender(sender), hello_clock(hello_clock), clock(clock),
        welcome_policy_bit(welcome_policy_bit), parts(parts), allocate_(allocate), state_(state),
        out_(out) {}

  std::uint32_t shard;                 ///< the link's shard
  std::uint32_t sender;                ///< this worker's id
  clock_value hello_clock;             ///< the clock its hello carried
  clock_value clock;                   ///< the worker's clock now
  bool welcome_policy_bit;             ///< the welcome had flag `frame_flags::policy`
  std::span<const rejoin_part> parts;  ///< per table

  /// Queues a `clock` message for clock `k`.
  void send_clock(clock_value k) {
    message m;
    m.header.type = message_type::clock;
    m.header.sender = sender;
    m.header.clock = k;
    out_.push_back(rejoin_message{std::move(m), 0});
  }
  /// Queues a range push of all of part `t`'s rows, flagged `flag` (`frame_flags::policy`,
  /// `prefixed`), with `clock = since`; its payload is `prefix` (bytes the policy's message puts
  /// before the rows, e.g. a backlog's count of clocks: wire.hpp checks its size) followed by a
  /// copy of `values` (`range.size() * width` floats). All of it counts in `bytes_out`.
  void send_rows(table_id t, std::uint8_t flag, const float* values, clock_value since,
                 std::span<const std::byte> prefix = {}) {
    const rejoin_part& p = parts[t];
    const std::size_t n = std::size_t{p.range.size()} * p.width;
    message m;
    m.header.type = message_type::push;
    m.header.flags = static_cast<std::uint8_t>(frame_flags::range | flag);
    m.header.sender = sender;
    m.header.table = t;
    m.header.clock = since;
    m.header.first_row = p.range.begin;
    m.header.row_count = p.range.size();
    m.header.width = p.width;
    m.payload = allocate_(state_, prefix.size() + n * sizeof(float));
    if (!prefix.empty()) std::memcpy(m.payload.data(), prefix.data(), prefix.size());
    std::memcpy(m.payload.data() + prefix.size(), values, n * sizeof(float));
    out_.push_back(rejoin_message{std::move(m), prefix.size() + n * sizeof(float)});
  }
  /// Queues `m` as is (e.g. a push resent with its shared payload); not counted in bytes_out.
  void send(message m) { out_.push_back(rejoin_message{std::move(m), 0}); }

 private:
  buffer (*allocate_)(void*, std::size_t);
  void* state_;
  std::vector<rejoin_message>& out_;
};

namespace detail::worker_hooks {
/// Whether `P` takes messages of types the worker does not know (`on_server_message`).
template <class P>
concept takes_server_messages =
    requires(P& p, std::uint32_t s, message& m, std::vector<message>& out) {
      { p.on_server_message(s, m, out) } -> std::same_as<std::error_code>;
    };
}  // namespace detail::worker_hooks

/// Checks the hooks a worker part declares: a hook declared with another signature than the
/// worker calls would silently fall back to the default, so it stops the build instead, with
/// a message naming the hook and the signature expected. Returns true (use it in a
/// `static_assert`).
template <class P>
consteval bool check_worker_part() {
  using s_t = std::uint32_t;
  if constexpr (requires { &P::on_start; })
    static_assert(
        requires(P& p, const worker_setup& s) { p.on_start(s); },
        "asyncps: recovery worker part: declare on_start as "
        "`void on_start(const asyncps::worker_setup&)`");
  if constexpr (requires { &P::hello_clock; })
    static_assert(
        requires(const P& p, s_t s, clock_value c) {
          { p.hello_clock(s, c) } -> std::convertible_to<clock_value>;
        }, "asyncps: recovery worker part: declare hello_clock as "
           "`clock_value hello_clock(std::uint32_t shard, clock_value clock) const`");
  if constexpr (requires { &P::hello_flags; })
    static_assert(
        requires(const P& p, s_t s) {
          { p.hello_flags(s) } -> std::convertible_to<std::uint8_t>;
        }, "asyncps: recovery worker part: declare hello_flags as "
           "`std::uint8_t hello_flags(std::uint32_t shard) const`");
  if constexpr (requires { &P::on_server_message; })
    static_assert(detail::worker_hooks::takes_server_messages<P>,
                  "asyncps: recovery worker part: declare on_server_message as `std::error_code "
                  "on_server_message(std::uint32_t shard, asyncps::message&, "
                  "std::vector<asyncps::message>& replies)`");
  if constexpr (requires { &P::on_welcome; })
    static_assert(
        requires(P& p, const welcome_part& w) {
          { p.on_welcome(w) } -> std::same_as<welcome_action>;
        }, "asyncps: recovery worker part: declare on_welcome as "
           "`asyncps::welcome_action on_welcome(const asyncps::welcome_part&)`");
  if constexpr (requires { &P::on_refused; })
    static_assert(
        requires(const P& p, s_t s, std::error_code c) {
          { p.on_refused(s, c) } -> std::same_as<refusal_action>;
        }, "asyncps: recovery worker part: declare on_refused as `asyncps::refusal_action "
           "on_refused(std::uint32_t shard, std::error_code code) const`");
  if constexpr (requires { &P::push_flags; })
    static_assert(
        requires(const P& p) {
          { p.push_flags() } -> std::convertible_to<std::uint8_t>;
        },
        "asyncps: recovery worker part: declare push_flags as `std::uint8_t push_flags() const`");
  if constexpr (requires { &P::on_push; })
    static_assert(
        requires(P& p, s_t s, const message& m) { p.on_push(s, m); },
        "asyncps: recovery worker part: declare on_push as "
        "`void on_push(std::uint32_t shard, const asyncps::message&)`");
  if constexpr (requires { &P::on_ack; })
    static_assert(
        requires(P& p, s_t s, std::uint64_t q) {
          { p.on_ack(s, q) } -> std::same_as<bool>;
        }, "asyncps: recovery worker part: declare on_ack as "
           "`bool on_ack(std::uint32_t shard, std::uint64_t seq)` (true: wake the clock loop)");
  if constexpr (requires { &P::flow_blocked; })
    static_assert(
        requires(const P& p, s_t s) {
          { p.flow_blocked(s) } -> std::same_as<bool>;
        }, "asyncps: recovery worker part: declare flow_blocked as "
           "`bool flow_blocked(std::uint32_t shard) const`");
  if constexpr (requires { &P::while_away; })
    static_assert(
        requires(P& p, s_t s, std::span<const away_slice> g) { p.while_away(s, g); },
        "asyncps: recovery worker part: declare while_away as `void while_away(std::uint32_t "
        "shard, std::span<const asyncps::away_slice>)`");
  if constexpr (requires { &P::on_rejoin; })
    static_assert(
        requires(P& p, rejoin_context& r) { p.on_rejoin(r); },
        "asyncps: recovery worker part: declare on_rejoin as "
        "`void on_rejoin(asyncps::rejoin_context&)`");
  if constexpr (requires { &P::on_rejoin_sent; })
    static_assert(
        requires(P& p, s_t s, const frame_header& h) { p.on_rejoin_sent(s, h); },
        "asyncps: recovery worker part: declare on_rejoin_sent as "
        "`void on_rejoin_sent(std::uint32_t shard, const asyncps::frame_header&)`");
  if constexpr (requires { &P::unacknowledged; })
    static_assert(
        requires(const P& p, s_t s) {
          { p.unacknowledged(s) } -> std::same_as<std::uint64_t>;
        }, "asyncps: recovery worker part: declare unacknowledged as "
           "`std::uint64_t unacknowledged(std::uint32_t shard) const`");
  if constexpr (requires { &P::has_pending; })
    static_assert(
        requires(const P& p, s_t s, bool up) {
          { p.has_pending(s, up) } -> std::same_as<bool>;
        }, "asyncps: recovery worker part: declare has_pending as "
           "`bool has_pending(std::uint32_t shard, bool up) const`");
  return true;
}

}  // namespace asyncps
