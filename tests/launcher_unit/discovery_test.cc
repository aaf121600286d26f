// The host discovery script (launcher/elastic/discovery.h): the parser on text, and real small
// shell scripts in a temporary folder: slots, bad lines, a failure, a hang, an empty output.
#include "launcher/elastic/discovery.h"

#include <signal.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "tests/launcher_unit/temp_dir.h"

namespace ringrun::launcher::elastic {
namespace {

using testing::TempDir;

// Writes an executable shell script `name` with `body` into `dir`; returns its path.
std::string Script(const TempDir& dir, const std::string& name, const std::string& body) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << "#!/bin/sh\n" << body;
  REQUIRE(::chmod(path.c_str(), 0755) == 0);
  return path;
}

Result<HostSet> Run(const std::string& script, int default_slots = 1, int timeout_ms = 5000) {
  DiscoveryOptions o;
  o.script = script;
  o.default_slots = default_slots;
  o.timeout_ms = timeout_ms;
  return RunDiscoveryScript(o);
}

TEST_CASE("discovery: host and host:slots lines, default slots, blanks ignored", "[discovery]") {
  Result<HostSet> hosts =
      ParseDiscoveryOutput("h1\n  h2:4  \n\n\t\n10.0.0.7:2\r\n[fe80::1]:3\n::1\n", "s.sh", 8);
  REQUIRE(hosts.ok());
  CHECK(*hosts == HostSet{{"h1", 8}, {"h2", 4}, {"10.0.0.7", 2}, {"fe80::1", 3}, {"::1", 8}});
}

TEST_CASE("discovery: an empty output is no hosts, not an error", "[discovery]") {
  for (const char* text : {"", "\n", "  \n\n\t\n"}) {
    Result<HostSet> hosts = ParseDiscoveryOutput(text, "s.sh", 1);
    REQUIRE(hosts.ok());
    CHECK(hosts->empty());
  }
}

TEST_CASE("discovery: a bad line names the script, the line number and the line", "[discovery]") {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"h1\nh2:x\n", "s.sh: line 2 'h2:x': slots must be a positive integer, got 'x'"},
      {"h1:0\n", "s.sh: line 1 'h1:0': slots must be a positive integer, got 0"},
      {"h1:\n", "s.sh: line 1 'h1:': slots must be a positive integer, got nothing"},
      {"\n:4\n", "s.sh: line 2 ':4': missing host name"},
      {"h1\nh2\nH1:2\n", "s.sh: line 3 'H1:2': host 'H1' is already listed at line 1"},
      {"bad host\n", "s.sh: line 1 'bad host': host name 'bad host' contains ' '"},
      {"h!\n", "s.sh: line 1 'h!': host name 'h!' contains '!'"},
      {"-h\n", "s.sh: line 1 '-h': host name '-h' starts with '-'"},
      {"u@h1\n", "s.sh: line 1 'u@h1': user@ is not part of the discovery contract"},
      {"h1:2:3\n", "s.sh: line 1 'h1:2:3': 'h1:2:3' is neither host:slots nor an IPv6 address"},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    Result<HostSet> hosts = ParseDiscoveryOutput(c.text, "s.sh", 1);
    REQUIRE_FALSE(hosts.ok());
    CHECK(hosts.status().code() == Code::kInvalidArgument);
    CHECK_THAT(hosts.status().message(), Catch::StartsWith(c.message));
  }
}

TEST_CASE("discovery: a real script's hosts and slots", "[discovery]") {
  TempDir dir;
  const std::string script = Script(dir, "hosts.sh", "echo h1\necho '  h2:3'\necho\necho h3:1\n");
  Result<HostSet> hosts = Run(script, 2);
  REQUIRE(hosts.ok());
  CHECK(*hosts == HostSet{{"h1", 2}, {"h2", 3}, {"h3", 1}});
  // Run by the shell: arguments after the script's path reach it.
  const std::string with_args = Script(dir, "args.sh", "echo \"$1:$2\"\n");
  hosts = Run(with_args + " node7 5");
  REQUIRE(hosts.ok());
  CHECK(*hosts == HostSet{{"node7", 5}});
}

TEST_CASE("discovery: a real script's bad line", "[discovery]") {
  TempDir dir;
  const std::string script = Script(dir, "hosts.sh", "echo h1\necho h2:many\n");
  Result<HostSet> hosts = Run(script);
  REQUIRE_FALSE(hosts.ok());
  CHECK_THAT(hosts.status().message(),
             Catch::StartsWith(script + ": line 2 'h2:many': slots must be a positive integer"));
}

TEST_CASE("discovery: a script's empty output is no hosts", "[discovery]") {
  TempDir dir;
  Result<HostSet> hosts = Run(Script(dir, "none.sh", "exit 0\n"));
  REQUIRE(hosts.ok());
  CHECK(hosts->empty());
}

TEST_CASE("discovery: a failing script is reported with its exit code and stderr tail",
          "[discovery]") {
  TempDir dir;
  std::string body;
  for (int i = 1; i <= 15; ++i) body += "echo 'line " + std::to_string(i) + "' >&2\n";
  body += "echo h1\nexit 3\n";
  const std::string script = Script(dir, "fail.sh", body);
  Result<HostSet> hosts = Run(script);
  REQUIRE_FALSE(hosts.ok());
  CHECK(hosts.status().code() == Code::kUnavailable);
  const std::string& m = hosts.status().message();
  CHECK_THAT(m, Catch::StartsWith(script + ": exited with code 3; its stderr ends:\nline 6\n"));
  CHECK_THAT(m, Catch::EndsWith("line 15"));
  CHECK_THAT(m, !Catch::Contains("line 5\n"));

  // A script that is not there: the shell's 127 and its complaint.
  hosts = Run(dir.path() + "/missing.sh");
  REQUIRE_FALSE(hosts.ok());
  CHECK_THAT(hosts.status().message(),
             Catch::Contains("exited with code 127") && Catch::Contains("missing.sh"));

  // The command's shell killed by a signal (a script's own death is the shell's exit code 137).
  hosts = Run("kill -9 $$");
  REQUIRE_FALSE(hosts.ok());
  CHECK_THAT(hosts.status().message(), Catch::Contains("killed by signal 9 (no stderr)"));
}

TEST_CASE("discovery: a hanging script is killed at the timeout, its children too", "[discovery]") {
  TempDir dir;
  // The script's child keeps stdout open and records its pid; the script waits for it. The
  // timeout leaves the script ample time to start its child and write the pid file on a loaded
  // machine (a test run in parallel with others), so the kill finds the child there.
  const std::string pid_file = dir.path() + "/child.pid";
  const std::string script =
      Script(dir, "hang.sh", "echo h1\nsleep 60 &\necho $! > " + pid_file + "\nwait\n");
  const auto start = std::chrono::steady_clock::now();
  Result<HostSet> hosts = Run(script, 1, 2000);
  const auto took = std::chrono::steady_clock::now() - start;
  REQUIRE_FALSE(hosts.ok());
  CHECK(hosts.status().code() == Code::kTimeout);
  CHECK(hosts.status().message() ==
        script + ": no exit within 2000 ms; killed it (its process group)");
  CHECK(took >= std::chrono::milliseconds(2000));
  CHECK(took < std::chrono::seconds(10));
  std::ifstream in(pid_file);
  pid_t child = 0;
  REQUIRE(in >> child);
  // SIGKILL reached the group: the child is gone, or dead and not yet reaped by its new parent.
  auto dead = [](pid_t pid) {
    if (::kill(pid, 0) != 0) return true;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string pid_field, comm, state;
    return !(stat >> pid_field >> comm >> state) || state == "Z" || state == "X";
  };
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = dead(child);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(gone);
}

TEST_CASE("discovery: a script that closes its output but does not exit times out", "[discovery]") {
  TempDir dir;
  Result<HostSet> hosts = Run(Script(dir, "closed.sh", "exec >/dev/null 2>&1\nsleep 60\n"), 1, 300);
  REQUIRE_FALSE(hosts.ok());
  CHECK(hosts.status().code() == Code::kTimeout);
}

}  // namespace
}  // namespace ringrun::launcher::elastic
