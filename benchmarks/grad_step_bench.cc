// A gradient step through the engine, against its ceiling and its alternatives.
//
//   grad_step_bench [--model FILE] [--rounds N] [--gap-us US] [--small-reps N] [--warm-steps N]
//
// Each rank loads a model's parameter shapes (benchmarks/models/*.txt), allocates one float32
// gradient per parameter, and per round runs, in alternating order:
//   engine       one thread submits every gradient by name, in reverse order (as backward
//                produces them) with --gap-us between submissions, then waits for all;
//   engine_nofuse the same with RINGRUN_FUSION_THRESHOLD=0 (the runtime is re-initialized);
//   blocking     the same gradients as blocking per-tensor allreduces, in reverse order;
//   ceiling      one blocking allreduce of all the gradients' bytes in one buffer.
// Every runtime runs one untimed engine step before its timed ones (--warm-steps N: N, so that
// HOROVOD_AUTOTUNE can finish first; with GRAD_STEP_ONLY=engine, as the runtime is not re-made).
// The first engine step after ringrun_init (every name negotiated for the first time, buffers
// touched for the first time) is printed as engine_first; it is not one of the compared cases.
// Then: a warm step of one 4-byte tensor per parameter (named, cached) against one blocking
// 4-byte allreduce (four timed one by one after each step), and the idle engine (CPU time and
// context switches of the whole process over 2 s with nothing submitted, and the run time and
// the times on a CPU of the threads other than the sleeping one, the engine's). Rank 0 prints
// medians; busbw = bytes * 2(n-1)/n / time.
#include <dirent.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ringrun/ringrun.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Die(const char* what) {
  std::fprintf(stderr, "grad_step_bench: rank %d: %s: %s\n", ringrun_rank(), what,
               ringrun_error_message());
  std::exit(1);
}
void Check(ringrun_status st, const char* what) {
  if (st != RINGRUN_OK) Die(what);
}

struct Tensor {
  std::string name;
  size_t count;
};

std::vector<Tensor> LoadShapes(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "grad_step_bench: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  std::vector<Tensor> out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    Tensor t;
    ss >> t.name;
    t.count = 1;
    for (size_t d; ss >> d;) t.count *= d;
    out.push_back(t);
  }
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void SpinFor(double us) {
  const double until = Now() + us * 1e-6;
  while (Now() < until) {
  }
}

void Reinit(const char* fusion) {
  ringrun_shutdown();
  if (fusion) {
    setenv("RINGRUN_FUSION_THRESHOLD", fusion, 1);
  } else {
    unsetenv("RINGRUN_FUSION_THRESHOLD");
  }
  Check(ringrun_init(), "ringrun_init");
}

// One engine step: submit in reverse with gaps, then wait for all.
double EngineStep(const std::vector<Tensor>& ts, std::vector<std::vector<float>>& bufs,
                  double gap_us) {
  std::vector<ringrun_handle> hs(ts.size());
  Check(ringrun_barrier(), "barrier");
  const double t0 = Now();
  for (size_t k = ts.size(); k-- > 0;) {
    Check(
        ringrun_allreduce_submit(ts[k].name.c_str(), bufs[k].data(), bufs[k].data(), bufs[k].size(),
                                 RINGRUN_FLOAT32, RINGRUN_SUM, 1.0, 1.0, 0, &hs[k]),
        "submit");
    if (gap_us > 0 && k > 0) SpinFor(gap_us);
  }
  for (ringrun_handle h : hs) {
    if (ringrun_wait(h) != RINGRUN_OK) {
      std::fprintf(stderr, "%s: %s\n", ringrun_handle_name(h), ringrun_handle_message(h));
      std::exit(1);
    }
    ringrun_release(h);
  }
  return Now() - t0;
}

double BlockingStep(const std::vector<Tensor>& ts, std::vector<std::vector<float>>& bufs) {
  Check(ringrun_barrier(), "barrier");
  const double t0 = Now();
  for (size_t k = ts.size(); k-- > 0;) {
    Check(ringrun_allreduce(bufs[k].data(), bufs[k].data(), bufs[k].size(), RINGRUN_FLOAT32,
                            RINGRUN_SUM),
          "allreduce");
  }
  return Now() - t0;
}

double CeilingStep(std::vector<float>& all) {
  Check(ringrun_barrier(), "barrier");
  const double t0 = Now();
  Check(ringrun_allreduce(all.data(), all.data(), all.size(), RINGRUN_FLOAT32, RINGRUN_SUM),
        "allreduce");
  return Now() - t0;
}

// Each thread's run time so far and how many times it has been put on a CPU, by thread id
// (/proc/self/task/TID/schedstat: run time in ns, wait time in ns, slices run).
struct ThreadStat {
  long long run_ns = 0;
  long long slices = 0;
};
std::map<long, ThreadStat> ThreadStats() {
  std::map<long, ThreadStat> out;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      ThreadStat st;
      long long wait_ns = 0;
      std::ifstream(std::string("/proc/self/task/") + e->d_name + "/schedstat") >> st.run_ns >>
          wait_ns >> st.slices;
      out[std::atol(e->d_name)] = st;
    }
    closedir(d);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "benchmarks/models/resnet50.txt";
  int rounds = 7, small_reps = 200, warm_steps = 0;
  double gap_us = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--model") {
      model = argv[i + 1];
    } else if (a == "--rounds") {
      rounds = std::atoi(argv[i + 1]);
    } else if (a == "--gap-us") {
      gap_us = std::atof(argv[i + 1]);
    } else if (a == "--small-reps") {
      small_reps = std::atoi(argv[i + 1]);
    } else if (a == "--warm-steps") {
      warm_steps = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr,
                   "usage: grad_step_bench [--model FILE] [--rounds N] [--gap-us US]"
                   " [--small-reps N] [--warm-steps N]\n");
      return 2;
    }
  }
  const char* fusion_env = std::getenv("RINGRUN_FUSION_THRESHOLD");
  const std::string fusion = fusion_env ? fusion_env : "";
  Check(ringrun_init(), "ringrun_init");
  const int n = ringrun_size(), rank = ringrun_rank();
  std::vector<Tensor> ts = LoadShapes(model);
  size_t total = 0;
  std::vector<std::vector<float>> bufs;
  for (const Tensor& t : ts) {
    bufs.emplace_back(t.count, 1.0f);
    total += t.count;
  }
  std::vector<float> all(total, 1.0f);
  const double bytes = static_cast<double>(total) * 4;
  const double factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;

  std::map<std::string, std::vector<double>> times;
  std::vector<std::string> modes = {"engine", "engine_nofuse", "blocking", "ceiling"};
  if (const char* only = std::getenv("GRAD_STEP_ONLY")) modes = {only};  // for a timeline
  for (int i = 0; i < warm_steps; ++i) (void)EngineStep(ts, bufs, gap_us);
  // One warm-up pass of every mode (connections, caches, the fusion buffer).
  for (int round = -1; round < rounds; ++round) {
    for (size_t m = 0; m < modes.size(); ++m) {
      const std::string& mode = modes[(m + static_cast<size_t>(round + 1)) % modes.size()];
      double t;
      if (mode == "engine_nofuse") {
        // A fresh runtime's first step negotiates every name and touches its buffers for the
        // first time, so each runtime does one untimed step before its timed ones and no
        // compared case times a first step. The default runtime's first step, right after it
        // is re-created here, is reported on its own (engine_first).
        Reinit("0");
        (void)EngineStep(ts, bufs, gap_us);
        t = EngineStep(ts, bufs, gap_us);
        Reinit(fusion.empty() ? nullptr : fusion.c_str());
        const double first = EngineStep(ts, bufs, gap_us);
        if (round >= 0) times["engine_first"].push_back(first);
      } else if (mode == "engine") {
        t = EngineStep(ts, bufs, gap_us);
      } else if (mode == "blocking") {
        t = BlockingStep(ts, bufs);
      } else {
        t = CeilingStep(all);
      }
      if (round >= 0) times[mode].push_back(t);
    }
  }

  // Warm step of one 4-byte tensor per parameter against one blocking 4-byte allreduce.
  std::vector<float> small(ts.size(), 1.0f);
  std::vector<double> step_small, one_small;
  std::vector<ringrun_handle> hs(ts.size());
  for (int rep = -5; rep < small_reps; ++rep) {
    Check(ringrun_barrier(), "barrier");
    double t0 = Now();
    for (size_t k = ts.size(); k-- > 0;) {
      Check(ringrun_allreduce_submit(ts[k].name.c_str(), &small[k], &small[k], 1, RINGRUN_FLOAT32,
                                     RINGRUN_SUM, 1.0, 1.0, 0, &hs[k]),
            "submit");
    }
    for (ringrun_handle h : hs) {
      Check(ringrun_wait(h), "wait");
      ringrun_release(h);
    }
    const double t_step = Now() - t0;
    if (rep >= 0) step_small.push_back(t_step);
    // Blocking allreduces, each timed on its own, alternating with the steps. Several per step:
    // the first one after a step can be disturbed by it (when the ranks' threads run again
    // after a step of 161 completions varies with how long the step took), so its median alone
    // would move with the step's speed, the other way.
    Check(ringrun_barrier(), "barrier");
    for (int i = 0; i < 4; ++i) {
      t0 = Now();
      Check(ringrun_allreduce(&small[0], &small[0], 1, RINGRUN_FLOAT32, RINGRUN_SUM), "allreduce");
      if (rep >= 0) one_small.push_back(Now() - t0);
    }
  }

  // The idle engine: nothing submitted for 2 s. Besides the process's rusage, each thread's
  // own run time and the times it was put on a CPU (/proc/self/task/*/schedstat): the calling
  // thread's include its own reads of /proc, the others' (the engine's) nothing but themselves.
  // The window opens 100 ms after the barrier, once the engine thread has finished that round
  // (it completes the barrier's handle before it is done with the round, and goes to sleep after).
  Check(ringrun_barrier(), "barrier");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  rusage r0, r1;
  const std::map<long, ThreadStat> th0 = ThreadStats();
  getrusage(RUSAGE_SELF, &r0);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  getrusage(RUSAGE_SELF, &r1);
  const std::map<long, ThreadStat> th1 = ThreadStats();
  const long self = syscall(SYS_gettid);
  long long other_ns = 0, self_ns = 0, other_slices = 0;
  for (const auto& [tid, st] : th1) {
    auto before = th0.find(tid);
    const ThreadStat b = before == th0.end() ? ThreadStat{} : before->second;
    if (tid == self) {
      self_ns += st.run_ns - b.run_ns;
    } else {
      other_ns += st.run_ns - b.run_ns;
      other_slices += st.slices - b.slices;
    }
  }
  auto cpu = [](const rusage& u) {
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  };
  const double idle_cpu = cpu(r1) - cpu(r0);
  const long idle_switches = (r1.ru_nvcsw - r0.ru_nvcsw) + (r1.ru_nivcsw - r0.ru_nivcsw);
  // The ranks' windows open and close a little apart: the barrier after them waits 100 ms too,
  // or the peer's frame for it would wake this rank's engine while this rank is still reading.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Check(ringrun_barrier(), "barrier");

  if (rank == 0) {
    std::printf("model %s: %zu tensors, %.1f MB float32; np=%d, %d rounds, gap %.0f us\n",
                model.c_str(), ts.size(), bytes / 1e6, n, rounds, gap_us);
    std::printf("%-14s %12s %12s %10s\n", "case", "step_ms", "busbw_GBps", "vs_ceiling");
    const double ceil = Median(times["ceiling"]);
    for (const std::string& m :
         {std::string("ceiling"), std::string("engine"), std::string("engine_nofuse"),
          std::string("blocking"), std::string("engine_first")}) {
      const double t = Median(times[m]);
      std::printf("%-14s %12.2f %12.2f %9.0f%%\n", m.c_str(), t * 1e3, bytes * factor / t / 1e9,
                  100.0 * ceil / t);
    }
    const double s = Median(step_small), o = Median(one_small);
    std::printf(
        "warm step of %zu 4-byte tensors: %.1f us; one blocking 4-byte allreduce: %.1f us;"
        " ratio %.2f\n",
        ts.size(), s * 1e6, o * 1e6, s / o);
    std::printf(
        "idle 2 s (rank 0 process): %.4f s CPU, %ld context switches; threads other than the"
        " sleeping one (the engine's): %lld us, put on a CPU %lld times; the sleeping one: %lld"
        " us\n",
        idle_cpu, idle_switches, other_ns / 1000, other_slices, self_ns / 1000);
  }
  ringrun_shutdown();
  return 0;
}
