// control_plane_bench: the launcher's cost at N hosts. The real job (job::RunJob: the job
// service, the registry, the state machine, output routing) runs in this process over a
// generated hostfile of N hosts; the agents are fake (launcher/starters/fake_agents.h) and run
// in a child process, speaking the real protocol over loopback, one TCP connection each. Every
// rank prints one line and exits 0. Reports this process's CPU time, peak RSS and peak thread
// count and its most frequent count (sampled every 5 ms), and the wall time of the job.
//
//   control_plane_bench [HOSTS [RANKS_PER_HOST]]      (default: 1000 1)
//
// Prints one line: hosts=.. ranks=.. rc=.. agents_rc=.. wall_s=.. cpu_s=.. maxrss_mb=..
// threads_peak=.. threads_steady=..
#include <absl/synchronization/mutex.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "launcher/hosts/placement.h"
#include "launcher/job/job.h"
#include "launcher/options.h"
#include "launcher/starters/fake_agents.h"
#include "ringrun/common/interfaces.h"
#include "ringrun/common/thread_annotations.h"

namespace {

using namespace ringrun::launcher;

void RaiseFdLimit() {
  rlimit r;
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0) {
    r.rlim_cur = r.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
}

// The child: fake agents started as the launcher's starter asks, one line per agent on
// `launch_fd`; each agent's end reported on `ended_fd`, as its process's exit would be.
int RunAgents(int launch_fd, int ended_fd, int hosts) {
  // As StartJobServer does for the launcher: Debian's Abseil checks lock order by default, a
  // cost that a thousand agent processes would each pay alone, not one process for them all.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Dialled at this machine's first non-loopback address, the agents look remote to the job,
  // as real ones do (for loopback agents the job looks for another host's address).
  starters::FakeAgentScript script;
  if (auto nics = ringrun::ListInterfaces(); nics.ok()) {
    for (const auto& nic : *nics) {
      if (!nic.address.empty() && !ringrun::IsLoopback(nic.address) &&
          nic.address.find(':') == std::string::npos) {
        script.service_address = nic.address;
        break;
      }
    }
  }
  ringrun::Mutex mu;
  starters::FakeAgents agents(script, [&](int host, const starters::FakeAgentResult& r) {
    const bool ok = r.register_status.ok() && r.session_status.ok();
    const std::string line = std::to_string(host) + (ok ? " 0\n" : " 1\n");
    ringrun::MutexLock lock(&mu);
    if (::write(ended_fd, line.data(), line.size()) < 0) std::perror("control_plane_bench");
  });
  FILE* in = ::fdopen(launch_fd, "r");
  int host = 0, port = 0, started = 0;
  char secret[256];
  while (started < hosts && std::fscanf(in, "%d %d %255s", &host, &port, secret) == 3) {
    agents.Start(host, port, secret);
    ++started;
  }
  return agents.WaitEnded(started, 120000) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int hosts = argc > 1 ? std::atoi(argv[1]) : 1000;
  const int per_host = argc > 2 ? std::atoi(argv[2]) : 1;
  RaiseFdLimit();
  int launches[2], ends[2];
  if (::pipe2(launches, O_CLOEXEC) != 0 || ::pipe2(ends, O_CLOEXEC) != 0) return 1;
  // Fork before anything starts a thread or gRPC.
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(launches[1]);
    ::close(ends[0]);
    ::_exit(RunAgents(launches[0], ends[1], hosts));
  }
  ::close(launches[0]);
  ::close(ends[1]);

  char hostfile[] = "/tmp/control_plane_bench.XXXXXX";
  const int hf = ::mkstemp(hostfile);
  std::string text;
  for (int h = 0; h < hosts; ++h) {
    text += "fake" + std::to_string(h) + " slots=" + std::to_string(per_host) + "\n";
  }
  if (hf < 0 || ::write(hf, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    return 1;
  ::close(hf);
  const std::string np = std::to_string(hosts * per_host);
  std::vector<const char*> args = {"ringrun", "--hostfile", hostfile, "-np", np.c_str(), "true"};
  ParseOutcome parsed = ParseCommandLine(static_cast<int>(args.size()), args.data(), {});
  ::unlink(hostfile);
  if (parsed.kind == ParseOutcome::kExitNow) {
    std::fprintf(stderr, "control_plane_bench: %s\n", parsed.message.c_str());
    return 2;
  }
  auto placed = hosts::PlaceRanks(parsed.options.hosts, parsed.options.np, false);
  if (!placed.ok()) return 2;

  // Threads, less the sampler: the peak, and the count seen most often (the steady state).
  std::atomic<bool> stop{false};
  std::map<int, int> seen;  // thread count -> samples; the sampler's until joined
  std::thread sampler([&] {
    while (!stop) {
      seen[starters::ProcessThreadCount() - 1]++;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  // The ranks' output goes to the console: not this report's.
  const int out = ::dup(1);
  const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  ::dup2(null, 1);

  auto starter = starters::MakePipeAgentStarter(launches[1], ends[0]);
  job::Starters s;
  s.local = s.remote = starter.get();
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = job::RunJob(parsed.options, std::move(placed.value()), s);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop = true;
  sampler.join();
  int peak = 0, steady = 0;
  for (const auto& [threads, samples] : seen) {
    peak = threads;
    if (samples > seen[steady]) steady = threads;
  }
  ::close(launches[1]);

  rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  const double cpu =
      ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  int status = 0;
  ::waitpid(child, &status, 0);
  char line[256];
  const int n =
      std::snprintf(line, sizeof line,
                    "hosts=%d ranks=%d rc=%d agents_rc=%d wall_s=%.3f cpu_s=%.3f maxrss_mb=%.1f "
                    "threads_peak=%d threads_steady=%d\n",
                    hosts, hosts * per_host, rc, WIFEXITED(status) ? WEXITSTATUS(status) : -1, wall,
                    cpu, ru.ru_maxrss / 1024.0, peak, steady);
  if (::write(out, line, n) != n) return 1;
  return rc;
}
