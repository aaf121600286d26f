// Starting a child process: the one fork/exec of ringrun (the agent's ranks, the local agent,
// the srun step).
//
// SpawnProcess() reports whether the child got as far as execve: the child holds the write end
// of a CLOEXEC pipe (the exec-status pipe) and, when a step before execve or execve itself
// fails, writes which step and its errno there and exits 127. execve closes the pipe, so the
// parent reads either end-of-file (the program runs) or the failure ("cannot execute '/x': No
// such file or directory"), and nothing is left running on failure.
//
// Between fork and execve the child makes system calls only (async-signal-safe, no allocation:
// the caller may have other threads). Everything it needs (argv, envp, the CPU mask, /dev/null)
// is prepared before fork. The child's steps, in order: a new process group, the death signal
// (and exit if the parent is already gone), default signal dispositions and an empty signal
// mask, the standard streams, fds above 2 marked close-on-exec, fd 3 (SpawnOptions::fd3), the
// working directory, the CPU affinity, execve.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "ringrun/common/fd.h"
#include "ringrun/common/status.h"

namespace ringrun {

// Where one of the child's standard streams comes from or goes.
struct ChildStream {
  enum class Kind {
    kInherit,  // the parent's own fd of that number
    kDevNull,  // /dev/null (read-only for stdin, write-only otherwise)
    kPipe,     // a new pipe; the parent's end (O_CLOEXEC) comes back in ChildProcess
    kFd,       // a copy of `fd`, which stays the caller's
  };
  Kind kind = Kind::kInherit;
  int fd = -1;  // kFd only

  static ChildStream Inherit() { return {}; }
  static ChildStream DevNull() { return {Kind::kDevNull, -1}; }
  static ChildStream NewPipe() { return {Kind::kPipe, -1}; }
  static ChildStream Fd(int fd) { return {Kind::kFd, fd}; }
};

struct SpawnOptions {
  std::string path;               // execve's path: not searched in PATH, relative to our cwd
  std::vector<std::string> argv;  // argv[0] included
  // "NAME=VALUE" entries; nullopt: this process's environment as it is at the call.
  std::optional<std::vector<std::string>> env;
  std::string cwd;  // empty: ours
  ChildStream in, out, err;
  // An output stream the child finds open at fd 3 (kInherit: none; the others as for out). The
  // child learns of it only from whatever the caller says in `env` (RINGRUN_TIMELINE_FD).
  ChildStream fd3;
  // The child leads a new process group (setpgid in the child and in the parent, so that
  // killpg(pid) works as soon as SpawnProcess returns).
  bool new_process_group = false;
  // PR_SET_PDEATHSIG: 0 for none. The kernel sends it when the THREAD that called
  // SpawnProcess ends, not only the process: call from a thread that lives as long as the child
  // should. A child whose parent died before it set the signal exits at once.
  int death_signal = 0;
  // Default dispositions and an empty signal mask; otherwise the calling thread's mask. Either
  // way no signal runs a handler of ours in the child before it execs (fork happens with every
  // signal blocked).
  bool reset_signals = false;
  bool close_other_fds = false;  // every fd above 2 close-on-exec, not only ours
  std::vector<int> cpus;         // sched_setaffinity to these CPUs; empty: inherit the mask
};

struct ChildProcess {
  pid_t pid = -1;  // also the process group id with new_process_group
  // The parent's ends of kPipe streams (O_CLOEXEC, blocking): stdin's write end, stdout's and
  // stderr's and fd3's read ends; invalid for the other kinds.
  UniqueFd in, out, err, fd3;
};

// Starts `options.path`. The caller reaps the child (waitpid) once it runs. Errors name the
// step: "cannot execute '<path>': <strerror>", "working directory <cwd>: ...", "binding to CPUs
// <list>: ...", "redirecting stdio: ...", "fork: ...", or a pipe's or /dev/null's failure; the
// child, if any, is reaped before the error returns.
Result<ChildProcess> SpawnProcess(const SpawnOptions& options);

// `cpus` (ascending) as the kernel writes a CPU list: "0", "2-3", "0-1,4,6-7". Empty for none.
std::string CpuListText(const std::vector<int>& cpus);

}  // namespace ringrun
