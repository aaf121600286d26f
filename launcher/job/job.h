// One ringrun job, from its placement (computed once, by the caller: hosts::PlaceRanks) to the
// last rank's exit: starts the job service and the agents, forwards output, forwards signals,
// tears down, and with --max-restarts runs the whole job again after a failure. Its rules
// (first failure, grace, signals, timeouts) live in JobStateMachine (job_state_machine.h), the
// restart rules in restart_policy.h; the registrations in AgentRegistry; the server comes from
// StartJobServer; signals from a SignalForwarder.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "launcher/elastic/membership.h"
#include "launcher/hosts/placement.h"
#include "launcher/job/job_state_machine.h"
#include "launcher/job/output.h"
#include "launcher/job/restart_policy.h"
#include "launcher/job/timeline_file.h"
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

// The starters for one attempt of a job, by its restart count (0 for the first). A starter that
// keeps state for one job (the srun step) is made afresh for each attempt; the caller owns them
// and keeps them until the next call or the end of RunJob.
using StartersForAttempt = std::function<Starters(int restart_count)>;

// Runs the job described by `options` (already validated) with its ranks where `placement`
// puts them (PlaceRanks(options.hosts, options.np)), and returns ringrun's exit code: 0 when
// every rank exited 0; the first failing rank's code (128+signo for a signal); 130/143 after
// SIGINT/SIGTERM; 1 when ringrun itself failed (the reason is printed).
//
// With options.max_restarts > 0, a failed attempt is followed by another on the same hosts
// (restart_policy.h decides and names the line printed). Every attempt is a job of its own: a
// new secret and job id, a new job service on a new port, new agents, so that a straggler of an
// earlier attempt cannot join a later one; each starts only once every agent of the one before
// has ended (the attempt's teardown, then StopAgents). Ranks get the attempt's restart count
// (RINGRUN_RESTART_COUNT, TORCHELASTIC_RESTART_COUNT), the limit (TORCHELASTIC_MAX_RESTARTS), and
// one TORCHELASTIC_RUN_ID for every attempt (the first attempt's job id). --output-filename files
// are appended to by later attempts. The exit code is the last attempt's; a signal to the
// launcher, during an attempt or between two, ends the job without another.
//
// Elastic jobs (options.elastic.enabled, docs/elastic.md): a rank that fails or an agent that
// is lost does not end the job. The membership policy (launcher/elastic/membership.h, without
// refill: no process is started in a running job) blacklists the host of the rank that failed
// first, its other ranks are ended, and the survivors form the next generation through the job
// service's Join (each survivor's ringrun_shutdown and ringrun_init), while at least --min-np
// remain and --reset-limit allows; else the job ends naming them. A rank that exits 0 leaves:
// the others go on without it, no host blamed, no reset counted; that generation is formed
// when a survivor asks to join it, so that ranks that finish one after another form none. One
// line on stderr per new generation. Failures of ranks while a generation formed after a failure is
// still gathering its members are taken as consequences of that failure: their hosts are not
// blacklisted. A lost agent (heartbeat, session, exit) also breaks the generation through the
// job service's Watch (JobService::BreakGeneration), so that survivors stuck on a host that
// closed nothing fail at once instead of at the collective timeout.
//
// With a host discovery script (options.elastic.discovery_script; its first run, by the caller,
// gave options.hosts), the host set changes while the job runs: a thread runs the script every
// --discovery-interval (a failure or a hang is reported once and the job goes on with the last
// hosts), and the policy runs with refill. A generation with new ranks starts them first, each
// host's new ranks under an agent of their own started by the job's starters (a new host index,
// also on a host that has an agent already), and raises the membership epoch
// (JobService::RaiseMembershipEpoch) only once every new rank waits in the Join of that
// generation: the running ranks then leave theirs at their next check of the epoch and join
// it, and their pause is only the re-forming. Ranks of a host that the script dropped leave:
// the generation is formed without them and the epoch raised at once; their agent is ended once
// the new generation has formed. New ranks get new worker ids (RINGRUN_WORKER_ID), the next
// after the highest so far.
//
// Installs handlers for SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGHUP for its duration.
int RunJob(const Options& options, std::vector<hosts::RankPlacement> placement,
           const StartersForAttempt& starters, const JobHooks& hooks = {});
// The same with the same starters for every attempt (those that keep no state between jobs).
int RunJob(const Options& options, std::vector<hosts::RankPlacement> placement,
           const Starters& starters, const JobHooks& hooks = {});

// Which attempt of a job (--max-restarts) a Job is.
struct JobAttempt {
  int restart_count = 0;
  std::string run_id;  // TORCHELASTIC_RUN_ID; empty: this attempt's job id (the first attempt)
  // Of --timeout, what the earlier attempts took.
  std::chrono::milliseconds timeout_used{0};
};

// One attempt of the job behind RunJob. Its main thread (the one that calls Run) owns the state
// machine and the agents' handles; gRPC threads, the signal thread and the remote start threads
// only queue events for it. The caller forwards the launcher's signals to OnSignal: Run
// installs no handler.
class Job final : public service::JobEvents {
 public:
  // `placement` is not empty (PlaceRanks places at least one rank).
  Job(const Options& options, std::vector<hosts::RankPlacement> placement, const Starters& starters,
      const JobHooks& hooks, JobAttempt attempt = {});
  ~Job() override;
  // Runs the job to its end (see RunJob) and returns its exit code. Call once.
  int Run();
  // A signal reached the launcher. Thread-safe; before Run it is handled when Run starts.
  void OnSignal(int signo);
  // After Run: how the attempt ended.
  AttemptOutcome outcome() const;
  // After Run: TORCHELASTIC_RUN_ID as the ranks got it.
  const std::string& run_id() const { return run_id_; }

  // JobEvents, from gRPC threads.
  bool OnRegisterAsync(const v1::RegisterRequest& req, const std::string& peer_address,
                       const RegisterDone& done) override;
  void OnAgentEvent(int host, const v1::AgentEvent& event) override;
  void OnSessionEnded(int host, bool clean, const std::string& why) override;

 private:
  // What the main thread reacts to.
  struct Event {
    enum Kind {
      kAgent,
      kSessionEnded,
      kSignal,
      kStarted,
      kRegistered,
      kGenerationJoined,  // signo: the elastic generation whose members have all joined
      kJoinWaiting,       // signo: a rank asks to join an elastic generation not formed yet
      kDiscovered,        // a run of the discovery script ended: `discovered`
    } kind = kAgent;
    int host = -1;
    v1::AgentEvent agent;
    std::string why;
    int signo = 0;
    std::unique_ptr<starters::AgentHandle>
        handle;  // kStarted: null when the start failed (see why)
    // kRegistered of a host added while the job runs (AgentRegistry::IsLate): the main thread
    // answers it with its ranks.
    service::Registration registration;
    RegisterDone register_done;
    std::optional<Result<elastic::HostSet>> discovered;  // kDiscovered
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
  // Starts the agents of `hosts` (host indexes).
  void StartAgents(const std::vector<int>& hosts);
  Event StartAgent(starters::AgentStarter* starter, int host, starters::AgentLaunch launch) const;
  // What every agent's RegisterReply says but its ranks.
  v1::RegisterReply BaseReply() const;
  // An event that will not be handled: its agent is killed, its registration refused.
  static void Discard(Event& e);
  // The job's host `h` (a copy: the list grows). Thread-safe.
  hosts::HostSpec HostAt(int h) const;

  // Elastic jobs (main thread).
  int PrepareElastic();
  // `failure`, when given, says what happened in place of "exited with code N".
  void ElasticRankExited(int worker, int exit_code, int signo, const std::string& failure = "");
  // The host's ranks are gone with its agent (`why`); true when it had live ranks.
  bool ElasticHostLost(int host, const std::string& why);
  // Tells the agent of `host` to end its ranks (SIGTERM, SIGKILL after the grace period).
  void TerminateAgent(int host, const std::string& reason);
  // The blacklisted host `name`'s live ranks, under each agent it has, are ended; returns their
  // worker ids ("2,3").
  std::string EndHostRanks(const std::string& name);
  // Asks the policy what now, after `cause` (a sentence); `failed`: a failure, not a leave.
  void Reform(const std::string& cause, bool failed, int exit_code);
  // Makes `g` the current generation: the job service's rendezvous serves it from now on. Starts
  // its new ranks; after a change of hosts (not a `failure`), raises the membership epoch once
  // they wait in their Join.
  void FormGeneration(const elastic::Generation& g, const std::string& cause, bool failure);
  int RankOfWorker(int worker) const;
  void Report(const std::string& line);
  // Hosts that come and go (a discovery script).
  void DiscoveryLoop();
  void StopDiscovery();
  void OnDiscovered(Result<elastic::HostSet>& found);
  // A new host index (and agent) for new ranks on the host named `name`.
  int AddHost(const std::string& name);
  // Answers the registration of a late host's agent with the ranks placed on it.
  void AnswerLateRegistration(Event& e);
  // Raises the membership epoch once the new ranks of growth_ wait in their Join.
  void MaybeRaiseEpoch();
  void RaiseEpoch(uint64_t epoch);
  // The policy said wait (kWait) and its deadline passed: ask it again.
  void CheckWait();
  // With a discovery script: a blacklisted host whose cooldown ended is usable again; the policy
  // is asked at once (a generation with ranks there, if it lists the host and below --max-np).
  void CheckCooldowns();
  // Generations that break with no rank lost, and members that never come to a join:
  //  - a rank asks to join a generation that is not formed while no failure is known (its
  //    collective failed on a rank stopped past the collective timeout, or on a link that
  //    dropped and came back): after the heartbeat timeout and 2 s (time for the launcher to
  //    learn of a lost agent or rank first), the next generation is formed with the same ranks
  //    and the running one broken through the Watch, so that every rank comes to the join;
  //  - a member of a forming generation (not one started in the running job: those have their
  //    own deadline) that has not come to its join --start-timeout after another member came to
  //    it failed first: its host is blacklisted. (Members come to a join together, within a
  //    step: after a failure the Watch breaks every rank's collectives, and host updates are
  //    acted on at a commit, which is collective.)
  void CheckStuckJoins();

  // Constant after construction.
  const Options& options_;
  const std::vector<hosts::RankPlacement> placement_;
  const Starters starters_;
  const JobHooks hooks_;
  const JobAttempt attempt_;
  const Clock& clock_;

  // The job's hosts by index: options_.hosts, then those added while the job runs (AddHost;
  // main thread). Read by gRPC threads too (HostAt).
  mutable Mutex hosts_mu_;
  std::vector<hosts::HostSpec> hosts_ GUARDED_BY(hosts_mu_);

  // Set up in Run() before any other thread starts; then constant.
  std::vector<int> active_hosts_;
  std::string secret_, job_id_, run_id_, agent_path_, cwd_;
  int port_ = 0;
  std::unique_ptr<service::AgentRegistry> registry_;
  std::unique_ptr<service::Rendezvous> rendezvous_;
  std::unique_ptr<service::JobService> service_;
  std::unique_ptr<OutputRouter> output_;
  std::unique_ptr<TimelineFile> timeline_;  // null without a timeline file

  // The events for the main thread, from every thread.
  Mutex queue_mu_;
  CondVar queue_cv_;  // queue_ grew
  std::deque<Event> queue_ GUARDED_BY(queue_mu_);

  // Main thread only.
  std::unique_ptr<JobStateMachine> state_;
  std::map<int, std::unique_ptr<starters::AgentHandle>> agents_;  // by host index
  std::vector<std::thread> start_threads_;  // remote Start() calls; joined before Run returns

  // Elastic jobs, main thread only. A worker is one process of the job, by its rank in the
  // first generation (RINGRUN_WORKER_ID, the tag of its output).
  struct Worker {
    int host = -1;
    bool alive = true;
    bool joined = false;  // a member of a generation that every member joined
    // A worker started in a running job: its place in the generation it was started for (the
    // RINGRUN_RANK... values it starts with; its Join reply has the current ones), and that
    // generation's size. 0 for the workers of the first generation.
    hosts::RankPlacement placement;
    int size = 0;
  };
  std::vector<Worker> workers_;
  std::unique_ptr<elastic::MembershipPolicy> policy_;
  std::vector<int> generation_workers_;  // the current generation: worker id by rank
  uint32_t generation_ = 0;
  bool pending_after_failure_ = false;  // formed after a failure, not yet joined by all
  // Ranks that exited 0 since the current generation formed, as the reset line names them; the
  // generation without them is formed when a survivor asks for it (or with a failure), so that
  // ranks finishing one after another form none.
  std::string leaves_;
  uint32_t join_waiting_ = 0;         // the newest generation a held Join waits for
  bool generation_complete_ = false;  // every member of the current generation joined it
  // Whether a survivor waits for a generation that the ranks that left make impossible.
  bool JoinBlockedByLeaves() const;

  // Hosts that come and go (a discovery script): the last hosts it listed, whether its last
  // run failed (reported once until a run succeeds), the wait the policy asked for, the epoch
  // raised so far and the last one planned, the new ranks a raise waits for, and the agents to
  // end once a generation has formed (a host the script dropped).
  elastic::HostSet discovered_;
  bool discovery_failing_ = false;
  std::optional<Clock::TimePoint> wait_until_;
  uint64_t epoch_raised_ = 0;
  uint64_t epoch_planned_ = 0;
  struct Growth {
    uint64_t epoch = 0;
    std::vector<int> newcomers;  // worker ids
    // When newcomers that have not reached their Join by then count as failed (--start-timeout):
    // one that hangs in its imports would otherwise hold the growth, and the next generation
    // that includes it, for ever.
    Clock::TimePoint deadline;
  };
  std::optional<Growth> growth_;
  // When a member of generation_ was first seen waiting in its join (CheckStuckJoins).
  std::optional<Clock::TimePoint> first_waiting_at_;
  std::optional<Clock::TimePoint> unexplained_since_;  // a join for an unformed generation
  // A member of the generation that the ranks run in (the last one every member joined) is
  // gone: they leave it without being told.
  bool running_broken_ = false;
  std::vector<std::pair<uint32_t, int>> leaving_agents_;  // generation, host index
  // The discovery thread (DiscoveryLoop): started by Run, stopped before the agents.
  std::thread discovery_thread_;
  Mutex discovery_mu_;
  CondVar discovery_cv_;  // discovery_stop_ set
  bool discovery_stop_ GUARDED_BY(discovery_mu_) = false;
};

}  // namespace ringrun::launcher::job
