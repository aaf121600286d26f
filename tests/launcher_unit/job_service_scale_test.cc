// The job service with many agents: fake agents (launcher/starters/fake_agents.h) speak the real
// protocol over loopback to the real JobService, registering through a real AgentRegistry.
// Sessions are reactors, not threads: the process's thread count is asserted not to grow with
// the number of agents.

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "launcher/service/agent_registry.h"
#include "launcher/service/job_server.h"
#include "launcher/service/job_service.h"
#include "launcher/starters/fake_agents.h"

namespace ringrun::launcher::service {
namespace {

using std::chrono::milliseconds;

// One rank per host (rank = host index); registration through a real AgentRegistry, answered
// when every host has registered. Records what the job would react to.
class ScaleEvents final : public JobEvents {
 public:
  explicit ScaleEvents(int hosts)
      : registry_(AllHosts(hosts), SteadyClock().Now() + std::chrono::seconds(30), Build) {}

  bool OnRegisterAsync(const v1::RegisterRequest& req, const std::string& peer,
                       const RegisterDone& done) override {
    Registration reg;
    reg.peer_address = peer;
    if (grpc::Status st = registry_.Add(req.host_index(), reg); !st.ok()) {
      done(st, {});
      return true;
    }
    registry_.WhenRanks(req.host_index(), [done](grpc::Status st, std::vector<v1::RankSpec> ranks) {
      v1::RegisterReply reply;
      reply.set_job_id("scale");
      for (auto& r : ranks) *reply.add_ranks() = std::move(r);
      done(st, std::move(reply));
    });
    return true;
  }
  void OnAgentEvent(int host, const v1::AgentEvent& ev) override {
    MutexLock lock(&mu_);
    events_++;
    if (ev.has_exited() && ev.exited().exit_code() != 0 && first_failed_ < 0) {
      first_failed_ = host;
      cv_.SignalAll();
    }
  }
  void OnSessionEnded(int host, bool clean, const std::string& why) override {
    MutexLock lock(&mu_);
    ended_[host] = clean ? "" : why;
    cv_.SignalAll();
  }

  // Waits for the first failing rank's host; -1 after `ms`.
  int WaitFirstFailure(int ms) {
    MutexLock lock(&mu_);
    const auto deadline = SteadyClock().Now() + milliseconds(ms);
    while (first_failed_ < 0 && cv_.WaitUntil(&mu_, deadline)) {
    }
    return first_failed_;
  }
  // Waits until `n` Sessions have ended; returns host -> why ("" when clean).
  std::map<int, std::string> WaitEnded(size_t n, int ms) {
    MutexLock lock(&mu_);
    const auto deadline = SteadyClock().Now() + milliseconds(ms);
    while (ended_.size() < n && cv_.WaitUntil(&mu_, deadline)) {
    }
    return ended_;
  }
  int events() {
    MutexLock lock(&mu_);
    return events_;
  }

 private:
  static std::vector<int> AllHosts(int n) {
    std::vector<int> hosts(n);
    for (int i = 0; i < n; ++i) hosts[i] = i;
    return hosts;
  }
  static std::map<int, std::vector<v1::RankSpec>> Build(
      const std::map<int, Registration>& registered) {
    std::map<int, std::vector<v1::RankSpec>> specs;
    for (const auto& [host, reg] : registered) {
      v1::RankSpec spec;
      spec.set_rank(host);
      specs[host].push_back(spec);
    }
    return specs;
  }

  AgentRegistry registry_;
  Mutex mu_;
  CondVar cv_;
  int events_ GUARDED_BY(mu_) = 0;
  int first_failed_ GUARDED_BY(mu_) = -1;
  std::map<int, std::string> ended_ GUARDED_BY(mu_);
};

struct ScaleServer {
  ScaleServer(int hosts, int heartbeat_interval_ms, int heartbeat_timeout_ms)
      : events(hosts),
        service(secret, &events, nullptr, heartbeat_interval_ms, heartbeat_timeout_ms) {
    auto started = StartJobServer("127.0.0.1:0", service);
    REQUIRE(started.ok());
    server = std::move(started->server);
    port = started->port;
  }
  ~ScaleServer() {
    service.Close();
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  const std::string secret = std::string(64, 's');
  ScaleEvents events;
  JobService service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// `n` agents whose ranks run until told to stop, except host `fail` (-1: none), whose rank
// exits 3. Once the first failure is seen, every host is told to terminate, as the job does.
// Returns the process's threads while all `n` Sessions were open.
int RunAgents(int n, int fail) {
  ScaleServer s(n, 100, 5000);
  starters::FakeAgentScript script;
  script.ranks_exit = false;
  script.fail_host = fail;
  starters::FakeAgents agents(script);
  for (int h = 0; h < n; ++h) agents.Start(h, s.port, s.secret);

  // Every agent registers (answered together, once the last has), opens its Session and
  // reports its rank's start and a line of output.
  const int expected_events = 2 * n + (fail >= 0 ? 1 : 0);
  for (int i = 0; i < 1000 && s.events.events() < expected_events; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  REQUIRE(s.events.events() >= 2 * n);
  const int threads = starters::ProcessThreadCount();
  CHECK(s.service.open_sessions() >= n - 1);

  if (fail >= 0) {
    REQUIRE(s.events.WaitFirstFailure(10000) == fail);
  }
  v1::AgentCommand terminate;
  terminate.mutable_terminate()->set_grace_ms(100);
  terminate.mutable_terminate()->set_reason("rank failed");
  for (int h = 0; h < n; ++h) s.service.Send(h, terminate);

  REQUIRE(agents.WaitEnded(n, 20000));
  const auto ended = s.events.WaitEnded(n, 10000);
  CHECK(ended.size() == static_cast<size_t>(n));
  int unclean = 0, terminated = 0, register_failed = 0;
  for (const auto& [host, why] : ended) unclean += !why.empty();
  for (const auto& [host, r] : agents.ended()) {
    terminated += r.terminated;
    register_failed += !r.register_status.ok();
    CHECK(r.ranks == 1);
  }
  CHECK(unclean == 0);
  CHECK(register_failed == 0);
  // The failed host's agent half-closed after its rank exited; the others were terminated.
  CHECK(terminated >= n - 1);
  return threads;
}

TEST_CASE("job service: 200 agents stream, one fails, all are told to terminate",
          "[job_service][scale]") {
  RunAgents(200, 77);
}

TEST_CASE("job service: threads do not grow with the number of agents", "[job_service][scale]") {
  const int with_20 = RunAgents(20, -1);
  const int with_200 = RunAgents(200, -1);
  INFO("threads with 20 agents: " << with_20 << ", with 200: " << with_200);
  // A thread per agent (or two, as a synchronous Session had) would add 180 or more; gRPC's own
  // pools may grow by a few under load.
  CHECK(with_200 <= with_20 + 12);
}

TEST_CASE("job service: silent agents are dropped at the heartbeat timeout, the rest stay",
          "[job_service][scale]") {
  const int n = 50;
  ScaleServer s(n, 50, 400);
  starters::FakeAgentScript script;
  script.ranks_exit = false;
  script.silent_hosts = {3, 17, 42};
  starters::FakeAgents agents(script);
  for (int h = 0; h < n; ++h) agents.Start(h, s.port, s.secret);
  const auto dropped = s.events.WaitEnded(3, 10000);
  REQUIRE(dropped.size() == 3);
  for (const auto& [host, why] : dropped) {
    CHECK((host == 3 || host == 17 || host == 42));
    CHECK(why.find("no heartbeat") != std::string::npos);
  }
  std::this_thread::sleep_for(milliseconds(600));  // past another timeout: the others answer
  CHECK(s.events.WaitEnded(3, 0).size() == 3);
  CHECK(s.service.open_sessions() == n - 3);
  s.service.Close();  // the job is over: every Session ends, cleanly
  const auto ended = s.events.WaitEnded(n, 10000);
  CHECK(ended.size() == static_cast<size_t>(n));
  int clean = 0;
  for (const auto& [host, why] : ended) clean += why.empty();
  CHECK(clean == n - 3);
  CHECK(agents.WaitEnded(n, 10000));
}

}  // namespace
}  // namespace ringrun::launcher::service
