// One ringrun job, from its placement (computed once, by the caller: hosts::PlaceRanks) to the
// last rank's exit: starts the job service and the agents, forwards output, forwards signals,
// tears down. Its rules (first failure, grace,
// signals, timeouts) live in JobStateMachine (job_state_machine.h); the registrations in
// AgentRegistry; the server comes from StartJobServer; signals from a SignalForwarder.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "launcher/hosts/placement.h"
#include "launcher/job/job_state_machine.h"
#include "launcher/job/output.h"
#include "launcher/options.h"
#include "launcher/service/agent_registry.h"
#include "launcher/service/job_service.h"
#include "launcher/service/rendezvous.h"
#include "launcher/starters/agent_starter.h"
#include "ringrun/common/thread_annotations.h"

namespace ringrun::launcher::job {

// Optional hooks for programs that run a job for their own purposes (--check-gpu).
struct JobHooks {
  // Every output line of every rank (without its '\n'), as it arrives. Called from one thread.
  std::function<void(int rank, bool is_stderr, std::string_view line)> on_line;
  // Print lines to the console with [rank]<stream>: tags (the default for user jobs).
  bool echo_to_console = true;
};

// The starters the job uses: `local` for hosts that are this machine, `remote` for the rest
// (nullptr: remote hosts are an error).
struct Starters {
  starters::AgentStarter* local = nullptr;
  starters::AgentStarter* remote = nullptr;
};

// Runs the job described by `options` (already validated) with its ranks where `placement`
// puts them (PlaceRanks(options.hosts, options.np)), and returns ringrun's exit code: 0 when
// every rank exited 0; the first failing rank's code (128+signo for a signal); 130/143 after
// SIGINT/SIGTERM; 1 when ringrun itself failed (the reason is printed). Installs handlers for
// SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGHUP for its duration.
int RunJob(const Options& options, std::vector<hosts::RankPlacement> placement,
           const Starters& starters, const JobHooks& hooks = {});

// The job behind RunJob. Its main thread (the one that calls Run) owns the state machine and the
// agents' handles; gRPC threads, the signal thread and the remote start threads only queue
// events for it.
class Job final : public service::JobEvents {
 public:
  // `placement` is not empty (PlaceRanks places at least one rank).
  Job(const Options& options, std::vector<hosts::RankPlacement> placement, const Starters& starters,
      const JobHooks& hooks);
  ~Job() override;
  // Runs the job to its end (see RunJob). Call once.
  int Run();

  // JobEvents, from gRPC threads.
  bool OnRegisterAsync(const v1::RegisterRequest& req, const std::string& peer_address,
                       const RegisterDone& done) override;
  void OnAgentEvent(int host, const v1::AgentEvent& event) override;
  void OnSessionEnded(int host, bool clean, const std::string& why) override;

 private:
  // What the main thread reacts to.
  struct Event {
    enum Kind { kAgent, kSessionEnded, kSignal, kStarted, kRegistered } kind = kAgent;
    int host = -1;
    v1::AgentEvent agent;
    std::string why;
    int signo = 0;
    std::unique_ptr<starters::AgentHandle>
        handle;  // kStarted: null when the start failed (see why)
  };

  void Push(Event e);
  int Prepare();
  int Loop();
  void CloseService();
  void StopAgents();
  void Handle(Event& e);
  // Handles every event queued so far.
  void HandleQueued();
  void HandleAgentEvent(int host, const v1::AgentEvent& ev);
  void PollAgents();
  // Carries out the state machine's commands until it has none.
  void Execute();
  std::map<int, std::vector<v1::RankSpec>> BuildSpecs(
      const std::map<int, service::Registration>& registered) const;
  std::string AddressOf(int host, const std::map<int, service::Registration>& registered) const;
  void StartAgents();
  Event StartAgent(starters::AgentStarter* starter, int host, starters::AgentLaunch launch) const;

  // Constant after construction.
  const Options& options_;
  const std::vector<hosts::RankPlacement> placement_;
  const Starters starters_;
  const JobHooks hooks_;
  const Clock& clock_;

  // Set up in Run() before any other thread starts; then constant.
  std::vector<int> active_hosts_;
  std::string secret_, job_id_, agent_path_, cwd_;
  int port_ = 0;
  std::unique_ptr<service::AgentRegistry> registry_;
  std::unique_ptr<service::Rendezvous> rendezvous_;
  std::unique_ptr<service::JobService> service_;
  std::unique_ptr<OutputRouter> output_;

  // The events for the main thread, from every thread.
  Mutex queue_mu_;
  CondVar queue_cv_;  // queue_ grew
  std::deque<Event> queue_ GUARDED_BY(queue_mu_);

  // Main thread only.
  std::unique_ptr<JobStateMachine> state_;
  std::map<int, std::unique_ptr<starters::AgentHandle>> agents_;  // by host index
  std::vector<std::thread> start_threads_;  // remote Start() calls; joined before Run returns
};

}  // namespace ringrun::launcher::job
