#include "launcher/job/job_state_machine.h"

#include <signal.h>
#include <string.h>

#include <utility>

namespace ringrun::launcher::job {
namespace {

using std::chrono::milliseconds;

std::string SignalName(int signo) {
  const char* abbrev = ::sigabbrev_np(signo);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signo);
}

void AppendPart(std::string* list, const std::string& part) {
  *list += (list->empty() ? "" : "; ") + part;
}

}  // namespace

JobStateMachine::JobStateMachine(JobPlan plan, const Clock& clock)
    : plan_(std::move(plan)),
      clock_(clock),
      start_deadline_(clock.Now() + std::chrono::seconds(plan_.start_timeout_s)),
      job_deadline_(clock.Now() + std::chrono::seconds(plan_.timeout_s) - plan_.timeout_used),
      hosts_(plan_.hosts.size()),
      ranks_(plan_.rank_hosts.size()) {
  for (size_t r = 0; r < plan_.rank_hosts.size(); ++r) {
    ranks_[r].host = plan_.rank_hosts[r];
    hosts_.at(ranks_[r].host).ranks.push_back(static_cast<int>(r));
  }
  for (auto& h : hosts_) h.finished = h.ranks.empty();
}

JobStateMachine::Host* JobStateMachine::FindHost(int host) {
  if (host < 0 || host >= static_cast<int>(hosts_.size()) || hosts_[host].ranks.empty()) {
    return nullptr;
  }
  return &hosts_[host];
}

std::vector<int> JobStateMachine::UnfinishedHosts() const {
  std::vector<int> out;
  for (size_t h = 0; h < hosts_.size(); ++h) {
    if (!hosts_[h].finished) out.push_back(static_cast<int>(h));
  }
  return out;
}

void JobStateMachine::Emit(JobCommand::Kind kind, int signo, int grace_ms, std::string text) {
  JobCommand c;
  c.kind = kind;
  if (kind == JobCommand::Kind::kSignalRanks || kind == JobCommand::Kind::kTerminateRanks) {
    c.hosts = UnfinishedHosts();
  }
  c.signo = signo;
  c.grace_ms = grace_ms;
  c.text = std::move(text);
  commands_.push_back(std::move(c));
}

void JobStateMachine::KillAgent(int host, std::string warning) {
  JobCommand c;
  c.kind = JobCommand::Kind::kKillAgent;
  c.host = host;
  c.text = std::move(warning);
  commands_.push_back(std::move(c));
}

std::vector<JobCommand> JobStateMachine::TakeCommands() { return std::exchange(commands_, {}); }

void JobStateMachine::Fail(JobFailure::Cause cause, int exit_code, std::string what,
                           const std::string& detail) {
  if (failure_) return;
  Emit(JobCommand::Kind::kReport, 0, 0, what + detail);
  failure_ = JobFailure{cause, exit_code, std::move(what)};
  BeginTeardown(plan_.grace_ms);
}

void JobStateMachine::CloseRegistration() {
  if (registration_closing_) return;
  registration_closing_ = true;
  Emit(JobCommand::Kind::kCloseRegistration);
}

void JobStateMachine::BeginTeardown(int grace_ms) {
  CloseRegistration();
  Emit(JobCommand::Kind::kAbortRendezvous);
  Emit(JobCommand::Kind::kTerminateRanks, 0, grace_ms, "job teardown");
  tearing_down_ = true;
  auto abandon = clock_.Now() + milliseconds(grace_ms + kAbandonAfterGraceMs);
  if (!abandon_at_ || abandon < *abandon_at_) abandon_at_ = abandon;
}

void JobStateMachine::RegistrationClosed(const std::vector<int>& registered) {
  registration_closed_ = true;
  for (int h : registered) {
    if (Host* hs = FindHost(h)) hs->registered = true;
  }
  // Hosts whose agent never registered cannot be told: end them now.
  for (size_t h = 0; h < hosts_.size(); ++h) {
    Host& hs = hosts_[h];
    if (hs.registered || hs.finished) continue;
    if (hs.has_agent) KillAgent(static_cast<int>(h));
    if (hs.start_done) hs.finished = true;
  }
}

void JobStateMachine::AgentStarted(int host, bool ok, const std::string& why) {
  Host* hs = FindHost(host);
  if (hs == nullptr) return;
  hs->start_done = true;
  if (!ok) {
    hs->finished = true;
    if (plan_.elastic && hs->late) return;  // the job's policy deals with its ranks
    Fail(JobFailure::Cause::kAgentStart, 1,
         "could not start the agent on host " + plan_.hosts[host].Display() + ": " + why);
    return;
  }
  hs->has_agent = true;
  if (registration_closed_ && !hs->registered) {
    // Too late to register: the job is ending.
    KillAgent(host);
    hs->finished = true;
  }
}

void JobStateMachine::AgentRegistered(int host) {
  if (Host* hs = FindHost(host)) hs->registered = true;
}

void JobStateMachine::RankStarted(int rank) {
  if (rank >= 0 && rank < static_cast<int>(ranks_.size())) ranks_[rank].started = true;
}

void JobStateMachine::RankExited(int rank, int exit_code, int signo,
                                 const std::string& stderr_tail) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return;
  ranks_[rank].exited = true;
  ranks_[rank].started = true;
  if ((exit_code == 0 && signo == 0) || stopping()) return;
  std::string what =
      signo ? "was killed by " + SignalName(signo) + " (signal " + std::to_string(signo) + ")"
            : "exited with code " + std::to_string(exit_code);
  std::string tail;
  if (!stderr_tail.empty()) {
    tail = "; the last lines of its stderr:";
    for (size_t start = 0;;) {  // one line each, as LineTail::Text joins them
      size_t nl = stderr_tail.find('\n', start);
      tail += "\n  " + stderr_tail.substr(start, nl - start);
      if (nl == std::string::npos) break;
      start = nl + 1;
    }
  }
  Fail(JobFailure::Cause::kRank, signo ? 128 + signo : exit_code,
       "rank " + std::to_string(rank) + " on host " + plan_.hosts[ranks_[rank].host].name + " " +
           what,
       tail);
}

void JobStateMachine::RankGone(int rank) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return;
  ranks_[rank].exited = true;
  ranks_[rank].started = true;
}

int JobStateMachine::AddHost(const hosts::HostSpec& host) {
  plan_.hosts.push_back(host);
  hosts_.emplace_back();
  hosts_.back().late = true;
  hosts_.back().finished = true;  // until it has a rank
  if (registration_closing_) hosts_.back().start_done = true;
  return static_cast<int>(hosts_.size()) - 1;
}

void JobStateMachine::AddRank(int rank, int host) {
  if (host < 0 || host >= static_cast<int>(hosts_.size()) || rank < 0) return;
  if (rank >= static_cast<int>(ranks_.size())) ranks_.resize(static_cast<size_t>(rank) + 1);
  if (plan_.rank_hosts.size() < ranks_.size()) plan_.rank_hosts.resize(ranks_.size(), -1);
  ranks_[rank].host = host;
  plan_.rank_hosts[rank] = host;
  hosts_[host].ranks.push_back(rank);
  if (!registration_closing_) hosts_[host].finished = false;
}

void JobStateMachine::EndJob(int exit_code, std::string what) {
  Fail(JobFailure::Cause::kRank, exit_code, std::move(what));
}

void JobStateMachine::RankSpawnFailed(int rank, int exit_code, const std::string& message) {
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return;
  ranks_[rank].exited = true;
  ranks_[rank].started = true;
  if (stopping()) return;
  Fail(JobFailure::Cause::kRankStart, exit_code ? exit_code : 127,
       "rank " + std::to_string(rank) + " on host " + plan_.hosts[ranks_[rank].host].name +
           " could not start: " + message);
}

void JobStateMachine::SessionEnded(int host, const std::string& why) {
  Host* hs = FindHost(host);
  if (hs == nullptr) return;
  hs->session_ended = true;
  std::string missing;
  for (int r : hs->ranks) {
    if (!ranks_[r].exited) missing += (missing.empty() ? "" : ",") + std::to_string(r);
  }
  hs->finished = true;
  if (missing.empty() || stopping()) return;
  Fail(JobFailure::Cause::kAgentLost, 1,
       "lost the agent on host " + plan_.hosts[host].name + ": " +
           (why.empty() ? "the agent closed its session early" : why) + " (ranks " + missing +
           " were still running)");
}

void JobStateMachine::AgentExited(int host, int exit_code, const std::string& stderr_tail) {
  Host* hs = FindHost(host);
  if (hs == nullptr || hs->finished) return;
  hs->finished = true;
  if (hs->session_ended || stopping()) return;
  if (plan_.elastic && (hs->registered || hs->late)) {
    bool all_gone = true;
    for (int r : hs->ranks) all_gone = all_gone && ranks_[r].exited;
    if (all_gone) return;
  }
  const std::string name = plan_.hosts[host].Display();
  const std::string tail = stderr_tail.empty() ? "" : ": " + stderr_tail;
  if (exit_code == 127 && !hs->registered) {
    Fail(JobFailure::Cause::kAgentStart, 1,
         "ringrun-agent not found at " + plan_.agent_path + " on host " + name, tail);
  } else {
    Fail(hs->registered ? JobFailure::Cause::kAgentLost : JobFailure::Cause::kAgentStart, 1,
         "the agent on host " + name + " exited with code " + std::to_string(exit_code) +
             (hs->registered ? "" : " before registering"),
         tail);
  }
}

void JobStateMachine::SignalReceived(int signo) {
  if (signo == SIGUSR1 || signo == SIGUSR2) {
    Emit(JobCommand::Kind::kSignalRanks, signo);
    return;
  }
  if (stopping()) {
    Emit(JobCommand::Kind::kReport, 0, 0, SignalName(signo) + " again: killing every rank now");
    if (!interrupted_) interrupted_ = signo;
    BeginTeardown(0);
    return;
  }
  interrupted_ = signo;
  Emit(JobCommand::Kind::kReport, 0, 0,
       SignalName(signo) + " received: forwarding it to every rank (SIGKILL in " +
           std::to_string(plan_.grace_ms) + " ms; send it again to kill at once)");
  Emit(JobCommand::Kind::kSignalRanks, signo == SIGHUP ? SIGTERM : signo);
  CloseRegistration();
  kill_at_ = clock_.Now() + milliseconds(plan_.grace_ms);
  abandon_at_ = clock_.Now() + milliseconds(plan_.grace_ms + kAbandonAfterGraceMs);
}

void JobStateMachine::Tick() {
  const auto now = clock_.Now();
  if (!start_timeout_checked_ && now >= start_deadline_) {
    start_timeout_checked_ = true;
    std::string missing;
    for (size_t h = 0; h < hosts_.size() && !stopping(); ++h) {
      const Host& hs = hosts_[h];
      if (hs.ranks.empty() || hs.late) continue;  // late hosts: the job's policy decides
      if (!hs.registered) {
        AppendPart(&missing, "the agent on host " + plan_.hosts[h].Display() + " did not register");
        continue;
      }
      for (int r : hs.ranks) {
        if (!ranks_[r].started) {
          AppendPart(&missing, "rank " + std::to_string(r) + " on host " + plan_.hosts[h].name +
                                   " did not start");
        }
      }
    }
    if (!missing.empty()) {
      Fail(JobFailure::Cause::kStartTimeout, 1,
           "start timeout (" + std::to_string(plan_.start_timeout_s) + " s): " + missing);
    }
  }
  if (plan_.timeout_s > 0 && now >= job_deadline_ && !stopping()) {
    Fail(JobFailure::Cause::kTimeout, kTimeoutExitCode,
         "--timeout " + std::to_string(plan_.timeout_s) + ": the job ran longer than " +
             std::to_string(plan_.timeout_s) + " s; ending its ranks (exit " +
             std::to_string(kTimeoutExitCode) + ")");
  }
  if (kill_at_ && now >= *kill_at_) {
    kill_at_.reset();
    Emit(JobCommand::Kind::kTerminateRanks, 0, 0, "grace period over");
    tearing_down_ = true;
  }
  if (abandon_at_ && now >= *abandon_at_) {
    abandon_at_.reset();
    for (int h : UnfinishedHosts()) {
      KillAgent(h,
                "host " + plan_.hosts[h].name + ": the agent did not finish in time; killing it");
      hosts_[h].finished = true;
    }
  }
}

bool JobStateMachine::done() const { return UnfinishedHosts().empty(); }

bool JobStateMachine::finished(int host) const {
  return host < 0 || host >= static_cast<int>(hosts_.size()) || hosts_[host].finished;
}

int JobStateMachine::exit_code() const {
  if (interrupted_) return interrupted_ == SIGINT ? 130 : 128 + interrupted_;
  return failure_ ? failure_->exit_code : 0;
}

}  // namespace ringrun::launcher::job
