#include "agent/process.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <string>

#include "agent/cpu_binding.h"
#include "tests/agent_unit/read_all.h"

namespace ringrun::agent {
namespace {

// A scratch directory with bin/tool (executable) and bin/data (not executable).
struct Tree {
  std::string dir;
  Tree() {
    char tmpl[] = "/tmp/ringrun-agent-test.XXXXXX";
    dir = ::mkdtemp(tmpl);
    ::mkdir((dir + "/bin").c_str(), 0755);
    for (const char* name : {"tool", "data"}) {
      std::ofstream(dir + "/bin/" + name) << "#!/bin/sh\n";
    }
    ::chmod((dir + "/bin/tool").c_str(), 0755);
    ::chmod((dir + "/bin/data").c_str(), 0644);
  }
  ~Tree() { (void)!std::system(("rm -rf '" + dir + "'").c_str()); }
};

TEST_CASE("a relative command path is resolved from the rank's working directory") {
  Tree t;
  // The agent's own directory is elsewhere (a remote agent runs in the login directory).
  REQUIRE(::access("bin/tool", F_OK) != 0);
  Result<std::string> r = ResolveExecutable("bin/tool", {}, t.dir);
  REQUIRE(r.ok());
  CHECK(*r == t.dir + "/bin/tool");
  CHECK(ResolveExecutable("./bin/tool", {}, t.dir + "/").value() == t.dir + "/./bin/tool");
}

TEST_CASE("relative PATH entries are searched from the rank's working directory") {
  Tree t;
  CHECK(ResolveExecutable("tool", {"PATH=/nonexistent:bin"}, t.dir).value() == t.dir + "/bin/tool");
  CHECK(ResolveExecutable("tool", {"PATH=" + t.dir + "/bin"}, "/").value() == t.dir + "/bin/tool");
  Result<std::string> missing = ResolveExecutable("tool", {"PATH=/nonexistent"}, t.dir);
  REQUIRE(!missing.ok());
  CHECK_THAT(missing.status().message(), Catch::Contains("not found in PATH (/nonexistent)"));
}

TEST_CASE("absolute paths and failures name the command") {
  Tree t;
  CHECK(ResolveExecutable(t.dir + "/bin/tool", {}, "/").value() == t.dir + "/bin/tool");
  Result<std::string> r = ResolveExecutable("bin/data", {}, t.dir);
  REQUIRE(!r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("bin/data") && Catch::Contains("permission"));
  r = ResolveExecutable("bin/nope", {}, t.dir);
  REQUIRE(!r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("bin/nope"));
}

TEST_CASE("a relative working directory and a relative command start the right program") {
  Tree t;
  // The agent runs in t's parent; the rank's directory is given relative to it, as a relative
  // --wdir would be, and the command relative to that.
  char before[4096];
  REQUIRE(::getcwd(before, sizeof(before)) != nullptr);
  const std::string parent = t.dir.substr(0, t.dir.rfind('/'));
  const std::string base = t.dir.substr(t.dir.rfind('/') + 1);
  REQUIRE(::chdir(parent.c_str()) == 0);
  SpawnRequest req;
  req.argv = {"./bin/tool"};
  req.env = {"PATH=/usr/bin:/bin"};
  req.cwd = base;
  Result<SpawnedProcess> p = MakeForkExecSpawner()->Spawn(req);
  REQUIRE(::chdir(before) == 0);
  REQUIRE(p.ok());
  int status = 0;
  REQUIRE(::waitpid(p->pid, &status, 0) == p->pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("a process with cpus runs on those CPUs only", "[cpu_binding]") {
  Result<std::vector<int>> allowed = AllowedCpus();
  REQUIRE(allowed.ok());
  const int cpu = allowed->back();
  SpawnRequest req;
  req.argv = {"/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status"};
  req.env = {"PATH=/usr/bin:/bin"};
  req.cwd = "/";
  req.cpus = {cpu};
  Result<SpawnedProcess> p = MakeForkExecSpawner()->Spawn(req);
  REQUIRE(p.ok());
  int status = 0;
  REQUIRE(::waitpid(p->pid, &status, 0) == p->pid);
  CHECK(WIFEXITED(status));
  CHECK(ReadAll(p->out.get()) == "Cpus_allowed_list:\t" + std::to_string(cpu) + "\n");
}

TEST_CASE("binding to a CPU the agent may not use fails the spawn, naming it", "[cpu_binding]") {
  Result<std::vector<int>> allowed = AllowedCpus();
  REQUIRE(allowed.ok());
  SpawnRequest req;
  req.argv = {"/bin/true"};
  req.cwd = "/";
  req.cpus = {allowed->back() + 4096};
  Result<SpawnedProcess> p = MakeForkExecSpawner()->Spawn(req);
  REQUIRE_FALSE(p.ok());
  CHECK_THAT(p.status().message(),
             Catch::Contains("binding to CPUs " + std::to_string(req.cpus[0])));
}

}  // namespace
}  // namespace ringrun::agent
