// fashion_mnist — train softmax regression, an MLP or a small CNN on Fashion-MNIST with asyncps
// parameter servers and workers talking over TCP.
//
//   fashion_mnist                                  # MLP, 2 servers + 4 workers, SSP(3)
//   fashion_mnist --model softmax --consistency essp --staleness 3
//   fashion_mnist --model cnn                                      # conv net (im2col)
//   head -c 32 /dev/urandom > secret; chmod 600 secret  # multi-process runs share a secret
//   fashion_mnist --role server --shard 0 --servers 2 --workers 2 --listen 127.0.0.1:7000
//                 --secret-file secret
//   fashion_mnist --role worker --worker-id 0 --workers 2 --connect 127.0.0.1:7000,127.0.0.1:7001
//                 --secret-file secret
//   fashion_mnist --tls-cert node.pem --tls-key node.key --tls-ca ca.pem  # mutual TLS
//   fashion_mnist --recovery stateless --kill-at 3,8 --downtime 2   # kill -9 server 0 twice
//   fashion_mnist --recovery chain --replicas 2 --kill-at 3,8         # kill the head of shard 0
//   fashion_mnist --recovery replica-log --replica-interval 10 --kill-at 3,8  # SWIFT-style
//   fashion_mnist --consistency vap --vap-magnitude 0.2 --vap-shrink  # value-bounded (VAP)
//   fashion_mnist --groups 2 --slow-worker 3 --slow-factor 4          # group servers (BSP
//                                                                     # inside, ASP between)
//   fashion_mnist --groups 2 --role server --shard 0 --listen 127.0.0.1:7000 ...  # each part
//   fashion_mnist --groups 2 --role group-server --group 0 --central 127.0.0.1:7000,... ...
//   fashion_mnist --groups 2 --role worker --worker-id 0 --connect GROUP0 --central ...
//                                                     # its own process (docs/deploy.md)
//
// The consistency model, the recovery policy and the server optimizer are compile-time
// policies; the command line picks one of the instantiations compiled in train_*.cpp. The
// SSP/ESSP staleness bound is a run-time value (consistency::ssp<>/essp<>).
#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <sys/types.h>
#include <sys/wait.h>
#include <system_error>
#include <thread>
#include <unistd.h>
#include <vector>

#include "config.hpp"

namespace {

using fashion::config;

// `n` distinct free TCP ports on 127.0.0.1, chosen by the kernel: n sockets bound to port 0
// at once, closed before the servers bind the ports. Throws std::system_error on failure.
std::vector<unsigned short> free_loopback_ports(std::uint32_t n) {
  std::vector<int> fds;
  std::vector<unsigned short> ports;
  const auto close_all = [&] {
    for (int fd : fds) ::close(fd);
  };
  for (std::uint32_t i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      const int err = errno;
      if (fd >= 0) ::close(fd);
      close_all();
      throw std::system_error(err, std::generic_category(), "cannot bind a loopback port");
    }
    fds.push_back(fd);
    ports.push_back(ntohs(a.sin_port));
  }
  close_all();
  return ports;
}

// Fault injection: the servers run as child processes of this one (the same binary with
// --role server), and shard `kill_shard` is killed with SIGKILL at each `kill_at` time and
// started again `downtime` seconds later. Times count from the end of worker 0's first
// clock, so slow process start-up (data loading) does not shift them. The workers run here,
// as in the default run. Under chain replication every shard has `replicas` server processes
// plus one chain master process (never killed), and kill k hits member k % replicas of shard
// `kill_shard`: as a restarted server rejoins as the tail, that is the head each time.
//
// No child outlives this process: each gets SIGKILL when the thread that forked it ends
// (PR_SET_PDEATHSIG, checked against a parent already gone). The first servers are forked by
// the main thread, which ends with the process; restarted ones by the kill schedule's thread,
// which therefore stays until stop() and kills every child itself before it ends.
class server_supervisor {
 public:
  server_supervisor(const config& c, std::vector<std::string> base_args)
      : cfg_(c), base_(std::move(base_args)), start_(std::chrono::steady_clock::now()) {}
  ~server_supervisor() { stop(); }

  // Starts every server (and the chain master) on free loopback ports; returns the servers'
  // host:port strings, shard-major.
  std::vector<std::string> start() {
    const std::uint32_t n = cfg_.servers * per_shard() + (chain() ? 1 : 0);
    ports_ = free_loopback_ports(n);
    pids_.assign(n, -1);
    for (std::uint32_t s = 0; s < n; ++s) spawn(s);
    killer_ = std::thread([this] { kill_schedule(); });
    std::vector<std::string> eps;
    for (std::uint32_t s = 0; s < cfg_.servers * per_shard(); ++s) eps.push_back(address(s));
    return eps;
  }

  // Called once training runs: kill times count from here.
  void training_started() {
    {
      std::lock_guard lock(mutex_);
      start_ = std::chrono::steady_clock::now();
      started_ = true;
    }
    cv_.notify_all();
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (killer_.joinable()) killer_.join();  // it kills the children as it ends
    kill_all();
  }

 private:
  // Kills and reaps every child: the chain master (last) first, so it does not report the
  // servers' exits. On the kill schedule's thread, or once it has ended.
  void kill_all() {
    for (auto it = pids_.rbegin(); it != pids_.rend(); ++it) {
      auto& pid = *it;
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        pid = -1;
      }
    }
  }

  double now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  bool chain() const { return cfg_.recovery.rfind("chain", 0) == 0; }
  std::uint32_t per_shard() const { return chain() ? cfg_.replicas : 1; }
  std::string address(std::uint32_t process) const {
    return "127.0.0.1:" + std::to_string(ports_[process]);
  }

  // Process i < servers * per_shard is server (i / per_shard, member i % per_shard); the
  // last one, under chain replication, is the chain master.
  void spawn(std::uint32_t i) {
    std::vector<std::string> args = base_;
    const std::uint32_t k = per_shard();
    // --linger: a server stays for the trainer's final read of the servers' model (stop()
    // ends it); 60 s bounds its life should this process die without stop().
    std::vector<std::string> extra{"--listen",  address(i), "--quiet", "--metrics",
                                   "/dev/null", "--linger", "60"};
    if (i == cfg_.servers * k) {
      extra.insert(extra.end(), {"--role", "master"});
    } else {
      extra.insert(extra.end(), {"--role", "server", "--shard", std::to_string(i / k)});
      if (chain()) {
        std::string members;
        for (std::uint32_t m = 0; m < k; ++m)
          members += (m == 0 ? "" : ",") + address(i / k * k + m);
        extra.insert(extra.end(), {"--member", std::to_string(i % k), "--chain", members,
                                   "--master", address(cfg_.servers * k)});
      }
    }
    for (auto& a : extra) args.push_back(std::move(a));
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Async-signal-safe calls only until exec (this process has threads). The death signal
      // survives exec; a parent that died before prctl leaves this child to init: exit.
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) std::_Exit(127);
      ::execv("/proc/self/exe", argv.data());
      std::perror("fashion_mnist: exec of a server process failed");
      std::_Exit(127);
    }
    if (pid < 0) {
      std::perror("fashion_mnist: fork of a server process failed");
      return;  // pids_[i] stays -1: never signalled (kill(-1) would signal every process)
    }
    pids_[i] = pid;
  }

  // Waits `seconds` or until stop(); false when stopping.
  bool sleep_until(double t) {
    std::unique_lock lock(mutex_);
    return !cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, t - now())),
                         [this] { return stopping_; });
  }

  // The kill schedule's thread: the kills and restarts, then, at stop(), the end of every
  // child (those it restarted would get their death signal when it ends anyway, before the
  // chain master is stopped).
  void kill_schedule() {
    run_kill_schedule();
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [this] { return stopping_; });
    }
    kill_all();
  }

  void run_kill_schedule() {
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [this] { return started_ || stopping_; });
      if (stopping_) return;
    }
    std::uint32_t kills = 0;
    for (double t : cfg_.kill_at) {
      if (!sleep_until(t)) return;
      const std::uint32_t s = cfg_.kill_shard;
      const std::uint32_t member = kills++ % per_shard();
      const std::uint32_t i = s * per_shard() + member;
      if (pids_[i] > 0) {
        ::kill(pids_[i], SIGKILL);
        ::waitpid(pids_[i], nullptr, 0);
        pids_[i] = -1;
      }
      const std::string name =
          chain() ? std::to_string(s) + "." + std::to_string(member) : std::to_string(s);
      std::printf("\n[fault] killed server %s (SIGKILL) at %.1f s\n", name.c_str(), now());
      std::fflush(stdout);
      if (!sleep_until(t + cfg_.downtime)) return;
      spawn(i);
      std::printf("\n[fault] restarted server %s at %.1f s\n", name.c_str(), now());
      std::fflush(stdout);
    }
  }

  const config& cfg_;
  std::vector<std::string> base_;
  std::chrono::steady_clock::time_point start_;
  std::vector<unsigned short> ports_;
  std::vector<pid_t> pids_;
  std::thread killer_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool started_ = false;
};

// A new empty file in memory (memfd_create, mode 0600) that this process shares with the
// server processes it forks: its descriptor is inherited (no close-on-exec), and `path()`,
// /proc/self/fd/N, opens it in this process and in each child alike. No name on any file
// system: it is gone once this process and its children are, however they end (SIGKILL
// included). Throws std::system_error.
class shared_memory_file {
 public:
  explicit shared_memory_file(const char* what) {
    const std::string name = std::string("fashion_mnist-") + what;
    fd_ = ::memfd_create(name.c_str(), MFD_ALLOW_SEALING);
    if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "memfd_create " + name);
    if (::fchmod(fd_, S_IRUSR | S_IWUSR) != 0) {
      const int err = errno;
      ::close(fd_);
      throw std::system_error(err, std::generic_category(), "fchmod " + name);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~shared_memory_file() { ::close(fd_); }
  shared_memory_file(const shared_memory_file&) = delete;
  shared_memory_file& operator=(const shared_memory_file&) = delete;
  const std::string& path() const { return path_; }

  // Writes `bytes` at the start and seals the file: no one can change it after that.
  void write_sealed(std::span<const std::byte> bytes) {
    std::size_t n = 0;
    while (n < bytes.size()) {
      const ::ssize_t r = ::pwrite(fd_, bytes.data() + n, bytes.size() - n, static_cast<off_t>(n));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw std::system_error(errno, std::generic_category(), "write " + path_);
      n += static_cast<std::size_t>(r);
    }
    if (::fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0)
      throw std::system_error(errno, std::generic_category(), "seal " + path_);
  }

 private:
  int fd_ = -1;
  std::string path_;
};

int train(const config& c) {
  if (c.role == "master") return fashion::run_master(c);
  if (c.groups >= 2) return fashion::train_groups(c);
  if (c.consistency == "vap") return fashion::train_vap(c);
  if (c.recovery == "chain") return fashion::train_chain(c);
  if (c.recovery == "chain-relaxed") return fashion::train_chain_relaxed(c);
  if (c.recovery == "checkpoint") return fashion::train_checkpoint(c);
  if (c.recovery == "stateless") return fashion::train_stateless(c);
  if (c.recovery == "replica-log") return fashion::train_replica_log(c);
  if (c.optimizer != "sgd") return fashion::train_none_optimizers(c);
  return fashion::train_none(c);
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  CLI::App app{"Train Fashion-MNIST with asyncps parameter servers and workers over TCP"};
  app.add_option("--role", c.role,
                 "all: servers and workers in this process; master: the chain master "
                 "(--recovery chain); scheduler: only the rendezvous (--rendezvous); "
                 "group-server: group --group's server (--groups). Default: from the launcher's "
                 "environment (--launcher), else all")
      ->check(CLI::IsMember({"all", "server", "worker", "master", "scheduler", "group-server"}));
  app.add_option("--launcher", c.launcher,
                 "auto: without --role, take the role, rank and counts from the environment of "
                 "Slurm (srun), Open MPI (mpirun), torchrun or DMLC (ps-lite/BytePS): ranks < "
                 "--servers serve, the others train (docs/deploy.md); none: ignore it")
      ->check(CLI::IsMember({"auto", "none"}));
  app.add_option("--rendezvous", c.rendezvous,
                 "host:port of the job's rendezvous, where servers publish their addresses and "
                 "workers look them up (instead of --listen/--connect lists; default: the "
                 "launcher's, or $ASYNCPS_RENDEZVOUS)");
  app.add_flag("--elastic", c.elastic,
               "workers may join and leave the running job (recovery none): --workers is the "
               "capacity of worker ids, training starts once --min-workers joined, a worker "
               "whose connection is gone for --grace seconds leaves, and a restarted one "
               "rejoins (docs/concepts/membership.md)");
  app.add_option("--min-workers", c.min_workers,
                 "--elastic: workers that must join before the clock moves (default --workers)")
      ->check(CLI::Range(1, 256));
  app.add_option("--grace", c.grace,
                 "--elastic: seconds a worker's connection may be gone before it leaves")
      ->check(CLI::PositiveNumber);
  app.add_option("--model", c.model,
                 "mlp (784-128-10, default), softmax regression, or cnn (conv 5x5 16, pool, conv "
                 "5x5 32, pool, dense; docs/results/fashion_mnist.md)")
      ->check(CLI::IsMember({"softmax", "mlp", "cnn"}));
  app.add_option("--consistency", c.consistency)
      ->check(CLI::IsMember({"bsp", "ssp", "essp", "asp", "vap"}));
  app.add_option("--staleness", c.staleness,
                 "SSP/ESSP bound s in clocks (any s >= 0; set at run time, ssp<>/essp<>)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--vap-magnitude", c.vap_magnitude,
                 "--consistency vap: bound on a worker's in-transit update magnitude (L2 norm of "
                 "lr x gradient; default 0.15 softmax, 0.5 MLP and CNN: about 2 clocks of SGD "
                 "updates)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--vap-shrink", c.vap_shrink,
               "--consistency vap: bound --vap-magnitude / sqrt(clock + 1)");
  app.add_option("--optimizer", c.optimizer, "server optimizer")
      ->check(CLI::IsMember({"sgd", "momentum", "adagrad", "adam"}));
  app.add_option("--servers", c.servers, "number of server shards")->check(CLI::Range(1, 64));
  app.add_option("--workers", c.workers, "number of workers")->check(CLI::Range(1, 256));
  app.add_option("--shard", c.shard, "--role server: this server's shard index");
  app.add_option("--worker-id", c.worker_id, "--role worker: this worker's id");
  app.add_option("--listen", c.listen, "--role server: host:port to listen on");
  app.add_option("--secret-file", c.secret_file,
                 "file holding the run's shared secret (at least 16 bytes, mode 0600; default: "
                 "$ASYNCPS_SECRET_FILE); every process of a run needs the same one. Required by "
                 "--role server|worker|master; --role all makes a random one for its run");
  app.add_option("--tls-cert", c.tls.certificate_file,
                 "PEM file: this process's TLS certificate (with --tls-key and --tls-ca: mutual "
                 "TLS on every connection; every process of a run needs certificates of the "
                 "same CA; docs/security.md)");
  app.add_option("--tls-key", c.tls.private_key_file,
                 "PEM file: the private key of --tls-cert (unencrypted, mode 0600)");
  app.add_option("--tls-ca", c.tls.ca_file,
                 "PEM file: the CA certificate that signs every process's --tls-cert");
  app.add_option("--connect", c.connect, "--role worker: host:port of every shard, in order")
      ->delimiter(',');
  app.add_option("--epochs", c.epochs, "passes over each worker's shard")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", c.batch,
                 "minibatch size per worker (default: 64 up to 2 workers; beyond, 128 / "
                 "workers and at least 4, so that a clock's global batch stays near 128)")
      ->check(CLI::Range(1, 60000));
  app.add_option("--lr", c.lr,
                 "learning rate (default SGD: 0.1 MLP, 0.05 softmax and CNN per 64 samples, "
                 "scaled under the mean rule with the global batch of workers x batch, up to "
                 "128: Goyal et al. 2017's linear scaling)")
      ->check(CLI::PositiveNumber);
  app.add_option("--l2", c.l2, "weight decay")->check(CLI::NonNegativeNumber);
  app.add_flag("--flip", c.flip,
               "--model cnn: mirror each training image left-right with probability 1/2");
  app.add_option("--shift", c.max_shift,
                 "--model cnn: move each training image by up to this many pixels in x and y "
                 "(uniform, zero fill)")
      ->check(CLI::Range(0, 27));
  app.add_option("--decay-at", c.decay_at, "epoch after which the learning rate is scaled")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--decay-factor", c.decay_factor, "learning-rate scale after --decay-at")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--hidden", c.hidden,
                 "hidden width: the MLP's (default 128), or a dense ReLU layer between the CNN's "
                 "pooled features and its output (default 128; 0: none)")
      ->check(CLI::Range(0, 4096));
  app.add_option("--seed", c.seed);
  app.add_option("--data", c.data, "directory with the four Fashion-MNIST .gz files");
  app.add_option("--metrics", c.metrics, "JSON-lines metrics file");
  app.add_option("--eval-every", c.eval_every, "epochs between evaluations")
      ->check(CLI::PositiveNumber);
  app.add_option("--eval", c.eval,
                 "what evaluations read: servers (their model, read as a reader), both (and "
                 "worker 0's view beside it) or worker (worker 0's view only)")
      ->check(CLI::IsMember({"servers", "both", "worker"}));
  app.add_option("--compute-threads", c.compute_threads,
                 "gradient threads (default: the machine's cores)");
  app.add_option("--io-threads", c.io_threads,
                 "threads running the servers' and workers' I/O; each server shard and worker "
                 "has a strand of its own (default: the machine's cores)");
  app.add_option(
         "--push-window", c.push_window,
         "clocks of pushes a worker may have unacknowledged per server before it waits "
         "to compute the next (bounds how stale ASP reads get behind the worker's own "
         "pushes; 0: no window). Default: 2 under ASP (1 past 16 workers), none under BSP and "
         "SSP")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--update-rule", c.update_rule,
                 "how each push's step scales with the workers W and its staleness: sum (full "
                 "step per push), mean (1/W: one step of the mean per clock), staleness-aware "
                 "(1/(1+staleness), Zhang et al. 2016), linear-scaling (Goyal et al. 2017: full "
                 "step after a warm-up from 1/W). Default: mean")
      ->check(CLI::IsMember({"sum", "mean", "staleness-aware", "linear-scaling"}));
  app.add_option("--warmup-epochs", c.warmup_epochs,
                 "--update-rule linear-scaling: epochs of warm-up (default 2)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--quiet", c.quiet, "no progress line");
  app.add_option("--recovery", c.recovery, "what happens when a server fails")
      ->check(CLI::IsMember(
          {"none", "checkpoint", "stateless", "chain", "chain-relaxed", "replica-log"}));
  app.add_option("--replicas", c.replicas,
                 "--recovery chain*: servers per shard (chain length); under chain --connect "
                 "lists them all, shard-major")
      ->check(CLI::Range(2, 8));
  app.add_option("--replicate-every", c.replicate_every,
                 "--recovery chain-relaxed: pushes between state copies down the chain")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--replica-interval", c.replica_interval,
                 "--recovery replica-log: server clocks between the state replicas a shard sends "
                 "to its workers (a longer interval: more log on the workers, more to replay)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--replica-ordering", c.replica_ordering,
                 "--recovery replica-log: write-ahead (a push is applied once its worker logged "
                 "its position: bit-exact rebuilds, one round trip per worker clock) or "
                 "apply-first (applied on arrival, the position follows: exactly-once rebuilds, "
                 "counted 'reordered' when not bit-exact)")
      ->check(CLI::IsMember({"write-ahead", "apply-first"}));
  app.add_option("--replica-log-budget", c.replica_log_budget,
                 "--recovery replica-log: bound on each worker's log, in shard states: a shard "
                 "sends its next state replica early once a worker's unreplicated pushes exceed "
                 "it (more replicas on the wire, less log); 0: off")
      ->check(CLI::Range(0.0, 1000.0));
  app.add_option("--replica-ack-delay", c.replica_ack_delay_ms,
                 "--recovery replica-log --replica-ordering apply-first: milliseconds a shard may "
                 "hold back a worker's clock ack, so one ack carries several clocks' positions "
                 "(fewer messages; more rebuilds reordered after a kill); 0: an ack per clock")
      ->check(CLI::Range(0, 10000));
  app.add_option("--server-report", c.server_report,
                 "--recovery replica-log, --role server: file to append a JSON line to after "
                 "each rebuild and at the end (role all with --kill-at sets it for its server "
                 "processes)");
  app.add_option("--member", c.member, "--role server, chain: this server's place in --chain");
  app.add_option("--chain", c.chain, "--role server, chain: host:port of every server of the shard")
      ->delimiter(',');
  app.add_option("--master", c.master, "--role server, chain: host:port of the chain master");
  app.add_option("--merge", c.merge, "--recovery stateless: how a worker's backlog is merged")
      ->check(CLI::IsMember({"sum", "mean", "lr-scaled", "staleness-aware"}));
  app.add_option("--checkpoint-dir", c.checkpoint_dir, "--recovery checkpoint: directory");
  app.add_option("--checkpoint-every", c.checkpoint_every,
                 "--recovery checkpoint: clocks between checkpoints (default: adaptive)");
  app.add_option("--checkpoint-seconds", c.checkpoint_seconds,
                 "--recovery checkpoint: seconds between checkpoints")
      ->check(CLI::PositiveNumber);
  app.add_option("--reconnect-timeout", c.reconnect_timeout,
                 "seconds a worker keeps reconnecting to a lost server")
      ->check(CLI::PositiveNumber);
  app.add_option("--linger", c.linger,
                 "--role server: seconds it keeps answering readers (the final model) after "
                 "the last worker left (default 0)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--kill-at", c.kill_at,
                 "seconds after start at which server --kill-shard is killed (SIGKILL); "
                 "servers then run as child processes")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  app.add_option("--downtime", c.downtime, "seconds a killed server stays down")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--kill-shard", c.kill_shard, "which server --kill-at kills");
  app.add_option("--groups", c.groups,
                 "group servers against stragglers: G >= 2 groups train BSP on their group "
                 "server, which pushes to the --servers central shards (ASP); 0 or 1: off")
      ->check(CLI::Range(0, 256));
  app.add_option("--group-by", c.group_by,
                 "--groups: id (contiguous ids) or speed (by the --slow-factor known up front)")
      ->check(CLI::IsMember({"id", "speed"}));
  app.add_option("--push-every", c.push_every, "--groups: group clocks per central push")
      ->check(CLI::Range(1, 1000000));
  app.add_flag("--scale-staleness", c.scale_staleness,
               "--groups: scale each central push by 1 / its staleness (other groups' pushes "
               "it did not see)");
  app.add_option("--group", c.group,
                 "--groups, --role group-server: the group it serves; --role worker: the group it "
                 "trains in (checked against --group-by's plan)")
      ->check(CLI::Range(0, 255));
  app.add_option("--central", c.central,
                 "--groups, --role group-server (and worker 0, which reports the central "
                 "model): host:port of every central shard, in order")
      ->delimiter(',');
  app.add_option("--slow-worker", c.slow_worker, "straggler: which worker --slow-factor slows");
  app.add_option("--slow-factor", c.slow_factor,
                 "straggler: --slow-worker sleeps (F - 1) x its compute time after each "
                 "gradient, on its own thread; 1: off")
      ->check(CLI::Range(1.0, 1000.0));
  // One line per error, naming the flag and (for choices) the accepted values.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "fashion_mnist: " + std::string(e.what()) + " (see --help)\n";
  });
  CLI11_PARSE(app, argc, argv);
  c.hidden_given = app.count("--hidden") > 0;  // before apply_defaults reads it

  // Launched by Slurm, Open MPI, torchrun or DMLC: role, index, counts and the rendezvous.
  if (const int rc =
          fashion::apply_launcher(c, app.count("--role") > 0, app.count("--servers") > 0);
      rc != 0)
    return rc;

  if (c.role == "server" && c.shard >= c.servers) {
    std::cerr << "fashion_mnist: --shard must be < --servers (" << c.servers << ")\n";
    return 2;
  }
  if (c.role == "worker" && c.worker_id >= c.workers) {
    std::cerr << "fashion_mnist: --worker-id must be < --workers (" << c.workers << ")\n";
    return 2;
  }
  const bool chain = c.recovery.rfind("chain", 0) == 0;
  const std::uint32_t per_shard = chain ? c.replicas : 1;
  if (c.role == "worker" && c.rendezvous.empty() && c.groups < 2 &&
      c.connect.size() != c.servers * per_shard) {
    std::cerr << "fashion_mnist: --connect needs "
              << (chain ? "every server of every shard" : "one host:port per shard") << " ("
              << c.servers * per_shard << " host:port)\n";
    return 2;
  }
  fashion::apply_defaults(c);

  if (c.hidden_given && c.hidden == 0 && c.model == "mlp") {
    std::cerr << "fashion_mnist: --hidden 0 is for --model cnn (no hidden layer); the MLP needs "
                 ">= 1\n";
    return 2;
  }
  if (c.model != "cnn" && (c.flip || c.max_shift != 0)) {
    std::cerr << "fashion_mnist: --flip and --shift need --model cnn\n";
    return 2;
  }
  const bool vap = c.consistency == "vap";
  if (!vap && (app.count("--vap-magnitude") > 0 || c.vap_shrink)) {
    std::cerr << "fashion_mnist: --vap-magnitude and --vap-shrink need --consistency vap\n";
    return 2;
  }
  if (vap && c.recovery != "none") {
    std::cerr << "fashion_mnist: --consistency vap is compiled with --recovery none only in "
                 "this example (drop --recovery "
              << c.recovery << " or pick another --consistency)\n";
    return 2;
  }
  if (c.slow_factor > 1 && c.slow_worker >= c.workers) {
    std::cerr << "fashion_mnist: --slow-worker must be < --workers (" << c.workers << ")\n";
    return 2;
  }
  if (c.groups >= 2) {
    // Group servers: everything in this process; BSP inside a group and ASP between groups.
    const char* bad = nullptr;
    if (c.groups > c.workers)
      bad = "--groups must be <= --workers";
    else if (c.role != "all" && c.role != "server" && c.role != "group-server" &&
             c.role != "worker")
      bad = "--groups needs --role all, server (a central shard), group-server or worker";
    else if (!c.rendezvous.empty())
      bad = "--groups takes the addresses by flags (--listen, --central, --connect), not from a "
            "rendezvous or a launcher's environment: give --role";
    else if ((c.role == "all" || c.role == "server") && (c.group >= 0 || !c.central.empty()))
      bad = "--group and --central are for --role group-server and worker";
    else if (c.role == "group-server" &&
             (c.group < 0 || static_cast<std::uint32_t>(c.group) >= c.groups))
      bad = "--role group-server needs --group g < --groups";
    else if (c.role == "worker" && c.group >= 0 && static_cast<std::uint32_t>(c.group) >= c.groups)
      bad = "--group must be < --groups";
    else if (c.role == "group-server" && c.central.size() != c.servers)
      bad = "--role group-server needs --central with one host:port per central shard "
            "(--servers)";
    else if (c.role == "worker" && c.connect.size() != 1)
      bad = "--groups, --role worker: --connect takes one host:port, its group server's";
    else if (c.role == "worker" && c.worker_id == 0 && c.central.empty())
      bad = "--groups, --role worker: worker 0 reports the central model's accuracy and needs "
            "--central (one host:port per central shard)";
    else if (c.role == "worker" && !c.central.empty() && c.central.size() != c.servers)
      bad = "--central needs one host:port per central shard (--servers)";
    else if (c.recovery != "none")
      bad = "--groups needs --recovery none";
    else if (!c.kill_at.empty())
      bad = "--groups does not combine with --kill-at";
    else if (app.count("--consistency") > 0 || app.count("--staleness") > 0)
      bad = "--groups fixes the consistency (BSP inside a group, ASP between groups): drop "
            "--consistency and --staleness";
    if (bad != nullptr) {
      std::cerr << "fashion_mnist: " << bad << '\n';
      return 2;
    }
  } else if (app.count("--group-by") > 0 || app.count("--push-every") > 0 || c.scale_staleness ||
             c.group >= 0 || !c.central.empty() || c.role == "group-server") {
    std::cerr << "fashion_mnist: --group-by, --push-every, --scale-staleness, --group, --central "
                 "and --role group-server need --groups >= 2\n";
    return 2;
  }

  if (c.elastic || app.count("--min-workers") > 0 || app.count("--grace") > 0) {
    const char* bad = nullptr;
    if (!c.elastic)
      bad = "--min-workers and --grace need --elastic";
    else if (c.recovery != "none")
      bad = "--elastic needs --recovery none (the recovery policies keep a fixed worker set)";
    else if (c.groups >= 2)
      bad = "--elastic does not combine with --groups";
    else if (c.min_workers > c.workers)
      bad = "--min-workers must be <= --workers";
    if (bad != nullptr) {
      std::cerr << "fashion_mnist: " << bad << '\n';
      return 2;
    }
  }
  if (!c.rendezvous.empty() && chain) {
    std::cerr << "fashion_mnist: --rendezvous does not combine with --recovery " << c.recovery
              << " (chain members need --chain and --master)\n";
    return 2;
  }
  if (c.role == "scheduler" && c.rendezvous.empty()) {
    std::cerr << "fashion_mnist: --role scheduler needs --rendezvous host:port (the address "
                 "it serves)\n";
    return 2;
  }
  if (c.recovery != "replica-log" &&
      (app.count("--replica-interval") > 0 || app.count("--server-report") > 0 ||
       app.count("--replica-ordering") > 0 || app.count("--replica-log-budget") > 0 ||
       app.count("--replica-ack-delay") > 0)) {
    std::cerr << "fashion_mnist: --replica-interval, --replica-ordering, --replica-log-budget, "
                 "--replica-ack-delay and --server-report need --recovery replica-log\n";
    return 2;
  }
  if (c.replica_ack_delay_ms > 0 && c.replica_ordering != "apply-first") {
    std::cerr << "fashion_mnist: --replica-ack-delay needs --replica-ordering apply-first "
                 "(write-ahead confirms every order before its update is applied)\n";
    return 2;
  }
  if (app.count("--server-report") > 0 && c.role != "server") {
    std::cerr << "fashion_mnist: --server-report needs --role server (role all with --kill-at "
                 "sets it for its server processes)\n";
    return 2;
  }
  if (c.recovery != "none" && c.optimizer != "sgd") {
    std::cerr << "fashion_mnist: --recovery " << c.recovery
              << " is compiled with --optimizer sgd only in this example\n";
    return 2;
  }
  if (!c.kill_at.empty() && c.kill_shard >= c.servers) {
    std::cerr << "fashion_mnist: --kill-shard must be < --servers (" << c.servers << ")\n";
    return 2;
  }
  if (!c.kill_at.empty() && c.role != "all") {
    std::cerr << "fashion_mnist: --kill-at needs --role all (it starts the server processes)\n";
    return 2;
  }
  std::sort(c.kill_at.begin(), c.kill_at.end());

  // The shared secret: from a file (never from the command line itself), else for role all a
  // random one for this run (handed to its server processes in a 0600 temporary file).
  if (c.secret_file.empty()) {
    const char* env = std::getenv("ASYNCPS_SECRET_FILE");
    if (env != nullptr) c.secret_file = env;
  }
  bool ephemeral_secret = false;
  if (!c.secret_file.empty()) {
    auto s = asyncps::load_secret_file(c.secret_file);
    if (!s) {
      std::cerr << "fashion_mnist: secret file '" << c.secret_file
                << "' (--secret-file or ASYNCPS_SECRET_FILE): " << s.error().message() << '\n';
      return 2;
    }
    c.secret = std::move(s).value();
  } else if (c.role != "all") {
    std::cerr << "fashion_mnist: --role " << c.role
              << " needs the run's shared secret: --secret-file FILE or the environment "
                 "variable ASYNCPS_SECRET_FILE (make one with: head -c 32 /dev/urandom > secret; "
                 "chmod 600 secret; docs/security.md)\n";
    return 2;
  } else {
    auto s = asyncps::shared_secret::random();
    if (!s) {
      std::cerr << "fashion_mnist: cannot make a random secret: " << s.error().message() << '\n';
      return 1;
    }
    c.secret = std::move(s).value();
    ephemeral_secret = true;
  }

  // TLS: all three files or none, checked here so that a bad file is one clear line, not a
  // failure of every transport.
  const int tls_flags = static_cast<int>(app.count("--tls-cert") > 0) +
                        static_cast<int>(app.count("--tls-key") > 0) +
                        static_cast<int>(app.count("--tls-ca") > 0);
  if (tls_flags != 0 && tls_flags != 3) {
    std::cerr << "fashion_mnist: TLS needs all three of --tls-cert, --tls-key and --tls-ca\n";
    return 2;
  }
  if (tls_flags == 3) {
    std::string why;
    if (!asyncps::make_tls_context(c.tls, why)) {
      std::cerr << "fashion_mnist: --tls-cert/--tls-key/--tls-ca: " << why << '\n';
      return 2;
    }
  }

  try {
    if (c.role == "scheduler") return fashion::run_scheduler(c);
    if (!c.rendezvous.empty() && (c.role == "server" || c.role == "worker")) {
      if (const int rc = fashion::join_rendezvous(c); rc != 0) return rc;
      const int rc = train(c);
      fashion::stop_rendezvous();
      return rc;
    }
    if (c.kill_at.empty()) return train(c);
    // Servers as child processes: the same command line, minus the fault flags.
    std::vector<std::string> base{argv[0]};
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--kill-at" || a == "--downtime" || a == "--kill-shard" || a == "--metrics" ||
          a == "--role" || a == "--listen" || a == "--shard" || a == "--server-report" ||
          a == "--linger") {
        ++i;  // drop the flag and its value
        continue;
      }
      if (a.rfind("--kill-at=", 0) == 0 || a.rfind("--downtime=", 0) == 0 ||
          a.rfind("--kill-shard=", 0) == 0 || a.rfind("--metrics=", 0) == 0 ||
          a.rfind("--server-report=", 0) == 0 || a.rfind("--linger=", 0) == 0 || a == "--quiet")
        continue;
      base.push_back(a);
    }
    // replica-log: the server processes report each rebuild to a file this process sums at
    // the end (a process killed with SIGKILL cannot report at its end).
    std::optional<shared_memory_file> report;
    if (c.recovery == "replica-log") {
      c.server_report = report.emplace("rebuilds").path();
      base.insert(base.end(), {"--server-report", c.server_report});
    }
    // An ephemeral secret reaches the server processes in a sealed 0600 file in memory that
    // they inherit, not in argv, and not in a file that would outlive this process.
    std::optional<shared_memory_file> secret_file;
    if (ephemeral_secret) {
      secret_file.emplace("secret").write_sealed(c.secret.bytes());
      base.insert(base.end(), {"--secret-file", secret_file->path()});
    }
    server_supervisor supervisor(c, base);
    c.connect = supervisor.start();
    c.external_servers = true;
    c.on_first_clock = [&supervisor] { supervisor.training_started(); };
    const int rc = train(c);
    supervisor.stop();
    return rc;
  } catch (const std::exception& e) {
    std::cerr << "fashion_mnist: " << e.what() << '\n';
    return 1;
  }
}
