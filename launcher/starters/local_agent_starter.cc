#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "launcher/starters/agent_starter.h"
#include "ringrun/common/fd.h"
#include "ringrun/common/spawn.h"

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
    std::string target =
        (launch.service_address.empty() ? std::string("127.0.0.1") : launch.service_address) + ":" +
        std::to_string(launch.service_port);
    // stdin is the secret pipe; stdout goes to our stderr. The agent resets its own signal mask
    // and dispositions.
    SpawnOptions options;
    options.path = launch.agent_path;
    options.argv = {launch.agent_path,
                    "--launcher",
                    target,
                    "--host-index",
                    std::to_string(launch.host_index),
                    "--log-level",
                    launch.log_level};
    options.in = ChildStream::NewPipe();
    options.out = ChildStream::Fd(STDERR_FILENO);
    options.death_signal = SIGKILL;
    Result<ChildProcess> child = SpawnProcess(options);
    if (!child.ok()) return child.status().Annotate(host.name + ": ringrun-agent");
    const pid_t pid = child->pid;
    std::string line = launch.secret + "\n";
    Status st = WriteAll(child->in.get(), line.data(), line.size());
    if (!st.ok()) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      return st.Annotate(host.name + ": handing the secret to the agent");
    }
    return std::unique_ptr<AgentHandle>(new LocalAgentHandle(pid, std::move(child->in)));
  }
};

}  // namespace

std::unique_ptr<AgentStarter> MakeLocalAgentStarter() {
  return std::make_unique<LocalAgentStarter>();
}

}  // namespace ringrun::launcher::starters
