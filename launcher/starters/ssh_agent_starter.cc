#include "launcher/starters/ssh_agent_starter.h"

#include <poll.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "ringrun/common/defaults.h"
#include "ringrun/common/fd.h"
#include "ringrun/common/line_tail.h"
#include "ringrun/common/thread_annotations.h"

namespace ringrun::launcher::starters {
namespace {

constexpr int kPumpIntervalMs = 1000;  // every session is pumped at least this often
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

// One started agent: its session and what its output and exit left behind.
struct SshAgent {
  SshAgent(std::string d, std::unique_ptr<SshSession> s)
      : display(std::move(d)), session(std::move(s)) {}

  const std::string display;
  // Used only by the poller's thread while the agent is registered (the SshSession contract:
  // one thread at a time), and freed with the agent once it is released.
  std::unique_ptr<SshSession> session;
  std::atomic<bool> kill_requested{false};
  // The poller thread's own.
  std::string out_partial, err_partial;
  std::optional<int> received_exit;
  std::optional<std::chrono::steady_clock::time_point> exit_seen_at;

  Mutex mu;
  CondVar released_cv;  // released became true
  std::optional<int> exit GUARDED_BY(mu);
  LineTail tail GUARDED_BY(mu) = LineTail(kStderrTailLines);
  bool released GUARDED_BY(mu) = false;  // the poller is done with it
};

// One thread that drives the sessions of every agent that a starter started: it waits in
// poll() on their sockets and a wake pipe, pumps the sessions that have input, relays the
// agents' output to the launcher's stderr, one line per write, as "[agent HOST] line", keeps
// the last kStderrTailLines stderr lines of each, and records their exits. So a job over N SSH
// hosts holds one I/O thread for them, not N. Every kPumpIntervalMs it pumps every session
// (libssh's timers; an exit status whose channel never closes is taken as the end after
// kSshCloseAfterExitMs).
class SshPoller {
 public:
  static Result<std::shared_ptr<SshPoller>> Make() {
    Result<Pipe> wake = MakePipe();
    if (!wake.ok()) return wake.status().Annotate("SSH poller");
    RINGRUN_RETURN_IF_ERROR(SetNonBlocking(wake->read.get(), true));
    RINGRUN_RETURN_IF_ERROR(SetNonBlocking(wake->write.get(), true));
    return std::shared_ptr<SshPoller>(new SshPoller(std::move(*wake)));
  }

  ~SshPoller() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    Wake();
    if (thread_.joinable()) thread_.join();
  }

  // Hands `agent` to the poller's thread (from a starting thread).
  void Add(std::shared_ptr<SshAgent> agent) {
    {
      MutexLock lock(&mu_);
      added_.push_back(std::move(agent));
      if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
    }
    Wake();
  }

  void Wake() {
    char b = 'w';
    (void)!::write(wake_.write.get(), &b, 1);
  }

 private:
  explicit SshPoller(Pipe wake) : wake_(std::move(wake)) {}

  void Run() {
    std::vector<std::shared_ptr<SshAgent>> agents;  // registered, this thread's own
    std::vector<pollfd> fds;
    auto next_sweep = std::chrono::steady_clock::now() + std::chrono::milliseconds(kPumpIntervalMs);
    for (;;) {
      bool stop;
      {
        MutexLock lock(&mu_);
        for (auto& a : added_) agents.push_back(std::move(a));
        added_.clear();
        stop = stop_;
      }
      const auto now = std::chrono::steady_clock::now();
      const bool sweep = now >= next_sweep;
      if (sweep) next_sweep = now + std::chrono::milliseconds(kPumpIntervalMs);
      // fds[i + 1] was agents[i]'s at the last poll (agents added since have none yet).
      for (size_t i = 0; i < agents.size();) {
        SshAgent& a = *agents[i];
        const bool polled = i + 1 < fds.size();
        const bool readable = polled && fds[i + 1].revents != 0;
        if (Drive(a, stop, sweep || readable)) {
          Release(a);
          agents.erase(agents.begin() + static_cast<long>(i));
          if (polled) fds.erase(fds.begin() + static_cast<long>(i) + 1);
        } else {
          ++i;
        }
      }
      if (stop) return;
      // What to wait for: the wake pipe and every session; until the next sweep, or an exit
      // status's wait for its channel's close.
      auto until = next_sweep;
      fds.assign(1, pollfd{wake_.read.get(), POLLIN, 0});
      for (const auto& a : agents) {
        fds.push_back(pollfd{a->session->PollFd(), POLLIN, 0});
        if (a->exit_seen_at) {
          until =
              std::min(until, *a->exit_seen_at + std::chrono::milliseconds(kSshCloseAfterExitMs));
        }
      }
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      (void)::poll(fds.data(), fds.size(),
                   static_cast<int>(std::max<int64_t>(0, wait.count()) + 1));
      char drain[64];
      while (::read(wake_.read.get(), drain, sizeof(drain)) > 0) {
      }
    }
  }

  // One look at `a`: kill it if asked (or the poller stops), else pump it when `pump`, relay
  // what came and note its end. True once it has ended.
  bool Drive(SshAgent& a, bool stop, bool pump) {
    if (a.kill_requested.load() || stop) {
      a.session->Terminate();
      Finish(a, a.received_exit.value_or(kKilledStatus), "");
      return true;
    }
    if (pump) {
      ExecEvents ev;
      a.session->Pump(0, -1, &ev);
      Relay(a, ev.stdout_data, &a.out_partial);
      Relay(a, ev.stderr_data, &a.err_partial);
      if (ev.exit_status && !a.received_exit) {
        a.received_exit = ev.exit_status;
        a.exit_seen_at = std::chrono::steady_clock::now();
      }
      if (ev.closed) {
        const int status = a.received_exit.value_or(kConnectionLostStatus);
        std::string why;
        if (!a.received_exit) {
          why = ev.error.ok() ? a.display + ": SSH channel closed without an exit status"
                              : ev.error.message();
        }
        Finish(a, status, why);
        return true;
      }
    }
    if (a.exit_seen_at && std::chrono::steady_clock::now() - *a.exit_seen_at >
                              std::chrono::milliseconds(kSshCloseAfterExitMs)) {
      Finish(a, *a.received_exit, "");
      return true;
    }
    return false;
  }

  static void Release(SshAgent& a) {
    {
      MutexLock lock(&a.mu);
      a.released = true;
    }
    a.released_cv.SignalAll();
  }

  static void Finish(SshAgent& a, int status, const std::string& why) {
    if (!a.out_partial.empty()) EmitLine(a, std::exchange(a.out_partial, {}));
    if (!a.err_partial.empty()) EmitLine(a, std::exchange(a.err_partial, {}));
    MutexLock lock(&a.mu);
    if (!why.empty()) a.tail.Push(why);
    a.exit = status;
  }

  // Splits `data` into lines, keeping an unterminated rest in *partial.
  static void Relay(SshAgent& a, const std::string& data, std::string* partial) {
    size_t start = 0;
    for (;;) {
      size_t nl = data.find('\n', start);
      if (nl == std::string::npos) break;
      partial->append(data, start, nl - start);
      EmitLine(a, std::exchange(*partial, {}));
      start = nl + 1;
    }
    partial->append(data, start, std::string::npos);
  }

  static void EmitLine(SshAgent& a, std::string line) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::string text = "[agent " + a.display + "] " + line + "\n";
    (void)WriteAll(STDERR_FILENO, text.data(), text.size());
    MutexLock lock(&a.mu);
    a.tail.Push(line);
  }

  // wake_.write is written from any thread; wake_.read is read by thread_.
  const Pipe wake_;
  Mutex mu_;
  std::vector<std::shared_ptr<SshAgent>> added_ GUARDED_BY(mu_);  // not yet taken by thread_
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;  // started by the first Add (under mu_), joined by the destructor
};

class SshAgentHandle final : public AgentHandle {
 public:
  SshAgentHandle(std::shared_ptr<SshPoller> poller, std::shared_ptr<SshAgent> agent)
      : poller_(std::move(poller)), agent_(std::move(agent)) {
    poller_->Add(agent_);
  }

  // Ends the agent if it runs, and waits until the poller is done with its session.
  ~SshAgentHandle() override {
    Kill();
    MutexLock lock(&agent_->mu);
    while (!agent_->released) agent_->released_cv.Wait(&agent_->mu);
  }

  std::optional<int> Poll() override {
    MutexLock lock(&agent_->mu);
    return agent_->exit;
  }

  void Kill() override {
    if (agent_->kill_requested.exchange(true)) return;
    poller_->Wake();
  }

  std::string StderrTail() override {
    MutexLock lock(&agent_->mu);
    return agent_->tail.Text();
  }

 private:
  const std::shared_ptr<SshPoller> poller_;
  const std::shared_ptr<SshAgent> agent_;
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

    Result<std::shared_ptr<SshPoller>> poller = Poller();
    if (!poller.ok()) return poller.status().Annotate(display);
    return std::unique_ptr<AgentHandle>(std::make_unique<SshAgentHandle>(
        *poller, std::make_shared<SshAgent>(display, std::move(session))));
  }

 private:
  // The starter's poller, made with its first agent; the handles share it, so it outlives the
  // starter while they run.
  Result<std::shared_ptr<SshPoller>> Poller() {
    MutexLock lock(&poller_mu_);
    if (!poller_) {
      Result<std::shared_ptr<SshPoller>> made = SshPoller::Make();
      if (!made.ok()) return made.status();
      poller_ = std::move(*made);
    }
    return poller_;
  }

  const SshConfig config_;
  const std::shared_ptr<SshConnector> connector_;
  Gate gate_;
  Mutex poller_mu_;
  std::shared_ptr<SshPoller> poller_ GUARDED_BY(poller_mu_);
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
