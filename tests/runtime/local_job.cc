// runtime_local_job NP PROGRAM [ARGS...]: runs NP copies of PROGRAM on this host with the
// launcher's environment contract, joined through a TestJobServer. A stand-in for
// `ringrun -np NP` in benchmarks and tests of libringrun alone. Exit: the first non-zero rank
// status, 0 when all succeed. Ranks inherit stdout and stderr.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ringrun/common/env_contract.h"
#include "tests/runtime/test_job_server.h"

extern char** environ;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: runtime_local_job NP PROGRAM [ARGS...]\n");
    return 2;
  }
  const int np = std::atoi(argv[1]);
  if (np < 1) return 2;
  const std::string secret = "local-job-secret-0123456789abcdef";
  auto server = ringrun::runtime::testing::TestJobServer::Start(np, secret, "local-job");
  if (!server) {
    std::fprintf(stderr, "runtime_local_job: cannot start the job server\n");
    return 1;
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < np; ++r) {
    std::vector<std::string> e = server->RankEnvironment(r);
    for (char** p = environ; *p; ++p) {
      const bool ours = std::strncmp(*p, "RINGRUN_", 8) == 0 &&
                        std::strncmp(*p, "RINGRUN_TIMEOUT_MS=", 19) != 0 &&
                        std::strncmp(*p, "RINGRUN_DISABLE_SHM=", 20) != 0;
      if (!ours) e.push_back(*p);
    }
    std::vector<char*> envp;
    for (auto& s : e) envp.push_back(s.data());
    envp.push_back(nullptr);
    pid_t pid;
    if (posix_spawnp(&pid, argv[2], nullptr, nullptr, argv + 2, envp.data()) != 0) {
      std::fprintf(stderr, "runtime_local_job: cannot start %s\n", argv[2]);
      for (pid_t p : pids) ::kill(p, SIGKILL);
      return 1;
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t p : pids) {
    int st = 0;
    ::waitpid(p, &st, 0);
    const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (rc == 0) rc = code;
  }
  return rc;
}
