// The autotuner alone (engine/tuner.h): a made-up training loop whose step time depends on the
// settings, on a made-up clock, so every trial, score and choice is known in advance.
#include "runtime/src/engine/tuner.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace ringrun::runtime::engine {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

std::vector<std::string> Split(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream s(line);
  std::string f;
  while (std::getline(s, f, ',')) out.push_back(f);
  return out;
}

struct Run {
  std::vector<std::string> csv;
  std::vector<TunedParams> trials;  // the settings of each trial, in order (warmup included)
  TunedParams final_params;
  int steps = 0;
  std::vector<double> scores;
};

// Trains until the tuner is done: each step submits three tensors (8 MB in all) in one round,
// and takes step_us(settings) on the clock.
Run Train(const AutotuneOptions& o, TunedParams initial, bool hierarchical_possible,
          const std::function<double(const TunedParams&)>& step_us, int max_steps = 100000) {
  Run run;
  Tuner t(o, initial, hierarchical_possible, true,
          [&](const std::string& line) { run.csv.push_back(line); });
  double now = 1e6;
  run.trials.push_back(t.current());
  while (t.active() && run.steps < max_steps) {
    const auto at = static_cast<int64_t>(now);
    t.Observe("grad.a", 4 * kMiB, at);
    t.Observe("grad.b", 3 * kMiB, at);
    t.Observe("grad.c", 1 * kMiB, at);
    if (t.EndRound()) run.trials.push_back(t.current());
    now += step_us(t.current());
    ++run.steps;
  }
  run.final_params = t.current();
  run.scores = t.scores();
  return run;
}

TunedParams Defaults() { return TunedParams{64 * kMiB, 2000, false}; }

// Horovod's knobs for a test, with the hierarchical knob given (not tuned) unless asked.
AutotuneOptions Knobs(int warmup, int steps_per_sample, int max_samples,
                      bool hierarchical = false) {
  AutotuneOptions o;
  o.warmup_samples = warmup;
  o.steps_per_sample = steps_per_sample;
  o.bayes_opt_max_samples = max_samples;
  o.tune_hierarchical = hierarchical;
  return o;
}

// Fastest at 8 MiB and 16 us; 10 ms a step at best.
double Bowl(const TunedParams& p) {
  const double mib = static_cast<double>(p.fusion_threshold) / kMiB;
  const double us = static_cast<double>(p.burst_quiet_ns) / 1000;
  return 10000 + 40 * std::fabs(mib - 8) + 30 * std::fabs(us - 16);
}

}  // namespace

TEST_CASE("tuner: warmup, trials of five samples, Horovod's CSV, the best kept", "[autotune]") {
  AutotuneOptions o = Knobs(2, 3, 6);
  Run run = Train(o, Defaults(), false, Bowl);
  // 2 warmup trials and 6 scored ones; each trial is 5 samples of 3 steps, and its end is seen
  // at the first tensor of the step after, which is not measured (the next trial's settings
  // apply from the next round).
  REQUIRE(run.scores.size() == 6);
  CHECK(run.steps == 8 * (5 * 3 + 1));
  // The warmup runs the job's own settings; then the first scored trial is them too.
  REQUIRE(run.trials.size() >= 2);
  CHECK(run.trials[0] == Defaults());
  CHECK(run.trials[1] != Defaults());  // the second test point: 4 MiB, 8 us
  CHECK(run.trials[1].fusion_threshold == 4 * kMiB);
  CHECK(run.trials[1].burst_quiet_ns == 8000);
  // Header, one line per scored trial, and the best again at the end.
  REQUIRE(run.csv.size() == 1 + 6 + 1);
  CHECK(run.csv[0] == kAutotuneCsvHeader);
  CHECK(run.csv[0] ==
        "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,"
        "cycle_time_ms,tensor_fusion_threshold,score");
  for (size_t i = 1; i < run.csv.size(); ++i) {
    std::vector<std::string> f = Split(run.csv[i]);
    REQUIRE(f.size() == 7);
    CHECK(f[0] == "0");
    CHECK(f[3] == "1");
  }
  // The first scored trial: 64 MiB and 2 us, at 8 MB per step of Bowl's time.
  CHECK(run.csv[1] == AutotuneCsvLine(Defaults(), true, 8.0 * kMiB / Bowl(Defaults())));
  CHECK(Split(run.csv[1])[4] == "0.002");
  CHECK(Split(run.csv[1])[5] == "64");
  // The final choice is the best scored trial, and the last line names it.
  const size_t best = std::max_element(run.scores.begin(), run.scores.end()) - run.scores.begin();
  CHECK(run.final_params == run.trials[best]);
  CHECK(run.csv.back() == AutotuneCsvLine(run.final_params, true, run.scores[best]));
  CHECK(run.final_params == run.trials.back());
}

TEST_CASE("tuner: the same measurements give the same trials", "[autotune]") {
  AutotuneOptions o = Knobs(0, 1, 12, true);
  Run a = Train(o, Defaults(), true, Bowl);
  Run b = Train(o, Defaults(), true, Bowl);
  CHECK(a.csv == b.csv);
  CHECK(a.final_params == b.final_params);
}

TEST_CASE("tuner: the optimizer finds better settings than every test point", "[autotune]") {
  AutotuneOptions o = Knobs(0, 1, 20);
  Run run = Train(o, Defaults(), false, Bowl);
  REQUIRE(run.scores.size() == 20);
  const double test_points_best = *std::max_element(run.scores.begin(), run.scores.begin() + 4);
  const double best = *std::max_element(run.scores.begin(), run.scores.end());
  CHECK(best > test_points_best);
  // Within 4 MiB and 8 us of the optimum, where a step costs at most 4% more than at best.
  CHECK(Bowl(run.final_params) < 10400);
}

TEST_CASE("tuner: hierarchical or flat, then the best, given knobs stay", "[autotune]") {
  AutotuneOptions o = Knobs(0, 2, 20, true);
  o.tune_fusion_threshold = false;
  o.tune_burst = false;
  TunedParams start = Defaults();
  start.hierarchical = true;
  auto flat_faster = [](const TunedParams& p) { return p.hierarchical ? 12000.0 : 10000.0; };
  Run run = Train(o, start, true, flat_faster);
  REQUIRE(run.scores.size() == 2);  // as given, then flipped
  CHECK(run.trials[1].hierarchical == false);
  CHECK(run.final_params.hierarchical == false);
  CHECK(run.final_params.fusion_threshold == start.fusion_threshold);
  CHECK(run.final_params.burst_quiet_ns == start.burst_quiet_ns);
  // Where the layout has no hierarchical path, nothing is left to tune: no trial, no log.
  Run none = Train(o, start, false, flat_faster);
  CHECK(none.steps == 0);
  CHECK(none.csv.empty());
  CHECK(none.final_params == start);
}

TEST_CASE("tuner: only the burst window free: thresholds stay as given", "[autotune]") {
  AutotuneOptions o = Knobs(0, 1, 8);
  o.tune_fusion_threshold = false;
  Run run = Train(o, Defaults(), false, Bowl);
  CHECK(run.scores.size() == 8);
  for (const TunedParams& p : run.trials) CHECK(p.fusion_threshold == 64 * kMiB);
  CHECK(std::llabs(run.final_params.burst_quiet_ns - 16000) <= 4000);
}

TEST_CASE("tuner: a name that never repeats ends no sample", "[autotune]") {
  AutotuneOptions o = Knobs(0, 1, 20);
  Tuner t(o, Defaults(), false, true, nullptr);
  for (int i = 0; i < 100; ++i) {
    t.Observe("noname." + std::to_string(i), 1000, 1000 * i);
    CHECK_FALSE(t.EndRound());
  }
  CHECK(t.scores().empty());
  CHECK(t.current() == Defaults());
}

TEST_CASE("bayesian optimizer: a smooth bump in one dimension", "[autotune]") {
  BayesianOptimizer bo({{0, 10}}, 0.01);
  auto f = [](double x) { return -(x - 7.3) * (x - 7.3); };
  for (double x : {1.0, 5.0, 9.0}) bo.Add({x}, f(x));
  double best_x = 0, best = -1e9;
  for (int i = 0; i < 10; ++i) {
    const double x = bo.Next()[0];
    bo.Add({x}, f(x));
    if (f(x) > best) best = f(x), best_x = x;
  }
  CHECK(std::fabs(best_x - 7.3) < 0.3);
  const auto [mu, sigma] = bo.Predict({7.3});
  CHECK(std::fabs(mu - 0) < 1.0);
  CHECK(sigma < 1.0);
}

}  // namespace ringrun::runtime::engine
