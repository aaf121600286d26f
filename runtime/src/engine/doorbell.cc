#include "runtime/src/engine/doorbell.h"

#include <sys/eventfd.h>

#include <cerrno>
#include <vector>

#include "ringrun/common/thread_annotations.h"

namespace ringrun::runtime::engine {
namespace {

struct DoorbellPool {
  Mutex mu;
  pid_t owner GUARDED_BY(mu) = 0;        // the process whose doorbells `free` holds
  std::vector<int> free GUARDED_BY(mu);  // open, no ring pending
};

DoorbellPool& Doorbells() {
  static DoorbellPool* pool = new DoorbellPool;  // never destroyed, as the doorbells
  return *pool;
}

}  // namespace

int TakeDoorbell() {
  DoorbellPool& pool = Doorbells();
  {
    MutexLock lock(&pool.mu);
    if (pool.owner != ::getpid()) {
      for (int fd : pool.free) ::close(fd);  // a parent's, inherited across fork()
      pool.free.clear();
      pool.owner = ::getpid();
    }
    if (!pool.free.empty()) {
      const int fd = pool.free.back();
      pool.free.pop_back();
      DrainDoorbell(fd);  // rings meant for its last engine
      return fd;
    }
  }
  const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  return fd >= 0 ? fd : -errno;
}

void ReturnDoorbell(int fd) {
  if (fd < 0) return;
  DoorbellPool& pool = Doorbells();
  MutexLock lock(&pool.mu);
  if (pool.owner != ::getpid()) return;  // an engine made before fork(): not this process's
  pool.free.push_back(fd);
}

}  // namespace ringrun::runtime::engine
