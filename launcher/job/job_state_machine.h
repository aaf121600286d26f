// The rules of a running job, apart from any I/O: events in, commands and the exit code out.
// The job (job.h) turns what happens into calls here and carries out the commands; tests feed
// the events directly with a manual clock.
//
// The rules:
//   - the first failure wins: a rank exiting non-zero or killed by a signal, a rank that could not
//     start, a lost agent, an agent that could not start or died, the start timeout. It alone is
//     reported (one message), sets the exit code (the rank's code, 128+signo, 127 for a missing
//     command, else 1), and starts the teardown: every agent is told to end its ranks with the
//     grace period, and agents that never registered (they cannot be told) are killed;
//   - a first SIGINT/SIGTERM/SIGHUP is forwarded to every rank (SIGHUP as SIGTERM), SIGKILL
//     follows after the grace period, and the exit code becomes 130 (SIGINT) or 128+signo;
//     a second one kills every rank at once; SIGUSR1/SIGUSR2 are forwarded and change nothing;
//   - --timeout: a job still running timeout_s after the state machine was made (less the time
//     its earlier attempts took, JobPlan::timeout_used) fails with kTimeoutExitCode and a message
//     naming the flag and its value (first failure wins);
//   - after the teardown starts, failures are consequences and are not reported (except an
//     agent that could not start, reported after a signal too unless a failure came first);
//   - an agent that has not finished kAbandonAfterGraceMs after the grace period is killed;
//   - the job is over when every host is finished: its session ended, its agent died or was
//     killed, or it never started;
//   - elastic jobs (JobPlan::elastic): the job (job.cc) decides on rank exits and lost agents
//     through its membership policy, and tells this machine RankGone for each rank that is gone
//     without ending the job; an agent whose ranks are all gone ends without a failure. EndJob
//     ends the job with the policy's reason.
// Not thread-safe: one thread drives it.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "launcher/hosts/hostfile.h"
#include "ringrun/common/clock.h"

namespace ringrun::launcher::job {

// Beyond the grace period, how long the job waits for agents to report before killing them.
inline constexpr int kAbandonAfterGraceMs = 3000;

// The exit code of a job ended by --timeout: coreutils timeout(1)'s.
inline constexpr int kTimeoutExitCode = 124;

// The first failure of a job, as recorded: what a restart policy (restart_policy.h) decides on.
struct JobFailure {
  enum class Cause {
    kRank,          // a rank exited non-zero or was killed by a signal
    kRankStart,     // a rank could not start (its command, working directory or CPUs)
    kAgentLost,     // an agent that had registered was lost while its ranks ran, or died
    kAgentStart,    // an agent could not start, was not found, or ended before registering
    kStartTimeout,  // an agent or rank was not up at the start timeout
    kTimeout,       // --timeout
  };
  Cause cause = Cause::kRank;
  int exit_code = 1;
  // One line, as the report begins, without the stderr tail that the report quotes:
  // "rank 3 on host h exited with code 1".
  std::string what;
};

// What the state machine asks the job to do.
struct JobCommand {
  enum class Kind {
    kReport,             // print "ringrun: <text>" on stderr, after the ranks' output so far
    kSignalRanks,        // forward `signo` to every rank on `hosts`
    kTerminateRanks,     // tell the agents on `hosts` to end their ranks: SIGTERM, SIGKILL after
                         // `grace_ms` (at once when 0); `text` is the reason
    kKillAgent,          // end the agent of `host` now; `text`, when set, is logged as a warning
    kCloseRegistration,  // refuse registrations from now on, then answer with
                         // RegistrationClosed()
    kAbortRendezvous,    // fail the ranks waiting in Join: the job is being torn down
  };
  Kind kind = Kind::kReport;
  std::vector<int> hosts;
  int host = -1;
  int signo = 0;
  int grace_ms = 0;
  std::string text;
};

struct JobPlan {
  std::vector<hosts::HostSpec> hosts;  // every host of the command line, by host index
  std::vector<int> rank_hosts;         // the host index of each rank, by rank
  int grace_ms = 0;
  int start_timeout_s = 0;
  int timeout_s = 0;  // --timeout; 0: none
  // Of timeout_s, what the job's earlier attempts (--max-restarts) took.
  std::chrono::milliseconds timeout_used{0};
  std::string agent_path;  // named when the agent is missing on a host
  bool elastic = false;    // see the rules above
};

class JobStateMachine {
 public:
  // The start timeout runs from construction, on `clock` (which must outlive this).
  JobStateMachine(JobPlan plan, const Clock& clock);

  // Events. `host` is a host index with ranks, `rank` a rank of the job; others are ignored.
  // The starter's Start() returned: an agent runs (`ok`), or `why` it could not start.
  void AgentStarted(int host, bool ok, const std::string& why);
  // The host's agent registered with the job service.
  void AgentRegistered(int host);
  // Answer to kCloseRegistration: no host outside `registered` can register any more.
  void RegistrationClosed(const std::vector<int>& registered);
  void RankStarted(int rank);
  // `stderr_tail`: the rank's last stderr lines joined by '\n' (LineTail::Text), quoted in the
  // failure message one per line.
  void RankExited(int rank, int exit_code, int signo, const std::string& stderr_tail);
  void RankSpawnFailed(int rank, int exit_code, const std::string& message);
  // The host's Session ended; `why` is empty when the agent closed it, else what broke
  // (including heartbeat silence, which the job service detects).
  void SessionEnded(int host, const std::string& why);
  // The host's agent process ended with `exit_code` (its stderr tail for the message).
  void AgentExited(int host, int exit_code, const std::string& stderr_tail);
  void SignalReceived(int signo);
  // Elastic jobs: the rank's process is gone (its exit or its agent's loss was handled by the
  // job's membership policy); no failure, no report.
  void RankGone(int rank);
  // Elastic jobs whose hosts grow (a discovery script): a host index and a rank (a worker id)
  // added while the job runs, each the next index. A host added here is "late": an agent that
  // could not start there, or ended before registering, is no failure of the job (the job's
  // policy deals with its ranks). Rank ids follow the host they are added to.
  int AddHost(const hosts::HostSpec& host);
  void AddRank(int rank, int host);
  // Ends the job as its first failure: reports `what` and tears down, exit code `exit_code`.
  void EndJob(int exit_code, std::string what);
  // The teardown has begun (a failure, EndJob) or a signal interrupted the job.
  bool stopping() const { return tearing_down_ || interrupted_ != 0; }
  // Time passed: the start timeout, the SIGKILL deadline, abandoning agents.
  void Tick();

  // The commands produced since the last call, in order.
  std::vector<JobCommand> TakeCommands();

  // Every host is finished: the job is over.
  bool done() const;
  // Whether nothing more is expected from `host` (the job stops watching its agent).
  bool finished(int host) const;
  // ringrun's exit code: 130/128+signo after a signal, else the first failure's, else 0.
  int exit_code() const;
  // The first failure, if there was one (a failure after a signal included).
  const std::optional<JobFailure>& failure() const { return failure_; }
  // The SIGINT, SIGTERM or SIGHUP that interrupted the job; 0 when none did.
  int interrupted() const { return interrupted_; }

 private:
  struct Host {
    std::vector<int> ranks;
    bool start_done = false;  // Start() returned
    bool has_agent = false;   // and an agent runs
    bool registered = false;
    bool session_ended = false;
    bool finished = false;
    bool late = false;  // AddHost
  };
  struct Rank {
    int host = -1;
    bool started = false;
    bool exited = false;
  };

  Host* FindHost(int host);
  // Records the first failure (later ones are ignored), reports `what` + `detail`, and starts
  // the teardown.
  void Fail(JobFailure::Cause cause, int exit_code, std::string what,
            const std::string& detail = "");
  void BeginTeardown(int grace_ms);
  void CloseRegistration();
  void Emit(JobCommand::Kind kind, int signo = 0, int grace_ms = 0, std::string text = "");
  void KillAgent(int host, std::string warning = "");
  std::vector<int> UnfinishedHosts() const;

  // Constant after construction, but for the hosts and ranks that AddHost and AddRank append.
  JobPlan plan_;
  const Clock& clock_;
  const Clock::TimePoint start_deadline_;
  const Clock::TimePoint job_deadline_;  // --timeout; meaningful when plan_.timeout_s > 0

  std::vector<Host> hosts_;  // by host index; hosts without ranks are finished from the start
  std::vector<Rank> ranks_;
  std::vector<JobCommand> commands_;
  std::optional<JobFailure> failure_;
  bool tearing_down_ = false;
  int interrupted_ = 0;  // the signal that interrupted the job
  bool registration_closing_ = false;
  bool registration_closed_ = false;
  bool start_timeout_checked_ = false;
  std::optional<Clock::TimePoint> kill_at_;     // escalate to SIGKILL at this time
  std::optional<Clock::TimePoint> abandon_at_;  // stop waiting for agents at this time
};

}  // namespace ringrun::launcher::job
