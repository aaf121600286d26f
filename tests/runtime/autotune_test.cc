// Autotune in the engine: ranks as threads over loopback and shared memory. Rank 0 tunes; every
// rank must switch to the same settings at the same round, and results stay right throughout.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/runtime/engine_helpers.h"
#include "thread_job.h"

namespace ringrun::runtime::testing {
namespace {

using engine::Entry;
using engine::Kind;
using engine::TunedParams;

struct Applied {
  uint64_t round;
  TunedParams params;
};

// Trains `steps` steps of a few float allreduces (small ones fused, one of 512 KiB that runs
// from its own buffers) with autotune on, checking every result; returns the failures and fills
// what each rank applied and when.
std::string TrainTuned(const ThreadJobOptions& o, engine::AutotuneOptions a, int steps,
                       std::vector<std::vector<Applied>>* applied) {
  std::mutex mu;
  applied->assign(static_cast<size_t>(o.np), {});
  EngineSettings settings;
  settings.autotune = std::move(a);
  settings.autotune.enabled = true;
  // Every rank's engine is given these settings, so the callback tells the engines apart by
  // their threads, one list each (whose is which does not matter: all must be equal).
  std::map<std::thread::id, size_t> list_of;
  settings.autotune.applied = [&](uint64_t round, const TunedParams& p) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = list_of.emplace(std::this_thread::get_id(), list_of.size()).first;
    (*applied)[it->second].push_back({round, p});
  };
  const std::vector<size_t> counts = {1, 7, 300, 4096, 128 << 10};
  return RunThreadJob(
      o,
      [&](int rank, Runtime& rt, Failures& f) {
        std::vector<std::vector<float>> bufs(counts.size());
        for (int step = 0; step < steps; ++step) {
          std::vector<std::shared_ptr<engine::HandleState>> hs;
          for (size_t t = 0; t < counts.size(); ++t) {
            bufs[t].assign(counts[t], static_cast<float>(rank + step + t));
            Entry e;
            e.req.name = "grad." + std::to_string(t), e.req.kind = Kind::kAllreduce;
            e.req.dtype = RINGRUN_FLOAT32, e.req.op = RINGRUN_SUM, e.req.count = counts[t];
            e.send = bufs[t].data(), e.recv = bufs[t].data();
            std::string err;
            auto h = Submit(rt, e, &err);
            if (!h) {
              f.Add(rank, "step " + std::to_string(step) + ": " + err);
              return;
            }
            hs.push_back(std::move(h));
          }
          for (auto& h : hs) {
            std::string err = WaitOk(*h);
            if (!err.empty()) {
              f.Add(rank, "step " + std::to_string(step) + ": " + err);
              return;
            }
          }
          for (size_t t = 0; t < counts.size(); ++t) {
            // Sum over ranks of (rank + step + t).
            const float want =
                static_cast<float>(o.np * (o.np - 1) / 2 + o.np * (step + static_cast<int>(t)));
            for (float v : bufs[t]) {
              if (v != want) {
                f.Add(rank, "step " + std::to_string(step) + ": grad." + std::to_string(t) + " = " +
                                std::to_string(v) + ", want " + std::to_string(want));
                return;
              }
            }
          }
        }
      },
      settings);
}

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

void CheckAgreement(const std::vector<std::vector<Applied>>& applied) {
  // Every rank applied the same settings at the same rounds, ending with the final choice.
  REQUIRE(!applied.empty());
  REQUIRE(!applied[0].empty());
  for (size_t r = 1; r < applied.size(); ++r) {
    INFO("rank list " << r);
    REQUIRE(applied[r].size() == applied[0].size());
    for (size_t i = 0; i < applied[0].size(); ++i) {
      CHECK(applied[r][i].round == applied[0][i].round);
      CHECK(applied[r][i].params == applied[0][i].params);
    }
  }
}

engine::AutotuneOptions Knobs(int warmup, int steps_per_sample, int max_samples) {
  engine::AutotuneOptions a;
  a.warmup_samples = warmup;
  a.steps_per_sample = steps_per_sample;
  a.bayes_opt_max_samples = max_samples;
  return a;
}

// Trains np ranks (on `hosts`, or one host) with autotune, checks the results and that every
// rank applied the same settings at the same rounds, and returns what was applied.
std::vector<std::vector<Applied>> TrainAndAgree(int np, std::vector<std::string> hosts,
                                                engine::AutotuneOptions a, int steps) {
  ThreadJobOptions o;
  o.np = np;
  o.hosts = std::move(hosts);
  o.transport.spin = false;  // ranks are threads on a small machine
  std::vector<std::vector<Applied>> applied;
  std::string failures = TrainTuned(o, std::move(a), steps, &applied);
  INFO(failures);
  CHECK(failures.empty());
  CheckAgreement(applied);
  return applied;
}

}  // namespace

TEST_CASE("autotune: ranks switch settings at the same round, results stay right", "[engine]") {
  char dir[] = "/tmp/ringrun-autotune-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string log = std::string(dir) + "/autotune.csv";
  engine::AutotuneOptions a = Knobs(1, 1, 5);
  a.log_path = log;
  // (1 warmup + 5 joint trials) x (5 samples + 1): 36 steps tune; the rest run the choice.
  std::vector<std::vector<Applied>> applied = TrainAndAgree(2, {}, a, 60);
  // 4 new trials and the final choice (one host: no hierarchical trial).
  CHECK(applied[0].size() == 5);
  std::vector<std::string> lines = Lines(log);
  REQUIRE(lines.size() == 1 + 5 + 1);
  CHECK(lines[0] ==
        "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,"
        "cycle_time_ms,tensor_fusion_threshold,score");
  for (size_t i = 1; i < lines.size(); ++i) {
    INFO(lines[i]);
    CHECK(std::count(lines[i].begin(), lines[i].end(), ',') == 6);
    CHECK(lines[i].rfind("0,0,0,1,", 0) == 0);
  }
  CHECK(lines[1] == "0,0,0,1,0.002,64," + lines[1].substr(lines[1].rfind(',') + 1));
  std::system(("rm -rf " + std::string(dir)).c_str());
}

TEST_CASE("autotune: two hosts of two ranks also try hierarchical or flat", "[engine]") {
  engine::AutotuneOptions a = Knobs(0, 1, 2);
  a.tune_burst = false;
  std::vector<std::vector<Applied>> applied =
      TrainAndAgree(4, {"127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"}, a, 24);
  // The second test point, the other allreduce, then the final choice.
  REQUIRE(applied[0].size() == 3);
  CHECK(applied[0][1].params.hierarchical == false);  // the layout's default is hierarchical
  CHECK(applied[0][0].params.burst_quiet_ns == engine::kDefaultBurstQuietNs);
}

TEST_CASE("autotune: every knob given leaves nothing to tune, and the frames say so once",
          "[engine]") {
  engine::AutotuneOptions a;
  a.tune_fusion_threshold = false;
  a.tune_burst = false;
  a.tune_hierarchical = false;
  std::vector<std::vector<Applied>> applied = TrainAndAgree(2, {}, a, 3);
  REQUIRE(applied[0].size() == 1);  // the final "choice", the settings as given
  CHECK(applied[0][0].params.fusion_threshold == engine::kDefaultFusionThreshold);
}

}  // namespace ringrun::runtime::testing
