#include "runtime/src/engine/handles.h"

#include "ringrun/common/clock.h"

namespace ringrun::runtime::engine {
namespace internal {

__thread HandleCache t_handles __attribute__((tls_model("initial-exec")));
std::atomic<int> waiters{0};

namespace {

// A thread keeps at most this many released states.
constexpr uint32_t kHandleCacheMax = 4096;

struct HandleCacheOwner {
  ~HandleCacheOwner() {
    t_handles.gone = true;
    while (HandleState* h = t_handles.top) {
      t_handles.top = h->next_free;
      delete h;
    }
    t_handles.count = 0;
  }
};

}  // namespace

HandleState* AllocateHandleState() { return new HandleState; }

void Recycle(HandleState* h, bool cache) {
  HandleCache& c = t_handles;
  if (!cache || c.gone || c.count >= kHandleCacheMax) {
    delete h;
    return;
  }
  if (!c.owned) {
    thread_local HandleCacheOwner owner;  // registers its destructor, once per thread
    (void)owner;
    c.owned = true;
  }
  h->flags.store(0, std::memory_order_relaxed);
  h->name_ptr = nullptr;
  h->code = Code::kOk;
  if (!h->message.empty()) h->message.clear();
  h->remaining = 0;
  h->kind = Kind::kAllreduce;
  h->elem = 0;
  h->wait_ms = 0;
  if (h->output.capacity() > (size_t{64} << 10)) {  // a cache keeps no large results
    std::vector<char>().swap(h->output);
  } else {
    h->output.clear();
  }
  h->rows.clear();
  h->last_joined = -1;
  if (h->device_output) h->device_output.reset();
  h->device_output_bytes = 0;
  h->next_free = c.top;
  c.top = h;
  ++c.count;
}

void WakeWaiter(HandleState* h) {
  h->flags.fetch_or(HandleState::kDone);
  // The waiter holds mu from setting kWaiting until it sleeps: once we have held it, the
  // waiter sleeps (and is woken below) or sees kDone. Notified after unlocking, a waiter does
  // not wake only to block on the mutex we hold. Our share keeps h alive meanwhile.
  { MutexLock lock(&h->mu); }
  h->cv.SignalAll();
  EngineDone(h);
}

}  // namespace internal

void ReleaseHandle(HandleState* h) {
  // The usual case, a handle released after it completed: the engine has let go already and
  // never touches h again, so nobody races for the last reference and no read-modify-write is
  // needed to take it.
  if (h->flags.load(std::memory_order_acquire) & HandleState::kEngineGone) {
    internal::Recycle(h, true);
    return;
  }
  if (h->flags.fetch_or(HandleState::kReleased) & HandleState::kEngineGone) {
    internal::Recycle(h, true);
  }
}

void EngineDone(HandleState* h) {
  if (h->flags.fetch_or(HandleState::kEngineGone) & HandleState::kReleased) {
    internal::Recycle(h, false);
  }
}

std::shared_ptr<HandleState> ShareHandle(HandleState* h) {
  return std::shared_ptr<HandleState>(h, ReleaseHandle);
}

Code WaitHandle(HandleState& h, int timeout_ms) {
  if (h.done()) return h.code;
  // Counted process-wide (an engine may be gone by the time a waiter leaves).
  internal::waiters.fetch_add(1, std::memory_order_relaxed);
  const Deadline deadline = DeadlineAfter(timeout_ms);
  bool done;
  {
    MutexLock lock(&h.mu);
    h.flags.fetch_or(HandleState::kWaiting);
    while (!(done = (h.flags.load() & HandleState::kDone) != 0)) {
      if (!h.cv.WaitUntil(&h.mu, deadline)) {
        done = (h.flags.load() & HandleState::kDone) != 0;
        break;
      }
    }
  }
  internal::waiters.fetch_sub(1, std::memory_order_relaxed);
  return done ? h.code : Code::kTimeout;
}

}  // namespace ringrun::runtime::engine
