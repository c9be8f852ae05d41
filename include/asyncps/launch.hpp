// asyncps — launch.hpp: what the cluster launcher that started this process says about it.
//
// Jobs are started by the launchers people already use, and each one describes the process in
// environment variables of its own. `read_launch_environment` reads them into one
// `launch_environment`; `plan_launch` turns that (and the number of servers the user wants)
// into this process's role, index and the address of the job's rendezvous
// (asyncps/rendezvous.hpp), where servers publish their addresses and workers look them up.
//
//   launcher   detected by            rank / size                        rendezvous host:port
//   ---------  ---------------------  ---------------------------------
//   --------------------------------- DMLC       DMLC_ROLE              none: the rendezvous
//   assigns ids;  DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT (ps-lite, DMLC_NUM_SERVER, DMLC_NUM_WORKER;
//    BytePS)                          DMLC_ROLE server|worker|scheduler
//   torchrun   RANK and WORLD_SIZE    RANK, WORLD_SIZE                   MASTER_ADDR:MASTER_PORT
//   Open MPI   OMPI_COMM_WORLD_RANK   OMPI_COMM_WORLD_RANK, _SIZE        127.0.0.1 when every rank
//   runs on one
//                                                                        host; the port from the
//                                                                        job id
//   Slurm      SLURM_PROCID           SLURM_PROCID, SLURM_NTASKS         the first host of
//   SLURM_STEP_NODELIST
//                                                                        (else SLURM_JOB_NODELIST);
//                                                                        the port from the job id
//
// Checked in this order (mpirun and torchrun inside a Slurm allocation see Slurm's variables
// too; their own ranks win). `ASYNCPS_RENDEZVOUS=host:port` overrides the rendezvous address
// of every launcher (needed for Open MPI across hosts: it does not say where rank 0 runs).
// A port derived from a job id is `derived_rendezvous_port(job id)`: 20000 + (FNV-1a of the id
// mod 10000), below Linux's ephemeral range, the same in every process of the job.
//
// With a rank (all but DMLC), ranks [0, servers) are servers (rank r serves shard r) and ranks
// [servers, world size) are workers (rank r is worker r - servers); rank 0 also runs the
// rendezvous. Under DMLC the scheduler runs the rendezvous, which hands out shard and worker
// indices in arrival order, as ps-lite's scheduler does.
//
// Nothing here reads a variable the caller did not ask for through `getenv`: pass a lookup
// function to test or to override. No Asio; no allocation beyond the strings returned.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "asyncps/error.hpp"
#include "asyncps/result.hpp"

namespace asyncps {

/// The launcher that started this process.
enum class launcher : std::uint8_t {
  none,      ///< no launcher variables: the program's flags say everything
  slurm,     ///< srun (SLURM_PROCID, SLURM_NTASKS, SLURM_STEP_NODELIST, SLURM_JOB_ID)
  open_mpi,  ///< mpirun (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, ...)
  torchrun,  ///< torchrun / torch.distributed (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
  dmlc,      ///< ps-lite / BytePS (DMLC_ROLE, DMLC_PS_ROOT_URI, DMLC_NUM_SERVER, ...)
};

/// The launcher's name as this header's table writes it: "none", "slurm", "open-mpi",
/// "torchrun", "dmlc".
constexpr std::string_view to_string(launcher l) noexcept {
  switch (l) {
    case launcher::slurm: return "slurm";
    case launcher::open_mpi: return "open-mpi";
    case launcher::torchrun: return "torchrun";
    case launcher::dmlc: return "dmlc";
    case launcher::none: break;
  }
  return "none";
}

/// What a process does in a job.
enum class node_role : std::uint8_t {
  unspecified,  ///< the launcher does not say (rank launchers: `plan_launch` decides by rank)
  server,       ///< a parameter server (one shard)
  worker,       ///< a worker
  scheduler,    ///< DMLC's scheduler: runs only the rendezvous
};

/// "unspecified", "server", "worker" or "scheduler".
constexpr std::string_view to_string(node_role r) noexcept {
  switch (r) {
    case node_role::server: return "server";
    case node_role::worker: return "worker";
    case node_role::scheduler: return "scheduler";
    case node_role::unspecified: break;
  }
  return "unspecified";
}

/// What the launcher's environment says about this process (`read_launch_environment`).
struct launch_environment {
  launcher source = launcher::none;
  /// This process's rank in [0, world_size) (every launcher but DMLC).
  std::optional<std::uint32_t> rank{};
  /// Processes in the job (every launcher but DMLC).
  std::optional<std::uint32_t> world_size{};
  /// DMLC_ROLE; `unspecified` for the rank launchers.
  node_role role = node_role::unspecified;
  std::optional<std::uint32_t> num_servers{};  ///< DMLC_NUM_SERVER
  std::optional<std::uint32_t> num_workers{};  ///< DMLC_NUM_WORKER
  /// The rendezvous host (a name or an address literal), empty when the launcher does not say
  /// (Open MPI across hosts, without ASYNCPS_RENDEZVOUS).
  std::string rendezvous_host{};
  /// The rendezvous port, 0 when unknown.
  std::uint16_t rendezvous_port = 0;
  /// The launcher's job identifier (SLURM_JOB_ID[.SLURM_STEP_ID], Open MPI's job id, or empty).
  std::string job_id{};
  /// Where the rendezvous address came from, for messages: e.g. "MASTER_ADDR:MASTER_PORT".
  std::string rendezvous_source{};
};

/// This process's place in the job (`plan_launch`).
struct launch_plan {
  node_role role = node_role::unspecified;
  /// The shard (servers) or worker id (workers); unset when the rendezvous assigns it (DMLC).
  std::optional<std::uint32_t> index{};
  std::uint32_t num_servers = 0;  ///< shards in the job
  std::uint32_t num_workers = 0;  ///< workers in the job
  /// Whether this process runs the rendezvous service (rank 0, or DMLC's scheduler).
  bool runs_rendezvous = false;
  std::string rendezvous_host{};  ///< from `launch_environment`
  std::uint16_t rendezvous_port = 0;
};

/// The rendezvous port a job derives from its id when the launcher names none: 20000 + (the
/// 32-bit FNV-1a hash of `job_id` mod 10000), so in [20000, 30000), below Linux's ephemeral
/// port range. Thread safety: pure.
constexpr std::uint16_t derived_rendezvous_port(std::string_view job_id) noexcept {
  std::uint32_t h = 2166136261u;
  for (const char ch : job_id) {
    h ^= static_cast<unsigned char>(ch);
    h *= 16777619u;
  }
  return static_cast<std::uint16_t>(20000 + h % 10000);
}

/// The first host name of a Slurm host list such as "node[07-09,12],gpu1" ("node07"),
/// "rack[1-2]-n[01-04]" ("rack1-n01") or "login" ("login"); zero padding is kept. Returns an
/// empty string for an empty or malformed list (an unclosed '['). Thread safety: pure.
inline std::string first_slurm_host(std::string_view list) {
  std::string out;
  std::size_t i = 0;
  while (i < list.size() && list[i] != ',') {
    if (list[i] != '[') {
      out += list[i++];
      continue;
    }
    const auto close = list.find(']', i);
    if (close == std::string_view::npos) return {};
    // The first element of the bracket: up to the first '-' or ','.
    std::size_t j = i + 1;
    while (j < close && list[j] != '-' && list[j] != ',') out += list[j++];
    i = close + 1;
  }
  return out;
}

namespace detail {

/// Parses a whole decimal u32; nullopt on anything else.
inline std::optional<std::uint32_t> parse_u32(std::string_view text) {
  std::uint32_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return v;
}

}  // namespace detail

/// Reads the environment of the launcher that started this process (the table at the top of
/// this header) through `getenv` (a callable `const char*(const char* name)`, default
/// `std::getenv`; a null result means unset).
///
/// Returns `launcher::none` (and nothing else set) when no launcher's variables are present.
/// Errors: `errc::invalid_argument`, with `why` set to one line naming the variable and its
/// value, when a variable the launcher always sets is missing or malformed (a rank that is not
/// a number or not below the size, a DMLC_ROLE other than server|worker|scheduler, a port that
/// is not in [1, 65535], an ASYNCPS_RENDEZVOUS that is not host:port). `why` is left as it is
/// on success. Thread safety: as safe as `getenv` (call it at start-up).
template <class Getenv = char* (*)(const char*)>
result<launch_environment> read_launch_environment(std::string& why, Getenv getenv = std::getenv) {
  const auto get = [&](const char* name) -> std::optional<std::string_view> {
    const char* v = getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string_view(v);
  };
  const auto fail = [&](std::string line) -> result<launch_environment> {
    why = std::move(line);
    return make_error_code(errc::invalid_argument);
  };
  // A u32 variable the launcher must set.
  std::string bad;
  const auto number = [&](const char* name) -> std::optional<std::uint32_t> {
    const auto v = get(name);
    if (!v) {
      bad = std::string(name) + " is not set";
      return std::nullopt;
    }
    auto n = detail::parse_u32(*v);
    if (!n) bad = std::string(name) + "='" + std::string(*v) + "' is not a number";
    return n;
  };
  const auto port_of = [&](const char* name) -> std::optional<std::uint16_t> {
    const auto v = get(name);
    const auto n = v ? detail::parse_u32(*v) : std::nullopt;
    if (!n || *n == 0 || *n > 65535) {
      bad = std::string(name) + (v ? "='" + std::string(*v) + "'" : std::string(" is not set")) +
            (v ? " is not a port in [1, 65535]" : "");
      return std::nullopt;
    }
    return static_cast<std::uint16_t>(*n);
  };

  launch_environment env;
  if (const auto role = get("DMLC_ROLE")) {
    env.source = launcher::dmlc;
    if (*role == "server")
      env.role = node_role::server;
    else if (*role == "worker")
      env.role = node_role::worker;
    else if (*role == "scheduler")
      env.role = node_role::scheduler;
    else
      return fail("DMLC_ROLE='" + std::string(*role) + "' is not server, worker or scheduler");
    env.num_servers = number("DMLC_NUM_SERVER");
    if (!env.num_servers) return fail(bad);
    env.num_workers = number("DMLC_NUM_WORKER");
    if (!env.num_workers) return fail(bad);
    if (*env.num_servers == 0 || *env.num_workers == 0)
      return fail("DMLC_NUM_SERVER and DMLC_NUM_WORKER must be at least 1 (they are " +
                  std::to_string(*env.num_servers) + " and " + std::to_string(*env.num_workers) +
                  ")");
    const auto uri = get("DMLC_PS_ROOT_URI");
    if (!uri || uri->empty()) return fail("DMLC_PS_ROOT_URI is not set");
    const auto port = port_of("DMLC_PS_ROOT_PORT");
    if (!port) return fail(bad);
    env.rendezvous_host = std::string(*uri);
    env.rendezvous_port = *port;
    env.rendezvous_source = "DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT";
  } else if (get("RANK") && get("WORLD_SIZE")) {
    env.source = launcher::torchrun;
    env.rank = number("RANK");
    if (!env.rank) return fail(bad);
    env.world_size = number("WORLD_SIZE");
    if (!env.world_size) return fail(bad);
    const auto addr = get("MASTER_ADDR");
    if (!addr || addr->empty()) return fail("MASTER_ADDR is not set (torchrun sets it)");
    const auto port = port_of("MASTER_PORT");
    if (!port) return fail(bad);
    env.rendezvous_host = std::string(*addr);
    env.rendezvous_port = *port;
    env.rendezvous_source = "MASTER_ADDR:MASTER_PORT";
    if (const auto id = get("TORCHELASTIC_RUN_ID")) env.job_id = std::string(*id);
  } else if (get("OMPI_COMM_WORLD_RANK")) {
    env.source = launcher::open_mpi;
    env.rank = number("OMPI_COMM_WORLD_RANK");
    if (!env.rank) return fail(bad);
    env.world_size = number("OMPI_COMM_WORLD_SIZE");
    if (!env.world_size) return fail(bad);
    const auto id = get("OMPI_MCA_ess_base_jobid");
    env.job_id = id ? std::string(*id) : std::string(get("PMIX_NAMESPACE").value_or(""));
    // One host when mpirun says so, or when every rank is local.
    const auto nodes = get("OMPI_MCA_orte_num_nodes");
    const auto local = get("OMPI_COMM_WORLD_LOCAL_SIZE");
    const bool one_host =
        (nodes && *nodes == "1") || (local && detail::parse_u32(*local) == env.world_size);
    if (one_host) {
      env.rendezvous_host = "127.0.0.1";
      env.rendezvous_port = derived_rendezvous_port(env.job_id);
      env.rendezvous_source = "one host (127.0.0.1), port from the Open MPI job id";
    }
  } else if (get("SLURM_PROCID")) {
    env.source = launcher::slurm;
    env.rank = number("SLURM_PROCID");
    if (!env.rank) return fail(bad);
    env.world_size = number("SLURM_NTASKS");
    if (!env.world_size) {
      env.world_size = number("SLURM_NPROCS");
      if (!env.world_size) return fail("SLURM_NTASKS is not set (srun sets it)");
    }
    const auto job = get("SLURM_JOB_ID");
    env.job_id = std::string(job.value_or(""));
    if (const auto step = get("SLURM_STEP_ID")) env.job_id += "." + std::string(*step);
    const auto list =
        get("SLURM_STEP_NODELIST") ? get("SLURM_STEP_NODELIST") : get("SLURM_JOB_NODELIST");
    if (list) {
      env.rendezvous_host = first_slurm_host(*list);
      if (env.rendezvous_host.empty())
        return fail("SLURM_STEP_NODELIST/SLURM_JOB_NODELIST='" + std::string(*list) +
                    "' is not a host list");
      env.rendezvous_port = derived_rendezvous_port(env.job_id);
      env.rendezvous_source = "the first host of the Slurm node list, port from the job id";
    }
  } else {
    return env;
  }
  if (env.rank && env.world_size && *env.rank >= *env.world_size)
    return fail("rank " + std::to_string(*env.rank) + " is not below the job's size " +
                std::to_string(*env.world_size));
  if (const auto over = get("ASYNCPS_RENDEZVOUS")) {
    const auto colon = over->rfind(':');
    const auto port =
        colon == std::string_view::npos ? std::nullopt : detail::parse_u32(over->substr(colon + 1));
    if (colon == std::string_view::npos || colon == 0 || !port || *port == 0 || *port > 65535)
      return fail("ASYNCPS_RENDEZVOUS='" + std::string(*over) + "' is not host:port");
    std::string_view host = over->substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
      host = host.substr(1, host.size() - 2);
    env.rendezvous_host = std::string(host);
    env.rendezvous_port = static_cast<std::uint16_t>(*port);
    env.rendezvous_source = "ASYNCPS_RENDEZVOUS";
  }
  return env;
}

/// This process's role and index in a job of `servers` shards, from the launcher's `env`.
/// `servers`: the number of server processes the user asked for (rank launchers: ranks
/// [0, servers) serve; DMLC: must be unset or equal DMLC_NUM_SERVER).
///
/// Errors: `errc::invalid_argument`, with `why` set to one line: no launcher (`env.source ==
/// none`), no rendezvous address (Open MPI across hosts: "set ASYNCPS_RENDEZVOUS=host:port"),
/// a job with no worker left (world size <= servers), `servers` 0, or `servers` disagreeing
/// with DMLC_NUM_SERVER. Thread safety: pure.
inline result<launch_plan> plan_launch(const launch_environment& env,
                                       std::optional<std::uint32_t> servers, std::string& why) {
  const auto fail = [&](std::string line) -> result<launch_plan> {
    why = std::move(line);
    return make_error_code(errc::invalid_argument);
  };
  if (env.source == launcher::none) return fail("no launcher environment was found");
  if (env.rendezvous_host.empty() || env.rendezvous_port == 0)
    return fail(std::string(to_string(env.source)) +
                " does not say where rank 0 runs: set ASYNCPS_RENDEZVOUS=host:port (a host "
                "every process can reach and a free port)");
  launch_plan p;
  p.rendezvous_host = env.rendezvous_host;
  p.rendezvous_port = env.rendezvous_port;
  if (env.source == launcher::dmlc) {
    if (servers && *servers != *env.num_servers)
      return fail("the number of servers given (" + std::to_string(*servers) +
                  ") differs from DMLC_NUM_SERVER (" + std::to_string(*env.num_servers) + ")");
    p.role = env.role;
    p.num_servers = *env.num_servers;
    p.num_workers = *env.num_workers;
    p.runs_rendezvous = env.role == node_role::scheduler;
    return p;
  }
  const std::uint32_t s = servers.value_or(1);
  if (s == 0) return fail("a job needs at least one server");
  if (*env.world_size <= s)
    return fail("the job has " + std::to_string(*env.world_size) + " processes: with " +
                std::to_string(s) + " servers no worker is left (start at least " +
                std::to_string(s + 1) + ")");
  p.num_servers = s;
  p.num_workers = *env.world_size - s;
  p.role = *env.rank < s ? node_role::server : node_role::worker;
  p.index = *env.rank < s ? *env.rank : *env.rank - s;
  p.runs_rendezvous = *env.rank == 0;
  return p;
}

}  // namespace asyncps
