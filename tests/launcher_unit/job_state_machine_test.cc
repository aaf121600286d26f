// The job's rules, fed event by event into JobStateMachine with a manual clock: no processes,
// no sockets, no sleeps.
#include "launcher/job/job_state_machine.h"

#include <signal.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace ringrun::launcher::job {
namespace {

using std::chrono::milliseconds;
using Kind = JobCommand::Kind;

// Ranks 0 and 1 on host 0 ("a"), rank 2 on host 2 ("c"); host 1 ("b") has no ranks.
JobPlan Plan() {
  JobPlan plan;
  plan.hosts = {hosts::HostSpec{"", "a", 2}, hosts::HostSpec{"", "b", 1},
                hosts::HostSpec{"me", "c", 1}};
  plan.rank_hosts = {0, 0, 2};
  plan.grace_ms = 1000;
  plan.start_timeout_s = 5;
  plan.agent_path = "/opt/rr/ringrun-agent";
  return plan;
}

struct Fixture {
  ManualClock clock;
  JobStateMachine job{Plan(), clock};

  // Both agents started, registered, and their ranks running.
  void StartAll() {
    for (int h : {0, 2}) {
      job.AgentStarted(h, true, "");
      job.AgentRegistered(h);
    }
    for (int r = 0; r < 3; ++r) job.RankStarted(r);
    REQUIRE(job.TakeCommands().empty());
  }
  // Answers kCloseRegistration as the job does, with the hosts that registered.
  std::vector<JobCommand> Take(const std::vector<int>& registered = {0, 2}) {
    std::vector<JobCommand> all = job.TakeCommands();
    for (const auto& c : all) {
      if (c.kind == Kind::kCloseRegistration) job.RegistrationClosed(registered);
    }
    for (auto& c : job.TakeCommands()) all.push_back(c);
    return all;
  }
};

// Both agents started and registered, every rank running, outside a Fixture.
void StartEverything(JobStateMachine& job) {
  for (int h : {0, 2}) {
    job.AgentStarted(h, true, "");
    job.AgentRegistered(h);
  }
  for (int r = 0; r < 3; ++r) job.RankStarted(r);
}

std::vector<JobCommand> OfKind(const std::vector<JobCommand>& commands, Kind kind) {
  std::vector<JobCommand> out;
  for (const auto& c : commands) {
    if (c.kind == kind) out.push_back(c);
  }
  return out;
}

TEST_CASE("job: every rank exiting 0 ends the job with 0", "[job_state]") {
  Fixture f;
  f.StartAll();
  for (int r = 0; r < 3; ++r) f.job.RankExited(r, 0, 0, "");
  f.job.SessionEnded(0, "");
  CHECK_FALSE(f.job.done());
  f.job.SessionEnded(2, "");
  f.job.AgentExited(2, 0, "");
  CHECK(f.job.done());
  CHECK(f.job.exit_code() == 0);
  f.clock.Advance(milliseconds(10000));  // the start timeout passes, with nothing missing
  f.job.Tick();
  CHECK(f.job.TakeCommands().empty());
}

TEST_CASE("job: elastic ranks that are gone end no job, EndJob does", "[job_state][elastic]") {
  ManualClock clock;
  JobPlan plan = Plan();
  plan.elastic = true;
  JobStateMachine job(plan, clock);
  StartEverything(job);
  // Host a's ranks are gone (the job's policy handled them); its agent ends: no failure.
  job.RankGone(0);
  job.RankGone(1);
  job.AgentExited(0, 0, "");
  CHECK(job.TakeCommands().empty());
  CHECK_FALSE(job.stopping());
  CHECK(job.finished(0));
  // The policy ends the job: reported once, torn down, with the code it gives.
  job.EndJob(137, "2 ranks remain, fewer than --min-np 3: ending the job");
  std::vector<JobCommand> commands = job.TakeCommands();
  REQUIRE(OfKind(commands, Kind::kReport).size() == 1);
  CHECK(OfKind(commands, Kind::kReport)[0].text ==
        "2 ranks remain, fewer than --min-np 3: ending the job");
  CHECK(OfKind(commands, Kind::kTerminateRanks).size() == 1);
  CHECK(job.stopping());
  CHECK(job.exit_code() == 137);
}

TEST_CASE("job: elastic hosts and ranks added while the job runs", "[job_state][elastic]") {
  ManualClock clock;
  JobPlan plan = Plan();
  plan.elastic = true;
  JobStateMachine job(plan, clock);
  StartEverything(job);
  // A host with one new rank (worker id 3): the job waits for it.
  const int h = job.AddHost(hosts::HostSpec{"", "d", 2});
  CHECK(h == 3);
  CHECK(job.finished(h));  // no rank yet
  job.AddRank(3, h);
  CHECK_FALSE(job.finished(h));
  // The start timeout passes before its agent registered: no failure (the job's policy decides).
  clock.Advance(milliseconds(6000));
  job.Tick();
  CHECK(job.TakeCommands().empty());
  job.AgentStarted(h, true, "");
  job.AgentRegistered(h);
  job.RankStarted(3);
  // The new rank is gone, its agent ends: no failure.
  job.RankGone(3);
  job.AgentExited(h, 0, "");
  CHECK(job.finished(h));
  CHECK(job.TakeCommands().empty());
  // A second host whose agent could not start, and a third whose agent ended before it
  // registered: no failure either.
  const int h2 = job.AddHost(hosts::HostSpec{"", "e", 1});
  job.AddRank(4, h2);
  job.AgentStarted(h2, false, "e: connection refused");
  CHECK(job.finished(h2));
  const int h3 = job.AddHost(hosts::HostSpec{"", "f", 1});
  job.AddRank(5, h3);
  job.AgentStarted(h3, true, "");
  job.RankGone(5);
  job.AgentExited(h3, 1, "");
  CHECK(job.TakeCommands().empty());
  CHECK_FALSE(job.stopping());
  // The teardown reaches the added hosts that run.
  const int h4 = job.AddHost(hosts::HostSpec{"", "g", 1});
  job.AddRank(6, h4);
  job.AgentStarted(h4, true, "");
  job.AgentRegistered(h4);
  job.EndJob(1, "ending");
  auto terminate = OfKind(job.TakeCommands(), Kind::kTerminateRanks);
  REQUIRE(terminate.size() == 1);
  CHECK(terminate[0].hosts == std::vector<int>{0, 2, h4});
}

TEST_CASE("job: the first failure wins, reported once, and tears the job down", "[job_state]") {
  Fixture f;
  f.StartAll();
  f.job.RankExited(1, 7, 0, "boom\nbang");
  auto commands = f.Take();
  auto reports = OfKind(commands, Kind::kReport);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].text ==
        "rank 1 on host a exited with code 7; the last lines of its stderr:\n  boom\n  bang");
  CHECK(OfKind(commands, Kind::kAbortRendezvous).size() == 1);
  auto terminate = OfKind(commands, Kind::kTerminateRanks);
  REQUIRE(terminate.size() == 1);
  CHECK(terminate[0].grace_ms == 1000);
  CHECK(terminate[0].hosts == std::vector<int>{0, 2});
  CHECK(OfKind(commands, Kind::kKillAgent).empty());  // both registered: they are told

  // What follows is a consequence: not reported, and the code stays.
  f.job.RankExited(2, 0, SIGTERM, "");
  f.job.RankExited(0, 1, 0, "");
  f.job.SessionEnded(2, "the connection to the agent broke");
  f.job.AgentExited(0, 1, "");
  CHECK(OfKind(f.Take(), Kind::kReport).empty());
  CHECK(f.job.done());
  CHECK(f.job.exit_code() == 7);
  // The failure's first line, without the stderr tail: what a restart line names.
  REQUIRE(f.job.failure());
  CHECK(f.job.failure()->what == "rank 1 on host a exited with code 7");
  CHECK(f.job.failure()->exit_code == 7);
}

TEST_CASE("job: a rank killed by a signal exits 128+signo", "[job_state]") {
  Fixture f;
  f.StartAll();
  f.job.RankExited(2, 0, SIGSEGV, "");
  auto reports = OfKind(f.Take(), Kind::kReport);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].text == "rank 2 on host c was killed by SIGSEGV (signal 11)");
  CHECK(f.job.exit_code() == 139);
  REQUIRE(f.job.failure());
  CHECK(f.job.failure()->cause == JobFailure::Cause::kRank);
  CHECK(f.job.failure()->exit_code == 139);
  CHECK(f.job.interrupted() == 0);
}

TEST_CASE("job: a rank that could not start fails the job with its code", "[job_state]") {
  Fixture f;
  f.StartAll();
  f.job.RankSpawnFailed(0, 0, "cannot execute 'x': command not found in PATH (/bin)");
  auto reports = OfKind(f.Take(), Kind::kReport);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].text ==
        "rank 0 on host a could not start: cannot execute 'x': command not found in PATH (/bin)");
  CHECK(f.job.exit_code() == 127);
  CHECK(f.job.failure()->cause == JobFailure::Cause::kRankStart);
}

TEST_CASE("job: SIGINT is forwarded, SIGKILL follows after the grace period", "[job_state]") {
  Fixture f;
  f.StartAll();
  f.job.SignalReceived(SIGINT);
  auto commands = f.Take();
  auto reports = OfKind(commands, Kind::kReport);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].text ==
        "SIGINT received: forwarding it to every rank (SIGKILL in 1000 ms; send it again to kill "
        "at once)");
  auto forwarded = OfKind(commands, Kind::kSignalRanks);
  REQUIRE(forwarded.size() == 1);
  CHECK(forwarded[0].signo == SIGINT);
  CHECK(forwarded[0].hosts == std::vector<int>{0, 2});
  CHECK(OfKind(commands, Kind::kTerminateRanks).empty());
  CHECK(OfKind(commands, Kind::kCloseRegistration).size() == 1);

  f.clock.Advance(milliseconds(999));
  f.job.Tick();
  CHECK(f.Take().empty());
  f.clock.Advance(milliseconds(1));
  f.job.Tick();
  auto terminate = OfKind(f.Take(), Kind::kTerminateRanks);
  REQUIRE(terminate.size() == 1);
  CHECK(terminate[0].grace_ms == 0);
  CHECK(terminate[0].text == "grace period over");

  f.job.RankExited(0, 0, SIGINT, "");  // ranks dying of it is no failure
  CHECK(OfKind(f.Take(), Kind::kReport).empty());
  CHECK(f.job.exit_code() == 130);
  CHECK(f.job.interrupted() == SIGINT);
  CHECK_FALSE(f.job.failure());
}

TEST_CASE("job: a second signal kills every rank at once", "[job_state]") {
  Fixture f;
  f.StartAll();
  f.job.SignalReceived(SIGTERM);
  f.Take();
  f.job.SignalReceived(SIGTERM);
  auto commands = f.Take();
  auto reports = OfKind(commands, Kind::kReport);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].text == "SIGTERM again: killing every rank now");
  auto terminate = OfKind(commands, Kind::kTerminateRanks);
  REQUIRE(terminate.size() == 1);
  CHECK(terminate[0].grace_ms == 0);
  CHECK(f.job.exit_code() == 143);
}

TEST_CASE("job: SIGHUP reaches ranks as SIGTERM, SIGUSR1 is only forwarded", "[job_state]") {
  Fixture f;
  f.StartAll();
  f.job.SignalReceived(SIGUSR1);
  auto commands = f.Take();
  REQUIRE(commands.size() == 1);
  CHECK(commands[0].kind == Kind::kSignalRanks);
  CHECK(commands[0].signo == SIGUSR1);
  CHECK(f.job.exit_code() == 0);
  f.job.SignalReceived(SIGHUP);
  auto forwarded = OfKind(f.Take(), Kind::kSignalRanks);
  REQUIRE(forwarded.size() == 1);
  CHECK(forwarded[0].signo == SIGTERM);
  CHECK(f.job.exit_code() == 128 + SIGHUP);
}

TEST_CASE("job: a lost agent fails the job, naming its running ranks", "[job_state]") {
  Fixture f;
  f.StartAll();
  f.job.RankExited(0, 0, 0, "");
  f.job.SessionEnded(0, "no heartbeat from the agent for 10 s");
  auto reports = OfKind(f.Take(), Kind::kReport);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].text ==
        "lost the agent on host a: no heartbeat from the agent for 10 s (ranks 1 were still "
        "running)");
  CHECK(f.job.exit_code() == 1);
  CHECK(f.job.failure()->cause == JobFailure::Cause::kAgentLost);
  CHECK(f.job.finished(0));
  CHECK_FALSE(f.job.finished(2));
}

TEST_CASE("job: an agent that dies while its ranks run is a lost agent", "[job_state]") {
  Fixture f;
  f.StartAll();
  f.job.AgentExited(2, 255, "ssh: connection reset");
  auto reports = OfKind(f.Take(), Kind::kReport);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].text == "the agent on host me@c exited with code 255: ssh: connection reset");
  REQUIRE(f.job.failure());
  CHECK(f.job.failure()->cause == JobFailure::Cause::kAgentLost);
  CHECK(f.job.failure()->what == "the agent on host me@c exited with code 255");
}

TEST_CASE("job: an agent that dies before registering is named", "[job_state]") {
  Fixture f;
  f.job.AgentStarted(0, true, "");
  f.job.AgentStarted(2, true, "");
  f.job.AgentExited(2, 127, "");
  auto commands = f.Take({});
  auto reports = OfKind(commands, Kind::kReport);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].text == "ringrun-agent not found at /opt/rr/ringrun-agent on host me@c");
  // Host 0's agent never registered either: it cannot be told, so it is killed.
  auto kills = OfKind(commands, Kind::kKillAgent);
  REQUIRE(kills.size() == 1);
  CHECK(kills[0].host == 0);
  CHECK(f.job.done());
  CHECK(f.job.exit_code() == 1);
  CHECK(f.job.failure()->cause == JobFailure::Cause::kAgentStart);
}

TEST_CASE("job: --timeout ends a job that runs too long, with exit 124", "[job_state]") {
  ManualClock clock;
  JobPlan plan = Plan();
  plan.timeout_s = 60;
  JobStateMachine job(plan, clock);
  StartEverything(job);
  clock.Advance(milliseconds(59999));
  job.Tick();
  CHECK(job.TakeCommands().empty());
  clock.Advance(milliseconds(1));
  job.Tick();
  auto commands = job.TakeCommands();
  auto reports = OfKind(commands, Kind::kReport);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].text ==
        "--timeout 60: the job ran longer than 60 s; ending its ranks (exit 124)");
  CHECK(OfKind(commands, Kind::kTerminateRanks).size() == 1);
  job.Tick();  // said once
  CHECK(OfKind(job.TakeCommands(), Kind::kReport).empty());
  job.RankExited(0, 0, SIGTERM, "");
  CHECK(job.exit_code() == kTimeoutExitCode);
  CHECK(job.failure()->cause == JobFailure::Cause::kTimeout);
}

TEST_CASE("job: --timeout counts the time of the job's earlier attempts", "[job_state]") {
  ManualClock clock;
  JobPlan plan = Plan();
  plan.timeout_s = 60;
  plan.timeout_used = milliseconds(45000);  // --max-restarts: the attempts before this one
  JobStateMachine job(plan, clock);
  clock.Advance(milliseconds(14999));
  job.Tick();
  CHECK(OfKind(job.TakeCommands(), Kind::kReport).size() == 1);  // the start timeout, at 5 s
  CHECK(job.failure()->cause == JobFailure::Cause::kStartTimeout);

  JobStateMachine later(plan, clock);
  StartEverything(later);
  clock.Advance(milliseconds(14999));
  later.Tick();
  CHECK(later.TakeCommands().empty());
  clock.Advance(milliseconds(1));
  later.Tick();
  auto reports = OfKind(later.TakeCommands(), Kind::kReport);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].text ==
        "--timeout 60: the job ran longer than 60 s; ending its ranks (exit 124)");
}

TEST_CASE("job: without --timeout a job runs as long as it runs", "[job_state]") {
  Fixture f;
  f.StartAll();
  f.clock.Advance(std::chrono::hours(24 * 400));
  f.job.Tick();
  CHECK(f.job.TakeCommands().empty());
}

TEST_CASE("job: the start timeout names what is missing", "[job_state]") {
  Fixture f;
  f.job.AgentStarted(0, true, "");
  f.job.AgentStarted(2, true, "");
  f.job.AgentRegistered(0);
  f.job.RankStarted(0);
  f.clock.Advance(milliseconds(4999));
  f.job.Tick();
  CHECK(f.Take({0}).empty());
  f.clock.Advance(milliseconds(1));
  f.job.Tick();
  auto commands = f.Take({0});
  auto reports = OfKind(commands, Kind::kReport);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].text ==
        "start timeout (5 s): rank 1 on host a did not start; the agent on host me@c did not "
        "register");
  CHECK(f.job.failure()->cause == JobFailure::Cause::kStartTimeout);
  auto kills = OfKind(commands, Kind::kKillAgent);
  REQUIRE(kills.size() == 1);
  CHECK(kills[0].host == 2);
  CHECK(f.job.finished(2));
  CHECK(f.job.exit_code() == 1);
}

TEST_CASE("job: an agent that could not start fails the job", "[job_state]") {
  Fixture f;
  f.job.AgentStarted(2, false, "c: connect 198.18.10.4:22: connection refused");
  auto reports = OfKind(f.Take({}), Kind::kReport);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].text ==
        "could not start the agent on host me@c: c: connect 198.18.10.4:22: connection refused");
  CHECK(f.job.failure()->cause == JobFailure::Cause::kAgentStart);
  CHECK(f.job.finished(2));
  CHECK_FALSE(f.job.finished(0));  // its Start() has not returned yet

  // It returns after registration closed: too late, its agent is killed at once.
  f.job.AgentStarted(0, true, "");
  auto kills = OfKind(f.Take(), Kind::kKillAgent);
  REQUIRE(kills.size() == 1);
  CHECK(kills[0].host == 0);
  CHECK(f.job.done());
}

TEST_CASE("job: agents that do not finish after the grace period are abandoned", "[job_state]") {
  Fixture f;
  f.StartAll();
  f.job.RankExited(0, 3, 0, "");
  f.Take();
  f.job.SessionEnded(0, "");
  f.clock.Advance(milliseconds(1000 + job::kAbandonAfterGraceMs - 1));
  f.job.Tick();
  CHECK(f.Take().empty());
  CHECK_FALSE(f.job.done());
  f.clock.Advance(milliseconds(1));
  f.job.Tick();
  auto kills = OfKind(f.Take(), Kind::kKillAgent);
  REQUIRE(kills.size() == 1);
  CHECK(kills[0].host == 2);
  CHECK(kills[0].text == "host c: the agent did not finish in time; killing it");
  CHECK(f.job.done());
  CHECK(f.job.exit_code() == 3);
}

TEST_CASE("job: events about unknown hosts and ranks are ignored", "[job_state]") {
  Fixture f;
  f.job.AgentStarted(1, false, "no ranks here");
  f.job.SessionEnded(7, "");
  f.job.RankExited(-1, 1, 0, "");
  f.job.RankExited(3, 1, 0, "");
  f.job.RankSpawnFailed(9, 127, "x");
  CHECK(f.job.TakeCommands().empty());
  CHECK(f.job.exit_code() == 0);
}

}  // namespace
}  // namespace ringrun::launcher::job
