// Fake agents for tests and benchmarks of the launcher at scale: each speaks the real protocol
// of ringrun-agent (Register, then a Session: Hello, every rank's RankStarted and one line of
// output, heartbeats in answer to the service's pings, RankExited) over loopback gRPC, as
// callback calls, so that a thousand of them cost a few threads and no processes. They spawn
// nothing: a rank "runs" until the script ends it or the launcher terminates it.
//
// FakeAgentStarter is the AgentStarter seam's fake over them: Start() starts a fake agent for
// the host and returns at once.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "launcher/starters/agent_starter.h"
#include "ringrun/common/thread_annotations.h"
#include "ringrun/job.grpc.pb.h"

namespace ringrun::launcher::starters {

// What the fake ranks do.
struct FakeAgentScript {
  // Each rank prints one line and exits 0 once all its host's ranks have started.
  bool ranks_exit = true;
  // The ranks of this host exit with `fail_code` (instead of running or exiting 0).
  int fail_host = -1;
  int fail_code = 3;
  // These hosts never answer a ping: their Sessions fall silent.
  std::vector<int> silent_hosts;
  // Agents per gRPC channel (one TCP connection): 1 is the truth (one connection per agent).
  int agents_per_channel = 1;
  // The address the agents dial the job service at: a non-loopback address of this machine
  // makes them look remote, as real agents on other hosts do.
  std::string service_address = "127.0.0.1";
};

// How one fake agent ended.
struct FakeAgentResult {
  grpc::Status register_status;  // Register's outcome
  grpc::Status session_status;   // the Session's final status (OK when never opened)
  int ranks = 0;                 // ranks the launcher gave it
  bool terminated = false;       // the launcher sent Terminate
  int pings = 0;                 // pings received
};

class FakeAgents {
 public:
  // `on_ended`, if set, is called (from a gRPC thread) as each agent ends.
  using OnEnded = std::function<void(int host, const FakeAgentResult& result)>;
  explicit FakeAgents(FakeAgentScript script, OnEnded on_ended = nullptr);
  // Cancels the calls of the agents still running and waits for them to end.
  ~FakeAgents();
  FakeAgents(const FakeAgents&) = delete;
  FakeAgents& operator=(const FakeAgents&) = delete;

  // Starts the agent of `host_index` against the job service on the script's address and
  // `port`: it registers
  // with `secret`, then holds its Session. Returns at once. Thread-safe.
  void Start(int host_index, int port, const std::string& secret);
  // Waits until `count` agents have ended, or `timeout_ms` passed; returns whether they had.
  bool WaitEnded(int count, int timeout_ms);
  // The agents that have ended, by host index. Thread-safe.
  std::map<int, FakeAgentResult> ended() const;
  // The agents whose Session is open now. Thread-safe.
  int sessions_open() const;

 private:
  class Agent;
  void Ended(int host, FakeAgentResult result);
  v1::JobService::Stub* StubFor(int port) REQUIRES(mu_);

  // Constant after construction.
  const FakeAgentScript script_;
  const OnEnded on_ended_;

  mutable Mutex mu_;
  CondVar cv_;                                                                // an agent ended
  std::vector<std::unique_ptr<v1::JobService::Stub>> stubs_ GUARDED_BY(mu_);  // the last is
                                                                              // not yet full
  std::vector<std::unique_ptr<Agent>> agents_ GUARDED_BY(mu_);
  std::map<int, FakeAgentResult> ended_ GUARDED_BY(mu_);
  int sessions_open_ GUARDED_BY(mu_) = 0;
  friend class Agent;
};

// Starts a fake agent in `agents` (which must outlive it) for each host; its handles report
// the agent as running until it has ended (exit 0; 1 when its Session failed).
std::unique_ptr<AgentStarter> MakeFakeAgentStarter(FakeAgents* agents);

// As above, for agents in another process: writes "HOST_INDEX PORT SECRET\n" to `launch_fd`
// for each start; the other process writes "HOST_INDEX EXIT_CODE\n" to `ended_fd` (made
// non-blocking here) as each agent ends, which its handle's Poll() then reports. The handles
// must be polled from one thread at a time (the job's).
std::unique_ptr<AgentStarter> MakePipeAgentStarter(int launch_fd, int ended_fd);

// The threads of this process now (/proc/self/task): what tests and benchmarks of many agents
// assert does not grow with them.
int ProcessThreadCount();

}  // namespace ringrun::launcher::starters
