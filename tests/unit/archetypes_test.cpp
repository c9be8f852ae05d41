// Archetypes: for every concept, a type that provides exactly what the concept's requirements
// table asks for (docs/concepts/*.md) and nothing more (no default constructor, no copies, no
// extra members unless a requirement needs them). The library templates are explicitly
// instantiated with them, so a template that starts using something a concept does not promise
// fails to compile here rather than in a user's build. Negative checks show that each concept
// rejects a type missing one requirement.
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <doctest/doctest.h>

#include "asyncps/consistency.hpp"
#include "asyncps/consistency/policies.hpp"
#include "asyncps/detail/worker/model_ref.hpp"
#include "asyncps/model.hpp"
#include "asyncps/optimizer.hpp"
#include "asyncps/optimizer/optimizers.hpp"
#include "asyncps/recovery.hpp"
#include "asyncps/recovery/none.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport.hpp"
#include "asyncps/transport/in_process.hpp"
#include "asyncps/transport/tcp.hpp"
#include "asyncps/worker.hpp"

namespace {

using asyncps::clock_value;
using asyncps::read_action;

/// Convertible to `float` and nothing else (for "convertible to float" requirements).
struct float_like {
  float value;
  operator float() const noexcept { return value; }
};

// ---------------------------------------------------------------------------------------------
// model (docs/concepts/model.md)
// ---------------------------------------------------------------------------------------------
struct model_archetype {
  explicit model_archetype(int) {}
  model_archetype(const model_archetype&) = delete;
  model_archetype& operator=(const model_archetype&) = delete;

  // `tables()` returns exactly std::span: basic_worker calls .begin()/.end() on the result,
  // which a type merely convertible to span lacks (reported against worker.hpp).
  std::span<const asyncps::table_spec> tables() const { return layout; }
  float_like compute_gradient(const asyncps::parameter_view&, asyncps::gradient_view& g) {
    for (auto& v : g.span(0)) v = 0.0f;
    return {0.0f};
  }

  static constexpr std::array<asyncps::table_spec, 1> layout{{{0, 4, 2, 0.0f}}};
};

// ---------------------------------------------------------------------------------------------
// optimizer_policy (docs/concepts/optimizer.md)
// ---------------------------------------------------------------------------------------------
struct optimizer_archetype {
  explicit optimizer_archetype(float lr) : learning_rate(lr) {}  // not default-constructible
  optimizer_archetype(const optimizer_archetype&) = default;
  optimizer_archetype& operator=(const optimizer_archetype&) = delete;

  static constexpr std::size_t state_per_param = 1;
  void apply(std::span<float> params, std::span<const float> grad,
             const asyncps::optimizer_state<1>& state, std::uint64_t step) const {
    for (std::size_t i = 0; i < params.size(); ++i) {
      state[0][i] += grad[i];  // accumulated gradient: the state plane is writable
      params[i] -= learning_rate * grad[i] * (step >= 1 ? 1.0f : 0.0f);
    }
  }
  float_like local_step() const { return {learning_rate}; }

  float learning_rate;
};

// ---------------------------------------------------------------------------------------------
// consistency_policy (docs/concepts/consistency.md): bounded staleness 1; `Eager` selects
// whether the server pushes subscribed rows (instantiates the server's eager path).
// ---------------------------------------------------------------------------------------------
template <bool Eager>
struct consistency_archetype {
  consistency_archetype() = default;
  consistency_archetype(const consistency_archetype&) = delete;
  consistency_archetype& operator=(const consistency_archetype&) = delete;

  static constexpr const char* name = "archetype";  // convertible to std::string_view
  static constexpr bool eager = Eager;              // must be a constant expression
  clock_value min_server_clock(clock_value c) const { return c - 1; }
  read_action on_read(clock_value c, clock_value cached, bool have) const {
    if (have && cached >= min_server_clock(c)) return read_action::read;
    return Eager && have ? read_action::wait : read_action::fetch;
  }
};

// ---------------------------------------------------------------------------------------------
// recovery_policy (docs/concepts/recovery.md): one without the optional server hooks, one with.
// ---------------------------------------------------------------------------------------------
struct worker_part_archetype {
  worker_part_archetype() = default;
  worker_part_archetype(const worker_part_archetype&) = delete;
  worker_part_archetype(worker_part_archetype&&) = default;  // configured parts are moved in
  worker_part_archetype& operator=(const worker_part_archetype&) = delete;
  asyncps::recovery_action on_server_lost(std::error_code) {
    return asyncps::recovery_action::fail;
  }
  std::chrono::seconds reconnect_timeout() const { return {}; }  // converts to milliseconds
};

struct recovery_archetype {
  static constexpr const char* name = "archetype";
  struct server_part {
    server_part() = default;
    server_part(const server_part&) = delete;
    server_part(server_part&&) = default;  // configured parts are moved in
    server_part& operator=(const server_part&) = delete;
  };
  using worker_part = worker_part_archetype;
};

struct hooked_recovery_archetype {
  static constexpr std::string_view name = "hooked archetype";
  struct server_part {
    server_part() = default;
    server_part(const server_part&) = delete;
    server_part(server_part&&) = default;  // configured parts are moved in
    server_part& operator=(const server_part&) = delete;
    // The optional hooks, with the argument types basic_server passes.
    void on_update(asyncps::table_id, std::uint64_t, std::uint32_t, std::span<const float>) {
      ++updates;
    }
    void on_clock(clock_value) { ++clocks; }
    int updates = 0;
    int clocks = 0;
  };
  using worker_part = worker_part_archetype;
};

// ---------------------------------------------------------------------------------------------
// transport, connection, acceptor (docs/concepts/transport.md): every awaitable completes at
// once with an error. The executor is io_context's own (not any_io_executor), so the templates
// must not assume a particular executor type.
// ---------------------------------------------------------------------------------------------
struct connection_archetype {
  // Default-constructible although `connection` does not require it: basic_worker declares a
  // connection per shard before connecting (reported against transport.hpp / worker.hpp).
  connection_archetype() = default;
  connection_archetype(connection_archetype&&) noexcept = default;
  connection_archetype& operator=(connection_archetype&&) noexcept = default;

  asio::awaitable<std::error_code> async_send(asyncps::message) {
    co_return asyncps::errc::connection_closed;
  }
  asio::awaitable<std::tuple<std::error_code, asyncps::message>> async_receive() {
    co_return std::tuple{make_error_code(asyncps::errc::connection_closed), asyncps::message{}};
  }
  void close() noexcept {}
  bool is_open() const { return false; }
};

struct acceptor_archetype {
  explicit acceptor_archetype(int) {}
  acceptor_archetype(acceptor_archetype&&) noexcept = default;
  acceptor_archetype& operator=(acceptor_archetype&&) noexcept = default;

  asio::awaitable<std::tuple<std::error_code, connection_archetype>> async_accept() {
    co_return std::tuple{make_error_code(asyncps::errc::stopped), connection_archetype{}};
  }
  void close() noexcept {}
};

struct endpoint_archetype {
  int id = 0;
};

class transport_archetype {
 public:
  using executor_type = asio::io_context::executor_type;
  using endpoint_type = endpoint_archetype;
  using connection_type = connection_archetype;
  using acceptor_type = acceptor_archetype;

  explicit transport_archetype(executor_type ex) : executor_(ex) {}
  transport_archetype(const transport_archetype&) = delete;
  transport_archetype& operator=(const transport_archetype&) = delete;

  executor_type get_executor() const { return executor_; }
  asyncps::result<acceptor_type> listen(const endpoint_type&) { return acceptor_type{0}; }
  asio::awaitable<std::tuple<std::error_code, connection_type>> async_connect(endpoint_type) {
    co_return std::tuple{std::make_error_code(std::errc::connection_refused), connection_type{}};
  }
  asyncps::buffer allocate(std::size_t n) { return pool_.allocate(n); }
  asyncps::wire_limits limits() const { return {}; }

 private:
  executor_type executor_;
  asyncps::buffer_pool pool_;
};

// ---------------------------------------------------------------------------------------------
// The archetypes model their concepts ...
// ---------------------------------------------------------------------------------------------
static_assert(asyncps::model<model_archetype>);
static_assert(asyncps::check_model<model_archetype>());
static_assert(asyncps::checked_model<model_archetype>);

// The optional model hooks, declared as documented, pass the checker (a wrong one is a
// compile-fail test: tests/compile_fail/model_check.cpp); so does an asynchronous model.
struct sparse_model_archetype : model_archetype {
  using model_archetype::model_archetype;
  std::span<const asyncps::row_id> touched_rows(asyncps::table_id) const { return {}; }
  std::span<const asyncps::row_id> rows_to_read(asyncps::table_id) { return {}; }
};
static_assert(asyncps::check_model<sparse_model_archetype>());
static_assert(asyncps::sparse_gradient_source<sparse_model_archetype> &&
              asyncps::sparse_read_source<sparse_model_archetype>);

struct async_model_archetype {
  std::span<const asyncps::table_spec> tables() const { return model_archetype::layout; }
  asio::awaitable<float> async_compute_gradient(const asyncps::parameter_view&,
                                                asyncps::gradient_view&) {
    co_return 0.0f;
  }
};
static_assert(asyncps::check_model<async_model_archetype>());
static_assert(asyncps::optimizer_policy<optimizer_archetype>);
static_assert(asyncps::consistency_policy<consistency_archetype<false>>);
static_assert(asyncps::consistency_policy<consistency_archetype<true>>);
static_assert(asyncps::recovery_policy<recovery_archetype>);
static_assert(asyncps::recovery_policy<hooked_recovery_archetype>);
static_assert(asyncps::connection<connection_archetype>);
static_assert(asyncps::acceptor<acceptor_archetype, connection_archetype>);
static_assert(asyncps::transport<transport_archetype>);

// ... and so do the library's types listed as models in docs/concepts/*.md.
static_assert(asyncps::transport<asyncps::tcp_transport>);
static_assert(asyncps::transport<asyncps::in_process_transport>);
static_assert(asyncps::consistency_policy<asyncps::consistency::bsp>);
static_assert(asyncps::consistency_policy<asyncps::consistency::ssp<0>>);
static_assert(asyncps::consistency_policy<asyncps::consistency::essp<2>>);
static_assert(asyncps::consistency_policy<asyncps::consistency::asp>);
static_assert(asyncps::optimizer_policy<asyncps::optimizer::sgd>);
static_assert(asyncps::optimizer_policy<asyncps::optimizer::momentum>);
static_assert(asyncps::optimizer_policy<asyncps::optimizer::adagrad>);
static_assert(asyncps::optimizer_policy<asyncps::optimizer::adam>);
static_assert(asyncps::recovery_policy<asyncps::recovery::none>);

// ---------------------------------------------------------------------------------------------
// Negative checks: each concept rejects unrelated types and a type missing one requirement.
// ---------------------------------------------------------------------------------------------
namespace missing {

using asyncps::gradient_view;
using asyncps::parameter_view;
using asyncps::table_spec;

struct model_without_gradient {
  std::span<const table_spec> tables() const;
};
struct model_without_tables {
  float compute_gradient(const parameter_view&, gradient_view&);
};
struct model_with_non_const_tables {  // `cm.tables()` must work on a const model
  std::span<const table_spec> tables();
  float compute_gradient(const parameter_view&, gradient_view&);
};
struct model_with_void_gradient {
  std::span<const table_spec> tables() const;
  void compute_gradient(const parameter_view&, gradient_view&);
};

struct optimizer_without_local_step {
  static constexpr std::size_t state_per_param = 0;
  void apply(std::span<float>, std::span<const float>, const asyncps::optimizer_state<0>&,
             std::uint64_t) const;
};
struct optimizer_with_runtime_state_count {  // `P::state_per_param` must be a constant
  static inline std::size_t state_per_param = 0;
  void apply(std::span<float>, std::span<const float>, const asyncps::optimizer_state<0>&,
             std::uint64_t) const;
  float local_step() const;
};
struct optimizer_with_mutating_apply {  // `o.apply(...)` is called on a const optimizer
  static constexpr std::size_t state_per_param = 0;
  void apply(std::span<float>, std::span<const float>, const asyncps::optimizer_state<0>&,
             std::uint64_t);
  float local_step() const;
};

struct consistency_without_eager {
  static constexpr std::string_view name = "x";
  clock_value min_server_clock(clock_value) const;
  read_action on_read(clock_value, clock_value, bool) const;
};
struct consistency_with_bool_on_read {
  static constexpr std::string_view name = "x";
  static constexpr bool eager = false;
  clock_value min_server_clock(clock_value) const;
  bool on_read(clock_value, clock_value, bool) const;
};
struct consistency_not_default_initializable {
  explicit consistency_not_default_initializable(int);
  // Never read: the concept stops at default_initializable (clang: -Wunused-const-variable).
  [[maybe_unused]] static constexpr std::string_view name = "x";
  [[maybe_unused]] static constexpr bool eager = false;
  clock_value min_server_clock(clock_value) const;
  read_action on_read(clock_value, clock_value, bool) const;
};

struct recovery_without_worker_part {
  static constexpr std::string_view name = "x";
  struct server_part {};
};
struct recovery_with_bool_on_server_lost {
  static constexpr std::string_view name = "x";
  struct server_part {};
  struct worker_part {
    bool on_server_lost(std::error_code);
    std::chrono::milliseconds reconnect_timeout() const;
  };
};

struct connection_with_throwing_close {
  asio::awaitable<std::error_code> async_send(asyncps::message);
  asio::awaitable<std::tuple<std::error_code, asyncps::message>> async_receive();
  void close();  // not noexcept
  bool is_open() const;
};
struct connection_with_plain_send {  // async_send must return exactly awaitable<error_code>
  std::error_code async_send(asyncps::message);
  asio::awaitable<std::tuple<std::error_code, asyncps::message>> async_receive();
  void close() noexcept;
  bool is_open() const;
};

struct transport_without_limits {
  using executor_type = asio::io_context::executor_type;
  using endpoint_type = endpoint_archetype;
  using connection_type = connection_archetype;
  using acceptor_type = acceptor_archetype;
  executor_type get_executor() const;
  asyncps::result<acceptor_type> listen(const endpoint_type&);
  asio::awaitable<std::tuple<std::error_code, connection_type>> async_connect(endpoint_type);
  asyncps::buffer allocate(std::size_t);
};

}  // namespace missing

static_assert(!asyncps::model<int>);
static_assert(!asyncps::model<missing::model_without_gradient>);
static_assert(!asyncps::model<missing::model_without_tables>);
static_assert(!asyncps::model<missing::model_with_non_const_tables>);
static_assert(!asyncps::model<missing::model_with_void_gradient>);

static_assert(!asyncps::optimizer_policy<int>);
static_assert(!asyncps::optimizer_policy<missing::optimizer_without_local_step>);
static_assert(!asyncps::optimizer_policy<missing::optimizer_with_runtime_state_count>);
static_assert(!asyncps::optimizer_policy<missing::optimizer_with_mutating_apply>);

static_assert(!asyncps::consistency_policy<int>);
static_assert(!asyncps::consistency_policy<missing::consistency_without_eager>);
static_assert(!asyncps::consistency_policy<missing::consistency_with_bool_on_read>);
static_assert(!asyncps::consistency_policy<missing::consistency_not_default_initializable>);

static_assert(!asyncps::recovery_policy<int>);
static_assert(!asyncps::recovery_policy<missing::recovery_without_worker_part>);
static_assert(!asyncps::recovery_policy<missing::recovery_with_bool_on_server_lost>);

static_assert(!asyncps::connection<int>);
static_assert(!asyncps::connection<missing::connection_with_throwing_close>);
static_assert(!asyncps::connection<missing::connection_with_plain_send>);
static_assert(!asyncps::acceptor<connection_archetype, connection_archetype>);
static_assert(!asyncps::acceptor<acceptor_archetype, int>);  // yields another connection type

static_assert(!asyncps::transport<int>);
static_assert(!asyncps::transport<missing::transport_without_limits>);
static_assert(!asyncps::transport<connection_archetype>);

// Concrete names for the instantiations below (and the test cases).
using server_archetype = asyncps::basic_server<transport_archetype, consistency_archetype<false>,
                                               recovery_archetype, optimizer_archetype>;
using eager_server_archetype =
    asyncps::basic_server<transport_archetype, consistency_archetype<true>,
                          hooked_recovery_archetype, optimizer_archetype>;
using worker_archetype = asyncps::basic_worker<model_archetype, transport_archetype,
                                               consistency_archetype<false>, recovery_archetype>;
using eager_worker_archetype =
    asyncps::basic_worker<model_archetype, transport_archetype, consistency_archetype<true>,
                          hooked_recovery_archetype>;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Explicit instantiation: every non-template member of the server and worker templates (the
// coroutines included) must compile against the archetypes alone.
// ---------------------------------------------------------------------------------------------
template class asyncps::basic_server<transport_archetype, consistency_archetype<false>,
                                     recovery_archetype, optimizer_archetype>;
template class asyncps::basic_server<transport_archetype, consistency_archetype<true>,
                                     hooked_recovery_archetype, optimizer_archetype>;
template class asyncps::basic_worker<model_archetype, transport_archetype,
                                     consistency_archetype<false>, recovery_archetype>;
template class asyncps::basic_worker<model_archetype, transport_archetype,
                                     consistency_archetype<true>, hooked_recovery_archetype>;

namespace {

// The invariant docs/concepts/consistency.md states for every policy: `on_read` answers `read`
// or `read_and_refresh` only when the cache exists and is at least `min_server_clock(c)` fresh.
template <class Policy>
int read_invariant_violations() {
  const Policy p{};
  int violations = 0;
  for (clock_value c = -2; c <= 12; ++c) {
    for (clock_value cached :
         {asyncps::no_clock, clock_value{-3}, clock_value{0}, c - 3, c - 2, c - 1, c, c + 1}) {
      for (bool have : {false, true}) {
        const read_action a = p.on_read(c, cached, have);
        const bool reads = a == read_action::read || a == read_action::read_and_refresh;
        if (reads && !(have && cached >= p.min_server_clock(c))) ++violations;
      }
    }
  }
  return violations;
}

// The postcondition docs/concepts/optimizer.md states: zero gradient + zero state leaves the
// parameters unchanged.
template <class Optimizer>
bool zero_gradient_is_a_no_op(const Optimizer& o) {
  constexpr std::size_t n = 6;
  std::array<float, n> params{1.0f, -2.0f, 3.5f, 0.0f, -0.25f, 8.0f};
  const auto before = params;
  const std::array<float, n> grad{};
  std::array<std::array<float, n>, 4> planes{};
  asyncps::optimizer_state<Optimizer::state_per_param> state{};
  for (std::size_t k = 0; k < Optimizer::state_per_param; ++k) state[k] = planes[k];
  o.apply(std::span<float>(params), std::span<const float>(grad), state, 1);
  return params == before;
}

}  // namespace

TEST_CASE("archetypes: consistency archetype keeps the read invariant and decides as documented") {
  CHECK(read_invariant_violations<consistency_archetype<false>>() == 0);
  CHECK(read_invariant_violations<consistency_archetype<true>>() == 0);
  // The library's policies keep it too.
  CHECK(read_invariant_violations<asyncps::consistency::bsp>() == 0);
  CHECK(read_invariant_violations<asyncps::consistency::ssp<2>>() == 0);
  CHECK(read_invariant_violations<asyncps::consistency::essp<2>>() == 0);
  CHECK(read_invariant_violations<asyncps::consistency::asp>() == 0);

  const consistency_archetype<false> lazy{};
  CHECK(lazy.min_server_clock(5) == 4);
  CHECK(lazy.on_read(5, 4, true) == read_action::read);
  CHECK(lazy.on_read(5, 3, true) == read_action::fetch);
  CHECK(lazy.on_read(5, 9, false) == read_action::fetch);  // no cache: must fetch
  const consistency_archetype<true> eager{};
  CHECK(eager.on_read(5, 3, true) == read_action::wait);  // the server will push
  CHECK(eager.on_read(5, asyncps::no_clock, false) == read_action::fetch);
  CHECK(std::string_view(consistency_archetype<true>::name) == "archetype");
}

TEST_CASE("archetypes: zero gradient leaves parameters unchanged for every optimizer") {
  CHECK(zero_gradient_is_a_no_op(optimizer_archetype{0.5f}));
  CHECK(zero_gradient_is_a_no_op(asyncps::optimizer::sgd{}));
  CHECK(zero_gradient_is_a_no_op(asyncps::optimizer::momentum{}));
  CHECK(zero_gradient_is_a_no_op(asyncps::optimizer::adagrad{}));
  CHECK(zero_gradient_is_a_no_op(asyncps::optimizer::adam{}));
}

TEST_CASE("archetypes: server and worker construct from archetypes alone") {
  asio::io_context io(1);
  transport_archetype net(io.get_executor());
  asyncps::server_options so;
  so.num_workers = 2;
  so.tables.assign(model_archetype::layout.begin(), model_archetype::layout.end());
  server_archetype server(net, so, optimizer_archetype{0.1f});
  eager_server_archetype eager_server(net, so, optimizer_archetype{0.1f});
  CHECK(server.clock() == 0);
  CHECK(server.range(0) == asyncps::key_range{0, 4});
  CHECK(server.values(0).size() == 8);
  CHECK(eager_server.connections() == 0);

  model_archetype m(0);
  worker_archetype::options_type wo;
  wo.servers = {endpoint_archetype{1}, endpoint_archetype{2}};
  worker_archetype worker(net, m, wo);
  eager_worker_archetype eager_worker(net, m, wo);
  CHECK(worker.clock() == 0);
  CHECK(worker.cache().tables().size() == 1);
  CHECK(eager_worker.stats().clocks == 0);
}

TEST_CASE("archetypes: errors from the transport archetype end the loops cleanly") {
  asio::io_context io(1);
  transport_archetype net(io.get_executor());
  asyncps::server_options so;
  so.tables.assign(model_archetype::layout.begin(), model_archetype::layout.end());
  so.log = [](std::string_view) {};
  server_archetype server(net, so, optimizer_archetype{0.1f});

  model_archetype m(0);
  worker_archetype::options_type wo;
  wo.servers = {endpoint_archetype{1}};
  wo.connect_timeout = std::chrono::milliseconds(0);  // give up after the first refusal
  wo.log = [](std::string_view) {};
  worker_archetype worker(net, m, wo);

  std::error_code served = asyncps::errc::timeout, ran = asyncps::errc::timeout;
  int finished = 0;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        auto acceptor = net.listen(endpoint_archetype{1});
        if (!acceptor) co_return;
        served = co_await server.async_serve(std::move(acceptor).value());
        ++finished;
      },
      asio::detached);
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        ran = co_await worker.async_run(3);
        ++finished;
      },
      asio::detached);
  io.run_for(std::chrono::seconds(10));
  REQUIRE(finished == 2);
  CHECK(served == asyncps::errc::stopped);  // the acceptor's error, as documented
  CHECK(ran == std::errc::connection_refused);
  CHECK(worker.clock() == 0);
  CHECK(server.stats().connections == 0);
}

namespace {

// Models of each kind, counting the calls the worker makes through its model_ref
// (detail/worker/model_ref.hpp): the worker shell is generated per kind, not per model type.
struct counted_model {
  static constexpr std::array<asyncps::table_spec, 1> layout{{{0, 4, 2, 0.0f}}};
  static constexpr std::array<asyncps::row_id, 2> rows{{1, 3}};
  mutable int calls = 0;
  std::span<const asyncps::table_spec> tables() const {
    ++calls;
    return layout;
  }
};
struct dense_model : counted_model {
  float compute_gradient(const asyncps::parameter_view&, asyncps::gradient_view&) {
    ++calls;
    return 2.5f;
  }
};
struct sparse_model : dense_model {
  std::span<const asyncps::row_id> rows_to_read(asyncps::table_id t) {
    calls += 10 * (static_cast<int>(t) + 1);
    return rows;
  }
  std::span<const asyncps::row_id> touched_rows(asyncps::table_id) const {
    calls += 100;
    return rows;
  }
};
struct async_model : counted_model {
  asio::awaitable<float> async_compute_gradient(const asyncps::parameter_view&,
                                                asyncps::gradient_view&) {
    ++calls;
    co_return 4.5f;
  }
};
struct async_double_model : counted_model {  // an awaitable of another type than float
  asio::awaitable<double> async_compute_gradient(const asyncps::parameter_view&,
                                                 asyncps::gradient_view&) {
    ++calls;
    co_return 6.5;
  }
};

template <class M>
constexpr bool same_kind = asyncps::sparse_read_source<asyncps::detail::model_ref_for<M>> ==
                               asyncps::sparse_read_source<M> &&
                           asyncps::sparse_gradient_source<asyncps::detail::model_ref_for<M>> ==
                               asyncps::sparse_gradient_source<M> &&
                           asyncps::async_gradient_source<asyncps::detail::model_ref_for<M>> ==
                               asyncps::async_gradient_source<M> &&
                           asyncps::model<asyncps::detail::model_ref_for<M>>;
static_assert(same_kind<dense_model> && same_kind<sparse_model> && same_kind<async_model> &&
              same_kind<async_double_model> && same_kind<model_archetype>);
static_assert(!asyncps::sparse_read_source<asyncps::detail::model_ref_for<dense_model>> &&
              asyncps::sparse_read_source<asyncps::detail::model_ref_for<sparse_model>> &&
              asyncps::sparse_gradient_source<asyncps::detail::model_ref_for<sparse_model>> &&
              asyncps::async_gradient_source<asyncps::detail::model_ref_for<async_model>>);
// Two model types of one kind share one shell.
static_assert(std::is_same_v<asyncps::detail::model_ref_for<dense_model>,
                             asyncps::detail::model_ref_for<model_archetype>>);

template <class M>
float awaited(asyncps::detail::model_ref_for<M> ref, const asyncps::parameter_view& p,
              asyncps::gradient_view& g) {
  asio::io_context io(1);
  float loss = -1;
  asio::co_spawn(
      io, [&]() -> asio::awaitable<void> { loss = co_await ref.async_compute_gradient(p, g); },
      asio::detached);
  io.run();
  return loss;
}

}  // namespace

TEST_CASE("archetypes: model_ref calls the model's own members and keeps its kind") {
  std::array<float, 8> values{}, grads{};
  const asyncps::parameter_view p(counted_model::layout, values.data());
  asyncps::gradient_view g(counted_model::layout, grads.data());

  sparse_model sparse;
  asyncps::detail::model_ref_for<sparse_model> sref(sparse);
  CHECK(sref.tables().data() == counted_model::layout.data());
  CHECK(sref.compute_gradient(p, g) == 2.5f);
  CHECK(sref.rows_to_read(1).data() == sparse_model::rows.data());
  CHECK(sref.touched_rows(0).size() == 2);
  CHECK(sparse.calls == 1 + 1 + 20 + 100);

  async_model am;
  CHECK(awaited<async_model>(asyncps::detail::model_ref_for<async_model>(am), p, g) == 4.5f);
  CHECK(am.calls == 1);
  async_double_model adm;
  CHECK(awaited<async_double_model>(asyncps::detail::model_ref_for<async_double_model>(adm), p,
                                    g) == 6.5f);
  CHECK(adm.calls == 1);

  dense_model dense;
  asyncps::detail::model_ref_for<dense_model> dref(dense);
  asyncps::detail::model_ref_for<dense_model> copy = dref;  // copies the reference
  CHECK(copy.compute_gradient(p, g) == 2.5f);
  CHECK(dense.calls == 1);
}
