#include "launcher/starters/slurm_agent_starter.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <set>
#include <thread>

#include "launcher/hosts/slurm.h"
#include "launcher/starters/ssh_session.h"
#include "ringrun/common/defaults.h"
#include "ringrun/common/env_contract.h"
#include "ringrun/common/fd.h"
#include "ringrun/common/interfaces.h"
#include "ringrun/common/line_tail.h"
#include "ringrun/common/log.h"
#include "ringrun/common/spawn.h"
#include "ringrun/common/thread_annotations.h"

extern char** environ;

namespace ringrun::launcher::starters {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kKillEscalation = std::chrono::seconds(5);  // SIGTERM to srun, then SIGKILL
constexpr int kPollMs = 100;

// Variables srun reads as options: the launcher's own task or step must not shape the agents'.
bool IsSrunInputVariable(std::string_view name) {
  static const std::set<std::string_view> kNames = {
      "SLURM_EXACT",      "SLURM_OVERLAP",       "SLURM_NO_KILL",       "SLURM_KILL_BAD_EXIT",
      "SLURM_EXPORT_ENV", "SRUN_CPUS_PER_TASK",  "SLURM_CPUS_PER_TASK", "SLURM_WAIT",
      "SLURM_NNODES",     "SLURM_JOB_NUM_NODES", "SLURM_NODELIST",      "SLURM_TASKS_PER_NODE",
      "SLURM_CPU_BIND",   "SLURM_DISTRIBUTION",  "SLURM_MPI_TYPE",      "SLURM_UNBUFFEREDIO",
      "SLURM_LABELIO",    "SLURM_STDINMODE",     "SLURM_STDOUTMODE",    "SLURM_STDERRMODE",
      "SLURM_OPEN_MODE",  "SLURM_JOB_NAME",      "SLURM_GRES",          "SLURM_GPUS_PER_TASK",
  };
  return kNames.count(name) != 0 || hosts::IsSlurmTaskVariable(name);
}

std::string FindOnPath(const std::string& prog) {
  if (prog.find('/') != std::string::npos) return ::access(prog.c_str(), X_OK) == 0 ? prog : "";
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t colon = p.find(':', start);
    std::string dir = p.substr(start, colon - start);
    if (dir.empty()) dir = ".";
    std::string full = dir + "/" + prog;
    if (::access(full.c_str(), X_OK) == 0) return full;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return "";
}

// The running srun step, shared by every host's handle. One monitor thread relays srun's output,
// escalates Kill() and reaps srun.
class SrunStep {
 public:
  SrunStep(pid_t pid, UniqueFd out) : pid_(pid), out_(std::move(out)) {
    thread_ = std::thread([this] { Monitor(); });
  }
  ~SrunStep() {
    Kill();
    if (thread_.joinable()) thread_.join();
  }
  SrunStep(const SrunStep&) = delete;
  SrunStep& operator=(const SrunStep&) = delete;

  std::optional<int> Poll() {
    MutexLock lock(&mu_);
    return exit_;
  }
  void Kill() { kill_requested_ = true; }
  std::string Tail() {
    MutexLock lock(&mu_);
    return tail_.Text();
  }

 private:
  void Monitor() {
    std::string partial;
    std::optional<Clock::time_point> term_sent;
    bool reaped = false, eof = false;
    int status_code = 0;
    while (!(reaped && eof)) {
      if (kill_requested_ && !reaped) {
        if (!term_sent) {
          ::kill(pid_, SIGTERM);
          term_sent = Clock::now();
        } else if (Clock::now() - *term_sent > kKillEscalation) {
          spdlog::warn("srun did not end {} s after SIGTERM: killing it",
                       std::chrono::duration_cast<std::chrono::seconds>(kKillEscalation).count());
          ::kill(pid_, SIGKILL);
          term_sent = Clock::now() + std::chrono::hours(1);  // once
        }
      }
      if (!eof) {
        pollfd p{out_.get(), POLLIN, 0};
        if (::poll(&p, 1, kPollMs) > 0) {
          char buf[4096];
          ssize_t n = ::read(out_.get(), buf, sizeof(buf));
          if (n > 0) {
            partial.append(buf, static_cast<size_t>(n));
            size_t nl;
            while ((nl = partial.find('\n')) != std::string::npos) {
              Emit(partial.substr(0, nl));
              partial.erase(0, nl + 1);
            }
          } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
            eof = true;
          }
        }
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (!reaped) {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
          reaped = true;
          status_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          // Output still in flight may follow; stop waiting for it after a moment.
          reaped_at_ = Clock::now();
        }
      } else if (!eof && Clock::now() - reaped_at_ > std::chrono::seconds(2)) {
        eof = true;  // a task's descendant still holds srun's output: stop reading
      }
      if (reaped && (eof || kill_requested_)) {
        MutexLock lock(&mu_);
        exit_ = status_code;
      }
    }
    if (!partial.empty()) Emit(partial);
    MutexLock lock(&mu_);
    exit_ = status_code;
  }

  void Emit(std::string line) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::string text = "[srun] " + line + "\n";
    (void)WriteAll(STDERR_FILENO, text.data(), text.size());
    MutexLock lock(&mu_);
    tail_.Push(line);
  }

  // Constant after construction.
  const pid_t pid_;
  // Used by thread_ only.
  UniqueFd out_;
  Clock::time_point reaped_at_;

  std::atomic<bool> kill_requested_{false};

  Mutex mu_;
  std::optional<int> exit_ GUARDED_BY(mu_);
  LineTail tail_ GUARDED_BY(mu_) = LineTail(kStderrTailLines);

  std::thread thread_;  // last: started once every field above exists
};

class SlurmAgentHandle final : public AgentHandle {
 public:
  explicit SlurmAgentHandle(std::shared_ptr<SrunStep> step) : step_(std::move(step)) {}
  std::optional<int> Poll() override { return step_->Poll(); }
  void Kill() override { step_->Kill(); }
  std::string StderrTail() override { return step_->Tail(); }

 private:
  const std::shared_ptr<SrunStep> step_;
};

class SlurmAgentStarter final : public AgentStarter {
 public:
  explicit SlurmAgentStarter(SlurmStarterConfig config) : config_(std::move(config)) {}

  Result<std::unique_ptr<AgentHandle>> Start(const hosts::HostSpec& host,
                                             const AgentLaunch& launch) override {
    if (config_.step_per_host) {
      Result<std::shared_ptr<SrunStep>> step = Launch(launch);
      if (!step.ok()) return step.status().Annotate(host.name);
      return std::unique_ptr<AgentHandle>(std::make_unique<SlurmAgentHandle>(*step));
    }
    MutexLock lock(&mu_);
    if (!step_ && launch_error_.ok()) {
      Result<std::shared_ptr<SrunStep>> step = Launch(launch);
      if (step.ok()) {
        step_ = std::move(step.value());
      } else {
        launch_error_ = step.status();
      }
    }
    if (!step_) return launch_error_.Annotate(host.name);
    return std::unique_ptr<AgentHandle>(std::make_unique<SlurmAgentHandle>(step_));
  }

 private:
  // Thread-safe: a shared step's is called under mu_, per-host steps' from several threads.
  Result<std::shared_ptr<SrunStep>> Launch(const AgentLaunch& launch) const {
    const std::string srun = FindOnPath(config_.srun);
    if (srun.empty()) return NotFound("srun: '" + config_.srun + "' not found on PATH");
    SlurmStarterConfig config = config_;
    if (!launch.service_address.empty()) config.launcher_address = launch.service_address;
    Result<std::string> address = SlurmLauncherAddress(config);
    if (!address.ok()) return address.status();
    std::vector<std::string> args = BuildSrunCommand(config, launch, *address);
    args[0] = srun;
    std::vector<std::string> env_list;
    for (char** e = environ; *e; ++e) env_list.emplace_back(*e);
    std::vector<std::string> env = BuildSrunEnvironment(env_list, launch.secret);
    std::string shown;
    for (const auto& a : args) shown += (shown.empty() ? "" : " ") + a;
    spdlog::debug("starting the agents: {}", shown);

    // One pipe for srun's stdout and stderr.
    Result<Pipe> out = MakePipe();
    if (!out.ok()) return out.status().Annotate("srun");
    SpawnOptions options;
    options.path = srun;
    options.argv = std::move(args);
    options.env = std::move(env);
    options.in = ChildStream::DevNull();
    options.out = ChildStream::Fd(out->write.get());
    options.err = ChildStream::Fd(out->write.get());
    options.new_process_group = true;
    options.reset_signals = true;
    Result<ChildProcess> child = SpawnProcess(options);
    if (!child.ok()) return child.status().Annotate("srun");
    out->write.Reset();
    return std::make_shared<SrunStep>(child->pid, std::move(out->read));
  }

  // Constant after construction.
  const SlurmStarterConfig config_;

  // Held while the step starts: the first Start() launches it, the others wait and share it.
  Mutex mu_;
  std::shared_ptr<SrunStep> step_ GUARDED_BY(mu_);
  Status launch_error_ GUARDED_BY(mu_);
};

}  // namespace

std::vector<std::string> BuildSrunCommand(const SlurmStarterConfig& config,
                                          const AgentLaunch& launch, const std::string& address) {
  std::string nodes, all;
  const std::vector<int> one{launch.host_index};
  for (int h : config.step_per_host ? one : config.active_hosts) {
    nodes += (nodes.empty() ? "" : ",") + config.host_names.at(static_cast<size_t>(h));
  }
  for (const auto& n : config.host_names) all += (all.empty() ? "" : ",") + n;
  const std::string n = std::to_string(config.step_per_host ? 1 : config.active_hosts.size());
  const bool v6 = address.find(':') != std::string::npos && address.front() != '[';
  const std::string endpoint =
      (v6 ? "[" + address + "]" : address) + ":" + std::to_string(launch.service_port);
  std::vector<std::string> args = {
      config.srun,           "--nodes=" + n,        "--ntasks=" + n,
      "--ntasks-per-node=1", "--nodelist=" + nodes, "--kill-on-bad-exit=1",
      "--cpu-bind=none",     "--mpi=none",          "--job-name=ringrun-agents"};
  if (config.overlap) args.push_back("--overlap");
  args.insert(args.end(), {launch.agent_path, "--launcher", endpoint, "--slurm-hosts", all,
                           "--log-level", launch.log_level.empty() ? "warn" : launch.log_level});
  return args;
}

std::vector<std::string> BuildSrunEnvironment(const std::vector<std::string>& env,
                                              const std::string& secret) {
  std::vector<std::string> out;
  const std::string secret_prefix = std::string(env::kAgentSecret) + "=";
  for (const std::string& e : env) {
    size_t eq = e.find('=');
    if (eq == std::string::npos) continue;
    std::string_view name(e.data(), eq);
    if (IsSrunInputVariable(name) || name == env::kAgentSecret) continue;
    out.push_back(e);
  }
  out.push_back(secret_prefix + secret);
  return out;
}

Result<std::string> SlurmLauncherAddress(const SlurmStarterConfig& config) {
  if (!config.launcher_address.empty()) return config.launcher_address;
  if (!config.network_interfaces.empty()) return InterfaceAddress(config.network_interfaces);
  for (int h : config.active_hosts) {
    const std::string& name = config.host_names.at(static_cast<size_t>(h));
    if (hosts::IsLocalHost(name)) continue;
    // The source address of the route to the node: where its agent can reach us.
    Result<std::string> found = RouteSourceAddress(name);
    if (!found.ok()) {
      return NotFound(found.status().message() +
                      " (a node of the allocation); pass --launcher-address or "
                      "--network-interfaces");
    }
    return found;
  }
  return std::string("127.0.0.1");
}

std::unique_ptr<AgentStarter> MakeSlurmAgentStarter(SlurmStarterConfig config) {
  return std::make_unique<SlurmAgentStarter>(std::move(config));
}

}  // namespace ringrun::launcher::starters
