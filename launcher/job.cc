#include "launcher/job.h"

#include <grpcpp/grpcpp.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "launcher/environment.h"
#include "launcher/job_service.h"
#include "launcher/output.h"
#include "launcher/placement.h"
#include "launcher/rendezvous.h"
#include "ringrun/common/defaults.h"
#include "ringrun/common/log.h"
#include "ringrun/common/secret.h"

extern char** environ;

namespace ringrun::launcher {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string SignalName(int signo) {
  const char* abbrev = ::sigabbrev_np(signo);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signo);
}

bool IsLoopback(const std::string& addr) {
  return addr.rfind("127.", 0) == 0 || addr == "::1" || addr == "localhost";
}

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

// What the job's main thread reacts to.
struct Event {
  enum Kind { kAgent, kSessionEnded, kSignal, kStarted } kind = kAgent;
  int host = -1;
  v1::AgentEvent agent;
  bool clean = false;
  std::string why;
  int signo = 0;
  std::unique_ptr<AgentHandle> handle;  // kStarted: null when the start failed (see why)
};

class Job final : public JobEvents {
 public:
  Job(const Options& options, const Starters& starters, const JobHooks& hooks)
      : options_(options), starters_(starters), hooks_(hooks) {}

  int Run();

  grpc::Status OnRegister(const v1::RegisterRequest& req, const std::string& peer_address,
                          v1::RegisterReply* reply) override;
  void OnAgentEvent(int host, const v1::AgentEvent& event) override {
    Event e;
    e.kind = Event::kAgent;
    e.host = host;
    e.agent = event;
    Push(std::move(e));
  }
  void OnSessionEnded(int host, bool clean, const std::string& why) override {
    Event e;
    e.kind = Event::kSessionEnded;
    e.host = host;
    e.clean = clean;
    e.why = why;
    Push(std::move(e));
  }

 private:
  struct HostState {
    std::vector<int> ranks;
    std::unique_ptr<AgentHandle> handle;
    bool start_done = false;  // Start() returned (handle set, or failed)
    bool registered = false;  // guarded by reg_mu_ (set from gRPC threads)
    bool session_ended = false;
    bool finished = false;  // nothing more will come from this host
    std::string hostname, peer_address, service_target;
    int free_port = 0;
  };
  struct RankState {
    bool started = false;
    bool exited = false;
    int pid = 0;
  };

  void Push(Event e) {
    std::lock_guard<std::mutex> lock(queue_mu_);
    queue_.push_back(std::move(e));
    queue_cv_.notify_one();
  }
  void Handle(Event& e);
  void HandleAgentEvent(int host, const v1::AgentEvent& ev);
  void HostFinished(int host);
  // Records the first failure (later ones are ignored) and starts the teardown.
  void Fail(int exit_code, const std::string& message);
  void BeginTeardown(int grace_ms);
  void SendAll(const v1::AgentCommand& cmd);
  void Tick();
  void BuildSpecsLocked();
  std::string AddressOfLocked(int host) const;
  void StartAgents();
  bool AllFinished() const;
  bool IsRegistered(int host) {
    std::lock_guard<std::mutex> lock(reg_mu_);
    return hosts_.at(host).registered;
  }

  // Constant after construction.
  const Options& options_;
  const Starters starters_;
  const JobHooks hooks_;

  // Set up in Run() before any thread starts; then constant.
  std::vector<RankPlacement> placement_;
  std::vector<int> active_hosts_;
  std::string secret_, job_id_, agent_path_, cwd_;
  int port_ = 0;
  Clock::time_point start_deadline_;
  std::unique_ptr<Rendezvous> rendezvous_;
  std::unique_ptr<JobService> service_;
  std::unique_ptr<OutputRouter> output_;

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Event> queue_;  // guarded by queue_mu_

  // Registration, touched by gRPC threads: guarded by reg_mu_.
  std::mutex reg_mu_;
  std::condition_variable reg_cv_;
  int registered_count_ = 0;
  bool specs_ready_ = false;
  bool reg_aborted_ = false;
  std::map<int, std::vector<v1::RankSpec>> specs_;

  // Main thread only.
  std::map<int, HostState> hosts_;  // by host index; hosts_[h].registered mirrors reg state
  std::vector<RankState> ranks_;
  std::optional<int> exit_code_;
  bool tearing_down_ = false;
  int interrupted_ = 0;                          // the signal that interrupted the job
  std::optional<Clock::time_point> kill_at_;     // escalate to SIGKILL at this time
  std::optional<Clock::time_point> abandon_at_;  // stop waiting for agents at this time
  bool start_timeout_checked_ = false;
  std::vector<std::thread> start_threads_;  // remote Start() calls; joined before Run returns
};

grpc::Status Job::OnRegister(const v1::RegisterRequest& req, const std::string& peer_address,
                             v1::RegisterReply* reply) {
  std::unique_lock<std::mutex> lock(reg_mu_);
  const int h = req.host_index();
  auto it = hosts_.find(h);
  if (it == hosts_.end()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "host index " + std::to_string(h) + " has no ranks in this job");
  }
  if (it->second.registered) {
    return grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "host already registered");
  }
  it->second.registered = true;
  it->second.hostname = req.hostname();
  it->second.peer_address = peer_address;
  it->second.service_target = req.service_target();
  it->second.free_port = req.free_port();
  spdlog::debug("agent for host {} ({}) registered from {}", options_.hosts[h].name, req.hostname(),
                peer_address);
  if (++registered_count_ == static_cast<int>(active_hosts_.size())) {
    BuildSpecsLocked();
    specs_ready_ = true;
    reg_cv_.notify_all();
  }
  if (!reg_cv_.wait_until(lock, start_deadline_, [&] { return specs_ready_ || reg_aborted_; })) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        "not every agent registered within the start timeout");
  }
  if (!specs_ready_) return grpc::Status(grpc::StatusCode::ABORTED, "the job was aborted");
  reply->set_job_id(job_id_);
  for (auto& spec : specs_[h]) *reply->add_ranks() = spec;
  reply->set_grace_ms(options_.grace_ms);
  reply->set_heartbeat_interval_ms(kHeartbeatIntervalMs);
  reply->set_heartbeat_timeout_ms(kHeartbeatTimeoutMs);
  return grpc::Status::OK;
}

// The address peers should use for `host`: what the launcher saw it connect from, except that
// a loopback address is useless to other machines, so in a job that spans machines the local
// host is named by the address the remote agents reached us on.
std::string Job::AddressOfLocked(int host) const {
  const std::string& seen = hosts_.at(host).peer_address;
  if (!IsLoopback(seen)) return seen;
  for (int h : active_hosts_) {
    const std::string& target = hosts_.at(h).service_target;
    std::string addr = target.substr(0, target.rfind(':'));
    if (!IsLoopback(hosts_.at(h).peer_address) && !addr.empty()) return addr;
  }
  return seen;
}

void Job::BuildSpecsLocked() {
  std::vector<std::string> launcher_env;
  for (char** e = environ; *e; ++e) launcher_env.emplace_back(*e);
  const int host0 = placement_[0].host_index;
  // The hosts of a job are taken to be alike: this machine's core count stands for each.
  const int host_cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  int threads_note = 0, threads_note_ranks = 0;
  for (const auto& p : placement_) {
    const HostState& hs = hosts_.at(p.host_index);
    JobContext ctx;
    ctx.job_id = job_id_;
    ctx.job_service = hs.service_target;
    ctx.secret = secret_;
    ctx.hostname = options_.hosts[p.host_index].name;
    ctx.host_addr = AddressOfLocked(p.host_index);
    ctx.master_addr = AddressOfLocked(host0);
    ctx.master_port = hosts_.at(host0).free_port;
    ctx.size = static_cast<int>(placement_.size());
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
    spec.set_cwd(cwd_);
    specs_[p.host_index].push_back(std::move(spec));
  }
  if (threads_note > 0) {
    std::fprintf(stderr,
                 "ringrun: %d ranks share a host's %d cores: OMP_NUM_THREADS, "
                 "OPENBLAS_NUM_THREADS and MKL_NUM_THREADS set to %d per rank (set one, or "
                 "-x OMP_NUM_THREADS=N, to choose)\n",
                 threads_note_ranks, host_cores, threads_note);
  }
}

void Job::StartAgents() {
  AgentLaunch base;
  base.service_port = port_;
  base.service_address = options_.launcher_address;
  base.secret = secret_;
  base.agent_path = agent_path_;
  base.log_level = options_.log_level;
  std::vector<int> remote;
  for (int h : active_hosts_) {
    if (IsLocalHost(options_.hosts[h].name)) {
      // Local agents are forked from this (the main) thread: PR_SET_PDEATHSIG follows the
      // thread that forked, and this one lives as long as the job.
      AgentLaunch launch = base;
      launch.host_index = h;
      if (IsLoopback(launch.service_address)) launch.service_address.clear();
      Event e;
      e.kind = Event::kStarted;
      e.host = h;
      if (starters_.local == nullptr) {
        e.why = "no local agent starter";
      } else {
        auto r = starters_.local->Start(options_.hosts[h], launch);
        if (r.ok())
          e.handle = std::move(r.value());
        else
          e.why = r.status().message();
      }
      Push(std::move(e));
    } else {
      remote.push_back(h);
    }
  }
  if (remote.empty()) return;
  // Remote hosts: a bounded pool of threads, each taking the next host.
  auto next = std::make_shared<std::atomic<size_t>>(0);
  int threads = std::max(1, std::min<int>(options_.ssh_fanout, static_cast<int>(remote.size())));
  for (int t = 0; t < threads; ++t) {
    start_threads_.emplace_back([this, remote, next, base] {
      for (size_t i; (i = next->fetch_add(1)) < remote.size();) {
        int h = remote[i];
        AgentLaunch launch = base;
        launch.host_index = h;
        Event e;
        e.kind = Event::kStarted;
        e.host = h;
        if (starters_.remote == nullptr) {
          e.why = options_.hosts[h].name + ": remote hosts are not supported by this build";
        } else {
          auto r = starters_.remote->Start(options_.hosts[h], launch);
          if (r.ok())
            e.handle = std::move(r.value());
          else
            e.why = r.status().message();
        }
        Push(std::move(e));
      }
    });
  }
}

void Job::SendAll(const v1::AgentCommand& cmd) {
  for (auto& [h, hs] : hosts_) {
    if (!hs.finished) service_->Send(h, cmd);
  }
}

void Job::Fail(int exit_code, const std::string& message) {
  if (exit_code_) return;
  exit_code_ = exit_code;
  output_->Flush();
  std::fprintf(stderr, "ringrun: %s\n", message.c_str());
  std::fflush(stderr);
  BeginTeardown(options_.grace_ms);
}

void Job::BeginTeardown(int grace_ms) {
  {
    std::lock_guard<std::mutex> lock(reg_mu_);
    reg_aborted_ = true;
    reg_cv_.notify_all();
  }
  if (rendezvous_) rendezvous_->Abort("the job is being torn down");
  v1::AgentCommand cmd;
  cmd.mutable_terminate()->set_grace_ms(grace_ms);
  cmd.mutable_terminate()->set_reason("job teardown");
  SendAll(cmd);
  tearing_down_ = true;
  auto abandon = Clock::now() + milliseconds(grace_ms + 3000);
  if (!abandon_at_ || abandon < *abandon_at_) abandon_at_ = abandon;
  // Hosts whose agent never registered cannot be told: end them now.
  for (auto& [h, hs] : hosts_) {
    if (!IsRegistered(h) && !hs.finished) {
      if (hs.handle) hs.handle->Kill();
      if (hs.start_done) HostFinished(h);
    }
  }
}

void Job::HostFinished(int host) {
  HostState& hs = hosts_.at(host);
  if (hs.finished) return;
  hs.finished = true;
}

void Job::HandleAgentEvent(int host, const v1::AgentEvent& ev) {
  const std::string& hostname = options_.hosts[host].name;
  switch (ev.event_case()) {
    case v1::AgentEvent::kStarted: {
      int r = ev.started().rank();
      if (r < 0 || r >= static_cast<int>(ranks_.size())) return;
      ranks_[r].started = true;
      ranks_[r].pid = ev.started().pid();
      break;
    }
    case v1::AgentEvent::kOutput: {
      const auto& o = ev.output();
      output_->Write(o.rank(), o.stream() == v1::AgentEvent::STDERR, o.data());
      break;
    }
    case v1::AgentEvent::kExited: {
      int r = ev.exited().rank();
      if (r < 0 || r >= static_cast<int>(ranks_.size())) return;
      ranks_[r].exited = true;
      ranks_[r].started = true;
      int code = ev.exited().exit_code();
      int sig = ev.exited().signal();
      if ((code != 0 || sig != 0) && !tearing_down_ && !interrupted_) {
        std::string what =
            sig ? "was killed by " + SignalName(sig) + " (signal " + std::to_string(sig) + ")"
                : "exited with code " + std::to_string(code);
        std::string msg = "rank " + std::to_string(r) + " on host " + hostname + " " + what;
        std::string tail = output_->StderrTail(r);
        if (!tail.empty()) {
          msg += "; the last lines of its stderr:";
          size_t start = 0;
          while (start < tail.size()) {
            size_t nl = tail.find('\n', start);
            msg += "\n  " + tail.substr(start, nl - start);
            start = nl + 1;
          }
        }
        Fail(sig ? 128 + sig : code, msg);
      }
      break;
    }
    case v1::AgentEvent::kSpawnFailed: {
      int r = ev.spawn_failed().rank();
      if (r >= 0 && r < static_cast<int>(ranks_.size())) {
        ranks_[r].exited = true;
        ranks_[r].started = true;
      }
      if (!tearing_down_ && !interrupted_) {
        int code = ev.spawn_failed().exit_code() ? ev.spawn_failed().exit_code() : 127;
        Fail(code, "rank " + std::to_string(r) + " on host " + hostname +
                       " could not start: " + ev.spawn_failed().message());
      }
      break;
    }
    default:
      break;
  }
}

void Job::Handle(Event& e) {
  switch (e.kind) {
    case Event::kAgent:
      HandleAgentEvent(e.host, e.agent);
      break;
    case Event::kStarted: {
      HostState& hs = hosts_.at(e.host);
      hs.start_done = true;
      if (e.handle) {
        hs.handle = std::move(e.handle);
        if (tearing_down_ && !IsRegistered(e.host)) {
          hs.handle->Kill();
          HostFinished(e.host);
        }
      } else {
        HostFinished(e.host);
        Fail(1, "could not start the agent on host " + options_.hosts[e.host].Display() + ": " +
                    e.why);
      }
      break;
    }
    case Event::kSessionEnded: {
      HostState& hs = hosts_.at(e.host);
      hs.session_ended = true;
      std::vector<int> missing;
      for (int r : hs.ranks) {
        if (!ranks_[r].exited) missing.push_back(r);
      }
      HostFinished(e.host);
      if (!missing.empty() && !tearing_down_ && !interrupted_) {
        std::string ranks;
        for (int r : missing) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
        std::string why = e.why.empty() ? "the agent closed its session early" : e.why;
        Fail(1, "lost the agent on host " + options_.hosts[e.host].name + ": " + why + " (ranks " +
                    ranks + " were still running)");
      }
      break;
    }
    case Event::kSignal: {
      int s = e.signo;
      if (s == SIGUSR1 || s == SIGUSR2) {
        v1::AgentCommand cmd;
        cmd.mutable_signal()->set_signo(s);
        SendAll(cmd);
        break;
      }
      if (interrupted_ || tearing_down_) {
        // A second interrupt: kill at once.
        std::fprintf(stderr, "ringrun: %s again: killing every rank now\n", SignalName(s).c_str());
        if (!interrupted_) interrupted_ = s;
        BeginTeardown(0);
        break;
      }
      interrupted_ = s;
      output_->Flush();
      std::fprintf(stderr,
                   "ringrun: %s received: forwarding it to every rank (SIGKILL in %d ms; "
                   "send it again to kill at once)\n",
                   SignalName(s).c_str(), options_.grace_ms);
      v1::AgentCommand cmd;
      cmd.mutable_signal()->set_signo(s == SIGHUP ? SIGTERM : s);
      SendAll(cmd);
      {
        std::lock_guard<std::mutex> lock(reg_mu_);
        reg_aborted_ = true;
        reg_cv_.notify_all();
      }
      for (auto& [h, hs] : hosts_) {
        if (!IsRegistered(h) && hs.handle) hs.handle->Kill();
        if (!IsRegistered(h) && hs.start_done) HostFinished(h);
      }
      kill_at_ = Clock::now() + milliseconds(options_.grace_ms);
      abandon_at_ = Clock::now() + milliseconds(options_.grace_ms + 3000);
      break;
    }
  }
}

void Job::Tick() {
  auto now = Clock::now();
  // Agents that died on their own (crashed, or were never found on the host).
  for (auto& [h, hs] : hosts_) {
    if (hs.finished || !hs.handle) continue;
    auto code = hs.handle->Poll();
    if (!code) continue;
    if (hs.session_ended) {
      HostFinished(h);
      continue;
    }
    HostFinished(h);
    if (tearing_down_ || interrupted_) continue;
    std::string name = options_.hosts[h].Display();
    std::string tail = hs.handle->StderrTail();
    if (*code == 127 && !IsRegistered(h)) {
      Fail(1, "ringrun-agent not found at " + agent_path_ + " on host " + name +
                  (tail.empty() ? "" : ": " + tail));
    } else {
      Fail(1, "the agent on host " + name + " exited with code " + std::to_string(*code) +
                  (IsRegistered(h) ? "" : " before registering") +
                  (tail.empty() ? "" : ": " + tail));
    }
  }
  if (!start_timeout_checked_ && now >= start_deadline_) {
    start_timeout_checked_ = true;
    if (!tearing_down_ && !interrupted_) {
      std::string missing;
      for (int h : active_hosts_) {
        const HostState& hs = hosts_.at(h);
        if (!IsRegistered(h)) {
          missing += (missing.empty() ? "" : "; ") + std::string("the agent on host ") +
                     options_.hosts[h].Display() + " did not register";
          continue;
        }
        for (int r : hs.ranks) {
          if (!ranks_[r].started) {
            missing += (missing.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
                       " on host " + options_.hosts[h].name + " did not start";
          }
        }
      }
      if (!missing.empty()) {
        Fail(1, "start timeout (" + std::to_string(options_.start_timeout_s) + " s): " + missing);
      }
    }
  }
  if (kill_at_ && now >= *kill_at_) {
    kill_at_.reset();
    v1::AgentCommand cmd;
    cmd.mutable_terminate()->set_grace_ms(0);
    cmd.mutable_terminate()->set_reason("grace period over");
    SendAll(cmd);
    tearing_down_ = true;
  }
  if (abandon_at_ && now >= *abandon_at_) {
    abandon_at_.reset();
    for (auto& [h, hs] : hosts_) {
      if (hs.finished) continue;
      spdlog::warn("host {}: the agent did not finish in time; killing it", options_.hosts[h].name);
      if (hs.handle) hs.handle->Kill();
      HostFinished(h);
    }
  }
}

bool Job::AllFinished() const {
  for (const auto& [h, hs] : hosts_) {
    if (!hs.finished) return false;
  }
  return true;
}

int Job::Run() {
  spdlog::debug("job starting");
  auto placed = PlaceRanks(options_.hosts, options_.np);
  if (!placed.ok()) {
    std::fprintf(stderr, "ringrun: %s\n", placed.status().message().c_str());
    return 2;
  }
  placement_ = std::move(placed.value());
  ranks_.resize(placement_.size());
  for (const auto& p : placement_) {
    if (hosts_[p.host_index].ranks.empty()) active_hosts_.push_back(p.host_index);
    hosts_[p.host_index].ranks.push_back(p.rank);
  }
  auto secret = GenerateSecret();
  auto job_id = GenerateSecret();
  if (!secret.ok() || !job_id.ok()) {
    std::fprintf(stderr, "ringrun: %s\n", secret.status().ToString().c_str());
    return 1;
  }
  secret_ = secret.value();
  job_id_ = job_id.value().substr(0, 12);
  agent_path_ = options_.agent_path.empty() ? DefaultAgentPath() : options_.agent_path;
  cwd_ = options_.wdir.empty() ? CurrentDir() : options_.wdir;

  OutputRouter::Config oc;
  oc.echo_to_console = hooks_.echo_to_console;
  oc.prefix_timestamp = options_.prefix_timestamp;
  oc.output_dir = options_.output_dir;
  oc.tail_lines = kStderrTailLines;
  oc.on_line = hooks_.on_line;
  output_ = std::make_unique<OutputRouter>(oc);
  if (Status st = output_->Open(static_cast<int>(placement_.size())); !st.ok()) {
    std::fprintf(stderr, "ringrun: %s\n", st.message().c_str());
    return 1;
  }

  // Signals go to one thread that turns them into events; every other thread blocks them.
  sigset_t sigs, old_mask;
  sigemptyset(&sigs);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) sigaddset(&sigs, s);
  pthread_sigmask(SIG_BLOCK, &sigs, &old_mask);
  struct sigaction ign {
  }, old_pipe{};
  ign.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ign, &old_pipe);
  std::atomic<bool> stop_signals{false};
  std::thread signal_thread([&] {
    timespec ts{0, 100 * 1000 * 1000};
    while (!stop_signals) {
      int s = sigtimedwait(&sigs, nullptr, &ts);
      if (s > 0 && !stop_signals) {
        Event e;
        e.kind = Event::kSignal;
        e.signo = s;
        Push(std::move(e));
      }
    }
  });

  bool all_local = true;
  for (int h : active_hosts_) all_local = all_local && IsLocalHost(options_.hosts[h].name);
  rendezvous_ = std::make_unique<Rendezvous>(static_cast<int>(placement_.size()), job_id_);
  service_ = std::make_unique<JobService>(secret_, this, rendezvous_.get(), kHeartbeatIntervalMs,
                                          kHeartbeatTimeoutMs);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(all_local ? "127.0.0.1:0" : "0.0.0.0:0",
                           grpc::InsecureServerCredentials(), &port_);
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  int rc = 1;
  if (!server || port_ == 0) {
    std::fprintf(stderr, "ringrun: could not start the job service\n");
  } else {
    spdlog::debug("job {}: job service on port {}, {} ranks on {} hosts", job_id_, port_,
                  placement_.size(), active_hosts_.size());
    start_deadline_ = Clock::now() + std::chrono::seconds(options_.start_timeout_s);
    StartAgents();
    auto next_tick = Clock::now();
    while (!AllFinished()) {
      std::deque<Event> batch;
      {
        std::unique_lock<std::mutex> lock(queue_mu_);
        queue_cv_.wait_until(lock, next_tick, [&] { return !queue_.empty(); });
        batch.swap(queue_);
      }
      for (auto& e : batch) Handle(e);
      output_->Flush();
      if (Clock::now() >= next_tick) {
        Tick();
        next_tick = Clock::now() + milliseconds(50);
      }
    }
    // Drain what arrived last (output racing the end of sessions).
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      for (auto& e : queue_) {
        if (e.kind == Event::kAgent) HandleAgentEvent(e.host, e.agent);
      }
      queue_.clear();
    }
    output_->Flush();
    spdlog::debug("every host finished");
    if (interrupted_)
      rc = interrupted_ == SIGINT ? 130 : 128 + interrupted_;
    else
      rc = exit_code_.value_or(0);
  }
  // Close everything: sessions, the server, then the agents themselves.
  {
    std::lock_guard<std::mutex> lock(reg_mu_);
    reg_aborted_ = true;
    reg_cv_.notify_all();
  }
  if (rendezvous_) rendezvous_->Abort("the job is over");
  if (service_) service_->Close();
  if (server) server->Shutdown(std::chrono::system_clock::now() + milliseconds(1000));
  auto give_up = Clock::now() + milliseconds(1000);
  for (auto& [h, hs] : hosts_) {
    if (!hs.handle) continue;
    while (!hs.handle->Poll() && Clock::now() < give_up)
      std::this_thread::sleep_for(milliseconds(1));
    hs.handle->Kill();
  }
  for (auto& t : start_threads_) t.join();
  {
    // Agents whose Start() returned after the loop ended.
    std::lock_guard<std::mutex> lock(queue_mu_);
    for (auto& e : queue_) {
      if (e.handle) e.handle->Kill();
    }
    queue_.clear();
  }
  hosts_.clear();
  stop_signals = true;
  pthread_kill(signal_thread.native_handle(), SIGUSR2);  // wakes sigtimedwait at once
  signal_thread.join();
  sigaction(SIGPIPE, &old_pipe, nullptr);
  spdlog::debug("job over");
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  return rc;
}

}  // namespace

int RunJob(const Options& options, const Starters& starters, const JobHooks& hooks) {
  Job job(options, starters, hooks);
  return job.Run();
}

}  // namespace ringrun::launcher
