// fashion_mnist — what starting this process's servers takes, whatever the recovery policy:
// the transports' and servers' options from the command line, and the places the servers,
// their transports and their addresses go (`server_setup`, filled by the trainer or by a
// policy that starts its servers itself, see policy_flags.hpp).
#pragma once

#include <asio/io_context.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "asyncps/asyncps.hpp"
#include "config.hpp"

namespace fashion {

/// Options of every TCP transport of this process: the run's shared secret (main.cpp loads it
/// from --secret-file or $ASYNCPS_SECRET_FILE, or makes a random one for --role all) and the
/// TLS files (--tls-cert, --tls-key, --tls-ca; none: no TLS).
inline asyncps::tcp_options tcp_opts(const config& c) {
  asyncps::tcp_options o;
  o.secret = c.secret;
  o.tls = c.tls;
  return o;
}

/// The options of the server of `shard`: the job's size, the model's tables, and under
/// --elastic the membership (--workers is then a capacity).
inline asyncps::server_options server_opts(const config& c, std::uint32_t shard,
                                           std::span<const asyncps::table_spec> layout) {
  asyncps::server_options o;
  o.shard = shard;
  o.num_shards = c.servers;
  o.num_workers = c.workers;
  o.tables.assign(layout.begin(), layout.end());
  o.seed = c.seed;
  if (c.elastic) {  // --workers is a capacity; members join and leave
    o.elastic = asyncps::membership_options{
        .start_members = c.min_workers != 0 ? c.min_workers : c.workers,
        .grace = std::chrono::milliseconds(static_cast<long long>(c.grace * 1000))};
  }
  return o;
}

using transports = std::vector<std::unique_ptr<asyncps::tcp_transport>>;

/// Where the servers of this process go as they start (all references into `run`'s locals).
/// `endpoints[s]`: where workers reach shard s first; `replicas[s]`: its other servers, in
/// failover order (empty when a shard has one server).
template <class Server>
struct server_setup {
  const config& c;
  const std::vector<asyncps::table_spec>& layout;
  asio::io_context& io;
  transports& server_transports;
  std::vector<std::unique_ptr<Server>>& servers;
  std::vector<asyncps::tcp_transport::endpoint_type>& endpoints;
  std::vector<std::vector<asyncps::tcp_transport::endpoint_type>>& replicas;
};

}  // namespace fashion
