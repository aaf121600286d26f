#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "launcher/starters/agent_starter.h"
#include "ringrun/common/fd.h"

namespace ringrun::launcher::starters {
namespace {

class LocalAgentHandle final : public AgentHandle {
 public:
  LocalAgentHandle(pid_t pid, UniqueFd stdin_fd) : pid_(pid), stdin_(std::move(stdin_fd)) {}
  ~LocalAgentHandle() override {
    Kill();
    if (!exit_) ::waitpid(pid_, nullptr, 0);
  }

  std::optional<int> Poll() override {
    if (exit_) return exit_;
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return exit_;
  }

  void Kill() override {
    if (!exit_) ::kill(pid_, SIGKILL);
    stdin_.Reset();
  }

  std::string StderrTail() override { return ""; }  // the agent writes to our stderr directly

 private:
  const pid_t pid_;
  UniqueFd stdin_;  // held open: its EOF tells the agent we are gone
  std::optional<int> exit_;
};

class LocalAgentStarter final : public AgentStarter {
 public:
  Result<std::unique_ptr<AgentHandle>> Start(const hosts::HostSpec& host,
                                             const AgentLaunch& launch) override {
    auto pipe = MakePipe();
    if (!pipe.ok()) return pipe.status().Annotate(host.name);
    std::string target =
        (launch.service_address.empty() ? std::string("127.0.0.1") : launch.service_address) + ":" +
        std::to_string(launch.service_port);
    std::vector<std::string> args = {launch.agent_path,
                                     "--launcher",
                                     target,
                                     "--host-index",
                                     std::to_string(launch.host_index),
                                     "--log-level",
                                     launch.log_level};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (::access(launch.agent_path.c_str(), X_OK) != 0) {
      return ErrnoStatus(host.name + ": ringrun-agent " + launch.agent_path, errno);
    }
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) return ErrnoStatus(host.name + ": fork", errno);
    if (pid == 0) {
      // Child: stdin is the secret pipe; stdout goes to our stderr. The agent resets its
      // own signal mask and dispositions.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      ::dup2(pipe->read.get(), 0);
      ::dup2(2, 1);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    pipe->read.Reset();
    std::string line = launch.secret + "\n";
    Status st = WriteAll(pipe->write.get(), line.data(), line.size());
    if (!st.ok()) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      return st.Annotate(host.name + ": handing the secret to the agent");
    }
    return std::unique_ptr<AgentHandle>(new LocalAgentHandle(pid, std::move(pipe->write)));
  }
};

}  // namespace

std::unique_ptr<AgentStarter> MakeLocalAgentStarter() {
  return std::make_unique<LocalAgentStarter>();
}

}  // namespace ringrun::launcher::starters
