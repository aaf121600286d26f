// The agents' registrations with the job service, and the one place that owns them. Add() and
// WhenRanks() run on gRPC threads; Close() on the job's thread. Once every host of the job has
// registered, the spec builder turns the registrations into each host's ranks, and every waiting
// agent gets its own: 1,000 waiting agents are 1,000 callbacks, not threads. Thread-safe.
#pragma once

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ringrun/common/clock.h"
#include "ringrun/common/thread_annotations.h"
#include "ringrun/job.pb.h"

namespace ringrun::launcher::service {

struct Registration {
  std::string hostname;        // the agent's gethostname()
  std::string peer_address;    // the address the service saw it connect from
  std::string service_target;  // the host:port it dialled to reach the service
  int free_port = 0;           // a port that was free on its host (MASTER_PORT)
  std::string data_address;    // from --network-interfaces; empty: use peer_address
};

class AgentRegistry {
 public:
  // Every host's ranks, from every host's registration. Called once, under the registry's lock.
  using SpecBuilder =
      std::function<std::map<int, std::vector<v1::RankSpec>>(const std::map<int, Registration>&)>;

  // `hosts`: the host indexes that have ranks; `deadline` (steady_clock): when waiting agents
  // give up.
  AgentRegistry(std::vector<int> hosts, Clock::TimePoint deadline, SpecBuilder build);
  // Releases the WhenRanks callers still waiting (ABORTED) and waits for its deadline timer.
  ~AgentRegistry();
  AgentRegistry(const AgentRegistry&) = delete;
  AgentRegistry& operator=(const AgentRegistry&) = delete;

  // Records `host`'s registration. INVALID_ARGUMENT for a host without ranks, ALREADY_EXISTS
  // for a second registration, ABORTED once the registry is closed.
  grpc::Status Add(int host, Registration registration);
  // Waits until every host has registered and returns `host`'s ranks; DEADLINE_EXCEEDED at the
  // deadline, ABORTED when the registry is closed first.
  grpc::Status WaitForRanks(int host, std::vector<v1::RankSpec>* ranks);
  using RanksDone = std::function<void(grpc::Status, std::vector<v1::RankSpec>)>;
  // WaitForRanks without the wait: calls `done` once with what WaitForRanks would return, on
  // the thread that decides it (the last Add, Close, or a gRPC timer thread at the deadline),
  // possibly before returning; never under the registry's lock.
  void WhenRanks(int host, RanksDone done);

  // Refuses registrations from now on and releases the waiting agents (with their ranks if
  // every host had registered). Returns the hosts that registered. Idempotent.
  std::vector<int> Close();

  // Elastic jobs whose hosts grow: `host` (a new host index) may register from now on. A late
  // host is not waited for, and gets no ranks from WhenRanks: the job answers its registration
  // itself (IsLate), since its ranks are made while the job runs.
  void AddLateHost(int host);
  bool IsLate(int host) const;
  // Every registration so far (the job builds a late host's ranks from them).
  std::map<int, Registration> Registrations() const;

 private:
  // Constant after construction.
  const std::vector<int> hosts_;
  const Clock::TimePoint deadline_;
  const SpecBuilder build_;

  mutable Mutex mu_;
  CondVar cv_;                          // specs_ready_ or closed_ set
  std::set<int> late_ GUARDED_BY(mu_);  // AddLateHost
  std::map<int, Registration> registered_ GUARDED_BY(mu_);
  std::map<int, std::vector<v1::RankSpec>> specs_ GUARDED_BY(mu_);
  bool specs_ready_ GUARDED_BY(mu_) = false;
  bool closed_ GUARDED_BY(mu_) = false;
  std::vector<std::pair<int, RanksDone>> waiting_ GUARDED_BY(mu_);  // WhenRanks callers
  // The deadline for waiting_, made and armed by the first WhenRanks that waits (not before:
  // a grpc::Alarm starts gRPC, and with it threads that would take the job's signals); its
  // callback has run once alarm_done_ is set.
  std::unique_ptr<grpc::Alarm> alarm_ GUARDED_BY(mu_);
  bool alarm_done_ GUARDED_BY(mu_) = false;

  // Takes the waiting callers with the answer they get now (under mu_); call them without it.
  std::vector<std::function<void()>> ReleaseLocked(grpc::Status status) REQUIRES(mu_);
};

}  // namespace ringrun::launcher::service
