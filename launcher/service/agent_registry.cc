#include "launcher/service/agent_registry.h"

#include <algorithm>

namespace ringrun::launcher::service {

AgentRegistry::AgentRegistry(std::vector<int> hosts, Clock::TimePoint deadline, SpecBuilder build)
    : hosts_(std::move(hosts)), deadline_(deadline), build_(std::move(build)) {}

AgentRegistry::~AgentRegistry() {
  Close();
  grpc::Alarm* alarm;
  {
    MutexLock lock(&mu_);
    alarm = alarm_.get();
  }
  if (alarm == nullptr) return;
  alarm->Cancel();  // not under mu_: the callback takes it
  MutexLock lock(&mu_);
  while (!alarm_done_) cv_.Wait(&mu_);
}

std::vector<std::function<void()>> AgentRegistry::ReleaseLocked(grpc::Status status) {
  std::vector<std::function<void()>> calls;
  for (auto& [host, done] : waiting_) {
    std::vector<v1::RankSpec> ranks;
    if (status.ok()) ranks = specs_[host];
    calls.push_back([done = std::move(done), status, ranks = std::move(ranks)]() mutable {
      done(status, std::move(ranks));
    });
  }
  waiting_.clear();
  return calls;
}

void AgentRegistry::WhenRanks(int host, RanksDone done) {
  grpc::Status now;
  std::vector<v1::RankSpec> ranks;
  grpc::Alarm* arm = nullptr;  // set outside mu_: a deadline just past may fire at once
  bool waits = false;
  {
    MutexLock lock(&mu_);
    if (specs_ready_) {
      ranks = specs_[host];
    } else if (closed_) {
      now = grpc::Status(grpc::StatusCode::ABORTED, "the job was aborted");
    } else if (std::chrono::steady_clock::now() >= deadline_) {
      now = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                         "not every agent registered within the start timeout");
    } else {
      waiting_.emplace_back(host, std::move(done));
      waits = true;
      if (alarm_ == nullptr) {
        alarm_ = std::make_unique<grpc::Alarm>();
        arm = alarm_.get();
      }
    }
  }
  if (arm != nullptr) {
    // grpc::Alarm takes a system_clock deadline.
    const auto at =
        std::chrono::system_clock::now() + (deadline_ - std::chrono::steady_clock::now());
    arm->Set(at, [this](bool) {
      std::vector<std::function<void()>> calls;
      {
        MutexLock lock(&mu_);
        calls = ReleaseLocked(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                           "not every agent registered within the start timeout"));
      }
      for (auto& call : calls) call();
      MutexLock lock(&mu_);
      alarm_done_ = true;
      cv_.SignalAll();
    });
  }
  if (!waits) done(now, std::move(ranks));
}

grpc::Status AgentRegistry::Add(int host, Registration registration) {
  std::vector<std::function<void()>> calls;
  {
    MutexLock lock(&mu_);
    const bool late = late_.count(host) > 0;
    if (!late && std::find(hosts_.begin(), hosts_.end(), host) == hosts_.end()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "host index " + std::to_string(host) + " has no ranks in this job");
    }
    if (registered_.count(host)) {
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "host already registered");
    }
    if (closed_) return grpc::Status(grpc::StatusCode::ABORTED, "the job was aborted");
    registered_[host] = std::move(registration);
    const bool all =
        std::all_of(hosts_.begin(), hosts_.end(), [&](int h) { return registered_.count(h) > 0; });
    if (!late && all) {
      specs_ = build_(registered_);
      specs_ready_ = true;
      cv_.SignalAll();
      calls = ReleaseLocked(grpc::Status::OK);
    }
  }
  for (auto& call : calls) call();
  return grpc::Status::OK;
}

grpc::Status AgentRegistry::WaitForRanks(int host, std::vector<v1::RankSpec>* ranks) {
  MutexLock lock(&mu_);
  while (!specs_ready_ && !closed_) {
    if (!cv_.WaitUntil(&mu_, deadline_) && !specs_ready_ && !closed_) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "not every agent registered within the start timeout");
    }
  }
  if (!specs_ready_) return grpc::Status(grpc::StatusCode::ABORTED, "the job was aborted");
  *ranks = specs_[host];
  return grpc::Status::OK;
}

std::vector<int> AgentRegistry::Close() {
  std::vector<std::function<void()>> calls;
  std::vector<int> out;
  {
    MutexLock lock(&mu_);
    closed_ = true;
    cv_.SignalAll();
    if (!specs_ready_) {
      calls = ReleaseLocked(grpc::Status(grpc::StatusCode::ABORTED, "the job was aborted"));
    }
    for (const auto& [host, registration] : registered_) out.push_back(host);
  }
  for (auto& call : calls) call();
  return out;
}

void AgentRegistry::AddLateHost(int host) {
  MutexLock lock(&mu_);
  late_.insert(host);
}

bool AgentRegistry::IsLate(int host) const {
  MutexLock lock(&mu_);
  return late_.count(host) > 0;
}

std::map<int, Registration> AgentRegistry::Registrations() const {
  MutexLock lock(&mu_);
  return registered_;
}

}  // namespace ringrun::launcher::service
