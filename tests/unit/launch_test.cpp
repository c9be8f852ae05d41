// launch.hpp: reading Slurm's, Open MPI's, torchrun's and DMLC's environments (from a fake
// environment, so no test depends on how it was started), the precedence between them, the
// rendezvous address each yields, and the role and index plan_launch derives.
#include <map>
#include <ostream>
#include <string>

#include <doctest/doctest.h>

#include "asyncps/launch.hpp"

using namespace asyncps;

namespace {

// A fake environment: a map the lookup reads.
struct fake_env {
  std::map<std::string, std::string> vars;
  const char* operator()(const char* name) const {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  }
};

launch_environment read_ok(const fake_env& e) {
  std::string why;
  auto r = read_launch_environment(why, e);
  INFO(why);
  REQUIRE(r.has_value());
  return r.value();
}

std::string read_error(const fake_env& e) {
  std::string why;
  auto r = read_launch_environment(why, e);
  REQUIRE(!r.has_value());
  CHECK(r.error() == errc::invalid_argument);
  return why;
}

}  // namespace

TEST_CASE("launch: no launcher variables is launcher none, and plan_launch refuses it") {
  const auto env = read_ok(fake_env{{{"HOME", "/root"}, {"PATH", "/bin"}}});
  CHECK(env.source == launcher::none);
  CHECK(!env.rank);
  std::string why;
  CHECK(!plan_launch(env, 2, why).has_value());
  CHECK(why.find("no launcher") != std::string::npos);
}

TEST_CASE("launch: torchrun gives rank, size and MASTER_ADDR:MASTER_PORT") {
  const fake_env e{{{"RANK", "3"},
                    {"WORLD_SIZE", "6"},
                    {"MASTER_ADDR", "trainer-0.trainer"},
                    {"MASTER_PORT", "29500"},
                    {"LOCAL_RANK", "1"}}};
  const auto env = read_ok(e);
  CHECK(env.source == launcher::torchrun);
  CHECK(env.rank == 3u);
  CHECK(env.world_size == 6u);
  CHECK(env.rendezvous_host == "trainer-0.trainer");
  CHECK(env.rendezvous_port == 29500);
  std::string why;
  const auto p = plan_launch(env, 2, why);
  REQUIRE(p.has_value());
  CHECK(p.value().role == node_role::worker);
  CHECK(p.value().index == 1u);
  CHECK(p.value().num_servers == 2);
  CHECK(p.value().num_workers == 4);
  CHECK(!p.value().runs_rendezvous);

  auto bad = e;
  bad.vars["MASTER_PORT"] = "70000";
  CHECK(read_error(bad).find("MASTER_PORT='70000'") != std::string::npos);
  bad = e;
  bad.vars.erase("MASTER_ADDR");
  CHECK(read_error(bad).find("MASTER_ADDR") != std::string::npos);
  bad = e;
  bad.vars["RANK"] = "x3";
  CHECK(read_error(bad).find("RANK='x3' is not a number") != std::string::npos);
  bad = e;
  bad.vars["RANK"] = "6";
  CHECK(read_error(bad).find("not below the job's size 6") != std::string::npos);
}

TEST_CASE("launch: Open MPI on one host meets at 127.0.0.1 on a port from the job id") {
  fake_env e{{{"OMPI_COMM_WORLD_RANK", "0"},
              {"OMPI_COMM_WORLD_SIZE", "6"},
              {"OMPI_COMM_WORLD_LOCAL_SIZE", "6"},
              {"OMPI_MCA_orte_num_nodes", "1"},
              {"OMPI_MCA_ess_base_jobid", "1734017025"}}};
  const auto env = read_ok(e);
  CHECK(env.source == launcher::open_mpi);
  CHECK(env.rendezvous_host == "127.0.0.1");
  CHECK(env.rendezvous_port == derived_rendezvous_port("1734017025"));
  CHECK(env.rendezvous_port >= 20000);
  CHECK(env.rendezvous_port < 30000);
  // Every rank of the job derives the same port; another job another one (for these ids).
  e.vars["OMPI_COMM_WORLD_RANK"] = "5";
  CHECK(read_ok(e).rendezvous_port == env.rendezvous_port);
  CHECK(derived_rendezvous_port("1734017026") != env.rendezvous_port);

  std::string why;
  const auto p0 = plan_launch(env, 2, why);
  REQUIRE(p0.has_value());
  CHECK(p0.value().role == node_role::server);
  CHECK(p0.value().index == 0u);
  CHECK(p0.value().runs_rendezvous);
  const auto p5 = plan_launch(read_ok(e), 2, why);
  REQUIRE(p5.has_value());
  CHECK(p5.value().role == node_role::worker);
  CHECK(p5.value().index == 3u);

  SUBCASE("across hosts it needs ASYNCPS_RENDEZVOUS") {
    e.vars["OMPI_MCA_orte_num_nodes"] = "2";
    e.vars["OMPI_COMM_WORLD_LOCAL_SIZE"] = "3";
    const auto multi = read_ok(e);
    CHECK(multi.rendezvous_host.empty());
    CHECK(!plan_launch(multi, 2, why).has_value());
    CHECK(why.find("ASYNCPS_RENDEZVOUS") != std::string::npos);
    e.vars["ASYNCPS_RENDEZVOUS"] = "10.0.0.5:7777";
    const auto given = read_ok(e);
    CHECK(given.rendezvous_host == "10.0.0.5");
    CHECK(given.rendezvous_port == 7777);
    CHECK(plan_launch(given, 2, why).has_value());
    e.vars["ASYNCPS_RENDEZVOUS"] = "[fd00::2]:7777";
    CHECK(read_ok(e).rendezvous_host == "fd00::2");
    e.vars["ASYNCPS_RENDEZVOUS"] = "10.0.0.5";
    CHECK(read_error(e).find("ASYNCPS_RENDEZVOUS='10.0.0.5' is not host:port") !=
          std::string::npos);
  }
}

TEST_CASE("launch: Slurm's first host of the step's node list, port from job and step id") {
  CHECK(first_slurm_host("node[07-09,12],gpu1") == "node07");
  CHECK(first_slurm_host("login") == "login");
  CHECK(first_slurm_host("a1,a2") == "a1");
  CHECK(first_slurm_host("rack[1-2]-n[01-04]") == "rack1-n01");
  CHECK(first_slurm_host("n[3,5]") == "n3");
  CHECK(first_slurm_host("n[3-").empty());
  CHECK(first_slurm_host("").empty());

  fake_env e{{{"SLURM_PROCID", "1"},
              {"SLURM_NTASKS", "4"},
              {"SLURM_JOB_ID", "4242"},
              {"SLURM_STEP_ID", "0"},
              {"SLURM_JOB_NODELIST", "c[01-08]"},
              {"SLURM_STEP_NODELIST", "c[03-04]"}}};
  const auto env = read_ok(e);
  CHECK(env.source == launcher::slurm);
  CHECK(env.rank == 1u);
  CHECK(env.world_size == 4u);
  CHECK(env.job_id == "4242.0");
  CHECK(env.rendezvous_host == "c03");
  CHECK(env.rendezvous_port == derived_rendezvous_port("4242.0"));
  std::string why;
  const auto p = plan_launch(env, 1, why);
  REQUIRE(p.has_value());
  CHECK(p.value().role == node_role::worker);
  CHECK(p.value().index == 0u);
  CHECK(p.value().num_workers == 3);

  e.vars["SLURM_STEP_NODELIST"] = "c[03";
  CHECK(read_error(e).find("is not a host list") != std::string::npos);
}

TEST_CASE("launch: mpirun or torchrun inside a Slurm allocation: their ranks win") {
  fake_env e{{{"SLURM_PROCID", "0"},
              {"SLURM_NTASKS", "1"},
              {"SLURM_JOB_NODELIST", "c01"},
              {"OMPI_COMM_WORLD_RANK", "4"},
              {"OMPI_COMM_WORLD_SIZE", "6"},
              {"OMPI_MCA_orte_num_nodes", "1"}}};
  CHECK(read_ok(e).source == launcher::open_mpi);
  CHECK(read_ok(e).rank == 4u);
  e.vars.insert({{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "c01"}, {"MASTER_PORT", "1"}});
  CHECK(read_ok(e).source == launcher::torchrun);
  CHECK(read_ok(e).rank == 2u);
}

TEST_CASE("launch: DMLC roles, counts and root; the scheduler runs the rendezvous") {
  fake_env e{{{"DMLC_ROLE", "server"},
              {"DMLC_NUM_SERVER", "2"},
              {"DMLC_NUM_WORKER", "4"},
              {"DMLC_PS_ROOT_URI", "10.1.0.1"},
              {"DMLC_PS_ROOT_PORT", "9091"}}};
  auto env = read_ok(e);
  CHECK(env.source == launcher::dmlc);
  CHECK(env.role == node_role::server);
  CHECK(!env.rank);
  std::string why;
  auto p = plan_launch(env, std::nullopt, why);
  REQUIRE(p.has_value());
  CHECK(p.value().role == node_role::server);
  CHECK(!p.value().index);  // the rendezvous assigns it
  CHECK(p.value().num_servers == 2);
  CHECK(p.value().num_workers == 4);
  CHECK(!p.value().runs_rendezvous);
  CHECK(p.value().rendezvous_host == "10.1.0.1");
  CHECK(p.value().rendezvous_port == 9091);
  CHECK(!plan_launch(env, 3, why).has_value());
  CHECK(why.find("DMLC_NUM_SERVER (2)") != std::string::npos);

  e.vars["DMLC_ROLE"] = "scheduler";
  p = plan_launch(read_ok(e), 2, why);
  REQUIRE(p.has_value());
  CHECK(p.value().runs_rendezvous);
  CHECK(p.value().role == node_role::scheduler);

  e.vars["DMLC_ROLE"] = "boss";
  CHECK(read_error(e).find("DMLC_ROLE='boss'") != std::string::npos);
  e.vars["DMLC_ROLE"] = "worker";
  e.vars.erase("DMLC_PS_ROOT_PORT");
  CHECK(read_error(e).find("DMLC_PS_ROOT_PORT is not set") != std::string::npos);
  e.vars["DMLC_PS_ROOT_PORT"] = "9091";
  e.vars["DMLC_NUM_WORKER"] = "0";
  CHECK(read_error(e).find("at least 1") != std::string::npos);
}

TEST_CASE("launch: plan_launch needs a worker left after the servers") {
  const fake_env e{
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}}};
  std::string why;
  CHECK(!plan_launch(read_ok(e), 2, why).has_value());
  CHECK(why.find("no worker is left (start at least 3)") != std::string::npos);
  CHECK(!plan_launch(read_ok(e), 0, why).has_value());
  const auto p = plan_launch(read_ok(e), 1, why);
  REQUIRE(p.has_value());
  CHECK(p.value().role == node_role::server);
  CHECK(p.value().runs_rendezvous);
}
