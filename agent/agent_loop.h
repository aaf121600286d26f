// The agent's rules, as an object the driver (agent.cc) feeds: which ranks run, what is reported
// to the launcher, and when ranks are ended. It touches the OS only through the Spawner (start,
// signal, reap) and reads ranks' pipes; the launcher only through the LauncherLink; time only
// through the Clock. Signals, poll() and registration stay with the driver.
//
// The rules:
//   - every rank is reported once: Started (or SpawnFailed), its output as whole lines, Exited;
//     with RegisterReply::timeline, each rank gets a pipe at fd 3 (RINGRUN_TIMELINE_FD=3) whose
//     lines go up as Output on the TIMELINE stream, as its stdout's do;
//     Exited waits up to kExitReportDelayMs for the rank's pipes to drain, then sweeps its group;
//   - Terminate{grace} from the launcher: SIGTERM to every rank's group, SIGKILL after grace
//     (at once when grace is 0); Signal{signo}: forwarded to every rank's group;
//   - losing the launcher (stdin EOF, the Session ending, no message for the heartbeat timeout)
//     or a terminating signal to the agent: the same termination with the job's grace, and exit
//     code 1;
//   - a heartbeat to the launcher every heartbeat interval.
// Not thread-safe: one thread drives it.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent/launcher_link.h"
#include "agent/process.h"
#include "ringrun/common/clock.h"
#include "ringrun/common/fd.h"
#include "ringrun/job.pb.h"

namespace ringrun::agent {

inline constexpr size_t kMaxLineBytes = 1 << 20;    // longer lines are sent in pieces
inline constexpr size_t kMaxQueuedBytes = 8 << 20;  // stop reading ranks' pipes beyond this
inline constexpr int kExitReportDelayMs = 500;      // a dead rank's pipes get this to drain
// A rank that exited non-zero is reported no sooner than this after it was reaped: a peer killed
// by a signal closes its sockets (on which the rank failed) before it can be reaped, so on a
// busy host the rank that failed on losing it may be reaped first.
inline constexpr int kFailedExitGraceMs = 100;
inline constexpr int kMaxPollIntervalMs = 100;  // Step runs at least this often
// The rank's timeline pipe, when the launcher collects the timeline (runtime/src/knobs.cc reads
// it). An inherited one is dropped.
inline constexpr char kTimelineFdVariable[] = "RINGRUN_TIMELINE_FD";

class AgentLoop {
 public:
  // `hostname` is named in SpawnFailed messages. The references must outlive the loop.
  AgentLoop(std::string hostname, Spawner& spawner, LauncherLink& link, const Clock& clock);

  // Takes the reply's timings and spawns its ranks, reporting each as Started or SpawnFailed.
  // With reply.cpu_binding() CORE, each rank is confined to its share of `allowed_cpus` (the
  // agent's own, AllowedCpus(); cpu_binding.h has the rule) and gets RINGRUN_CPUS naming it;
  // when allowed_cpus is an error or there are more ranks than CPUs, no rank is bound and one
  // warning names the host and why. Unbound ranks get no RINGRUN_CPUS (an inherited one is
  // dropped).
  void Start(const v1::RegisterReply& reply,
             const Result<std::vector<int>>& allowed_cpus = std::vector<int>{});

  // A terminating signal reached the agent: end the ranks (grace), exit code 1.
  void OnSignal(int signo);
  // The launcher's end of the agent's stdin closed: the launcher is gone.
  void OnStdinClosed();
  // Sends `signo` to every running rank's process group (what a Signal command does).
  void ForwardSignal(int signo) { SignalAll(signo); }
  // A rank's pipe is readable (or at EOF): read what is there and send whole lines.
  void OnPipeReadable(int rank, int stream);
  // SIGTERM to every rank now and SIGKILL after `grace_ms` (at once when 0). A later call can
  // only bring the SIGKILL closer.
  void Terminate(int grace_ms, const std::string& why);

  // One pass of the rules: commands, launcher liveness, the SIGKILL deadline, heartbeats, reaping
  // and exit reports. Returns false once every rank has been reported (the loop is over).
  bool Step();

  struct Watch {
    int fd;
    int rank;
    int stream;  // 0 stdout, 1 stderr, 2 the timeline (RegisterReply::timeline)
  };
  // The ranks' open pipes to wait on; none while the link's queue is over kMaxQueuedBytes.
  std::vector<Watch> watches();
  // The latest time at which Step must run next.
  Clock::TimePoint next_deadline() const;

  // 1 after losing the launcher or being signalled, else 0.
  int exit_code() const { return exit_code_; }
  // The launcher is gone (nothing more can be handed to it).
  bool lost() const { return lost_; }

 private:
  struct Rank {
    int rank = 0;
    pid_t pid = -1;
    UniqueFd fds[3];  // stdout, stderr, the timeline (invalid without one); reset at EOF
    std::string pending[3];
    bool reaped = false;
    int wait_status = 0;
    Clock::TimePoint reaped_at;
    uint64_t reap_sweep = 0;  // which Reap() saw it: exits are reported in this order
    bool reported = false;
  };

  void SendOutput(Rank& r, int stream, std::string data, bool final);
  void ReadPipe(Rank& r, int stream);
  void RunCommands();
  void CheckLauncher();
  void Reap();
  void ReportExits(bool force);
  bool ReadyToReport(const Rank& r, bool force, Clock::TimePoint now) const;
  void SignalAll(int signo);
  void LoseLauncher(const std::string& why);
  bool AllReported() const;

  // Constant after construction (timings: after Start).
  const std::string hostname_;
  Spawner& spawner_;
  LauncherLink& link_;
  const Clock& clock_;
  int grace_ms_ = 0;
  int heartbeat_interval_ms_ = 0;
  int heartbeat_timeout_ms_ = 0;

  std::map<int, Rank> ranks_;
  std::optional<Clock::TimePoint> kill_at_;
  Clock::TimePoint next_heartbeat_;
  bool terminating_ = false;
  bool lost_ = false;
  uint64_t reap_sweeps_ = 0;  // Reap() calls so far
  int exit_code_ = 0;
};

}  // namespace ringrun::agent
