// fashion_mnist — chain replication's servers of this process (through
// `recovery_flags<chain_replication<M>>`, policy_flags.hpp): under --role all every member of
// every shard's chain on free loopback ports plus the chain master, under --role server one
// member of one shard's chain (--chain, --member, --master).
#pragma once

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/strand.hpp>

#include <iostream>
#include <memory>
#include <string_view>
#include <vector>

#include "asyncps/asyncps.hpp"
#include "config.hpp"
#include "server_setup.hpp"

namespace fashion {

template <class Recovery>
struct recovery_flags;  // policy_flags.hpp

// Chain replication, everything in this process: `replicas` servers per shard on free
// loopback ports and a chain master; they serve until the workers are done.
template <class Server, class Optimizer>
bool start_chain(const config& c, Optimizer opt, const std::vector<asyncps::table_spec>& layout,
                 asio::io_context& io, transports& ts,
                 std::vector<std::unique_ptr<Server>>& servers,
                 std::vector<asyncps::tcp_transport::endpoint_type>& heads,
                 std::vector<std::vector<asyncps::tcp_transport::endpoint_type>>& others,
                 std::unique_ptr<asyncps::tcp_transport>& mt,
                 std::unique_ptr<asyncps::basic_chain_master<asyncps::tcp_transport>>& master) {
  const auto loopback = asyncps::parse_tcp_endpoint("127.0.0.1:0").value();
  mt = std::make_unique<asyncps::tcp_transport>(asio::make_strand(io), tcp_opts(c));
  auto macc = mt->listen(loopback);
  if (!macc) {
    std::cerr << "fashion_mnist: chain master cannot listen: " << macc.error().message() << '\n';
    return false;
  }
  const auto master_ep = macc.value().local_endpoint();
  asyncps::chain_master_options mo;
  mo.num_shards = c.servers;
  mo.members = c.replicas;
  mo.log = [](std::string_view line) { std::cerr << line << '\n'; };
  master = std::make_unique<asyncps::basic_chain_master<asyncps::tcp_transport>>(*mt, mo);
  asio::co_spawn(
      mt->get_executor(),
      [m = master.get(), a = std::move(macc).value()]() mutable -> asio::awaitable<void> {
        (void)co_await m->async_serve(std::move(a));
      },
      asio::detached);
  for (std::uint32_t s = 0; s < c.servers; ++s) {
    std::vector<asyncps::tcp_transport::endpoint_type> eps;
    std::vector<asyncps::tcp_transport::acceptor> accs;
    for (std::uint32_t m = 0; m < c.replicas; ++m) {
      auto& t = ts.emplace_back(
          std::make_unique<asyncps::tcp_transport>(asio::make_strand(io), tcp_opts(c)));
      auto acc = t->listen(loopback);
      if (!acc) {
        std::cerr << "fashion_mnist: cannot listen: " << acc.error().message() << '\n';
        return false;
      }
      eps.push_back(acc.value().local_endpoint());
      accs.push_back(std::move(acc).value());
    }
    for (std::uint32_t m = 0; m < c.replicas; ++m) {
      auto& t = *ts[ts.size() - c.replicas + m];
      auto& srv = servers.emplace_back(std::make_unique<Server>(
          t, server_opts(c, s, layout), opt,
          recovery_flags<typename Server::recovery_type>::server_part(c, s)));
      srv->recovery().set_chain(master_ep, eps, m);
      asio::co_spawn(
          t.get_executor(),
          [p = srv.get(), a = std::move(accs[m])]() mutable -> asio::awaitable<void> {
            if (auto ec = co_await p->async_serve(std::move(a)))
              std::cerr << "server " << p->options().shard << ": " << ec.message() << '\n';
          },
          asio::detached);
    }
    heads.push_back(eps[0]);
    others.emplace_back(eps.begin() + 1, eps.end());
  }
  return true;
}

// Chain replication, --role server: one member of one shard's chain, serving until killed.
template <class Server, class Optimizer>
bool start_chain_server(const config& c, Optimizer opt,
                        const std::vector<asyncps::table_spec>& layout, asio::io_context& io,
                        transports& ts, std::vector<std::unique_ptr<Server>>& servers) {
  std::vector<asyncps::tcp_transport::endpoint_type> eps;
  for (const auto& text : c.chain) {
    auto ep = asyncps::parse_tcp_endpoint(text);
    if (!ep) {
      std::cerr << "fashion_mnist: --chain: expected host:port, got '" << text << "'\n";
      return false;
    }
    eps.push_back(ep.value());
  }
  auto master_ep = asyncps::parse_tcp_endpoint(c.master);
  auto listen_ep = asyncps::parse_tcp_endpoint(c.listen);
  if (!master_ep || !listen_ep || c.member >= eps.size()) {
    std::cerr << "fashion_mnist: --role server with chain replication needs --master host:port, "
                 "--chain host:port,... (every server of the shard) and --member < their count\n";
    return false;
  }
  auto& t =
      ts.emplace_back(std::make_unique<asyncps::tcp_transport>(asio::make_strand(io), tcp_opts(c)));
  auto acc = t->listen(listen_ep.value());
  if (!acc) {
    std::cerr << "fashion_mnist: cannot listen on " << c.listen << ": " << acc.error().message()
              << '\n';
    return false;
  }
  auto& srv = servers.emplace_back(std::make_unique<Server>(
      *t, server_opts(c, c.shard, layout), opt,
      recovery_flags<typename Server::recovery_type>::server_part(c, c.shard)));
  srv->recovery().set_chain(master_ep.value(), eps, c.member);
  const auto bound = acc.value().local_endpoint();
  asio::co_spawn(
      t->get_executor(),
      [p = srv.get(), a = std::move(acc).value()]() mutable -> asio::awaitable<void> {
        if (auto ec = co_await p->async_serve(std::move(a)))
          std::cerr << "server " << p->options().shard << ": " << ec.message() << '\n';
      },
      asio::detached);
  std::cout << "server " << c.shard << "." << c.member << " of " << c.servers << " listening on "
            << bound << std::endl;
  return true;
}
/// The trainer's companion of chain replication servers (see `server_extras` in
/// policy_flags.hpp): it starts this process's servers itself (`start_chain`,
/// `start_chain_server`) and holds the chain master of a --role all run, which it stops first
/// once the workers are done (so the master does not report the servers' exits as failures).
template <class Server>
class chain_servers {
 public:
  static constexpr bool starts_servers = true;
  explicit chain_servers(const config&) {}
  /// Starts the servers --role asks for (none for --role worker or --external-servers).
  /// False, with a line on stderr, when one cannot start.
  template <class Optimizer>
  bool start(server_setup<Server>& s, Optimizer opt) {
    if (s.c.role == "all" && !s.c.external_servers)
      return start_chain<Server>(s.c, opt, s.layout, s.io, s.server_transports, s.servers,
                                 s.endpoints, s.replicas, master_transport_, master_);
    if (s.c.role == "server")
      return start_chain_server<Server>(s.c, opt, s.layout, s.io, s.server_transports, s.servers);
    return true;
  }
  /// Once every worker of this process is done, before the servers stop.
  void stop() {
    if (master_) asio::post(master_transport_->get_executor(), [m = master_.get()] { m->stop(); });
  }

 private:
  std::unique_ptr<asyncps::tcp_transport> master_transport_;
  std::unique_ptr<asyncps::basic_chain_master<asyncps::tcp_transport>> master_;
};

}  // namespace fashion
