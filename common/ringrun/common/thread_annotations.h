// The one mutex of ringrun, its scoped lock and its condition variable, with clang's
// thread-safety annotations (-Wthread-safety; other compilers ignore them). Every class whose
// fields are shared between threads groups them under "guarded by mu_" and marks each one
// GUARDED_BY(mu_); the `clang` preset then checks at compile time that every access holds the
// mutex. std::mutex is not used in the tree: libstdc++'s is not annotated.
//
// Why a futex and not pthread: glibc's pthread_mutex_lock and unlock run about 130 instructions
// together (type and elision checks, the owner's tid, a user count) around the two atomic
// operations that matter, and the engine takes its queue's lock once per gradient. Mutex is the
// three-state futex mutex of Drepper's "Futexes Are Tricky" (0 free, 1 locked, 2 locked with
// sleepers): an uncontended lock is one compare-and-swap, an unlock one exchange. Contended, it
// spins briefly and then sleeps on the futex. Not recursive. ThreadSanitizer sees its
// happens-before edges through the atomics.
//
// CondVar is a futex sequence word: a waiter reads it, releases the mutex and sleeps unless the
// word moved; Signal and SignalAll move it and wake. Waits may wake spuriously, so callers loop
// on their condition. Signalling costs no system call while nobody waits.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>

#if defined(__clang__)
#define RINGRUN_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define RINGRUN_THREAD_ANNOTATION(x)
#endif

// Where Abseil's headers (through gRPC's) came first, their macros of the same names, with the
// same meaning, stand.
#ifndef CAPABILITY
#define CAPABILITY(x) RINGRUN_THREAD_ANNOTATION(capability(x))
#endif
#ifndef SCOPED_CAPABILITY
#define SCOPED_CAPABILITY RINGRUN_THREAD_ANNOTATION(scoped_lockable)
#endif
#ifndef GUARDED_BY
#define GUARDED_BY(x) RINGRUN_THREAD_ANNOTATION(guarded_by(x))
#endif
#ifndef PT_GUARDED_BY
#define PT_GUARDED_BY(x) RINGRUN_THREAD_ANNOTATION(pt_guarded_by(x))
#endif
#ifndef REQUIRES
#define REQUIRES(...) RINGRUN_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#endif
#ifndef EXCLUDES
#define EXCLUDES(...) RINGRUN_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#endif
#ifndef ACQUIRE
#define ACQUIRE(...) RINGRUN_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#endif
#ifndef RELEASE
#define RELEASE(...) RINGRUN_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#endif
#ifndef TRY_ACQUIRE
#define TRY_ACQUIRE(...) RINGRUN_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#endif
#ifndef ASSERT_CAPABILITY
#define ASSERT_CAPABILITY(x) RINGRUN_THREAD_ANNOTATION(assert_capability(x))
#endif
#ifndef NO_THREAD_SAFETY_ANALYSIS
#define NO_THREAD_SAFETY_ANALYSIS RINGRUN_THREAD_ANNOTATION(no_thread_safety_analysis)
#endif

namespace ringrun {

// One step of a spin-wait: the x86 pause hint (lets the sibling hyperthread run, saves power).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

namespace internal {
// FUTEX_WAIT with an optional relative timeout; FUTEX_WAKE of up to `count` sleepers.
inline void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, const timespec* timeout) {
  (void)::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected,
                  timeout, nullptr, 0);
}
inline void FutexWake(std::atomic<uint32_t>* word, int count) {
  (void)::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, count, nullptr,
                  nullptr, 0);
}
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
}  // namespace internal

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() {
    uint32_t c = 0;
    if (!state_.compare_exchange_strong(c, 1, std::memory_order_acquire,
                                        std::memory_order_relaxed)) {
      LockSlow(c);
    }
  }
  bool TryLock() TRY_ACQUIRE(true) {
    uint32_t c = 0;
    return state_.compare_exchange_strong(c, 1, std::memory_order_acquire,
                                          std::memory_order_relaxed);
  }
  void Unlock() RELEASE() {
    if (state_.exchange(0, std::memory_order_release) == 2) internal::FutexWake(&state_, 1);
  }
  // Tells the analysis that the caller holds the mutex (where it cannot see so itself).
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  void LockSlow(uint32_t c) {
    for (int i = 0; i < 100 && c != 0; ++i) {
      CpuRelax();
      c = state_.load(std::memory_order_relaxed);
      if (c == 0 && state_.compare_exchange_strong(c, 1, std::memory_order_acquire,
                                                   std::memory_order_relaxed)) {
        return;
      }
    }
    // Marked as having sleepers (2) from here: whoever unlocks wakes one. Taking the lock in
    // this state keeps it 2, which costs at most one spurious wake-up.
    if (c != 2) c = state_.exchange(2, std::memory_order_acquire);
    while (c != 0) {
      internal::FutexWait(&state_, 2, nullptr);
      c = state_.exchange(2, std::memory_order_acquire);
    }
  }

  std::atomic<uint32_t> state_{0};
};

// Holds a Mutex for its scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable for Mutex. Each wait names the mutex the caller holds.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex* mu) REQUIRES(mu) { WaitFor(mu, nullptr); }
  // False when the deadline passed (the caller still re-checks its condition).
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline) REQUIRES(mu) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= left.zero()) return false;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    WaitFor(mu, &ts);
    return std::chrono::steady_clock::now() < deadline;
  }
  void Signal() { Wake(1); }
  void SignalAll() { Wake(INT_MAX); }

 private:
  void WaitFor(Mutex* mu, const timespec* timeout) REQUIRES(mu) {
    const uint32_t seq = seq_.load(std::memory_order_relaxed);
    waiters_.fetch_add(1, std::memory_order_relaxed);
    mu->Unlock();
    internal::FutexWait(&seq_, seq, timeout);
    waiters_.fetch_sub(1, std::memory_order_relaxed);
    mu->Lock();
  }
  void Wake(int count) {
    // The seq_cst pair (this increment, a waiter's increment of waiters_ before it reads seq_
    // under the mutex the signaller held or took) means a waiter that missed the new seq_ is
    // counted here.
    seq_.fetch_add(1, std::memory_order_seq_cst);
    if (waiters_.load(std::memory_order_seq_cst) != 0) internal::FutexWake(&seq_, count);
  }

  std::atomic<uint32_t> seq_{0};
  std::atomic<uint32_t> waiters_{0};
};

}  // namespace ringrun
