// Handles: the object behind a ringrun_handle (HandleState), who owns it when, and the
// per-thread caches that reuse released ones.
//
// Ownership. A handle has two owners: the user (ringrun_release, or the last ShareHandle copy
// dropped) and the engine (done with it). Each lets go by setting a bit; whichever sets its bit
// second recycles the state, so the engine never touches a reference count that the user's
// thread owns. A handle released after the engine let go (the usual case) is taken back with a
// load, without a read-modify-write.
//
// Completion. CompleteHandle marks a handle done: one compare-and-swap when nobody sleeps on it;
// when a waiter has said it sleeps, the engine marks it done, takes and drops the handle's mutex
// (the waiter holds it until it sleeps) and only then notifies, so the waiter does not wake only
// to block on a mutex the engine still holds. A waiter that finds the handle done reads its
// result without a lock.
//
// Reuse. Released states are kept per thread (a training step has hundreds in flight, more than
// malloc's per-thread cache holds) in an initial-exec thread-local: one %fs-relative access,
// no call to __tls_get_addr, no guard. The engine thread submits nothing, so what it recycles
// is freed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ringrun/common/status.h"
#include "ringrun/common/thread_annotations.h"
#include "runtime/src/engine/request.h"

namespace ringrun::runtime::engine {

// The object behind a ringrun_handle.
struct HandleState {
  // Who is done with it, and whether someone sleeps on it (see the file comment). kDone is set
  // once everything below is written: a waiter that finds it reads the results without a lock.
  // A waiter that must sleep sets kWaiting under mu and sleeps on cv. The engine sets kDone and
  // kEngineGone together, in one compare-and-swap that fails if kWaiting appears; when it finds
  // kWaiting it sets kDone, locks and unlocks mu, notifies, and only then lets go.
  static constexpr uint8_t kDone = 1, kWaiting = 2, kEngineGone = 4, kReleased = 8;
  std::atomic<uint8_t> flags{0};
  bool done() const { return flags.load(std::memory_order_acquire) & kDone; }
  Mutex mu;
  CondVar cv;
  // Written by the engine thread before done; read after: how it ended, and why (a failure).
  Code code = Code::kOk;
  std::string message;
  int remaining = 0;  // entries not complete yet (the engine thread's)
  // Constant after submission.
  // A named tensor's handle points at the interned name (InternName), another's owns it.
  const std::string* name_ptr = nullptr;
  std::string name_;
  const std::string& name() const { return name_ptr ? *name_ptr : name_; }
  Kind kind = Kind::kAllreduce;
  size_t elem = 0;
  int wait_ms = 0;  // the collective timeout: ringrun_wait's bound
  // Written by the engine before done is set; read after.
  std::vector<char> output;
  std::vector<size_t> rows;
  int last_joined = -1;
  // Device allgather/alltoall through a handle: the result, in device memory that the handle
  // owns (freed with it), instead of `output`.
  std::shared_ptr<void> device_output;
  size_t device_output_bytes = 0;
  HandleState* next_free = nullptr;  // in a thread's cache of released states
};

// A HandleState for a new submission, from this thread's cache when it has one. The user's
// reference ends with ReleaseHandle (a ringrun_handle is the state itself: ringrun_release),
// the engine's with EngineDone or CompleteHandle; neither touches h afterwards.
inline HandleState* NewHandleState();
void ReleaseHandle(HandleState* h);
void EngineDone(HandleState* h);
// Owns the user's reference of h (for C++ callers): ReleaseHandle when the last copy goes.
std::shared_ptr<HandleState> ShareHandle(HandleState* h);

// Marks h done (its results written) and lets the engine's reference go, waking a waiter.
// Engine thread.
inline void CompleteHandle(HandleState* h);

// Waits for h up to timeout_ms: its code once done, or kTimeout if it has not completed by
// then (h.done() tells the two timeouts apart). Any thread.
Code WaitHandle(HandleState& h, int timeout_ms);
// Whether some thread of the process is inside WaitHandle, on any engine's handle (the engine
// stops gathering a burst of submissions as soon as anyone waits).
inline bool SomeoneWaits();

// ---- inline definitions (the submission and completion paths) ----

namespace internal {

// A thread's cache of released states: a list through HandleState::next_free. Trivially
// destructible and constant-initialized, so that it is still readable after the thread's
// destructors ran; the first state cached on a thread registers the owner that frees the list
// at the thread's exit (handles.cc).
struct HandleCache {
  HandleState* top = nullptr;
  uint32_t count = 0;
  bool owned = false;  // the owner is registered
  bool gone = false;   // the owner ran: free, do not cache (a late release, from a destructor)
};
// __thread rather than thread_local: an extern thread_local is reached through a wrapper call
// (it might have a dynamic initializer in its own file); this one is a plain initial-exec
// access. It takes 24 bytes of the static TLS that glibc keeps for libraries loaded later with
// dlopen (Python loads this one so).
extern __thread HandleCache t_handles __attribute__((tls_model("initial-exec")));

// A new state, for an empty cache (out of line: the inline path stays a few instructions).
HandleState* AllocateHandleState();
// Resets h and keeps it in this thread's cache (cache: the thread submits), or frees it.
void Recycle(HandleState* h, bool cache);
// CompleteHandle's path when a waiter sleeps on h.
void WakeWaiter(HandleState* h);
// Threads inside WaitHandle, in every engine of the process.
extern std::atomic<int> waiters;

}  // namespace internal

inline HandleState* NewHandleState() {
  internal::HandleCache& c = internal::t_handles;
  if (HandleState* h = c.top) {
    c.top = h->next_free;
    --c.count;
    return h;
  }
  return internal::AllocateHandleState();
}

inline void CompleteHandle(HandleState* h) {
  // Nobody sleeps on it (the usual case): done and let go in one read-modify-write.
  uint8_t v = h->flags.load(std::memory_order_relaxed);
  while (!(v & HandleState::kWaiting)) {
    if (h->flags.compare_exchange_weak(v, v | HandleState::kDone | HandleState::kEngineGone)) {
      if (v & HandleState::kReleased) internal::Recycle(h, false);
      return;
    }
  }
  internal::WakeWaiter(h);
}

inline bool SomeoneWaits() { return internal::waiters.load(std::memory_order_relaxed) != 0; }

}  // namespace ringrun::runtime::engine
