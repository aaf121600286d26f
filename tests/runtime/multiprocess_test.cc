// Real worker processes (runtime_test_worker, linked against libringrun.so) joined through a
// real Rendezvous job server, with the environment contract set as the launcher sets it.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "ringrun/common/env_contract.h"
#include "tests/runtime/test_job_server.h"

extern char** environ;

namespace ringrun::runtime::testing {
namespace {

struct Worker {
  pid_t pid = -1;
  std::string out_path;
  std::string err_path;
  int status = -1;
  bool exited = false;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class Job {
 public:
  Job(int np, std::vector<std::string> extra_env, const std::string& mode) {
    server_ = TestJobServer::Start(np, kSecret, "mp-job");
    for (int r = 0; r < np; ++r) {
      std::vector<std::string> env = server_->RankEnvironment(r);
      env.insert(env.end(), extra_env.begin(), extra_env.end());
      for (char** e = environ; *e; ++e) {
        if (std::strncmp(*e, "RINGRUN_", 8) != 0) env.push_back(*e);
      }
      std::vector<char*> envp;
      for (auto& s : env) envp.push_back(s.data());
      envp.push_back(nullptr);
      Worker w;
      const std::string base =
          "/tmp/ringrun-test-worker-" + std::to_string(::getpid()) + "-" + std::to_string(r);
      w.out_path = base + ".out";
      w.err_path = base + ".err";
      posix_spawn_file_actions_t fa;
      posix_spawn_file_actions_init(&fa);
      posix_spawn_file_actions_addopen(&fa, 2, w.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0600);
      posix_spawn_file_actions_addopen(&fa, 1, w.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0600);
      std::string m = mode;
      char* argv[] = {const_cast<char*>(RINGRUN_TEST_WORKER), m.data(), nullptr};
      if (posix_spawn(&w.pid, RINGRUN_TEST_WORKER, &fa, nullptr, argv, envp.data()) != 0) {
        w.pid = -1;
      }
      posix_spawn_file_actions_destroy(&fa);
      workers_.push_back(w);
    }
  }
  ~Job() {
    for (Worker& w : workers_) {
      if (w.pid > 0 && !w.exited) {
        ::kill(w.pid, SIGKILL);
        ::waitpid(w.pid, &w.status, 0);
      }
      ::unlink(w.out_path.c_str());
      ::unlink(w.err_path.c_str());
    }
  }
  // Waits for every worker (except already-exited ones) until the deadline; false on timeout.
  bool WaitAll(int timeout_ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      bool all = true;
      for (Worker& w : workers_) {
        if (w.exited || w.pid < 0) continue;
        if (::waitpid(w.pid, &w.status, WNOHANG) == w.pid) {
          w.exited = true;
        } else {
          all = false;
        }
      }
      if (all) return true;
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // Waits for `ranks` only, until the deadline; false on timeout.
  bool WaitRanks(const std::vector<int>& ranks, int timeout_ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (int r : ranks) {
      Worker& w = workers_[r];
      while (!w.exited && w.pid > 0) {
        if (::waitpid(w.pid, &w.status, WNOHANG) == w.pid) {
          w.exited = true;
        } else if (std::chrono::steady_clock::now() > end) {
          return false;
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
    }
    return true;
  }
  void Signal(int rank, int sig) { ::kill(workers_[rank].pid, sig); }
  void Kill(int rank) {
    ::kill(workers_[rank].pid, SIGKILL);
    ::waitpid(workers_[rank].pid, &workers_[rank].status, 0);
    workers_[rank].exited = true;
  }
  // Waits until every rank's stdout holds `text` (a readiness line), until the deadline.
  bool WaitAllPrinted(const std::string& text, int timeout_ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (const Worker& w : workers_) {
      while (ReadFile(w.out_path).find(text) == std::string::npos) {
        if (std::chrono::steady_clock::now() > end) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    return true;
  }
  const Worker& worker(int r) const { return workers_[r]; }
  std::string Stderr(int r) const { return ReadFile(workers_[r].err_path); }
  int ExitCode(int r) const {
    const int s = workers_[r].status;
    return WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
  }
  bool server_ok() const { return server_ != nullptr; }

 private:
  static constexpr const char* kSecret = "0123456789abcdef0123456789abcdef";
  std::unique_ptr<TestJobServer> server_;
  std::vector<Worker> workers_;
};

// ringrun's named shared memory (/dev/shm/ringrun-*). Pairs use anonymous memfds, so a job
// must never create one.
int NamedShmSegments() {
  int found = 0;
  DIR* d = ::opendir("/dev/shm");
  if (d == nullptr) return 0;
  while (dirent* e = ::readdir(d)) found += std::string(e->d_name).rfind("ringrun-", 0) == 0;
  ::closedir(d);
  return found;
}

// How many shared-memory pair segments a live process has mapped.
int MappedPairSegments(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  int found = 0;
  for (std::string line; std::getline(maps, line);) {
    found += line.find("/memfd:ringrun-pair") != std::string::npos;
  }
  return found;
}

// Runs runtime_test_worker MODE on np ranks; every rank must exit 0.
void RunMode(int np, std::vector<std::string> env, const std::string& mode = "check") {
  Job job(np, env, mode);
  REQUIRE(job.server_ok());
  const bool done = job.WaitAll(120000);
  REQUIRE(done);
  for (int r = 0; r < np; ++r) {
    INFO("rank " << r << " stderr: " << job.Stderr(r));
    CHECK(job.ExitCode(r) == 0);
  }
  CHECK(NamedShmSegments() == 0);
}

}  // namespace

TEST_CASE("processes: collectives through the C API, shared memory", "[multiprocess]") {
  for (int np : {1, 2, 3, 5}) {
    DYNAMIC_SECTION("np=" << np) { RunMode(np, {}); }
  }
}

TEST_CASE("processes: collectives through the C API, TCP", "[multiprocess]") {
  for (int np : {2, 3}) {
    DYNAMIC_SECTION("np=" << np) { RunMode(np, {"RINGRUN_DISABLE_SHM=1"}); }
  }
}

TEST_CASE("processes: a stopped peer fails the others at the timeout, naming it",
          "[multiprocess][dead-peer]") {
  // SIGSTOP: the peer's sockets stay open (no EOF), so only the collective timeout can tell.
  for (const char* shm : {"0", "1"}) {
    DYNAMIC_SECTION("disable_shm=" << shm) {
      constexpr int kTimeoutMs = 3000;
      Job job(3,
              {"RINGRUN_TIMEOUT_MS=" + std::to_string(kTimeoutMs),
               std::string("RINGRUN_DISABLE_SHM=") + shm},
              "loop");
      REQUIRE(job.server_ok());
      REQUIRE(job.WaitAllPrinted("looping", 30000));  // each rank inside its allreduce loop
      const auto t0 = std::chrono::steady_clock::now();
      job.Signal(1, SIGSTOP);
      const bool done = job.WaitRanks({0, 2}, kTimeoutMs + 10000);
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - t0)
                          .count();
      job.Kill(1);
      REQUIRE(done);
      CHECK(ms < 3 * kTimeoutMs);  // one timeout, plus the neighbour's failure reaching it
      // Where the stop lands decides who tells. Inside a collective or a negotiation exchange
      // with rank 1, the transport times out naming "peer rank 1". Between them (rank 1 has
      // not submitted the next allreduce, and nothing is in flight to it), no transfer is
      // waiting, and the blocking call's own timeout breaks the job with the stall report,
      // which names rank 1 as the one that has not submitted. Either way a rank whose own
      // timeout did not fire first fails naming the peer that closed on it. A round that rank 2
      // starts reaches rank 0 through rank 1; with rank 1 stopped, rank 2 asks rank 0 to join
      // it (transport::Op::round), and both time out on rank 1 (without that, rank 0 reported
      // that rank 2 had not submitted, and rank 2 that rank 0 had closed).
      const std::string both = job.Stderr(0) + job.Stderr(2);
      const bool transport_timeout = both.find("timed out") != std::string::npos &&
                                     both.find("peer rank 1 ") != std::string::npos;
      const bool call_timeout = both.find("did not complete within 3000 ms") != std::string::npos &&
                                both.find("rank 1 has not submitted") != std::string::npos;
      for (int r : {0, 2}) {
        INFO("rank " << r << " stderr: " << job.Stderr(r));
        CHECK(job.ExitCode(r) == 3);
        CHECK((job.Stderr(r).find("peer rank") != std::string::npos ||
               job.Stderr(r).find("rank 1 has not submitted") != std::string::npos));
        // A rank that runs is never reported as the one that did not submit.
        CHECK(both.find("rank " + std::to_string(r) + " has not submitted") == std::string::npos);
      }
      INFO("stderr of ranks 0 and 2: " << both);
      // Rank 1 must still be stopped here (killed by Kill above: 128 + SIGKILL); a rank 1 gone
      // earlier (another signal) closed its connections, and the others rightly say so.
      INFO("rank 1: exit " << job.ExitCode(1) << ", stderr: " << job.Stderr(1));
      CHECK((transport_timeout || call_timeout));
    }
  }
}

TEST_CASE("processes: ranks waiting for a late one sleep, on every pair they wait on",
          "[multiprocess]") {
  // In a ring a rank waits on two pairs (its send and its receive neighbour): at np=3 with
  // both neighbours late, rank 1's send ring fills and its receive is empty, and it must sleep
  // on both bells at once (futex_waitv), not spin.
  for (int np : {2, 3}) {
    DYNAMIC_SECTION("np=" << np) { RunMode(np, {}, "late"); }
  }
}

TEST_CASE("processes: ringrun_init after ringrun_shutdown joins the job again", "[multiprocess]") {
  for (int np : {2, 3}) {
    DYNAMIC_SECTION("np=" << np) { RunMode(np, {}, "reinit"); }
  }
}

TEST_CASE("processes: ringrun_init at the open-file limit fails cleanly, and can be retried",
          "[multiprocess][engine]") {
  RunMode(1, {}, "nofd");
}

TEST_CASE("processes: running out of memory in a collective is an error, not an abort",
          "[multiprocess]") {
  // The others would wait 20 s (the timeout) if rank 0's failure did not close its connections.
  RunMode(2, {"RINGRUN_TIMEOUT_MS=20000"}, "oom");
}

TEST_CASE("processes: a peer killed mid-allreduce fails the others, without hanging",
          "[multiprocess][dead-peer]") {
  for (const char* shm : {"0", "1"}) {
    DYNAMIC_SECTION("disable_shm=" << shm) {
      constexpr int kNp = 3;
      constexpr int kTimeoutMs = 8000;
      Job job(kNp,
              {"RINGRUN_TIMEOUT_MS=" + std::to_string(kTimeoutMs),
               std::string("RINGRUN_DISABLE_SHM=") + shm},
              "loop");
      REQUIRE(job.server_ok());
      REQUIRE(job.WaitAllPrinted("looping", 30000));  // each rank inside its allreduce loop
      // Same-host pairs are shared memory unless disabled: rank 0 maps one per peer.
      CHECK(MappedPairSegments(job.worker(0).pid) == (std::string(shm) == "0" ? kNp - 1 : 0));
      const auto t0 = std::chrono::steady_clock::now();
      job.Kill(1);
      const bool done = job.WaitAll(kTimeoutMs + 5000);
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - t0)
                          .count();
      REQUIRE(done);
      CHECK(ms < kTimeoutMs + 2000);
      for (int r : {0, 2}) {
        INFO("rank " << r << " stderr: " << job.Stderr(r));
        CHECK(job.ExitCode(r) == 3);
        CHECK(job.Stderr(r).find("peer rank") != std::string::npos);
      }
      // Segments have no names, so a killed rank leaves none behind.
      CHECK(NamedShmSegments() == 0);
    }
  }
}

TEST_CASE("processes: the engine through the C API", "[multiprocess][engine]") {
  for (int np : {1, 2, 3}) {
    DYNAMIC_SECTION("np=" << np) { RunMode(np, {}, "engine"); }
  }
  RunMode(3, {"RINGRUN_DISABLE_SHM=1"}, "engine");
}

TEST_CASE("processes: process sets through the C API", "[multiprocess][process_set]") {
  for (int np : {2, 3}) {
    DYNAMIC_SECTION("np=" << np) { RunMode(np, {}, "sets"); }
  }
}

TEST_CASE("processes: a peer killed mid fused collective fails every pending handle",
          "[multiprocess][dead-peer][engine]") {
  for (const char* shm : {"0", "1"}) {
    DYNAMIC_SECTION("disable_shm=" << shm) {
      constexpr int kTimeoutMs = 8000;
      Job job(3,
              {"RINGRUN_TIMEOUT_MS=" + std::to_string(kTimeoutMs),
               std::string("RINGRUN_DISABLE_SHM=") + shm},
              "fused");
      REQUIRE(job.server_ok());
      REQUIRE(job.WaitAllPrinted("looping rank=", 30000));
      // Not a synchronization: let the fused steps run a while, so the kill lands mid-step.
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      const auto t0 = std::chrono::steady_clock::now();
      job.Kill(1);
      const bool done = job.WaitAll(kTimeoutMs + 5000);
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - t0)
                          .count();
      REQUIRE(done);
      CHECK(ms < kTimeoutMs);
      // A rank that loses rank 1 closes its own connections, so the other may see that rank
      // leave instead; at least one names rank 1.
      for (int r : {0, 2}) {
        INFO("rank " << r << " stderr: " << job.Stderr(r));
        CHECK(job.ExitCode(r) == 3);
      }
      CHECK((job.Stderr(0) + job.Stderr(2)).find("peer rank 1 ") != std::string::npos);
    }
  }
}

}  // namespace ringrun::runtime::testing
