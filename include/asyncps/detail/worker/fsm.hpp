// asyncps — detail::worker_core: a worker's clock loop as a state machine, sans-io.
//
// The core (`worker_protocol`: what a worker knows, plus the loop's state) decides what to do
// next; `basic_worker` (worker.hpp) is the
// thin coroutine shell that executes it: it owns the connections, the timer and the
// coroutines. The clock loop is `resume(now) -> action` (Boost.Redis's `*_fsm` shape): join
// reconnected links, send a message, start a reconnect, wait on the timer, compute a
// gradient, or done. The shell runs it in one coroutine frame (a coroutine call per clock
// would allocate a frame per clock). tests/unit/worker_core_test.cpp steps it with no network.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "asyncps/detail/worker/protocol.hpp"
#include "asyncps/detail/worker/push_builder.hpp"

namespace asyncps {

namespace detail {

/// What the clock loop asks its shell to do next (`worker_core::resume`).
enum class loop_step {
  join,       ///< finish the rejoin of reconnected links, then resume
  send,       ///< send `msg` on link `shard` (on failure fail the link), then resume
  reconnect,  ///< start reconnecting link `shard` (a coroutine of its own), then resume
  wait,       ///< wait on the wake timer for `wait` (or until woken), then resume
  compute,    ///< compute the gradient of `parameters()` into a new buffer, then `computed`
  done,       ///< the run ends with `ec`
};

/// A worker's sans-io core: its protocol (`worker_protocol`) and its clock loop (see the file
/// comment). `Clock` is the transport's clock (virtual in simulations). Thread safety: the
/// shell's executor only.
template <class Model, class Consistency, class Recovery, class Alloc, class Clock, class Endpoint>
class worker_core : public worker_protocol<Model, Consistency, Recovery, Alloc, Endpoint> {
  using base = worker_protocol<Model, Consistency, Recovery, Alloc, Endpoint>;
  using base::alloc_, base::cache_, base::clock_, base::links_, base::model_, base::opts_,
      base::policy_, base::recovery_, base::snapshot_, base::staleness_, base::stats_;

 public:
  using base::all_up, base::log, base::server_name;
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;
  using link = typename base::link;
  using in_transit_update = typename base::in_transit_update;
  static constexpr bool value_bounded = base::value_bounded;
  static constexpr bool sparse_reads = base::sparse_reads;

  /// One step of the clock loop.
  struct action {
    loop_step kind = loop_step::done;
    std::uint32_t shard = 0;
    message msg{};
    duration wait{};
    std::error_code ec{};
  };

  /// See `worker_protocol`.
  worker_core(Model& model, const worker_options<Endpoint>& opts, Alloc& alloc,
              typename base::part_type part)
      : base(model, opts, alloc, std::move(part)) {
    away_slices_.reserve(cache_.tables().size());
  }

  /// Starts the clock loop: `clocks` clocks, after connecting with result `ec`.
  void start(std::uint64_t clocks, std::error_code ec) {
    clocks_ = clocks;
    k_ = 0;
    ec_ = ec;
    pc_ = pc::clock_begin;
  }
  /// After a `compute` step: the gradient of `parameters()` is in `grad` (`loss`: what the
  /// model returned), at time `now`. The loop goes on at the next `resume`.
  void computed(buffer grad, float loss, time_point now) {
    grad_ = std::move(grad);
    loss_ = loss;
    stats_.compute_seconds += std::chrono::duration<double>(now - computed_).count();
    pc_ = pc::computed;
  }

  /// An allocation failed (`std::bad_alloc`, `std::length_error`) in the shell while it was
  /// `what` (e.g. "receiving from", with `shard` named after it): the run ends with
  /// `errc::resource_exhausted` at the next `resume` (unless it already ends with another
  /// error), without the pending work the recovery policy holds. Logged for the first failure
  /// only (the line is lost when even it cannot be allocated); every one counts in
  /// `worker_stats::out_of_memory`.
  void out_of_memory(std::string_view what,
                     std::optional<std::uint32_t> shard = std::nullopt) noexcept {
    ++stats_.out_of_memory;
    if (no_memory_) return;
    no_memory_ = true;
    try {
      log("out of memory while " + std::string(what) +
          (shard ? " " + server_name(links_[*shard]) : std::string()) +
          "; the run ends (resource_exhausted)");
    } catch (const std::bad_alloc&) {
    } catch (const std::length_error&) {}
  }

  /// The next step of the clock loop, at time `now`, after the previous step was carried out
  /// (`join`, `send`, `reconnect`, `wait`). Every `clock_report` goes to `on_clock`.
  action resume(time_point now) {
    if (no_memory_ && pc_ != pc::finished) {
      if (!ec_) ec_ = make_error_code(errc::resource_exhausted);
      pc_ = pc::finished;
    }
    for (;;) {
      switch (pc_) {
        case pc::clock_begin:
          if (ec_ || k_ >= clocks_ || (opts_.end_clock && clock_ >= *opts_.end_clock)) {
            pc_ = pc::pending_begin;
            break;
          }
          c_ = clock_;
          need_ = policy_.min_server_clock(c_);
          window_ = push_window(need_);
          pc_ = pc::clock_joined;
          return {loop_step::join};
        case pc::clock_joined:
          // 1. Consistency: decide per cached part (per row the model reads, for sparse
          //    reads); pull where needed.
          if constexpr (sparse_reads)
            cache_.select_rows([&](table_id t) { return model_.rows_to_read(t); });
          begin_pulls(false, pc::rows_begin);
          break;
        case pc::pulls:
          for (; li_ < links_.size(); ++li_, ti_ = 0) {
            link& l = links_[li_];
            while (ti_ < cache_.tables().size() && l.up) {
              const table_id t = ti_++;
              if (auto m = read_pull(l, t, fetch_only_))
                return {loop_step::send, l.shard, std::move(*m)};
            }
          }
          pc_ = after_pulls_;
          break;
        case pc::rows_begin:
          // 2. Wait until every part is fresh enough (parts of a shard that is down are read
          //    from the cache when the recovery policy trains on) and flow control allows.
          wait_start_ = now;
          wait_ = bounded_wait{now, true};
          window_waited_ = false;
          pc_ = pc::rows_check;
          break;
        case pc::rows_check:
          if (auto a = check_links(); a.kind == loop_step::reconnect) return a;
          if (const bool window = window_blocked();
              ec_ || (ready() && !flow_blocked() && !window)) {
            pc_ = pc::rows_end;
            break;
          } else if (window) {
            window_waited_ = true;
          }
          if (timed_out(wait_, now)) {
            log("no fresh rows for clock " + std::to_string(c_) + " within the wait timeout (" +
                std::to_string(opts_.wait_timeout.count()) + " ms): " + blocked_by());
            ec_ = errc::timeout;
            pc_ = pc::rows_end;
            break;
          }
          pc_ = pc::rows_woke;
          return {loop_step::wait, 0, {}, tick()};
        case pc::rows_woke:
          // A link that came back while waiting (or lost its outstanding pull) needs a pull.
          pc_ = pc::rows_joined;
          return {loop_step::join};
        case pc::rows_joined:
          if (clock_ > c_) {
            // A shard took this worker back at a later clock while it waited (elastic
            // membership): start that clock instead.
            pc_ = pc::clock_begin;
            break;
          }
          begin_pulls(true, pc::rows_check);
          break;
        case pc::rows_end: {
          if (ec_) {
            pc_ = pc::pending_begin;
            break;
          }
          computed_ = now;
          stats_.wait_seconds += std::chrono::duration<double>(now - wait_start_).count();
          if (window_waited_) ++stats_.window_waits;
          for (auto& l : links_)
            if (l.up) cache_.record_staleness(l.shard, c_, staleness_);
          // 3. Snapshot (the rows changed since the last one); the shell computes the
          // gradient straight into a pooled buffer.
          cache_.refresh_snapshot(snapshot_);
          pc_ = pc::computing;
          return {loop_step::compute};
        }
        case pc::computing: return {loop_step::compute};  // (resumed by `computed`)
        case pc::computed:
          if (opts_.check_gradients && (ec_ = check_gradient())) {
            pc_ = pc::pending_begin;
            break;
          }
          pc_ = pc::pushes_begin;
          if constexpr (value_bounded) {
            // 4. VAP: wait until this update fits under the bound on in-transit magnitude.
            added_ = 0;
            for (auto& l : links_) {
              const float lr = cache_.step(l.shard) > 0 ? cache_.step(l.shard) : 1.0f;
              added_ += l.magnitude = update_magnitude(cache_, l.shard, grad_.floats(), lr);
            }
            bound_ = policy_.threshold(c_);
            wait_ = bounded_wait{now, false};
            waited_ = false;
            pc_ = pc::visible_check;
          }
          break;
        case pc::visible_check:
          if (auto a = check_links(); a.kind == loop_step::reconnect) return a;
          if (!ec_ && in_transit_magnitude() > 0 && in_transit_magnitude() + added_ > bound_) {
            if (timed_out(wait_, now)) {
              log("updates before clock " + std::to_string(c_) +
                  " not visible within the wait timeout");
              ec_ = errc::timeout;
              pc_ = pc::pending_begin;
              break;
            }
            waited_ = true;
            return {loop_step::wait, 0, {}, tick()};  // resumes at visible_check
          }
          if (ec_) {
            pc_ = pc::pending_begin;
            break;
          }
          if (waited_) {
            const double secs = std::chrono::duration<double>(now - wait_.start).count();
            ++stats_.value_waits;
            stats_.value_wait_seconds += secs;
            stats_.wait_seconds += secs;
          }
          pc_ = pc::pushes_begin;
          break;
        case pc::pushes_begin:
          // 5. Push each shard's slice of the buffer (no copy); the last push ends the clock.
          //    A shard that is down gets the slice through the policy's `while_away` hook when
          //    it trains on. A link that failed meanwhile gets its recovery action first.
          if (auto a = check_links(); a.kind == loop_step::reconnect) return a;
          if (ec_) {
            pc_ = pc::pending_begin;
            break;
          }
          if (clock_ > c_) {
            // A shard this worker had left welcomed it back at a later clock while it computed
            // clock c_ (elastic membership): drop the gradient, counted, and go on at the clock
            // the shard expects.
            log("clock " + std::to_string(c_) +
                "'s gradient dropped: a shard took this worker "
                "back at clock " +
                std::to_string(clock_));
            ++stats_.dropped_clocks;
            grad_ = buffer{};
            pc_ = pc::clock_begin;
            break;
          }
          li_ = 0;
          ti_ = 0;
          pc_ = pc::pushes;
          break;
        case pc::pushes:
          for (; li_ < links_.size(); ++li_, ti_ = 0) {
            link& l = links_[li_];
            if (ti_ == 0 && !l.up && l.trains_away) {
              keep_local(l);
              continue;
            }
            // A link that is down (before this clock's pushes or after some of them were sent)
            // still gets the rest built, not sent: the policy's `on_push` keeps them (a log, a
            // resend list) or the next welcome counts them as lost. None vanishes uncounted.
            while (ti_ <= cache_.tables().size()) {
              const table_id t = ti_++;
              if (auto m = make_push(l, t); m && l.up)
                return {loop_step::send, l.shard, std::move(*m)};
              else if (m)
                l.unsent = true;
            }
          }
          ++clock_;
          ++stats_.clocks;
          if (opts_.on_clock) opts_.on_clock(clock_report{opts_.id, c_, loss_, base::parameters()});
          grad_ = buffer{};
          ++k_;
          pc_ = pc::clock_begin;
          break;
        case pc::pending_begin:
          // Before leaving, deliver what the recovery policy still holds (`has_pending`: e.g.
          // a backlog trained while a shard was down, or pushes not acknowledged yet), within
          // the policy's reconnect timeout while a link is down, else within wait_timeout.
          wait_ = bounded_wait{now, true};
          pc_ = pc::pending_check;
          break;
        case pc::pending_check:
          if (ec_ || !has_pending()) {
            pc_ = pc::finished;
            break;
          }
          if (auto a = check_links(); a.kind == loop_step::reconnect) return a;
          if (ec_) {
            pc_ = pc::finished;
            break;
          }
          pc_ = pc::pending_joined;
          return {loop_step::join};
        case pc::pending_joined:
          if (!has_pending()) {
            pc_ = pc::finished;
            break;
          }
          if (timed_out(wait_, now)) {
            log("pushes still unacknowledged after the wait timeout");
            ec_ = errc::timeout;
            pc_ = pc::finished;
            break;
          }
          pc_ = pc::pending_check;
          return {loop_step::wait, 0, {}, std::chrono::milliseconds(50)};
        case pc::finished: grad_ = buffer{}; return {loop_step::done, 0, {}, {}, ec_};
      }
    }
  }

 private:
  // Resume points of the clock loop.
  enum class pc {
    clock_begin,
    clock_joined,
    pulls,
    rows_begin,
    rows_check,
    rows_woke,
    rows_joined,
    rows_end,
    computing,
    computed,
    visible_check,
    pushes_begin,
    pushes,
    pending_begin,
    pending_check,
    pending_joined,
    finished,
  };
  // A wait bounded by wait_timeout from `start`; restarted while a link is down when
  // `restart_while_down` (the reconnect's own timeout applies then).
  struct bounded_wait {
    time_point start{};
    bool restart_while_down = false;
  };

  // The one timeout rule of the loop's three waits (rows, VAP visibility, pending work).
  bool timed_out(bounded_wait& w, time_point now) const {
    if (w.restart_while_down && !all_up()) w.start = now;
    return now - w.start > opts_.wait_timeout;
  }
  // The wake timer's period while waiting: wait_timeout (woken by messages), or 100 ms while a
  // link is down (to notice its rejoin).
  duration tick() const {
    return all_up() ? duration(opts_.wait_timeout) : duration(std::chrono::milliseconds(100));
  }
  void begin_pulls(bool fetch_only, pc after) {
    li_ = 0;
    ti_ = 0;
    fetch_only_ = fetch_only;
    after_pulls_ = after;
    pc_ = pc::pulls;
  }

  // Sets ec_ when some link is down and the recovery policy gives up; otherwise returns a
  // `reconnect` for the first link that is down and not being reconnected (the shell starts
  // it and resumes, and the check goes on with the next one).
  action check_links() {
    for (auto& l : links_) {
      if (l.up || l.reconnecting || l.joining) continue;
      if (l.gave_up) {
        ec_ = l.refused ? l.failure : make_error_code(errc::server_lost);
        return {};
      }
      const recovery_action act = recovery_.on_server_lost(l.failure);
      if (act == recovery_action::fail) {
        log("lost server " + std::to_string(l.shard) + " (" + l.failure.message() +
            "); recovery policy '" + std::string(Recovery::name) + "' gives up");
        ec_ = l.refused ? l.failure : make_error_code(errc::server_lost);
        return {};
      }
      l.trains_away = act == recovery_action::continue_local;
      log("lost server " + std::to_string(l.shard) + " (" + l.failure.message() + "); " +
          (l.trains_away ? "training on locally, " : "") + "reconnecting");
      l.reconnecting = true;
      return {loop_step::reconnect, l.shard};
    }
    return {};
  }
  bool has_pending() const noexcept {
    return std::any_of(links_.begin(), links_.end(), [&](const link& l) {
      return (l.unsent && !l.up) || worker_hooks::has_pending(recovery_, l.shard, l.up);
    });
  }
  bool flow_blocked() const noexcept {
    return std::any_of(links_.begin(), links_.end(), [&](const link& l) {
      return l.up && worker_hooks::flow_blocked(recovery_, l.shard);
    });
  }
  // The push window at a clock whose reads must be at least `need` fresh (see
  // worker_options::push_window); 0: none.
  std::uint32_t push_window(clock_value need) const noexcept {
    if constexpr (value_bounded) {
      return 0;  // VAP bounds its in-transit updates itself
    } else {
      if (opts_.push_window) return *opts_.push_window;
      return need == no_clock ? default_push_window : 0;
    }
  }
  // Some server that is up has `window_` of this worker's clocks unacknowledged.
  bool window_blocked() const noexcept {
    if constexpr (value_bounded) {
      return false;
    } else {
      return window_ > 0 && std::any_of(links_.begin(), links_.end(), [&](const link& l) {
               return l.up && l.in_transit.size() >= window_;
             });
    }
  }
  bool ready() const noexcept {
    return std::all_of(links_.begin(), links_.end(), [&](const link& l) {
      return cache_.ready(l.shard, need_, l.up, l.trains_away);
    });
  }
  float in_transit_magnitude() const noexcept {
    float sum = 0;
    for (const auto& l : links_)
      if (l.up)
        for (std::size_t i = 0; i < l.in_transit.size(); ++i) sum += l.in_transit[i].magnitude;
    return sum;
  }

  // What the wait for rows waits on: per shard whose rows are not fresh enough, its server
  // clock and the slowest worker as the server last reported them.
  std::string blocked_by() const {
    std::string out = "waits for server clock >= " + std::to_string(need_);
    for (const auto& l : links_) {
      if (window_ > 0 && l.up && l.in_transit.size() >= window_)
        out += "; " + std::to_string(l.in_transit.size()) + " clocks of pushes to " +
               server_name(l) + " not acknowledged (push window " + std::to_string(window_) + ")";
      if (l.up && !cache_.stale(l.shard, need_)) continue;
      out += "; " + server_name(l);
      if (!l.up) out += " (not connected)";
      if (l.reported) {
        out += " is at server clock " + std::to_string(l.report_clock) + ", slowest worker " +
               std::to_string(l.slowest) + " at clock " + std::to_string(l.slowest_clock) +
               (l.slowest_connected ? " (connected)" : " (not connected)");
      } else {
        out += " has not reported its clock (no heartbeat report yet)";
      }
    }
    return out;
  }

  // check_gradients: errc::bad_gradient (logged with table, row and column).
  std::error_code check_gradient() const {
    const auto bad = find_bad_value(cache_.tables(), grad_, unwritten_gradient_bits);
    if (!bad) return {};
    const std::uint32_t w = cache_.tables()[bad->table].width;
    log("compute_gradient at clock " + std::to_string(clock_) + ": the gradient of table " +
        std::to_string(bad->table) + " row " + std::to_string(bad->index / w) + " column " +
        std::to_string(bad->index % w) +
        (bad->unwritten
             ? " was not written (every value must be written; check_gradients)"
             : (std::isnan(bad->value) ? " is NaN (computed)" : " is infinite (computed)")));
    return errc::bad_gradient;
  }

  // The pull part `t` of `l` needs before this clock's read, if any.
  std::optional<message> read_pull(link& l, table_id t, bool fetch_only) {
    const auto want = cache_.pull_clock(policy_, l.shard, t, c_, need_, fetch_only);
    if (!want) return std::nullopt;
    message m = cache_.pull(l.shard, t, *want, opts_.id, l.seq,
                            [this](std::size_t n) { return alloc_.allocate(n); });
    ++stats_.pulls;
    if (!m.header.has(frame_flags::range)) {
      ++stats_.sparse_pulls;
      stats_.bytes_out += m.payload.size();
    }
    return m;
  }

  // Message `t` of this clock's pushes to `l` (see build_push) with the recovery policy's
  // flags; counts it and applies it to the cache (read-my-writes).
  std::optional<message> make_push(link& l, table_id t) {
    const auto& parts = cache_.parts(l.shard);
    const bool is_part = t < parts.size();
    auto m = build_push(parts, t, c_, grad_, is_part ? cache_.part_offset(l.shard, t) : 0,
                        is_part ? cache_.tables()[t].width : 0, opts_.id, l.seq);
    if (!m) return m;
    if (!is_part) {  // a bare clock message
      m->header.flags = worker_hooks::push_flags(recovery_);
      if (m->header.has(frame_flags::want_ack)) m->header.seq = ++l.seq;  // acks echo it
      worker_hooks::on_push(recovery_, l.shard, *m);
      return m;
    }
    if constexpr (sparse_gradient_source<Model>)
      sparsify(*m, parts[t].range, model_.touched_rows(t), grad_.floats().data() + cache_.offset(t),
               cache_.tables()[t].width, [this](std::size_t n) { return alloc_.allocate(n); });
    m->header.flags |= worker_hooks::push_flags(recovery_);
    worker_hooks::on_push(recovery_, l.shard, *m);
    if constexpr (value_bounded) {
      if (l.up && m->header.has(frame_flags::end_of_clock)) {
        m->header.flags |= frame_flags::want_ack;
        l.in_transit.push_back(in_transit_update{m->header.seq, l.magnitude});
      }
    } else {
      // The push window: the clock's last push to this server asks for an ack, and counts as
      // in flight until it comes (protocol: on_message, `ack`).
      if (window_ > 0 && l.up && m->header.has(frame_flags::end_of_clock)) {
        m->header.flags |= frame_flags::want_ack;
        l.in_transit.push_back(in_transit_update{m->header.seq, 0});
      }
    }
    cache_.note_push(l.shard, t, grad_);
    ++stats_.pushes;
    stats_.bytes_out += m->payload.size();
    return m;
  }

  // The recovery policy trains on while `l`'s shard is down: this clock's slices go to its
  // `while_away` hook and are applied to the cache (read-my-writes).
  void keep_local(link& l) {
    away_slices_.clear();
    const auto& parts = cache_.parts(l.shard);
    for (table_id t = 0; t < parts.size(); ++t)
      if (!parts[t].range.empty())
        away_slices_.push_back(away_slice{t, parts[t].range, parts[t].clock,
                                          grad_.floats().subspan(cache_.part_offset(l.shard, t),
                                                                 cache_.part_floats(l.shard, t))});
    worker_hooks::while_away(recovery_, l.shard, away_slices_);
    cache_.apply_local(l.shard);  // the pushes sent before, first
    if (const float step = cache_.step(l.shard); step > 0)
      for (const away_slice& s : away_slices_) cache_.local_apply(step, s.table, s.rows, s.grad);
  }

  std::vector<away_slice> away_slices_;  // scratch for while_away (no allocation once warm)
  // The clock loop's state between steps.
  pc pc_ = pc::finished;
  pc after_pulls_ = pc::rows_begin;
  std::uint64_t clocks_ = 0, k_ = 0;
  std::error_code ec_{};
  clock_value c_ = 0, need_ = 0;
  std::size_t li_ = 0;  // link and table cursors of the pulls and pushes being sent
  table_id ti_ = 0;
  bool fetch_only_ = false;
  time_point wait_start_{}, computed_{};
  bounded_wait wait_{};
  bool waited_ = false;
  float added_ = 0, bound_ = 0;
  std::uint32_t window_ = 0;    // the push window of this clock (0: none)
  bool window_waited_ = false;  // this clock waited on it
  buffer grad_{};
  float loss_ = 0;
  bool no_memory_ = false;  // see out_of_memory
};

}  // namespace detail
}  // namespace asyncps
