#include "agent/agent.h"

#include <errno.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "ringrun/common/auth.h"
#include "ringrun/common/defaults.h"
#include "ringrun/common/log.h"
#include "ringrun/common/version.h"
#include "ringrun/job.grpc.pb.h"

namespace ringrun::agent {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using Stream = grpc::ClientReaderWriter<v1::AgentEvent, v1::AgentCommand>;

constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kMaxLine = 1 << 20;  // longer lines are sent in pieces
// An Output event (kMaxLine plus one read, and framing) must fit the job service's cap.
static_assert(kMaxLine + kReadChunk + 4096 <= size_t{kMaxJobServiceRequestBytes});
constexpr size_t kMaxQueuedBytes = 8 << 20;  // stop reading ranks' pipes beyond this
constexpr int kExitReportDelayMs = 500;      // wait this long for a dead rank's pipes to drain

int64_t NowMs() {
  return std::chrono::duration_cast<milliseconds>(Clock::now().time_since_epoch()).count();
}

int FindFreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(a);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

// Events to the launcher go through one writer thread, so the main loop never blocks on the
// network. Thread-safe.
class Outbox {
 public:
  explicit Outbox(Stream* stream) : stream_(stream), thread_([this] { Loop(); }) {}
  ~Outbox() { Close(); }

  void Push(v1::AgentEvent ev) {
    std::lock_guard<std::mutex> lock(mu_);
    bytes_ += ev.ByteSizeLong();
    queue_.push_back(std::move(ev));
    cv_.notify_one();
  }
  size_t queued_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
  }
  // Waits (until `deadline`) for the queue to drain, then half-closes the stream.
  bool Drain(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    done_ = true;
    cv_.notify_one();
    return drained_cv_.wait_until(lock, deadline, [&] { return finished_; });
  }
  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      abandon_ = true;
      cv_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
  }
  bool broken() {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return !queue_.empty() || done_; });
      if (abandon_ && !finished_) break;
      if (queue_.empty() && done_) {
        lock.unlock();
        if (!broken_) stream_->WritesDone();
        lock.lock();
        finished_ = true;
        drained_cv_.notify_all();
        break;
      }
      v1::AgentEvent ev = std::move(queue_.front());
      queue_.pop_front();
      bytes_ -= ev.ByteSizeLong();
      if (broken_) continue;
      lock.unlock();
      bool ok = stream_->Write(ev);
      lock.lock();
      if (!ok) broken_ = true;
    }
    finished_ = true;
    drained_cv_.notify_all();
  }

  Stream* const stream_;
  std::mutex mu_;
  std::condition_variable cv_, drained_cv_;
  std::deque<v1::AgentEvent> queue_;                                         // guarded by mu_
  size_t bytes_ = 0;                                                         // guarded by mu_
  bool done_ = false, abandon_ = false, finished_ = false, broken_ = false;  // guarded by mu_
  std::thread thread_;
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  UniqueFd fds[2];  // stdout, stderr; reset at EOF
  std::string pending[2];
  bool reaped = false;
  int wait_status = 0;
  int64_t reaped_at_ms = 0;
  bool reported = false;
};

class Agent {
 public:
  Agent(const AgentConfig& config, Spawner& spawner) : config_(config), spawner_(spawner) {}
  int Run();

 private:
  void SpawnAll(const v1::RegisterReply& reply);
  void ReadPipe(Rank& r, int which);
  void SendOutput(Rank& r, int which, std::string data, bool final);
  void ReapChildren();
  void ReportExits(bool force);
  void SignalAll(int signo);
  void BeginTermination(int grace_ms, const std::string& why);
  bool AllReported() const;

  const AgentConfig& config_;
  Spawner& spawner_;
  std::unique_ptr<Outbox> outbox_;
  std::map<int, Rank> ranks_;
  std::optional<Clock::time_point> kill_at_;
  bool terminating_ = false;
};

void Agent::SendOutput(Rank& r, int which, std::string data, bool final) {
  v1::AgentEvent ev;
  auto* o = ev.mutable_output();
  o->set_rank(r.rank);
  o->set_stream(which == 0 ? v1::AgentEvent::STDOUT : v1::AgentEvent::STDERR);
  o->set_data(std::move(data));
  o->set_final(final);
  outbox_->Push(std::move(ev));
}

void Agent::ReadPipe(Rank& r, int which) {
  char buf[kReadChunk];
  ssize_t n = ::read(r.fds[which].get(), buf, sizeof(buf));
  if (n < 0) {
    if (errno == EAGAIN || errno == EINTR) return;
    n = 0;  // treat errors as EOF
  }
  std::string& pending = r.pending[which];
  if (n == 0) {
    if (!pending.empty()) SendOutput(r, which, std::move(pending), true);
    pending.clear();
    r.fds[which].Reset();
    return;
  }
  pending.append(buf, static_cast<size_t>(n));
  size_t last_nl = pending.rfind('\n');
  if (last_nl != std::string::npos) {
    std::string rest = pending.substr(last_nl + 1);
    pending.resize(last_nl + 1);
    SendOutput(r, which, std::move(pending), false);
    pending = std::move(rest);
  } else if (pending.size() >= kMaxLine) {
    SendOutput(r, which, std::move(pending) + "\n", false);
    pending.clear();
  }
}

void Agent::ReapChildren() {
  while (true) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (auto& [rank, r] : ranks_) {
      if (r.pid == pid && !r.reaped) {
        r.reaped = true;
        r.wait_status = status;
        r.reaped_at_ms = NowMs();
      }
    }
    // Other pids are orphaned descendants re-parented to us (we are a subreaper).
  }
}

void Agent::ReportExits(bool force) {
  int64_t now = NowMs();
  for (auto& [rank, r] : ranks_) {
    if (!r.reaped || r.reported) continue;
    bool drained = !r.fds[0].valid() && !r.fds[1].valid();
    if (!drained && !force && now - r.reaped_at_ms < kExitReportDelayMs) continue;
    for (int w = 0; w < 2; ++w) {
      // Whatever is still buffered (a descendant may hold the pipe open): send it now.
      while (r.fds[w].valid()) {
        size_t before = r.pending[w].size();
        ReadPipe(r, w);
        if (r.fds[w].valid() && r.pending[w].size() == before) break;
      }
      if (!r.pending[w].empty()) SendOutput(r, w, std::move(r.pending[w]), true);
      r.pending[w].clear();
      r.fds[w].Reset();
    }
    v1::AgentEvent ev;
    auto* x = ev.mutable_exited();
    x->set_rank(r.rank);
    if (WIFEXITED(r.wait_status)) {
      x->set_exit_code(WEXITSTATUS(r.wait_status));
    } else if (WIFSIGNALED(r.wait_status)) {
      x->set_signal(WTERMSIG(r.wait_status));
    }
    outbox_->Push(std::move(ev));
    r.reported = true;
    // Sweep what the rank left in its process group.
    ::killpg(r.pid, SIGKILL);
  }
}

void Agent::SignalAll(int signo) {
  for (auto& [rank, r] : ranks_) {
    if (r.pid > 0 && !r.reported) ::killpg(r.pid, signo);
  }
}

void Agent::BeginTermination(int grace_ms, const std::string& why) {
  if (!terminating_) spdlog::debug("terminating ranks: {}", why);
  terminating_ = true;
  if (grace_ms <= 0) {
    SignalAll(SIGKILL);
    kill_at_.reset();
    return;
  }
  SignalAll(SIGTERM);
  auto at = Clock::now() + milliseconds(grace_ms);
  if (!kill_at_ || at < *kill_at_) kill_at_ = at;
}

bool Agent::AllReported() const {
  for (const auto& [rank, r] : ranks_) {
    if (!r.reported) return false;
  }
  return true;
}

void Agent::SpawnAll(const v1::RegisterReply& reply) {
  for (const auto& spec : reply.ranks()) {
    SpawnRequest req;
    for (const auto& a : spec.argv()) req.argv.push_back(a);
    for (const auto& e : spec.env()) req.env.push_back(e);
    req.cwd = spec.cwd();
    Rank& r = ranks_[spec.rank()];
    r.rank = spec.rank();
    auto p = spawner_.Spawn(req);
    v1::AgentEvent ev;
    if (!p.ok()) {
      auto* f = ev.mutable_spawn_failed();
      f->set_rank(r.rank);
      char host[256] = "";
      ::gethostname(host, sizeof(host) - 1);
      f->set_message(p.status().message() + " (on " + host + ")");
      f->set_exit_code(p.status().code() == Code::kNotFound ? 127 : 126);
      r.reaped = r.reported = true;
    } else {
      r.pid = p->pid;
      r.fds[0] = std::move(p->out);
      r.fds[1] = std::move(p->err);
      ev.mutable_started()->set_rank(r.rank);
      ev.mutable_started()->set_pid(r.pid);
    }
    outbox_->Push(std::move(ev));
  }
}

int Agent::Run() {
  // Signals arrive through a signalfd; the ranks get default dispositions back at exec.
  sigset_t sigs;
  sigemptyset(&sigs);
  for (int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) sigaddset(&sigs, s);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  UniqueFd sigfd(::signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK));
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  ::signal(SIGPIPE, SIG_IGN);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);

  auto channel = MakeChannel(config_.launcher_target, kKeepaliveMs, kKeepaliveTimeoutMs);
  auto stub = v1::JobService::NewStub(channel);

  v1::RegisterRequest req;
  req.set_host_index(config_.host_index);
  char host[256] = "";
  ::gethostname(host, sizeof(host) - 1);
  req.set_hostname(host);
  req.set_agent_pid(::getpid());
  req.set_version(RINGRUN_VERSION_STRING);
  req.set_free_port(FindFreePort());
  req.set_service_target(config_.launcher_target);
  v1::RegisterReply reply;
  {
    grpc::ClientContext ctx;
    AttachSecret(&ctx, config_.secret);
    ctx.set_deadline(DeadlineAfterMs(config_.register_timeout_ms));
    ctx.set_wait_for_ready(true);
    grpc::Status st = stub->Register(&ctx, req, &reply);
    if (!st.ok()) {
      // ABORTED: the job was torn down before this host's turn; the launcher says why.
      auto level =
          st.error_code() == grpc::StatusCode::ABORTED ? spdlog::level::debug : spdlog::level::err;
      spdlog::log(level, "{}: registering with the job service at {}: {}", host,
                  config_.launcher_target, st.error_message());
      return 1;
    }
  }
  spdlog::debug("registered: {} ranks", reply.ranks_size());
  const int heartbeat_ms =
      reply.heartbeat_interval_ms() > 0 ? reply.heartbeat_interval_ms() : kHeartbeatIntervalMs;
  const int silence_ms =
      reply.heartbeat_timeout_ms() > 0 ? reply.heartbeat_timeout_ms() : kHeartbeatTimeoutMs;
  const int grace_ms = reply.grace_ms();

  grpc::ClientContext session_ctx;
  AttachSecret(&session_ctx, config_.secret);
  std::unique_ptr<Stream> stream = stub->Session(&session_ctx);
  outbox_ = std::make_unique<Outbox>(stream.get());
  {
    v1::AgentEvent hello;
    hello.mutable_hello()->set_host_index(config_.host_index);
    outbox_->Push(std::move(hello));
  }

  // Commands from the launcher, read on their own thread.
  std::mutex cmd_mu;
  std::deque<v1::AgentCommand> commands;  // guarded by cmd_mu
  std::atomic<bool> session_over{false};
  std::atomic<int64_t> last_heard{NowMs()};
  const int wake_fd = wake.get();
  std::thread reader([&] {
    v1::AgentCommand cmd;
    while (stream->Read(&cmd)) {
      last_heard = NowMs();
      if (cmd.has_ping()) continue;
      std::lock_guard<std::mutex> lock(cmd_mu);
      commands.push_back(cmd);
      uint64_t one = 1;
      (void)!::write(wake_fd, &one, sizeof(one));
    }
    session_over = true;
    uint64_t one = 1;
    (void)!::write(wake_fd, &one, sizeof(one));
  });

  SpawnAll(reply);

  int exit_code = 0;
  bool lost = false;
  bool stdin_open = config_.stdin_fd >= 0;
  auto next_heartbeat = Clock::now();
  while (true) {
    ReapChildren();
    ReportExits(terminating_ && !kill_at_);
    if (AllReported()) break;
    if (lost && !terminating_) BeginTermination(grace_ms, "lost the launcher");

    std::vector<pollfd> pfds;
    std::vector<std::pair<int, int>> who;  // (rank, stream) per pollfd beyond the fixed ones
    pfds.push_back({sigfd.get(), POLLIN, 0});
    pfds.push_back({wake.get(), POLLIN, 0});
    pfds.push_back({stdin_open ? config_.stdin_fd : -1, POLLIN, 0});
    if (outbox_->queued_bytes() < kMaxQueuedBytes) {
      for (auto& [rank, r] : ranks_) {
        for (int w = 0; w < 2; ++w) {
          if (r.fds[w].valid()) {
            pfds.push_back({r.fds[w].get(), POLLIN, 0});
            who.emplace_back(rank, w);
          }
        }
      }
    }
    auto now = Clock::now();
    auto until = std::min(next_heartbeat, now + milliseconds(100));
    if (kill_at_) until = std::min(until, *kill_at_);
    int timeout = static_cast<int>(
        std::max<int64_t>(0, std::chrono::duration_cast<milliseconds>(until - now).count()));
    int n = ::poll(pfds.data(), pfds.size(), timeout);
    if (n < 0 && errno != EINTR) {
      spdlog::error("poll: {}", std::strerror(errno));
      BeginTermination(0, "poll failed");
    }
    if (pfds[0].revents & POLLIN) {
      signalfd_siginfo si;
      while (::read(sigfd.get(), &si, sizeof(si)) == sizeof(si)) {
        if (si.ssi_signo != SIGCHLD && !terminating_) {
          spdlog::warn("{}: terminated by signal {}: ending ranks", host, si.ssi_signo);
          exit_code = 1;
          BeginTermination(grace_ms, "agent signalled");
        }
      }
    }
    if (pfds[1].revents & POLLIN) {
      uint64_t v;
      (void)!::read(wake.get(), &v, sizeof(v));
    }
    if (pfds[2].revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[256];
      ssize_t r = ::read(config_.stdin_fd, buf, sizeof(buf));
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        stdin_open = false;
        if (!lost) spdlog::warn("{}: lost the launcher (stdin closed): ending ranks", host);
        lost = true;
        exit_code = 1;
      }
    }
    for (size_t i = 3; i < pfds.size(); ++i) {
      if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        ReadPipe(ranks_[who[i - 3].first], who[i - 3].second);
      }
    }
    {
      std::deque<v1::AgentCommand> todo;
      {
        std::lock_guard<std::mutex> lock(cmd_mu);
        todo.swap(commands);
      }
      for (const auto& cmd : todo) {
        if (cmd.has_signal()) {
          SignalAll(cmd.signal().signo());
        } else if (cmd.has_terminate()) {
          BeginTermination(cmd.terminate().grace_ms(), cmd.terminate().reason());
        }
      }
    }
    if (session_over && !lost) {
      spdlog::warn("{}: lost the launcher (session ended): ending ranks", host);
      lost = true;
      exit_code = 1;
    }
    if (!lost && NowMs() - last_heard > silence_ms) {
      spdlog::warn("{}: lost the launcher (no heartbeat for {} ms): ending ranks", host,
                   silence_ms);
      lost = true;
      exit_code = 1;
    }
    now = Clock::now();
    if (kill_at_ && now >= *kill_at_) {
      kill_at_.reset();
      SignalAll(SIGKILL);
    }
    if (now >= next_heartbeat) {
      v1::AgentEvent hb;
      hb.mutable_heartbeat();
      outbox_->Push(std::move(hb));
      next_heartbeat = now + milliseconds(heartbeat_ms);
    }
  }

  spdlog::debug("every rank reported");
  // Every rank is reported: hand the rest to the launcher, then wait for it to close.
  if (!lost) {
    outbox_->Drain(Clock::now() + milliseconds(5000));
    auto deadline = Clock::now() + milliseconds(5000);
    while (!session_over && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(5));
  }
  if (!session_over) session_ctx.TryCancel();
  reader.join();
  outbox_->Close();
  grpc::Status st = stream->Finish();
  spdlog::debug("session finished");
  if (!st.ok() && !lost) spdlog::debug("session ended: {}", st.error_message());
  return exit_code;
}

}  // namespace

int RunAgent(const AgentConfig& config, Spawner& spawner) {
  Agent agent(config, spawner);
  return agent.Run();
}

}  // namespace ringrun::agent
