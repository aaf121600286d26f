#include "launcher/starters/fake_agents.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <deque>

#include "ringrun/common/auth.h"

namespace ringrun::launcher::starters {

// One fake agent: Register, then the Session as a bidirectional reactor. Writes go one at a
// time from a queue; a read is always outstanding until the Session ends.
class FakeAgents::Agent final : public grpc::ClientBidiReactor<v1::AgentEvent, v1::AgentCommand> {
 public:
  Agent(FakeAgents* owner, v1::JobService::Stub* stub, int host, const std::string& secret)
      : owner_(*owner), stub_(stub), host_(host), secret_(secret) {
    const auto& silent = owner_.script_.silent_hosts;
    silent_ = std::find(silent.begin(), silent.end(), host) != silent.end();
  }

  void Begin() {
    AttachSecret(&register_ctx_, secret_);
    register_ctx_.set_deadline(DeadlineAfterMs(60000));
    register_req_.set_host_index(host_);
    register_req_.set_hostname("fake" + std::to_string(host_));
    register_req_.set_agent_pid(static_cast<int>(::getpid()));
    register_req_.set_free_port(20000 + host_ % 40000);
    stub_->async()->Register(&register_ctx_, &register_req_, &register_reply_,
                             [this](grpc::Status st) { OnRegistered(std::move(st)); });
  }

  void Cancel() {
    register_ctx_.TryCancel();
    session_ctx_.TryCancel();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the Session is ending: OnDone follows
    if (command_.has_ping()) {
      MutexLock lock(&mu_);
      result_.pings++;
      if (!silent_) {
        v1::AgentEvent hb;
        hb.mutable_heartbeat();
        Queue(std::move(hb));
      }
    } else if (command_.has_terminate()) {
      MutexLock lock(&mu_);
      result_.terminated = true;
      ExitRanks(0, SIGTERM);
    }
    StartRead(&command_);
  }

  void OnWriteDone(bool ok) override {
    MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) return;
    WriteNext();
  }

  void OnDone(const grpc::Status& status) override {
    FakeAgentResult result;
    {
      MutexLock lock(&mu_);
      result_.session_status = status;
      result = result_;
    }
    owner_.Ended(host_, result);
  }

 private:
  void OnRegistered(grpc::Status st) {
    {
      MutexLock lock(&mu_);
      result_.register_status = st;
      result_.ranks = register_reply_.ranks_size();
    }
    if (!st.ok()) {
      FakeAgentResult result;
      {
        MutexLock lock(&mu_);
        result = result_;
      }
      owner_.Ended(host_, result);
      return;
    }
    {
      MutexLock lock(&owner_.mu_);
      owner_.sessions_open_++;
    }
    AttachSecret(&session_ctx_, secret_);
    stub_->async()->Session(&session_ctx_, this);
    {
      MutexLock lock(&mu_);
      v1::AgentEvent hello;
      hello.mutable_hello()->set_host_index(host_);
      Queue(std::move(hello));
      for (const v1::RankSpec& spec : register_reply_.ranks()) {
        v1::AgentEvent started;
        started.mutable_started()->set_rank(spec.rank());
        started.mutable_started()->set_pid(100000 + spec.rank());
        Queue(std::move(started));
        v1::AgentEvent out;
        out.mutable_output()->set_rank(spec.rank());
        out.mutable_output()->set_data("hello from rank " + std::to_string(spec.rank()) + "\n");
        Queue(std::move(out));
      }
      if (owner_.script_.fail_host == host_) {
        ExitRanks(owner_.script_.fail_code, 0);
      } else if (owner_.script_.ranks_exit) {
        ExitRanks(0, 0);
      }
    }
    StartRead(&command_);
    StartCall();
  }

  // Every rank still running exits; then the agent half-closes its Session, as the real one
  // does once all its ranks are reported.
  void ExitRanks(int code, int signo) REQUIRES(mu_) {
    if (exited_) return;
    exited_ = true;
    for (const v1::RankSpec& spec : register_reply_.ranks()) {
      v1::AgentEvent ev;
      ev.mutable_exited()->set_rank(spec.rank());
      ev.mutable_exited()->set_exit_code(signo ? 0 : code);
      ev.mutable_exited()->set_signal(signo);
      Queue(std::move(ev));
    }
    close_after_writes_ = true;
    WriteNext();
  }

  void Queue(v1::AgentEvent ev) REQUIRES(mu_) {
    queue_.push_back(std::move(ev));
    WriteNext();
  }

  void WriteNext() REQUIRES(mu_) {
    if (writing_ || writes_done_) return;
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      StartWrite(&current_);
    } else if (close_after_writes_) {
      writes_done_ = true;
      StartWritesDone();
    }
  }

  FakeAgents& owner_;
  v1::JobService::Stub* const stub_;
  const int host_;
  const std::string secret_;
  bool silent_ = false;

  grpc::ClientContext register_ctx_;
  v1::RegisterRequest register_req_;
  v1::RegisterReply register_reply_;  // read-only once OnRegistered runs
  grpc::ClientContext session_ctx_;
  v1::AgentCommand command_;  // the read in flight; read callbacks only

  Mutex mu_;
  std::deque<v1::AgentEvent> queue_ GUARDED_BY(mu_);
  v1::AgentEvent current_ GUARDED_BY(mu_);  // the write in flight
  bool writing_ GUARDED_BY(mu_) = false;
  bool exited_ GUARDED_BY(mu_) = false;
  bool close_after_writes_ GUARDED_BY(mu_) = false;
  bool writes_done_ GUARDED_BY(mu_) = false;
  FakeAgentResult result_ GUARDED_BY(mu_);
};

FakeAgents::FakeAgents(FakeAgentScript script, OnEnded on_ended)
    : script_(std::move(script)), on_ended_(std::move(on_ended)) {}

FakeAgents::~FakeAgents() {
  std::vector<Agent*> running;
  {
    MutexLock lock(&mu_);
    for (auto& a : agents_) running.push_back(a.get());
  }
  for (Agent* a : running) a->Cancel();
  MutexLock lock(&mu_);
  while (ended_.size() < agents_.size()) cv_.Wait(&mu_);
}

v1::JobService::Stub* FakeAgents::StubFor(int port) {
  const size_t per = static_cast<size_t>(std::max(1, script_.agents_per_channel));
  if (stubs_.empty() || agents_.size() % per == 0) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", static_cast<int>(stubs_.size()));  // a connection of its own
    stubs_.push_back(v1::JobService::NewStub(
        grpc::CreateCustomChannel(script_.service_address + ":" + std::to_string(port),
                                  grpc::InsecureChannelCredentials(), args)));
  }
  return stubs_.back().get();
}

void FakeAgents::Start(int host_index, int port, const std::string& secret) {
  Agent* agent;
  {
    MutexLock lock(&mu_);
    v1::JobService::Stub* stub = StubFor(port);
    agents_.push_back(std::make_unique<Agent>(this, stub, host_index, secret));
    agent = agents_.back().get();
  }
  agent->Begin();
}

void FakeAgents::Ended(int host, FakeAgentResult result) {
  if (on_ended_) on_ended_(host, result);
  MutexLock lock(&mu_);
  if (result.register_status.ok()) sessions_open_--;
  ended_[host] = std::move(result);
  cv_.SignalAll();
}

bool FakeAgents::WaitEnded(int count, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  MutexLock lock(&mu_);
  while (static_cast<int>(ended_.size()) < count) {
    if (!cv_.WaitUntil(&mu_, deadline) && static_cast<int>(ended_.size()) < count) return false;
  }
  return true;
}

std::map<int, FakeAgentResult> FakeAgents::ended() const {
  MutexLock lock(&mu_);
  return ended_;
}

int FakeAgents::sessions_open() const {
  MutexLock lock(&mu_);
  return sessions_open_;
}

namespace {

int ExitCode(const FakeAgentResult& r) {
  return r.register_status.ok() && r.session_status.ok() ? 0 : 1;
}

// A fake agent's handle: running until `exit_code` has one, or until killed.
class FakeHandle final : public AgentHandle {
 public:
  explicit FakeHandle(std::function<std::optional<int>()> exit_code)
      : exit_code_(std::move(exit_code)) {}
  std::optional<int> Poll() override { return killed_ ? 137 : exit_code_(); }
  void Kill() override { killed_ = true; }
  std::string StderrTail() override { return ""; }

 private:
  const std::function<std::optional<int>()> exit_code_;
  bool killed_ = false;
};

class FakeStarter final : public AgentStarter {
 public:
  explicit FakeStarter(FakeAgents* agents) : agents_(agents) {}
  Result<std::unique_ptr<AgentHandle>> Start(const hosts::HostSpec& /*host*/,
                                             const AgentLaunch& launch) override {
    agents_->Start(launch.host_index, launch.service_port, launch.secret);
    FakeAgents* agents = agents_;
    return std::unique_ptr<AgentHandle>(
        new FakeHandle([agents, host = launch.host_index]() -> std::optional<int> {
          auto ended = agents->ended();
          auto it = ended.find(host);
          if (it == ended.end()) return std::nullopt;
          return ExitCode(it->second);
        }));
  }

 private:
  FakeAgents* const agents_;
};

// The exits reported by the other process, read as handles poll.
class PipeExits {
 public:
  explicit PipeExits(int fd) : fd_(fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }
  std::optional<int> ExitOf(int host) {
    char buf[4096];
    for (ssize_t n; (n = ::read(fd_, buf, sizeof buf)) > 0;) pending_.append(buf, n);
    for (size_t nl; (nl = pending_.find('\n')) != std::string::npos; pending_.erase(0, nl + 1)) {
      int h = -1, code = 0;
      if (std::sscanf(pending_.c_str(), "%d %d", &h, &code) == 2) exits_[h] = code;
    }
    auto it = exits_.find(host);
    return it == exits_.end() ? std::nullopt : std::optional<int>(it->second);
  }

 private:
  const int fd_;
  std::string pending_;
  std::map<int, int> exits_;
};

class PipeStarter final : public AgentStarter {
 public:
  PipeStarter(int launch_fd, int ended_fd) : fd_(launch_fd), exits_(ended_fd) {}
  Result<std::unique_ptr<AgentHandle>> Start(const hosts::HostSpec& host,
                                             const AgentLaunch& launch) override {
    const std::string line = std::to_string(launch.host_index) + " " +
                             std::to_string(launch.service_port) + " " + launch.secret + "\n";
    MutexLock lock(&mu_);
    if (::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      return Unavailable(host.name + ": could not hand the launch to the fake agents");
    }
    PipeExits* exits = &exits_;
    return std::unique_ptr<AgentHandle>(
        new FakeHandle([exits, host = launch.host_index] { return exits->ExitOf(host); }));
  }

 private:
  const int fd_;
  Mutex mu_;  // one line at a time
  PipeExits exits_;
};

}  // namespace

int ProcessThreadCount() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

std::unique_ptr<AgentStarter> MakeFakeAgentStarter(FakeAgents* agents) {
  return std::make_unique<FakeStarter>(agents);
}

std::unique_ptr<AgentStarter> MakePipeAgentStarter(int launch_fd, int ended_fd) {
  return std::make_unique<PipeStarter>(launch_fd, ended_fd);
}

}  // namespace ringrun::launcher::starters
