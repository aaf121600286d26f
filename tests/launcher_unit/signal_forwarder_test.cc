// SignalForwarder (launcher/job/signal_forwarder.h), with real signals sent to this process.
//
// A process-directed signal goes to any thread that does not block it, and the default action
// of these signals ends the process: so these tests live in their own executable
// (launcher_signal_tests), whose process starts no thread before a forwarder exists. Signals are
// sent with kill(getpid()), as they come from outside (a terminal, Slurm, `kill`): raise() and
// pthread_kill() direct a signal at one thread, where it stays pending, unseen by the forwarder's
// sigtimedwait. Every wait has a deadline, so a lost signal fails the test instead of hanging it.
#include "launcher/job/signal_forwarder.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace ringrun::launcher::job {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr auto kDeadline = std::chrono::seconds(10);
const std::vector<int> kJobSignals = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2};

// What the callback saw: each signal and the thread it was called on.
class Recorder {
 public:
  void Record(int signo) {
    std::lock_guard<std::mutex> lock(mu_);
    signals_.push_back(signo);
    threads_.push_back(std::this_thread::get_id());
    cv_.notify_all();
  }
  // Waits until `n` signals were recorded, for kDeadline at most.
  bool WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kDeadline, [&] { return signals_.size() >= n; });
  }
  std::vector<int> signals() const {
    std::lock_guard<std::mutex> lock(mu_);
    return signals_;
  }
  std::vector<std::thread::id> threads() const {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> signals_;
  std::vector<std::thread::id> threads_;
};

sigset_t CurrentMask() {
  sigset_t m;
  sigemptyset(&m);
  pthread_sigmask(SIG_SETMASK, nullptr, &m);
  return m;
}

bool Blocked(const sigset_t& mask, int signo) { return sigismember(&mask, signo) == 1; }

// Restores the calling thread's signal mask when the test ends, however it ends.
class MaskGuard {
 public:
  MaskGuard() { pthread_sigmask(SIG_SETMASK, nullptr, &saved_); }
  ~MaskGuard() { pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }

 private:
  sigset_t saved_;
};

TEST_CASE("signal forwarder: each job signal reaches the callback once, on its own thread",
          "[signals]") {
  Recorder rec;
  {
    SignalForwarder fwd(kJobSignals, [&](int s) { rec.Record(s); });
    for (size_t i = 0; i < kJobSignals.size(); ++i) {
      INFO("signal " << kJobSignals[i]);
      // One at a time: two of the same signal pending at once would merge into one.
      REQUIRE(::kill(::getpid(), kJobSignals[i]) == 0);
      REQUIRE(rec.WaitFor(i + 1));
    }
  }
  CHECK(rec.signals() == kJobSignals);  // and nothing more once the forwarder has stopped
  for (std::thread::id t : rec.threads()) {
    CHECK(t != std::this_thread::get_id());
    CHECK(t == rec.threads().front());
  }
}

TEST_CASE("signal forwarder: signals that arrive while the callback runs come after it",
          "[signals]") {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  Recorder rec;
  {
    SignalForwarder fwd({SIGUSR1, SIGUSR2, SIGHUP}, [&](int s) {
      rec.Record(s);
      if (s != SIGHUP) return;
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, kDeadline, [&] { return release; });
    });
    REQUIRE(::kill(::getpid(), SIGHUP) == 0);
    REQUIRE(rec.WaitFor(1));  // the callback is busy with SIGHUP now
    REQUIRE(::kill(::getpid(), SIGUSR1) == 0);
    REQUIRE(::kill(::getpid(), SIGUSR2) == 0);
    {
      std::lock_guard<std::mutex> lock(mu);
      release = true;
    }
    cv.notify_all();
    REQUIRE(rec.WaitFor(3));
  }
  std::vector<int> got = rec.signals();
  REQUIRE(got.size() == 3);
  CHECK(got[0] == SIGHUP);
  // Both pending signals are taken, in whichever order the kernel hands them over.
  CHECK(((got[1] == SIGUSR1 && got[2] == SIGUSR2) || (got[1] == SIGUSR2 && got[2] == SIGUSR1)));
}

TEST_CASE("signal forwarder: blocks its signals here and in later threads, then restores the mask",
          "[signals]") {
  MaskGuard guard;
  // A starting mask with something blocked already, one of the forwarder's signals among it:
  // the destructor must bring back exactly this, not an empty mask.
  sigset_t start;
  sigemptyset(&start);
  sigaddset(&start, SIGWINCH);
  sigaddset(&start, SIGUSR1);
  REQUIRE(pthread_sigmask(SIG_SETMASK, &start, nullptr) == 0);
  const sigset_t before = CurrentMask();
  {
    SignalForwarder fwd({SIGINT, SIGTERM, SIGUSR1}, [](int) {});
    const sigset_t during = CurrentMask();
    for (int s : {SIGINT, SIGTERM, SIGUSR1, SIGWINCH}) {
      INFO("signal " << s);
      CHECK(Blocked(during, s));
    }
    CHECK_FALSE(Blocked(during, SIGHUP));
    sigset_t in_thread;
    std::thread([&] { in_thread = CurrentMask(); }).join();
    CHECK(Blocked(in_thread, SIGINT));
    CHECK(Blocked(in_thread, SIGTERM));
  }
  const sigset_t after = CurrentMask();
  for (int s = 1; s < SIGRTMIN; ++s) {
    INFO("signal " << s);
    CHECK(Blocked(after, s) == Blocked(before, s));
  }
}

volatile sig_atomic_t g_sigpipe_count = 0;  // counts calls of the handler below: none expected
void CountSigpipe(int) { g_sigpipe_count = g_sigpipe_count + 1; }

TEST_CASE("signal forwarder: SIGPIPE is ignored while it lives, and its handler comes back after",
          "[signals]") {
  struct sigaction mine {
  }, original{};
  mine.sa_handler = CountSigpipe;
  sigemptyset(&mine.sa_mask);
  REQUIRE(sigaction(SIGPIPE, &mine, &original) == 0);
  g_sigpipe_count = 0;
  {
    SignalForwarder fwd({SIGUSR1}, [](int) {});
    struct sigaction now {};
    REQUIRE(sigaction(SIGPIPE, nullptr, &now) == 0);
    CHECK(now.sa_handler == SIG_IGN);
    // A write to a pipe nobody reads fails with EPIPE instead of raising SIGPIPE's action.
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    ::close(fds[0]);
    const char c = 'x';
    const ssize_t n = ::write(fds[1], &c, 1);
    const int err = errno;
    ::close(fds[1]);
    CHECK(n == -1);
    CHECK(err == EPIPE);
    CHECK(g_sigpipe_count == 0);
  }
  struct sigaction after {};
  REQUIRE(sigaction(SIGPIPE, nullptr, &after) == 0);
  CHECK(after.sa_handler == CountSigpipe);
  REQUIRE(sigaction(SIGPIPE, &original, nullptr) == 0);
}

TEST_CASE("signal forwarder: destruction is prompt and forwards nothing more", "[signals]") {
  Recorder rec;
  const auto t0 = steady_clock::now();
  {
    SignalForwarder fwd(kJobSignals, [&](int s) { rec.Record(s); });
  }
  const auto ms = std::chrono::duration_cast<milliseconds>(steady_clock::now() - t0).count();
  // The destructor wakes the thread's sigtimedwait with one of its own signals, which must not
  // reach the callback; it must not wait out a poll period either (generous bound: a loaded CI).
  CHECK(ms < 2000);
  CHECK(rec.signals().empty());
}

}  // namespace
}  // namespace ringrun::launcher::job
