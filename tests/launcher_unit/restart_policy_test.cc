// --max-restarts: which attempts are run again, and the line printed for each decision.
#include "launcher/job/restart_policy.h"

#include <signal.h>

#include <catch2/catch.hpp>

namespace ringrun::launcher::job {
namespace {

using Cause = JobFailure::Cause;

AttemptOutcome Failed(Cause cause, int exit_code, std::string what) {
  AttemptOutcome o;
  o.exit_code = exit_code;
  o.failure = JobFailure{cause, exit_code, std::move(what)};
  return o;
}

TEST_CASE("restarts: a failed rank restarts the job while restarts are left", "[restart]") {
  const AttemptOutcome rank3 = Failed(Cause::kRank, 1, "rank 3 on host h exited with code 1");
  RestartDecision d = DecideRestart(3, 0, rank3);
  CHECK(d.restart);
  CHECK(d.report ==
        "restarting the job (attempt 2 of 4) after rank 3 on host h exited with code 1");
  d = DecideRestart(3, 2, rank3);
  CHECK(d.restart);
  CHECK(d.report ==
        "restarting the job (attempt 4 of 4) after rank 3 on host h exited with code 1");
  // The last attempt failed too: its exit code is the job's.
  d = DecideRestart(3, 3, Failed(Cause::kRank, 137, "rank 0 on host h was killed by SIGKILL"));
  CHECK_FALSE(d.restart);
  CHECK(d.report ==
        "no restarts left (--max-restarts 3): every one of the 4 attempts failed; exit code 137, "
        "the last attempt's");
}

TEST_CASE("restarts: a lost agent restarts the job, as a failed rank does", "[restart]") {
  RestartDecision d = DecideRestart(1, 0, Failed(Cause::kAgentLost, 1, "lost the agent on host h"));
  CHECK(d.restart);
  CHECK(d.report == "restarting the job (attempt 2 of 2) after lost the agent on host h");
}

TEST_CASE("restarts: none without --max-restarts, and nothing to say", "[restart]") {
  RestartDecision d = DecideRestart(0, 0, Failed(Cause::kRank, 7, "rank 1 on host h exited"));
  CHECK_FALSE(d.restart);
  CHECK(d.report.empty());
}

TEST_CASE("restarts: a success or a signal ends the job, silently", "[restart]") {
  CHECK_FALSE(DecideRestart(3, 0, AttemptOutcome{}).restart);
  CHECK(DecideRestart(3, 0, AttemptOutcome{}).report.empty());
  // Ctrl-C while the ranks ran, or during the teardown of a failure: no restart either way.
  for (const auto& failure : {std::optional<JobFailure>(),
                              std::optional<JobFailure>(JobFailure{Cause::kRank, 1, "rank 0"})}) {
    AttemptOutcome o;
    o.exit_code = 130;
    o.interrupted = SIGINT;
    o.failure = failure;
    RestartDecision d = DecideRestart(3, 0, o);
    CHECK_FALSE(d.restart);
    CHECK(d.report.empty());
  }
}

TEST_CASE("restarts: ringrun's own failure before the job started is not restarted", "[restart]") {
  AttemptOutcome o;
  o.exit_code = 1;  // no failure recorded: the job service did not start, say
  CHECK_FALSE(DecideRestart(3, 0, o).restart);
}

TEST_CASE("restarts: failures that would repeat, and --timeout, end the job naming why",
          "[restart]") {
  struct Case {
    Cause cause;
    int exit_code;
    const char* why;
  };
  for (const Case& c : {
           Case{Cause::kRankStart, 127,
                "what could not start would fail the same way on the same hosts"},
           Case{Cause::kAgentStart, 1,
                "what could not start would fail the same way on the same hosts"},
           Case{Cause::kStartTimeout, 1, "the job did not start within --start-timeout"},
           Case{Cause::kTimeout, 124, "--timeout bounds the whole job, its restarts included"},
       }) {
    CHECK_FALSE(IsRestartable(c.cause));
    RestartDecision d = DecideRestart(2, 0, Failed(c.cause, c.exit_code, "x"));
    CHECK_FALSE(d.restart);
    CHECK(d.report == "not restarting the job (--max-restarts 2): " + std::string(c.why) +
                          "; exit code " + std::to_string(c.exit_code));
  }
  CHECK(IsRestartable(Cause::kRank));
  CHECK(IsRestartable(Cause::kAgentLost));
}

}  // namespace
}  // namespace ringrun::launcher::job
