// Step 4: your own transport under the unchanged basic_server / basic_worker.
//
// A transport is three small types (docs/concepts/transport.md): a node endpoint, a connection
// that sends and receives whole framed `asyncps::message`s, and an acceptor. This one uses Unix
// domain stream sockets and reuses only the public codec of wire.hpp and a `buffer_pool`. Then
// 1 server + 2 workers fit a linear regression with SSP; the exit status says if it converged.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/read.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/server.hpp"
#include "asyncps/worker.hpp"
#include "linear_regression.hpp"

namespace aps = asyncps;
using local = asio::local::stream_protocol;
constexpr auto no_throw = asio::experimental::as_tuple(asio::use_awaitable);  // auto [ec, ...]

class unix_transport {
 public:
  using executor_type = asio::any_io_executor;
  using endpoint_type = local::endpoint;  // a socket file path

  class connection {
   public:
    connection() = default;  // basic_worker holds one per shard before it connects
    connection(unix_transport& t, local::socket s) : net_(&t), socket_(std::move(s)) {}

    // Header + pooled payload in one gathered write (no copy). The caller set the header fields
    // type..first_row; payload_bytes and the checksum are ours to fill in.
    asio::awaitable<std::error_code> async_send(aps::message m) {
      m.header.payload_bytes = m.payload.size();
      aps::encode_header(m.header, out_, m.payload.bytes(), /*compute_checksum=*/true);
      const std::array bufs{asio::buffer(out_), asio::buffer(m.payload.data(), m.payload.size())};
      auto [ec, n] = co_await asio::async_write(socket_, bufs, no_throw);
      if (ec) close();
      co_return ec;
    }

    // Header -> validate against limits() -> payload into a pooled buffer -> checksum. A peer's
    // bad bytes never abort: this receive and every later one completes with the errc naming
    // the bad field (we cannot re-synchronise), and the server closes only this connection.
    asio::awaitable<std::tuple<std::error_code, aps::message>> async_receive() {
      aps::message m;
      if (poisoned_) co_return std::tuple{poisoned_, std::move(m)};
      auto [ec, n] = co_await asio::async_read(socket_, asio::buffer(in_), no_throw);
      if (ec) co_return std::tuple{lost(ec, n == 0), std::move(m)};
      m.header = aps::decode_header(in_);
      if ((poisoned_ = aps::validate_header(m.header, net_->limits())))
        co_return std::tuple{poisoned_, std::move(m)};
      m.payload = net_->allocate(static_cast<std::size_t>(m.header.payload_bytes));
      auto [ec2, n2] = co_await asio::async_read(
          socket_, asio::buffer(m.payload.data(), m.payload.size()), no_throw);
      if (ec2) co_return std::tuple{lost(ec2, false), aps::message{}};
      if (aps::frame_checksum(in_, m.payload.bytes()) != m.header.checksum)
        co_return std::tuple{poisoned_ = aps::errc::bad_checksum, aps::message{}};
      co_return std::tuple{std::error_code{}, std::move(m)};
    }

    void close() noexcept { socket_.close(ignored_); }  // pending operations complete aborted
    bool is_open() const noexcept { return socket_.is_open(); }

   private:
    std::error_code lost(std::error_code ec, bool at_frame_boundary) noexcept {
      close();
      if (ec != asio::error::eof) return ec;
      return at_frame_boundary ? aps::errc::connection_closed : aps::errc::truncated_frame;
    }
    unix_transport* net_ = nullptr;
    local::socket socket_{asio::system_executor{}};
    std::error_code poisoned_, ignored_;
    std::array<std::byte, aps::header_size> out_{}, in_{};
  };

  class acceptor {
   public:
    acceptor(unix_transport& t, local::acceptor a) : net_(&t), acceptor_(std::move(a)) {}
    asio::awaitable<std::tuple<std::error_code, connection>> async_accept() {
      auto [ec, s] = co_await acceptor_.async_accept(no_throw);
      co_return std::tuple{ec, ec ? connection{} : connection{*net_, std::move(s)}};
    }
    void close() noexcept { acceptor_.close(ignored_); }  // a pending accept completes aborted

   private:
    unix_transport* net_;
    local::acceptor acceptor_;
    std::error_code ignored_;
  };
  using connection_type = connection;
  using acceptor_type = acceptor;

  explicit unix_transport(executor_type ex) : executor_(std::move(ex)) {}
  unix_transport(const unix_transport&) = delete;  // connections point back at their transport
  executor_type get_executor() const noexcept { return executor_; }
  aps::wire_limits limits() const noexcept { return {}; }
  aps::buffer allocate(std::size_t bytes) { return pool_.allocate(bytes); }

  aps::result<acceptor> listen(const endpoint_type& ep) {
    local::acceptor a(executor_);
    std::error_code ec;
    if (a.open(ep.protocol(), ec); !ec) a.bind(ep, ec);
    if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return ec;
    return acceptor{*this, std::move(a)};
  }
  asio::awaitable<std::tuple<std::error_code, connection>> async_connect(endpoint_type ep) {
    local::socket s(executor_);
    auto [ec] = co_await s.async_connect(ep, no_throw);
    co_return std::tuple{ec, ec ? connection{} : connection{*this, std::move(s)}};
  }

 private:
  executor_type executor_;
  aps::buffer_pool pool_;  // must outlive every buffer it hands out
};
static_assert(aps::transport<unix_transport>);

using tutorial::linear_regression;  // the tutorial's model (linear_regression.hpp)
constexpr std::uint32_t dim = linear_regression::dim;

int main() {
  using policy = aps::consistency::ssp<2>;  // servers and workers use the same policy
  using worker_type = aps::basic_worker<linear_regression, unix_transport, policy>;
  constexpr float learning_rate = 0.05f;
  std::string dir = (std::filesystem::temp_directory_path() / "asyncps-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) return std::perror("mkdtemp"), EXIT_FAILURE;
  const local::endpoint where(dir + "/shard0.sock");

  asio::io_context io(1);  // one thread: every node's coroutines interleave on it
  unix_transport server_net(io.get_executor());  // one transport object per node
  unix_transport worker_nets[2]{unix_transport(io.get_executor()),
                                unix_transport(io.get_executor())};
  aps::server_options so;
  so.num_workers = 2;
  so.tables.assign(linear_regression::layout.begin(), linear_regression::layout.end());
  aps::basic_server<unix_transport, policy, aps::recovery::none, aps::optimizer::sgd> server(
      server_net, so, aps::optimizer::sgd{learning_rate});
  auto acceptor = server_net.listen(where);
  if (!acceptor) return std::fprintf(stderr, "%s\n", acceptor.error().message().c_str()), 1;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        co_await server.async_serve(std::move(acceptor).value());  // until server.stop()
      },
      asio::detached);

  linear_regression models[2]{linear_regression{1}, linear_regression{2}};
  std::error_code results[2];
  int running = 2;
  for (std::uint32_t id = 0; id < 2; ++id) {
    asio::co_spawn(
        io,
        [&, id]() -> asio::awaitable<void> {
          worker_type::options_type opts;
          opts.id = id;
          opts.servers = {where};           // servers[s]: where shard s listens
          opts.local_step = learning_rate;  // read-my-writes in the worker's cache (exact for SGD)
          opts.on_clock = [](const aps::clock_report& r) {  // runs after each clock
            if (r.worker == 0 && r.clock % 100 == 0)
              std::printf("clock %3d: minibatch loss %.6f\n", static_cast<int>(r.clock), r.loss);
          };
          worker_type worker(worker_nets[id], models[id], std::move(opts));
          results[id] = co_await worker.async_run(300);  // clocks
          if (--running == 0) server.stop();
        },
        asio::detached);
  }
  io.run();
  std::filesystem::remove_all(dir);

  const Eigen::Map<const Eigen::VectorXf> w(server.values(0).data(), dim);
  const float distance = (w - linear_regression::true_weights()).norm();
  const float loss =
      0.5f * (models[0].x * w - models[0].y).squaredNorm() / linear_regression::samples;
  std::printf("workers: %s, %s; loss %.6f; |w - w_true| = %.6f\n", results[0].message().c_str(),
              results[1].message().c_str(), loss, distance);
  const bool converged = !results[0] && !results[1] && distance < 0.02f;
  std::puts(converged ? "converged" : "FAILED: did not converge");
  return converged ? EXIT_SUCCESS : EXIT_FAILURE;
}
