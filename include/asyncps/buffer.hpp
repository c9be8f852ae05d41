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

/// Counters of a `buffer_pool` (for tests and benchmarks).
struct buffer_pool_stats {
  std::uint64_t fresh_blocks = 0;   ///< blocks obtained from the heap
  std::uint64_t reused_blocks = 0;  ///< allocations served from the free lists
};

/// A thread-safe pool of 64-byte-aligned blocks in power-of-two size classes (64 B .. 4 GiB).
///
/// Preconditions: the pool outlives every `buffer` it handed out. Thread safety: `allocate`
/// and buffer release may be called concurrently from any threads (one mutex per pool; held
/// for a free-list push/pop only). Freed blocks are cached until `max_cached_bytes` is reached,
/// then returned to the heap.
class buffer_pool {
 public:
  /// `max_cached_bytes`: upper bound on bytes kept in the free lists.
  explicit buffer_pool(std::size_t max_cached_bytes = std::size_t{1} << 30) noexcept
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
      b = free_[cls];
      if (b != nullptr) {
        free_[cls] = b->next_free;
        cached_bytes_ -= std::size_t{1} << cls;
        ++stats_.reused_blocks;
      } else {
        ++stats_.fresh_blocks;
      }
      ++outstanding_;
      lent_bytes_ += std::size_t{1} << cls;
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
      b = free_[cls];
      if (b != nullptr) {
        free_[cls] = b->next_free;
        cached_bytes_ -= cap;
        ++stats_.reused_blocks;
      } else {
        ++stats_.fresh_blocks;
        // Make room: hand back cached blocks, largest first, until lent + cached + cap fit.
        for (std::uint32_t c = 63; cached_bytes_ > max_bytes - cap - lent_bytes_ && c > 0;) {
          detail::block_header* h = free_[c];
          if (h == nullptr) {
            --c;
            continue;
          }
          free_[c] = h->next_free;
          cached_bytes_ -= std::size_t{1} << c;
          h->next_free = to_free;
          to_free = h;
        }
      }
      ++outstanding_;
      lent_bytes_ += cap;
    }
    while (to_free != nullptr) {
      auto* next = to_free->next_free;
      free_block(to_free);
      to_free = next;
    }
    return lend(b != nullptr ? b : fresh_block(cls), bytes);
  }

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
    return stats_;
  }

 private:
  friend class buffer;
  static constexpr std::uint32_t min_class = 6;  // 64 bytes
  static std::uint32_t size_class_for(std::size_t bytes) noexcept {
    const std::size_t n = bytes < 64 ? 64 : bytes;
    return static_cast<std::uint32_t>(std::bit_width(n - 1));
  }
  detail::block_header* fresh_block(std::uint32_t cls) {
    void* mem = nullptr;
    try {
      mem = ::operator new(sizeof(detail::block_header) + (std::size_t{1} << cls),
                           std::align_val_t{64});
    } catch (...) {
      std::lock_guard lock(mutex_);
      --outstanding_;
      lent_bytes_ -= std::size_t{1} << cls;
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
    const std::size_t cap = std::size_t{1} << b->size_class;
    {
      std::lock_guard lock(mutex_);
      --outstanding_;
      lent_bytes_ -= cap;
      if (cached_bytes_ + cap <= max_cached_bytes_) {
        b->next_free = free_[b->size_class];
        free_[b->size_class] = b;
        cached_bytes_ += cap;
        return;
      }
    }
    free_block(b);
  }

  mutable std::mutex mutex_;
  detail::block_header* free_[64] = {};
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
