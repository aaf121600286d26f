// TCP and shared-memory pairs under one Transport, with lazy connection setup.
//
// Connection rule: the lower rank connects to the higher; the higher accepts on its listener
// and learns the connector's rank from a hello. Connecting never waits on the peer's program
// (the kernel completes the handshake from the listen backlog), so lazy setup cannot deadlock.
// Same-host pairs with shared memory on: the connector reaches the peer's local listener, an
// abstract Unix socket named after the peer's TCP endpoint, creates an anonymous memfd
// segment and passes it with the hello (SCM_RIGHTS). Nothing has a name in any file system, so
// nothing can be left behind however the job ends: the kernel frees the segment with its last
// mapping. The Unix socket stays open as the peer's lifeline: its EOF means the peer died.
// Where the local listener cannot be reached (another network namespace, say), the pair is TCP.
#include <arpa/inet.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <thread>

#include "ringrun/common/defaults.h"
#include "runtime/src/transport.h"

namespace ringrun::runtime {

std::string PeerTable::Describe(int r) const {
  if (r < 0 || r >= size()) return "rank " + std::to_string(r);
  return "rank " + std::to_string(r) + " (" + address(r) + ":" + std::to_string(port_of_rank[r]) +
         ")";
}

namespace {

constexpr uint32_t kHelloMagic = 0x52475233;  // "RGR3"
constexpr size_t kMaxShmRingBytes = size_t{1} << 30;
// A TCP Progress step moves at most kTcpChunk bytes of one op, so that a Run alternates between
// its sends and receives instead of filling one socket direction while the other idles; 128 KiB
// against 1 MiB took two-host 64 MiB allreduces over veth from ~70 to ~50-55 ms (median of
// 6-8 alternating rounds; benchmarks/veth_allreduce.sh). A RecvReduce stages at most
// kStagingBytes before reducing them, small enough to stay in L2 (64 KiB beat 16-256 KiB).
constexpr size_t kTcpChunk = 128 << 10;
constexpr size_t kStagingBytes = 64 << 10;
constexpr size_t kShmChunk = 512 << 10;  // most bytes one shm progress step moves
// Busy-wait this long on a shared-memory pair before sleeping on its futex (only when this
// host's ranks do not outnumber its CPUs). Waking a sleeping rank costs tens of microseconds
// under a hypervisor, paid once per collective phase when ranks arrive a little apart; Open MPI
// and NCCL poll without end. 1 ms against 50 us: fashion_mnist at np=2, 3 epochs, median of six
// alternating runs 4.35 s against 4.6 s.
constexpr int kSpinUs = kShmSpinUs;  // defaults.h

struct Hello {
  uint32_t magic;
  uint32_t rank;
  uint64_t job_tag;
  uint64_t ring_bytes;  // on the local socket: the passed segment's ring size; on TCP: 0
};

uint64_t JobTag(const std::string& job_id) { return std::hash<std::string>{}(job_id) | 1; }

int MsUntil(Deadline d) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d - Clock::now()).count();
  return ms <= 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

// Waits until `fd` may be ready for `events`; kTimeout once the deadline has passed.
Status WaitFd(int fd, short events, Deadline deadline) {
  pollfd pfd{fd, events, 0};
  int ms = MsUntil(deadline);
  if (ms == 0) return Timeout("timed out");
  if (::poll(&pfd, 1, ms) < 0 && errno != EINTR) return ErrnoStatus("poll", errno);
  return Status::Ok();
}

// Blocking-style I/O on a non-blocking fd, bounded by a deadline.
Status IoFull(int fd, void* buf, size_t len, bool write, Deadline deadline) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t n = write ? ::send(fd, p, len, MSG_NOSIGNAL) : ::recv(fd, p, len, 0);
    if (n > 0) {
      p += n, len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Unavailable("connection closed");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return ErrnoStatus(write ? "send" : "recv", errno);
    RINGRUN_RETURN_IF_ERROR(WaitFd(fd, write ? POLLOUT : POLLIN, deadline));
  }
  return Status::Ok();
}

Result<sockaddr_in> ParseAddr(const std::string& host, uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) {
    return InvalidArgument("not an IPv4 address: '" + host + "'");
  }
  return sa;
}

void TuneSocket(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// ---- shared memory ----------------------------------------------------------------------

struct alignas(64) PaddedU32 {
  std::atomic<uint32_t> v{0};
};
struct alignas(64) PaddedU64 {
  std::atomic<uint64_t> v{0};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shm needs lock-free atomics");

// A segment holds four rings ("lanes"). Lane d (0, 1) carries large messages from side d to
// side 1-d; lane 2 + d carries that direction's messages of at most kSmallMessageBytes in a
// small ring that stays hot in both cores' caches (a 4 KiB message walking a 1 MiB ring touched
// cold lines every time: 4 KiB allreduce ~2.9 us with one ring, ~2.0 with a 16 KiB one). Both
// sides pick the lane from the message's length, so each lane stays in message order. Side 0 is
// the connector.
constexpr size_t kSmallMessageBytes = 8 << 10;
constexpr size_t kSmallRingBytes = 32 << 10;
struct ShmHeader {
  uint64_t magic;
  uint64_t ring_bytes;   // of the large lanes
  PaddedU32 bell[2];     // bumped whenever something side s may wait for changes
  PaddedU32 waiting[2];  // side s is about to sleep on bell[s]
  PaddedU64 head[4];     // lane l: bytes produced (written by side l % 2)
  PaddedU64 tail[4];     // lane l: bytes consumed (written by side 1 - l % 2)
};
constexpr size_t kShmDataOffset = (sizeof(ShmHeader) + 4095) & ~size_t{4095};
// Each lane has a region of its ring's size plus a page and starts kLaneSkew bytes into it.
// Page-aligned rings with page-aligned user buffers put the reduction's loads and stores at the
// same offsets within a page (4K aliasing): a 4 KiB allreduce took ~1.9 us from a fresh ring
// position and ~1.0 us from one skewed by earlier odd-sized messages.
constexpr size_t kLaneSkew = 2048 + 64;
constexpr size_t ShmSegmentBytes(size_t ring_bytes) {
  return kShmDataOffset + 2 * (ring_bytes + 4096) + 2 * (kSmallRingBytes + 4096);
}
constexpr uint64_t kShmMagic = 0x72696e6772756e31ull;

long Futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

// One mapping of a segment.
class ShmSegment {
 public:
  ShmSegment(void* base, size_t len) : base_(base), len_(len) {}
  ~ShmSegment() { ::munmap(base_, len_); }
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ShmHeader* header() const { return static_cast<ShmHeader*>(base_); }
  char* data() const { return static_cast<char*>(base_) + kShmDataOffset; }

 private:
  void* base_;
  size_t len_;
};

// Maps the segment behind `fd`. create: sizes it and writes the header; otherwise checks it.
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
  // ring page cost a page fault (and, under a hypervisor, the host's first touch): a 4 KiB
  // allreduce averaged 9-73 us over its first 25 iterations instead of ~2 us.
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

// The abstract Unix socket name (no file) of the local listener of the rank at address:port.
// Abstract names belong to a network namespace, as the TCP port does, and the port is this
// rank's while it runs, so among ringrun's ranks the name is unique. Anyone may bind an
// abstract name, so both ends also check that the other runs as the same user (SameUser).
sockaddr_un LocalName(const std::string& address, uint16_t port, socklen_t* len) {
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  const int n = std::snprintf(un.sun_path + 1, sizeof(un.sun_path) - 1, "ringrun/%s:%u",
                              address.c_str(), static_cast<unsigned>(port));
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 +
                                std::min<size_t>(n, sizeof(un.sun_path) - 2));
  return un;
}

// Whether the process at the other end of a Unix socket runs as this process's user.
bool SameUser(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  return ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == ::getuid();
}

// Sends the hello, with `pass_fd` attached when >= 0.
Status SendHello(int fd, const Hello& hello, int pass_fd, Deadline deadline) {
  if (pass_fd < 0) return IoFull(fd, const_cast<Hello*>(&hello), sizeof(hello), true, deadline);
  iovec iov{const_cast<Hello*>(&hello), sizeof(hello)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov, msg.msg_iovlen = 1;
  msg.msg_control = control, msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  for (;;) {
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(sizeof(hello))) return Status::Ok();
    if (n >= 0) return Internal("short hello");  // a Unix stream sends small messages whole
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return ErrnoStatus("sendmsg", errno);
    RINGRUN_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline));
  }
}

// Receives a hello and the fd passed with it (*passed: invalid when none came).
Status RecvHello(int fd, Hello* hello, UniqueFd* passed, Deadline deadline) {
  char* p = reinterpret_cast<char*>(hello);
  size_t got = 0;
  while (got < sizeof(*hello)) {
    iovec iov{p + got, sizeof(*hello) - got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov, msg.msg_iovlen = 1;
    msg.msg_control = control, msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          int received;
          std::memcpy(&received, CMSG_DATA(c), sizeof(int));
          *passed = UniqueFd(received);
        }
      }
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Unavailable("connection closed");
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return ErrnoStatus("recvmsg", errno);
    RINGRUN_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline));
  }
  return Status::Ok();
}

}  // namespace

// ---- pairs --------------------------------------------------------------------------------

// The progress of one Op.
struct OpState {
  Op* op;
  size_t done = 0;  // bytes of the op moved (shm: wire bytes, including padding)
  bool complete = false;
};

class Pair {
 public:
  explicit Pair(UniqueFd fd) : fd_(std::move(fd)) {}
  virtual ~Pair() = default;
  // Moves what it can without blocking; returns whether anything moved.
  virtual Result<bool> Progress(OpState& st) = 0;
  virtual bool is_shm() const = 0;
  int fd() const { return fd_.get(); }

 protected:
  UniqueFd fd_;
};

class TcpPair final : public Pair {
 public:
  using Pair::Pair;
  bool is_shm() const override { return false; }

  Result<bool> Progress(OpState& st) override {
    Op& op = *st.op;
    bool moved = false;
    const size_t limit = std::min(op.bytes, st.done + kTcpChunk);
    while (st.done < limit) {
      if (op.kind == Op::kSend) {
        ssize_t n = ::send(fd(), static_cast<char*>(op.buf) + st.done, limit - st.done,
                           MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          return ErrnoStatus("send", errno);
        }
        st.done += static_cast<size_t>(n), moved = true;
      } else if (op.kind == Op::kRecv) {
        ssize_t n =
            ::recv(fd(), static_cast<char*>(op.buf) + st.done, limit - st.done, MSG_DONTWAIT);
        if (n == 0) return Unavailable("connection closed by peer");
        if (n < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          return ErrnoStatus("recv", errno);
        }
        st.done += static_cast<size_t>(n), moved = true;
      } else {
        if (staging_.empty()) staging_.resize(kStagingBytes);
        // staged_ bytes of the op past st.done sit at the start of staging_.
        const size_t want = std::min(op.bytes - st.done, kStagingBytes) - staged_;
        ssize_t n = ::recv(fd(), staging_.data() + staged_, want, MSG_DONTWAIT);
        if (n == 0) return Unavailable("connection closed by peer");
        if (n < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          return ErrnoStatus("recv", errno);
        }
        staged_ += static_cast<size_t>(n), moved = true;
        const size_t whole = staged_ - staged_ % op.elem_size;
        if (whole > 0) {
          const char* mine = static_cast<const char*>(op.src) + st.done;
          const char* in = staging_.data();
          op.reduce(static_cast<char*>(op.buf) + st.done, op.incoming_first ? in : mine,
                    op.incoming_first ? mine : in, whole / op.elem_size);
          std::memmove(staging_.data(), staging_.data() + whole, staged_ - whole);
          staged_ -= whole;
          st.done += whole;
        }
      }
    }
    st.complete = st.done == op.bytes;
    return moved;
  }

 private:
  std::vector<char> staging_;
  size_t staged_ = 0;
};

class ShmPair final : public Pair {
 public:
  ShmPair(UniqueFd lifeline, std::unique_ptr<ShmSegment> seg, int side)
      : Pair(std::move(lifeline)),
        seg_(std::move(seg)),
        side_(side),
        ring_bytes_(seg_->header()->ring_bytes) {}
  bool is_shm() const override { return true; }

  Result<bool> Progress(OpState& st) override {
    ShmHeader* h = seg_->header();
    Op& op = *st.op;
    const size_t wire = (op.bytes + 7) & ~size_t{7};
    const bool small = wire <= kSmallMessageBytes;
    bool moved = false;
    // Each step moves at most kShmChunk so that a Run alternates between its ops.
    if (op.kind == Op::kSend) {
      const Lane l = GetLane(side_, small);
      const uint64_t head = h->head[l.index].v.load(std::memory_order_relaxed);
      const uint64_t tail = h->tail[l.index].v.load(std::memory_order_acquire);
      size_t n = std::min<size_t>({l.bytes - (head - tail), wire - st.done, kShmChunk});
      if (n > 0) {
        CopyIn(l, head, static_cast<const char*>(op.buf), op.bytes, st.done, n);
        h->head[l.index].v.store(head + n, std::memory_order_seq_cst);
        Notify(1 - side_);
        st.done += n, moved = true;
      }
    } else {
      const Lane l = GetLane(1 - side_, small);
      const uint64_t head = h->head[l.index].v.load(std::memory_order_acquire);
      const uint64_t tail = h->tail[l.index].v.load(std::memory_order_relaxed);
      size_t n = std::min<size_t>({head - tail, wire - st.done, kShmChunk});
      if (n > 0) {
        CopyOut(l, tail, op, st.done, n);
        h->tail[l.index].v.store(tail + n, std::memory_order_seq_cst);
        Notify(1 - side_);
        st.done += n, moved = true;
      }
    }
    st.complete = st.done == wire;
    return moved;
  }

  // Sleeping on this pair's bell: PrepareWait (returns the bell's value), re-check progress,
  // then sleep while the bell still holds that value (WaitForBells), then CancelWait.
  uint32_t PrepareWait() {
    seg_->header()->waiting[side_].v.store(1, std::memory_order_seq_cst);
    return bell()->load(std::memory_order_seq_cst);
  }
  void CancelWait() { seg_->header()->waiting[side_].v.store(0, std::memory_order_relaxed); }
  // This side's bell: the peer bumps it (and wakes it when this side waits) on every change.
  std::atomic<uint32_t>* bell() const { return &seg_->header()->bell[side_].v; }

 private:
  void Notify(int other) {
    ShmHeader* h = seg_->header();
    h->bell[other].v.fetch_add(1, std::memory_order_seq_cst);
    if (h->waiting[other].v.load(std::memory_order_seq_cst)) {
      Futex(&h->bell[other].v, FUTEX_WAKE, 1, nullptr);
    }
  }
  struct Lane {
    int index;     // into head/tail
    char* ring;    // its bytes
    size_t bytes;  // a power of two
  };
  // The lane of messages from side `from`, small or large.
  Lane GetLane(int from, bool small) const {
    char* base = seg_->data() + kLaneSkew;
    if (!small) return Lane{from, base + size_t(from) * (ring_bytes_ + 4096), ring_bytes_};
    base += 2 * (ring_bytes_ + 4096) + size_t(from) * (kSmallRingBytes + 4096);
    return Lane{2 + from, base, kSmallRingBytes};
  }
  // Ring positions are multiples of 8, so an element never straddles the wrap.
  void CopyIn(const Lane& l, uint64_t pos, const char* src, size_t len, size_t off, size_t n) {
    char* ring = l.ring;
    size_t real = off < len ? std::min(n, len - off) : 0;
    while (real > 0) {
      const size_t at = pos % l.bytes;
      const size_t k = std::min(real, l.bytes - at);
      std::memcpy(ring + at, src + off, k);
      pos += k, off += k, real -= k;
    }
  }
  void CopyOut(const Lane& l, uint64_t pos, Op& op, size_t off, size_t n) {
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
      }
      pos += k, off += k, real -= k;
    }
  }

  std::unique_ptr<ShmSegment> seg_;
  const int side_;
  const size_t ring_bytes_;
};

// ---- the transport ------------------------------------------------------------------------

namespace {

// Sleeps until one of `bells` no longer holds its value in `seen`, or max_us pass. A rank in a
// ring waits on two pairs at once (sending to one neighbour, receiving from the other), and
// sleeping on one bell alone missed the other's progress until the timeout (ranks waiting on
// full send rings, each for a neighbour asleep on its own send ring): futex_waitv (Linux 5.16)
// sleeps on all of them: np=3 on this host with 64 KiB rings (RINGRUN_SHM_RING_KIB=64), 16 MiB
// allreduce 45-52 ms -> 19-24 ms. Where the kernel lacks it, the first bell, 200 us at most.
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

class SocketTransport final : public Transport {
 public:
  SocketTransport(int rank, PeerTable peers, Listener listener, const TransportOptions& options)
      : rank_(rank),
        peers_(std::move(peers)),
        listener_(std::move(listener)),
        options_(options),
        job_tag_(JobTag(peers_.job_id)),
        pairs_(peers_.size()) {}

  int rank() const override { return rank_; }
  int size() const override { return peers_.size(); }
  const PeerTable& peers() const override { return peers_; }

  Status Run(std::vector<Op>& ops, Deadline deadline) override {
    if (!broken_.ok()) return broken_;
    Status st = RunOps(ops, deadline);
    if (!st.ok()) Break(st);
    return st;
  }
  Status status() const override { return broken_; }
  void Break(const Status& st) override {
    if (!broken_.ok()) return;
    // Close every connection, so that peers waiting on this rank fail at once too instead of
    // waiting for their timeout.
    broken_ = st;
    pairs_.clear();
  }

 private:
  Status RunOps(std::vector<Op>& ops, Deadline deadline);
  Status EnsureConnected(const std::vector<Op>& ops, Deadline deadline);
  Status Connect(int peer, Deadline deadline);
  // A shared-memory pair through the peer's local listener; false when it cannot be reached.
  Result<bool> ConnectLocal(int peer, Deadline deadline);
  Status AcceptOne(Deadline deadline);
  Status AcceptFrom(int listener, bool local, Deadline deadline);
  Status PeerError(int peer, const Status& st) const {
    return Status(st.code(), "rank " + std::to_string(rank_) + ": peer " + peers_.Describe(peer) +
                                 ": " + st.message());
  }
  Status Wait(std::vector<OpState>& states, Deadline deadline, bool* progressed);
  Result<bool> ProgressAll(std::vector<OpState>& states, size_t* remaining);

  const int rank_;
  const PeerTable peers_;
  const Listener listener_;
  const TransportOptions options_;
  const uint64_t job_tag_;
  std::vector<std::unique_ptr<Pair>> pairs_;  // by peer rank; made on first use
  Status broken_;
};

Result<bool> SocketTransport::ConnectLocal(int peer, Deadline deadline) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoStatus("socket", errno);
  socklen_t len;
  const sockaddr_un un = LocalName(peers_.address(peer), peers_.port_of_rank[peer], &len);
  while (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&un), len) != 0) {
    if (errno == EINTR) continue;
    if (errno == EAGAIN) {  // its backlog is full: it is accepting
      if (MsUntil(deadline) == 0) return PeerError(peer, Timeout("connect timed out"));
      ::usleep(1000);
      continue;
    }
    if (errno == ECONNREFUSED || errno == ENOENT) return false;  // not in this namespace
    return PeerError(peer, ErrnoStatus("connect to its local socket", errno));
  }
  // Someone else's socket under the peer's name: not the peer, so reach it over TCP.
  if (!SameUser(fd.get())) return false;
  UniqueFd mem(::memfd_create("ringrun-pair", MFD_CLOEXEC));
  if (!mem.valid()) return PeerError(peer, ErrnoStatus("memfd_create", errno));
  Result<std::unique_ptr<ShmSegment>> seg = MapShm(mem.get(), options_.shm_ring_bytes, true);
  if (!seg.ok()) return PeerError(peer, seg.status());
  Hello hello{kHelloMagic, static_cast<uint32_t>(rank_), job_tag_, options_.shm_ring_bytes};
  Status st = SendHello(fd.get(), hello, mem.get(), deadline);
  if (!st.ok()) return PeerError(peer, st.Annotate("hello"));
  pairs_[peer] = std::make_unique<ShmPair>(std::move(fd), std::move(seg.value()), 0);
  return true;
}

Status SocketTransport::Connect(int peer, Deadline deadline) {
  if (options_.use_shm && peers_.SameHost(rank_, peer)) {
    Result<bool> local = ConnectLocal(peer, deadline);
    if (!local.ok() || *local) return local.status();
  }
  Result<sockaddr_in> sa = ParseAddr(peers_.address(peer), peers_.port_of_rank[peer]);
  if (!sa.ok()) return PeerError(peer, sa.status());
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoStatus("socket", errno);
  TuneSocket(fd.get());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&*sa), sizeof(*sa)) != 0) {
    if (errno != EINPROGRESS) return PeerError(peer, ErrnoStatus("connect", errno));
    pollfd pfd{fd.get(), POLLOUT, 0};
    int ms = MsUntil(deadline);
    int rc = ms > 0 ? ::poll(&pfd, 1, ms) : 0;
    if (rc == 0) return PeerError(peer, Timeout("connect timed out"));
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return PeerError(peer, ErrnoStatus("connect", err));
  }
  Hello hello{kHelloMagic, static_cast<uint32_t>(rank_), job_tag_, 0};
  Status st = SendHello(fd.get(), hello, -1, deadline);
  if (!st.ok()) return PeerError(peer, st.Annotate("hello"));
  pairs_[peer] = std::make_unique<TcpPair>(std::move(fd));
  return Status::Ok();
}

Status SocketTransport::AcceptOne(Deadline deadline) {
  pollfd pfd[2] = {{listener_.fd.get(), POLLIN, 0}, {listener_.local.get(), POLLIN, 0}};
  const nfds_t n = listener_.local.valid() ? 2 : 1;
  int ms = MsUntil(deadline);
  if (ms == 0) return Timeout("timed out");
  int rc = ::poll(pfd, n, ms);
  if (rc < 0 && errno != EINTR) return ErrnoStatus("poll", errno);
  for (nfds_t i = 0; rc > 0 && i < n; ++i) {
    if (pfd[i].revents) RINGRUN_RETURN_IF_ERROR(AcceptFrom(pfd[i].fd, i == 1, deadline));
  }
  return Status::Ok();
}

// Accepts one connection and makes its pair. A stray or foreign connection, or a hello that
// does not fit the listener it came to, is dropped (the real peer will still come); a peer's
// segment that cannot be mapped is an error naming it.
Status SocketTransport::AcceptFrom(int listener, bool local, Deadline deadline) {
  UniqueFd fd(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!fd.valid()) {
    if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) return Status::Ok();
    return ErrnoStatus("accept", errno);
  }
  if (!local) TuneSocket(fd.get());
  if (local && !SameUser(fd.get())) return Status::Ok();
  Hello hello{};
  UniqueFd mem;
  Deadline hello_deadline = std::min(deadline, DeadlineAfter(kPairHelloTimeoutMs));
  if (!RecvHello(fd.get(), &hello, &mem, hello_deadline).ok()) return Status::Ok();
  const size_t ring = hello.ring_bytes;
  if (hello.magic != kHelloMagic || hello.job_tag != job_tag_ ||
      hello.rank >= static_cast<uint32_t>(size()) || static_cast<int>(hello.rank) >= rank_ ||
      pairs_[hello.rank] || local != mem.valid() || (ring != 0) != local ||
      (local && (ring < 4096 || ring > kMaxShmRingBytes || (ring & (ring - 1)) != 0))) {
    return Status::Ok();
  }
  const int peer = static_cast<int>(hello.rank);
  if (!local) {
    pairs_[peer] = std::make_unique<TcpPair>(std::move(fd));
    return Status::Ok();
  }
  Result<std::unique_ptr<ShmSegment>> seg = MapShm(mem.get(), ring, false);
  if (!seg.ok()) return PeerError(peer, seg.status());
  pairs_[peer] = std::make_unique<ShmPair>(std::move(fd), std::move(seg.value()), 1);
  return Status::Ok();
}

Status SocketTransport::EnsureConnected(const std::vector<Op>& ops, Deadline deadline) {
  for (const Op& op : ops) {
    if (op.peer < 0 || op.peer >= size() || op.peer == rank_) {
      return Internal("op on invalid peer " + std::to_string(op.peer));
    }
    if (!pairs_[op.peer] && op.peer > rank_) RINGRUN_RETURN_IF_ERROR(Connect(op.peer, deadline));
  }
  for (const Op& op : ops) {
    while (!pairs_[op.peer]) {
      Status st = AcceptOne(deadline);
      if (st.code() == Code::kTimeout) {
        return PeerError(op.peer, Timeout("timed out waiting for it to connect"));
      }
      RINGRUN_RETURN_IF_ERROR(st);
    }
  }
  return Status::Ok();
}

Result<bool> SocketTransport::ProgressAll(std::vector<OpState>& states, size_t* remaining) {
  // Only the first incomplete op per (peer, direction) may progress.
  bool moved = false;
  *remaining = 0;
  for (size_t i = 0; i < states.size(); ++i) {
    OpState& s = states[i];
    if (s.complete) continue;
    ++*remaining;
    bool blocked = false;
    const bool send = s.op->kind == Op::kSend;
    for (size_t j = 0; j < i && !blocked; ++j) {
      blocked = !states[j].complete && states[j].op->peer == s.op->peer &&
                (states[j].op->kind == Op::kSend) == send;
    }
    if (blocked) continue;
    Result<bool> r = pairs_[s.op->peer]->Progress(s);
    if (!r.ok()) return PeerError(s.op->peer, r.status());
    moved |= *r;
    if (s.complete) --*remaining;
  }
  return moved;
}

Status SocketTransport::Wait(std::vector<OpState>& states, Deadline deadline, bool* progressed) {
  *progressed = false;
  std::vector<ShmPair*> shm_waits;  // the distinct shared-memory pairs with pending ops
  bool tcp_pending = false;
  for (OpState& s : states) {
    if (s.complete) continue;
    Pair* p = pairs_[s.op->peer].get();
    tcp_pending |= !p->is_shm();
    if (p->is_shm() && std::find(shm_waits.begin(), shm_waits.end(), p) == shm_waits.end()) {
      shm_waits.push_back(static_cast<ShmPair*>(p));
    }
  }
  int ms = MsUntil(deadline);
  if (ms == 0) {
    for (OpState& s : states) {
      if (s.complete) continue;
      const char* what = s.op->kind == Op::kSend ? "sending" : "receiving";
      return PeerError(s.op->peer,
                       Timeout("timed out " + std::string(what) + " (" + std::to_string(s.done) +
                               " of " + std::to_string(s.op->bytes) + " bytes moved)"));
    }
  }
  if (!shm_waits.empty()) {
    if (options_.spin) {
      const Deadline spin_until = Clock::now() + std::chrono::microseconds(kSpinUs);
      size_t remaining;
      for (unsigned i = 1;; ++i) {
        // No PAUSE here: under KVM, pause loops trigger PAUSE-loop exits that deschedule
        // the spinning vCPU, which made 4 KiB allreduces 5x slower on this VM.
        Result<bool> r = ProgressAll(states, &remaining);
        if (!r.ok()) return r.status();
        if (*r) return *progressed = true, Status::Ok();
        if (i % 32 == 0 && Clock::now() >= spin_until) break;  // the clock costs more than a poll
      }
    }
    std::vector<std::atomic<uint32_t>*> bells;
    std::vector<uint32_t> seen;
    for (ShmPair* p : shm_waits) seen.push_back(p->PrepareWait()), bells.push_back(p->bell());
    size_t remaining;
    Result<bool> r = ProgressAll(states, &remaining);
    if (r.ok() && !*r) WaitForBells(bells, seen, tcp_pending ? 1000 : std::min(ms, 20) * 1000);
    for (ShmPair* p : shm_waits) p->CancelWait();
    if (!r.ok()) return r.status();
    if (*r) return *progressed = true, Status::Ok();
    ms = 0;  // then only look at the sockets
  }
  std::vector<pollfd> fds;
  std::vector<int> fd_peer;
  for (OpState& s : states) {
    if (s.complete) continue;
    Pair* p = pairs_[s.op->peer].get();
    short ev = p->is_shm() ? POLLIN : (s.op->kind == Op::kSend ? POLLOUT : POLLIN);
    bool merged = false;
    for (pollfd& f : fds) {
      if (f.fd == p->fd()) f.events |= ev, merged = true;
    }
    if (!merged) fds.push_back(pollfd{p->fd(), ev, 0}), fd_peer.push_back(s.op->peer);
  }
  int rc = ::poll(fds.data(), fds.size(), std::min(ms, 1000));
  if (rc < 0 && errno != EINTR) return ErrnoStatus("poll", errno);
  for (size_t i = 0; rc > 0 && i < fds.size(); ++i) {
    if (!fds[i].revents) continue;
    if (!pairs_[fd_peer[i]]->is_shm()) continue;
    // A shared-memory pair's socket carries nothing after the hello: readable means EOF.
    char c;
    ssize_t n = ::recv(fds[i].fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      // The peer may have written its last bytes and exited: drain what it left first (all of
      // it: a progress step moves at most kShmChunk, and up to a ring's worth may be waiting;
      // the mapping outlives the peer).
      size_t remaining;
      for (;;) {
        Result<bool> r = ProgressAll(states, &remaining);
        if (!r.ok()) return r.status();
        if (!*r) break;
      }
      for (const OpState& s : states) {
        if (!s.complete && s.op->peer == fd_peer[i]) {
          return PeerError(fd_peer[i], Unavailable("connection closed: the peer process is gone"));
        }
      }
      *progressed = true;
      return Status::Ok();
    }
    if (n > 0) return PeerError(fd_peer[i], Internal("unexpected bytes on a shared-memory pair"));
  }
  return Status::Ok();
}

Status SocketTransport::RunOps(std::vector<Op>& ops, Deadline deadline) {
  RINGRUN_RETURN_IF_ERROR(EnsureConnected(ops, deadline));
  std::vector<OpState> states;
  states.reserve(ops.size());
  for (Op& op : ops) states.push_back(OpState{&op});
  for (;;) {
    size_t remaining;
    Result<bool> moved = ProgressAll(states, &remaining);
    if (!moved.ok()) return moved.status();
    if (remaining == 0) return Status::Ok();
    if (*moved) continue;
    bool progressed;
    RINGRUN_RETURN_IF_ERROR(Wait(states, deadline, &progressed));
  }
}

}  // namespace

Result<Listener> Listen(const std::string& address) {
  Result<sockaddr_in> sa = ParseAddr(address, 0);
  if (!sa.ok()) return sa.status();
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoStatus("socket", errno);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&*sa), sizeof(*sa)) != 0) {
    return ErrnoStatus("bind " + address + ":0", errno);
  }
  if (::listen(fd.get(), 4096) != 0) return ErrnoStatus("listen", errno);
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    return ErrnoStatus("getsockname", errno);
  }
  Listener l;
  l.fd = std::move(fd);
  l.port = ntohs(bound.sin_port);
  // The local listener for shared-memory pairs. Without it (the name is taken, say), same-host
  // peers fall back to TCP.
  UniqueFd local(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  socklen_t un_len;
  const sockaddr_un un = LocalName(address, l.port, &un_len);
  if (local.valid() && ::bind(local.get(), reinterpret_cast<const sockaddr*>(&un), un_len) == 0 &&
      ::listen(local.get(), 4096) == 0) {
    l.local = std::move(local);
  }
  return l;
}

Result<std::unique_ptr<Transport>> MakeSocketTransport(int rank, PeerTable peers, Listener listener,
                                                       const TransportOptions& options) {
  if (rank < 0 || rank >= peers.size()) return InvalidArgument("rank outside the peer table");
  if (peers.address_of_rank.size() != peers.port_of_rank.size()) {
    return InvalidArgument("peer table columns differ in length");
  }
  for (uint32_t a : peers.address_of_rank) {
    if (a >= peers.addresses.size()) return InvalidArgument("peer table address out of range");
  }
  if (options.shm_ring_bytes < 4096 || options.shm_ring_bytes > kMaxShmRingBytes ||
      (options.shm_ring_bytes & (options.shm_ring_bytes - 1))) {
    return InvalidArgument("shm_ring_bytes must be a power of two in [4 KiB, 1 GiB]");
  }
  return std::unique_ptr<Transport>(
      new SocketTransport(rank, std::move(peers), std::move(listener), options));
}

}  // namespace ringrun::runtime
