// A whole Job in-process: the real job service on a loopback port 0, and agents as threads that
// register and hold their Session over the real gRPC link, running AgentLoop with a scripted
// Spawner in place of processes.
#include "launcher/job/job.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "agent/agent_loop.h"
#include "agent/launcher_link.h"

namespace ringrun::launcher::job {
namespace {

using std::chrono::milliseconds;

// Ranks as scripted by argv[0]: "ok" prints a line and exits 0; "cpus" prints the CPUs it was
// given and its RINGRUN_CPUS, and exits 0; "fail=R:C" makes rank R exit C and the others run
// until signalled; "restarts=N:R:C" is "fail=R:C" while RINGRUN_RESTART_COUNT is below N, then
// "ok", whose line then names the restart count.
class ScriptedSpawner final : public agent::Spawner {
 public:
  Result<agent::SpawnedProcess> Spawn(const agent::SpawnRequest& req) override {
    int rank = -1, restart_count = -1;
    std::string cpus_variable = "none";
    for (const auto& kv : req.env) {
      if (kv.rfind("RINGRUN_RANK=", 0) == 0) rank = std::stoi(kv.substr(13));
      if (kv.rfind("RINGRUN_CPUS=", 0) == 0) cpus_variable = kv.substr(13);
      if (kv.rfind("RINGRUN_RESTART_COUNT=", 0) == 0) restart_count = std::stoi(kv.substr(22));
    }
    agent::SpawnedProcess p;
    p.pid = 1000 + rank;
    std::string script = req.argv.at(0);
    if (script.rfind("restarts=", 0) == 0) {
      const int n = std::stoi(script.substr(9));
      script = restart_count < n ? "fail=" + script.substr(script.find(':') + 1) : "ok";
    }
    if (script == "ok" || script == "cpus") {
      auto out = MakePipe();
      if (!out.ok()) return out.status();
      std::string line = "hello from " + std::to_string(rank) +
                         (restart_count > 0 ? " after " + std::to_string(restart_count) : "") +
                         "\n";
      if (script == "cpus") {
        line = "cpus";
        for (int c : req.cpus) line += " " + std::to_string(c);
        line += " RINGRUN_CPUS=" + cpus_variable + "\n";
      }
      if (Status st = WriteAll(out->write.get(), line.data(), line.size()); !st.ok()) return st;
      p.out = std::move(out->read);
      exits_.push_back({p.pid, 0});
    } else if (script.rfind("fail=", 0) == 0 && std::stoi(script.substr(5)) == rank) {
      exits_.push_back({p.pid, (std::stoi(script.substr(script.find(':') + 1)) & 0xff) << 8});
    }
    return p;
  }
  void SignalGroup(pid_t pgid, int signo) override {
    if (signo == SIGTERM || signo == SIGKILL) exits_.push_back({pgid, signo});
  }
  std::optional<Reaped> Reap() override {
    if (exits_.empty()) return std::nullopt;
    Reaped r = exits_.front();
    exits_.erase(exits_.begin());
    return r;
  }

 private:
  std::vector<Reaped> exits_;
};

// One agent thread. Kill() is the launcher closing the agent's stdin.
class ThreadAgent final : public starters::AgentHandle {
 public:
  ThreadAgent(const starters::AgentLaunch& launch, bool registers)
      : thread_([this, launch, registers] { exit_ = Run(launch, registers); }) {}
  ~ThreadAgent() override {
    Kill();
    thread_.join();
  }
  std::optional<int> Poll() override {
    int e = exit_;
    return e >= 0 ? std::optional<int>(e) : std::nullopt;
  }
  void Kill() override { killed_ = true; }
  std::string StderrTail() override { return ""; }

 private:
  int Run(const starters::AgentLaunch& launch, bool registers) {
    if (!registers) {
      while (!killed_) std::this_thread::sleep_for(milliseconds(2));
      return 137;
    }
    const std::string target = "127.0.0.1:" + std::to_string(launch.service_port);
    auto link = agent::MakeGrpcLauncherLink(target, launch.secret, SteadyClock());
    v1::RegisterRequest req;
    req.set_host_index(launch.host_index);
    req.set_hostname("thread-agent");
    req.set_free_port(29500);
    req.set_service_target(target);
    auto reply = link->Register(req, 5000);
    if (!reply.ok() || !link->OpenSession(launch.host_index).ok()) return 1;
    ScriptedSpawner spawner;
    agent::AgentLoop loop("thread-agent", spawner, *link, SteadyClock());
    loop.Start(reply.value(), std::vector<int>{0, 1, 2, 3});  // as if each host had 4 CPUs
    while (loop.Step()) {
      if (killed_) loop.OnStdinClosed();
      for (const auto& w : loop.watches()) loop.OnPipeReadable(w.rank, w.stream);
      std::this_thread::sleep_for(milliseconds(2));
    }
    link->Close(loop.lost(), 2000);
    return loop.exit_code();
  }

  std::atomic<bool> killed_{false};
  std::atomic<int> exit_{-1};
  std::thread thread_;
};

class ThreadAgentStarter final : public starters::AgentStarter {
 public:
  Result<std::unique_ptr<starters::AgentHandle>> Start(
      const hosts::HostSpec& host, const starters::AgentLaunch& launch) override {
    std::lock_guard<std::mutex> lock(mu_);
    started.push_back(host.name);
    return std::unique_ptr<starters::AgentHandle>(
        new ThreadAgent(launch, host.name != silent_host));
  }
  std::string silent_host;  // its agent never registers
  std::vector<std::string> started;

 private:
  std::mutex mu_;
};

// What the process writes to fd 2 while it lives.
class StderrCapture {
 public:
  StderrCapture() : file_(std::tmpfile()), saved_(::dup(2)) {
    std::fflush(stderr);
    ::dup2(::fileno(file_), 2);
  }
  ~StderrCapture() {
    Restore();
    std::fclose(file_);
  }
  std::string Text() {
    Restore();
    std::string out;
    std::rewind(file_);
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof(buf), file_)) > 0;) out.append(buf, n);
    return out;
  }

 private:
  void Restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  std::FILE* file_;
  int saved_;
};

Options JobOptions(const std::string& script) {
  Options o;
  o.hosts = {hosts::HostSpec{"", "localhost", 2}, hosts::HostSpec{"", "127.0.0.2", 1}};
  o.np = 3;
  o.command = {script};
  o.grace_ms = 500;
  o.start_timeout_s = 5;
  o.agent_path = "/nonexistent/ringrun-agent";
  // The ranks' threads are chosen (-x), so the launcher prints no threads-per-rank note: the
  // tests below check its stderr word for word.
  o.exports = {{"OMP_NUM_THREADS", "1"}};
  return o;
}

// RunJob with the placement ringrun's main computes for `options`.
int RunPlaced(const Options& options, const Starters& starters, const JobHooks& hooks) {
  Result<std::vector<hosts::RankPlacement>> placed = hosts::PlaceRanks(options.hosts, options.np);
  REQUIRE(placed.ok());
  return RunJob(options, std::move(placed.value()), starters, hooks);
}

// Runs a job with thread agents; each rank's last output line goes to `lines`.
int RunForLines(const Options& options, ThreadAgentStarter& starter,
                std::map<int, std::string>* lines) {
  Starters starters{&starter, &starter};
  std::mutex mu;
  JobHooks hooks;
  hooks.echo_to_console = false;
  hooks.on_line = [&](int rank, bool, std::string_view line) {
    std::lock_guard<std::mutex> lock(mu);
    (*lines)[rank] = std::string(line);
  };
  return RunPlaced(options, starters, hooks);
}

TEST_CASE("job in-process: every rank runs, its output arrives, the job exits 0", "[job]") {
  ThreadAgentStarter starter;
  std::map<int, std::string> lines;
  CHECK(RunForLines(JobOptions("ok"), starter, &lines) == 0);
  CHECK(starter.started.size() == 2);
  REQUIRE(lines.size() == 3);
  CHECK(lines[2] == "hello from 2");
}

TEST_CASE("job in-process: --bind-to core reaches the agents, none is the default", "[job]") {
  ThreadAgentStarter starter;
  std::map<int, std::string> lines;
  Options options = JobOptions("cpus");
  SECTION("core") {
    options.bind_to = Options::BindTo::kCore;
    CHECK(RunForLines(options, starter, &lines) == 0);
    REQUIRE(lines.size() == 3);
    CHECK(lines[0] == "cpus 0 1 RINGRUN_CPUS=0-1");  // localhost: 2 ranks, 2 CPUs each
    CHECK(lines[1] == "cpus 2 3 RINGRUN_CPUS=2-3");
    CHECK(lines[2] == "cpus 0 1 2 3 RINGRUN_CPUS=0-3");  // 127.0.0.2: 1 rank, every CPU
  }
  SECTION("none") {
    CHECK(RunForLines(options, starter, &lines) == 0);
    REQUIRE(lines.size() == 3);
    for (const auto& [rank, line] : lines) CHECK(line == "cpus RINGRUN_CPUS=none");
  }
}

TEST_CASE("job in-process: the first failing rank's code ends the job", "[job]") {
  ThreadAgentStarter starter;
  Starters starters{&starter, &starter};
  JobHooks hooks;
  hooks.echo_to_console = false;
  const Options options = JobOptions("fail=2:7");
  const auto t0 = std::chrono::steady_clock::now();
  StderrCapture err;
  CHECK(RunPlaced(options, starters, hooks) == 7);
  // Well before agents are abandoned (grace + kAbandonAfterGraceMs): every agent was told, even
  // one whose Session opened after the failure.
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(3000));
  CHECK(err.Text() == "ringrun: rank 2 on host 127.0.0.2 exited with code 7\n");
}

TEST_CASE("job in-process: an agent that never registers fails the start timeout", "[job]") {
  ThreadAgentStarter starter;
  starter.silent_host = "127.0.0.2";
  Starters starters{&starter, &starter};
  JobHooks hooks;
  hooks.echo_to_console = false;
  Options options = JobOptions("ok");
  options.start_timeout_s = 1;
  std::string also;
  SECTION("without --max-restarts") {}
  SECTION("with --max-restarts: not restarted, and said so") {
    options.max_restarts = 2;
    also =
        "ringrun: not restarting the job (--max-restarts 2): the job did not start within "
        "--start-timeout; exit code 1\n";
  }
  const auto t0 = std::chrono::steady_clock::now();
  StderrCapture err;
  CHECK(RunPlaced(options, starters, hooks) == 1);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(starter.started.size() == 2);  // one attempt
  CHECK(err.Text() ==
        "ringrun: start timeout (1 s): rank 0 on host localhost did not start; rank 1 on host "
        "localhost did not start; the agent on host 127.0.0.2 did not register\n" +
            also);
}

TEST_CASE("job in-process: --max-restarts runs the job again until it succeeds", "[job][restart]") {
  ThreadAgentStarter starter;
  std::map<int, std::string> lines;
  Options options = JobOptions("restarts=2:2:7");  // rank 2 fails in attempts 1 and 2
  options.max_restarts = 3;
  std::vector<int> attempts;
  StderrCapture err;
  int rc = RunJob(
      options, hosts::PlaceRanks(options.hosts, options.np).value(),
      [&](int restart_count) {
        attempts.push_back(restart_count);
        return Starters{&starter, &starter};
      },
      [&] {
        JobHooks hooks;
        hooks.echo_to_console = false;
        hooks.on_line = [&](int rank, bool, std::string_view line) {
          lines[rank] = std::string(line);  // one thread calls it
        };
        return hooks;
      }());
  CHECK(rc == 0);
  CHECK(attempts == std::vector<int>{0, 1, 2});
  CHECK(starter.started.size() == 6);  // both hosts, in each of 3 attempts
  CHECK(lines[2] == "hello from 2 after 2");
  CHECK(err.Text() ==
        "ringrun: rank 2 on host 127.0.0.2 exited with code 7\n"
        "ringrun: restarting the job (attempt 2 of 4) after rank 2 on host 127.0.0.2 exited with "
        "code 7\n"
        "ringrun: rank 2 on host 127.0.0.2 exited with code 7\n"
        "ringrun: restarting the job (attempt 3 of 4) after rank 2 on host 127.0.0.2 exited with "
        "code 7\n");
}

TEST_CASE("job in-process: when every attempt fails, the last one's code is the job's",
          "[job][restart]") {
  ThreadAgentStarter starter;
  Starters starters{&starter, &starter};
  JobHooks hooks;
  hooks.echo_to_console = false;
  Options options = JobOptions("fail=1:3");
  options.max_restarts = 1;
  StderrCapture err;
  CHECK(RunPlaced(options, starters, hooks) == 3);
  CHECK(starter.started.size() == 4);
  CHECK(err.Text() ==
        "ringrun: rank 1 on host localhost exited with code 3\n"
        "ringrun: restarting the job (attempt 2 of 2) after rank 1 on host localhost exited with "
        "code 3\n"
        "ringrun: rank 1 on host localhost exited with code 3\n"
        "ringrun: no restarts left (--max-restarts 1): every one of the 2 attempts failed; exit "
        "code 3, the last attempt's\n");
}

}  // namespace
}  // namespace ringrun::launcher::job
