// Proves the push/pull path allocates nothing after warm-up: a global operator new counter
// wraps a worker/server run, and the clocks after the warm-up must not touch the heap.
// The test target defines ASIO_DISABLE_STD_ALIGNED_ALLOC (so Asio's coroutine frames and
// handlers also go through the counted operator new), EIGEN_RUNTIME_NO_MALLOC (Eigen asserts
// on any allocation in the window) and ASIO_RECYCLING_ALLOCATOR_CACHE_SIZE=32 (see the
// top-level CMakeLists.txt and docs/performance.md).
#include <atomic>
#include <cstdlib>
#include <new>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <doctest/doctest.h>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/in_process.hpp"
#include "asyncps/transport/tcp.hpp"
#include "asyncps/worker.hpp"
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

template <class Transport, class Policy, class MakeTransport, class Endpoint>
std::uint64_t count_allocations(MakeTransport make, Endpoint ep0, Endpoint ep1) {
  asio::io_context io(1);
  const std::uint32_t workers = 2;
  auto st0 = make(io), st1 = make(io);
  std::vector<counting_model> models;
  for (std::uint32_t w = 0; w < workers; ++w) models.emplace_back(w, workers, 1, 64);
  server_options so;
  so.num_workers = workers;
  so.num_shards = 2;
  so.tables = {models[0].spec[0]};
  basic_server<Transport, Policy> s0(*st0, so, optimizer::sgd{1.0f});
  so.shard = 1;
  basic_server<Transport, Policy> s1(*st1, so, optimizer::sgd{1.0f});
  auto a0 = st0->listen(ep0);
  auto a1 = st1->listen(ep1);
  REQUIRE(a0.has_value());
  REQUIRE(a1.has_value());
  std::vector<Endpoint> eps{ep0, ep1};
  if constexpr (std::is_same_v<Transport, tcp_transport>) {
    eps = {a0.value().local_endpoint(), a1.value().local_endpoint()};
  }
  using worker_t = basic_worker<counting_model, Transport, Policy>;
  std::vector<std::unique_ptr<Transport>> wts;
  std::vector<std::unique_ptr<worker_t>> ws;
  for (std::uint32_t w = 0; w < workers; ++w) {
    wts.push_back(make(io));
    typename worker_t::options_type o;
    o.id = w;
    o.servers = eps;
    o.local_step = 1.0f;
    ws.push_back(std::make_unique<worker_t>(*wts.back(), models[w], o));
  }
  asio::co_spawn(io, s0.async_serve(std::move(a0).value()), asio::detached);
  asio::co_spawn(io, s1.async_serve(std::move(a1).value()), asio::detached);
  int done = 0;
  std::error_code errors[2];
  for (std::uint32_t w = 0; w < workers; ++w) {
    asio::co_spawn(
        io,
        [&, w]() -> asio::awaitable<void> {
          errors[w] = co_await ws[w]->async_run(260);
          if (++done == 2) {
            s0.stop();
            s1.stop();
          }
        },
        asio::detached);
  }
  allocations = 0;
  io.run();
  CHECK(!errors[0]);
  CHECK(!errors[1]);
  CHECK(models[0].bound_violations == 0);
  CHECK(models[0].own_write_violations == 0);
  CHECK(models[0].clock == 260);  // the counting window [20, 220) was inside the run
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
  in_process_network net;
  auto make = [&](asio::io_context& io) {
    return std::make_unique<in_process_transport>(io.get_executor(), net);
  };
  const auto n = count_allocations<in_process_transport, consistency::ssp<1>>(
      make, std::string("s0"), std::string("s1"));
  CHECK(n == 0);
}

TEST_CASE("push/pull path does not allocate after warm-up: TCP") {
  auto make = [](asio::io_context& io) {
    return std::make_unique<tcp_transport>(io.get_executor());
  };
  const asio::ip::tcp::endpoint any{asio::ip::make_address("127.0.0.1"), 0};
  const auto n = count_allocations<tcp_transport, consistency::essp<1>>(make, any, any);
  CHECK(n == 0);
}
