// The runtime's joining logic against a fake job service client (its notices to elastic ranks
// included), and the environment contract.
#include "runtime/src/runtime.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "ringrun/common/env_contract.h"

namespace ringrun::runtime {
namespace {

using namespace ringrun::runtime::transport;

// Collects every rank's JoinInfo and answers all once the last has joined (like the service).
class FakeJobService {
 public:
  explicit FakeJobService(int size) : size_(size) {}
  Result<PeerTable> Join(const JoinInfo& info) {
    std::unique_lock<std::mutex> lock(mu_);
    if (fail_) return PermissionDenied("wrong secret");
    infos_[info.rank] = info;
    if (static_cast<int>(infos_.size()) == size_) cv_.notify_all();
    if (!cv_.wait_for(lock, std::chrono::seconds(30),
                      [&] { return static_cast<int>(infos_.size()) == size_; })) {
      return Timeout("fake job service: rank " + std::to_string(info.rank) +
                     " waited 30 s for the others");
    }
    PeerTable t;
    t.job_id = "fake-job";
    for (auto& [rank, i] : infos_) {
      uint32_t idx = 0;
      while (idx < t.addresses.size() && t.addresses[idx] != i.address) ++idx;
      if (idx == t.addresses.size()) t.addresses.push_back(i.address);
      t.address_of_rank.push_back(idx);
      t.port_of_rank.push_back(i.port);
    }
    return t;
  }
  void set_fail(bool f) { fail_ = f; }

 private:
  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, JoinInfo> infos_;
  bool fail_ = false;
};

class FakeClient final : public JobClient {
 public:
  explicit FakeClient(FakeJobService* s) : s_(s) {}
  Result<PeerTable> Join(const JoinInfo& info, int) override {
    ++calls;
    return s_->Join(info);
  }
  int calls = 0;

 private:
  FakeJobService* s_;
};

std::function<const char*(const char*)> Env(std::map<std::string, std::string> m) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(m));
  return [shared](const char* n) -> const char* {
    auto it = shared->find(n);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

}  // namespace

TEST_CASE("no job environment: a job of size 1", "[runtime]") {
  Result<JobEnv> env = ReadJobEnv(Env({}));
  REQUIRE(env.ok());
  CHECK_FALSE(env->in_job);
  Result<std::unique_ptr<Runtime>> rt = Runtime::Join(*env, nullptr);
  REQUIRE(rt.ok());
  CHECK(rt.value()->shape().size == 1);
  CHECK(rt.value()->shape().rank == 0);
  float a[3] = {1, 2, 3}, b[3];
  REQUIRE(rt.value()->Allreduce(a, b, 3, RINGRUN_FLOAT32, RINGRUN_AVERAGE).ok());
  CHECK(b[2] == 3.0f);
  CHECK(rt.value()->Barrier().ok());
  CHECK(rt.value()->Broadcast(a, 3, RINGRUN_FLOAT32, 0).ok());
  CHECK(rt.value()->Broadcast(a, 3, RINGRUN_FLOAT32, 1).code() == Code::kInvalidArgument);
}

TEST_CASE("the environment contract is parsed and checked", "[runtime]") {
  Result<JobEnv> env = ReadJobEnv(Env({{env::kRank, "2"},
                                       {env::kSize, "4"},
                                       {env::kLocalRank, "0"},
                                       {env::kJobService, "127.0.0.1:5000"},
                                       {env::kSecret, "s"},
                                       {env::kHostAddr, "127.0.0.1"},
                                       {"RINGRUN_TIMEOUT_MS", "1500"},
                                       {"RINGRUN_DISABLE_SHM", "1"}}));
  REQUIRE(env.ok());
  CHECK(env->in_job);
  CHECK(env->rank == 2);
  CHECK(env->size == 4);
  CHECK(env->local_rank == 0);
  CHECK(env->local_size == -1);
  CHECK(env->timeout_ms == 1500);
  CHECK_FALSE(env->use_shm);
  CHECK(ReadJobEnv(Env({{env::kRank, "4"}, {env::kSize, "4"}, {env::kJobService, "x:1"}}))
            .status()
            .code() == Code::kInvalidArgument);
  CHECK(ReadJobEnv(Env({{env::kRank, "0"}})).status().code() == Code::kInvalidArgument);
  CHECK(ReadJobEnv(Env({{env::kRank, "0"}, {env::kSize, "2"}})).status().code() ==
        Code::kInvalidArgument);  // no job service
  Result<JobEnv> bad = ReadJobEnv(Env({{env::kRank, "x"}, {env::kSize, "2"}}));
  CHECK(bad.status().message().find("RINGRUN_RANK") != std::string::npos);
  // The engine's burst window: microseconds, 0 turns it off, a bad value names the variable.
  CHECK(ReadJobEnv(Env({}))->burst_quiet_ns == engine::kDefaultBurstQuietNs);
  CHECK(ReadJobEnv(Env({{"RINGRUN_BURST_QUIET_US", "0"}}))->burst_quiet_ns == 0);
  CHECK(ReadJobEnv(Env({{"RINGRUN_BURST_QUIET_US", "7.5"}}))->burst_quiet_ns == 7500);
  Result<JobEnv> bad_burst = ReadJobEnv(Env({{"RINGRUN_BURST_QUIET_US", "-1"}}));
  CHECK(bad_burst.status().message().find("RINGRUN_BURST_QUIET_US") != std::string::npos);
  CHECK(ReadJobEnv(Env({{"RINGRUN_BURST_QUIET_US", "1001"}})).status().code() ==
        Code::kInvalidArgument);
  // Spinning: unset is -1 (decided from the host's ranks and CPUs, or ringrun_init_with_spin).
  CHECK(ReadJobEnv(Env({}))->spin == -1);
  CHECK(ReadJobEnv(Env({{"RINGRUN_SPIN", "0"}}))->spin == 0);
  CHECK(ReadJobEnv(Env({{"RINGRUN_SPIN", "1"}}))->spin == 1);
  CHECK(ReadJobEnv(Env({{"RINGRUN_SPIN", "yield"}}))->spin == JobEnv::kYield);
}

TEST_CASE("same-host waits spin up to the CPU count and yield past it, unless told", "[runtime]") {
  auto waiting = [](int spin, int local_size, int cpus) {
    transport::TransportOptions t;
    SameHostWaiting(spin, local_size, cpus, &t);
    return std::string(t.spin ? "spin" : "") + (t.yield ? "yield" : "");
  };
  CHECK(waiting(-1, 2, 2) == "spin");
  CHECK(waiting(-1, 1, 2) == "spin");
  CHECK(waiting(-1, 3, 2) == "yield");  // oversubscribed
  CHECK(waiting(-1, 32, 2) == "yield");
  CHECK(waiting(0, 32, 2).empty());  // RINGRUN_SPIN=0, or the Python package: sleep at once
  CHECK(waiting(0, 2, 2).empty());
  CHECK(waiting(1, 32, 2) == "spin");
  CHECK(waiting(JobEnv::kYield, 2, 2) == "yield");
}

TEST_CASE("Horovod's variables set the same knobs, in Horovod's units, and ringrun's win",
          "[runtime]") {
  Result<JobEnv> e = ReadJobEnv(Env({{"HOROVOD_FUSION_THRESHOLD", "1048576"},
                                     {"HOROVOD_CACHE_CAPACITY", "0"},
                                     {"HOROVOD_CYCLE_TIME", "0.5"},
                                     {"HOROVOD_STALL_CHECK_DISABLE", "1"},
                                     {"HOROVOD_STALL_CHECK_TIME_SECONDS", "5"},
                                     {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "9"},
                                     {"HOROVOD_GLOO_TIMEOUT_SECONDS", "7"},
                                     {"HOROVOD_TIMELINE", "/tmp/t.json"},
                                     {"HOROVOD_LOG_LEVEL", "WARNING"},
                                     {"HOROVOD_LOG_HIDE_TIME", "1"},
                                     {"HOROVOD_HIERARCHICAL_ALLREDUCE", "0"}}));
  REQUIRE(e.ok());
  CHECK(e->fusion_threshold == 1048576);
  CHECK(e->cache_capacity == 0);
  CHECK(e->burst_quiet_ns == 500'000);  // 0.5 ms
  CHECK_FALSE(e->stall.enabled);
  CHECK(e->stall.warning_us == 5'000'000);
  CHECK(e->stall.shutdown_us == 9'000'000);
  CHECK(e->join_timeout_ms == 7000);
  CHECK(e->timeline == "/tmp/t.json");
  CHECK(e->log_level == "warn");
  CHECK(e->log_hide_time);
  CHECK(e->hierarchical_allreduce == 0);
  CHECK(e->knob_notes.empty());
  CHECK_FALSE(e->timeline_dynamic);
  CHECK_FALSE(e->timeline_mark_cycles);
  // DYNAMIC: no file until the program starts one (not a file named DYNAMIC), and said nowhere.
  e = ReadJobEnv(Env({{"HOROVOD_TIMELINE", "DYNAMIC"}, {"HOROVOD_TIMELINE_MARK_CYCLES", "1"}}));
  REQUIRE(e.ok());
  CHECK(e->timeline.empty());
  CHECK(e->timeline_dynamic);
  CHECK(e->timeline_mark_cycles);
  CHECK(e->knob_notes.empty());
  CHECK_FALSE(ReadJobEnv(Env({{"HOROVOD_TIMELINE_MARK_CYCLES", "yes"}})).ok());
  // ringrun's own names win.
  e = ReadJobEnv(Env({{"HOROVOD_FUSION_THRESHOLD", "1"},
                      {"RINGRUN_FUSION_THRESHOLD", "2"},
                      {"HOROVOD_STALL_CHECK_DISABLE", "1"},
                      {"RINGRUN_STALL_CHECK", "1"},
                      {"HOROVOD_CYCLE_TIME", "0.5"},
                      {"RINGRUN_BURST_QUIET_US", "3"},
                      {"HOROVOD_LOG_LEVEL", "FATAL"},
                      {"RINGRUN_LOG_LEVEL", "debug"}}));
  REQUIRE(e.ok());
  CHECK(e->fusion_threshold == 2);
  CHECK(e->stall.enabled);
  CHECK(e->burst_quiet_ns == 3000);
  CHECK(e->log_level == "debug");
  // Every Horovod level name, in any case.
  for (auto [in, out] : std::vector<std::pair<std::string, std::string>>{{"TRACE", "trace"},
                                                                         {"debug", "debug"},
                                                                         {"Info", "info"},
                                                                         {"WARNING", "warn"},
                                                                         {"ERROR", "err"},
                                                                         {"FATAL", "critical"}}) {
    INFO(in);
    CHECK(ReadJobEnv(Env({{"HOROVOD_LOG_LEVEL", in}}))->log_level == out);
  }
  Result<JobEnv> bad = ReadJobEnv(Env({{"HOROVOD_LOG_LEVEL", "LOUD"}}));
  CHECK(bad.status().message().find("HOROVOD_LOG_LEVEL='LOUD'") != std::string::npos);
  bad = ReadJobEnv(Env({{"HOROVOD_CYCLE_TIME", "soon"}}));
  CHECK(bad.status().message().find("HOROVOD_CYCLE_TIME") != std::string::npos);
  // A cycle time past the engine's longest window is cut to it, and said.
  e = ReadJobEnv(Env({{"HOROVOD_CYCLE_TIME", "5"}}));
  REQUIRE(e.ok());
  CHECK(e->burst_quiet_ns == 1'000'000);
  REQUIRE(e->knob_notes.size() == 1);
  CHECK(e->knob_notes[0].find("HOROVOD_CYCLE_TIME=5") != std::string::npos);
}

TEST_CASE("HOROVOD_AUTOTUNE and its knobs, a knob given is not tuned", "[runtime]") {
  Result<JobEnv> e = ReadJobEnv(Env({}));
  REQUIRE(e.ok());
  CHECK_FALSE(e->autotune.enabled);
  CHECK(e->autotune.warmup_samples == 3);  // Horovod's defaults
  CHECK(e->autotune.steps_per_sample == 10);
  CHECK(e->autotune.bayes_opt_max_samples == 20);
  CHECK(e->autotune.gaussian_process_noise == 0.8);
  CHECK(e->autotune.tune_fusion_threshold);
  CHECK(e->autotune.tune_burst);
  CHECK(e->autotune.tune_hierarchical);
  e = ReadJobEnv(Env({{"HOROVOD_AUTOTUNE", "1"},
                      {"HOROVOD_AUTOTUNE_LOG", "/tmp/at.csv"},
                      {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "0"},
                      {"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "4"},
                      {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "7"},
                      {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.5"},
                      {"HOROVOD_FUSION_THRESHOLD", "1048576"},
                      {"HOROVOD_CYCLE_TIME", "0.01"},
                      {"HOROVOD_HIERARCHICAL_ALLREDUCE", "1"}}));
  REQUIRE(e.ok());
  CHECK(e->knob_notes.empty());
  CHECK(e->autotune.enabled);
  CHECK(e->autotune.log_path == "/tmp/at.csv");
  CHECK(e->autotune.warmup_samples == 0);
  CHECK(e->autotune.steps_per_sample == 4);
  CHECK(e->autotune.bayes_opt_max_samples == 7);
  CHECK(e->autotune.gaussian_process_noise == 0.5);
  CHECK_FALSE(e->autotune.tune_fusion_threshold);
  CHECK_FALSE(e->autotune.tune_burst);
  CHECK_FALSE(e->autotune.tune_hierarchical);
  CHECK(ReadJobEnv(Env({{"HOROVOD_AUTOTUNE", "1"}})).value().autotune.tune_burst);
  CHECK_FALSE(ReadJobEnv(Env({{"HOROVOD_AUTOTUNE", "on"}})).ok());
  CHECK_FALSE(ReadJobEnv(Env({{"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "0"}})).ok());
  CHECK_FALSE(ReadJobEnv(Env({{"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "2"}})).ok());
  CHECK_FALSE(ReadJobEnv(Env({{"RINGRUN_BURST_QUIET_US", "5"}})).value().autotune.tune_burst);
  CHECK(ReadJobEnv(Env({{"HOROVOD_AUTOTUNE", "0"}})).value().knob_notes.empty());
}

TEST_CASE("a Horovod variable that means nothing here is said, not ignored", "[runtime]") {
  Result<JobEnv> e = ReadJobEnv(Env({{"HOROVOD_THREAD_AFFINITY", "1"},
                                     {"HOROVOD_NUM_NCCL_STREAMS", "2"},
                                     {"HOROVOD_TORUS_ALLREDUCE", "1"},
                                     {"HOROVOD_AUTOTUNE", "1"},    // honoured
                                     {"HOROVOD_ELASTIC", "1"}}));  // honoured (ringrun.torch)
  REQUIRE(e.ok());
  std::string all;
  for (const std::string& n : e->knob_notes) all += n + "\n";
  INFO(all);
  CHECK(e->knob_notes.size() == 3);
  CHECK(all.find("HOROVOD_THREAD_AFFINITY=1 has no effect") != std::string::npos);
  CHECK(all.find("HOROVOD_NUM_NCCL_STREAMS=2 has no effect") != std::string::npos);
  CHECK(all.find("HOROVOD_TORUS_ALLREDUCE=1 has no effect: there is no torus allreduce") !=
        std::string::npos);
  CHECK(all.find("HOROVOD_ELASTIC") == std::string::npos);
}

TEST_CASE("ranks join through the job client once and then communicate", "[runtime]") {
  constexpr int kSize = 3;
  FakeJobService service(kSize);
  std::vector<std::unique_ptr<Runtime>> rts(kSize);
  std::vector<Status> errors(kSize);
  std::vector<int> calls(kSize);
  std::vector<std::thread> threads;
  for (int r = 0; r < kSize; ++r) {
    threads.emplace_back([&, r] {
      JobEnv env;
      env.in_job = true, env.rank = r, env.size = kSize, env.job_service = "fake";
      env.secret = "fake-job-secret";
      env.timeout_ms = 10000;
      FakeClient client(&service);
      Result<std::unique_ptr<Runtime>> rt = Runtime::Join(env, &client);
      calls[r] = client.calls;
      if (!rt.ok()) {
        errors[r] = rt.status();
        return;
      }
      rts[r] = std::move(rt.value());
      int64_t v = r + 1;
      errors[r] = rts[r]->Allreduce(&v, &v, 1, RINGRUN_INT64, RINGRUN_SUM);
      if (errors[r].ok() && v != 6) errors[r] = Internal("wrong sum");
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kSize; ++r) {
    INFO(errors[r].ToString());
    CHECK(errors[r].ok());
    CHECK(calls[r] == 1);
    REQUIRE(rts[r]);
    CHECK(rts[r]->shape().local_size == kSize);
    CHECK(rts[r]->shape().local_rank == r);
    CHECK(rts[r]->shape().cross_size == 1);
  }
}

TEST_CASE("a failed join is an error naming the rank", "[runtime]") {
  FakeJobService service(2);
  service.set_fail(true);
  FakeClient client(&service);
  JobEnv env;
  env.in_job = true, env.rank = 1, env.size = 2, env.job_service = "fake";
  Result<std::unique_ptr<Runtime>> rt = Runtime::Join(env, &client);
  REQUIRE_FALSE(rt.ok());
  CHECK(rt.status().code() == Code::kPermissionDenied);
  CHECK(rt.status().message().find("rank 1") != std::string::npos);
}

// An elastic job's service for the ranks that join it through ElasticClient: generation 1 of
// `size` workers, each on the host of its address; and the Watches they open, by worker.
class FakeElasticService {
 public:
  explicit FakeElasticService(int size) : size_(size) {}
  // Publishes a rank that never speaks (a frozen process): its listener is bound, never served.
  void AddFrozen(int worker, const std::string& address, uint16_t port) {
    JoinInfo info;
    info.worker_id = worker, info.address = address, info.port = port;
    (void)Join(info, /*wait=*/false);
  }
  Result<PeerTable> Join(const JoinInfo& info, bool wait = true) {
    std::unique_lock<std::mutex> lock(mu_);
    infos_[info.worker_id] = info;
    cv_.notify_all();
    if (!wait) return PeerTable{};
    if (!cv_.wait_for(lock, std::chrono::seconds(30),
                      [&] { return static_cast<int>(infos_.size()) == size_; })) {
      return Timeout("fake elastic service: the others did not join within 30 s");
    }
    PeerTable t;
    t.job_id = "fake-elastic-job";
    t.generation = 1;
    t.data_secret = std::string(64, 'd');
    t.membership_epoch = 1;
    for (auto& [worker, i] : infos_) {
      t.addresses.push_back(i.address);
      t.address_of_rank.push_back(static_cast<uint32_t>(t.addresses.size() - 1));
      t.port_of_rank.push_back(i.port);
      t.worker_of_rank.push_back(worker);
      t.host_of_rank.push_back("h" + std::to_string(worker));
    }
    return t;
  }
  // One Watch of `worker`; withdrawn when the watch is destroyed.
  class Watch final : public MembershipWatch {
   public:
    Watch(FakeElasticService* s, int worker) : s_(s), worker_(worker) {}
    ~Watch() override {
      std::lock_guard<std::mutex> lock(s_->mu_);
      s_->watches_.erase(worker_);
    }

   private:
    FakeElasticService* s_;
    int worker_;
  };
  std::unique_ptr<MembershipWatch> OpenWatch(int worker, uint32_t generation,
                                             JobClient::OnNotice on_notice) {
    std::lock_guard<std::mutex> lock(mu_);
    watches_[worker] = std::move(on_notice);
    generations_[worker] = generation;
    cv_.notify_all();
    return std::make_unique<Watch>(this, worker);
  }
  // Waits until `workers` have their Watch open (30 s at most).
  bool WaitForWatches(const std::set<int>& workers) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] {
      for (int w : workers) {
        if (!watches_.count(w)) return false;
      }
      return true;
    });
  }
  // Sends `n` to every open Watch (as the service's thread would, one call at a time).
  void Notify(const MembershipNotice& n) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [worker, f] : watches_) f(n);
  }
  size_t open_watches() {
    std::lock_guard<std::mutex> lock(mu_);
    return watches_.size();
  }
  uint32_t generation_of(int worker) {
    std::lock_guard<std::mutex> lock(mu_);
    return generations_[worker];
  }

 private:
  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, JoinInfo> infos_;
  std::map<int, JobClient::OnNotice> watches_;
  std::map<int, uint32_t> generations_;
};

class ElasticClient final : public JobClient {
 public:
  explicit ElasticClient(FakeElasticService* s) : s_(s) {}
  Result<PeerTable> Join(const JoinInfo& info, int) override { return s_->Join(info); }
  std::unique_ptr<MembershipWatch> Watch(int worker, uint32_t generation, uint64_t,
                                         OnNotice on_notice) override {
    return s_->OpenWatch(worker, generation, std::move(on_notice));
  }

 private:
  FakeElasticService* s_;
};

TEST_CASE("a broken generation fails a collective stuck on a frozen peer, not at the timeout",
          "[runtime][elastic]") {
  // Workers 0 and 1 are runtimes; worker 2 joined and froze: its listener accepts connections
  // and never answers, as a stopped process's does. The survivors' allreduce is stuck on it
  // until the job service says that generation 1 is broken.
  constexpr int kSize = 3;
  FakeElasticService service(kSize);
  Result<Listener> frozen = Listen("127.0.0.3");
  REQUIRE(frozen.ok());
  service.AddFrozen(2, "127.0.0.3", frozen->port);
  std::vector<std::unique_ptr<Runtime>> rts(2);
  std::vector<Status> errors(2);
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      JobEnv env;
      env.in_job = true, env.rank = w, env.size = kSize, env.job_service = "fake";
      env.secret = "fake-job-secret";
      env.elastic = true, env.worker_id = w, env.generation = 1;
      env.host_addr = w == 0 ? "127.0.0.1" : "127.0.0.2";
      env.timeout_ms = 30000;  // the failure to fix would take this long
      ElasticClient client(&service);
      Result<std::unique_ptr<Runtime>> rt = Runtime::Join(env, &client);
      if (!rt.ok()) {
        errors[w] = rt.status();
        return;
      }
      rts[w] = std::move(rt.value());
      double v = 1;
      errors[w] = rts[w]->Allreduce(&v, &v, 1, RINGRUN_FLOAT64, RINGRUN_SUM);
    });
  }
  REQUIRE(service.WaitForWatches({0, 1}));
  CHECK(service.generation_of(0) == 1);
  MembershipNotice epoch;
  epoch.membership_epoch = 7;
  service.Notify(epoch);
  MembershipNotice broken;
  broken.broken_generation = 1;
  broken.reason = "lost the agent on host h2: no heartbeat from the agent for 10 s";
  service.Notify(broken);
  for (auto& t : threads) t.join();
  for (int w = 0; w < 2; ++w) {
    INFO("worker " << w << ": " << errors[w].ToString());
    REQUIRE(rts[w]);
    CHECK(errors[w].code() == Code::kUnavailable);
    CHECK_THAT(errors[w].message(),
               Catch::Contains("generation 1 of the job is broken: lost the agent on host h2: no "
                               "heartbeat from the agent for 10 s"));
    CHECK(rts[w]->membership_epoch() == 7);
    // Later collectives of the generation fail the same way.
    double v = 1;
    CHECK(rts[w]->Allreduce(&v, &v, 1, RINGRUN_FLOAT64, RINGRUN_SUM).code() == Code::kUnavailable);
  }
  // Shutdown withdraws the Watch: no notice reaches a runtime that is shut down.
  for (auto& rt : rts) rt->Shutdown();
  CHECK(service.open_watches() == 0);
}

}  // namespace ringrun::runtime
