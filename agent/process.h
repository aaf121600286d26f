// The seam between the agent and the OS for ranks' processes: starting them, signalling their
// process groups and reaping them.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ringrun/common/fd.h"
#include "ringrun/common/status.h"

namespace ringrun::agent {

struct SpawnRequest {
  std::vector<std::string> argv;  // argv[0] without '/' is looked up in env's PATH
  std::vector<std::string> env;   // "NAME=VALUE"
  std::string cwd;
  std::vector<int> cpus;  // CPUs to confine the process to (sched_setaffinity); empty: inherit
  bool timeline = false;  // a pipe at the child's fd 3 for its timeline (RINGRUN_TIMELINE_FD)
};

struct SpawnedProcess {
  pid_t pid = -1;  // also the process group id: each rank leads its own group
  UniqueFd out;    // read ends of the rank's stdout and stderr (O_CLOEXEC, non-blocking)
  UniqueFd err;
  UniqueFd timeline;  // the read end of its fd 3 with SpawnRequest::timeline; else invalid
};

class Spawner {
 public:
  virtual ~Spawner() = default;
  // Starts one process. Errors name the path and the errno ("cannot execute 'x': ...",
  // "working directory /d: No such file or directory"); nothing is left running on error.
  virtual Result<SpawnedProcess> Spawn(const SpawnRequest& req) = 0;
  // Sends `signo` to the process group `pgid` (a rank's pid). A group that is gone is no error.
  virtual void SignalGroup(pid_t pgid, int signo) = 0;
  struct Reaped {
    pid_t pid = -1;
    int wait_status = 0;  // as waitpid() reports it
  };
  // One child that has ended, without blocking; nullopt when none has. Children that are not
  // ranks (orphans re-parented to a subreaper agent) are reaped and returned too.
  virtual std::optional<Reaped> Reap() = 0;
};

// SpawnProcess (ringrun/common/spawn.h) after checking the working directory and resolving
// argv[0] (ResolveExecutable). The child leads a new process group, has PR_SET_PDEATHSIG(SIGKILL)
// so that it dies with the agent, default signal dispositions, an empty signal mask, stdin from
// /dev/null, and no fd of ours beyond 0, 1 and 2; with req.cpus, the affinity mask is set in the
// child before execve (a CPU the agent may not use fails the spawn, naming the CPUs). Spawn() must
// be called from the agent's main thread (the death signal follows the forking thread).
std::unique_ptr<Spawner> MakeForkExecSpawner();

// Resolves argv[0] as execvp would, but with the rank's PATH and from the rank's working
// directory `cwd` (not the agent's: a remote agent runs in the login directory), so that
// "build/bin/x" and relative PATH entries mean what they mean to the launcher's user. Relative
// results come back joined to `cwd`, which should therefore be absolute (Spawn makes it so).
Result<std::string> ResolveExecutable(const std::string& file, const std::vector<std::string>& env,
                                      const std::string& cwd);

}  // namespace ringrun::agent
