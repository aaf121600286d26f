#include "runtime/src/knobs.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "runtime/src/runtime.h"

namespace ringrun::runtime {

namespace {

const char* Set(const Getenv& getenv, const char* name) {
  const char* v = getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// The first of `names` that is set: its value, and its name in *which.
const char* First(const Getenv& getenv, std::initializer_list<const char*> names,
                  const char** which) {
  for (const char* n : names) {
    if (const char* v = Set(getenv, n)) {
      *which = n;
      return v;
    }
  }
  return nullptr;
}

Result<double> ParseNumber(const char* name, const char* v, double lo, double hi) {
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(v, &end);
  if (errno != 0 || end == v || *end != '\0' || !(x >= lo && x <= hi)) {
    return InvalidArgument(std::string("environment variable ") + name + "='" + v +
                           "' is not a number in [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "]");
  }
  return x;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// Horovod's level names (TRACE DEBUG INFO WARNING ERROR FATAL, any case) and spdlog's.
Result<std::string> ParseLogLevel(const char* name, const char* v) {
  const std::string s = Lower(v);
  if (s == "trace" || s == "debug" || s == "info" || s == "off") return s;
  if (s == "warning" || s == "warn") return std::string("warn");
  if (s == "error" || s == "err") return std::string("err");
  if (s == "fatal" || s == "critical") return std::string("critical");
  return InvalidArgument(std::string("environment variable ") + name + "='" + v +
                         "' is not a log level (TRACE, DEBUG, INFO, WARNING, ERROR or FATAL)");
}

// Horovod's booleans: an integer, nonzero is true.
Result<bool> ParseFlag(const char* name, const char* v) {
  Result<double> x = ParseNumber(name, v, -1e9, 1e9);
  if (!x.ok()) return x.status();
  return *x != 0;
}

constexpr double kMaxBytes = 1099511627776.0;  // 1 TiB
constexpr double kMaxBurstUs = 1000;           // see ReadKnobs

// HOROVOD_AUTOTUNE and its knobs; a knob given in the environment is not tuned (Horovod's
// rule), so it must be read after them.
Status ReadAutotune(const Getenv& getenv, JobEnv* e) {
  engine::AutotuneOptions& a = e->autotune;
  if (const char* v = Set(getenv, "HOROVOD_AUTOTUNE")) {
    Result<bool> on = ParseFlag("HOROVOD_AUTOTUNE", v);
    if (!on.ok()) return on.status();
    a.enabled = *on;
  }
  if (const char* v = Set(getenv, "HOROVOD_AUTOTUNE_LOG")) a.log_path = v;
  struct Count {
    const char* name;
    double lo;
    int* out;
  };
  for (const Count& c :
       {Count{"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", 0, &a.warmup_samples},
        Count{"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", 1, &a.steps_per_sample},
        Count{"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", 1, &a.bayes_opt_max_samples}}) {
    if (const char* v = Set(getenv, c.name)) {
      Result<double> x = ParseNumber(c.name, v, c.lo, 1 << 30);
      if (!x.ok()) return x.status();
      *c.out = static_cast<int>(*x);
    }
  }
  if (const char* v = Set(getenv, "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE")) {
    Result<double> x = ParseNumber("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", v, 0, 1);
    if (!x.ok()) return x.status();
    a.gaussian_process_noise = *x;
  }
  const char* which = nullptr;
  a.tune_fusion_threshold =
      First(getenv, {"RINGRUN_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD"}, &which) == nullptr;
  a.tune_burst = First(getenv, {"RINGRUN_BURST_QUIET_US", "HOROVOD_CYCLE_TIME"}, &which) == nullptr;
  a.tune_hierarchical = Set(getenv, "HOROVOD_HIERARCHICAL_ALLREDUCE") == nullptr;
  return Status::Ok();
}

}  // namespace

const std::vector<HorovodVariable>& HorovodVariables() {
  static const std::vector<HorovodVariable> v = {
      {"HOROVOD_FUSION_THRESHOLD", "the fusion buffer's bytes (RINGRUN_FUSION_THRESHOLD)", true},
      {"HOROVOD_CYCLE_TIME",
       "ms: the engine's gathering window, at most 1 ms (RINGRUN_BURST_QUIET_US)", true},
      {"HOROVOD_CACHE_CAPACITY", "response cache entries (RINGRUN_CACHE_CAPACITY)", true},
      {"HOROVOD_STALL_CHECK_DISABLE", "1: no stall warnings (RINGRUN_STALL_CHECK=0)", true},
      {"HOROVOD_STALL_CHECK_TIME_SECONDS",
       "the stall warning's time (RINGRUN_STALL_WARNING_SECONDS)", true},
      {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
       "the stall shutdown's time (RINGRUN_STALL_SHUTDOWN_SECONDS)", true},
      {"HOROVOD_TIMELINE",
       "the timeline file (RINGRUN_TIMELINE); DYNAMIC: none until the program starts one", true},
      {"HOROVOD_LOG_LEVEL", "the ranks' log level (RINGRUN_LOG_LEVEL)", true},
      {"HOROVOD_LOG_HIDE_TIME", "1: log lines without a time", true},
      {"HOROVOD_GLOO_TIMEOUT_SECONDS", "how long init waits for every rank to join", true},
      {"HOROVOD_HIERARCHICAL_ALLREDUCE",
       "0: flat ring; 1 or unset: hierarchical where every host has the same number of ranks",
       true},
      {"HOROVOD_HIERARCHICAL_ALLGATHER", "allgather is always one ring", false},
      {"HOROVOD_TORUS_ALLREDUCE",
       "there is no torus allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE chooses the two-level one)",
       false},
      {"HOROVOD_TIMELINE_MARK_CYCLES", "1: a CYCLE_START mark on the timeline per round", true},
      {"HOROVOD_AUTOTUNE",
       "1: rank 0 tunes the fusion threshold, the burst window and hierarchical allreduce (those "
       "not set) during the first steps, then keeps the best",
       true},
      {"HOROVOD_AUTOTUNE_LOG", "rank 0 writes the trials there, in Horovod's CSV columns", true},
      {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "trials discarded first (3)", true},
      {"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "steps per sample; a trial is 5 samples (10)", true},
      {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
       "trials of the fusion threshold and burst window together (20)", true},
      {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "the Gaussian process's noise, in [0, 1] (0.8)",
       true},
      {"HOROVOD_MPI_THREADS_DISABLE", "ringrun does not use MPI", false},
      {"HOROVOD_CONTROLLER", "ringrun has one controller, its own", false},
      {"HOROVOD_CPU_OPERATIONS", "host memory always goes over ringrun's TCP and shared memory",
       false},
      {"HOROVOD_GLOO_IFACE", "use --network-interfaces", false},
      {"HOROVOD_CCL_CACHE", "ringrun does not use oneCCL", false},
      {"HOROVOD_ADASUM_MPI_CHUNK_SIZE", "ringrun does not use MPI", false},
      {"HOROVOD_NUM_NCCL_STREAMS", "one NCCL stream per rank", false},
      {"HOROVOD_BATCH_D2D_MEMCOPIES", "fusion copies each device tensor on its own", false},
      {"HOROVOD_ENABLE_ASYNC_COMPLETION", "device completion is always asynchronous", false},
      {"HOROVOD_DISABLE_NVTX_RANGES", "ringrun emits no NVTX ranges", false},
      {"HOROVOD_ENABLE_XLA_OPS", "TensorFlow only", false},
      {"HOROVOD_THREAD_AFFINITY", "the engine thread is not pinned (use --bind-to)", false},
      {"HOROVOD_DISABLE_GROUP_FUSION", "grouped collectives fuse like others", false},
      {"HOROVOD_DYNAMIC_PROCESS_SETS",
       "1: ringrun.torch allows add_process_set; collectives run on the global set only", true},
      {"HOROVOD_ELASTIC",
       "1 (ringrun sets it in elastic jobs, --min-np/--max-np): ringrun.torch.elastic.run "
       "re-forms the job after a failure",
       true},
  };
  return v;
}

Status ReadKnobs(const Getenv& getenv, JobEnv* e) {
  const char* which = nullptr;
  auto number = [&](std::initializer_list<const char*> names, double lo, double hi,
                    double* out) -> Result<bool> {
    const char* v = First(getenv, names, &which);
    if (v == nullptr) return false;
    Result<double> r = ParseNumber(which, v, lo, hi);
    if (!r.ok()) return r.status();
    *out = *r;
    return true;
  };
  auto horovod = [&]() { return std::string(which).rfind("HOROVOD_", 0) == 0; };
  double x = 0;
  Result<bool> got =
      number({"RINGRUN_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD"}, 0, kMaxBytes, &x);
  if (!got.ok()) return got.status();
  if (*got) e->fusion_threshold = static_cast<size_t>(x);
  got = number({"RINGRUN_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY"}, 0, 1 << 24, &x);
  if (!got.ok()) return got.status();
  if (*got) e->cache_capacity = static_cast<size_t>(x);
  // The burst window is at most 1 ms: the engine gathers for at most 32 windows, and nothing
  // else (a shutdown, a failure) is looked at meanwhile. Horovod's cycle time (ms) is the
  // nearest thing it has; a longer one is cut to 1 ms, and said.
  got = number({"RINGRUN_BURST_QUIET_US"}, 0, kMaxBurstUs, &x);
  if (!got.ok()) return got.status();
  if (*got) {
    e->burst_quiet_ns = static_cast<int64_t>(x * 1000);
  } else if (got = number({"HOROVOD_CYCLE_TIME"}, 0, 1e7, &x); !got.ok()) {
    return got.status();
  } else if (*got) {
    if (x * 1000 > kMaxBurstUs) {
      e->knob_notes.push_back("HOROVOD_CYCLE_TIME=" + std::string(getenv("HOROVOD_CYCLE_TIME")) +
                              ": the engine gathers submissions for at most 1 ms; using 1 ms");
    }
    e->burst_quiet_ns = static_cast<int64_t>(std::min(x * 1000, kMaxBurstUs) * 1000);
  }
  got = number({"RINGRUN_STALL_CHECK", "HOROVOD_STALL_CHECK_DISABLE"}, 0, 1, &x);
  if (!got.ok()) return got.status();
  if (*got) e->stall.enabled = horovod() ? x == 0 : x != 0;
  got =
      number({"RINGRUN_STALL_WARNING_SECONDS", "HOROVOD_STALL_CHECK_TIME_SECONDS"}, 0.001, 1e7, &x);
  if (!got.ok()) return got.status();
  if (*got) e->stall.warning_us = static_cast<int64_t>(x * 1e6);
  got =
      number({"RINGRUN_STALL_SHUTDOWN_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"}, 0, 1e7, &x);
  if (!got.ok()) return got.status();
  if (*got) e->stall.shutdown_us = static_cast<int64_t>(x * 1e6);
  got = number({"HOROVOD_GLOO_TIMEOUT_SECONDS"}, 0.001, 1e6, &x);
  if (!got.ok()) return got.status();
  if (*got && Set(getenv, "RINGRUN_JOIN_TIMEOUT_MS") == nullptr) {
    e->join_timeout_ms = static_cast<int>(x * 1000);
  }
  if (const char* t = First(getenv, {"RINGRUN_TIMELINE", "HOROVOD_TIMELINE"}, &which)) {
    if (std::string(t) == "DYNAMIC") {
      e->timeline_dynamic = true;  // none until the program starts one
    } else {
      e->timeline = t;
    }
  }
  // The agent's pipe for the timeline (agent/agent_loop.h): an fd number, else ignored.
  if (const char* v = Set(getenv, "RINGRUN_TIMELINE_FD")) {
    char* end = nullptr;
    const long fd = std::strtol(v, &end, 10);
    if (end != v && *end == '\0' && fd > 2 && fd < 1 << 20) e->timeline_fd = static_cast<int>(fd);
  }
  if (const char* v = Set(getenv, "HOROVOD_TIMELINE_MARK_CYCLES")) {
    Result<bool> on = ParseFlag("HOROVOD_TIMELINE_MARK_CYCLES", v);
    if (!on.ok()) return on.status();
    e->timeline_mark_cycles = *on;
  }
  if (const char* v = First(getenv, {"RINGRUN_LOG_LEVEL", "HOROVOD_LOG_LEVEL"}, &which)) {
    Result<std::string> level = ParseLogLevel(which, v);
    if (!level.ok()) return level.status();
    e->log_level = *level;
  }
  if (const char* v = Set(getenv, "HOROVOD_LOG_HIDE_TIME")) {
    Result<bool> hide = ParseFlag("HOROVOD_LOG_HIDE_TIME", v);
    if (!hide.ok()) return hide.status();
    e->log_hide_time = *hide;
  }
  if (const char* v = Set(getenv, "HOROVOD_HIERARCHICAL_ALLREDUCE")) {
    Result<bool> on = ParseFlag("HOROVOD_HIERARCHICAL_ALLREDUCE", v);
    if (!on.ok()) return on.status();
    e->hierarchical_allreduce = *on;
  }
  RINGRUN_RETURN_IF_ERROR(ReadAutotune(getenv, e));
  for (const HorovodVariable& h : HorovodVariables()) {
    if (h.honoured) continue;
    if (const char* v = Set(getenv, h.name)) {
      // 0 asks for what ringrun does anyway; ringrun sets HOROVOD_ELASTIC in elastic jobs.
      if (std::string(v) == "0") continue;
      if (std::string(h.name) == "HOROVOD_ELASTIC" && Set(getenv, "RINGRUN_ELASTIC")) continue;
      e->knob_notes.push_back(std::string(h.name) + "=" + v + " has no effect: " + h.here);
    }
  }
  return Status::Ok();
}

}  // namespace ringrun::runtime
