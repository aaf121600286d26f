#include "runtime/src/engine/tuner.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace ringrun::runtime::engine {
namespace {

constexpr double kLengthScale = 0.25;  // of the kernel, in the unit box
constexpr double kExploration = 0.01;  // expected improvement's xi, in standard deviations
constexpr double kMiB = 1024.0 * 1024.0;

double NormalPdf(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI); }
double NormalCdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

double Kernel(const std::vector<double>& a, const std::vector<double>& b) {
  double d2 = 0;
  for (size_t i = 0; i < a.size(); ++i) d2 += (a[i] - b[i]) * (a[i] - b[i]);
  return std::exp(-d2 / (2 * kLengthScale * kLengthScale));
}

// Solves L y = b in place (L lower triangular, n x n, row-major).
void ForwardSolve(const std::vector<double>& l, size_t n, std::vector<double>& b) {
  for (size_t i = 0; i < n; ++i) {
    double s = b[i];
    for (size_t j = 0; j < i; ++j) s -= l[i * n + j] * b[j];
    b[i] = s / l[i * n + i];
  }
}

// Solves L^T x = b in place.
void BackSolve(const std::vector<double>& l, size_t n, std::vector<double>& b) {
  for (size_t i = n; i-- > 0;) {
    double s = b[i];
    for (size_t j = i + 1; j < n; ++j) s -= l[j * n + i] * b[j];
    b[i] = s / l[i * n + i];
  }
}

}  // namespace

const char kAutotuneCsvHeader[] =
    "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,cycle_time_ms,"
    "tensor_fusion_threshold,score";

std::string AutotuneCsvLine(const TunedParams& p, bool cache_enabled, double score) {
  // Allgather is always one ring here, and there is no torus allreduce: those columns are 0.
  std::ostringstream s;
  s << (p.hierarchical ? 1 : 0) << ",0,0," << (cache_enabled ? 1 : 0) << ","
    << static_cast<double>(p.burst_quiet_ns) / 1e6 << ","
    << static_cast<double>(p.fusion_threshold) / kMiB << "," << score;
  return s.str();
}

// BayesianOptimizer

BayesianOptimizer::BayesianOptimizer(std::vector<std::pair<double, double>> bounds, double noise)
    : bounds_(std::move(bounds)), noise_(std::max(noise, 1e-6)) {}

std::vector<double> BayesianOptimizer::Unit(const std::vector<double>& x) const {
  std::vector<double> u(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double w = bounds_[i].second - bounds_[i].first;
    u[i] = w > 0 ? (x[i] - bounds_[i].first) / w : 0;
  }
  return u;
}

void BayesianOptimizer::Add(const std::vector<double>& x, double y) {
  xs_.push_back(Unit(x));
  ys_.push_back(y);
  fitted_ = false;
}

void BayesianOptimizer::Fit() const {
  if (fitted_) return;
  const size_t n = ys_.size();
  mean_ = 0;
  for (double y : ys_) mean_ += y;
  mean_ /= static_cast<double>(n);
  double var = 0;
  for (double y : ys_) var += (y - mean_) * (y - mean_);
  scale_ = n > 1 ? std::sqrt(var / static_cast<double>(n)) : 0;
  if (!(scale_ > 1e-12 * std::max(1.0, std::fabs(mean_)))) scale_ = 1;
  // Cholesky of K + noise I.
  chol_.assign(n * n, 0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j <= i; ++j) {
      double s = Kernel(xs_[i], xs_[j]) + (i == j ? noise_ : 0);
      for (size_t k = 0; k < j; ++k) s -= chol_[i * n + k] * chol_[j * n + k];
      chol_[i * n + j] = i == j ? std::sqrt(std::max(s, 1e-12)) : s / chol_[j * n + j];
    }
  }
  alpha_.resize(n);
  for (size_t i = 0; i < n; ++i) alpha_[i] = (ys_[i] - mean_) / scale_;
  ForwardSolve(chol_, n, alpha_);
  BackSolve(chol_, n, alpha_);
  fitted_ = true;
}

std::pair<double, double> BayesianOptimizer::Predict(const std::vector<double>& x) const {
  if (ys_.empty()) return {0, 1};
  Fit();
  const size_t n = ys_.size();
  const std::vector<double> u = Unit(x);
  std::vector<double> k(n);
  double mu = 0;
  for (size_t i = 0; i < n; ++i) {
    k[i] = Kernel(u, xs_[i]);
    mu += k[i] * alpha_[i];
  }
  ForwardSolve(chol_, n, k);
  double var = 1;
  for (double v : k) var -= v * v;
  return {mu * scale_ + mean_, std::sqrt(std::max(var, 1e-12)) * scale_};
}

std::vector<double> BayesianOptimizer::Next() const {
  const size_t d = bounds_.size();
  std::vector<double> x(d);
  if (ys_.empty()) {
    for (size_t i = 0; i < d; ++i) x[i] = (bounds_[i].first + bounds_[i].second) / 2;
    return x;
  }
  const double best = *std::max_element(ys_.begin(), ys_.end());
  // A grid of about 1000 candidates over the box, in a fixed order: ties go to the first.
  const size_t per_dim = d == 1 ? 1025 : d == 2 ? 33 : 11;
  size_t total = 1;
  for (size_t i = 0; i < d; ++i) total *= per_dim;
  std::vector<double> best_x, c(d);
  double best_ei = -1;
  for (size_t idx = 0; idx < total; ++idx) {
    size_t rest = idx;
    for (size_t i = 0; i < d; ++i) {
      const double t = static_cast<double>(rest % per_dim) / static_cast<double>(per_dim - 1);
      rest /= per_dim;
      c[i] = bounds_[i].first + t * (bounds_[i].second - bounds_[i].first);
    }
    const auto [mu, sigma] = Predict(c);
    const double improve = (mu - best) / scale_ - kExploration;
    const double s = sigma / scale_;
    const double z = improve / s;
    const double ei = improve * NormalCdf(z) + s * NormalPdf(z);
    if (ei > best_ei) best_ei = ei, best_x = c;
  }
  return best_x;
}

// Tuner

Tuner::Tuner(const AutotuneOptions& options, TunedParams initial, bool hierarchical_possible,
             bool cache_enabled, std::function<void(const std::string&)> csv)
    : options_(options),
      hierarchical_possible_(hierarchical_possible),
      tune_hierarchical_(options.tune_hierarchical && hierarchical_possible),
      cache_enabled_(cache_enabled),
      csv_(std::move(csv)),
      bounds_([&] {
        std::vector<std::pair<double, double>> b;
        if (options.tune_fusion_threshold) b.push_back({0, kTuneMaxFusionMiB});
        if (options.tune_burst) b.push_back({0, kTuneMaxBurstUs});
        return b;
      }()),
      bayes_(bounds_, options.gaussian_process_noise),
      current_(initial),
      best_(initial),
      warmup_left_(std::max(options.warmup_samples, 0)) {
  // The first trial is the job's own setting; then a spread of others (MiB, us) before the
  // optimizer leads.
  test_points_.push_back(ToPoint(initial));
  for (const auto& [mib, us] : {std::pair<double, double>{4, 8}, {16, 0}, {1, 32}}) {
    TunedParams p = initial;
    p.fusion_threshold = static_cast<size_t>(mib * kMiB);
    p.burst_quiet_ns = static_cast<int64_t>(us * 1000);
    test_points_.push_back(ToPoint(p));
  }
  active_ = !bounds_.empty() || tune_hierarchical_;
  if (active_ && csv_) csv_(kAutotuneCsvHeader);
}

std::vector<double> Tuner::ToPoint(const TunedParams& p) const {
  std::vector<double> x;
  if (options_.tune_fusion_threshold) x.push_back(static_cast<double>(p.fusion_threshold) / kMiB);
  if (options_.tune_burst) x.push_back(static_cast<double>(p.burst_quiet_ns) / 1000);
  return x;
}

TunedParams Tuner::FromPoint(const std::vector<double>& x) const {
  TunedParams p = current_;
  size_t i = 0;
  if (options_.tune_fusion_threshold) {
    // Whole KiB: the fusion buffer's size.
    p.fusion_threshold = static_cast<size_t>(std::llround(x[i++] * 1024)) << 10;
  }
  if (options_.tune_burst) p.burst_quiet_ns = std::llround(x[i++] * 1000);
  return p;
}

void Tuner::Log(const TunedParams& p, double score) {
  if (!csv_) return;
  // The column says whether allreduce runs hierarchical, which the setting alone does not
  // where the layout has no hierarchical path.
  TunedParams runs = p;
  runs.hierarchical = p.hierarchical && hierarchical_possible_;
  csv_(AutotuneCsvLine(runs, cache_enabled_, score));
}

void Tuner::Observe(std::string_view name, uint64_t bytes, int64_t now_us) {
  if (!active_ || skip_round_) return;
  if (!started_) started_ = true, sample_start_us_ = now_us;
  const int seen = counts_[std::string(name)]++;
  const int steps = std::max(options_.steps_per_sample, 1);
  if (seen >= (static_cast<int>(samples_.size()) + 1) * steps) {
    const double us = static_cast<double>(std::max<int64_t>(now_us - sample_start_us_, 1));
    samples_.push_back(static_cast<double>(bytes_) / us);
    bytes_ = 0;
    sample_start_us_ = now_us;
    if (static_cast<int>(samples_.size()) == kSamplesPerTrial) {
      std::vector<double> s = samples_;
      std::nth_element(s.begin(), s.begin() + kSamplesPerTrial / 2, s.end());
      const double median = s[kSamplesPerTrial / 2];
      counts_.clear(), samples_.clear(), started_ = false;
      // The rest of this round ran with the trial's settings too, but the next trial starts
      // with the next round, where every rank applies its settings.
      skip_round_ = true;
      EndTrial(median);
      return;
    }
  }
  bytes_ += bytes;
}

void Tuner::EndTrial(double score) {
  if (warmup_left_ > 0) {
    --warmup_left_;  // as Horovod: the first trials warm up, with the job's settings
    return;
  }
  Log(current_, score);
  scores_.push_back(score);
  if (score > best_score_) best_score_ = score, best_ = current_;
  const int joint_budget = bounds_.empty() ? 1 : std::max(options_.bayes_opt_max_samples, 1);
  if (joint_trials_ < joint_budget) {
    if (!bounds_.empty()) bayes_.Add(ToPoint(current_), score);
    if (++joint_trials_ < joint_budget) {
      const size_t k = static_cast<size_t>(joint_trials_);
      current_ = FromPoint(k < test_points_.size() ? test_points_[k] : bayes_.Next());
      changed_ = true;
      return;
    }
  }
  if (tune_hierarchical_ && !hierarchical_tried_) {
    hierarchical_tried_ = true;
    current_ = best_;
    current_.hierarchical = !best_.hierarchical;
    changed_ = true;
    return;
  }
  // Done: the best stays, and the log ends with it, as Horovod's.
  current_ = best_;
  active_ = false;
  changed_ = true;
  Log(best_, best_score_);
}

}  // namespace ringrun::runtime::engine
