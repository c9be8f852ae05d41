// asyncps_bench — push / pull throughput and round-trip latency against a real server shard,
// next to the machine's raw loopback ceiling measured in the same run.
//
//   asyncps_bench [--quick] [--json FILE] [--reps N] [--seconds S] [--windows 1,16]
//                 [--transport tcp,tcp-checksum,tcp-secret,tcp-tls,in-process] [--size BYTES]
//                 [--workers N] [--op push|pull|push+pull] [--api protocol,worker] [--no-raw]
//                 [--cpu SERVER,CLIENT] [--spin-us US] [--max-update-norm N]
//                 [--max-parameter-value V] [--socket-buffer BYTES,...]
//                 [--receive-wakeup BYTES,...]
//
// Two APIs: `worker` (the headline: a real `basic_worker` training against the shard, see
// bench/worker_path.hpp; op `clock`, window W = staleness W - 1, 1 worker) and `protocol` (the
// wire protocol driven directly by bench/client.hpp, below). `--cpu S,C` pins the server's
// thread (and the raw baseline's helper thread) to CPU S and the client's thread to CPU C;
// `--spin-us N` runs both threads' io_contexts with `asyncps::run_polling` (poll N us before
// sleeping; the raw baseline still blocks). `--max-update-norm N` sets the protocol API's
// server_options::max_update_norm (0, the default: off), to measure the cost of the bound
// (docs/security.md): N large enough that no push is refused still computes every norm;
// `--max-parameter-value V` likewise sets server_options::max_parameter_value (clipping).
// `--socket-buffer B1,B2,...` runs transport `tcp` once per size, in that order, with
// `tcp_options::send_buffer_bytes` and `receive_buffer_bytes` both B at both ends (0: the
// kernel's default and autotuning, the rows named `tcp`; others `tcp-sb<size>`, e.g.
// `tcp-sb1M`), each against the same raw baseline (which keeps the kernel's default).
// `--receive-wakeup W1,W2,...` likewise for `tcp_options::receive_wakeup_bytes` (rows
// `tcp-wk<size>`, `tcp-wk0` for off, `tcp` for the default 1 MiB); with both lists, every pair
// runs (`tcp-sb4M-wk0`), socket sizes outer.
//
// Transports: `tcp` (plain, default options: frames checksum their header only),
// `tcp-checksum` (plain, `tcp_options::checksum_payloads` on at both ends: payloads hashed
// too), `tcp-secret` (the shared-secret handshake on every connection), `tcp-tls` (mutual TLS with
// certificates of a throwaway CA made at start-up, tests/support/test_pki.hpp), `in-process`;
// several, comma-separated, run one after another in the same process (docs/security.md, "Cost").
//
// Setup per (transport, value size, workers): one `basic_server<Transport, consistency::asp>`
// shard holding one table of size / 4 KiB rows x 1024 floats, running on its own thread and
// io_context; `workers` protocol clients (bench/client.hpp), each on its own connection, all
// on the main thread's io_context. Each (op, window) is run once to warm up, then `reps` times
// for `seconds` each; the figure is the median over the repetitions. See docs/performance.md.
//
// Ratios ("vs raw"): MB/s rows at window 1 against the raw request/reply of the same size
// (push, pull: `size` bytes one way and 8 back, MB/s = size / round trip; push+pull and the
// worker's clock: `size` bytes each way, MB/s = 2 size / round trip), pipelined rows against
// the raw one-way stream; round-trip rows against the raw round trip of the same shape.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include "asyncps/consistency/policies.hpp"
#include "asyncps/run_loop.hpp"
#include "asyncps/server.hpp"
#include "asyncps/transport/in_process.hpp"
#include "asyncps/transport/tcp.hpp"

#include "client.hpp"
#include "raw_baseline.hpp"
#include "report.hpp"
#include "tests/support/test_pki.hpp"
#include "worker_path.hpp"

namespace asyncps::bench {
namespace {

constexpr std::uint32_t row_width = 1024;  // floats per row: one row = 4 KiB

struct config {
  std::vector<std::size_t> sizes{std::size_t{4} << 10, std::size_t{64} << 10, std::size_t{1} << 20,
                                 std::size_t{4} << 20};
  std::vector<unsigned> workers{1, 2};
  std::vector<std::string> transports{"tcp", "in-process"};
  std::vector<std::string> apis{"protocol", "worker"};
  int server_cpu = -1;  // --cpu: pin the server (and raw helper) thread; -1: no pinning
  int client_cpu = -1;
  std::chrono::microseconds spin{0};  // --spin-us: asyncps::run_polling on both threads
  double max_update_norm = 0;         // --max-update-norm: server_options::max_update_norm (0: off)
  float max_parameter_value = 0;      // --max-parameter-value: server_options' (0: off)
  std::vector<std::size_t> socket_buffers{0};  // --socket-buffer: tcp_options' (0: kernel's)
  std::vector<std::size_t> wakeups{tcp_options{}.receive_wakeup_bytes};  // --receive-wakeup
  std::vector<op_kind> ops{op_kind::push, op_kind::pull, op_kind::push_pull};
  std::vector<unsigned> windows{1, 16};  // requests in flight per connection
  unsigned reps = 5;
  double seconds = 0.2;  // per repetition
  bool raw = true;
  bool quick = false;
  std::string json;
};

bench_clock::duration to_duration(double seconds) {
  return std::chrono::duration_cast<bench_clock::duration>(std::chrono::duration<double>(seconds));
}

// ---------------------------------------------------------------------------------------------
// Raw loopback baseline
// ---------------------------------------------------------------------------------------------
// Repetitions of the raw baseline of one size. It is measured twice, before and after the
// library runs, and the figure is the median of both sets: on this (virtualised, shared) machine
// a blocked thread sometimes takes ~40 us to wake up for seconds at a time, and one unlucky
// set would otherwise skew every ratio of that size.
struct baseline {
  std::vector<double> one_way_mbps;  // MB/s per repetition
  std::vector<double> rtt_us;        // median us per repetition (size-byte request, 8-byte reply)
  std::vector<double> exchange_us;   // median us per repetition (size bytes each way)
  std::vector<double> rtt_all, exchange_all;  // every round trip, us
};

void measure_raw(const config& cfg, std::size_t size, baseline& out) {
  raw::socket_pair pair;
  // Warm up (and calibrate the message count so that one repetition takes ~cfg.seconds).
  const std::size_t warm = std::max<std::size_t>(8, (std::size_t{16} << 20) / size);
  const int peer = cfg.server_cpu;
  const double rate = raw::one_way(pair, size, warm, peer);
  const auto count = std::max<std::size_t>(
      8, static_cast<std::size_t>(rate * cfg.seconds / static_cast<double>(size)));
  for (unsigned r = 0; r < cfg.reps; ++r)
    out.one_way_mbps.push_back(raw::one_way(pair, size, count, peer) / 1e6);

  const auto trips = [&](std::size_t reply, std::vector<double>& medians,
                         std::vector<double>& all) {
    (void)raw::round_trips(size, reply, bench_clock::now() + to_duration(cfg.seconds / 4), 8, peer);
    for (unsigned r = 0; r < cfg.reps; ++r) {
      auto us =
          raw::round_trips(size, reply, bench_clock::now() + to_duration(cfg.seconds), 8, peer);
      all.insert(all.end(), us.begin(), us.end());
      medians.push_back(median(std::move(us)));
    }
  };
  trips(8, out.rtt_us, out.rtt_all);
  trips(size, out.exchange_us, out.exchange_all);
}

// ---------------------------------------------------------------------------------------------
// Transports: a server-side and a client-side endpoint object per setup
// ---------------------------------------------------------------------------------------------
// The TCP transport in one of its modes: plain, with a shared secret, or with TLS.
struct tcp_env {
  using transport_type = tcp_transport;
  const char* name;
  tcp_transport server;
  tcp_transport client;
  tcp_env(asio::io_context& s, asio::io_context& c, const char* mode, const tcp_options& so = {},
          const tcp_options& co = {})
      : name(mode), server(s.get_executor(), so), client(c.get_executor(), co) {
    if (!server.tls_setup_error().empty() || !client.tls_setup_error().empty())
      throw std::runtime_error("TLS setup: " + server.tls_setup_error() + client.tls_setup_error());
  }
  result<tcp_transport::acceptor> listen() {
    return server.listen({asio::ip::address_v4::loopback(), 0});
  }
  static tcp_transport::endpoint_type endpoint(const tcp_transport::acceptor& a) {
    return a.local_endpoint();
  }
  static const char* name_of(const char* mode, const tcp_options& = {}, const tcp_options& = {}) {
    return mode;
  }
  std::uint64_t fresh_blocks() const {
    return server.pool().stats().fresh_blocks + client.pool().stats().fresh_blocks;
  }
};

struct in_process_env {
  using transport_type = in_process_transport;
  const char* name = "in-process";
  in_process_network net;
  in_process_transport server;
  in_process_transport client;
  in_process_env(asio::io_context& s, asio::io_context& c)
      : server(s.get_executor(), net), client(c.get_executor(), net) {}
  result<in_process_transport::acceptor> listen() { return server.listen("asyncps-bench"); }
  static std::string endpoint(const in_process_transport::acceptor&) { return "asyncps-bench"; }
  static const char* name_of() { return "in-process"; }
  std::uint64_t fresh_blocks() { return net.pool().stats().fresh_blocks; }
};

// ---------------------------------------------------------------------------------------------
// One setup: a server shard + `workers` clients; every (op, window) measured on it
// ---------------------------------------------------------------------------------------------
struct setup {
  std::size_t size = 0;
  unsigned workers = 1;
};

template <class Server, class Acceptor>
asio::awaitable<void> serve(Server& server, Acceptor acceptor) {
  if (auto ec = co_await server.async_serve(std::move(acceptor)))
    std::fprintf(stderr, "asyncps_bench: server stopped: %s\n", ec.message().c_str());
}

template <class Env>
asio::awaitable<void> drive(Env& env, typename Env::transport_type::endpoint_type ep,
                            const config& cfg, const setup& su, std::vector<row>& rows,
                            std::uint64_t& pushes) {
  using connection = typename Env::transport_type::connection_type;
  const auto rows_per_table = static_cast<std::uint32_t>(su.size / (row_width * sizeof(float)));

  // A finite gradient, written once and shared into every push of every client.
  buffer gradient = env.client.allocate(su.size);
  for (float& f : gradient.floats()) f = 1e-6f;

  std::vector<std::unique_ptr<client<connection>>> clients;
  for (unsigned w = 0; w < su.workers; ++w) {
    auto [ec, conn] = co_await env.client.async_connect(ep);
    if (ec) throw std::runtime_error("connect: " + ec.message());
    clients.push_back(std::make_unique<client<connection>>(std::move(conn), w, rows_per_table,
                                                           row_width, gradient.share()));
    co_await clients.back()->handshake(env.client.allocate(protocol::hello_bytes(1)));
  }

  const auto run_all = [&](const workload& w,
                           std::vector<worker_result>& res) -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    res.assign(clients.size(), worker_result{});
    if (clients.size() == 1) {
      co_await clients[0]->run(w, res[0]);
    } else {
      co_await (clients[0]->run(w, res[0]) && clients[1]->run(w, res[1]));
    }
    for (const auto& r : res) pushes += r.pushes;
  };

  for (op_kind op : cfg.ops) {
    for (unsigned window : cfg.windows) {
      workload w;
      w.op = op;
      w.size = su.size;
      w.window = window;
      w.min_requests = std::max(4u, 2 * window);
      w.record_latency = window == 1 && op != op_kind::push_pull;
      std::vector<worker_result> res;

      w.deadline = bench_clock::now() + to_duration(cfg.seconds / 2);  // warm-up
      co_await run_all(w, res);

      std::vector<double> mbps;
      std::vector<double> ops;
      std::vector<double> lat;
      std::vector<double> all_lat;
      for (unsigned r = 0; r < cfg.reps; ++r) {
        const auto t0 = bench_clock::now();
        w.deadline = t0 + to_duration(cfg.seconds);
        co_await run_all(w, res);
        std::uint64_t bytes = 0;
        std::uint64_t requests = 0;
        auto end = t0;
        std::vector<double> samples;
        for (const auto& x : res) {
          bytes += x.bytes;
          requests += x.requests;
          end = std::max(end, x.end);
          samples.insert(samples.end(), x.latency_us.begin(), x.latency_us.end());
        }
        const double secs = std::chrono::duration<double>(end - t0).count();
        mbps.push_back(static_cast<double>(bytes) / 1e6 / secs);
        ops.push_back(static_cast<double>(requests) / secs);
        if (w.record_latency) {
          all_lat.insert(all_lat.end(), samples.begin(), samples.end());
          lat.push_back(median(std::move(samples)));
        }
      }
      row t{env.name, op_name(op), su.size, window, su.workers, "MB/s", summarize(mbps), 0.0};
      t.ops_per_s = median(ops);
      rows.push_back(std::move(t));
      if (w.record_latency) {
        row r{env.name,       std::string(op_name(op)) + "-rtt",
              su.size,        1,
              su.workers,     "us",
              summarize(lat), 0.0};
        r.p99 = quantile(std::move(all_lat), 0.99);
        rows.push_back(std::move(r));
      }
    }
  }
  for (auto& c : clients) c->close();
}

template <class Env, class... ModeArgs>
void run_setup(const config& cfg, const setup& su, std::vector<row>& rows, ModeArgs&&... mode) {
  asio::io_context server_ctx{1};
  asio::io_context client_ctx{1};
  Env env(server_ctx, client_ctx, std::forward<ModeArgs>(mode)...);

  server_options opts;
  opts.num_workers = su.workers;
  opts.tables = {table_spec{0, static_cast<std::uint32_t>(su.size / (row_width * sizeof(float))),
                            row_width, 0.0f}};
  opts.max_update_norm = cfg.max_update_norm;
  opts.max_parameter_value = cfg.max_parameter_value;
  basic_server<typename Env::transport_type, consistency::asp> server(env.server, opts);

  auto acceptor = env.listen();
  if (!acceptor) throw std::runtime_error("listen: " + acceptor.error().message());
  const auto ep = Env::endpoint(acceptor.value());
  asio::co_spawn(server_ctx, serve(server, std::move(acceptor).value()), asio::detached);
  std::thread server_thread([&] {
    pin_current_thread(cfg.server_cpu);
    run_polling(server_ctx, cfg.spin);
  });

  std::exception_ptr failure;
  std::uint64_t pushes = 0;
  asio::co_spawn(client_ctx, drive(env, ep, cfg, su, rows, pushes),
                 [&](std::exception_ptr e) { failure = e; });
  run_polling(client_ctx, cfg.spin);

  asio::post(server_ctx, [&] { server.stop(); });
  server_thread.join();
  if (failure) std::rethrow_exception(failure);
  const server_stats& st = server.stats();
  if (st.pushes != pushes)
    throw std::runtime_error("server applied " + std::to_string(st.pushes) +
                             " pushes, clients saw " + std::to_string(pushes) + " acks");
  std::fprintf(stderr,
               "  server: %llu pushes, %llu pulls, %.0f MB in, %.0f MB out; "
               "%llu pool blocks taken from the heap\n",
               static_cast<unsigned long long>(st.pushes),
               static_cast<unsigned long long>(st.pulls), static_cast<double>(st.bytes_in) / 1e6,
               static_cast<double>(st.bytes_out) / 1e6,
               static_cast<unsigned long long>(env.fresh_blocks()));
}

// ---------------------------------------------------------------------------------------------
// Through the real worker (bench/worker_path.hpp): one worker, one shard, every window
// ---------------------------------------------------------------------------------------------
template <class Env, class... ModeArgs>
void run_worker_setup(const config& cfg, const setup& su, std::vector<row>& rows,
                      const ModeArgs&... mode) {
  const auto table_rows = static_cast<std::uint32_t>(su.size / (row_width * sizeof(float)));
  const std::vector<float> gradient(su.size / sizeof(float), 1e-6f);
  for (unsigned window : cfg.windows) {
    // Calibrate: a short run gives the time per clock, from which the measured run's clock
    // count follows (warm-up of about half a repetition, then `reps` of `seconds` each).
    const std::uint64_t probe_clocks = 24;
    const auto probe = run_worker_path<Env>(table_rows, window, probe_clocks, 1, gradient,
                                            cfg.server_cpu, cfg.spin, mode...);
    const double clock_s = std::max(1e-6, median(probe.all_clock_us) * 1e-6);
    const auto per_rep =
        std::max<std::uint64_t>(8, static_cast<std::uint64_t>(cfg.seconds / clock_s));
    const std::uint64_t measured = per_rep * cfg.reps;
    const std::uint64_t clocks = measured + std::max<std::uint64_t>(measured / 9, 4);
    const auto res = run_worker_path<Env>(table_rows, window, clocks, cfg.reps, gradient,
                                          cfg.server_cpu, cfg.spin, mode...);
    const char* name = Env::name_of(mode...);
    row r{name, "clock", su.size, window, 1, "MB/s", summarize(res.mbps), 0.0};
    r.api = "worker";
    r.ops_per_s = median(res.clocks_per_s);
    r.server_ns_per_byte = res.bytes > 0 ? res.server_cpu_s * 1e9 / res.bytes : 0.0;
    r.client_ns_per_byte = res.bytes > 0 ? res.client_cpu_s * 1e9 / res.bytes : 0.0;
    rows.push_back(r);
    std::fprintf(stderr,
                 "  worker window %u: %llu clocks, %.0f MB, snapshot + model's gradient %.1f us "
                 "per clock, CPU s: server %.3f, worker %.3f\n",
                 window, static_cast<unsigned long long>(res.clocks), res.bytes / 1e6,
                 res.compute_s * 1e6 / static_cast<double>(res.clocks), res.server_cpu_s,
                 res.client_cpu_s);
    if (window != 1) continue;  // pipelined: clocks overlap, their time is no round trip
    r.op = "clock-rtt";
    r.unit = "us";
    r.ops_per_s = 0;
    r.value = summarize(res.clock_us);
    r.p99 = quantile(res.all_clock_us, 0.99);
    rows.push_back(r);
  }
}

// ---------------------------------------------------------------------------------------------
// Command line, ordering, output
// ---------------------------------------------------------------------------------------------
[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "asyncps_bench: %s\n"
               "usage: asyncps_bench [--quick] [--json FILE] [--reps N] [--seconds S]\n"
               "                     [--windows 1,16] [--size BYTES] [--workers N]\n"
               "                     [--transport tcp,tcp-checksum,tcp-secret,tcp-tls,in-process]\n"
               "                     [--op push|pull|push+pull] [--api protocol,worker]\n"
               "                     [--cpu SERVER,CLIENT] [--spin-us US] [--no-raw]\n"
               "                     [--max-update-norm N] [--max-parameter-value V]\n"
               "                     [--socket-buffer BYTES,...] [--receive-wakeup BYTES,...]\n",
               msg);
  std::exit(2);
}

config parse(int argc, char** argv) {
  config cfg;
  std::optional<unsigned> reps;
  std::optional<double> seconds;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value");
      return argv[++i];
    };
    if (a == "--quick") {
      cfg.quick = true;
    } else if (a == "--json") {
      cfg.json = value();
    } else if (a == "--reps") {
      reps = static_cast<unsigned>(std::stoul(value()));
    } else if (a == "--seconds") {
      seconds = std::stod(value());
    } else if (a == "--windows") {
      cfg.windows.clear();
      const std::string v = value();
      for (std::size_t pos = 0; pos < v.size();) {
        const std::size_t comma = std::min(v.find(',', pos), v.size());
        cfg.windows.push_back(static_cast<unsigned>(std::stoul(v.substr(pos, comma - pos))));
        pos = comma + 1;
      }
    } else if (a == "--transport") {
      cfg.transports.clear();
      const std::string v = value();
      for (std::size_t pos = 0; pos <= v.size();) {
        const std::size_t comma = std::min(v.find(',', pos), v.size());
        const std::string t = v.substr(pos, comma - pos);
        if (t != "tcp" && t != "tcp-checksum" && t != "tcp-secret" && t != "tcp-tls" &&
            t != "in-process")
          usage("--transport takes tcp, tcp-checksum, tcp-secret, tcp-tls or in-process "
                "(comma-separated)");
        cfg.transports.push_back(t);
        pos = comma + 1;
      }
    } else if (a == "--size") {
      cfg.sizes = {static_cast<std::size_t>(std::stoull(value()))};
      if (cfg.sizes[0] == 0 || cfg.sizes[0] % (row_width * sizeof(float)) != 0)
        usage("--size must be a positive multiple of 4096");
    } else if (a == "--workers") {
      cfg.workers = {static_cast<unsigned>(std::stoul(value()))};
      if (cfg.workers[0] != 1 && cfg.workers[0] != 2) usage("--workers takes 1 or 2");
    } else if (a == "--op") {
      const std::string v = value();
      if (v == "push") {
        cfg.ops = {op_kind::push};
      } else if (v == "pull") {
        cfg.ops = {op_kind::pull};
      } else if (v == "push+pull") {
        cfg.ops = {op_kind::push_pull};
      } else {
        usage("--op takes push, pull or push+pull");
      }
    } else if (a == "--api") {
      cfg.apis.clear();
      const std::string v = value();
      for (std::size_t pos = 0; pos <= v.size();) {
        const std::size_t comma = std::min(v.find(',', pos), v.size());
        const std::string t = v.substr(pos, comma - pos);
        if (t != "protocol" && t != "worker")
          usage("--api takes protocol, worker or both (comma-separated)");
        cfg.apis.push_back(t);
        pos = comma + 1;
      }
    } else if (a == "--cpu") {
      const std::string v = value();
      const std::size_t comma = v.find(',');
      if (comma == std::string::npos) usage("--cpu takes SERVER,CLIENT (two CPU numbers)");
      cfg.server_cpu = std::stoi(v.substr(0, comma));
      cfg.client_cpu = std::stoi(v.substr(comma + 1));
      if (cfg.server_cpu < 0 || cfg.client_cpu < 0) usage("--cpu takes CPU numbers >= 0");
    } else if (a == "--spin-us") {
      const long us = std::stol(value());
      if (us < 0) usage("--spin-us takes microseconds >= 0");
      cfg.spin = std::chrono::microseconds(us);
    } else if (a == "--max-update-norm") {
      cfg.max_update_norm = std::stod(value());
      if (!(cfg.max_update_norm >= 0)) usage("--max-update-norm takes a norm >= 0 (0: off)");
    } else if (a == "--max-parameter-value") {
      cfg.max_parameter_value = std::stof(value());
      if (!(cfg.max_parameter_value >= 0)) usage("--max-parameter-value takes a value >= 0");
    } else if (a == "--socket-buffer" || a == "--receive-wakeup") {
      auto& list = a == "--socket-buffer" ? cfg.socket_buffers : cfg.wakeups;
      list.clear();
      const std::string v = value();
      for (std::size_t pos = 0; pos <= v.size();) {
        const std::size_t comma = std::min(v.find(',', pos), v.size());
        const auto b = static_cast<std::size_t>(std::stoull(v.substr(pos, comma - pos)));
        if (b > tcp_options::max_socket_buffer_bytes)
          usage("--socket-buffer and --receive-wakeup take sizes in bytes up to 256 MiB (0: the "
                "kernel's default, off)");
        list.push_back(b);
        pos = comma + 1;
      }
    } else if (a == "--no-raw") {
      cfg.raw = false;
    } else if (a == "--help" || a == "-h") {
      usage("help");
    } else {
      usage(("unknown argument " + std::string(a)).c_str());
    }
  }
  if (cfg.quick) {
    cfg.reps = 3;
    cfg.seconds = 0.02;
  }
  if (reps) cfg.reps = *reps;
  if (seconds) cfg.seconds = *seconds;
  if (cfg.reps == 0 || cfg.seconds <= 0 || cfg.windows.empty() ||
      std::count(cfg.windows.begin(), cfg.windows.end(), 0u) != 0)
    usage("--reps must be > 0, --seconds > 0 and --windows a list of numbers >= 1");
  return cfg;
}

// The row name of transport `tcp` with socket buffers of `sb` bytes and `receive_wakeup_bytes`
// `wk` (`tcp` for the defaults; `-wk0`: wake-ups off).
std::string variant_name(std::size_t sb, std::size_t wk) {
  const auto text = [](std::size_t bytes) {
    if (bytes % (std::size_t{1} << 20) == 0) return std::to_string(bytes >> 20) + "M";
    if (bytes % 1024 == 0) return std::to_string(bytes >> 10) + "K";
    return std::to_string(bytes);
  };
  std::string name = "tcp";
  if (sb != 0) name += "-sb" + text(sb);
  if (wk != tcp_options{}.receive_wakeup_bytes) name += "-wk" + (wk == 0 ? "0" : text(wk));
  return name;
}

int rank_transport(const std::string& t) {
  if (t.starts_with("tcp-sb") || t.starts_with("tcp-wk")) return 1;  // with `tcp`, as run
  static const char* order[] = {"raw-tcp",    "tcp",     "tcp-checksum",
                                "tcp-secret", "tcp-tls", "in-process"};
  for (int i = 0; i < 6; ++i)
    if (t == order[i]) return i;
  return 6;
}
int rank_op(const std::string& op) {
  static const char* order[] = {"one-way",      "req-reply", "exchange",  "rtt",
                                "exchange-rtt", "clock",     "clock-rtt", "push",
                                "pull",         "push+pull", "push-rtt",  "pull-rtt"};
  for (int i = 0; i < 12; ++i)
    if (op == order[i]) return i;
  return 12;
}
int rank_api(const std::string& api) { return api == "raw" ? 0 : api == "worker" ? 1 : 2; }

int run(int argc, char** argv) {
  const config cfg = parse(argc, argv);
  (void)pin_current_thread(cfg.client_cpu);  // a refusal is printed; the run goes on unpinned
  const auto started = bench_clock::now();
  const double load_before = load_average();
  std::vector<row> rows;

  std::vector<baseline> raw(cfg.sizes.size());
  const auto measure_all_raw = [&](const char* when) {
    if (!cfg.raw) return;
    for (std::size_t i = 0; i < cfg.sizes.size(); ++i) {
      std::fprintf(stderr, "raw baseline (%s), %s\n", when, size_text(cfg.sizes[i]).c_str());
      measure_raw(cfg, cfg.sizes[i], raw[i]);
    }
  };
  // tcp-secret: one random secret for both ends; tcp-tls: a throwaway CA and a certificate
  // for each end (files in a temporary directory, removed at the end).
  tcp_options checksum_opts;
  checksum_opts.checksum_payloads = true;
  tcp_options secret_opts;
  secret_opts.secret = shared_secret::random().value();
  std::optional<test::test_pki> pki;
  std::vector<std::string> buffer_names;  // per --socket-buffer size (stable: rows keep copies)
  std::vector<tcp_options> buffer_opts;
  for (std::size_t b : cfg.socket_buffers) {
    for (std::size_t w : cfg.wakeups) {
      buffer_names.push_back(variant_name(b, w));
      tcp_options o;
      o.send_buffer_bytes = b;
      o.receive_buffer_bytes = b;
      o.receive_wakeup_bytes = w;
      buffer_opts.push_back(o);
    }
  }
  tcp_options tls_server_opts, tls_client_opts;
  if (std::find(cfg.transports.begin(), cfg.transports.end(), "tcp-tls") != cfg.transports.end()) {
    pki.emplace("bench");
    tls_server_opts.tls = pki->issue("server");
    tls_client_opts.tls = pki->issue("client");
  }

  measure_all_raw("before");
  for (const auto& t : cfg.transports) {
    for (std::size_t i = 0; i < cfg.sizes.size(); ++i) {
      if (std::find(cfg.apis.begin(), cfg.apis.end(), "worker") != cfg.apis.end()) {
        std::fprintf(stderr, "%s, %s, through basic_worker\n", t.c_str(),
                     size_text(cfg.sizes[i]).c_str());
        const setup su{cfg.sizes[i], 1};
        if (t == "tcp") {
          for (std::size_t k = 0; k < buffer_opts.size(); ++k) {
            if (buffer_opts.size() > 1) std::fprintf(stderr, "  %s\n", buffer_names[k].c_str());
            run_worker_setup<tcp_env>(cfg, su, rows, buffer_names[k].c_str(), buffer_opts[k],
                                      buffer_opts[k]);
          }
        } else if (t == "tcp-checksum") {
          run_worker_setup<tcp_env>(cfg, su, rows, "tcp-checksum", checksum_opts, checksum_opts);
        } else if (t == "tcp-secret") {
          run_worker_setup<tcp_env>(cfg, su, rows, "tcp-secret", secret_opts, secret_opts);
        } else if (t == "tcp-tls") {
          run_worker_setup<tcp_env>(cfg, su, rows, "tcp-tls", tls_server_opts, tls_client_opts);
        } else {
          run_worker_setup<in_process_env>(cfg, su, rows);
        }
      }
      if (std::find(cfg.apis.begin(), cfg.apis.end(), "protocol") == cfg.apis.end()) continue;
      for (unsigned workers : cfg.workers) {
        std::fprintf(stderr, "%s, %s, %u worker(s)\n", t.c_str(), size_text(cfg.sizes[i]).c_str(),
                     workers);
        const setup su{cfg.sizes[i], workers};
        if (t == "tcp") {
          for (std::size_t k = 0; k < buffer_opts.size(); ++k) {
            if (buffer_opts.size() > 1) std::fprintf(stderr, "  %s\n", buffer_names[k].c_str());
            run_setup<tcp_env>(cfg, su, rows, buffer_names[k].c_str(), buffer_opts[k],
                               buffer_opts[k]);
          }
        } else if (t == "tcp-checksum") {
          run_setup<tcp_env>(cfg, su, rows, "tcp-checksum", checksum_opts, checksum_opts);
        } else if (t == "tcp-secret") {
          run_setup<tcp_env>(cfg, su, rows, "tcp-secret", secret_opts, secret_opts);
        } else if (t == "tcp-tls") {
          run_setup<tcp_env>(cfg, su, rows, "tcp-tls", tls_server_opts, tls_client_opts);
        } else {
          run_setup<in_process_env>(cfg, su, rows);
        }
      }
    }
  }

  measure_all_raw("after");

  // Ratios to the raw baseline of the same size and shape (see the file comment).
  if (cfg.raw) {
    for (std::size_t i = 0; i < cfg.sizes.size(); ++i) {
      const baseline& b = raw[i];
      const double size = static_cast<double>(cfg.sizes[i]);
      std::vector<double> req_reply, exchange;
      for (double us : b.rtt_us) req_reply.push_back(size / us);  // bytes/us = MB/s
      for (double us : b.exchange_us) exchange.push_back(2 * size / us);
      const auto raw_row = [&](const char* op, const char* unit, const std::vector<double>& v,
                               const std::vector<double>* all) {
        row r{"raw-tcp", op, cfg.sizes[i], 1, 1, unit, summarize(v), 1.0};
        r.api = "raw";
        // Messages (one-way), requests (req-reply) or exchanges per second.
        if (r.unit == "MB/s")
          r.ops_per_s = r.value.median * 1e6 / (r.op == "exchange" ? 2 * size : size);
        if (all != nullptr) r.p99 = quantile(*all, 0.99);
        rows.push_back(std::move(r));
      };
      raw_row("one-way", "MB/s", b.one_way_mbps, nullptr);
      raw_row("req-reply", "MB/s", req_reply, nullptr);
      raw_row("exchange", "MB/s", exchange, nullptr);
      raw_row("rtt", "us", b.rtt_us, &b.rtt_all);
      raw_row("exchange-rtt", "us", b.exchange_us, &b.exchange_all);
    }
    for (auto& r : rows) {
      if (r.api == "raw") continue;
      const auto i = static_cast<std::size_t>(
          std::find(cfg.sizes.begin(), cfg.sizes.end(), r.size) - cfg.sizes.begin());
      const baseline& b = raw[i];
      const double size = static_cast<double>(r.size);
      // Both directions carry `size` bytes: the push+pull alternation and the worker's clock.
      const bool both_ways = r.op == "push+pull" || r.op == "clock" || r.op == "clock-rtt";
      double base = 0;
      if (r.unit == "us") {
        base = median(both_ways ? b.exchange_us : b.rtt_us);
      } else if (r.window == 1) {
        const double us = median(both_ways ? b.exchange_us : b.rtt_us);
        base = us > 0 ? (both_ways ? 2 : 1) * size / us : 0.0;
      } else {
        base = median(b.one_way_mbps);
      }
      r.ratio = base > 0.0 ? r.value.median / base : 0.0;
    }
  }

  std::stable_sort(rows.begin(), rows.end(), [](const row& a, const row& b) {
    const auto key = [](const row& r) {
      return std::tuple{
          rank_api(r.api), rank_transport(r.transport), rank_op(r.op), r.size, r.window, r.workers};
    };
    return key(a) < key(b);
  });
  const double elapsed = std::chrono::duration<double>(bench_clock::now() - started).count();
  std::string windows;
  for (unsigned w : cfg.windows) windows += (windows.empty() ? "" : ",") + std::to_string(w);
  const double load_after = load_average();
  std::printf("asyncps_bench: %u repetitions x %.2f s per figure, windows %s, %u hardware "
              "threads, %.0f s in all, load average %.2f before / %.2f after\n",
              cfg.reps, cfg.seconds, windows.c_str(), std::thread::hardware_concurrency(), elapsed,
              load_before, load_after);
  std::printf("MB/s = 1e6 payload bytes/s; vs raw = median / raw-tcp of the same size and shape "
              "(window 1: req-reply, or exchange\nwhen both directions carry the size; "
              "pipelined: one-way; us: rtt or exchange-rtt); p99 over every sample;\ncpu ns/B = "
              "CPU ns of the server (s) and client (c) threads per payload byte; raw-tcp = medians "
              "over %u\nrepetitions before and %u after the library runs; worker: window W = "
              "ssp staleness W - 1 (1 = BSP)\n\n",
              cfg.reps, cfg.reps);
  print_table_header();
  for (const auto& r : rows) print_row(r);

  if (!cfg.json.empty()) {
    std::string buffers, wakeups;
    for (std::size_t b : cfg.socket_buffers)
      buffers += (buffers.empty() ? "" : ",") + std::to_string(b);
    for (std::size_t w : cfg.wakeups) wakeups += (wakeups.empty() ? "" : ",") + std::to_string(w);
    char meta[600];
    std::snprintf(
        meta, sizeof meta,
        "{\"reps\": %u, \"seconds\": %.3f, \"windows\": [%s], "
        "\"hardware_threads\": %u, \"quick\": %s, \"elapsed_s\": %.1f, "
        "\"load_before\": %.2f, \"load_after\": %.2f, \"server_cpu\": %d, "
        "\"client_cpu\": %d, \"spin_us\": %lld, \"max_update_norm\": %g, "
        "\"max_parameter_value\": %g, \"socket_buffers\": [%s], \"receive_wakeups\": [%s]}",
        cfg.reps, cfg.seconds, windows.c_str(), std::thread::hardware_concurrency(),
        cfg.quick ? "true" : "false", elapsed, load_before, load_after, cfg.server_cpu,
        cfg.client_cpu, static_cast<long long>(cfg.spin.count()), cfg.max_update_norm,
        static_cast<double>(cfg.max_parameter_value), buffers.c_str(), wakeups.c_str());
    if (!write_json(cfg.json, rows, meta)) {
      std::fprintf(stderr, "asyncps_bench: cannot write %s\n", cfg.json.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace asyncps::bench

int main(int argc, char** argv) {
  try {
    return asyncps::bench::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "asyncps_bench: %s\n", e.what());
    return 1;
  }
}
