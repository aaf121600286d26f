#include "agent/agent_loop.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "agent/cpu_binding.h"
#include "ringrun/common/defaults.h"
#include "ringrun/common/log.h"

namespace ringrun::agent {

using std::chrono::milliseconds;

constexpr size_t kReadChunk = 64 * 1024;
// An Output event (a whole line plus one read, and framing) must fit the job service's cap.
static_assert(kMaxLineBytes + kReadChunk + 4096 <= size_t{kMaxJobServiceRequestBytes});

AgentLoop::AgentLoop(std::string hostname, Spawner& spawner, LauncherLink& link, const Clock& clock)
    : hostname_(std::move(hostname)), spawner_(spawner), link_(link), clock_(clock) {}

namespace {

// The CPUs of each local rank under --bind-to core (none bound: empty), and a debug line per host.
std::map<int, std::vector<int>> ChooseCpus(const std::string& hostname,
                                           const v1::RegisterReply& reply,
                                           const Result<std::vector<int>>& allowed_cpus) {
  std::map<int, std::vector<int>> out;
  if (reply.cpu_binding() != v1::RegisterReply::CPU_BINDING_CORE || reply.ranks_size() == 0) {
    return out;
  }
  if (!allowed_cpus.ok()) {
    spdlog::warn("{}: --bind-to core: {}: binding no rank on this host", hostname,
                 allowed_cpus.status().message());
    return out;
  }
  const int local_size = reply.ranks_size();
  std::string summary;
  for (const auto& spec : reply.ranks()) {
    Result<std::vector<int>> cpus =
        CpusForRank(allowed_cpus.value(), local_size, spec.local_rank());
    if (!cpus.ok()) {
      spdlog::warn("{}: --bind-to core: {}: binding no rank on this host", hostname,
                   cpus.status().message());
      return {};
    }
    summary += (summary.empty() ? "" : ", ") + std::string("rank ") + std::to_string(spec.rank()) +
               " -> " + CpuListText(*cpus);
    out[spec.local_rank()] = std::move(cpus.value());
  }
  spdlog::debug("{}: --bind-to core over allowed CPUs {}: {}", hostname,
                CpuListText(allowed_cpus.value()), summary);
  return out;
}

}  // namespace

void AgentLoop::Start(const v1::RegisterReply& reply,
                      const Result<std::vector<int>>& allowed_cpus) {
  heartbeat_interval_ms_ =
      reply.heartbeat_interval_ms() > 0 ? reply.heartbeat_interval_ms() : kHeartbeatIntervalMs;
  heartbeat_timeout_ms_ =
      reply.heartbeat_timeout_ms() > 0 ? reply.heartbeat_timeout_ms() : kHeartbeatTimeoutMs;
  grace_ms_ = reply.grace_ms();
  next_heartbeat_ = clock_.Now();
  const std::map<int, std::vector<int>> cpus = ChooseCpus(hostname_, reply, allowed_cpus);
  const std::string cpus_prefix = std::string(kCpusVariable) + "=";
  const std::string timeline_prefix = std::string(kTimelineFdVariable) + "=";
  for (const auto& spec : reply.ranks()) {
    SpawnRequest req;
    for (const auto& a : spec.argv()) req.argv.push_back(a);
    for (const auto& e : spec.env()) {
      if (e.rfind(cpus_prefix, 0) != 0 && e.rfind(timeline_prefix, 0) != 0) req.env.push_back(e);
    }
    req.cwd = spec.cwd();
    if (reply.timeline()) {
      req.timeline = true;
      req.env.push_back(timeline_prefix + "3");
    }
    if (auto it = cpus.find(spec.local_rank()); it != cpus.end()) {
      req.cpus = it->second;
      req.env.push_back(cpus_prefix + CpuListText(req.cpus));
    }
    Rank& r = ranks_[spec.rank()];
    r.rank = spec.rank();
    auto p = spawner_.Spawn(req);
    v1::AgentEvent ev;
    if (!p.ok()) {
      auto* f = ev.mutable_spawn_failed();
      f->set_rank(r.rank);
      f->set_message(p.status().message() + " (on " + hostname_ + ")");
      f->set_exit_code(p.status().code() == Code::kNotFound ? 127 : 126);
      r.reaped = r.reported = true;
    } else {
      r.pid = p->pid;
      r.fds[0] = std::move(p->out);
      r.fds[1] = std::move(p->err);
      r.fds[2] = std::move(p->timeline);
      ev.mutable_started()->set_rank(r.rank);
      ev.mutable_started()->set_pid(r.pid);
      if (!req.cpus.empty()) ev.mutable_started()->set_cpus(CpuListText(req.cpus));
    }
    link_.Send(std::move(ev));
  }
}

void AgentLoop::SendOutput(Rank& r, int stream, std::string data, bool final) {
  v1::AgentEvent ev;
  auto* o = ev.mutable_output();
  o->set_rank(r.rank);
  static constexpr v1::AgentEvent::Stream kStreams[] = {
      v1::AgentEvent::STDOUT, v1::AgentEvent::STDERR, v1::AgentEvent::TIMELINE};
  o->set_stream(kStreams[stream]);
  o->set_data(std::move(data));
  o->set_final(final);
  link_.Send(std::move(ev));
}

void AgentLoop::ReadPipe(Rank& r, int stream) {
  char buf[kReadChunk];
  ssize_t n = ::read(r.fds[stream].get(), buf, sizeof(buf));
  if (n < 0) {
    if (errno == EAGAIN || errno == EINTR) return;
    n = 0;  // treat errors as EOF
  }
  std::string& pending = r.pending[stream];
  if (n == 0) {
    if (!pending.empty()) SendOutput(r, stream, std::move(pending), true);
    pending.clear();
    r.fds[stream].Reset();
    return;
  }
  pending.append(buf, static_cast<size_t>(n));
  size_t last_nl = pending.rfind('\n');
  if (last_nl != std::string::npos) {
    std::string rest = pending.substr(last_nl + 1);
    pending.resize(last_nl + 1);
    SendOutput(r, stream, std::move(pending), false);
    pending = std::move(rest);
  } else if (pending.size() >= kMaxLineBytes) {
    SendOutput(r, stream, std::move(pending) + "\n", false);
    pending.clear();
  }
}

void AgentLoop::OnPipeReadable(int rank, int stream) {
  auto it = ranks_.find(rank);
  if (it != ranks_.end() && it->second.fds[stream].valid()) ReadPipe(it->second, stream);
}

void AgentLoop::Reap() {
  ++reap_sweeps_;
  while (auto reaped = spawner_.Reap()) {
    for (auto& [rank, r] : ranks_) {
      if (r.pid == reaped->pid && !r.reaped) {
        r.reaped = true;
        r.wait_status = reaped->wait_status;
        r.reaped_at = clock_.Now();
        r.reap_sweep = reap_sweeps_;
      }
    }
    // Other pids are orphaned descendants re-parented to us (we are a subreaper).
  }
}

namespace {

bool FailedExit(int wait_status) { return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) != 0; }

}  // namespace

bool AgentLoop::ReadyToReport(const Rank& r, bool force, Clock::TimePoint now) const {
  if (!force && FailedExit(r.wait_status) && now - r.reaped_at < milliseconds(kFailedExitGraceMs)) {
    return false;
  }
  bool drained = !r.fds[0].valid() && !r.fds[1].valid() && !r.fds[2].valid();
  return drained || force || now - r.reaped_at >= milliseconds(kExitReportDelayMs);
}

// Exits go up in the order the ranks died, as far as this agent can tell: by the time it reaped
// them, a non-zero exit counted kFailedExitGraceMs late (a rank killed from outside is more
// likely the cause than a peer that failed on losing it, and may be reaped after it), then by
// the Reap() sweep that saw them, and within one sweep a death by signal first. A rank whose
// pipes are still draining holds back the ones that died after it, at most kExitReportDelayMs,
// so that the launcher's first-failure rule sees the first death.
void AgentLoop::ReportExits(bool force) {
  const auto now = clock_.Now();
  std::vector<Rank*> order;
  for (auto& [rank, r] : ranks_) {
    if (r.reaped && !r.reported) order.push_back(&r);
  }
  auto died = [](const Rank* r) {
    return FailedExit(r->wait_status) ? r->reaped_at + milliseconds(kFailedExitGraceMs)
                                      : r->reaped_at;
  };
  std::stable_sort(order.begin(), order.end(), [&died](const Rank* a, const Rank* b) {
    if (died(a) != died(b)) return died(a) < died(b);
    if (a->reap_sweep != b->reap_sweep) return a->reap_sweep < b->reap_sweep;
    return WIFSIGNALED(a->wait_status) && !WIFSIGNALED(b->wait_status);
  });
  for (Rank* rp : order) {
    Rank& r = *rp;
    if (!ReadyToReport(r, force, now)) break;
    for (int w = 0; w < 3; ++w) {
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
    link_.Send(std::move(ev));
    r.reported = true;
    // Sweep what the rank left in its process group.
    spawner_.SignalGroup(r.pid, SIGKILL);
  }
}

void AgentLoop::SignalAll(int signo) {
  for (auto& [rank, r] : ranks_) {
    if (r.pid > 0 && !r.reported) spawner_.SignalGroup(r.pid, signo);
  }
}

void AgentLoop::Terminate(int grace_ms, const std::string& why) {
  if (!terminating_) spdlog::debug("terminating ranks: {}", why);
  terminating_ = true;
  if (grace_ms <= 0) {
    SignalAll(SIGKILL);
    kill_at_.reset();
    return;
  }
  SignalAll(SIGTERM);
  auto at = clock_.Now() + milliseconds(grace_ms);
  if (!kill_at_ || at < *kill_at_) kill_at_ = at;
}

void AgentLoop::OnSignal(int signo) {
  if (terminating_) return;
  spdlog::warn("{}: terminated by signal {}: ending ranks", hostname_, signo);
  exit_code_ = 1;
  Terminate(grace_ms_, "agent signalled");
}

void AgentLoop::LoseLauncher(const std::string& why) {
  if (lost_) return;
  spdlog::warn("{}: lost the launcher ({}): ending ranks", hostname_, why);
  lost_ = true;
  exit_code_ = 1;
}

void AgentLoop::OnStdinClosed() { LoseLauncher("stdin closed"); }

void AgentLoop::RunCommands() {
  for (const auto& cmd : link_.TakeCommands()) {
    if (cmd.has_signal()) {
      ForwardSignal(cmd.signal().signo());
    } else if (cmd.has_terminate()) {
      Terminate(cmd.terminate().grace_ms(), cmd.terminate().reason());
    }
  }
}

void AgentLoop::CheckLauncher() {
  if (link_.session_over()) LoseLauncher("session ended");
  if (clock_.Now() - link_.last_heard() > milliseconds(heartbeat_timeout_ms_)) {
    LoseLauncher("no heartbeat for " + std::to_string(heartbeat_timeout_ms_) + " ms");
  }
}

bool AgentLoop::AllReported() const {
  for (const auto& [rank, r] : ranks_) {
    if (!r.reported) return false;
  }
  return true;
}

bool AgentLoop::Step() {
  RunCommands();
  CheckLauncher();
  auto now = clock_.Now();
  if (kill_at_ && now >= *kill_at_) {
    kill_at_.reset();
    SignalAll(SIGKILL);
  }
  if (now >= next_heartbeat_) {
    v1::AgentEvent hb;
    hb.mutable_heartbeat();
    link_.Send(std::move(hb));
    next_heartbeat_ = now + milliseconds(heartbeat_interval_ms_);
  }
  Reap();
  ReportExits(terminating_ && !kill_at_);
  if (AllReported()) return false;
  if (lost_ && !terminating_) Terminate(grace_ms_, "lost the launcher");
  return true;
}

std::vector<AgentLoop::Watch> AgentLoop::watches() {
  std::vector<Watch> out;
  if (link_.queued_bytes() >= kMaxQueuedBytes) return out;
  for (auto& [rank, r] : ranks_) {
    for (int w = 0; w < 3; ++w) {
      if (r.fds[w].valid()) out.push_back({r.fds[w].get(), rank, w});
    }
  }
  return out;
}

Clock::TimePoint AgentLoop::next_deadline() const {
  auto until = std::min(next_heartbeat_, clock_.Now() + milliseconds(kMaxPollIntervalMs));
  if (kill_at_) until = std::min(until, *kill_at_);
  return until;
}

}  // namespace ringrun::agent
