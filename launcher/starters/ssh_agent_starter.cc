#include "launcher/starters/ssh_agent_starter.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <utility>

#include "ringrun/common/defaults.h"
#include "ringrun/common/fd.h"
#include "ringrun/common/line_tail.h"
#include "ringrun/common/thread_annotations.h"

namespace ringrun::launcher::starters {
namespace {

constexpr int kPumpIntervalMs = 1000;  // how long the I/O thread sleeps with nothing to do
constexpr int kKilledStatus = 128 + SIGKILL;
constexpr int kConnectionLostStatus = 255;  // what ssh(1) reports for the same failure

// Bounds the connections in progress. Holders are bounded by the connect timeout.
class Gate {
 public:
  explicit Gate(int slots) : free_(std::max(1, slots)) {}
  void Acquire() {
    MutexLock lock(&mu_);
    while (free_ <= 0) cv_.Wait(&mu_);
    --free_;
  }
  void Release() {
    {
      MutexLock lock(&mu_);
      ++free_;
    }
    cv_.Signal();
  }

 private:
  Mutex mu_;
  CondVar cv_;  // free_ grew
  int free_ GUARDED_BY(mu_);
};

class GateHold {
 public:
  explicit GateHold(Gate& g) : g_(g) { g_.Acquire(); }
  ~GateHold() { g_.Release(); }
  GateHold(const GateHold&) = delete;
  GateHold& operator=(const GateHold&) = delete;

 private:
  Gate& g_;
};

class SshAgentHandle final : public AgentHandle {
 public:
  SshAgentHandle(std::string display, std::unique_ptr<SshSession> session, Pipe wake)
      : display_(std::move(display)), session_(std::move(session)), wake_(std::move(wake)) {
    thread_ = std::thread([this] { Run(); });
  }

  ~SshAgentHandle() override {
    Kill();
    if (thread_.joinable()) thread_.join();
  }

  std::optional<int> Poll() override {
    MutexLock lock(&mu_);
    return exit_;
  }

  void Kill() override {
    if (kill_requested_.exchange(true)) return;
    char b = 'k';
    (void)!::write(wake_.write.get(), &b, 1);
  }

  std::string StderrTail() override {
    MutexLock lock(&mu_);
    return tail_.Text();
  }

 private:
  void Run() {
    std::string out_partial, err_partial;
    std::optional<int> received_exit;
    std::optional<std::chrono::steady_clock::time_point> exit_seen_at;
    for (;;) {
      if (kill_requested_.load()) {
        session_->Terminate();
        Finish(received_exit.value_or(kKilledStatus), &out_partial, &err_partial, "");
        return;
      }
      ExecEvents ev;
      session_->Pump(kPumpIntervalMs, wake_.read.get(), &ev);
      char drain[64];
      while (::read(wake_.read.get(), drain, sizeof(drain)) > 0) {
      }
      Relay(ev.stdout_data, &out_partial);
      Relay(ev.stderr_data, &err_partial);
      if (ev.exit_status && !received_exit) {
        received_exit = ev.exit_status;
        exit_seen_at = std::chrono::steady_clock::now();
      }
      if (ev.closed) {
        int status = received_exit.value_or(kConnectionLostStatus);
        std::string why = received_exit ? ""
                                        : (ev.error.ok() ? display_ +
                                                               ": SSH channel closed "
                                                               "without an exit status"
                                                         : ev.error.message());
        Finish(status, &out_partial, &err_partial, why);
        return;
      }
      if (exit_seen_at && std::chrono::steady_clock::now() - *exit_seen_at >
                              std::chrono::milliseconds(kSshCloseAfterExitMs)) {
        Finish(*received_exit, &out_partial, &err_partial, "");
        return;
      }
    }
  }

  void Finish(int status, std::string* out_partial, std::string* err_partial,
              const std::string& why) {
    if (!out_partial->empty()) EmitLine(std::exchange(*out_partial, {}));
    if (!err_partial->empty()) EmitLine(std::exchange(*err_partial, {}));
    MutexLock lock(&mu_);
    if (!why.empty()) tail_.Push(why);
    exit_ = status;
  }

  // Splits `data` into lines, keeping an unterminated rest in *partial.
  void Relay(const std::string& data, std::string* partial) {
    size_t start = 0;
    for (;;) {
      size_t nl = data.find('\n', start);
      if (nl == std::string::npos) break;
      partial->append(data, start, nl - start);
      EmitLine(std::exchange(*partial, {}));
      start = nl + 1;
    }
    partial->append(data, start, std::string::npos);
  }

  void EmitLine(std::string line) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::string text = "[agent " + display_ + "] " + line + "\n";
    (void)WriteAll(STDERR_FILENO, text.data(), text.size());
    MutexLock lock(&mu_);
    tail_.Push(line);
  }

  // Constant after construction.
  const std::string display_;
  // Used only by thread_ (the SshSession contract: one thread at a time).
  std::unique_ptr<SshSession> session_;
  // wake_.write is written by Kill() from any thread; wake_.read is read by thread_.
  Pipe wake_;
  std::atomic<bool> kill_requested_{false};

  Mutex mu_;
  std::optional<int> exit_ GUARDED_BY(mu_);
  LineTail tail_ GUARDED_BY(mu_) = LineTail(kStderrTailLines);

  std::thread thread_;  // last: started once every field above exists
};

class SshAgentStarter final : public AgentStarter {
 public:
  SshAgentStarter(const SshConfig& config, std::shared_ptr<SshConnector> connector)
      : config_(config), connector_(std::move(connector)), gate_(config.fanout) {}

  Result<std::unique_ptr<AgentHandle>> Start(const hosts::HostSpec& host,
                                             const AgentLaunch& launch) override {
    const std::string display = host.Display();
    GateHold hold(gate_);

    SshConnectOutcome outcome;
    const int attempts = std::max(1, config_.connect_attempts);
    int backoff_ms = std::max(0, config_.retry_backoff_ms);
    for (int attempt = 1;; ++attempt) {
      outcome = connector_->Connect(host, config_);
      if (outcome.session) break;
      if (!IsTransient(outcome.failure) || attempt >= attempts) {
        if (attempt > 1) {
          return Status(outcome.status.code(), outcome.status.message() + " (after " +
                                                   std::to_string(attempt) + " attempts)");
        }
        return outcome.status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
      backoff_ms *= 2;
    }
    std::unique_ptr<SshSession> session = std::move(outcome.session);

    std::string address = launch.service_address;
    if (address.empty()) address = config_.launcher_address;
    if (address.empty() && !config_.network_interfaces.empty()) {
      Result<std::string> a = InterfaceAddress(config_.network_interfaces);
      if (!a.ok()) return a.status().Annotate(display);
      address = *a;
    }
    if (address.empty()) address = session->LocalAddress();
    if (address.empty()) {
      return Internal(display +
                      ": cannot tell the local address of the SSH connection; "
                      "pass --launcher-address or --network-interfaces");
    }

    RINGRUN_RETURN_IF_ERROR(session->Exec(BuildAgentCommand(launch, address)));
    RINGRUN_RETURN_IF_ERROR(session->WriteStdin(launch.secret + "\n"));

    Result<Pipe> wake = MakePipe();
    if (!wake.ok()) return wake.status().Annotate(display);
    RINGRUN_RETURN_IF_ERROR(SetNonBlocking(wake->read.get(), true));
    RINGRUN_RETURN_IF_ERROR(SetNonBlocking(wake->write.get(), true));
    return std::unique_ptr<AgentHandle>(
        std::make_unique<SshAgentHandle>(display, std::move(session), std::move(*wake)));
  }

 private:
  const SshConfig config_;
  const std::shared_ptr<SshConnector> connector_;
  Gate gate_;
};

}  // namespace

SshConfig SshConfigFromOptions(const Options& o) {
  SshConfig c;
  c.identity_file = o.ssh_identity_file;
  c.port = o.ssh_port;
  c.known_hosts = o.ssh_known_hosts;
  c.accept_new_host_keys = o.ssh_accept_new_host_keys;
  c.connect_timeout_s = o.ssh_connect_timeout_s;
  c.fanout = o.ssh_fanout;
  c.launcher_address = o.launcher_address;
  c.network_interfaces = o.network_interfaces;
  return c;
}

std::unique_ptr<AgentStarter> MakeSshAgentStarter(const SshConfig& config) {
  return MakeSshAgentStarter(config, std::shared_ptr<SshConnector>(MakeLibsshConnector()));
}

std::unique_ptr<AgentStarter> MakeSshAgentStarter(const SshConfig& config,
                                                  std::shared_ptr<SshConnector> connector) {
  return std::make_unique<SshAgentStarter>(config, std::move(connector));
}

std::string ShellQuote(std::string_view word) {
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  out += "'";
  return out;
}

std::string BuildAgentCommand(const AgentLaunch& launch, const std::string& address) {
  const bool v6 = address.find(':') != std::string::npos && address.front() != '[';
  const std::string endpoint =
      (v6 ? "[" + address + "]" : address) + ":" + std::to_string(launch.service_port);
  const std::string agent = ShellQuote(launch.agent_path);
  return "test -e " + agent + " || exit 127; exec " + agent + " --launcher " +
         ShellQuote(endpoint) + " --host-index " + ShellQuote(std::to_string(launch.host_index)) +
         " --log-level " + ShellQuote(launch.log_level.empty() ? "warn" : launch.log_level);
}

std::string DescribeRemoteAgentExit(const std::string& host, const std::string& agent_path,
                                    int exit_code) {
  if (exit_code == 127) {
    return host + ": ringrun-agent not found at " + agent_path + " (exit status 127)";
  }
  if (exit_code == 126) {
    return host + ": ringrun-agent at " + agent_path + " cannot be executed (exit status 126)";
  }
  if (exit_code == kConnectionLostStatus) return host + ": the SSH connection to the agent failed";
  if (exit_code > 128 && exit_code < 128 + 65) {
    const char* name = sigabbrev_np(exit_code - 128);
    return host + ": ringrun-agent was killed by signal " +
           (name ? std::string("SIG") + name : std::to_string(exit_code - 128));
  }
  return host + ": ringrun-agent exited with status " + std::to_string(exit_code);
}

}  // namespace ringrun::launcher::starters
