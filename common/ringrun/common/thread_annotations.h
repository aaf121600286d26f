// Clang's thread-safety annotations (-Wthread-safety; other compilers ignore them), and a mutex
// that carries them. libstdc++'s std::mutex and std::lock_guard are not annotated, so a class
// whose fields are GUARDED_BY a mutex uses ringrun::Mutex, ringrun::MutexLock and
// ringrun::CondVar instead; the analysis then checks at compile time that every access holds
// the mutex. Build with the `clang` preset to run it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define RINGRUN_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define RINGRUN_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) RINGRUN_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY RINGRUN_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) RINGRUN_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) RINGRUN_THREAD_ANNOTATION(pt_guarded_by(x))
#define REQUIRES(...) RINGRUN_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) RINGRUN_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) RINGRUN_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) RINGRUN_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define NO_THREAD_SAFETY_ANALYSIS RINGRUN_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace ringrun {

// A std::mutex the analysis knows about. Not recursive.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
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

// A condition variable for Mutex. Each wait names the mutex the caller holds (so the analysis
// can check it); waits may wake spuriously, so callers loop on their condition.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held, by the caller
  }
  // False when the deadline passed.
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace ringrun
