// asyncps — small pieces of the worker's coroutine shell (worker.hpp): allocation failures
// caught in its loops, a link's send turn, durations in log lines.
#pragma once

#include <chrono>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace asyncps::detail {

/// For a `catch (...)` handler: rethrows the exception being handled unless it is an
/// allocation failure (`std::bad_alloc`, `std::length_error`). Precondition: called inside a
/// handler.
inline void rethrow_unless_no_memory() {
  try {
    throw;
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {}
}

/// Holds link `s`'s send turn (`flags[s]`: a send or a queue drain is in progress on it) while
/// alive, and gives it back when destroyed, also when an exception unwinds the coroutine that
/// holds it. Thread safety: the owner's executor.
class send_turn {
 public:
  send_turn(std::vector<char>& flags, std::uint32_t s) noexcept : flags_(flags), s_(s) {
    flags_[s_] = 1;
  }
  send_turn(const send_turn&) = delete;
  send_turn& operator=(const send_turn&) = delete;
  ~send_turn() { flags_[s_] = 0; }

 private:
  std::vector<char>& flags_;
  std::uint32_t s_;
};

/// Points `slots[s]` at `value` while alive and back at null when destroyed, also when an
/// exception unwinds the coroutine that holds it: a reconnect registers its backoff timer this
/// way, so that the worker's `stop()` can cancel the wait. Thread safety: the owner's executor.
template <class T>
class slot_registration {
 public:
  slot_registration(std::vector<T*>& slots, std::uint32_t s, T& value) noexcept
      : slots_(slots), s_(s) {
    slots_[s_] = &value;
  }
  slot_registration(const slot_registration&) = delete;
  slot_registration& operator=(const slot_registration&) = delete;
  ~slot_registration() { slots_[s_] = nullptr; }

 private:
  std::vector<T*>& slots_;
  std::uint32_t s_;
};

/// `d` for a log line: "10 s" when whole seconds, else "1500 ms".
inline std::string duration_text(std::chrono::milliseconds d) {
  const auto ms = d.count();
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  return std::to_string(ms) + " ms";
}

}  // namespace asyncps::detail
