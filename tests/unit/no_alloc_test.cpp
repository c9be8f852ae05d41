// Proves the push/pull path allocates nothing after warm-up: a global operator new counter
// wraps a worker/server run, and the clocks after the warm-up must not touch the heap.
// The test target defines ASIO_DISABLE_STD_ALIGNED_ALLOC (so Asio's coroutine frames and
// handlers also go through the counted operator new), EIGEN_RUNTIME_NO_MALLOC (Eigen asserts
// on any allocation in the window) and ASIO_RECYCLING_ALLOCATOR_CACHE_SIZE=32 (see the
// top-level CMakeLists.txt and docs/performance.md).
#include <atomic>
#include <cstdlib>
#include <new>

#include <doctest/doctest.h>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/local_cluster.hpp"
#include "asyncps/transport/in_process.hpp"
#include "asyncps/transport/tcp.hpp"
#include "counter_model.hpp"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace {
std::atomic<bool> counting{false};
std::atomic<std::uint64_t> allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
// The nothrow forms too (std::stable_sort's temporary buffer uses them): otherwise ASan's
// nothrow new would be paired with the free() of the replaced delete below.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return operator new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return operator new(n, std::nothrow);
}
void* operator new(std::size_t n, std::align_val_t a) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  const auto al = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace {

using namespace asyncps;

// A model that starts counting allocations once it has run `warmup` clocks and stops after
// `warmup + measured` clocks.
struct counting_model : test::counter_model {
  using test::counter_model::counter_model;
  std::int64_t warmup = 20;
  std::int64_t measured = 200;
  float compute_gradient(const parameter_view& p, gradient_view& g) {
    if (id == 0 && clock == warmup) set_counting(true);
    if (id == 0 && clock == warmup + measured) set_counting(false);
    return test::counter_model::compute_gradient(p, g);
  }
  static void set_counting(bool on) {
    counting = on;
#ifdef EIGEN_RUNTIME_NO_MALLOC
    Eigen::internal::set_is_malloc_allowed(!on);  // Eigen asserts if it would allocate
#endif
  }
};

// 2 shards and 2 workers on one thread (local_cluster's `single` mode) or on a thread each
// (`one_per_node`), `warmup` + 200 + 40 clocks; returns the allocations counted, on every
// thread (workers' and servers' alike), in the window [warmup, warmup + 200) of worker 0's
// clocks.
template <class Transport, class Policy>
std::uint64_t count_allocations(cluster_threads threads = cluster_threads::single,
                                std::int64_t warmup = 20) {
  local_cluster<counting_model, Policy, recovery::none, optimizer::sgd, Transport> cluster(
      {.servers = 2, .workers = 2, .threads = threads},
      [warmup](std::uint32_t w) {
        counting_model m(w, 2, 1, 64);
        m.warmup = warmup;
        return m;
      },
      optimizer::sgd{1.0f});
  allocations = 0;
  const std::int64_t clocks = warmup + 200 + 40;
  const auto r = cluster.run(static_cast<std::uint64_t>(clocks));
  CHECK(r.ok());
  REQUIRE(r.models.size() == 2);
  CHECK(r.models[0].bound_violations == 0);
  CHECK(r.models[0].own_write_violations == 0);
  CHECK(r.models[0].clock == clocks);  // the counting window was inside the run
  return allocations.load();
}

}  // namespace

TEST_CASE("the allocation counter counts") {
  allocations = 0;
  counting = true;
  int* volatile p = new int(7);  // volatile: clang -O2 elides an unused new/delete pair
  counting = false;
  delete p;
  CHECK(allocations == 1);
}

TEST_CASE("push/pull path does not allocate after warm-up: in-process") {
  CHECK(count_allocations<in_process_transport, consistency::ssp<1>>() == 0);
}

TEST_CASE("push/pull path does not allocate after warm-up: TCP") {
  CHECK(count_allocations<tcp_transport, consistency::essp<1>>() == 0);
}

// Each node on its own thread, as a deployment runs them: Asio's per-thread recycling cache
// (32 slots shared by coroutine frames of several sizes) reaches its high-water mark later
// when the threads' timing varies (with a 20-clock warm-up, 1-2 frames of an async_write or a
// timer wait came from the heap in about a third of the runs), hence the longer warm-up. The
// server's waiting pulls no longer grow in the steady state (shard_core reserves them).
TEST_CASE("push/pull path does not allocate after warm-up: TCP, a thread per worker and server") {
  CHECK(count_allocations<tcp_transport, consistency::ssp<1>>(cluster_threads::one_per_node, 400) ==
        0);
}
