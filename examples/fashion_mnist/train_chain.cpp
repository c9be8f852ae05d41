// fashion_mnist — the instantiations for recovery::chain_replication, strict (see trainer.hpp),
// and the chain master process (--role master).
#include "trainer.hpp"

int fashion::train_chain(const config& c) {
  return train<asyncps::recovery::chain_replication<asyncps::recovery::chain_mode::strict>,
               asyncps::optimizer::sgd>(c);
}

namespace fashion {

/// --role master: the chain master of every shard, serving until killed.
int run_master(const config& c) {
  asio::io_context io(1);
  auto ep = asyncps::parse_tcp_endpoint(c.listen);
  if (!ep) {
    std::cerr << "fashion_mnist: --listen: expected host:port, got '" << c.listen << "'\n";
    return 2;
  }
  asyncps::tcp_transport t(asio::make_strand(io), tcp_opts(c));
  auto acc = t.listen(ep.value());
  if (!acc) {
    std::cerr << "fashion_mnist: cannot listen on " << c.listen << ": " << acc.error().message()
              << '\n';
    return 2;
  }
  asyncps::chain_master_options mo;
  mo.num_shards = c.servers;
  mo.members = c.replicas;
  asyncps::basic_chain_master<asyncps::tcp_transport> master(t, mo);
  std::cout << "chain master for " << c.servers << " shards x " << c.replicas
            << " servers listening on " << acc.value().local_endpoint() << std::endl;
  asio::co_spawn(
      t.get_executor(),
      [&, a = std::move(acc).value()]() mutable -> asio::awaitable<void> {
        (void)co_await master.async_serve(std::move(a));
      },
      asio::detached);
  io.run();
  return 0;
}

}  // namespace fashion
