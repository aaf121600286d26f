#include "agent/process.h"

#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ringrun/common/spawn.h"

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

    SpawnOptions options;
    options.path = path.value();
    options.argv = req.argv;
    options.env = req.env;
    options.cwd = cwd;
    options.in = ChildStream::DevNull();
    options.out = ChildStream::NewPipe();
    options.err = ChildStream::NewPipe();
    if (req.timeline) options.fd3 = ChildStream::NewPipe();
    options.new_process_group = true;
    options.death_signal = SIGKILL;
    options.reset_signals = true;
    options.close_other_fds = true;
    options.cpus = req.cpus;
    Result<ChildProcess> child = SpawnProcess(options);
    if (!child.ok()) return child.status();
    Status nonblocking = SetNonBlocking(child->out.get(), true);
    if (nonblocking.ok()) nonblocking = SetNonBlocking(child->err.get(), true);
    if (nonblocking.ok() && req.timeline) nonblocking = SetNonBlocking(child->fd3.get(), true);
    if (!nonblocking.ok()) {  // the agent's output loop would block on this rank's pipes
      ::killpg(child->pid, SIGKILL);
      ::waitpid(child->pid, nullptr, 0);
      return nonblocking.Annotate("rank output pipes");
    }
    SpawnedProcess p;
    p.pid = child->pid;
    p.out = std::move(child->out);
    p.err = std::move(child->err);
    p.timeline = std::move(child->fd3);
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
