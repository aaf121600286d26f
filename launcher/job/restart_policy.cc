#include "launcher/job/restart_policy.h"

namespace ringrun::launcher::job {
namespace {

// Why a failure of `cause` is not restarted.
std::string WhyNotRestarted(JobFailure::Cause cause) {
  switch (cause) {
    case JobFailure::Cause::kRankStart:
    case JobFailure::Cause::kAgentStart:
      return "what could not start would fail the same way on the same hosts";
    case JobFailure::Cause::kStartTimeout:
      return "the job did not start within --start-timeout";
    case JobFailure::Cause::kTimeout:
      return "--timeout bounds the whole job, its restarts included";
    case JobFailure::Cause::kRank:
    case JobFailure::Cause::kAgentLost:
      break;
  }
  return "";
}

}  // namespace

bool IsRestartable(JobFailure::Cause cause) {
  return cause == JobFailure::Cause::kRank || cause == JobFailure::Cause::kAgentLost;
}

RestartDecision DecideRestart(int max_restarts, int restart_count, const AttemptOutcome& outcome) {
  RestartDecision d;
  if (max_restarts <= 0 || outcome.interrupted != 0 || !outcome.failure) return d;
  const JobFailure& failure = *outcome.failure;
  const std::string flag = "--max-restarts " + std::to_string(max_restarts);
  const std::string code = std::to_string(outcome.exit_code);
  if (!IsRestartable(failure.cause)) {
    d.report = "not restarting the job (" + flag + "): " + WhyNotRestarted(failure.cause) +
               "; exit code " + code;
    return d;
  }
  if (restart_count >= max_restarts) {
    d.report = "no restarts left (" + flag + "): every one of the " +
               std::to_string(max_restarts + 1) + " attempts failed; exit code " + code +
               ", the last attempt's";
    return d;
  }
  d.restart = true;
  d.report = "restarting the job (attempt " + std::to_string(restart_count + 2) + " of " +
             std::to_string(max_restarts + 1) + ") after " + failure.what;
  return d;
}

}  // namespace ringrun::launcher::job
