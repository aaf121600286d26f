// Autotuning (HOROVOD_AUTOTUNE): during the first steps of training, rank 0 tries settings of
// the engine's knobs, scores each by the bytes its collectives reduced per microsecond, and
// keeps the best, as Horovod's ParameterManager does (docs/engine.md, "Autotune").
//
// Who decides. Only rank 0 holds a Tuner; it times rounds on its own clock. What it decides
// travels in rank 0's negotiation frame and every rank applies it at the same round
// (Engine::Round), so no rank ever times anything for the choice. The Tuner itself knows nothing
// of the engine: it is fed the names and bytes of the responses each round ran, and the time,
// so tests drive it with a made-up clock and score.
//
// Not thread-safe: the engine thread is its only user.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ringrun::runtime::engine {

// The knobs the tuner sets. Every rank runs with the same ones from the same round on.
struct TunedParams {
  size_t fusion_threshold = 0;  // bytes (EngineOptions::fusion_threshold)
  int64_t burst_quiet_ns = 0;   // EngineOptions::burst_quiet_ns
  bool hierarchical = false;    // EngineOptions::hierarchical
  bool operator==(const TunedParams& o) const {
    return fusion_threshold == o.fusion_threshold && burst_quiet_ns == o.burst_quiet_ns &&
           hierarchical == o.hierarchical;
  }
  bool operator!=(const TunedParams& o) const { return !(*this == o); }
};

// Horovod's knobs and defaults (horovod/common/parameter_manager.cc), and which of the
// engine's knobs are free: one the user set stays as set, as in Horovod.
struct AutotuneOptions {
  bool enabled = false;                 // HOROVOD_AUTOTUNE
  std::string log_path;                 // HOROVOD_AUTOTUNE_LOG: rank 0's CSV; "" none
  int warmup_samples = 3;               // HOROVOD_AUTOTUNE_WARMUP_SAMPLES: trials discarded first
  int steps_per_sample = 10;            // HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE
  int bayes_opt_max_samples = 20;       // HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES: joint trials
  double gaussian_process_noise = 0.8;  // HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE
  bool tune_fusion_threshold = true;    // RINGRUN_/HOROVOD_FUSION_THRESHOLD unset
  bool tune_burst = true;               // RINGRUN_BURST_QUIET_US, HOROVOD_CYCLE_TIME unset
  bool tune_hierarchical = true;        // HOROVOD_HIERARCHICAL_ALLREDUCE unset
  // Tests: called on every rank's engine thread with the round (Controller::round) at which
  // that rank starts running with new settings.
  std::function<void(uint64_t round, const TunedParams&)> applied;
};

// The search ranges: fusion threshold in MiB (Horovod's), burst window in microseconds (the
// window gathers for at most 32 of them; longer ones only add latency to a lone tensor).
inline constexpr double kTuneMaxFusionMiB = 64;
inline constexpr double kTuneMaxBurstUs = 64;
// Samples per trial: a trial's score is the median of this many (Horovod's SAMPLES).
inline constexpr int kSamplesPerTrial = 5;

// Bayesian optimization over a box, maximizing: a Gaussian process (squared-exponential
// kernel over coordinates scaled to [0, 1], observations standardized, `noise` added to the
// kernel's diagonal) and expected improvement, maximized over a fixed grid of candidates, so
// the same observations always give the same next point.
class BayesianOptimizer {
 public:
  BayesianOptimizer(std::vector<std::pair<double, double>> bounds, double noise);
  void Add(const std::vector<double>& x, double y);
  // The candidate with the highest expected improvement over the best observation (the
  // box's centre before any).
  std::vector<double> Next() const;
  // The posterior mean and standard deviation at x (in the observations' units).
  std::pair<double, double> Predict(const std::vector<double>& x) const;
  size_t samples() const { return ys_.size(); }

 private:
  std::vector<double> Unit(const std::vector<double>& x) const;
  // Fits the process to the observations: alpha_ = K^-1 y (standardized), chol_ = K's factor.
  void Fit() const;
  const std::vector<std::pair<double, double>> bounds_;
  const double noise_;
  std::vector<std::vector<double>> xs_;  // in [0, 1]^d
  std::vector<double> ys_;
  mutable bool fitted_ = false;
  mutable std::vector<double> chol_, alpha_;
  mutable double mean_ = 0, scale_ = 1;
};

class Tuner {
 public:
  // `initial`: the settings the job started with (the first trial, so the best found is never
  // worse than them by more than the noise of a measurement). `hierarchical_possible`: the
  // layout allows a hierarchical allreduce (else that knob stays). `csv`: receives each line
  // of Horovod's autotune log (header first), or is empty.
  Tuner(const AutotuneOptions& options, TunedParams initial, bool hierarchical_possible,
        bool cache_enabled, std::function<void(const std::string&)> csv);

  // Whether trials are still running; once false, current() is the best found, for good.
  bool active() const { return active_; }
  // The settings to run with now.
  const TunedParams& current() const { return current_; }

  // A response that ran in the round that started at `now_us`: its name and the bytes it
  // moved. As in Horovod, a sample ends when some name has been seen steps_per_sample more
  // times (one step of training submits each name once; made-up names never repeat), and a
  // trial ends after kSamplesPerTrial samples, scored by their median.
  void Observe(std::string_view name, uint64_t bytes, int64_t now_us);
  // After a round's Observe calls: whether current() changed since the last call (the next
  // trial, or the final choice), which the caller then carries to every rank.
  bool EndRound() {
    skip_round_ = false;
    return std::exchange(changed_, false);
  }

  // The scores of the finished trials (after warmup), in order; for tests.
  const std::vector<double>& scores() const { return scores_; }

 private:
  void EndTrial(double score);
  void Log(const TunedParams& p, double score);
  TunedParams FromPoint(const std::vector<double>& x) const;
  std::vector<double> ToPoint(const TunedParams& p) const;

  const AutotuneOptions options_;
  const bool hierarchical_possible_;
  const bool tune_hierarchical_;
  const bool cache_enabled_;
  const std::function<void(const std::string&)> csv_;
  std::vector<std::pair<double, double>> bounds_;  // of the joint knobs that are free
  std::vector<std::vector<double>> test_points_;   // tried before the optimizer leads
  BayesianOptimizer bayes_;

  bool active_ = true;
  bool changed_ = false;
  bool skip_round_ = false;  // a trial ended in this round: the rest of it is not measured
  TunedParams current_, best_;
  double best_score_ = -1;
  int warmup_left_;
  int joint_trials_ = 0;  // scored trials of the joint knobs
  bool hierarchical_tried_ = false;
  std::vector<double> scores_;

  // The trial being measured: how often each name ran in it, and its samples' scores.
  std::unordered_map<std::string, int> counts_;
  bool started_ = false;
  int64_t sample_start_us_ = 0;
  uint64_t bytes_ = 0;
  std::vector<double> samples_;
};

// One line of Horovod's autotune log for p (its columns, see Tuner), score in bytes/us.
std::string AutotuneCsvLine(const TunedParams& p, bool cache_enabled, double score);
// Horovod's header line.
extern const char kAutotuneCsvHeader[];

}  // namespace ringrun::runtime::engine
