#include "launcher/service/agent_registry.h"

#include <algorithm>

namespace ringrun::launcher::service {

AgentRegistry::AgentRegistry(std::vector<int> hosts, Clock::TimePoint deadline, SpecBuilder build)
    : hosts_(std::move(hosts)), deadline_(deadline), build_(std::move(build)) {}

grpc::Status AgentRegistry::Add(int host, Registration registration) {
  MutexLock lock(&mu_);
  if (std::find(hosts_.begin(), hosts_.end(), host) == hosts_.end()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "host index " + std::to_string(host) + " has no ranks in this job");
  }
  if (registered_.count(host)) {
    return grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "host already registered");
  }
  if (closed_) return grpc::Status(grpc::StatusCode::ABORTED, "the job was aborted");
  registered_[host] = std::move(registration);
  if (registered_.size() == hosts_.size()) {
    specs_ = build_(registered_);
    specs_ready_ = true;
    cv_.SignalAll();
  }
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
  MutexLock lock(&mu_);
  closed_ = true;
  cv_.SignalAll();
  std::vector<int> out;
  for (const auto& [host, registration] : registered_) out.push_back(host);
  return out;
}

}  // namespace ringrun::launcher::service
