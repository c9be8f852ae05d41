// asyncps — pooled, 64-byte-aligned, reference-counted buffers (the zero-copy currency).
//
// Gradients are computed straight into a `buffer`, pushed without a copy (TCP sends header +
// payload with scatter-gather, the in-process transport moves the buffer), received straight
// into a `buffer`, and applied in place. Blocks are recycled by their `buffer_pool`, so the
// push/pull path does not touch the heap after warm-up.
#pragma once

#include <atomic>
#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <span>
#include <utility>

namespace asyncps {

class buffer_pool;

namespace detail {

/// Header stored in the 64 bytes in front of every pooled block.
struct alignas(64) block_header {
  buffer_pool* pool = nullptr;
  block_header* next_free = nullptr;
  std::atomic<std::uint32_t> refs{0};
  std::uint32_t size_class = 0;  ///< capacity = 1 << size_class bytes
};
static_assert(sizeof(block_header) == 64, "block header must keep payloads 64-byte aligned");

}  // namespace detail

/// A reference-counted view of (part of) a pooled block: `size()` bytes at `data()`, with
/// `data()` 64-byte aligned for a buffer fresh from `buffer_pool::allocate`.
///
/// Move-only; `share()` makes a second reference to the same bytes (used when one gradient
/// block is pushed to several shards). The block returns to its pool when the last reference
/// goes. Thread safety: distinct `buffer` objects may be used and destroyed concurrently from
/// any threads, even when they share a block; one object is not safe to use concurrently.
class buffer {
 public:
  buffer() noexcept = default;
  buffer(buffer&& o) noexcept
      : block_(std::exchange(o.block_, nullptr)), data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  buffer& operator=(buffer&& o) noexcept {
    if (this != &o) {
      reset();
      block_ = std::exchange(o.block_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  ~buffer() { reset(); }

  /// Bytes in this view.
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  std::byte* data() noexcept { return data_; }
  const std::byte* data() const noexcept { return data_; }
  std::span<std::byte> bytes() noexcept { return {data_, size_}; }
  std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }

  /// The bytes as floats (IEEE-754 binary32). Precondition: `size() % 4 == 0`.
  std::span<float> floats() noexcept {
    return {reinterpret_cast<float*>(data_), size_ / sizeof(float)};
  }
  std::span<const float> floats() const noexcept {
    return {reinterpret_cast<const float*>(data_), size_ / sizeof(float)};
  }

  /// A new reference to `count` bytes at `offset` of this view. Complexity: one atomic add.
  /// Precondition: `offset + count <= size()`.
  buffer share(std::size_t offset, std::size_t count) const noexcept {
    assert(offset + count <= size_);
    if (block_ != nullptr) block_->refs.fetch_add(1, std::memory_order_relaxed);
    return buffer{block_, data_ + offset, count};
  }
  /// A new reference to the whole view.
  buffer share() const noexcept { return share(0, size_); }

  /// Whether this is the only reference to its block (false for an empty buffer). An acquire
  /// load, paired with the release of `reset`: when it returns true, every access made
  /// through the other references, on any thread, happened before it, so the caller may
  /// write the bytes (used by copy-on-write storage such as a shard's table values).
  /// Complexity: one atomic load.
  bool unique() const noexcept {
    return block_ != nullptr && block_->refs.load(std::memory_order_acquire) == 1;
  }
  /// The pool the block came from; null for an empty buffer.
  buffer_pool* pool() const noexcept { return block_ != nullptr ? block_->pool : nullptr; }

  /// Shrinks the view to its first `count` bytes. Precondition: `count <= size()`.
  void truncate(std::size_t count) noexcept {
    assert(count <= size_);
    size_ = count;
  }

  /// Drops this reference (returns the block to its pool if it was the last).
  void reset() noexcept;

 private:
  friend class buffer_pool;
  buffer(detail::block_header* b, std::byte* d, std::size_t n) noexcept
      : block_(b), data_(d), size_(n) {}
  detail::block_header* block_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Counters of a `buffer_pool` (for tests, benchmarks and memory reports).
struct buffer_pool_stats {
  std::uint64_t fresh_blocks = 0;   ///< blocks obtained from the heap
  std::uint64_t reused_blocks = 0;  ///< allocations served from the free lists
  /// Blocks given back to the heap while the pool lives: freed beyond the budget
  /// (`max_cached_bytes`), dropped from the cache by `try_allocate`, `trim` or
  /// `release_cached`.
  std::uint64_t returned_blocks = 0;
  std::uint64_t returned_bytes = 0;  ///< their capacity, in bytes
  std::uint64_t trims = 0;           ///< calls of `trim`
  std::size_t cached_bytes = 0;      ///< capacity bytes in the free lists at the snapshot
};

/// A thread-safe pool of 64-byte-aligned blocks in power-of-two size classes (64 B .. 4 GiB).
///
/// Freed blocks are cached in per-class free lists, so a steady working set (the same buffer
/// sizes, step after step) is served without touching the heap. Two bounds keep a burst (e.g. a
/// flood of big frames) from pinning its memory until the process ends:
/// - a budget: a block freed while the free lists hold `max_cached_bytes` (capacity bytes)
///   goes back to the heap at once;
/// - `trim()`, for an owner to call now and then (e.g. when idle, or every few seconds): it
///   gives back what the working set since the previous call did not need, so a burst's
///   blocks leave the cache at the second call after it, and an idle pool keeps nothing.
///
/// Preconditions: the pool outlives every `buffer` it handed out. Thread safety: every member
/// may be called concurrently from any threads, as may buffer release (one mutex per pool;
/// held for a free-list push/pop or a trim's unlinking only; blocks go back to the heap
/// outside it).
class buffer_pool {
 public:
  /// The default budget of the free lists: 64 MiB of capacity.
  static constexpr std::size_t default_max_cached_bytes = std::size_t{64} << 20;

  /// `max_cached_bytes`: the budget, an upper bound on the capacity bytes kept in the free
  /// lists (blocks count their power-of-two capacity: a 40 MiB buffer's block counts 64 MiB).
  /// A working set larger than the budget is partly reallocated from the heap at each use:
  /// raise it to at least the working set (e.g. twice the largest model message per peer).
  explicit buffer_pool(std::size_t max_cached_bytes = default_max_cached_bytes) noexcept
      : max_cached_bytes_(max_cached_bytes) {}
  buffer_pool(const buffer_pool&) = delete;
  buffer_pool& operator=(const buffer_pool&) = delete;
  ~buffer_pool() {
    assert(outstanding_ == 0 && "buffer_pool destroyed while buffers are alive");
    for (auto*& head : free_) {
      while (head != nullptr) {
        auto* next = head->next_free;
        free_block(head);
        head = next;
      }
    }
  }

  /// A buffer of exactly `bytes` bytes (capacity rounded up to a power of two >= 64), 64-byte
  /// aligned. Contents are unspecified. Throws `std::bad_alloc` only when the heap is exhausted.
  buffer allocate(std::size_t bytes) {
    const std::uint32_t cls = size_class_for(bytes);
    detail::block_header* b = nullptr;
    {
      std::lock_guard lock(mutex_);
      b = pop(cls);
      if (b != nullptr) {
        ++stats_.reused_blocks;
      } else {
        ++stats_.fresh_blocks;
      }
      lent(cls);
    }
    return lend(b != nullptr ? b : fresh_block(cls), bytes);
  }

  /// Like `allocate`, but only while the blocks lent out plus this one stay within
  /// `max_bytes` of capacity (powers of two, so a buffer of `bytes` may count up to twice
  /// that); otherwise returns a buffer with `data() == nullptr` and allocates nothing. Cached
  /// blocks of other sizes are returned to the heap first when lent plus cached bytes would
  /// exceed `max_bytes`, so a pool used only through this call never holds more than
  /// `max_bytes` (lent and cached). Used by `tcp_transport` to bound the frames its accepted
  /// connections receive (`tcp_options::max_receive_bytes`). Throws `std::bad_alloc` only
  /// when the heap is exhausted. Thread safety: any thread.
  buffer try_allocate(std::size_t bytes, std::size_t max_bytes) {
    const std::uint32_t cls = size_class_for(bytes);
    const std::size_t cap = std::size_t{1} << cls;
    detail::block_header* b = nullptr;
    detail::block_header* to_free = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (cap > max_bytes || lent_bytes_ > max_bytes - cap) return buffer{};
      b = pop(cls);
      if (b != nullptr) {
        ++stats_.reused_blocks;
      } else {
        ++stats_.fresh_blocks;
        // Make room: hand back cached blocks, largest first, until lent + cached + cap fit.
        to_free = unlink_largest(max_bytes - cap - lent_bytes_);
      }
      lent(cls);
    }
    free_all(to_free);
    return lend(b != nullptr ? b : fresh_block(cls), bytes);
  }

  /// Gives back to the heap the cached blocks that the working set since the previous `trim`
  /// (or since construction) did not need: per size class, the free list keeps at most the
  /// most blocks lent at once in that period minus those lent now, so the same working set
  /// again is still served without the heap. Then a new period starts. Called when idle (no
  /// buffer lent all period) it empties the cache; called periodically, a burst's blocks go
  /// back at the second call after the burst. Returns the capacity bytes given back.
  /// Complexity: O(blocks given back) plus 64 steps. Thread safety: any thread.
  std::size_t trim() noexcept {
    detail::block_header* to_free = nullptr;
    std::size_t released = 0;
    {
      std::lock_guard lock(mutex_);
      ++stats_.trims;
      for (std::uint32_t c = 0; c < 64; ++c) {
        const std::size_t keep = peak_count_[c] - lent_count_[c];  // peak >= lent
        while (cached_count_[c] > keep) {
          detail::block_header* h = pop(c);
          returned(c);
          released += std::size_t{1} << c;
          h->next_free = to_free;
          to_free = h;
        }
        peak_count_[c] = lent_count_[c];
      }
    }
    free_all(to_free);
    return released;
  }

  /// Gives back cached blocks to the heap, largest first, until at most `keep_bytes` of
  /// capacity stay cached (0: all). Returns the capacity bytes given back. Thread safety: any
  /// thread.
  std::size_t release_cached(std::size_t keep_bytes = 0) noexcept {
    detail::block_header* to_free = nullptr;
    std::size_t before = 0;
    std::size_t after = 0;
    {
      std::lock_guard lock(mutex_);
      before = cached_bytes_;
      to_free = unlink_largest(keep_bytes);
      after = cached_bytes_;
    }
    free_all(to_free);
    return before - after;
  }

  /// The budget of the free lists, in capacity bytes (see the constructor).
  std::size_t max_cached_bytes() const noexcept { return max_cached_bytes_; }
  /// Capacity bytes of the blocks lent out (their `buffer`s alive). Thread safety: any thread.
  std::size_t lent_bytes() const {
    std::lock_guard lock(mutex_);
    return lent_bytes_;
  }
  /// Capacity bytes of the blocks cached in the free lists. Thread safety: any thread.
  std::size_t cached_bytes() const {
    std::lock_guard lock(mutex_);
    return cached_bytes_;
  }

  /// Snapshot of the counters. Thread safety: any thread.
  buffer_pool_stats stats() const {
    std::lock_guard lock(mutex_);
    buffer_pool_stats s = stats_;
    s.cached_bytes = cached_bytes_;
    return s;
  }

 private:
  friend class buffer;
  static constexpr std::uint32_t min_class = 6;  // 64 bytes
  static std::uint32_t size_class_for(std::size_t bytes) noexcept {
    const std::size_t n = bytes < 64 ? 64 : bytes;
    return static_cast<std::uint32_t>(std::bit_width(n - 1));
  }
  // The free-list operations below run under `mutex_`.
  // The head of class `c`'s free list, unlinked, or null.
  detail::block_header* pop(std::uint32_t c) noexcept {
    detail::block_header* b = free_[c];
    if (b != nullptr) {
      free_[c] = b->next_free;
      cached_bytes_ -= std::size_t{1} << c;
      --cached_count_[c];
    }
    return b;
  }
  // A block of class `c` is lent out.
  void lent(std::uint32_t c) noexcept {
    ++outstanding_;
    lent_bytes_ += std::size_t{1} << c;
    if (++lent_count_[c] > peak_count_[c]) peak_count_[c] = lent_count_[c];
  }
  // Undoes `lent(c)` (a block given back, or one the heap could not provide).
  void unlent(std::uint32_t c) noexcept {
    --outstanding_;
    lent_bytes_ -= std::size_t{1} << c;
    --lent_count_[c];
  }
  // A block of class `c` leaves the pool for the heap.
  void returned(std::uint32_t c) noexcept {
    ++stats_.returned_blocks;
    stats_.returned_bytes += std::size_t{1} << c;
  }
  // Unlinks cached blocks, largest first, until at most `keep_bytes` stay cached; returns
  // them as a list (through `next_free`) for `free_all` outside the lock.
  detail::block_header* unlink_largest(std::size_t keep_bytes) noexcept {
    detail::block_header* out = nullptr;
    for (std::uint32_t c = 63; cached_bytes_ > keep_bytes && c > 0;) {
      detail::block_header* h = pop(c);
      if (h == nullptr) {
        --c;
        continue;
      }
      returned(c);
      h->next_free = out;
      out = h;
    }
    return out;
  }
  static void free_all(detail::block_header* list) noexcept {
    while (list != nullptr) {
      auto* next = list->next_free;
      free_block(list);
      list = next;
    }
  }
  detail::block_header* fresh_block(std::uint32_t cls) {
    void* mem = nullptr;
    try {
      mem = ::operator new(sizeof(detail::block_header) + (std::size_t{1} << cls),
                           std::align_val_t{64});
    } catch (...) {
      std::lock_guard lock(mutex_);
      unlent(cls);
      throw;
    }
    auto* b = ::new (mem) detail::block_header{};
    b->pool = this;
    b->size_class = cls;
    return b;
  }
  static buffer lend(detail::block_header* b, std::size_t bytes) noexcept {
    b->next_free = nullptr;
    b->refs.store(1, std::memory_order_relaxed);
    return buffer{b, reinterpret_cast<std::byte*>(b + 1), bytes};
  }
  static void free_block(detail::block_header* b) noexcept {
    b->~block_header();
    ::operator delete(static_cast<void*>(b), std::align_val_t{64});
  }
  void release(detail::block_header* b) noexcept {
    const std::uint32_t c = b->size_class;
    const std::size_t cap = std::size_t{1} << c;
    {
      std::lock_guard lock(mutex_);
      unlent(c);
      if (cached_bytes_ + cap <= max_cached_bytes_) {
        b->next_free = free_[c];
        free_[c] = b;
        cached_bytes_ += cap;
        ++cached_count_[c];
        return;
      }
      returned(c);
    }
    free_block(b);
  }

  mutable std::mutex mutex_;
  detail::block_header* free_[64] = {};
  std::size_t cached_count_[64] = {};  // blocks in each free list
  std::size_t lent_count_[64] = {};    // blocks of each class lent out
  std::size_t peak_count_[64] = {};    // the most of them lent at once since the last trim
  std::size_t cached_bytes_ = 0;
  std::size_t max_cached_bytes_;
  std::size_t outstanding_ = 0;  // blocks lent out
  std::size_t lent_bytes_ = 0;   // their capacity in bytes
  buffer_pool_stats stats_{};
};

inline void buffer::reset() noexcept {
  if (block_ != nullptr && block_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    block_->pool->release(block_);
  }
  block_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

}  // namespace asyncps
