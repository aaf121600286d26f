// SpawnProcess (ringrun/common/spawn.h), the one fork/exec of the agent and the launcher.
#include "ringrun/common/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "tests/agent_unit/read_all.h"

namespace ringrun {
namespace {

using Catch::Contains;

SpawnOptions Shell(const std::string& script) {
  SpawnOptions o;
  o.path = "/bin/sh";
  o.argv = {"sh", "-c", script};
  o.env = std::vector<std::string>{"PATH=/usr/bin:/bin"};
  o.out = ChildStream::NewPipe();
  return o;
}

// The child's exit code (or 128 + signal), after waiting for it.
int Wait(pid_t pid) {
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The value of a /proc/<pid>/status line ("SigBlk", "SigIgn") as the child printed it.
std::string Field(const std::string& status_text, const std::string& name) {
  size_t at = status_text.find(name + ":\t");
  if (at == std::string::npos) return "";
  at += name.size() + 2;
  return status_text.substr(at, status_text.find('\n', at) - at);
}

TEST_CASE("spawn: an execve failure comes back as the step and its errno", "[spawn]") {
  SpawnOptions o;
  o.path = "/nonexistent/prog";
  o.argv = {"prog"};
  Result<ChildProcess> r = SpawnProcess(o);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kNotFound);
  CHECK(r.status().message() == "cannot execute '/nonexistent/prog': No such file or directory");
  // The failed child was reaped before SpawnProcess returned.
  errno = 0;
  CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);
  CHECK(errno == ECHILD);

  char tmpl[] = "/tmp/ringrun-spawn-test.XXXXXX";
  const int fd = ::mkstemp(tmpl);
  REQUIRE(fd >= 0);
  ::close(fd);
  o.path = tmpl;  // a file that is not executable
  r = SpawnProcess(o);
  ::unlink(tmpl);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kPermissionDenied);
  CHECK_THAT(r.status().message(),
             Contains("cannot execute '" + std::string(tmpl) + "': Permission denied"));
}

TEST_CASE("spawn: the child gets the environment and working directory it was given", "[spawn]") {
  char tmpl[] = "/tmp/ringrun-spawn-test.XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  SpawnOptions o = Shell("echo \"$GREETING $(pwd) $HOME\"");
  o.env = std::vector<std::string>{"PATH=/usr/bin:/bin", "GREETING=hello"};
  o.cwd = dir;
  Result<ChildProcess> r = SpawnProcess(o);
  REQUIRE(r.ok());
  CHECK(ReadAll(r->out.get()) == "hello " + dir + " \n");  // nothing of ours (HOME) leaks in
  CHECK(Wait(r->pid) == 0);

  SECTION("no env: this process's environment") {
    REQUIRE(::setenv("RINGRUN_SPAWN_TEST", "inherited", 1) == 0);
    SpawnOptions inherit = Shell("echo $RINGRUN_SPAWN_TEST");
    inherit.env.reset();
    Result<ChildProcess> c = SpawnProcess(inherit);
    ::unsetenv("RINGRUN_SPAWN_TEST");
    REQUIRE(c.ok());
    CHECK(ReadAll(c->out.get()) == "inherited\n");
    CHECK(Wait(c->pid) == 0);
  }
  SECTION("a working directory that is not there fails the spawn, naming it") {
    o.cwd = dir + "/missing";
    Result<ChildProcess> c = SpawnProcess(o);
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().message() ==
          "working directory " + dir + "/missing: No such file or directory");
  }
  ::rmdir(dir.c_str());
}

TEST_CASE("spawn: stdin and stdout as pipes or the caller's fds", "[spawn]") {
  Result<Pipe> sink = MakePipe();
  REQUIRE(sink.ok());
  SpawnOptions o;
  o.path = "/bin/cat";
  o.argv = {"cat"};
  o.in = ChildStream::NewPipe();
  o.out = ChildStream::Fd(sink->write.get());
  Result<ChildProcess> r = SpawnProcess(o);
  REQUIRE(r.ok());
  CHECK_FALSE(r->out.valid());  // the caller's fd: no end of ours comes back
  sink->write.Reset();          // the child holds its copy
  REQUIRE(WriteAll(r->in.get(), "through\n", 8).ok());
  r->in.Reset();
  CHECK(ReadAll(sink->read.get()) == "through\n");
  CHECK(Wait(r->pid) == 0);

  SpawnOptions null_in = Shell("cat; echo done");
  null_in.in = ChildStream::DevNull();
  Result<ChildProcess> c = SpawnProcess(null_in);
  REQUIRE(c.ok());
  CHECK(ReadAll(c->out.get()) == "done\n");
  CHECK(Wait(c->pid) == 0);
}

TEST_CASE("spawn: the child leads its own process group when asked", "[spawn]") {
  SpawnOptions o = Shell("exec sleep 30");
  o.out = ChildStream::Inherit();
  o.new_process_group = true;
  Result<ChildProcess> r = SpawnProcess(o);
  REQUIRE(r.ok());
  CHECK(::getpgid(r->pid) == r->pid);  // already, as SpawnProcess returns
  REQUIRE(::killpg(r->pid, SIGTERM) == 0);
  CHECK(Wait(r->pid) == 128 + SIGTERM);

  o.new_process_group = false;
  r = SpawnProcess(o);
  REQUIRE(r.ok());
  CHECK(::getpgid(r->pid) == ::getpgrp());
  ::kill(r->pid, SIGKILL);
  CHECK(Wait(r->pid) == 128 + SIGKILL);
}

TEST_CASE("spawn: the death signal comes when the spawning thread ends", "[spawn]") {
  pid_t pid = -1;
  std::thread([&] {
    SpawnOptions o = Shell("exec sleep 30");
    o.out = ChildStream::Inherit();
    o.death_signal = SIGKILL;
    Result<ChildProcess> r = SpawnProcess(o);
    if (r.ok()) pid = r->pid;
  }).join();
  REQUIRE(pid > 0);
  int status = 0;
  pid_t got = 0;
  for (int i = 0; i < 500 && got == 0; ++i) {
    got = ::waitpid(pid, &status, WNOHANG);
    if (got == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (got == 0) {  // not killed: end it before failing
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  CHECK(got == pid);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
}

TEST_CASE("spawn: signals are reset to defaults and unblocked when asked", "[spawn]") {
  // This thread blocks SIGUSR1 and the process ignores SIGUSR2; the child inherits both unless
  // reset_signals.
  sigset_t usr1, old_mask;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  REQUIRE(::pthread_sigmask(SIG_BLOCK, &usr1, &old_mask) == 0);
  struct sigaction ignore {
  }, old_action{};
  ignore.sa_handler = SIG_IGN;
  REQUIRE(::sigaction(SIGUSR2, &ignore, &old_action) == 0);

  SpawnOptions o = Shell("");
  o.path = "/bin/cat";  // not through sh, which unblocks every signal itself
  o.argv = {"cat", "/proc/self/status"};
  Result<ChildProcess> inherited = SpawnProcess(o);
  o.reset_signals = true;
  Result<ChildProcess> reset = SpawnProcess(o);

  ::sigaction(SIGUSR2, &old_action, nullptr);
  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  REQUIRE(inherited.ok());
  REQUIRE(reset.ok());
  const std::string before = ReadAll(inherited->out.get());
  const std::string after = ReadAll(reset->out.get());
  CHECK(Wait(inherited->pid) == 0);
  CHECK(Wait(reset->pid) == 0);
  const unsigned long usr1_bit = 1UL << (SIGUSR1 - 1), usr2_bit = 1UL << (SIGUSR2 - 1);
  CHECK((std::stoul(Field(before, "SigBlk"), nullptr, 16) & usr1_bit) != 0);
  CHECK((std::stoul(Field(before, "SigIgn"), nullptr, 16) & usr2_bit) != 0);
  CHECK(std::stoul(Field(after, "SigBlk"), nullptr, 16) == 0);
  CHECK((std::stoul(Field(after, "SigIgn"), nullptr, 16) & usr2_bit) == 0);
}

TEST_CASE("spawn: with close_other_fds, an fd opened without O_CLOEXEC does not reach the child",
          "[spawn]") {
  const int leaky = ::open("/dev/null", O_RDONLY);  // no O_CLOEXEC, as some libraries do
  REQUIRE(leaky > 2);
  const std::string script = "test -e /proc/$$/fd/" + std::to_string(leaky) + " && echo open";
  SpawnOptions o = Shell(script);
  Result<ChildProcess> kept = SpawnProcess(o);
  o.close_other_fds = true;
  Result<ChildProcess> closed = SpawnProcess(o);
  ::close(leaky);
  REQUIRE(kept.ok());
  REQUIRE(closed.ok());
  CHECK(ReadAll(kept->out.get()) == "open\n");
  CHECK(ReadAll(closed->out.get()) == "");
  Wait(kept->pid);
  Wait(closed->pid);
}

TEST_CASE("spawn: fd3 is a pipe the child writes at fd 3, with close_other_fds", "[spawn]") {
  SpawnOptions o = Shell("echo event >&3 && echo out");
  o.close_other_fds = true;
  o.fd3 = ChildStream::NewPipe();
  Result<ChildProcess> c = SpawnProcess(o);
  REQUIRE(c.ok());
  REQUIRE(c->fd3.valid());
  CHECK(ReadAll(c->out.get()) == "out\n");
  CHECK(ReadAll(c->fd3.get()) == "event\n");
  Wait(c->pid);
  // Without it the child has no fd 3.
  o = Shell("echo event >&3 || echo none");
  o.close_other_fds = true;
  c = SpawnProcess(o);
  REQUIRE(c.ok());
  CHECK_FALSE(c->fd3.valid());
  CHECK(ReadAll(c->out.get()) == "none\n");
  Wait(c->pid);
}

TEST_CASE("spawn: a CPU that cannot be set fails the spawn, naming the CPUs", "[spawn]") {
  SpawnOptions o = Shell("true");
  o.cpus = {-1};
  Result<ChildProcess> r = SpawnProcess(o);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "binding to CPUs -1: bad CPU");
  o.cpus = {1 << 16};  // beyond any machine here: sched_setaffinity fails in the child
  r = SpawnProcess(o);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Contains("binding to CPUs 65536: "));
}

}  // namespace
}  // namespace ringrun
