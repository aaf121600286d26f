#include "runtime/src/transport/shm_pair.h"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

namespace ringrun::runtime::transport {

namespace {

constexpr size_t kShmChunk = 512 << 10;  // most bytes one progress step moves

long Futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

}  // namespace

Result<std::unique_ptr<ShmSegment>> MapShm(int fd, size_t ring_bytes, bool create) {
  const size_t len = ShmSegmentBytes(ring_bytes);
  if (create && ::ftruncate(fd, static_cast<off_t>(len)) != 0) {
    return ErrnoStatus("ftruncate shared memory", errno);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus("fstat shared memory", errno);
  if (static_cast<size_t>(st.st_size) != len) {
    return Internal("shared-memory segment of " + std::to_string(st.st_size) + " bytes, expected " +
                    std::to_string(len));
  }
  // MAP_POPULATE: fault the rings in now, on both sides. Left to the first messages, each new
  // ring page costs a page fault (and, under a hypervisor, the host's first touch), which made
  // the first iterations of a small allreduce many times slower than the rest.
  void* base = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) return ErrnoStatus("mmap shared memory", errno);
  auto seg = std::make_unique<ShmSegment>(base, len);
  if (create) {
    seg->header()->magic = kShmMagic;
    seg->header()->ring_bytes = ring_bytes;
  } else if (seg->header()->magic != kShmMagic || seg->header()->ring_bytes != ring_bytes) {
    return Internal("shared-memory segment has an unexpected layout");
  }
  return seg;
}

Result<bool> ShmPair::Progress(OpState& st) {
  ShmHeader* h = seg_->header();
  Op& op = *st.op;
  // Both sides pick the lane from the buffer's length, which a length-prefixed message does not
  // exceed.
  const bool small = ((op.bytes + 7) & ~size_t{7}) <= kSmallMessageBytes;
  const bool prefixed = op.length_prefixed && op.bytes >= 4;
  bool moved = false;
  // Each step moves at most kShmChunk so that a Run alternates between its ops.
  if (op.kind == Op::kSend) {
    size_t len = op.bytes;
    if (prefixed) {
      uint32_t l;
      std::memcpy(&l, op.buf, 4);
      len = std::min(op.bytes, 4 + size_t{l});
    }
    const size_t wire = (len + 7) & ~size_t{7};
    const Lane l = GetLane(side_, small);
    const uint64_t head = h->head[l.index].v.load(std::memory_order_relaxed);
    // The receiver's tail as last read: reading it again (a cache line that the receiver
    // writes) only when what it left free is too little.
    uint64_t& tail = seen_tail_[small ? 1 : 0];
    const size_t want = std::min(wire - st.done, kShmChunk);
    if (l.bytes - (head - tail) < want) {
      tail = h->tail[l.index].v.load(std::memory_order_acquire);
    }
    size_t n = std::min<size_t>({l.bytes - (head - tail), want});
    if (n > 0) {
      CopyIn(l, head, static_cast<const char*>(op.buf), op.bytes, st.done, n);
      h->head[l.index].v.store(head + n, std::memory_order_seq_cst);
      Notify(1 - side_);
      st.done += n, moved = true;
    }
    st.complete = st.done == wire;
  } else {
    const Lane l = GetLane(1 - side_, small);
    const uint64_t head = h->head[l.index].v.load(std::memory_order_acquire);
    const uint64_t tail = h->tail[l.index].v.load(std::memory_order_relaxed);
    size_t len = op.bytes;
    if (prefixed) {
      if (st.length == 0 && head != tail) {
        // The sender moves multiples of 8 bytes, and its first move holds the length word,
        // which never straddles the ring's end (positions are multiples of 8).
        uint32_t l32;
        std::memcpy(&l32, l.ring + tail % l.bytes, 4);
        st.length = std::min(op.bytes, 4 + size_t{l32});
      }
      len = st.length;  // 0 until seen: nothing moves
    }
    const size_t wire = (len + 7) & ~size_t{7};
    size_t n = std::min<size_t>({head - tail, wire - st.done, kShmChunk});
    if (n > 0) {
      CopyOut(l, tail, op, st.done, n);
      h->tail[l.index].v.store(tail + n, std::memory_order_seq_cst);
      Notify(1 - side_);
      st.done += n, moved = true;
    }
    st.complete = st.done == wire && (!prefixed || st.length > 0);
  }
  return moved;
}

void ShmPair::Notify(int other) {
  ShmHeader* h = seg_->header();
  h->bell[other].v.fetch_add(1, std::memory_order_seq_cst);
  uint32_t w = h->waiting[other].v.load(std::memory_order_seq_cst);
  if (w == 1) {
    Futex(&h->bell[other].v, FUTEX_WAKE, 1, nullptr);
  } else if (w == kIdleWaiting && h->waiting[other].v.compare_exchange_strong(w, 0)) {
    SendWakeByte();  // the peer sleeps in poll() on the lifeline: wake it (once)
  }
}

void ShmPair::SendWakeByte() {
  const char c = 0;
  (void)!::send(fd(), &c, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

void DrainWakeBytes(int fd) {
  char buf[64];
  while (::recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
  }
}

void ShmPair::CopyIn(const Lane& l, uint64_t pos, const char* src, size_t len, size_t off,
                     size_t n) {
  char* ring = l.ring;
  size_t real = off < len ? std::min(n, len - off) : 0;
  while (real > 0) {
    const size_t at = pos % l.bytes;
    const size_t k = std::min(real, l.bytes - at);
    std::memcpy(ring + at, src + off, k);
    pos += k, off += k, real -= k;
  }
}

void ShmPair::CopyOut(const Lane& l, uint64_t pos, Op& op, size_t off, size_t n) {
  const char* ring = l.ring;
  size_t real = off < op.bytes ? std::min(n, op.bytes - off) : 0;
  while (real > 0) {
    const size_t at = pos % l.bytes;
    const size_t k = std::min(real, l.bytes - at);
    char* dst = static_cast<char*>(op.buf) + off;
    if (op.kind == Op::kRecv) {
      std::memcpy(dst, ring + at, k);
    } else {
      const char* mine = static_cast<const char*>(op.src) + off;
      op.reduce(dst, op.incoming_first ? ring + at : mine, op.incoming_first ? mine : ring + at,
                k / op.elem_size);
      if (op.finish) op.finish->Apply(dst, k / op.elem_size);
    }
    pos += k, off += k, real -= k;
  }
}

// Sleeps until one of `bells` no longer holds its value in `seen`, or max_us pass. A rank in a
// ring waits on two pairs at once (sending to one neighbour, receiving from the other), and
// sleeping on one bell alone missed the other's progress until the timeout (ranks waiting on
// full send rings, each for a neighbour asleep on its own send ring): futex_waitv (Linux 5.16)
// sleeps on all of them. Where the kernel lacks it, the first bell, 200 us at most.
void WaitForBells(const std::vector<std::atomic<uint32_t>*>& bells,
                  const std::vector<uint32_t>& seen, int max_us) {
#if defined(FUTEX_WAITV_MAX) && defined(SYS_futex_waitv)  // kernel headers 5.16 and later
  static std::atomic<bool> no_waitv{false};
  if (bells.size() > 1 && bells.size() <= FUTEX_WAITV_MAX && !no_waitv.load()) {
    futex_waitv w[FUTEX_WAITV_MAX] = {};
    for (size_t i = 0; i < bells.size(); ++i) {
      w[i].val = seen[i];
      w[i].uaddr = reinterpret_cast<uintptr_t>(bells[i]);
      w[i].flags = FUTEX_32;  // shared (no FUTEX_PRIVATE_FLAG): the bells are in shared memory
    }
    timespec until;
    ::clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += max_us / 1000000;
    until.tv_nsec += (max_us % 1000000) * 1000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec += 1, until.tv_nsec -= 1000000000L;
    if (::syscall(SYS_futex_waitv, w, static_cast<unsigned>(bells.size()), 0u, &until,
                  CLOCK_MONOTONIC) >= 0 ||
        errno == EAGAIN || errno == EINTR || errno == ETIMEDOUT) {
      return;  // woken, a bell had moved already, a signal, or the timeout
    }
    // ENOSYS (an older kernel), EPERM (a seccomp filter that does not know it), ...: from now
    // on the fallback, which sleeps (returning at once here would make the caller spin).
    no_waitv.store(true);
  }
#endif
  if (bells.size() > 1) max_us = std::min(max_us, 200);
  timespec ts{max_us / 1000000, (max_us % 1000000) * 1000L};
  Futex(bells[0], FUTEX_WAIT, seen[0], &ts);
}

}  // namespace ringrun::runtime::transport
