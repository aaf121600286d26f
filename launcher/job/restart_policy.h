// --max-restarts N, as torchrun's: when an attempt of a job fails, every rank has been ended by
// the attempt's teardown, and the whole command starts again on the same hosts, up to N times.
// This file holds the decision alone, apart from any I/O; RunJob (job.h) carries it out.
//
// The rules:
//   - an attempt that failed because of its ranks is run again while restarts are left: a rank
//     that exited non-zero or was killed (JobFailure::Cause::kRank), or an agent lost while its
//     ranks ran (kAgentLost: the host, its link or its agent died);
//   - a failure that would only repeat itself, or that bounds the whole job, ends it: a rank or
//     an agent that could not start (kRankStart, kAgentStart: the command, the working
//     directory, SSH, the agent's path), the start timeout, and --timeout, which counts the
//     time of every attempt;
//   - a signal to the launcher (SIGINT, SIGTERM, SIGHUP) ends the job: no restart, whatever
//     else failed;
//   - ringrun's exit code is the last attempt's.
// Each decision comes with the line to print, if any: one per restart, naming the failure and
// the attempt; one when restarts were allowed but the job ends on a failure.
#pragma once

#include <optional>
#include <string>

#include "launcher/job/job_state_machine.h"

namespace ringrun::launcher::job {

// The most restarts --max-restarts accepts: far beyond any real use, it bounds a typo.
inline constexpr int kMaxRestarts = 1 << 20;

// How one attempt of a job ended.
struct AttemptOutcome {
  int exit_code = 0;
  int interrupted = 0;                // the signal that interrupted it (JobStateMachine)
  std::optional<JobFailure> failure;  // the first failure; none when it succeeded, or when
                                      // ringrun itself failed before the job started
};

struct RestartDecision {
  bool restart = false;
  std::string report;  // for stderr, after "ringrun: "; empty: nothing to say
};

// Whether a failed attempt is worth another (the second rule above).
bool IsRestartable(JobFailure::Cause cause);

// After the attempt that ran with restart count `restart_count` (0 for the first) ended with
// `outcome`, under --max-restarts `max_restarts`: run the command again, or end the job.
RestartDecision DecideRestart(int max_restarts, int restart_count, const AttemptOutcome& outcome);

}  // namespace ringrun::launcher::job
