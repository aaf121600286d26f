#include "launcher/job/job.h"

#include <limits.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "launcher/job/environment.h"
#include "launcher/job/signal_forwarder.h"
#include "launcher/service/job_server.h"
#include "ringrun/common/defaults.h"
#include "ringrun/common/interfaces.h"
#include "ringrun/common/log.h"
#include "ringrun/common/secret.h"

extern char** environ;

namespace ringrun::launcher::job {
namespace {

using std::chrono::milliseconds;

constexpr int kTickMs = 50;             // how often the job polls agents and checks deadlines
constexpr int kShutdownGraceMs = 1000;  // for the server's calls, then for the agents to exit

std::string DefaultAgentPath() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "ringrun-agent";
  std::string self(buf, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/') + 1) + "ringrun-agent";
}

std::string CurrentDir() {
  char buf[PATH_MAX];
  return ::getcwd(buf, sizeof(buf)) ? std::string(buf) : std::string(".");
}

// The launcher's signals, to the attempt that runs (RunJob): the signal thread calls OnSignal,
// the main thread SetRunning.
class SignalRouter {
 public:
  void OnSignal(int signo) {
    MutexLock lock(&mu_);
    if (interrupted_ == 0 && signo != SIGUSR1 && signo != SIGUSR2) interrupted_ = signo;
    if (running_ != nullptr) running_->OnSignal(signo);
  }
  // Routes signals to `job` from now on (nullptr: none). Returns false, and routes none, when a
  // terminating signal has arrived: the job is over.
  bool SetRunning(Job* job) {
    MutexLock lock(&mu_);
    running_ = interrupted_ == 0 ? job : nullptr;
    return job == nullptr || running_ != nullptr;
  }
  // The first SIGINT, SIGTERM or SIGHUP; 0 while none has arrived.
  int interrupted() {
    MutexLock lock(&mu_);
    return interrupted_;
  }

 private:
  Mutex mu_;
  Job* running_ GUARDED_BY(mu_) = nullptr;
  int interrupted_ GUARDED_BY(mu_) = 0;
};

}  // namespace

Job::Job(const Options& options, std::vector<hosts::RankPlacement> placement,
         const Starters& starters, const JobHooks& hooks, JobAttempt attempt)
    : options_(options),
      placement_(std::move(placement)),
      starters_(starters),
      hooks_(hooks),
      attempt_(std::move(attempt)),
      clock_(SteadyClock()) {
  MutexLock lock(&hosts_mu_);
  hosts_ = options_.hosts;
}

Job::~Job() = default;

hosts::HostSpec Job::HostAt(int h) const {
  MutexLock lock(&hosts_mu_);
  if (h < 0 || h >= static_cast<int>(hosts_.size()))
    return hosts::HostSpec{"", "host " + std::to_string(h), 0};
  return hosts_[static_cast<size_t>(h)];
}

void Job::Push(Event e) {
  MutexLock lock(&queue_mu_);
  queue_.push_back(std::move(e));
  queue_cv_.Signal();
}

void Job::OnAgentEvent(int host, const v1::AgentEvent& event) {
  Event e;
  e.kind = Event::kAgent;
  e.host = host;
  e.agent = event;
  Push(std::move(e));
}

void Job::OnSignal(int signo) {
  Event e;
  e.kind = Event::kSignal;
  e.signo = signo;
  Push(std::move(e));
}

AttemptOutcome Job::outcome() const {
  AttemptOutcome o;
  if (state_ == nullptr) {  // ringrun failed before the job started
    o.exit_code = 1;
    return o;
  }
  o.exit_code = state_->exit_code();
  o.interrupted = state_->interrupted();
  o.failure = state_->failure();
  return o;
}

void Job::OnSessionEnded(int host, bool /*clean*/, const std::string& why) {
  Event e;
  e.kind = Event::kSessionEnded;
  e.host = host;
  e.why = why;
  Push(std::move(e));
}

bool Job::OnRegisterAsync(const v1::RegisterRequest& req, const std::string& peer_address,
                          const RegisterDone& done) {
  const int h = req.host_index();
  service::Registration reg;
  reg.hostname = req.hostname();
  reg.peer_address = peer_address;
  reg.service_target = req.service_target();
  reg.free_port = req.free_port();
  if (!options_.network_interfaces.empty()) {
    std::vector<NetInterface> nics;
    for (const auto& i : req.interfaces()) nics.push_back({i.name(), i.address()});
    Result<std::string> a = FirstInterfaceAddress(nics, options_.network_interfaces);
    if (!a.ok()) {
      done(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "host " + HostAt(h).name + ": " + a.status().message()),
           {});
      return true;
    }
    reg.data_address = *a;
  }
  service::Registration copy = reg;
  if (grpc::Status st = registry_->Add(h, std::move(reg)); !st.ok()) {
    done(st, {});
    return true;
  }
  spdlog::debug("agent for host {} ({}) registered from {}", HostAt(h).name, req.hostname(),
                peer_address);
  Event e;
  e.kind = Event::kRegistered;
  e.host = h;
  if (registry_->IsLate(h)) {  // its ranks were made while the job ran: the main thread's
    e.registration = std::move(copy);
    e.register_done = done;
    Push(std::move(e));
    return true;
  }
  Push(std::move(e));
  // Answered once every host has registered: a callback, so that waiting agents hold no thread.
  registry_->WhenRanks(h, [this, done](grpc::Status st, std::vector<v1::RankSpec> ranks) {
    v1::RegisterReply reply;
    if (st.ok()) {
      reply = BaseReply();
      for (auto& spec : ranks) *reply.add_ranks() = std::move(spec);
    }
    done(st, std::move(reply));
  });
  return true;
}

v1::RegisterReply Job::BaseReply() const {
  v1::RegisterReply reply;
  reply.set_job_id(job_id_);
  reply.set_grace_ms(options_.grace_ms);
  reply.set_heartbeat_interval_ms(kHeartbeatIntervalMs);
  reply.set_heartbeat_timeout_ms(kHeartbeatTimeoutMs);
  reply.set_timeline(timeline_ != nullptr);
  reply.set_cpu_binding(options_.bind_to == Options::BindTo::kCore
                            ? v1::RegisterReply::CPU_BINDING_CORE
                            : v1::RegisterReply::CPU_BINDING_NONE);
  return reply;
}

void Job::Discard(Event& e) {
  if (e.handle) e.handle->Kill();  // an agent whose Start() returned after the loop ended
  if (e.register_done) {
    e.register_done(grpc::Status(grpc::StatusCode::ABORTED, "the job is over"), {});
    e.register_done = nullptr;
  }
}

// The address peers should use for `host`: its --network-interfaces address; else what the
// launcher saw it connect from, except that a loopback address is useless to other machines,
// so in a job that spans machines the local host is named by the address the remote agents
// reached us on.
std::string Job::AddressOf(int host, const std::map<int, service::Registration>& registered) const {
  if (!registered.at(host).data_address.empty()) return registered.at(host).data_address;
  const std::string& seen = registered.at(host).peer_address;
  if (!IsLoopback(seen)) return seen;
  for (const auto& [h, reg] : registered) {
    const std::string addr = reg.service_target.substr(0, reg.service_target.rfind(':'));
    if (!IsLoopback(reg.peer_address) && !addr.empty()) return addr;
  }
  return seen;
}

std::map<int, std::vector<v1::RankSpec>> Job::BuildSpecs(
    const std::map<int, service::Registration>& registered) const {
  std::map<int, std::vector<v1::RankSpec>> specs;
  std::vector<std::string> launcher_env;
  for (char** e = environ; *e; ++e) launcher_env.emplace_back(*e);
  const int host0 = placement_[0].host_index;
  // The hosts of a job are taken to be alike: this machine's core count stands for each.
  const int host_cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  int threads_note = 0, threads_note_ranks = 0;
  std::map<int, std::string> address;  // per host, found once: AddressOf may scan every host
  for (const auto& [h, reg] : registered) address[h] = AddressOf(h, registered);
  for (const auto& p : placement_) {
    JobContext ctx;
    ctx.job_id = job_id_;
    ctx.job_service = registered.at(p.host_index).service_target;
    ctx.secret = secret_;
    ctx.hostname = options_.hosts[p.host_index].name;
    ctx.host_addr = address.at(p.host_index);
    ctx.master_addr = address.at(host0);
    ctx.master_port = registered.at(host0).free_port;
    ctx.size = static_cast<int>(placement_.size());
    ctx.restart_count = attempt_.restart_count;
    ctx.max_restarts = options_.max_restarts;
    ctx.run_id = run_id_;
    ctx.threads_per_rank =
        DefaultThreadsPerRank(launcher_env, options_.exports, p.local_size, host_cores);
    if (ctx.threads_per_rank > 0 && threads_note == 0) {
      threads_note = ctx.threads_per_rank;
      threads_note_ranks = p.local_size;
    }
    v1::RankSpec spec;
    spec.set_rank(p.rank);
    spec.set_local_rank(p.local_rank);
    for (const auto& a : options_.command) spec.add_argv(a);
    for (auto& kv : BuildRankEnvironment(launcher_env, options_.exports, p, ctx)) {
      spec.add_env(std::move(kv));
    }
    if (options_.elastic.enabled) {
      spec.add_env("RINGRUN_ELASTIC=1");
      spec.add_env("HOROVOD_ELASTIC=1");
      spec.add_env("RINGRUN_WORKER_ID=" + std::to_string(p.rank));
    }
    spec.set_cwd(cwd_);
    specs[p.host_index].push_back(std::move(spec));
  }
  if (threads_note > 0 && attempt_.restart_count == 0) {  // said once, not per attempt
    std::fprintf(stderr,
                 "ringrun: %d ranks share a host's %d cores: OMP_NUM_THREADS, "
                 "OPENBLAS_NUM_THREADS and MKL_NUM_THREADS set to %d per rank (set one, or "
                 "-x OMP_NUM_THREADS=N, to choose)\n",
                 threads_note_ranks, host_cores, threads_note);
  }
  return specs;
}

Job::Event Job::StartAgent(starters::AgentStarter* starter, int host,
                           starters::AgentLaunch launch) const {
  Event e;
  e.kind = Event::kStarted;
  e.host = host;
  launch.host_index = host;
  auto r = starter->Start(HostAt(host), launch);
  if (r.ok()) {
    e.handle = std::move(r.value());
  } else {
    e.why = r.status().message();
  }
  return e;
}

// Where a host's agent is started from: local hosts by starters_.local on this (the main)
// thread, since PR_SET_PDEATHSIG follows the thread that forked and this one lives as long as
// the job; remote hosts by starters_.remote, from a bounded pool of threads.
void Job::StartAgents(const std::vector<int>& hosts) {
  starters::AgentLaunch base;
  base.service_port = port_;
  base.service_address = options_.launcher_address;
  base.secret = secret_;
  base.agent_path = agent_path_;
  base.log_level = options_.log_level;
  std::vector<int> remote;
  for (int h : hosts) {
    if (!hosts::IsLocalHost(HostAt(h).name)) {
      remote.push_back(h);
      continue;
    }
    starters::AgentLaunch launch = base;
    if (IsLoopback(launch.service_address)) launch.service_address.clear();
    if (starters_.local == nullptr) {
      Event e;
      e.kind = Event::kStarted;
      e.host = h;
      e.why = "no local agent starter";
      Push(std::move(e));
    } else {
      Push(StartAgent(starters_.local, h, launch));
    }
  }
  if (remote.empty()) return;
  auto next = std::make_shared<std::atomic<size_t>>(0);
  int threads = std::max(1, std::min<int>(options_.ssh_fanout, static_cast<int>(remote.size())));
  for (int t = 0; t < threads; ++t) {
    start_threads_.emplace_back([this, remote, next, base] {
      for (size_t i; (i = next->fetch_add(1)) < remote.size();) {
        const int h = remote[i];
        if (starters_.remote == nullptr) {
          Event e;
          e.kind = Event::kStarted;
          e.host = h;
          e.why = HostAt(h).name + ": remote hosts are not supported by this build";
          Push(std::move(e));
        } else {
          Push(StartAgent(starters_.remote, h, base));
        }
      }
    });
  }
}

void Job::Execute() {
  for (auto commands = state_->TakeCommands(); !commands.empty();
       commands = state_->TakeCommands()) {
    for (const JobCommand& c : commands) {
      switch (c.kind) {
        case JobCommand::Kind::kReport:
          output_->Flush();
          std::fprintf(stderr, "ringrun: %s\n", c.text.c_str());
          std::fflush(stderr);
          break;
        case JobCommand::Kind::kSignalRanks: {
          v1::AgentCommand cmd;
          cmd.mutable_signal()->set_signo(c.signo);
          for (int h : c.hosts) service_->Send(h, cmd);
          break;
        }
        case JobCommand::Kind::kTerminateRanks: {
          v1::AgentCommand cmd;
          cmd.mutable_terminate()->set_grace_ms(c.grace_ms);
          cmd.mutable_terminate()->set_reason(c.text);
          for (int h : c.hosts) service_->Send(h, cmd);
          break;
        }
        case JobCommand::Kind::kKillAgent: {
          if (!c.text.empty()) spdlog::warn("{}", c.text);
          auto it = agents_.find(c.host);
          if (it != agents_.end()) it->second->Kill();
          break;
        }
        case JobCommand::Kind::kCloseRegistration:
          state_->RegistrationClosed(registry_->Close());
          break;
        case JobCommand::Kind::kAbortRendezvous:
          rendezvous_->Abort("the job is being torn down");
          break;
      }
    }
  }
}

void Job::HandleAgentEvent(int host, const v1::AgentEvent& ev) {
  switch (ev.event_case()) {
    case v1::AgentEvent::kStarted: {
      const auto& st = ev.started();
      if (options_.report_bindings) {
        output_->Flush();
        std::fprintf(stderr, "ringrun: rank %d on %s (pid %d): %s\n", st.rank(),
                     HostAt(host).name.c_str(), st.pid(),
                     st.cpus().empty() ? "not bound (--bind-to none)"
                                       : ("bound to CPUs " + st.cpus()).c_str());
      }
      state_->RankStarted(st.rank());
      break;
    }
    case v1::AgentEvent::kOutput: {
      const auto& o = ev.output();
      if (o.stream() == v1::AgentEvent::TIMELINE) {
        if (timeline_) timeline_->Append(o.data());
      } else {
        output_->Write(o.rank(), o.stream() == v1::AgentEvent::STDERR, o.data());
      }
      break;
    }
    case v1::AgentEvent::kExited: {
      const auto& x = ev.exited();
      const bool failed = x.exit_code() != 0 || x.signal() != 0;
      if (policy_ && !state_->stopping() && x.rank() >= 0 &&
          x.rank() < static_cast<int>(workers_.size())) {
        ElasticRankExited(x.rank(), x.exit_code(), x.signal());
        break;
      }
      state_->RankExited(x.rank(), x.exit_code(), x.signal(),
                         failed ? output_->StderrTail(x.rank()) : "");
      break;
    }
    case v1::AgentEvent::kSpawnFailed:
      // A rank started in a running elastic job: a failure of that rank, not of the job.
      if (policy_ && !state_->stopping() &&
          ev.spawn_failed().rank() >= static_cast<int>(placement_.size()) &&
          ev.spawn_failed().rank() < static_cast<int>(workers_.size())) {
        output_->Write(ev.spawn_failed().rank(), true, ev.spawn_failed().message() + "\n");
        ElasticRankExited(ev.spawn_failed().rank(),
                          ev.spawn_failed().exit_code() ? ev.spawn_failed().exit_code() : 127, 0);
        break;
      }
      state_->RankSpawnFailed(ev.spawn_failed().rank(), ev.spawn_failed().exit_code(),
                              ev.spawn_failed().message());
      break;
    default:
      spdlog::trace("host {}: event {} ignored", host, static_cast<int>(ev.event_case()));
      break;
  }
}

void Job::Handle(Event& e) {
  switch (e.kind) {
    case Event::kAgent:
      HandleAgentEvent(e.host, e.agent);
      break;
    case Event::kStarted: {
      const bool ok = e.handle != nullptr;
      if (ok) agents_[e.host] = std::move(e.handle);
      if (!ok && policy_ && registry_->IsLate(e.host)) {
        ElasticHostLost(e.host, "could not start the agent: " + e.why);
      }
      state_->AgentStarted(e.host, ok, e.why);
      break;
    }
    case Event::kRegistered:
      state_->AgentRegistered(e.host);
      if (e.register_done) AnswerLateRegistration(e);
      break;
    case Event::kSessionEnded:
      if (policy_) {
        ElasticHostLost(e.host, e.why.empty() ? "the agent closed its session early" : e.why);
      }
      state_->SessionEnded(e.host, e.why);
      break;
    case Event::kGenerationJoined:
      if (static_cast<uint32_t>(e.signo) == generation_) {
        pending_after_failure_ = false;
        generation_complete_ = true;
        running_broken_ = false;
        for (int w : generation_workers_) workers_[static_cast<size_t>(w)].joined = true;
        // The agents of hosts that the script dropped: their ranks are out of the job now.
        for (auto it = leaving_agents_.begin(); it != leaving_agents_.end();) {
          if (it->first > generation_) {
            ++it;
            continue;
          }
          TerminateAgent(it->second,
                         "host " + HostAt(it->second).name + " left the host discovery's list");
          it = leaving_agents_.erase(it);
        }
      }
      break;
    case Event::kJoinWaiting:
      join_waiting_ = std::max(join_waiting_, static_cast<uint32_t>(e.signo));
      if (policy_ && !state_->stopping() && JoinBlockedByLeaves()) Reform("", false, 1);
      if (policy_ && join_waiting_ > generation_ && generation_complete_ && !unexplained_since_) {
        unexplained_since_ = clock_.Now();
      }
      MaybeRaiseEpoch();
      break;
    case Event::kDiscovered:
      if (e.discovered) OnDiscovered(*e.discovered);
      break;
    case Event::kSignal:
      state_->SignalReceived(e.signo);
      break;
  }
  Execute();
}

void Job::HandleQueued() {
  std::deque<Event> batch;
  {
    MutexLock lock(&queue_mu_);
    batch.swap(queue_);
  }
  for (auto& e : batch) Handle(e);
}

// Agents that ended (after their session, or on their own: crashed, never found on the host).
void Job::PollAgents() {
  std::vector<std::pair<int, int>> exited;  // host, exit code
  for (auto& [h, agent] : agents_) {
    if (state_->finished(h)) continue;
    if (auto code = agent->Poll()) exited.emplace_back(h, *code);
  }
  if (exited.empty()) return;
  // What an agent reported before it ended (its registration, its session's end) is queued by
  // now: it counts first.
  HandleQueued();
  for (const auto& [h, code] : exited) {
    if (policy_) {
      ElasticHostLost(h, "the agent exited with code " + std::to_string(code));
      Execute();
    }
    state_->AgentExited(h, code, agents_.at(h)->StderrTail());
  }
  Execute();
}

int Job::Prepare() {
  JobPlan plan;
  plan.hosts = options_.hosts;
  std::vector<bool> active(options_.hosts.size(), false);  // in the order of their first rank
  for (const auto& p : placement_) {
    if (!active.at(p.host_index)) {
      active[p.host_index] = true;
      active_hosts_.push_back(p.host_index);
    }
    plan.rank_hosts.push_back(p.host_index);
  }
  auto secret = GenerateSecret();
  auto job_id = GenerateSecret();
  if (!secret.ok() || !job_id.ok()) {
    std::fprintf(stderr, "ringrun: %s\n", secret.status().ToString().c_str());
    return 1;
  }
  secret_ = secret.value();
  job_id_ = job_id.value().substr(0, 12);
  run_id_ = attempt_.run_id.empty() ? job_id_ : attempt_.run_id;
  agent_path_ = options_.agent_path.empty() ? DefaultAgentPath() : options_.agent_path;
  cwd_ = options_.wdir.empty() ? CurrentDir() : options_.wdir;

  OutputRouter::Config oc;
  oc.echo_to_console = hooks_.echo_to_console;
  oc.prefix_timestamp = options_.prefix_timestamp;
  oc.output_dir = options_.output_dir;
  oc.append = attempt_.restart_count > 0;  // after the earlier attempts' output
  oc.tail_lines = kStderrTailLines;
  oc.on_line = hooks_.on_line;
  output_ = std::make_unique<OutputRouter>(oc);
  if (Status st = output_->Open(static_cast<int>(placement_.size())); !st.ok()) {
    std::fprintf(stderr, "ringrun: %s\n", st.message().c_str());
    return 1;
  }

  // The ranks' timeline, which this launcher writes (timeline_file.h). Each attempt of a
  // restarted job starts the file again, as the ranks' own files would be.
  std::vector<std::string> launcher_env;
  for (char** e = environ; *e; ++e) launcher_env.emplace_back(*e);
  if (std::string named = TimelineFile::Named(launcher_env, options_.exports, cwd_);
      !named.empty()) {
    Result<std::unique_ptr<TimelineFile>> t = TimelineFile::Open(named);
    if (t.ok()) {
      timeline_ = std::move(t.value());
    } else {  // the ranks try their own files, as without this launcher
      std::fprintf(stderr, "ringrun: %s\n", t.status().message().c_str());
    }
  }

  plan.grace_ms = options_.grace_ms;
  plan.start_timeout_s = options_.start_timeout_s;
  plan.timeout_s = options_.timeout_s;
  plan.timeout_used = attempt_.timeout_used;
  plan.agent_path = agent_path_;
  plan.elastic = options_.elastic.enabled;
  state_ = std::make_unique<JobStateMachine>(std::move(plan), clock_);
  registry_ = std::make_unique<service::AgentRegistry>(
      active_hosts_, clock_.Now() + std::chrono::seconds(options_.start_timeout_s),
      [this](const std::map<int, service::Registration>& registered) {
        return BuildSpecs(registered);
      });
  rendezvous_ = std::make_unique<service::Rendezvous>(static_cast<int>(placement_.size()), job_id_);
  service_ = std::make_unique<service::JobService>(secret_, this, rendezvous_.get(),
                                                   kHeartbeatIntervalMs, kHeartbeatTimeoutMs);
  return options_.elastic.enabled ? PrepareElastic() : 0;
}

// ---- Elastic jobs ----

namespace {

std::string SignalText(int signo) {
  const char* abbrev = ::sigabbrev_np(signo);
  return (abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signo)) + " (signal " +
         std::to_string(signo) + ")";
}

}  // namespace

void Job::Report(const std::string& line) {
  output_->Flush();
  std::fprintf(stderr, "ringrun: %s\n", line.c_str());
  std::fflush(stderr);
}

int Job::PrepareElastic() {
  const Options::Elastic& e = options_.elastic;
  elastic::MembershipOptions mo;
  mo.np = options_.np;
  mo.min_np = e.min_np;
  mo.max_np = std::max(e.max_np, options_.np);
  mo.reset_limit = e.reset_limit;
  if (e.cooldown_s) {
    mo.cooldown = std::make_pair(std::chrono::seconds(e.cooldown_s->first),
                                 std::chrono::seconds(e.cooldown_s->second));
  }
  mo.start_timeout = std::chrono::seconds(options_.start_timeout_s);
  mo.elastic_timeout = std::chrono::seconds(e.elastic_timeout_s);
  mo.jitter_seed = std::hash<std::string>()(job_id_);
  // A fixed host set starts no process in a running job; hosts that come and go do.
  mo.refill = !e.discovery_script.empty();
  Result<elastic::MembershipPolicy> policy = elastic::MembershipPolicy::Create(mo, clock_);
  if (!policy.ok()) {
    std::fprintf(stderr, "ringrun: %s\n", policy.status().message().c_str());
    return 1;
  }
  policy_ = std::make_unique<elastic::MembershipPolicy>(std::move(policy.value()));
  // The fixed host set: each host with the ranks placed on it. With a discovery script, what its
  // first run listed (the placement took every slot up to --max-np, as the policy does).
  elastic::HostSet hosts;
  if (!e.discovery_script.empty()) {
    for (const auto& h : options_.hosts) hosts.push_back({h.name, h.slots});
  } else {
    for (int h : active_hosts_) {
      int slots = 0;
      for (const auto& p : placement_) slots += p.host_index == h;
      hosts.push_back({options_.hosts[h].name, slots});
    }
  }
  discovered_ = hosts;
  policy_->OnDiscovery(hosts);
  for (const auto& p : placement_) {
    Worker w;
    w.host = p.host_index;
    workers_.push_back(w);
  }
  elastic::Decision d = policy_->Decide();
  if (d.action != elastic::Decision::Action::kForm ||
      d.generation.ranks.size() != placement_.size()) {
    std::fprintf(stderr, "ringrun: the elastic policy did not take the placement as is\n");
    return 1;
  }
  // The first generation is the placement: worker w is the rank w placed.
  std::vector<int> first;
  for (const auto& slot : d.generation.ranks) {
    int w = -1;
    for (const auto& p : placement_) {
      if (options_.hosts[p.host_index].name == slot.host && p.local_rank == slot.local_rank) {
        w = p.rank;
      }
    }
    if (w < 0) {
      std::fprintf(stderr, "ringrun: the elastic policy placed a rank on %s, not placed\n",
                   slot.host.c_str());
      return 1;
    }
    first.push_back(w);
  }
  generation_workers_ = std::move(first);
  rendezvous_->SetOnGenerationComplete([this](uint32_t g) {
    Event ev;
    ev.kind = Event::kGenerationJoined;
    ev.signo = static_cast<int>(g);
    Push(std::move(ev));
  });
  rendezvous_->SetOnJoinWaiting([this](uint32_t g) {
    Event ev;
    ev.kind = Event::kJoinWaiting;
    ev.signo = static_cast<int>(g);
    Push(std::move(ev));
  });
  FormGeneration(d.generation, "", false);
  return 0;
}

bool Job::JoinBlockedByLeaves() const {
  return !leaves_.empty() &&
         (join_waiting_ > generation_ || (join_waiting_ == generation_ && !generation_complete_));
}

int Job::RankOfWorker(int worker) const {
  for (size_t r = 0; r < generation_workers_.size(); ++r) {
    if (generation_workers_[r] == worker) return static_cast<int>(r);
  }
  return -1;
}

namespace {

// The place of rank `r` in generation `g`, as the runtime shapes a generation (its hosts in the
// order of their first rank): what a rank started for `g` is told in its environment.
hosts::RankPlacement PlacementIn(const elastic::Generation& g, int r) {
  std::vector<std::string> order;  // hosts by their first rank
  std::map<std::string, int> count;
  for (const auto& slot : g.ranks) {
    if (count[slot.host]++ == 0) order.push_back(slot.host);
  }
  const elastic::RankSlot& me = g.ranks.at(static_cast<size_t>(r));
  hosts::RankPlacement p;
  p.rank = r;
  p.local_rank = me.local_rank;
  p.local_size = count[me.host];
  p.node_count = static_cast<int>(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] == me.host) p.node_rank = static_cast<int>(i);
    if (count[order[i]] > me.local_rank) {
      if (order[i] == me.host) p.cross_rank = p.cross_size;
      ++p.cross_size;
    }
  }
  return p;
}

std::string WorkerList(const std::vector<int>& workers) {
  std::string out;
  for (int w : workers) out += (out.empty() ? "" : ",") + std::to_string(w);
  return out;
}

// What changed between two results of the discovery script, in words; empty: nothing.
std::string DescribeChange(const elastic::HostSet& before, const elastic::HostSet& after) {
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : ", ") + part; };
  auto find = [](const elastic::HostSet& set, const std::string& name) -> const elastic::Host* {
    for (const auto& h : set) {
      if (h.name == name) return &h;
    }
    return nullptr;
  };
  for (const auto& h : after) {
    const elastic::Host* was = find(before, h.name);
    if (was == nullptr) {
      add("host " + h.name + " (" + std::to_string(h.slots) + " slots) added");
    } else if (was->slots != h.slots) {
      add("host " + h.name + " has " + std::to_string(h.slots) + " slots (was " +
          std::to_string(was->slots) + ")");
    }
  }
  for (const auto& h : before) {
    if (find(after, h.name) == nullptr) add("host " + h.name + " removed");
  }
  return out;
}

}  // namespace

int Job::AddHost(const std::string& name) {
  hosts::HostSpec spec;
  spec.name = name;
  for (const auto& h : discovered_) {
    if (h.name == name) spec.slots = h.slots;
  }
  const int h = state_->AddHost(spec);
  {
    MutexLock lock(&hosts_mu_);
    hosts_.push_back(spec);
  }
  registry_->AddLateHost(h);
  return h;
}

void Job::FormGeneration(const elastic::Generation& g, const std::string& cause, bool failure) {
  std::vector<int> workers;
  std::vector<int> started;              // new workers
  std::map<std::string, int> new_agent;  // host name -> the host index of its new ranks' agent
  service::Rendezvous::ElasticGeneration eg;
  for (size_t r = 0; r < g.ranks.size(); ++r) {
    const elastic::RankSlot& slot = g.ranks[r];
    int w;
    if (g.number == 1) {
      w = generation_workers_.at(r);
    } else if (slot.previous_rank >= 0) {
      w = generation_workers_.at(static_cast<size_t>(slot.previous_rank));
    } else {
      auto [it, inserted] = new_agent.emplace(slot.host, -1);
      if (inserted) it->second = AddHost(slot.host);
      w = static_cast<int>(workers_.size());
      Worker nw;
      nw.host = it->second;
      nw.placement = PlacementIn(g, static_cast<int>(r));
      nw.placement.host_index = it->second;
      nw.size = static_cast<int>(g.ranks.size());
      workers_.push_back(nw);
      state_->AddRank(w, it->second);
      started.push_back(w);
    }
    workers.push_back(w);
    eg.hosts.push_back(slot.host);
  }
  // Live members of the last generation that this one leaves out: the script dropped their host
  // (or took slots from it). They leave; their exits are expected.
  std::vector<int> dropped;
  for (int w : generation_workers_) {
    if (workers_[static_cast<size_t>(w)].alive &&
        std::find(workers.begin(), workers.end(), w) == workers.end()) {
      workers_[static_cast<size_t>(w)].alive = false;
      dropped.push_back(w);
    }
  }
  const size_t before = generation_workers_.size();
  generation_workers_ = workers;
  generation_ = static_cast<uint32_t>(g.number);
  generation_complete_ = false;
  first_waiting_at_.reset();
  unexplained_since_.reset();
  // Members started in the running job that never were in a formed generation: the raise of
  // the epoch waits for them.
  std::vector<int> newcomers;
  for (int w : workers) {
    const Worker& wk = workers_[static_cast<size_t>(w)];
    if (wk.size > 0 && !wk.joined) newcomers.push_back(w);
  }
  // The running ranks are told (a new epoch) when the hosts changed, unless their generation is
  // broken (a failure, a rank gone): they leave it and join the newest anyway.
  const bool broken = failure || running_broken_;
  const bool hosts_changed =
      !broken && (!started.empty() || !dropped.empty() || growth_.has_value());
  if (hosts_changed) ++epoch_planned_;
  if (broken && growth_) {
    growth_.reset();
    RaiseEpoch(epoch_planned_);
  }
  eg.number = generation_;
  eg.workers = std::move(workers);
  eg.membership_epoch = epoch_planned_;
  Result<std::string> key = GenerateSecret();
  eg.data_secret = key.ok() ? key.value() : secret_;
  rendezvous_->SetGeneration(std::move(eg));
  for (int w : dropped) {
    const int h = workers_[static_cast<size_t>(w)].host;
    bool all_gone = true;
    for (const Worker& o : workers_) all_gone = all_gone && (o.host != h || !o.alive);
    const auto entry = std::make_pair(generation_, h);
    if (all_gone &&
        std::find(leaving_agents_.begin(), leaving_agents_.end(), entry) == leaving_agents_.end()) {
      leaving_agents_.push_back(entry);
    }
  }
  if (!cause.empty()) {
    std::string limit = options_.elastic.reset_limit
                            ? " of --reset-limit " + std::to_string(*options_.elastic.reset_limit)
                            : "";
    std::string extra;
    if (!started.empty()) extra += "; starting workers " + WorkerList(started);
    if (!dropped.empty()) extra += "; workers " + WorkerList(dropped) + " leave";
    Report(cause + "; generation " + std::to_string(g.number) + ": " +
           std::to_string(g.ranks.size()) + " ranks (was " + std::to_string(before) + "), reset " +
           std::to_string(policy_->resets()) + limit + extra);
  }
  if (!new_agent.empty()) {
    std::vector<int> agents;
    for (const auto& [name, h] : new_agent) agents.push_back(h);
    StartAgents(agents);
  }
  if (!hosts_changed) return;
  growth_ = Growth{epoch_planned_, std::move(newcomers),
                   clock_.Now() + std::chrono::seconds(options_.start_timeout_s)};
  MaybeRaiseEpoch();
}

void Job::MaybeRaiseEpoch() {
  if (!growth_ || state_->stopping()) return;
  if (!growth_->newcomers.empty()) {
    std::vector<int> late = rendezvous_->NotHeld(growth_->newcomers);
    if (!late.empty()) {
      if (clock_.Now() < growth_->deadline) return;
      // Failed like a rank that exits: its host is blacklisted and its ranks are ended, and the
      // next generation (formed without it) raises the epoch for the running ranks.
      const int w = late.front();
      const int agent = workers_[static_cast<size_t>(w)].host;
      TerminateAgent(agent, "its worker " + std::to_string(w) + " did not join in time");
      ElasticRankExited(w, 1, 0,
                        "did not join within " + std::to_string(options_.start_timeout_s) +
                            " s of its start (--start-timeout)");
      return;
    }
  }
  const Growth g = *growth_;
  growth_.reset();
  if (!g.newcomers.empty()) {
    Report("generation " + std::to_string(generation_) + ": its new workers " +
           WorkerList(g.newcomers) + " wait to join it; membership epoch " +
           std::to_string(g.epoch) + ": the running ranks join it at their next commit");
  }
  RaiseEpoch(g.epoch);
}

void Job::RaiseEpoch(uint64_t epoch) {
  epoch_raised_ = std::max(epoch_raised_, epoch);
  service_->RaiseMembershipEpoch(epoch_raised_);
}

void Job::AnswerLateRegistration(Event& e) {
  RegisterDone done = std::move(e.register_done);
  e.register_done = nullptr;
  if (state_->stopping()) {
    done(grpc::Status(grpc::StatusCode::ABORTED, "the job is over"), {});
    return;
  }
  std::map<int, service::Registration> registered = registry_->Registrations();
  registered[e.host] = e.registration;
  std::vector<std::string> launcher_env;
  for (char** v = environ; *v; ++v) launcher_env.emplace_back(*v);
  // MASTER_ADDR and MASTER_PORT: the host of the current rank 0, as far as known.
  int host0 = e.host;
  if (!generation_workers_.empty()) {
    const int h = workers_[static_cast<size_t>(generation_workers_[0])].host;
    if (registered.count(h)) host0 = h;
  }
  const int host_cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  v1::RegisterReply reply = BaseReply();
  for (size_t w = 0; w < workers_.size(); ++w) {
    const Worker& wk = workers_[w];
    if (wk.host != e.host || !wk.alive) continue;
    JobContext ctx;
    ctx.job_id = job_id_;
    ctx.job_service = e.registration.service_target;
    ctx.secret = secret_;
    ctx.hostname = HostAt(e.host).name;
    ctx.host_addr = AddressOf(e.host, registered);
    ctx.master_addr = AddressOf(host0, registered);
    ctx.master_port = registered.at(host0).free_port;
    ctx.size = wk.size;
    ctx.restart_count = attempt_.restart_count;
    ctx.max_restarts = options_.max_restarts;
    ctx.run_id = run_id_;
    ctx.threads_per_rank =
        DefaultThreadsPerRank(launcher_env, options_.exports, wk.placement.local_size, host_cores);
    v1::RankSpec* spec = reply.add_ranks();
    spec->set_rank(static_cast<int>(w));  // the agent's name for it: its worker id
    spec->set_local_rank(wk.placement.local_rank);
    for (const auto& a : options_.command) spec->add_argv(a);
    for (auto& kv : BuildRankEnvironment(launcher_env, options_.exports, wk.placement, ctx)) {
      spec->add_env(std::move(kv));
    }
    spec->add_env("RINGRUN_ELASTIC=1");
    spec->add_env("HOROVOD_ELASTIC=1");
    spec->add_env("RINGRUN_WORKER_ID=" + std::to_string(w));
    spec->set_cwd(cwd_);
  }
  done(grpc::Status::OK, std::move(reply));
}

void Job::CheckWait() {
  if (wait_until_ && clock_.Now() >= *wait_until_) {
    wait_until_.reset();
    Reform("", true, 1);
  }
}

void Job::CheckStuckJoins() {
  if (state_->stopping()) return;
  if (unexplained_since_) {
    if (join_waiting_ <= generation_ || !generation_complete_) {
      unexplained_since_.reset();  // a generation was formed meanwhile
    } else if (clock_.Now() - *unexplained_since_ >= milliseconds(kHeartbeatTimeoutMs + 2000)) {
      unexplained_since_.reset();
      const std::string why = "a collective of generation " + std::to_string(generation_) +
                              " failed with no rank or host lost (a rank stopped, or a link "
                              "that dropped?)";
      service_->BreakGeneration(generation_, why);
      policy_->OnBroken();
      Reform(why + ": its ranks form the next one", true, 1);
      return;
    }
  }
  if (generation_complete_ || generation_ <= 1) return;
  std::vector<int> members;  // live members that were running before this generation
  for (int w : generation_workers_) {
    const Worker& wk = workers_[static_cast<size_t>(w)];
    if (wk.alive && (wk.size == 0 || wk.joined)) members.push_back(w);
  }
  const std::vector<int> missing = rendezvous_->NotHeld(members);
  if (missing.empty() || missing.size() == members.size()) return;  // nobody waits
  if (!first_waiting_at_) first_waiting_at_ = clock_.Now();
  if (clock_.Now() - *first_waiting_at_ < std::chrono::seconds(options_.start_timeout_s)) return;
  const int w = missing.front();
  TerminateAgent(workers_[static_cast<size_t>(w)].host,
                 "its worker " + std::to_string(w) + " did not come to its join");
  pending_after_failure_ = false;  // it failed first, whatever formed this generation
  ElasticRankExited(w, 1, 0,
                    "did not come to the join of generation " + std::to_string(generation_) +
                        " within " + std::to_string(options_.start_timeout_s) +
                        " s (--start-timeout): stopped, or cut off");
}

void Job::CheckCooldowns() {
  if (options_.elastic.discovery_script.empty() || state_->stopping()) return;
  std::string ended;
  for (const auto& [host, until] : policy_->Blacklist()) {
    if (until != Clock::TimePoint::max() && clock_.Now() >= until) {
      ended += (ended.empty() ? "host " : ", host ") + host;
    }
  }
  if (ended.empty()) return;
  Reform(ended + ": blacklist cooldown ended", false, 1);
}

void Job::OnDiscovered(Result<elastic::HostSet>& found) {
  if (!policy_ || state_->stopping()) return;
  if (!found.ok()) {
    if (!discovery_failing_) {
      Report(
          "host discovery failed, the job goes on with the hosts it has (said once until a "
          "run succeeds): " +
          found.status().message());
    }
    discovery_failing_ = true;
    return;
  }
  if (discovery_failing_) Report("host discovery works again");
  discovery_failing_ = false;
  const std::string change = DescribeChange(discovered_, *found);
  discovered_ = *found;
  policy_->OnDiscovery(*found);
  // Asked only on a change (or while the policy waits for slots), so that ranks that finish
  // one after another still form no generation between two runs of the script.
  if (!change.empty()) {
    Reform("host discovery: " + change, false, 1);
  } else if (wait_until_) {
    Reform("", false, 1);
  }
}

void Job::DiscoveryLoop() {
  elastic::DiscoveryOptions d;
  d.script = options_.elastic.discovery_script;
  d.default_slots = options_.elastic.slots_per_host;
  d.timeout_ms = options_.elastic.discovery_timeout_s * 1000;
  for (;;) {
    {
      MutexLock lock(&discovery_mu_);
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::seconds(options_.elastic.discovery_interval_s);
      while (!discovery_stop_ && discovery_cv_.WaitUntil(&discovery_mu_, until)) {
      }
      if (discovery_stop_) return;
    }
    Event e;
    e.kind = Event::kDiscovered;
    e.discovered = elastic::RunDiscoveryScript(d);
    Push(std::move(e));
  }
}

// Waits for a run of the script in progress (at most the discovery timeout).
void Job::StopDiscovery() {
  if (!discovery_thread_.joinable()) return;
  {
    MutexLock lock(&discovery_mu_);
    discovery_stop_ = true;
    discovery_cv_.SignalAll();
  }
  discovery_thread_.join();
}

void Job::Reform(const std::string& failure, bool failed, int exit_code) {
  // The ranks that left since the last generation are part of the change.
  std::string cause = leaves_;
  if (!failure.empty()) cause += (cause.empty() ? "" : "; ") + failure;
  leaves_.clear();
  elastic::Decision d = policy_->Decide();
  if (d.action != elastic::Decision::Action::kWait) wait_until_.reset();
  switch (d.action) {
    case elastic::Decision::Action::kKeep:
      break;
    case elastic::Decision::Action::kForm: {
      // Rank 0 of a generation holds the committed state that `run` syncs from: a survivor of
      // the first generation or of one that every member joined. Ranks started in the running
      // job that never got that far hold only their initial values.
      std::vector<int> survivors;
      bool any_holder = false;
      for (const auto& slot : d.generation.ranks) {
        if (slot.previous_rank < 0) continue;
        const int w = generation_workers_.at(static_cast<size_t>(slot.previous_rank));
        const Worker& wk = workers_[static_cast<size_t>(w)];
        survivors.push_back(w);
        any_holder = any_holder || wk.size == 0 || wk.joined;
      }
      if (!any_holder) {
        state_->EndJob(exit_code, (cause.empty() ? "" : cause + "; ") +
                                      "no rank holds the committed state: workers " +
                                      WorkerList(survivors) +
                                      " remain, started in the running job and never in a "
                                      "generation that every member joined");
        Execute();
        break;
      }
      pending_after_failure_ = failed || pending_after_failure_;
      FormGeneration(d.generation, cause, failed);
      break;
    }
    case elastic::Decision::Action::kWait: {
      if (!options_.elastic.discovery_script.empty()) {
        // Slots may come: the policy is asked again after each change the script lists, and
        // at its deadline (CheckWait), when it ends the job unless they came.
        if (!wait_until_) {
          const auto secs =
              std::chrono::duration_cast<std::chrono::seconds>(d.wait_until - clock_.Now());
          Report((cause.empty() ? "" : cause + "; ") + "waiting for host discovery: " + d.missing +
                 " (at most " + std::to_string(std::max<long>(0, secs.count())) +
                 " s, --elastic-timeout)");
        }
        wait_until_ = d.wait_until;
        break;
      }
      // A fixed host set: no slot will come.
      int alive = 0;
      for (const Worker& w : workers_) alive += w.alive;
      const std::string few = std::to_string(alive) + " ranks remain, fewer than --min-np " +
                              std::to_string(options_.elastic.min_np);
      state_->EndJob(exit_code, cause + "; " + few + ": ending the job");
      Execute();
      break;
    }
    case elastic::Decision::Action::kEnd:
      state_->EndJob(exit_code, (cause.empty() ? "" : cause + "; ") + d.end.message());
      Execute();
      break;
  }
}

void Job::ElasticRankExited(int worker, int exit_code, int signo, const std::string& failure) {
  Worker& wk = workers_[static_cast<size_t>(worker)];
  state_->RankGone(worker);
  if (!wk.alive) return;  // ended with its blacklisted host: expected
  wk.alive = false;
  const std::string host = HostAt(wk.host).name;
  const int rank = RankOfWorker(worker);
  const std::string who = "rank " + std::to_string(rank < 0 ? worker : rank) + " (worker " +
                          std::to_string(worker) + ") on host " + host;
  if (rank < 0) return;  // not in the current generation (cannot happen: members only live)
  // A member of the generation that runs: its peers' collectives fail, they join the next.
  if (wk.joined) running_broken_ = true;
  bool any_alive = false;
  for (const Worker& w : workers_) any_alive = any_alive || w.alive;
  if (exit_code == 0 && signo == 0) {
    (void)policy_->OnRankGone(rank, false);
    if (!any_alive) return;
    leaves_ += (leaves_.empty() ? "" : "; ") + who + " exited 0 and left the job";
    // A survivor may already wait for a generation that cannot complete without it.
    if (JoinBlockedByLeaves()) Reform("", false, 1);
    return;
  }
  const std::string what = who + (!failure.empty() ? " " + failure
                                  : signo          ? " was killed by " + SignalText(signo)
                                          : " exited with code " + std::to_string(exit_code));
  const int code = signo ? 128 + signo : exit_code;
  if (pending_after_failure_) {
    (void)policy_->OnRankGone(rank, true);
    Reform(what + " while generation " + std::to_string(generation_) +
               " was forming (a consequence: its host is not blacklisted)",
           true, code);
    return;
  }
  (void)policy_->OnFailure(elastic::Failure{rank, {}});
  // The host is blacklisted: its other ranks are ended.
  const std::string others = EndHostRanks(host);
  const auto bl = policy_->Blacklist();
  auto it = bl.find(host);
  std::string how = "host " + host + " is blacklisted";
  if (it != bl.end() && it->second != Clock::TimePoint::max()) {
    how +=
        " for " +
        std::to_string(
            std::chrono::duration_cast<std::chrono::seconds>(it->second - clock_.Now()).count()) +
        " s";
  }
  if (!others.empty()) how += ", its workers " + others + " are ended";
  Reform(what + "; " + how, true, code);
}

void Job::TerminateAgent(int host, const std::string& reason) {
  v1::AgentCommand cmd;
  cmd.mutable_terminate()->set_grace_ms(options_.grace_ms);
  cmd.mutable_terminate()->set_reason(reason);
  service_->Send(host, cmd);
}

std::string Job::EndHostRanks(const std::string& name) {
  std::string ended;
  std::set<int> agents;
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (!workers_[w].alive || HostAt(workers_[w].host).name != name) continue;
    workers_[w].alive = false;
    ended += (ended.empty() ? "" : ",") + std::to_string(w);
    agents.insert(workers_[w].host);
  }
  for (int h : agents) TerminateAgent(h, "host " + name + " blacklisted");
  return ended;
}

bool Job::ElasticHostLost(int host, const std::string& why) {
  if (state_->stopping()) return false;
  std::vector<int> lost;
  for (size_t w = 0; w < workers_.size(); ++w) {
    if (workers_[w].host != host) continue;
    // Gone with the agent, reported or not (ranks of a blacklisted host included).
    state_->RankGone(static_cast<int>(w));
    if (workers_[w].alive) lost.push_back(static_cast<int>(w));
  }
  if (lost.empty()) return false;
  std::string list;
  int root = -1;
  std::vector<int> ranks;
  bool any_joined = false;
  for (int w : lost) {
    workers_[static_cast<size_t>(w)].alive = false;
    any_joined = any_joined || workers_[static_cast<size_t>(w)].joined;
    list += (list.empty() ? "" : ",") + std::to_string(w);
    const int r = RankOfWorker(w);
    if (r >= 0) ranks.push_back(r);
  }
  if (ranks.empty()) return true;
  if (any_joined) running_broken_ = true;
  const std::string name = HostAt(host).name;
  const std::string what =
      "lost the agent on host " + name + ": " + why + " (workers " + list + " were running)";
  // The lost ranks may be alive but unreachable (the link cut, the host frozen): nothing closes
  // their connections, so the survivors are told through their Watch instead of waiting for
  // the collective timeout. Ranks that never joined (started for a pending generation) were
  // nobody's peers yet.
  if (any_joined) service_->BreakGeneration(generation_, what);
  if (pending_after_failure_) {
    for (int r : ranks) (void)policy_->OnRankGone(r, true);
    Reform(what + " while generation " + std::to_string(generation_) +
               " was forming (a consequence: the host is not blacklisted)",
           true, 1);
    return true;
  }
  root = ranks.front();
  (void)policy_->OnFailure(elastic::Failure{root, {}});
  // The host is blacklisted: ranks under its other agents (started later) are ended too.
  EndHostRanks(name);
  Reform(what + "; host " + name + " is blacklisted", true, 1);
  return true;
}

int Job::Loop() {
  auto next_tick = clock_.Now();
  while (!state_->done()) {
    {
      MutexLock lock(&queue_mu_);
      while (queue_.empty() && queue_cv_.WaitUntil(&queue_mu_, next_tick)) {
      }
    }
    HandleQueued();
    output_->Flush();
    if (clock_.Now() >= next_tick) {
      // Deadlines first: an agent refused at the start deadline exits at once, and the start
      // timeout, not that exit, is the failure to report.
      state_->Tick();
      Execute();
      PollAgents();
      if (policy_ && !state_->stopping()) {
        CheckWait();
        CheckCooldowns();
        CheckStuckJoins();
        MaybeRaiseEpoch();
      }
      next_tick = clock_.Now() + milliseconds(kTickMs);
    }
  }
  // Drain what arrived last (output racing the end of sessions).
  std::deque<Event> rest;
  {
    MutexLock lock(&queue_mu_);
    rest.swap(queue_);
  }
  for (auto& e : rest) {
    if (e.kind == Event::kAgent) {
      HandleAgentEvent(e.host, e.agent);
      Execute();
    } else {
      Discard(e);
    }
  }
  output_->Flush();
  spdlog::debug("every host finished");
  return state_->exit_code();
}

// The job is over: no more registrations, joins or sessions.
void Job::CloseService() {
  registry_->Close();
  rendezvous_->Abort("the job is over");
  service_->Close();
}

// Gives the agents a moment to exit on their own (their sessions are closed), then ends them.
void Job::StopAgents() {
  auto give_up = clock_.Now() + milliseconds(kShutdownGraceMs);
  for (auto& [h, agent] : agents_) {
    while (!agent->Poll() && clock_.Now() < give_up) std::this_thread::sleep_for(milliseconds(1));
    agent->Kill();
  }
  for (auto& t : start_threads_) t.join();
  {
    // Agents whose Start() returned after the loop ended.
    MutexLock lock(&queue_mu_);
    for (auto& e : queue_) Discard(e);
    queue_.clear();
  }
  agents_.clear();
}

int Job::Run() {
  spdlog::debug("job starting (restart count {})", attempt_.restart_count);
  if (int rc = Prepare(); rc != 0) return rc;

  // Hosts that a discovery script lists later may be other machines.
  bool all_local = options_.elastic.discovery_script.empty();
  for (int h : active_hosts_) all_local = all_local && hosts::IsLocalHost(options_.hosts[h].name);
  Result<service::JobServer> server =
      service::StartJobServer(all_local ? "127.0.0.1:0" : "0.0.0.0:0", *service_);
  int rc = 1;
  if (!server.ok()) {
    std::fprintf(stderr, "ringrun: could not start the job service: %s\n",
                 server.status().message().c_str());
  } else {
    port_ = server->port;
    spdlog::debug("job {}: job service on port {}, {} ranks on {} hosts", job_id_, port_,
                  placement_.size(), active_hosts_.size());
    StartAgents(active_hosts_);
    if (policy_ && !options_.elastic.discovery_script.empty()) {
      discovery_thread_ = std::thread([this] { DiscoveryLoop(); });
    }
    rc = Loop();
  }
  StopDiscovery();
  CloseService();
  if (server.ok()) {
    server->server->Shutdown(std::chrono::system_clock::now() + milliseconds(kShutdownGraceMs));
  }
  StopAgents();
  spdlog::debug("job over");
  return rc;
}

int RunJob(const Options& options, std::vector<hosts::RankPlacement> placement,
           const StartersForAttempt& starters, const JobHooks& hooks) {
  SignalRouter router;
  // Signals go to one thread that turns them into events; every other thread blocks them.
  SignalForwarder signals({SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2},
                          [&router](int signo) { router.OnSignal(signo); });
  const auto start = SteadyClock().Now();
  JobAttempt attempt;
  for (;;) {
    Job job(options, placement, starters(attempt.restart_count), hooks, attempt);
    if (!router.SetRunning(&job)) return 128 + router.interrupted();  // none after a signal
    const int rc = job.Run();
    router.SetRunning(nullptr);
    const RestartDecision next =
        DecideRestart(options.max_restarts, attempt.restart_count, job.outcome());
    // A signal that came as the attempt ended, too late for it to see, still ends the job.
    if (next.restart && router.interrupted() != 0) return 128 + router.interrupted();
    if (!next.report.empty()) std::fprintf(stderr, "ringrun: %s\n", next.report.c_str());
    if (!next.restart) return rc;
    attempt.restart_count++;
    attempt.run_id = job.run_id();
    attempt.timeout_used = std::chrono::duration_cast<milliseconds>(SteadyClock().Now() - start);
  }
}

int RunJob(const Options& options, std::vector<hosts::RankPlacement> placement,
           const Starters& starters, const JobHooks& hooks) {
  return RunJob(
      options, std::move(placement), [&starters](int) { return starters; }, hooks);
}

}  // namespace ringrun::launcher::job
