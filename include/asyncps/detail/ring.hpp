// asyncps — detail: a growable FIFO ring buffer.
//
// For the queues on the push path (a worker's unacknowledged pushes, a chain server's sent
// list and pending acks): std::deque allocates and frees a node every few elements in a
// steady FIFO, this keeps its slots and only allocates when it grows past its capacity.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace asyncps::detail {

/// A FIFO of `T` (default-constructible, move-assignable) in a power-of-two array of slots.
/// `pop_front` resets the slot to `T{}` (releasing what it held). Complexity: O(1) per
/// operation, amortised O(1) `push_back`; no allocation once the capacity suffices.
template <class T>
class ring {
 public:
  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  /// The oldest element. Precondition: `!empty()`.
  T& front() noexcept { return slots_[head_]; }
  const T& front() const noexcept { return slots_[head_]; }
  /// The `i`-th oldest element. Precondition: `i < size()`.
  T& operator[](std::size_t i) noexcept { return slots_[(head_ + i) & (slots_.size() - 1)]; }
  const T& operator[](std::size_t i) const noexcept {
    return slots_[(head_ + i) & (slots_.size() - 1)];
  }

  void push_back(T v) {
    if (size_ == slots_.size()) grow();
    slots_[(head_ + size_) & (slots_.size() - 1)] = std::move(v);
    ++size_;
  }
  /// Precondition: `!empty()`.
  void pop_front() noexcept {
    slots_[head_] = T{};
    head_ = (head_ + 1) & (slots_.size() - 1);
    --size_;
  }
  void clear() noexcept {
    while (!empty()) pop_front();
    head_ = 0;
  }

 private:
  void grow() {
    std::vector<T> bigger(std::max<std::size_t>(16, slots_.size() * 2));
    for (std::size_t i = 0; i < size_; ++i) bigger[i] = std::move((*this)[i]);
    slots_.swap(bigger);
    head_ = 0;
  }

  std::vector<T> slots_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

}  // namespace asyncps::detail
