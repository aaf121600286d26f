#include "agent/process.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "agent/cpu_binding.h"

namespace ringrun::agent {
namespace {

// `path` as seen from `cwd`.
std::string FromDir(const std::string& cwd, const std::string& path) {
  if (path.empty() || path[0] == '/' || cwd.empty()) return path;
  return cwd.back() == '/' ? cwd + path : cwd + "/" + path;
}

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

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

// Child side of fork: never returns. Reports a failure as {stage, errno} on `status_fd`.
// Only async-signal-safe calls: the agent has other threads.
[[noreturn]] void ExecChild(const std::string& path, char* const* argv, char* const* envp,
                            const char* cwd, const CpuMask& cpus, int out_fd, int err_fd,
                            int status_fd, pid_t parent) {
  auto fail = [&](int stage) {
    int msg[2] = {stage, errno};
    (void)!::write(status_fd, msg, sizeof(msg));
    ::_exit(127);
  };
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(137);
  // Default dispositions and an empty mask, whatever the agent (or the launcher) had.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) ::sigaction(s, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull < 0 || ::dup2(devnull, 0) < 0 || ::dup2(out_fd, 1) < 0 || ::dup2(err_fd, 2) < 0) {
    fail(0);
  }
  // Everything above 2 closes on exec: ours are O_CLOEXEC already, this catches the rest.
  ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  if (::chdir(cwd) != 0) fail(1);
  if (cpus.set() != nullptr && ::sched_setaffinity(0, cpus.size(), cpus.set()) != 0) fail(3);
  ::execve(path.c_str(), argv, envp);
  fail(2);
  ::_exit(127);  // not reached: fail() exits (a lambda cannot say so)
}

class ForkExecSpawner final : public Spawner {
 public:
  Result<SpawnedProcess> Spawn(const SpawnRequest& req) override {
    if (req.argv.empty()) return InvalidArgument("empty command");
    struct stat st;
    if (::stat(req.cwd.c_str(), &st) != 0) {
      return ErrnoStatus("working directory " + req.cwd, errno);
    }
    if (!S_ISDIR(st.st_mode)) return NotFound("working directory " + req.cwd + ": not a directory");
    // A relative --wdir is the agent's directory's (the launcher's here, the login directory on
    // a remote host); made absolute so that what ResolveExecutable returns holds after chdir.
    std::string cwd = req.cwd;
    if (cwd.empty() || cwd[0] != '/') {
      char here[4096];
      if (::getcwd(here, sizeof(here)) == nullptr) return ErrnoStatus("getcwd", errno);
      cwd = FromDir(here, cwd.empty() ? "." : cwd);
    }
    auto path = ResolveExecutable(req.argv[0], req.env, cwd);
    if (!path.ok()) return path.status();

    std::vector<char*> argv, envp;
    std::vector<std::string> args = req.argv, env = req.env;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    // Negative CPU numbers cannot be set: refused here rather than in the child.
    for (int c : req.cpus) {
      if (c < 0) return InvalidArgument("binding to CPUs " + CpuListText(req.cpus) + ": bad CPU");
    }
    CpuMask mask(req.cpus);
    if (!req.cpus.empty() && mask.set() == nullptr) {
      return ErrnoStatus("binding to CPUs " + CpuListText(req.cpus), ENOMEM);
    }

    auto out = MakePipe();
    auto err = MakePipe();
    auto status = MakePipe();
    if (!out.ok()) return out.status();
    if (!err.ok()) return err.status();
    if (!status.ok()) return status.status();
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) return ErrnoStatus("fork", errno);
    if (pid == 0) {
      ExecChild(path.value(), argv.data(), envp.data(), cwd.c_str(), mask, out->write.get(),
                err->write.get(), status->write.get(), parent);
    }
    ::setpgid(pid, pid);  // also in the parent, so that killpg works before the child runs
    out->write.Reset();
    err->write.Reset();
    status->write.Reset();
    int msg[2];
    ssize_t n;
    do {
      n = ::read(status->read.get(), msg, sizeof(msg));
    } while (n < 0 && errno == EINTR);
    if (n == static_cast<ssize_t>(sizeof(msg))) {
      ::waitpid(pid, nullptr, 0);
      if (msg[0] == 1) return ErrnoStatus("working directory " + req.cwd, msg[1]);
      if (msg[0] == 2) return ErrnoStatus("cannot execute '" + path.value() + "'", msg[1]);
      if (msg[0] == 3) return ErrnoStatus("binding to CPUs " + CpuListText(req.cpus), msg[1]);
      return ErrnoStatus("redirecting stdio", msg[1]);
    }
    Status nonblocking = SetNonBlocking(out->read.get(), true);
    if (nonblocking.ok()) nonblocking = SetNonBlocking(err->read.get(), true);
    if (!nonblocking.ok()) {  // the agent's output loop would block on this rank's pipes
      ::killpg(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      return nonblocking.Annotate("rank output pipes");
    }
    SpawnedProcess p;
    p.pid = pid;
    p.out = std::move(out->read);
    p.err = std::move(err->read);
    return p;
  }

  void SignalGroup(pid_t pgid, int signo) override {
    if (pgid > 0) ::killpg(pgid, signo);
  }

  std::optional<Reaped> Reap() override {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return std::nullopt;
    return Reaped{pid, status};
  }
};

}  // namespace

Result<std::string> ResolveExecutable(const std::string& file, const std::vector<std::string>& env,
                                      const std::string& cwd) {
  if (file.empty()) return NotFound("cannot execute '': empty command name");
  if (file.find('/') != std::string::npos) {
    const std::string full = FromDir(cwd, file);
    if (IsExecutableFile(full)) return full;
    int e = errno;
    struct stat st;
    if (::stat(full.c_str(), &st) == 0) {
      return PermissionDenied("cannot execute '" + file + "': " +
                              (S_ISDIR(st.st_mode) ? "is a directory" : "permission denied"));
    }
    return ErrnoStatus("cannot execute '" + file + "'", e);
  }
  std::string path = "/usr/local/bin:/usr/bin:/bin";
  for (const auto& kv : env) {
    if (kv.rfind("PATH=", 0) == 0) path = kv.substr(5);
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t colon = path.find(':', start);
    std::string dir =
        path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    std::string candidate = FromDir(cwd, (dir.empty() ? "." : dir) + "/" + file);
    if (IsExecutableFile(candidate)) return candidate;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return NotFound("cannot execute '" + file + "': command not found in PATH (" + path + ")");
}

std::unique_ptr<Spawner> MakeForkExecSpawner() { return std::make_unique<ForkExecSpawner>(); }

}  // namespace ringrun::agent
