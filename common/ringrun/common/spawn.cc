#include "ringrun/common/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

extern char** environ;

namespace ringrun {
namespace {

// The step that failed in the child, as written on the exec-status pipe with its errno.
enum Step : int { kStdio = 1, kWorkingDirectory, kCpuAffinity, kExec };

// A CPU mask made before fork (CPU_ALLOC), so that the child only makes the syscall.
class CpuMask {
 public:
  explicit CpuMask(const std::vector<int>& cpus) {
    if (cpus.empty()) return;
    const int ncpus = *std::max_element(cpus.begin(), cpus.end()) + 1;
    set_ = CPU_ALLOC(ncpus);
    if (set_ == nullptr) return;
    size_ = CPU_ALLOC_SIZE(ncpus);
    CPU_ZERO_S(size_, set_);
    for (int c : cpus) CPU_SET_S(c, size_, set_);
  }
  ~CpuMask() {
    if (set_ != nullptr) CPU_FREE(set_);
  }
  CpuMask(const CpuMask&) = delete;
  CpuMask& operator=(const CpuMask&) = delete;
  const cpu_set_t* set() const { return set_; }
  size_t size() const { return size_; }

 private:
  cpu_set_t* set_ = nullptr;
  size_t size_ = 0;
};

// What the child does, all of it prepared by the parent.
struct ChildPlan {
  const char* path;
  char* const* argv;
  char* const* envp;
  const char* cwd;  // nullptr: stay
  int stdio[4];     // the fd to dup2 onto 0, 1, 2, 3 (all above 3); -1: leave that one alone
  bool new_process_group;
  int death_signal;
  pid_t parent;
  bool reset_signals;
  const sigset_t* caller_mask;  // the spawning thread's mask before fork blocked everything
  bool close_other_fds;
  const CpuMask* cpus;
  int status_fd;
};

[[noreturn]] void Fail(int status_fd, Step step) {
  const int msg[2] = {step, errno};
  (void)!::write(status_fd, msg, sizeof(msg));
  ::_exit(127);
}

// Child side of fork: never returns. Async-signal-safe calls only.
[[noreturn]] void RunChild(const ChildPlan& plan) {
  if (plan.new_process_group) ::setpgid(0, 0);
  if (plan.death_signal != 0) {
    ::prctl(PR_SET_PDEATHSIG, plan.death_signal);
    if (::getppid() != plan.parent) ::_exit(128 + plan.death_signal);
  }
  // Every signal is blocked here (the parent forked so): none can run one of the parent's
  // handlers in this copy of its memory before the handlers are reset.
  if (plan.reset_signals) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; ++s) ::sigaction(s, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
  } else {
    ::sigprocmask(SIG_SETMASK, plan.caller_mask, nullptr);
  }
  // Every source is above 3 (the parent made it so), so no dup2 overwrites a later one.
  for (int target = 0; target < 3; ++target) {
    if (plan.stdio[target] >= 0 && ::dup2(plan.stdio[target], target) < 0) {
      Fail(plan.status_fd, kStdio);
    }
  }
  // Ours are O_CLOEXEC already; this catches fds other code opened without it.
  if (plan.close_other_fds) ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  // After the sweep: dup2's copy is not close-on-exec.
  if (plan.stdio[3] >= 0 && ::dup2(plan.stdio[3], 3) < 0) Fail(plan.status_fd, kStdio);
  if (plan.cwd != nullptr && ::chdir(plan.cwd) != 0) Fail(plan.status_fd, kWorkingDirectory);
  if (plan.cpus->set() != nullptr &&
      ::sched_setaffinity(0, plan.cpus->size(), plan.cpus->set()) != 0) {
    Fail(plan.status_fd, kCpuAffinity);
  }
  ::execve(plan.path, plan.argv, plan.envp);
  Fail(plan.status_fd, kExec);
}

// A CLOEXEC copy of `fd` above 3, so that the child's dup2 onto 0..3 cannot clobber it.
Result<UniqueFd> DupAbove3(int fd) {
  UniqueFd copy(::fcntl(fd, F_DUPFD_CLOEXEC, 4));
  if (!copy.valid()) return ErrnoStatus("redirecting stdio: fcntl(F_DUPFD_CLOEXEC)", errno);
  return copy;
}

// Moves a valid `fd` among 0..3 above 3 (the parent may run with a standard stream closed).
Status KeepAbove3(UniqueFd* fd) {
  if (!fd->valid() || fd->get() > 3) return Status::Ok();
  Result<UniqueFd> copy = DupAbove3(fd->get());
  if (!copy.ok()) return copy.status();
  *fd = std::move(*copy);
  return Status::Ok();
}

}  // namespace

Result<ChildProcess> SpawnProcess(const SpawnOptions& options) {
  if (options.argv.empty()) {
    return InvalidArgument("cannot execute '" + options.path + "': no argv");
  }
  for (int c : options.cpus) {
    if (c < 0) return InvalidArgument("binding to CPUs " + CpuListText(options.cpus) + ": bad CPU");
  }
  CpuMask mask(options.cpus);
  if (!options.cpus.empty() && mask.set() == nullptr) {
    return ErrnoStatus("binding to CPUs " + CpuListText(options.cpus), ENOMEM);
  }

  std::vector<std::string> args = options.argv;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_copy;
  std::vector<char*> envp;
  if (options.env) {
    env_copy = *options.env;
    for (auto& e : env_copy) envp.push_back(e.data());
    envp.push_back(nullptr);
  }

  // The child's ends of its streams (closed here once it has them), each above 3.
  ChildProcess child;
  const ChildStream* streams[4] = {&options.in, &options.out, &options.err, &options.fd3};
  UniqueFd* parent_end[4] = {&child.in, &child.out, &child.err, &child.fd3};
  UniqueFd child_end[4];
  for (int target = 0; target < 4; ++target) {
    const ChildStream& s = *streams[target];
    const bool reads = target == 0;
    switch (s.kind) {
      case ChildStream::Kind::kInherit:
        break;
      case ChildStream::Kind::kDevNull:
        child_end[target].Reset(::open("/dev/null", (reads ? O_RDONLY : O_WRONLY) | O_CLOEXEC));
        if (!child_end[target].valid()) return ErrnoStatus("open /dev/null", errno);
        break;
      case ChildStream::Kind::kPipe: {
        Result<Pipe> p = MakePipe();
        if (!p.ok()) return p.status();
        child_end[target] = std::move(reads ? p->read : p->write);
        *parent_end[target] = std::move(reads ? p->write : p->read);
        break;
      }
      case ChildStream::Kind::kFd: {
        Result<UniqueFd> copy = DupAbove3(s.fd);
        if (!copy.ok()) return copy.status();
        child_end[target] = std::move(*copy);
        break;
      }
    }
    RINGRUN_RETURN_IF_ERROR(KeepAbove3(&child_end[target]));
  }

  Result<Pipe> status = MakePipe();
  if (!status.ok()) return status.status().Annotate("exec-status pipe");
  RINGRUN_RETURN_IF_ERROR(KeepAbove3(&status->write));

  ChildPlan plan{};
  plan.path = options.path.c_str();
  plan.argv = argv.data();
  plan.envp = options.env ? envp.data() : environ;
  plan.cwd = options.cwd.empty() ? nullptr : options.cwd.c_str();
  for (int target = 0; target < 4; ++target) plan.stdio[target] = child_end[target].get();
  plan.new_process_group = options.new_process_group;
  plan.death_signal = options.death_signal;
  plan.parent = ::getpid();
  plan.reset_signals = options.reset_signals;
  plan.close_other_fds = options.close_other_fds;
  plan.cpus = &mask;
  plan.status_fd = status->write.get();

  sigset_t all, caller_mask;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &caller_mask);
  plan.caller_mask = &caller_mask;
  const pid_t pid = ::fork();
  const int fork_errno = errno;
  if (pid == 0) RunChild(plan);
  ::pthread_sigmask(SIG_SETMASK, &caller_mask, nullptr);
  if (pid < 0) return ErrnoStatus("fork", fork_errno);
  if (options.new_process_group) ::setpgid(pid, pid);
  for (UniqueFd& fd : child_end) fd.Reset();
  status->write.Reset();

  int msg[2];
  ssize_t n;
  do {
    n = ::read(status->read.get(), msg, sizeof(msg));
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof(msg))) {
    child.pid = pid;  // end-of-file: execve succeeded
    return child;
  }
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  switch (msg[0]) {
    case kWorkingDirectory:
      return ErrnoStatus("working directory " + options.cwd, msg[1]);
    case kCpuAffinity:
      return ErrnoStatus("binding to CPUs " + CpuListText(options.cpus), msg[1]);
    case kExec:
      return ErrnoStatus("cannot execute '" + options.path + "'", msg[1]);
    default:
      return ErrnoStatus("redirecting stdio", msg[1]);
  }
}

std::string CpuListText(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace ringrun
