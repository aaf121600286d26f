// ringrun-test-probe: a rank program for the integration tests.
//   env                      print the contract variables, one NAME=VALUE a line
//   args ARG...              print each argument hex-encoded, one a line
//   lines N                  N numbered lines on stdout, then a partial line without '\n'
//   fail RANK CODE           RANK writes to stderr and exits CODE; others sleep 60 s
//   signal RANK SIGNO        RANK raises SIGNO; others sleep 60 s
//   sleep SECONDS            sleep; report SIGUSR1/SIGUSR2 on stdout
//   ignore-term SECONDS      ignore SIGTERM, then sleep
//   hygiene                  print the blocked/ignored signal masks and open fds above 2
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace {

int Rank() {
  const char* r = std::getenv("RINGRUN_RANK");
  return r ? std::atoi(r) : 0;
}

volatile sig_atomic_t got_usr = 0;
void OnUsr(int s) { got_usr = s; }

void SleepReporting(int seconds) {
  signal(SIGUSR1, OnUsr);
  signal(SIGUSR2, OnUsr);
  for (int i = 0; i < seconds * 100; ++i) {
    usleep(10000);
    if (got_usr) {
      std::printf("rank %d got %s\n", Rank(), got_usr == SIGUSR1 ? "SIGUSR1" : "SIGUSR2");
      std::fflush(stdout);
      got_usr = 0;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::string mode = argv[1];
  if (mode == "env") {
    const char* names[] = {"RINGRUN_RANK",
                           "RINGRUN_SIZE",
                           "RINGRUN_LOCAL_RANK",
                           "RINGRUN_LOCAL_SIZE",
                           "RINGRUN_CROSS_RANK",
                           "RINGRUN_CROSS_SIZE",
                           "RINGRUN_HOSTNAME",
                           "HOROVOD_RANK",
                           "HOROVOD_SIZE",
                           "HOROVOD_LOCAL_RANK",
                           "HOROVOD_LOCAL_SIZE",
                           "HOROVOD_CROSS_RANK",
                           "HOROVOD_CROSS_SIZE",
                           "HOROVOD_HOSTNAME",
                           "RANK",
                           "WORLD_SIZE",
                           "LOCAL_RANK",
                           "LOCAL_WORLD_SIZE",
                           "GROUP_RANK",
                           "MASTER_ADDR",
                           "MASTER_PORT",
                           "RINGRUN_JOB_SERVICE",
                           "RINGRUN_TEST_X",
                           "SHLVL",
                           "OLDPWD"};
    for (const char* n : names) {
      const char* v = std::getenv(n);
      if (v) std::printf("%s=%s\n", n, v);
    }
    char cwd[4096];
    if (getcwd(cwd, sizeof(cwd))) std::printf("CWD=%s\n", cwd);
    return 0;
  }
  if (mode == "args") {
    for (int i = 2; i < argc; ++i) {
      std::printf("arg%d=", i - 2);
      for (const unsigned char* p = reinterpret_cast<unsigned char*>(argv[i]); *p; ++p) {
        std::printf("%02x", *p);
      }
      std::printf("\n");
    }
    return 0;
  }
  if (mode == "lines" && argc >= 3) {
    int n = std::atoi(argv[2]);
    int r = Rank();
    for (int i = 0; i < n; ++i) {
      std::printf("r%d l%d %s\n", r, i, "the quick brown fox jumps over the lazy dog");
    }
    std::printf("r%d partial", r);
    return 0;
  }
  if ((mode == "fail" || mode == "signal") && argc >= 4) {
    if (Rank() == std::atoi(argv[2])) {
      usleep(200000);
      std::fprintf(stderr, "rank %d: something went wrong\n", Rank());
      std::fflush(stderr);
      if (mode == "fail") return std::atoi(argv[3]);
      // Die by the signal itself, whatever handler is installed (a sanitizer's SIGSEGV handler
      // would report and exit 1 instead).
      const int signo = std::atoi(argv[3]);
      signal(signo, SIG_DFL);
      raise(signo);
      return 99;
    }
    SleepReporting(60);
    return 0;
  }
  if (mode == "sleep" && argc >= 3) {
    std::printf("rank %d sleeping\n", Rank());
    std::fflush(stdout);
    SleepReporting(std::atoi(argv[2]));
    return 0;
  }
  if (mode == "ignore-term" && argc >= 3) {
    signal(SIGTERM, SIG_IGN);
    std::printf("rank %d ignoring SIGTERM\n", Rank());
    std::fflush(stdout);
    sleep(std::atoi(argv[2]));
    return 0;
  }
  if (mode == "hygiene") {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("SigBlk:", 0) == 0 || line.rfind("SigIgn:", 0) == 0) {
        std::printf("%s\n", line.c_str());
      }
    }
    status.close();
    DIR* d = opendir("/proc/self/fd");
    int self = dirfd(d);
    while (dirent* e = readdir(d)) {
      int fd = std::atoi(e->d_name);
      if (e->d_name[0] != '.' && fd > 2 && fd != self) std::printf("fd %d open\n", fd);
    }
    closedir(d);
    return 0;
  }
  return 2;
}
