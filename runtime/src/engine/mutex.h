// Mutex: the engine's lock of its submission queue, taken once per submission.
//
// Why not std::mutex: glibc's pthread_mutex_lock and unlock run about 130 instructions together
// (type and elision checks, the owner's tid, a user count) around the two atomic operations
// that matter, and a training step takes this lock once per gradient: a tenth of a small
// submission. This is the three-state futex mutex of Drepper's "Futexes Are Tricky" (0 free,
// 1 locked, 2 locked with sleepers): an uncontended lock is one compare-and-swap and an unlock
// one exchange. Contended, it spins briefly (the engine holds it for a queue swap, well under a
// microsecond) and then sleeps on the futex. BasicLockable, for std::lock_guard; not recursive,
// no timed lock, no condition variable.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace ringrun::runtime::engine {

// One step of a spin-wait: the x86 pause hint (lets the sibling hyperthread run and saves power).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

class Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() {
    uint32_t c = 0;
    if (!state_.compare_exchange_strong(c, 1, std::memory_order_acquire,
                                        std::memory_order_relaxed)) {
      LockSlow(c);
    }
  }
  void unlock() {
    if (state_.exchange(0, std::memory_order_release) == 2) {
      Futex(FUTEX_WAKE_PRIVATE, 1);
    }
  }

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
      Futex(FUTEX_WAIT_PRIVATE, 2);
      c = state_.exchange(2, std::memory_order_acquire);
    }
  }
  void Futex(int op, uint32_t val) {
    (void)::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&state_), op, val, nullptr, nullptr, 0);
  }

  std::atomic<uint32_t> state_{0};
};
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

}  // namespace ringrun::runtime::engine
