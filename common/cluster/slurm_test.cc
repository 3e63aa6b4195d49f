#include "common/cluster/slurm.h"

#include <map>

#include "absl/strings/str_join.h"
#include "catch2/catch.hpp"
#include "nlohmann/json.hpp"

namespace pstrain {
namespace {

std::string Expand(const std::string& list) {
  auto hosts = ExpandHostList(list);
  if (!hosts.ok()) return "error: " + std::string(hosts.status().message());
  return absl::StrJoin(*hosts, " ");
}

TEST_CASE("Slurm host lists expand as Slurm writes them", "[slurm]") {
  CHECK(Expand("node[01-03,07],gpu-a[1-2]") == "node01 node02 node03 node07 gpu-a1 gpu-a2");
  CHECK(Expand("vm") == "vm");
  CHECK(Expand("a,b,c") == "a b c");
  CHECK(Expand("n[8-10]") == "n8 n9 n10");
  CHECK(Expand("n[08-10]") == "n08 n09 n10");
  CHECK(Expand("n[001-2]") == "n001 n002");
  CHECK(Expand("n[5]") == "n5");
  CHECK(Expand("r[1-2]n[1-2]") == "r1n1 r1n2 r2n1 r2n2");
  CHECK(Expand("cn[1-2]-ib") == "cn1-ib cn2-ib");
  CHECK(Expand("node[1-3],login") == "node1 node2 node3 login");
  CHECK(ExpandHostList("node[00000-65535]").ok());
}

TEST_CASE("malformed Slurm host lists are one clear error", "[slurm]") {
  for (const char* bad : {"", "node[1-3", "node1-3]", "node[3-1]", "node[a-b]", "node[]",
                          "node[1,,2]", "a,,b", "a,", ",a", "node[1-[2]]", "bad_name[1-2]",
                          "node[0-9999999999]", "n[0-65535],extra[1-2]", "n[1-300]m[1-300]"}) {
    INFO(bad);
    auto hosts = ExpandHostList(bad);
    REQUIRE_FALSE(hosts.ok());
    CHECK(std::string(hosts.status().message()).find("Slurm host list") == 0);
  }
}

TEST_CASE("a long name after a large range is refused before it is built", "[slurm]") {
  auto hosts = ExpandHostList("n[00000-65535]" + std::string(300, 'a'));
  REQUIRE_FALSE(hosts.ok());
  CHECK(hosts.status().message().find("over 253 characters") != std::string::npos);
}

TEST_CASE("Slurm tasks-per-node counts expand", "[slurm]") {
  auto tpn = ExpandTasksPerNode("2(x3),1");
  REQUIRE(tpn.ok());
  CHECK(*tpn == std::vector<int>{2, 2, 2, 1});
  CHECK(*ExpandTasksPerNode("5") == std::vector<int>{5});
  for (const char* bad : {"", "0", "2(x0)", "2(x3", "x", "2,", "-1", "2(y3)"}) {
    INFO(bad);
    CHECK_FALSE(ExpandTasksPerNode(bad).ok());
  }
}

using Env = std::map<std::string, std::string>;

absl::StatusOr<SlurmTask> Resolve(const Env& env, SlurmRoles roles = {},
                                  const std::string& extras = "") {
  return ResolveSlurmTask(
      [&](const char* name) -> std::optional<std::string> {
        auto it = env.find(name);
        if (it == env.end()) return std::nullopt;
        return it->second;
      },
      roles, extras);
}

Env StepEnv(int rank) {
  return {{"SLURM_PROCID", std::to_string(rank)},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_STEP_NUM_TASKS", "7"},
          {"SLURM_STEP_NODELIST", "node[01-03],gpu7"},
          {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"}};
}

TEST_CASE("each Slurm rank derives the same cluster and its own task", "[slurm]") {
  SlurmRoles roles;
  roles.num_ps = 2;
  roles.base_port = 9000;
  std::string first_spec;
  const char* expected[] = {"chief:0", "ps:0", "ps:1", "worker:0", "worker:1", "worker:2",
                            "worker:3"};
  const char* address[] = {"node01:9000", "node01:9001", "node02:9000", "node02:9001",
                           "node03:9000", "node03:9001", "gpu7:9000"};
  for (int rank = 0; rank < 7; ++rank) {
    INFO("rank " << rank);
    auto t = Resolve(StepEnv(rank), roles);
    REQUIRE(t.ok());
    CHECK(t->task.task.ToString() == expected[rank]);
    CHECK(t->task.cluster.address(t->task.task.job, t->task.task.index) == address[rank]);
    CHECK(t->rank == rank);
    CHECK(t->num_tasks == 7);
    CHECK(t->node == std::string(address[rank]).substr(0, std::string(address[rank]).find(':')));
    // The TF_CONFIG it hands the daemon parses back to the same task.
    auto back = ParseTfConfig(t->tf_config);
    REQUIRE(back.ok());
    CHECK(back->task.ToString() == expected[rank]);
    const std::string spec = nlohmann::json::parse(t->tf_config)["cluster"].dump();
    if (rank == 0) first_spec = spec;
    CHECK(spec == first_spec);
  }
  auto t = Resolve(StepEnv(0), roles);
  REQUIRE(t.ok());
  CHECK(t->task.cluster.num_ps() == 2);
  CHECK(t->task.cluster.num_workers() == 4);
}

TEST_CASE("a batch script outside srun is not taken for a task", "[slurm]") {
  // What sbatch gives the script itself: rank 0 of the job, no step.
  Env batch = {{"SLURM_PROCID", "0"},
               {"SLURM_NTASKS", "3"},
               {"SLURM_JOB_NODELIST", "vm"},
               {"SLURM_TASKS_PER_NODE", "3"},
               {"SLURMD_NODENAME", "vm"}};
  auto t = Resolve(batch);
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().message().find("start every task with srun") != std::string::npos);
}

TEST_CASE("a rank where Slurm really placed it gets its node's next port", "[slurm]") {
  Env env = StepEnv(3);
  env["SLURMD_NODENAME"] = "node02";
  env["SLURM_NODEID"] = "1";
  env["SLURM_LOCALID"] = "1";
  auto t = Resolve(env, {}, R"({"insecure": true})");
  REQUIRE(t.ok());
  CHECK(t->task.task.ToString() == "worker:1");  // 1 ps by default
  CHECK(t->task.cluster.address("worker", 1) == "node02:8471");
  CHECK(t->node_index == 1);
  CHECK(t->local_index == 1);
  CHECK(t->task.cluster.insecure());
  // Cyclic placement would put rank 3 elsewhere: refused, not mis-addressed.
  for (const auto& [name, value] : {std::pair{"SLURMD_NODENAME", "node01"},
                                    std::pair{"SLURM_NODEID", "0"},
                                    std::pair{"SLURM_LOCALID", "0"}}) {
    Env moved = env;
    moved[name] = value;
    auto m = Resolve(moved);
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().message().find("--distribution=block") != std::string::npos);
    CHECK(m.status().message().find(name) != std::string::npos);
  }
}

TEST_CASE("a Slurm allocation that does not fit the roles is one clear line", "[slurm]") {
  SlurmRoles roles;
  roles.num_ps = 2;
  Env env = StepEnv(0);
  env["SLURM_STEP_NUM_TASKS"] = "3";
  env["SLURM_STEP_TASKS_PER_NODE"] = "1(x3)";
  env["SLURM_STEP_NODELIST"] = "n[1-3]";
  auto t = Resolve(env, roles);
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().message() ==
        "Slurm gave 3 task(s), but 1 chief + 2 ps + at least 1 worker need 4: ask for "
        "--ntasks=4 or more");
  roles.num_workers = 2;
  t = Resolve(StepEnv(0), roles);
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().message() ==
        "Slurm gave 7 task(s), but 1 chief + 2 ps + 2 worker(s) need exactly 5: ask for "
        "--ntasks=5");

  CHECK(Resolve({}).status().message().find("SLURM_PROCID or SLURM_STEP_ID is unset") !=
        std::string::npos);
  Env partial = {{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}};
  CHECK(Resolve(partial).status().message() ==
        "Slurm's environment is incomplete: SLURM_STEP_NODELIST is unset (srun sets it)");
  env = StepEnv(0);
  env["SLURM_STEP_NUM_TASKS"] = "6";
  CHECK(Resolve(env).status().message().find("disagrees") != std::string::npos);
  env = StepEnv(7);
  CHECK_FALSE(Resolve(env).ok());
  roles = {};
  roles.base_port = 65535;
  CHECK(Resolve(StepEnv(0), roles).status().message().find("--base_port") != std::string::npos);
  roles = {};
  roles.num_ps = 0;
  CHECK_FALSE(Resolve(StepEnv(0), roles).ok());
}

}  // namespace
}  // namespace pstrain
