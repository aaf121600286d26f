// Scheduler allocations: Slurm's hostlist grammar (checked against `scontrol show hostnames`),
// task counts, reading an allocation from the environment, the rank environment inside one, the
// srun command and environment, the --starter choice, and the PBS/LSF/SGE host lists.
#include "launcher/hosts/slurm.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "launcher/hosts/scheduler_hosts.h"
#include "launcher/job/environment.h"
#include "launcher/options.h"
#include "launcher/starters/slurm_agent_starter.h"

using Catch::Matchers::Contains;
using namespace ringrun::launcher;

namespace {

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

std::string Shape(const std::vector<hosts::HostSpec>& hosts) {
  std::string s;
  for (const hosts::HostSpec& h : hosts)
    s += (s.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots);
  return s;
}

std::string Fixture(const std::string& name) {
  return std::string(RINGRUN_HOSTFILES_DIR) + "/fixtures/" + name;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Expression -> `scontrol show hostnames EXPR` (Slurm 22.05.8), one name per line joined by ' '.
struct Case {
  const char* expr;
  const char* expected;
};
const Case kTable[] = {
    {"node[01-04,07],gpu[1-2]", "node01 node02 node03 node04 node07 gpu1 gpu2"},
    {"a[1-2]b[3-4]", "a1b3 a1b4 a2b3 a2b4"},
    {"foo", "foo"},
    {"foo,bar[1-2]", "foo bar1 bar2"},
    {"n[8-10]", "n8 n9 n10"},
    {"n[008-10]", "n008 n009 n010"},
    {"n[1-3,5-6,9]", "n1 n2 n3 n5 n6 n9"},
    {"a b,c", "a b c"},
    {"rack[1-2]_n[01-2]", "rack1_n01 rack1_n02 rack2_n01 rack2_n02"},
    {"n-[1-2]", "n-1 n-2"},
    {"[1-3]", "1 2 3"},
    {"n[1-2],,n3", "n1 n2 n3"},
    {",n1", "n1"},
    {"n1,", "n1"},
    {"n[0-0]", "n0"},
    {"n[00-02]", "n00 n01 n02"},
    {"n[1-2][3-4]", "n13 n14 n23 n24"},
    {"a.b[1-2]", "a.b1 a.b2"},
    {"n[1,1]", "n1 n1"},
    {"n[01-3]", "n01 n02 n03"},
    {"n[1-03]", "n1 n2 n3"},
    {"h[1-2]x[1-2]y[1-2]", "h1x1y1 h1x1y2 h2x1y1 h2x1y2 h1x2y1 h1x2y2 h2x2y1 h2x2y2"},
    {"N[1-2]", "N1 N2"},
    {"n[09-11]", "n09 n10 n11"},
    {"n[1-2]a[3]", "n1a3 n2a3"},
    {"a,b c\td", "a b c d"},
    {"n0[1-2]", "n01 n02"},
    {"a-b", "a-b"},
    {"n[1-2],n[2-3]", "n1 n2 n2 n3"},
    {"n[010-12]", "n010 n011 n012"},
    {"gpu-[7-9],cpu-[0098-0101]", "gpu-7 gpu-8 gpu-9 cpu-0098 cpu-0099 cpu-0100 cpu-0101"},
    {"x[1-2]y[3]z[4-5]", "x1y3z4 x1y3z5 x2y3z4 x2y3z5"},
    {"r[1-2]n[1-2]s[1-2]t[1-2]",
     "r1n1s1t1 r1n1s1t2 r2n1s1t1 r2n1s1t2 r1n2s1t1 r1n2s1t2 r2n2s1t1 r2n2s1t2 r1n1s2t1 r1n1s2t2 "
     "r2n1s2t1 r2n1s2t2 r1n2s2t1 r1n2s2t2 r2n2s2t1 r2n2s2t2"},
};

// Rejected by Slurm too ("Invalid hostlist"); the message must quote this text.
struct BadCase {
  const char* expr;
  const char* quoted;
};
const BadCase kBad[] = {
    {"x[1-2]y", "x[1-2]y"}, {"n[10-8]", "10-8"},       {"n[1-2]-ib", "-ib"},
    {"n[]", "n[]"},         {"n[a-b]", "a-b"},         {"n[1--2]", "1--2"},
    {"n[-1]", "-1"},        {"a.b[1-2].c", ".c"},      {"n[1-2,]", "n[1-2,]"},
    {"n[,1]", "n[,1]"},     {"n[[1-2]]", "n[[1-2]]"},  {"n[1-2]]", "n[1-2]]"},
    {"n[1]x", "n[1]x"},     {"n[1-2]0", "n[1-2]0"},    {"n[2-1,3]", "2-1"},
    {"n[1-3x]", "1-3x"},    {"n[1-65537]", "1-65537"}, {"n[1-2", "n[1-2"},
    {"n1-2]", "n1-2]"},
};

// Runs `scontrol show hostnames EXPR` with a minimal configuration (it needs no controller).
// Returns false when scontrol is not installed.
bool Scontrol(const std::string& expr, std::string* out) {
  if (::access("/usr/bin/scontrol", X_OK) != 0) return false;
  // A minimal configuration, removed when the tests end.
  struct TempConf {
    std::string path;
    TempConf() {
      char p[] = "/tmp/ringrun-scontrol-XXXXXX";
      int fd = ::mkstemp(p);
      const char text[] = "ClusterName=unit\nSlurmctldHost=localhost\n";
      (void)!::write(fd, text, sizeof(text) - 1);
      ::close(fd);
      path = p;
    }
    ~TempConf() { ::unlink(path.c_str()); }
  };
  static TempConf temp;
  const std::string& conf = temp.path;
  std::string quoted = "'";
  for (char c : expr) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  std::string cmd = "SLURM_CONF=" + conf + " /usr/bin/scontrol show hostnames " + quoted + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return false;
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) text.append(buf, n);
  ::pclose(p);
  std::istringstream lines(text);
  out->clear();
  for (std::string l; std::getline(lines, l);) *out += (out->empty() ? "" : " ") + l;
  return true;
}

}  // namespace

TEST_CASE("Slurm hostlists expand as scontrol show hostnames does", "[slurm]") {
  for (const Case& c : kTable) {
    INFO(c.expr);
    auto r = hosts::ExpandHostlist(c.expr);
    REQUIRE(r.ok());
    CHECK(Join(*r) == c.expected);
  }
  CHECK(hosts::ExpandHostlist("").value().empty());
  CHECK(hosts::ExpandHostlist("n[1-65536]").value().size() == 65536);
}

TEST_CASE("A bracket of many ranges stops at the cap before expanding them", "[slurm]") {
  // 3.8 KB of "0-65535," ranges in one bracket name 31 million hosts: the 2^20-name cap must
  // refuse them before they are made, which would take seconds and about a gigabyte.
  std::string inside;
  for (int i = 0; i < 480; ++i) inside += (i ? "," : "") + std::string("0-65535");
  auto r = hosts::ExpandHostlist("n[" + inside + "]");
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Contains("names more than 1048576 hosts"));
  CHECK(hosts::ExpandHostlist("n[0-65535,0-65535,0-65535,0-65535,0-65535,0-65535,0-65535,0-65535,"
                              "0-65535,0-65535,0-65535,0-65535,0-65535,0-65535,0-65535,0-65535]")
            .value()
            .size() == 1u << 20);
}

TEST_CASE("Malformed Slurm hostlists are errors quoting the bad token", "[slurm]") {
  for (const BadCase& c : kBad) {
    INFO(c.expr);
    auto r = hosts::ExpandHostlist(c.expr);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Contains(c.quoted));
  }
  // Corners where Slurm is laxer than this parser (documented in slurm.h).
  for (const char* e : {"n[ 1-2]", "n[+1-2]", "n[1-]", "n[999999999999999999999]"}) {
    INFO(e);
    CHECK_FALSE(hosts::ExpandHostlist(e).ok());
  }
}

TEST_CASE("The hostlist table agrees with the installed scontrol", "[slurm]") {
  std::string out;
  if (!Scontrol("n[1-2]", &out)) {
    WARN("scontrol not installed: the table is checked against its recorded output only");
    return;
  }
  for (const Case& c : kTable) {
    INFO(c.expr);
    REQUIRE(Scontrol(c.expr, &out));
    CHECK(out == c.expected);
  }
  for (const BadCase& c : kBad) {
    INFO(c.expr);
    REQUIRE(Scontrol(c.expr, &out));
    if (std::string(c.expr) == "n[1-2") continue;  // Slurm prints "n]"; an error here
    if (std::string(c.expr) == "n1-2]") continue;  // Slurm keeps it as a name; an error here
    CHECK_THAT(out, Contains("Invalid hostlist"));
  }
}

TEST_CASE("Slurm count lists", "[slurm]") {
  auto r = hosts::ExpandCountList("2(x3),1");
  REQUIRE(r.ok());
  CHECK(*r == std::vector<int>{2, 2, 2, 1});
  CHECK(hosts::ExpandCountList("4").value() == std::vector<int>{4});
  CHECK(hosts::ExpandCountList("72(x2),36").value() == std::vector<int>{72, 72, 36});
  for (const char* bad : {"", "2(x3", "2x3", "a", "2(x0)", "2(x)", "-1", "2,,1", "(x2)", "2(y3)"}) {
    INFO(bad);
    CHECK_FALSE(hosts::ExpandCountList(bad).ok());
  }
  CHECK_THAT(hosts::ExpandCountList("2,x").status().message(), Contains("'x'"));
}

TEST_CASE("A Slurm allocation from the environment", "[slurm]") {
  std::vector<std::string> env = {"SLURM_JOB_ID=12", "SLURM_JOB_NODELIST=n[1-3],gpu7",
                                  "SLURM_TASKS_PER_NODE=2(x3),1", "SLURM_NODELIST=ignored"};
  REQUIRE(hosts::InSlurmJob(env));
  auto a = hosts::ReadSlurmAllocation(env);
  REQUIRE(a.ok());
  CHECK(Shape(a->hosts) == "n1:2,n2:2,n3:2,gpu7:1");
  CHECK_FALSE(a->inside_step);
  CHECK_THAT(a->source, Contains("SLURM_JOB_NODELIST=n[1-3],gpu7"));
  CHECK_THAT(a->source, Contains("SLURM_TASKS_PER_NODE=2(x3),1"));

  // The older names, and more counts than nodes (tolerated).
  a = hosts::ReadSlurmAllocation(
      {"SLURM_JOBID=3", "SLURM_NODELIST=x1", "SLURM_TASKS_PER_NODE=4(x30)"});
  REQUIRE(a.ok());
  CHECK(Shape(a->hosts) == "x1:4");

  // Inside a step: the step's own pair.
  a = hosts::ReadSlurmAllocation({"SLURM_JOB_ID=3", "SLURM_STEP_ID=0", "SLURM_JOB_NODELIST=n[1-3]",
                                  "SLURM_TASKS_PER_NODE=1", "SLURM_STEP_NODELIST=n2",
                                  "SLURM_STEP_TASKS_PER_NODE=1"});
  REQUIRE(a.ok());
  CHECK(a->inside_step);
  CHECK(Shape(a->hosts) == "n2:1");

  auto err = [](std::vector<std::string> e) {
    return hosts::ReadSlurmAllocation(e).status().message();
  };
  CHECK_THAT(err({"SLURM_JOB_ID=1", "SLURM_JOB_NODELIST=n[1-x]", "SLURM_TASKS_PER_NODE=1"}),
             Contains("SLURM_JOB_NODELIST=n[1-x]") && Contains("'1-x'"));
  CHECK_THAT(err({"SLURM_JOB_ID=1", "SLURM_JOB_NODELIST=n[1-2]", "SLURM_TASKS_PER_NODE=1(x2"}),
             Contains("SLURM_TASKS_PER_NODE=1(x2") && Contains("'1(x2'"));
  CHECK_THAT(err({"SLURM_JOB_ID=1", "SLURM_JOB_NODELIST=n[1-3]", "SLURM_TASKS_PER_NODE=1,1"}),
             Contains("2 counts for the 3 hosts"));
  CHECK_THAT(err({"SLURM_JOB_ID=1", "SLURM_TASKS_PER_NODE=1"}),
             Contains("SLURM_JOB_NODELIST is not set"));
  CHECK_THAT(err({"SLURM_JOB_ID=1", "SLURM_JOB_NODELIST=n[1,1]", "SLURM_TASKS_PER_NODE=1(x2)"}),
             Contains("'n1' is listed twice"));
}

TEST_CASE("Ranks do not inherit the launcher's Slurm task variables", "[slurm]") {
  for (const char* v :
       {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS",
        "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NODELIST", "SLURM_GTIDS", "SLURM_TASK_PID",
        "SLURMD_NODENAME", "SLURM_SRUN_COMM_PORT", "SLURM_CPU_BIND_TYPE", "PMI_RANK"}) {
    INFO(v);
    CHECK(job::IsDeniedVariable(v));
  }
  for (const char* v : {"SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_CONF", "SLURM_CLUSTER_NAME"}) {
    INFO(v);
    CHECK_FALSE(job::IsDeniedVariable(v));
  }
  hosts::RankPlacement p;
  p.rank = 3;
  job::JobContext ctx;
  ctx.size = 4;
  auto env =
      job::BuildRankEnvironment({"SLURM_PROCID=0", "SLURM_NTASKS=7", "SLURM_JOB_ID=9"}, {}, p, ctx);
  std::string all = Join(env);
  CHECK_THAT(all,
             !Contains("SLURM_PROCID") && !Contains("SLURM_NTASKS") && Contains("SLURM_JOB_ID=9"));
}

TEST_CASE("The srun command and environment", "[slurm]") {
  starters::SlurmStarterConfig c;
  c.host_names = {"n1", "n2", "n3", "n4"};
  c.active_hosts = {0, 1, 3};
  starters::AgentLaunch launch;
  launch.service_port = 4321;
  launch.secret = "s3cr3t";
  launch.agent_path = "/opt/rr/ringrun-agent";
  launch.log_level = "info";
  std::string cmd = Join(starters::BuildSrunCommand(c, launch, "10.0.0.1"));
  CHECK(cmd ==
        "srun --nodes=3 --ntasks=3 --ntasks-per-node=1 --nodelist=n1,n2,n4 --kill-on-bad-exit=1 "
        "--cpu-bind=none --mpi=none --job-name=ringrun-agents /opt/rr/ringrun-agent --launcher "
        "10.0.0.1:4321 --slurm-hosts n1,n2,n3,n4 --log-level info");
  CHECK_THAT(cmd, !Contains("s3cr3t"));
  // An elastic job: a step of one node for each host.
  c.step_per_host = true;
  launch.host_index = 1;
  CHECK(Join(BuildSrunCommand(c, launch, "10.0.0.1")) ==
        "srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --nodelist=n2 --kill-on-bad-exit=1 "
        "--cpu-bind=none --mpi=none --job-name=ringrun-agents /opt/rr/ringrun-agent --launcher "
        "10.0.0.1:4321 --slurm-hosts n1,n2,n3,n4 --log-level info");
  c.step_per_host = false;
  c.overlap = true;
  CHECK_THAT(Join(BuildSrunCommand(c, launch, "fe80::1")),
             Contains("--overlap") && Contains("--launcher [fe80::1]:4321"));

  auto env = starters::BuildSrunEnvironment(
      {"PATH=/bin", "SLURM_JOB_ID=5", "SLURM_NTASKS=7", "SLURM_PROCID=0",
       "SLURM_CPU_BIND=map_cpu:1", "SLURM_EXACT=1", "RINGRUN_AGENT_SECRET=old"},
      "s3cr3t");
  CHECK(Join(env) == "PATH=/bin SLURM_JOB_ID=5 RINGRUN_AGENT_SECRET=s3cr3t");

  c.launcher_address = "192.0.2.7";
  CHECK(starters::SlurmLauncherAddress(c).value() == "192.0.2.7");
  c.launcher_address.clear();
  c.host_names = {"localhost"};
  c.active_hosts = {0};
  CHECK(SlurmLauncherAddress(c).value() == "127.0.0.1");
}

TEST_CASE("Inside a Slurm job, the hosts and the starter come from the job", "[slurm]") {
  std::vector<std::string> job = {"SLURM_JOB_ID=12", "SLURM_JOB_NODELIST=n[1-3]",
                                  "SLURM_TASKS_PER_NODE=2(x2),1"};
  auto parse = [](std::vector<std::string> args, const std::vector<std::string>& env) {
    args.insert(args.begin(), "ringrun");
    std::vector<const char*> argv;
    for (auto& a : args) argv.push_back(a.c_str());
    return ParseCommandLine(static_cast<int>(argv.size()), argv.data(), env);
  };
  ParseOutcome o = parse({"./train"}, job);
  REQUIRE(o.kind == ParseOutcome::kRun);
  CHECK(Shape(o.options.hosts) == "n1:2,n2:2,n3:1");
  CHECK(o.options.np == 5);
  CHECK(o.options.starter == Options::Starter::kSlurm);
  CHECK_FALSE(o.options.srun_overlap);
  CHECK_THAT(o.options.host_source, Contains("Slurm job 12"));

  o = parse({"-np", "3", "./train"}, job);
  CHECK(o.options.np == 3);

  // -H wins; nodes of the job still start through srun, other hosts over SSH.
  o = parse({"-H", "n2:4", "./train"}, job);
  CHECK(Shape(o.options.hosts) == "n2:4");
  CHECK(o.options.starter == Options::Starter::kSlurm);
  o = parse({"-H", "elsewhere:2", "./train"}, job);
  CHECK(o.options.starter == Options::Starter::kSsh);
  o = parse({"--starter", "ssh", "./train"}, job);
  CHECK(o.options.starter == Options::Starter::kSsh);
  CHECK(Shape(o.options.hosts) == "n1:2,n2:2,n3:1");

  // An elastic job: the allocation is its host set.
  o = parse({"-np", "5", "--min-np", "3", "./train"}, job);
  REQUIRE(o.kind == ParseOutcome::kRun);
  CHECK(o.options.starter == Options::Starter::kSlurm);
  CHECK(o.options.elastic.enabled);
  CHECK(o.options.elastic.min_np == 3);

  // Inside a step, the agent step overlaps it.
  auto in_step = job;
  in_step.insert(in_step.end(),
                 {"SLURM_STEP_ID=0", "SLURM_STEP_NODELIST=n1", "SLURM_STEP_TASKS_PER_NODE=1"});
  o = parse({"./train"}, in_step);
  CHECK(o.options.srun_overlap);
  CHECK(Shape(o.options.hosts) == "n1:1");

  // Usage errors: exit 2 naming the variable and the token.
  o = parse({"./train"},
            {"SLURM_JOB_ID=12", "SLURM_JOB_NODELIST=n[3-1]", "SLURM_TASKS_PER_NODE=1"});
  REQUIRE(o.kind == ParseOutcome::kExitNow);
  CHECK(o.exit_code == 2);
  CHECK_THAT(o.message, Contains("SLURM_JOB_NODELIST=n[3-1]") && Contains("'3-1'"));
  o = parse({"--starter", "slurm", "./train"}, {});
  CHECK(o.exit_code == 2);
  CHECK_THAT(o.message, Contains("not inside a Slurm job"));
  o = parse({"--starter", "pbs", "./train"}, job);
  CHECK(o.exit_code == 2);
  CHECK_THAT(o.message, Contains("--starter pbs"));

  // Outside any job: as before.
  o = parse({"-np", "2", "./train"}, {});
  CHECK(Shape(o.options.hosts) == "localhost:2");
  CHECK(o.options.starter == Options::Starter::kSsh);
}

TEST_CASE("PBS, LSF and Grid Engine host lists", "[slurm][scheduler]") {
  auto pbs = hosts::ParsePbsNodefile(ReadAll(Fixture("pbs-good.txt")), "nodes");
  REQUIRE(pbs.ok());
  CHECK(Shape(*pbs) == "n1.cluster:3,n2.cluster:1,n3.cluster:1");
  CHECK_THAT(hosts::ParsePbsNodefile(ReadAll(Fixture("pbs-bad-two-words.txt")), "nodes")
                 .status()
                 .message(),
             Contains("nodes:2") && Contains("n1 n2"));
  CHECK_THAT(
      hosts::ParsePbsNodefile(ReadAll(Fixture("pbs-bad-empty.txt")), "nodes").status().message(),
      Contains("no hosts"));

  auto lsf = hosts::ParseLsfMcpuHosts("hA 2 hB 1 hA 1");
  REQUIRE(lsf.ok());
  CHECK(Shape(*lsf) == "hA:3,hB:1");
  CHECK_THAT(hosts::ParseLsfMcpuHosts("hA 2 hB").status().message(), Contains("'hB' has no count"));
  CHECK_THAT(hosts::ParseLsfMcpuHosts("hA x").status().message(), Contains("'hA x'"));
  CHECK_FALSE(hosts::ParseLsfMcpuHosts("hA 0").ok());

  auto sge = hosts::ParseSgeHostfile(ReadAll(Fixture("sge-good.txt")), "pe");
  REQUIRE(sge.ok());
  CHECK(Shape(*sge) == "n1.cluster:5,n2.cluster:2");
  CHECK_THAT(
      hosts::ParseSgeHostfile(ReadAll(Fixture("sge-bad-slots.txt")), "pe").status().message(),
      Contains("pe:2") && Contains("n2 x"));
  CHECK_THAT(hosts::ParseSgeHostfile(ReadAll(Fixture("sge-bad-missing-slots.txt")), "pe")
                 .status()
                 .message(),
             Contains("pe:2"));
  CHECK_FALSE(hosts::ParseSgeHostfile(ReadAll(Fixture("sge-bad-zero.txt")), "pe").ok());

  // Through the environment: the first scheduler present, started over SSH.
  auto h = hosts::HostsFromScheduler({"PBS_NODEFILE=" + Fixture("pbs-good.txt")});
  REQUIRE(h.ok());
  REQUIRE(h->has_value());
  CHECK((*h)->kind == hosts::SchedulerHosts::kPbs);
  CHECK_THAT((*h)->source, Contains("PBS_NODEFILE="));
  h = hosts::HostsFromScheduler({"LSB_MCPU_HOSTS=a 1 b 2"});
  CHECK(Shape((*h)->hosts) == "a:1,b:2");
  h = hosts::HostsFromScheduler({"PE_HOSTFILE=" + Fixture("sge-good.txt")});
  CHECK((*h)->kind == hosts::SchedulerHosts::kSge);
  CHECK_THAT(hosts::HostsFromScheduler({"PBS_NODEFILE=/nonexistent/x"}).status().message(),
             Contains("PBS_NODEFILE=/nonexistent/x"));
  CHECK_FALSE(hosts::HostsFromScheduler({"PATH=/bin"}).value().has_value());

  std::vector<const char*> argv = {"ringrun", "./x"};
  ParseOutcome o = ParseCommandLine(2, argv.data(), {"LSB_MCPU_HOSTS=a 1 b 2"});
  REQUIRE(o.kind == ParseOutcome::kRun);
  CHECK(Shape(o.options.hosts) == "a:1,b:2");
  CHECK(o.options.np == 3);
  CHECK(o.options.starter == Options::Starter::kSsh);
  o = ParseCommandLine(2, argv.data(), {"PE_HOSTFILE=" + Fixture("sge-bad-slots.txt")});
  CHECK(o.exit_code == 2);
  CHECK_THAT(o.message, Contains("sge-bad-slots.txt:2"));
}

namespace {

// A stand-in for srun (the real one is exercised by the slurm tests): a shell script that
// records how it was started, then runs `tail`.
std::string WriteStandIn(const std::string& dir, const std::string& tail) {
  const std::string path = dir + "/srun";
  std::ofstream f(path);
  f << "#!/bin/sh\n"
    << "{ echo \"pid=$$ pgid=$(ps -o pgid= -p $$ | tr -d ' ')\"\n"
    << "  echo \"stdin=$(readlink /proc/$$/fd/0)\"\n"
    << "  echo \"secret=$RINGRUN_AGENT_SECRET ntasks=${SLURM_NTASKS-unset}\"\n"
    << "  echo \"args=$*\"; } >" << dir << "/record\n"
    << "echo from-srun >&2\n"
    << tail << "\n";
  f.close();
  ::chmod(path.c_str(), 0755);
  return path;
}

}  // namespace

TEST_CASE("The srun starter: one step for every host, own process group, no stdin", "[slurm]") {
  char dir[] = "/tmp/ringrun-srun-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  starters::SlurmStarterConfig c;
  c.host_names = {"n1", "n2"};
  c.active_hosts = {0, 1};
  c.launcher_address = "192.0.2.1";
  c.srun = WriteStandIn(dir, "exit 3");
  starters::AgentLaunch launch;
  launch.service_port = 7;
  launch.secret = "topsecret";
  launch.agent_path = "/x/ringrun-agent";
  ::setenv("SLURM_NTASKS", "9", 1);
  auto starter = starters::MakeSlurmAgentStarter(c);
  auto h1 = starter->Start(hosts::HostSpec{"", "n1", 1}, launch);
  auto h2 = starter->Start(hosts::HostSpec{"", "n2", 1}, launch);
  ::unsetenv("SLURM_NTASKS");
  REQUIRE(h1.ok());
  REQUIRE(h2.ok());
  std::optional<int> code;
  for (int i = 0; i < 500 && !(code = (*h2)->Poll()); ++i) ::usleep(10000);
  REQUIRE(code);
  CHECK(*code == 3);
  CHECK((*h1)->Poll() == code);
  CHECK_THAT((*h1)->StderrTail(), Contains("from-srun"));
  std::string record = ReadAll(std::string(dir) + "/record");
  std::istringstream lines(record);
  std::string first;
  std::getline(lines, first);
  std::string pid = first.substr(4, first.find(' ') - 4);
  CHECK(first == "pid=" + pid + " pgid=" + pid);  // its own process group
  CHECK_THAT(record, Contains("stdin=/dev/null"));
  CHECK_THAT(record, Contains("secret=topsecret ntasks=unset"));
  CHECK_THAT(record, Contains("--nodelist=n1,n2") && Contains("--launcher 192.0.2.1:7") &&
                         !Contains("topsecret --"));

  // Kill() ends the step: SIGTERM to srun.
  c.srun = WriteStandIn(dir, "exec sleep 30");
  auto starter2 = MakeSlurmAgentStarter(c);
  auto h = starter2->Start(hosts::HostSpec{"", "n1", 1}, launch);
  REQUIRE(h.ok());
  (*h)->Kill();
  code.reset();
  for (int i = 0; i < 500 && !(code = (*h)->Poll()); ++i) ::usleep(10000);
  REQUIRE(code);
  CHECK(*code == 128 + SIGTERM);

  // No srun: an error naming it, for every host.
  c.srun = std::string(dir) + "/missing-srun";
  auto starter3 = MakeSlurmAgentStarter(c);
  auto bad = starter3->Start(hosts::HostSpec{"", "n2", 1}, launch);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Contains("n2") && Contains("missing-srun"));
  std::filesystem::remove_all(dir);
}
