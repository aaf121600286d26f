// The rank environment: the three name families, the denylist, -x, no duplicates.
#include "launcher/job/environment.h"

#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "ringrun/common/env_contract.h"

using Catch::Matchers::Contains;
using ringrun::launcher::hosts::RankPlacement;
using ringrun::launcher::job::BuildRankEnvironment;
using ringrun::launcher::job::ContractVariableNames;
using ringrun::launcher::job::IsContractVariable;
using ringrun::launcher::job::IsDeniedVariable;
using ringrun::launcher::job::JobContext;
using ringrun::launcher::job::ParseExportFlag;

namespace {

std::map<std::string, std::string> AsMap(const std::vector<std::string>& env) {
  std::map<std::string, std::string> m;
  for (const std::string& e : env) {
    size_t eq = e.find('=');
    REQUIRE(eq != std::string::npos);
    m[e.substr(0, eq)] = e.substr(eq + 1);
  }
  return m;
}

void CheckNoDuplicates(const std::vector<std::string>& env) {
  std::set<std::string> names;
  for (const std::string& e : env) {
    std::string name = e.substr(0, e.find('='));
    INFO(name);
    CHECK(names.insert(name).second);
  }
}

ringrun::launcher::hosts::RankPlacement Placement() {
  RankPlacement p;
  p.rank = 5;
  p.host_index = 2;
  p.local_rank = 1;
  p.local_size = 3;
  p.cross_rank = 1;
  p.cross_size = 2;
  p.node_rank = 1;
  p.node_count = 2;
  return p;
}

ringrun::launcher::job::JobContext Job() {
  JobContext j;
  j.job_id = "job-42";
  j.job_service = "127.0.0.1:4567";
  j.secret = std::string(64, 'a');
  j.hostname = "node-b";
  j.host_addr = "198.18.0.3";
  j.master_addr = "198.18.0.2";
  j.master_port = 29500;
  j.size = 6;
  return j;
}

}  // namespace

TEST_CASE("environment: a restarted job's count, limit and run id", "[environment]") {
  ringrun::launcher::job::JobContext job = Job();
  job.restart_count = 2;
  job.max_restarts = 3;
  job.run_id = "job-41";  // the first attempt's job id
  auto env = AsMap(ringrun::launcher::job::BuildRankEnvironment({}, {}, Placement(), job));
  CHECK(env[ringrun::env::kRestartCount] == "2");
  CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "2");
  CHECK(env["TORCHELASTIC_MAX_RESTARTS"] == "3");
  CHECK(env["TORCHELASTIC_RUN_ID"] == "job-41");  // one for every attempt, as torchrun's
  CHECK(env[ringrun::env::kJobId] == "job-42");   // the attempt's own
  // Inherited from an enclosing torchrun or ringrun job: replaced, never passed on.
  env = AsMap(ringrun::launcher::job::BuildRankEnvironment(
      {"RINGRUN_RESTART_COUNT=9", "TORCHELASTIC_RESTART_COUNT=9"}, {}, Placement(), Job()));
  CHECK(env[ringrun::env::kRestartCount] == "0");
  CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "0");
}

TEST_CASE("environment: all three name families", "[environment]") {
  auto env = AsMap(
      ringrun::launcher::job::BuildRankEnvironment({"PATH=/usr/bin"}, {}, Placement(), Job()));
  CHECK(env["PATH"] == "/usr/bin");
  // ours
  CHECK(env[ringrun::env::kRank] == "5");
  CHECK(env[ringrun::env::kSize] == "6");
  CHECK(env[ringrun::env::kLocalRank] == "1");
  CHECK(env[ringrun::env::kLocalSize] == "3");
  CHECK(env[ringrun::env::kCrossRank] == "1");
  CHECK(env[ringrun::env::kCrossSize] == "2");
  CHECK(env[ringrun::env::kHostname] == "node-b");
  CHECK(env[ringrun::env::kJobId] == "job-42");
  CHECK(env[ringrun::env::kJobService] == "127.0.0.1:4567");
  CHECK(env[ringrun::env::kSecret] == std::string(64, 'a'));
  CHECK(env[ringrun::env::kHostAddr] == "198.18.0.3");
  CHECK(env[ringrun::env::kHostIndex] == "2");
  CHECK(env[ringrun::env::kRestartCount] == "0");
  // Horovod's
  CHECK(env["HOROVOD_RANK"] == "5");
  CHECK(env["HOROVOD_SIZE"] == "6");
  CHECK(env["HOROVOD_LOCAL_RANK"] == "1");
  CHECK(env["HOROVOD_LOCAL_SIZE"] == "3");
  CHECK(env["HOROVOD_CROSS_RANK"] == "1");
  CHECK(env["HOROVOD_CROSS_SIZE"] == "2");
  CHECK(env["HOROVOD_HOSTNAME"] == "node-b");
  // torchrun's
  CHECK(env["RANK"] == "5");
  CHECK(env["WORLD_SIZE"] == "6");
  CHECK(env["LOCAL_RANK"] == "1");
  CHECK(env["LOCAL_WORLD_SIZE"] == "3");
  CHECK(env["GROUP_RANK"] == "1");
  CHECK(env["GROUP_WORLD_SIZE"] == "2");
  CHECK(env["ROLE_RANK"] == "5");
  CHECK(env["ROLE_WORLD_SIZE"] == "6");
  CHECK(env["MASTER_ADDR"] == "198.18.0.2");
  CHECK(env["MASTER_PORT"] == "29500");
  CHECK(env["ROLE_NAME"] == "default");
  CHECK(env["TORCHELASTIC_RUN_ID"] == "job-42");  // torch's is_torchelastic_launched()
  CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "0");
  CHECK(env["TORCHELASTIC_MAX_RESTARTS"] == "0");
  // Every contract name is there.
  for (const std::string& name : ringrun::launcher::job::ContractVariableNames()) {
    INFO(name);
    CHECK(env.count(name) == 1);
    CHECK(ringrun::launcher::job::IsContractVariable(name));
    CHECK(ringrun::launcher::job::IsDeniedVariable(name));
  }
}

TEST_CASE("environment: GROUP_WORLD_SIZE is left out when the placement lacks it",
          "[environment]") {
  ringrun::launcher::hosts::RankPlacement p = Placement();
  p.node_count = 0;
  auto env = AsMap(ringrun::launcher::job::BuildRankEnvironment({}, {}, p, Job()));
  CHECK(env.count("GROUP_WORLD_SIZE") == 0);
  CHECK(env["GROUP_RANK"] == "1");
}

TEST_CASE("environment: the denylist drops session and contract variables", "[environment]") {
  const std::vector<std::string> launcher = {
      "PATH=/bin",
      "HOME=/root",
      "SHLVL=2",
      "PWD=/x",
      "OLDPWD=/y",
      "_=/usr/bin/ringrun",
      "SSH_CLIENT=1.2.3.4 5 22",
      "SSH_CONNECTION=a b c d",
      "SSH_TTY=/dev/pts/0",
      "SSH_AUTH_SOCK=/tmp/agent",
      "TERM_SESSION_ID=w0",
      "WINDOWID=1",
      "DISPLAY=:0",
      "XDG_SESSION_ID=3",
      "XDG_RUNTIME_DIR=/run/user/0",
      "PS1=$ ",
      "PROMPT_COMMAND=x",
      "TMUX=t",
      "TMUX_PANE=%1",
      "STY=s",
      "RINGRUN_JOB_ID=old",
      "RINGRUN_SECRET=old",
      "RINGRUN_TIMEOUT_MS=5000",
      "HOROVOD_RANK=9",
      "HOROVOD_SIZE=9",
      "RANK=9",
      "WORLD_SIZE=9",
      "LOCAL_RANK=9",
      "LOCAL_WORLD_SIZE=9",
      "GROUP_RANK=9",
      "MASTER_ADDR=old",
      "MASTER_PORT=1",
      "OMPI_COMM_WORLD_RANK=9",
      "OMPI_COMM_WORLD_SIZE=9",
      "PMI_RANK=9",
      "PMIX_RANK=9",
      "TORCHELASTIC_RUN_ID=r",
      "TORCHELASTIC_ERROR_FILE=/tmp/e",
      "SLURM_PROCID=9",
      "HOROVOD_FUSION_THRESHOLD=64",
      "NCCL_DEBUG=INFO",
      "OMPI_MCA_btl=tcp",
      "CUDA_VISIBLE_DEVICES=0,1",
      "TERM=xterm",
      "LANG=C.UTF-8",
      "SLURM_JOB_ID=77",
      "HOSTNAME=launcher-host",
  };
  auto built = ringrun::launcher::job::BuildRankEnvironment(launcher, {}, Placement(), Job());
  CheckNoDuplicates(built);
  auto env = AsMap(built);
  for (const char* kept :
       {"PATH", "HOME", "HOROVOD_FUSION_THRESHOLD", "NCCL_DEBUG", "OMPI_MCA_btl",
        "CUDA_VISIBLE_DEVICES", "TERM", "LANG", "SLURM_JOB_ID", "RINGRUN_TIMEOUT_MS"}) {
    INFO(kept);
    CHECK(env.count(kept) == 1);
    CHECK_FALSE(ringrun::launcher::job::IsDeniedVariable(kept));
  }
  for (const char* gone : {"SHLVL",
                           "PWD",
                           "OLDPWD",
                           "_",
                           "SSH_CLIENT",
                           "SSH_CONNECTION",
                           "SSH_TTY",
                           "SSH_AUTH_SOCK",
                           "TERM_SESSION_ID",
                           "WINDOWID",
                           "DISPLAY",
                           "XDG_SESSION_ID",
                           "XDG_RUNTIME_DIR",
                           "PS1",
                           "PROMPT_COMMAND",
                           "TMUX",
                           "TMUX_PANE",
                           "STY",
                           "OMPI_COMM_WORLD_RANK",
                           "OMPI_COMM_WORLD_SIZE",
                           "PMI_RANK",
                           "PMIX_RANK",
                           "TORCHELASTIC_ERROR_FILE",
                           "SLURM_PROCID",
                           "HOSTNAME"}) {
    INFO(gone);
    CHECK(env.count(gone) == 0);
    CHECK(ringrun::launcher::job::IsDeniedVariable(gone));
  }
  // Inherited contract values are replaced by this job's.
  CHECK(env["RINGRUN_JOB_ID"] == "job-42");
  CHECK(env["TORCHELASTIC_RUN_ID"] == "job-42");
  CHECK(env["RINGRUN_SECRET"] != "old");  // an enclosing job's contract never leaks through
  CHECK(env["HOROVOD_RANK"] == "5");
  CHECK(env["RANK"] == "5");
  CHECK(env["MASTER_ADDR"] == "198.18.0.2");
}

TEST_CASE("environment: -x overrides the launcher's value in place", "[environment]") {
  auto built = ringrun::launcher::job::BuildRankEnvironment(
      {"A=1", "FOO=old", "B=2"}, {{"FOO", "new"}, {"NEW", "v"}}, Placement(), Job());
  CheckNoDuplicates(built);
  REQUIRE(built.size() >= 4);
  CHECK(built[0] == "A=1");
  CHECK(built[1] == "FOO=new");
  CHECK(built[2] == "B=2");
  CHECK(built[3] == "NEW=v");
}

TEST_CASE("environment: -x passes a denied variable when asked", "[environment]") {
  auto env = AsMap(ringrun::launcher::job::BuildRankEnvironment(
      {"SHLVL=3"}, {{"SHLVL", "3"}, {"DISPLAY", ":1"}}, Placement(), Job()));
  CHECK(env["SHLVL"] == "3");
  CHECK(env["DISPLAY"] == ":1");
}

TEST_CASE("environment: contract wins over exports, and nothing is duplicated", "[environment]") {
  auto built = ringrun::launcher::job::BuildRankEnvironment(
      {"X=1", "X=2", "noequals", "=empty", "Y="}, {{"RANK", "99"}, {"X", "3"}, {"X", "4"}},
      Placement(), Job());
  CheckNoDuplicates(built);
  auto env = AsMap(built);
  CHECK(env["RANK"] == "5");
  CHECK(env["X"] == "4");
  CHECK(env["Y"] == "");
  CHECK(env.count("noequals") == 0);
  CHECK(env.count("") == 0);
}

TEST_CASE("environment: the first of duplicate launcher entries wins, as getenv", "[environment]") {
  auto env = AsMap(ringrun::launcher::job::BuildRankEnvironment({"X=first", "X=second"}, {},
                                                                Placement(), Job()));
  CHECK(env["X"] == "first");
}

TEST_CASE("environment: values are byte for byte", "[environment]") {
  const std::string odd = "a b 'q' \"d\" $(id) `id` ; \n caf\xC3\xA9 =x";
  auto env = AsMap(ringrun::launcher::job::BuildRankEnvironment({"ODD=" + odd}, {{"ODD2", odd}},
                                                                Placement(), Job()));
  CHECK(env["ODD"] == odd);
  CHECK(env["ODD2"] == odd);
}

TEST_CASE("export: -x NAME=VALUE and -x NAME", "[environment]") {
  const std::vector<std::string> launcher = {"FOO=from-env", "EMPTY="};
  auto r = ringrun::launcher::job::ParseExportFlag("FOO", launcher);
  REQUIRE(r.ok());
  CHECK(r->first == "FOO");
  CHECK(r->second == "from-env");
  r = ParseExportFlag("EMPTY", launcher);
  REQUIRE(r.ok());
  CHECK(r->second.empty());
  r = ParseExportFlag("BAR=a=b c", launcher);
  REQUIRE(r.ok());
  CHECK(r->first == "BAR");
  CHECK(r->second == "a=b c");
  r = ParseExportFlag("BAR=", launcher);
  REQUIRE(r.ok());
  CHECK(r->second.empty());
  r = ParseExportFlag("_x1", launcher);
  CHECK_FALSE(r.ok());  // valid name, but unset
}

TEST_CASE("export: -x errors name the flag", "[environment]") {
  CHECK_THAT(ringrun::launcher::job::ParseExportFlag("NOPE", {}).status().message(),
             Contains("-x NOPE"));
  CHECK_THAT(ringrun::launcher::job::ParseExportFlag("NOPE", {}).status().message(),
             Contains("not set"));
  CHECK_THAT(ringrun::launcher::job::ParseExportFlag("1A=2", {}).status().message(),
             Contains("-x 1A=2"));
  CHECK_THAT(ringrun::launcher::job::ParseExportFlag("A-B=2", {}).status().message(),
             Contains("not a valid variable name"));
  CHECK_THAT(ringrun::launcher::job::ParseExportFlag("=2", {}).status().message(),
             Contains("missing variable name"));
  CHECK_THAT(ringrun::launcher::job::ParseExportFlag("", {}).status().message(), Contains("-x"));
  CHECK_THAT(ringrun::launcher::job::ParseExportFlag("RANK=3", {}).status().message(),
             Contains("set by ringrun"));
  CHECK_THAT(ringrun::launcher::job::ParseExportFlag("RINGRUN_SECRET=x", {}).status().message(),
             Contains("-x RINGRUN_SECRET"));
}

TEST_CASE("threads per rank: several ranks on a host share its cores", "[environment]") {
  using ringrun::launcher::job::DefaultThreadsPerRank;
  CHECK(ringrun::launcher::job::DefaultThreadsPerRank({"PATH=/usr/bin"}, {}, 2, 2) == 1);
  CHECK(ringrun::launcher::job::DefaultThreadsPerRank({}, {}, 4, 64) == 16);
  CHECK(DefaultThreadsPerRank({}, {}, 8, 4) == 1);   // never below one
  CHECK(DefaultThreadsPerRank({}, {}, 1, 64) == 0);  // one rank per host keeps every core
  // A count the user chose, in the environment or with -x, wins.
  CHECK(DefaultThreadsPerRank({"OMP_NUM_THREADS=3"}, {}, 2, 2) == 0);
  CHECK(DefaultThreadsPerRank({"OPENBLAS_NUM_THREADS=2"}, {}, 2, 8) == 0);
  CHECK(DefaultThreadsPerRank({"MKL_NUM_THREADS=2"}, {}, 2, 8) == 0);
  CHECK(DefaultThreadsPerRank({}, {{"OMP_NUM_THREADS", "4"}}, 2, 8) == 0);
  CHECK(DefaultThreadsPerRank({"OMP_NUM_THREADS_X=1"}, {}, 2, 8) == 4);
}

TEST_CASE("threads per rank: the counts are set after the exports", "[environment]") {
  ringrun::launcher::job::JobContext job = Job();
  job.threads_per_rank = 3;
  auto env = AsMap(ringrun::launcher::job::BuildRankEnvironment({"PATH=/usr/bin"}, {{"OTHER", "x"}},
                                                                Placement(), job));
  CHECK(env["OMP_NUM_THREADS"] == "3");
  CHECK(env["OPENBLAS_NUM_THREADS"] == "3");
  CHECK(env["MKL_NUM_THREADS"] == "3");
  job.threads_per_rank = 0;
  auto plain =
      AsMap(ringrun::launcher::job::BuildRankEnvironment({"PATH=/usr/bin"}, {}, Placement(), job));
  CHECK(plain.count("OMP_NUM_THREADS") == 0);
}
