// The agent's rules, driven through AgentLoop with a fake Spawner, a fake LauncherLink and a
// manual clock: no processes, no sockets, no sleeps.
#include "agent/agent_loop.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace ringrun::agent {
namespace {

using std::chrono::milliseconds;

int Exited(int code) { return (code & 0xff) << 8; }  // a wait status, as waitpid() makes it
int Killed(int signo) { return signo & 0x7f; }

// Hands out pids 100, 101, ... and records every signal; Exit() makes a child reapable.
class FakeSpawner final : public Spawner {
 public:
  Result<SpawnedProcess> Spawn(const SpawnRequest& req) override {
    requests.push_back(req);
    if (!req.argv.empty() && req.argv[0] == "missing") {
      return NotFound("cannot execute 'missing': command not found in PATH (/bin)");
    }
    SpawnedProcess p;
    p.pid = next_pid++;
    if (with_pipes) {
      auto out = MakePipe();
      auto err = MakePipe();
      REQUIRE(out.ok());
      REQUIRE(err.ok());
      REQUIRE(SetNonBlocking(out->read.get(), true).ok());
      REQUIRE(SetNonBlocking(err->read.get(), true).ok());
      p.out = std::move(out->read);
      p.err = std::move(err->read);
      writers.push_back(std::move(out->write));
      writers.push_back(std::move(err->write));
      if (req.timeline) {
        auto tl = MakePipe();
        REQUIRE(tl.ok());
        REQUIRE(SetNonBlocking(tl->read.get(), true).ok());
        p.timeline = std::move(tl->read);
        timeline_writers.push_back(std::move(tl->write));
      }
    }
    return p;
  }
  void SignalGroup(pid_t pgid, int signo) override { signals.emplace_back(pgid, signo); }
  std::optional<Reaped> Reap() override {
    if (exits.empty()) return std::nullopt;
    Reaped r = exits.front();
    exits.pop_front();
    return r;
  }

  void Exit(pid_t pid, int wait_status) { exits.push_back({pid, wait_status}); }
  // The signals sent to `pgid`, in order.
  std::vector<int> SignalsTo(pid_t pgid) const {
    std::vector<int> out;
    for (const auto& [p, s] : signals) {
      if (p == pgid) out.push_back(s);
    }
    return out;
  }

  bool with_pipes = false;
  pid_t next_pid = 100;
  std::vector<SpawnRequest> requests;
  std::vector<std::pair<pid_t, int>> signals;
  std::deque<Reaped> exits;
  std::vector<UniqueFd> writers;           // rank r's stdout at 2r, stderr at 2r+1
  std::vector<UniqueFd> timeline_writers;  // rank r's timeline pipe at r (with a timeline)
};

class FakeLink final : public LauncherLink {
 public:
  explicit FakeLink(const Clock& clock) : heard(clock.Now()) {}
  Result<v1::RegisterReply> Register(const v1::RegisterRequest&, int) override {
    return Unavailable("not used");
  }
  Status OpenSession(int) override { return Status::Ok(); }
  void Send(v1::AgentEvent event) override { sent.push_back(std::move(event)); }
  size_t queued_bytes() override { return queued; }
  std::vector<v1::AgentCommand> TakeCommands() override { return std::exchange(commands, {}); }
  Clock::TimePoint last_heard() override { return heard; }
  bool session_over() override { return over; }
  int wake_fd() override { return -1; }
  void Close(bool, int) override {}

  void Terminate(int grace_ms) {
    v1::AgentCommand c;
    c.mutable_terminate()->set_grace_ms(grace_ms);
    c.mutable_terminate()->set_reason("test");
    commands.push_back(c);
  }
  // The events sent so far of one kind.
  std::vector<v1::AgentEvent> Sent(v1::AgentEvent::EventCase kind) const {
    std::vector<v1::AgentEvent> out;
    for (const auto& e : sent) {
      if (e.event_case() == kind) out.push_back(e);
    }
    return out;
  }

  std::vector<v1::AgentEvent> sent;
  std::vector<v1::AgentCommand> commands;
  Clock::TimePoint heard;
  bool over = false;
  size_t queued = 0;
};

v1::RegisterReply Reply(int ranks, int grace_ms) {
  v1::RegisterReply reply;
  for (int r = 0; r < ranks; ++r) {
    auto* spec = reply.add_ranks();
    spec->set_rank(r);
    spec->add_argv("train");
    spec->add_env("PATH=/bin");
    spec->set_cwd("/");
  }
  reply.set_grace_ms(grace_ms);
  reply.set_heartbeat_interval_ms(1000);
  reply.set_heartbeat_timeout_ms(5000);
  return reply;
}

// Two ranks (pids 100 and 101) started with a 2 s grace period.
struct Fixture {
  Fixture(int ranks = 2, int grace_ms = 2000, bool pipes = false) {
    spawner.with_pipes = pipes;
    loop.Start(Reply(ranks, grace_ms));
  }
  ManualClock clock;
  FakeSpawner spawner;
  FakeLink link{clock};
  AgentLoop loop{"node1", spawner, link, clock};
};

TEST_CASE("agent: ranks are started and their exits reported", "[agent_loop]") {
  Fixture f;
  REQUIRE(f.spawner.requests.size() == 2);
  CHECK(f.spawner.requests[0].argv == std::vector<std::string>{"train"});
  CHECK(f.spawner.requests[0].cwd == "/");
  auto started = f.link.Sent(v1::AgentEvent::kStarted);
  REQUIRE(started.size() == 2);
  CHECK(started[1].started().rank() == 1);
  CHECK(started[1].started().pid() == 101);

  CHECK(f.loop.Step());
  f.spawner.Exit(101, Exited(3));
  f.spawner.Exit(77, Exited(0));  // an orphan re-parented to the agent: not a rank
  CHECK(f.loop.Step());
  CHECK(f.link.Sent(v1::AgentEvent::kExited).empty());  // a failed exit waits kFailedExitGraceMs
  f.clock.Advance(std::chrono::milliseconds(kFailedExitGraceMs));
  CHECK(f.loop.Step());
  auto exited = f.link.Sent(v1::AgentEvent::kExited);
  REQUIRE(exited.size() == 1);
  CHECK(exited[0].exited().rank() == 1);
  CHECK(exited[0].exited().exit_code() == 3);
  CHECK(f.spawner.SignalsTo(101) == std::vector<int>{SIGKILL});  // its group is swept
  CHECK(f.spawner.SignalsTo(100).empty());

  f.spawner.Exit(100, Killed(SIGSEGV));
  CHECK_FALSE(f.loop.Step());  // every rank reported: the loop is over
  exited = f.link.Sent(v1::AgentEvent::kExited);
  REQUIRE(exited.size() == 2);
  CHECK(exited[1].exited().signal() == SIGSEGV);
  CHECK(f.loop.exit_code() == 0);
  CHECK_FALSE(f.loop.lost());
}

TEST_CASE("agent: a rank that cannot start is reported with 127 and the host", "[agent_loop]") {
  ManualClock clock;
  FakeSpawner spawner;
  FakeLink link(clock);
  AgentLoop loop("node1", spawner, link, clock);
  v1::RegisterReply reply = Reply(1, 1000);
  reply.mutable_ranks(0)->set_argv(0, "missing");
  loop.Start(reply);
  auto failed = link.Sent(v1::AgentEvent::kSpawnFailed);
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].spawn_failed().exit_code() == 127);
  CHECK_THAT(failed[0].spawn_failed().message(),
             Catch::Contains("missing") && Catch::Contains("(on node1)"));
  CHECK_FALSE(loop.Step());
}

// Three ranks with local ranks 0..2 and --bind-to core; rank 1 inherited a stale RINGRUN_CPUS.
v1::RegisterReply BoundReply(int ranks) {
  v1::RegisterReply reply = Reply(ranks, 1000);
  for (int r = 0; r < ranks; ++r) reply.mutable_ranks(r)->set_local_rank(r);
  reply.set_cpu_binding(v1::RegisterReply::CPU_BINDING_CORE);
  if (ranks > 1) reply.mutable_ranks(1)->add_env("RINGRUN_CPUS=7");
  return reply;
}

// The RINGRUN_CPUS entries of a request's environment.
std::vector<std::string> CpusVariables(const SpawnRequest& req) {
  std::vector<std::string> out;
  for (const auto& e : req.env) {
    if (e.rfind("RINGRUN_CPUS=", 0) == 0) out.push_back(e);
  }
  return out;
}

TEST_CASE("agent: --bind-to core gives each local rank its share and names it", "[agent_loop]") {
  ManualClock clock;
  FakeSpawner spawner;
  FakeLink link(clock);
  AgentLoop loop("node1", spawner, link, clock);
  loop.Start(BoundReply(3), std::vector<int>{0, 1, 2, 3, 4, 5, 6});
  REQUIRE(spawner.requests.size() == 3);
  CHECK(spawner.requests[0].cpus == std::vector<int>{0, 1});
  CHECK(spawner.requests[1].cpus == std::vector<int>{2, 3});
  CHECK(spawner.requests[2].cpus == std::vector<int>{4, 5});
  CHECK(CpusVariables(spawner.requests[0]) == std::vector<std::string>{"RINGRUN_CPUS=0-1"});
  CHECK(CpusVariables(spawner.requests[1]) == std::vector<std::string>{"RINGRUN_CPUS=2-3"});
  CHECK(CpusVariables(spawner.requests[2]) == std::vector<std::string>{"RINGRUN_CPUS=4-5"});
  CHECK(spawner.requests[0].env.front() == "PATH=/bin");  // the rest of the env is kept
}

TEST_CASE("agent: without --bind-to core no rank is bound or told RINGRUN_CPUS", "[agent_loop]") {
  ManualClock clock;
  FakeSpawner spawner;
  FakeLink link(clock);
  AgentLoop loop("node1", spawner, link, clock);
  v1::RegisterReply reply = BoundReply(2);
  reply.set_cpu_binding(v1::RegisterReply::CPU_BINDING_NONE);
  loop.Start(reply, std::vector<int>{0, 1});
  REQUIRE(spawner.requests.size() == 2);
  for (const auto& req : spawner.requests) {
    CHECK(req.cpus.empty());
    CHECK(CpusVariables(req).empty());  // rank 1's inherited one is dropped
  }
}

TEST_CASE("agent: more ranks than allowed CPUs, or no CPU list, binds no rank", "[agent_loop]") {
  ManualClock clock;
  FakeSpawner spawner;
  FakeLink link(clock);
  AgentLoop loop("node1", spawner, link, clock);
  SECTION("three ranks, two CPUs") { loop.Start(BoundReply(3), std::vector<int>{0, 1}); }
  SECTION("the affinity could not be read") {
    loop.Start(BoundReply(3), Result<std::vector<int>>(Internal("sched_getaffinity: test")));
  }
  REQUIRE(spawner.requests.size() == 3);
  for (const auto& req : spawner.requests) {
    CHECK(req.cpus.empty());
    CHECK(CpusVariables(req).empty());
  }
  CHECK(link.Sent(v1::AgentEvent::kStarted).size() == 3);  // the ranks run all the same
}

TEST_CASE("agent: Terminate sends SIGTERM, then SIGKILL after the grace period", "[agent_loop]") {
  Fixture f;
  f.link.Terminate(1000);
  CHECK(f.loop.Step());
  CHECK(f.spawner.SignalsTo(100) == std::vector<int>{SIGTERM});
  CHECK(f.spawner.SignalsTo(101) == std::vector<int>{SIGTERM});
  CHECK(f.loop.next_deadline() <= f.clock.Now() + milliseconds(1000));

  f.spawner.Exit(100, Killed(SIGTERM));  // rank 0 obeys; rank 1 ignores SIGTERM
  f.clock.Advance(milliseconds(999));
  CHECK(f.loop.Step());
  CHECK(f.spawner.SignalsTo(101) == std::vector<int>{SIGTERM});
  f.clock.Advance(milliseconds(1));
  CHECK(f.loop.Step());
  CHECK(f.spawner.SignalsTo(101) == std::vector<int>{SIGTERM, SIGKILL});
  CHECK(f.spawner.SignalsTo(100) == std::vector<int>{SIGTERM, SIGKILL});  // the sweep only

  f.spawner.Exit(101, Killed(SIGKILL));
  CHECK_FALSE(f.loop.Step());
  CHECK(f.link.Sent(v1::AgentEvent::kExited).size() == 2);
  CHECK(f.loop.exit_code() == 0);  // the launcher asked: not a failure of the agent
}

TEST_CASE("agent: Terminate with no grace kills at once, a later one only hastens",
          "[agent_loop]") {
  Fixture f;
  f.link.Terminate(5000);
  CHECK(f.loop.Step());
  f.link.Terminate(0);
  CHECK(f.loop.Step());
  CHECK(f.spawner.SignalsTo(100) == std::vector<int>{SIGTERM, SIGKILL});
  f.clock.Advance(milliseconds(5000));
  f.link.heard = f.clock.Now();
  CHECK(f.loop.Step());
  CHECK(f.spawner.SignalsTo(100).size() == 2);  // no second SIGKILL at the old deadline
}

TEST_CASE("agent: a Signal command reaches every rank's group", "[agent_loop]") {
  Fixture f;
  v1::AgentCommand c;
  c.mutable_signal()->set_signo(SIGUSR1);
  f.link.commands.push_back(c);
  CHECK(f.loop.Step());
  CHECK(f.spawner.SignalsTo(100) == std::vector<int>{SIGUSR1});
  CHECK(f.spawner.SignalsTo(101) == std::vector<int>{SIGUSR1});
  CHECK_FALSE(f.loop.lost());
}

TEST_CASE("agent: heartbeat silence ends the ranks with the job's grace", "[agent_loop]") {
  Fixture f;
  CHECK(f.loop.Step());
  f.clock.Advance(milliseconds(5000));
  CHECK(f.loop.Step());  // exactly the timeout: not yet
  CHECK(f.spawner.signals.empty());
  f.clock.Advance(milliseconds(1));
  CHECK(f.loop.Step());
  CHECK(f.loop.lost());
  CHECK(f.loop.exit_code() == 1);
  CHECK(f.spawner.SignalsTo(100) == std::vector<int>{SIGTERM});
  f.clock.Advance(milliseconds(2000));
  CHECK(f.loop.Step());
  CHECK(f.spawner.SignalsTo(100) == std::vector<int>{SIGTERM, SIGKILL});
}

TEST_CASE("agent: a message from the launcher keeps it alive", "[agent_loop]") {
  Fixture f;
  for (int i = 0; i < 10; ++i) {
    f.clock.Advance(milliseconds(4000));
    f.link.heard = f.clock.Now();
    CHECK(f.loop.Step());
  }
  CHECK_FALSE(f.loop.lost());
  CHECK(f.spawner.signals.empty());
}

TEST_CASE("agent: stdin EOF ends the ranks", "[agent_loop]") {
  Fixture f;
  CHECK(f.loop.Step());
  f.loop.OnStdinClosed();
  CHECK(f.loop.Step());
  CHECK(f.loop.lost());
  CHECK(f.loop.exit_code() == 1);
  CHECK(f.spawner.SignalsTo(100) == std::vector<int>{SIGTERM});
  CHECK(f.spawner.SignalsTo(101) == std::vector<int>{SIGTERM});
}

TEST_CASE("agent: the Session ending ends the ranks", "[agent_loop]") {
  Fixture f;
  f.link.over = true;
  CHECK(f.loop.Step());
  CHECK(f.loop.lost());
  CHECK(f.spawner.SignalsTo(100) == std::vector<int>{SIGTERM});
}

TEST_CASE("agent: a signal to the agent ends the ranks once", "[agent_loop]") {
  Fixture f;
  f.loop.OnSignal(SIGTERM);
  f.loop.OnSignal(SIGINT);
  CHECK(f.loop.Step());
  CHECK(f.loop.exit_code() == 1);
  CHECK_FALSE(f.loop.lost());
  CHECK(f.spawner.SignalsTo(100) == std::vector<int>{SIGTERM});
}

TEST_CASE("agent: heartbeats go out every interval", "[agent_loop]") {
  Fixture f;
  CHECK(f.loop.Step());
  CHECK(f.link.Sent(v1::AgentEvent::kHeartbeat).size() == 1);
  CHECK(f.loop.next_deadline() <= f.clock.Now() + milliseconds(kMaxPollIntervalMs));
  f.clock.Advance(milliseconds(999));
  CHECK(f.loop.Step());
  CHECK(f.link.Sent(v1::AgentEvent::kHeartbeat).size() == 1);
  f.clock.Advance(milliseconds(1));
  CHECK(f.loop.Step());
  CHECK(f.link.Sent(v1::AgentEvent::kHeartbeat).size() == 2);
}

TEST_CASE("agent: output goes up as whole lines, the exit after it", "[agent_loop]") {
  Fixture f(1, 1000, /*pipes=*/true);
  auto watches = f.loop.watches();
  REQUIRE(watches.size() == 2);
  REQUIRE(WriteAll(f.spawner.writers[0].get(), "a\nb", 3).ok());
  f.loop.OnPipeReadable(0, 0);
  auto out = f.link.Sent(v1::AgentEvent::kOutput);
  REQUIRE(out.size() == 1);
  CHECK(out[0].output().data() == "a\n");
  CHECK_FALSE(out[0].output().final());

  // The rank exits with its pipes still open (a descendant holds them): the exit waits for them,
  // at most kExitReportDelayMs, then carries the partial line with it.
  f.spawner.Exit(100, Exited(0));
  CHECK(f.loop.Step());
  CHECK(f.link.Sent(v1::AgentEvent::kExited).empty());
  f.clock.Advance(milliseconds(kExitReportDelayMs));
  CHECK_FALSE(f.loop.Step());
  out = f.link.Sent(v1::AgentEvent::kOutput);
  REQUIRE(out.size() == 2);
  CHECK(out[1].output().data() == "b");
  CHECK(out[1].output().final());
  REQUIRE(f.link.Sent(v1::AgentEvent::kExited).size() == 1);
  CHECK(f.link.sent.back().has_exited());
}

TEST_CASE("agent: with a timeline each rank gets a pipe at fd 3 whose lines go up as TIMELINE",
          "[agent_loop]") {
  ManualClock clock;
  FakeSpawner spawner;
  spawner.with_pipes = true;
  FakeLink link{clock};
  AgentLoop loop{"node1", spawner, link, clock};
  v1::RegisterReply reply = Reply(1, 1000);
  reply.mutable_ranks(0)->add_env("RINGRUN_TIMELINE_FD=7");  // inherited: dropped
  reply.set_timeline(true);
  loop.Start(reply);
  REQUIRE(spawner.requests.size() == 1);
  CHECK(spawner.requests[0].timeline);
  const auto& env = spawner.requests[0].env;
  CHECK(std::count(env.begin(), env.end(), "RINGRUN_TIMELINE_FD=3") == 1);
  CHECK(std::count(env.begin(), env.end(), "RINGRUN_TIMELINE_FD=7") == 0);
  auto watches = loop.watches();
  REQUIRE(watches.size() == 3);
  CHECK(watches[2].stream == 2);
  REQUIRE(WriteAll(spawner.timeline_writers[0].get(), "{\"ph\": \"X\"},\n{", 14).ok());
  loop.OnPipeReadable(0, 2);
  auto out = link.Sent(v1::AgentEvent::kOutput);
  REQUIRE(out.size() == 1);
  CHECK(out[0].output().stream() == v1::AgentEvent::TIMELINE);
  CHECK(out[0].output().data() == "{\"ph\": \"X\"},\n");
}

TEST_CASE("agent: without a timeline no rank gets a pipe or RINGRUN_TIMELINE_FD", "[agent_loop]") {
  Fixture f(1, 1000, /*pipes=*/true);
  REQUIRE(f.spawner.requests.size() == 1);
  CHECK_FALSE(f.spawner.requests[0].timeline);
  for (const auto& e : f.spawner.requests[0].env) CHECK(e.rfind("RINGRUN_TIMELINE_FD=", 0) != 0);
  CHECK(f.loop.watches().size() == 2);
}

TEST_CASE("agent: a full outbox stops reading the ranks' pipes", "[agent_loop]") {
  Fixture f(1, 1000, /*pipes=*/true);
  CHECK(f.loop.watches().size() == 2);
  f.link.queued = kMaxQueuedBytes;
  CHECK(f.loop.watches().empty());
}

TEST_CASE("agent: exits go up in the order the ranks died, a killed rank first within one sweep",
          "[agent_loop]") {
  Fixture f(3, 2000, /*pipes=*/true);
  // Rank 2 dies first and its pipes are still open (a descendant holds them); ranks 0 and 1 die
  // together later: rank 0 fails on losing its peer, rank 1 was killed.
  f.spawner.Exit(102, Killed(SIGKILL));
  CHECK(f.loop.Step());
  f.spawner.Exit(100, Exited(3));
  f.spawner.Exit(101, Killed(SIGKILL));
  CHECK(f.loop.Step());
  CHECK(f.link.Sent(v1::AgentEvent::kExited).empty());  // rank 2 still drains: it goes first
  f.clock.Advance(std::chrono::milliseconds(600));
  f.loop.Step();
  auto exited = f.link.Sent(v1::AgentEvent::kExited);
  REQUIRE(exited.size() == 3);
  CHECK(exited[0].exited().rank() == 2);
  CHECK(exited[1].exited().rank() == 1);
  CHECK(exited[1].exited().signal() == SIGKILL);
  CHECK(exited[2].exited().rank() == 0);
}

TEST_CASE(
    "agent: a rank killed by a signal goes before a peer that failed just before it was reaped",
    "[agent_loop]") {
  Fixture f(2, 2000, /*pipes=*/false);
  // Rank 0 fails on the connection that its killed peer closed while exiting, and is reaped
  // first; rank 1, killed, is reaped 20 ms later.
  f.spawner.Exit(100, Exited(3));
  CHECK(f.loop.Step());
  CHECK(f.link.Sent(v1::AgentEvent::kExited).empty());  // held: a killed peer may come
  f.clock.Advance(std::chrono::milliseconds(20));
  f.spawner.Exit(101, Killed(SIGKILL));
  f.loop.Step();
  f.clock.Advance(std::chrono::milliseconds(600));
  f.loop.Step();
  auto exited = f.link.Sent(v1::AgentEvent::kExited);
  REQUIRE(exited.size() == 2);
  CHECK(exited[0].exited().rank() == 1);
  CHECK(exited[0].exited().signal() == SIGKILL);
  CHECK(exited[1].exited().rank() == 0);
  CHECK(exited[1].exited().exit_code() == 3);
}

}  // namespace
}  // namespace ringrun::agent
