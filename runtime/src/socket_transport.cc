// TCP and shared-memory pairs under one Transport, with lazy connection setup.
//
// Connection rule: the lower rank connects to the higher; the higher accepts on its listener
// and learns the connector's rank from a hello. Connecting never waits on the peer's program
// (the kernel completes the handshake from the listen backlog), so lazy setup cannot deadlock.
// Same-host pairs with shared memory on: the connector creates a /dev/shm segment named
// "ringrun-<job>-..." and sends its name in the hello; the acceptor maps and unlinks it at once
// (the connector unlinks too, once it sees the segment mapped, and on destruction), so no
// segment outlives the pair. The TCP socket of a shared-memory pair stays open as the peer's
// lifeline: its EOF means the peer died.
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <thread>

#include "transport.h"

namespace ringrun::runtime {

std::string PeerTable::Describe(int r) const {
  if (r < 0 || r >= size()) return "rank " + std::to_string(r);
  return "rank " + std::to_string(r) + " (" + address(r) + ":" + std::to_string(port_of_rank[r]) +
         ")";
}

namespace {

constexpr uint32_t kHelloMagic = 0x52475231;  // "RGR1"
constexpr size_t kMaxShmName = 96;
// A TCP Progress step moves at most kTcpChunk bytes of one op, so that a Run alternates between
// its sends and receives instead of filling one socket direction while the other idles; 128 KiB
// against 1 MiB took two-host 64 MiB allreduces over veth from ~70 to ~50-55 ms (median of
// 6-8 alternating rounds; benchmarks/veth_allreduce.sh). A RecvReduce stages at most
// kStagingBytes before reducing them, small enough to stay in L2 (64 KiB beat 16-256 KiB).
constexpr size_t kTcpChunk = 128 << 10;
constexpr size_t kStagingBytes = 64 << 10;
constexpr size_t kShmChunk = 512 << 10;    // most bytes one shm progress step moves
constexpr int kHelloTimeoutMs = 10000;
// Busy-wait this long on a shared-memory pair before sleeping on its futex (only when this
// host's ranks do not outnumber its CPUs). Waking a sleeping rank costs tens of microseconds
// under a hypervisor, paid once per collective phase when ranks arrive a little apart; Open MPI
// and NCCL poll without end. 1 ms against 50 us: fashion_mnist at np=2, 3 epochs, median of six
// alternating runs 4.35 s against 4.6 s.
constexpr int kSpinUs = 1000;

struct Hello {
  uint32_t magic;
  uint32_t rank;
  uint64_t job_tag;
  uint64_t ring_bytes;  // 0: plain TCP pair
  char shm_name[kMaxShmName];
};

uint64_t JobTag(const std::string& job_id) { return std::hash<std::string>{}(job_id) | 1; }

int MsUntil(Deadline d) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d - Clock::now()).count();
  return ms <= 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
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
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    int ms = MsUntil(deadline);
    if (ms == 0) return Timeout("timed out");
    if (::poll(&pfd, 1, ms) < 0 && errno != EINTR) return ErrnoStatus("poll", errno);
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

struct alignas(64) PaddedU32 { std::atomic<uint32_t> v{0}; };
struct alignas(64) PaddedU64 { std::atomic<uint64_t> v{0}; };
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shm needs lock-free atomics");

// Ring d carries bytes from side d to side 1-d. Side 0 is the connector.
struct ShmHeader {
  uint64_t magic;
  uint64_t ring_bytes;
  PaddedU32 mapped;      // set by the acceptor once it has mapped the segment
  PaddedU32 bell[2];     // bumped whenever something side s may wait for changes
  PaddedU32 waiting[2];  // side s is about to sleep on bell[s]
  PaddedU64 head[2];     // ring d: bytes produced (written by side d)
  PaddedU64 tail[2];     // ring d: bytes consumed (written by side 1-d)
};
constexpr size_t kShmDataOffset = (sizeof(ShmHeader) + 4095) & ~size_t{4095};
constexpr uint64_t kShmMagic = 0x72696e6772756e31ull;

long Futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

// One mapping of a segment; unlinks the name (once) when asked or on destruction.
class ShmSegment {
 public:
  ShmSegment(void* base, size_t len, std::string name) : base_(base), len_(len), name_(name) {}
  ~ShmSegment() {
    Unlink();
    ::munmap(base_, len_);
  }
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  void Unlink() {
    if (!name_.empty()) ::shm_unlink(name_.c_str());
    name_.clear();
  }
  bool unlinked() const { return name_.empty(); }
  ShmHeader* header() const { return static_cast<ShmHeader*>(base_); }
  char* data() const { return static_cast<char*>(base_) + kShmDataOffset; }

 private:
  void* base_;
  size_t len_;
  std::string name_;
};

Result<std::unique_ptr<ShmSegment>> MapShm(const std::string& name, size_t ring_bytes,
                                           bool create) {
  const size_t len = kShmDataOffset + 2 * ring_bytes;
  int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_EXCL : 0);
  UniqueFd fd(::shm_open(name.c_str(), flags, 0600));
  if (!fd.valid()) return ErrnoStatus("shm_open " + name, errno);
  if (create && ::ftruncate(fd.get(), static_cast<off_t>(len)) != 0) {
    Status st = ErrnoStatus("ftruncate " + name, errno);
    ::shm_unlink(name.c_str());
    return st;
  }
  // MAP_POPULATE: fault the rings in now, on both sides. Left to the first messages, each new
  // ring page cost a page fault (and, under a hypervisor, the host's first touch): a 4 KiB
  // allreduce averaged 9-73 us over its first 25 iterations instead of ~2 us.
  void* base =
      ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (base == MAP_FAILED) {
    Status st = ErrnoStatus("mmap " + name, errno);
    if (create) ::shm_unlink(name.c_str());
    return st;
  }
  auto seg = std::make_unique<ShmSegment>(base, len, create ? name : std::string());
  if (create) {
    seg->header()->magic = kShmMagic;
    seg->header()->ring_bytes = ring_bytes;
  } else if (seg->header()->magic != kShmMagic || seg->header()->ring_bytes != ring_bytes) {
    return Internal("shm segment " + name + " has an unexpected layout");
  }
  return seg;
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
        ssize_t n = ::recv(fd(), static_cast<char*>(op.buf) + st.done, limit - st.done,
                           MSG_DONTWAIT);
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
          op.reduce(static_cast<char*>(op.buf) + st.done,
                    static_cast<const char*>(op.src) + st.done, staging_.data(),
                    whole / op.elem_size);
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
      : Pair(std::move(lifeline)), seg_(std::move(seg)), side_(side),
        ring_bytes_(seg_->header()->ring_bytes) {}
  bool is_shm() const override { return true; }

  Result<bool> Progress(OpState& st) override {
    ShmHeader* h = seg_->header();
    if (!seg_->unlinked() && h->mapped.v.load(std::memory_order_acquire)) seg_->Unlink();
    Op& op = *st.op;
    const size_t wire = (op.bytes + 7) & ~size_t{7};
    bool moved = false;
    // Each step moves at most kShmChunk so that a Run alternates between its ops.
    if (op.kind == Op::kSend) {
      const int d = side_;
      const uint64_t head = h->head[d].v.load(std::memory_order_relaxed);
      const uint64_t tail = h->tail[d].v.load(std::memory_order_acquire);
      size_t n = std::min<size_t>({ring_bytes_ - (head - tail), wire - st.done, kShmChunk});
      if (n > 0) {
        CopyIn(d, head, static_cast<const char*>(op.buf), op.bytes, st.done, n);
        h->head[d].v.store(head + n, std::memory_order_seq_cst);
        Notify(1 - side_);
        st.done += n, moved = true;
      }
    } else {
      const int d = 1 - side_;
      const uint64_t head = h->head[d].v.load(std::memory_order_acquire);
      const uint64_t tail = h->tail[d].v.load(std::memory_order_relaxed);
      size_t n = std::min<size_t>({head - tail, wire - st.done, kShmChunk});
      if (n > 0) {
        CopyOut(d, tail, op, st.done, n);
        h->tail[d].v.store(tail + n, std::memory_order_seq_cst);
        Notify(1 - side_);
        st.done += n, moved = true;
      }
    }
    st.complete = st.done == wire;
    return moved;
  }

  // Sleeping on this pair's bell: PrepareWait, re-check progress, then Wait.
  uint32_t PrepareWait() {
    seg_->header()->waiting[side_].v.store(1, std::memory_order_seq_cst);
    return seg_->header()->bell[side_].v.load(std::memory_order_seq_cst);
  }
  void Wait(uint32_t seen, int max_us) {
    timespec ts{max_us / 1000000, (max_us % 1000000) * 1000L};
    Futex(&seg_->header()->bell[side_].v, FUTEX_WAIT, seen, &ts);
    seg_->header()->waiting[side_].v.store(0, std::memory_order_relaxed);
  }
  void CancelWait() { seg_->header()->waiting[side_].v.store(0, std::memory_order_relaxed); }

 private:
  void Notify(int other) {
    ShmHeader* h = seg_->header();
    h->bell[other].v.fetch_add(1, std::memory_order_seq_cst);
    if (h->waiting[other].v.load(std::memory_order_seq_cst)) {
      Futex(&h->bell[other].v, FUTEX_WAKE, 1, nullptr);
    }
  }
  // Ring positions are multiples of 8, so an element never straddles the wrap.
  void CopyIn(int d, uint64_t pos, const char* src, size_t len, size_t off, size_t n) {
    char* ring = seg_->data() + static_cast<size_t>(d) * ring_bytes_;
    size_t real = off < len ? std::min(n, len - off) : 0;
    while (real > 0) {
      const size_t at = pos % ring_bytes_;
      const size_t k = std::min(real, ring_bytes_ - at);
      std::memcpy(ring + at, src + off, k);
      pos += k, off += k, real -= k;
    }
  }
  void CopyOut(int d, uint64_t pos, Op& op, size_t off, size_t n) {
    const char* ring = seg_->data() + static_cast<size_t>(d) * ring_bytes_;
    size_t real = off < op.bytes ? std::min(n, op.bytes - off) : 0;
    while (real > 0) {
      const size_t at = pos % ring_bytes_;
      const size_t k = std::min(real, ring_bytes_ - at);
      char* dst = static_cast<char*>(op.buf) + off;
      if (op.kind == Op::kRecv) {
        std::memcpy(dst, ring + at, k);
      } else {
        op.reduce(dst, static_cast<const char*>(op.src) + off, ring + at, k / op.elem_size);
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

class SocketTransport final : public Transport {
 public:
  SocketTransport(int rank, PeerTable peers, Listener listener, const TransportOptions& options)
      : rank_(rank), peers_(std::move(peers)), listener_(std::move(listener)),
        options_(options), job_tag_(JobTag(peers_.job_id)), pairs_(peers_.size()) {}

  int rank() const override { return rank_; }
  int size() const override { return peers_.size(); }
  const PeerTable& peers() const override { return peers_; }

  Status Run(std::vector<Op>& ops, Deadline deadline) override {
    if (!broken_.ok()) return broken_;
    Status st = RunOps(ops, deadline);
    if (!st.ok()) {
      // Close every connection, so that peers waiting on this rank fail at once too instead of
      // waiting for their timeout.
      broken_ = st;
      pairs_.clear();
    }
    return st;
  }

 private:
  Status RunOps(std::vector<Op>& ops, Deadline deadline);
  Status EnsureConnected(const std::vector<Op>& ops, Deadline deadline);
  Status Connect(int peer, Deadline deadline);
  Status AcceptOne(Deadline deadline);
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
  uint64_t shm_counter_ = 0;
  Status broken_;
};

Status SocketTransport::Connect(int peer, Deadline deadline) {
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
  Hello hello{};
  hello.magic = kHelloMagic;
  hello.rank = static_cast<uint32_t>(rank_);
  hello.job_tag = job_tag_;
  std::unique_ptr<ShmSegment> seg;
  if (options_.use_shm && peers_.SameHost(rank_, peer)) {
    char name[kMaxShmName];
    std::snprintf(name, sizeof(name), "/ringrun-%016llx-%d-%d-%d-%llu",
                  static_cast<unsigned long long>(job_tag_), rank_, peer,
                  static_cast<int>(::getpid()), static_cast<unsigned long long>(shm_counter_++));
    Result<std::unique_ptr<ShmSegment>> made = MapShm(name, options_.shm_ring_bytes, true);
    if (!made.ok()) return PeerError(peer, made.status());
    seg = std::move(made.value());
    hello.ring_bytes = options_.shm_ring_bytes;
    std::snprintf(hello.shm_name, sizeof(hello.shm_name), "%s", name);
  }
  Status st = IoFull(fd.get(), &hello, sizeof(hello), true, deadline);
  if (!st.ok()) return PeerError(peer, st.Annotate("hello"));
  if (seg) {
    pairs_[peer] = std::make_unique<ShmPair>(std::move(fd), std::move(seg), 0);
  } else {
    pairs_[peer] = std::make_unique<TcpPair>(std::move(fd));
  }
  return Status::Ok();
}

Status SocketTransport::AcceptOne(Deadline deadline) {
  pollfd pfd{listener_.fd.get(), POLLIN, 0};
  int ms = MsUntil(deadline);
  if (ms == 0) return Timeout("timed out");
  int rc = ::poll(&pfd, 1, ms);
  if (rc < 0 && errno != EINTR) return ErrnoStatus("poll", errno);
  if (rc <= 0) return Status::Ok();
  UniqueFd fd(::accept4(listener_.fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!fd.valid()) {
    if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) return Status::Ok();
    return ErrnoStatus("accept", errno);
  }
  TuneSocket(fd.get());
  Hello hello{};
  Deadline hello_deadline = std::min(deadline, DeadlineAfter(kHelloTimeoutMs));
  if (!IoFull(fd.get(), &hello, sizeof(hello), false, hello_deadline).ok()) return Status::Ok();
  // A stray or foreign connection is dropped; the real peer will still come.
  if (hello.magic != kHelloMagic || hello.job_tag != job_tag_ ||
      hello.rank >= static_cast<uint32_t>(size()) || static_cast<int>(hello.rank) >= rank_ ||
      pairs_[hello.rank]) {
    return Status::Ok();
  }
  const int peer = static_cast<int>(hello.rank);
  if (hello.ring_bytes == 0) {
    pairs_[peer] = std::make_unique<TcpPair>(std::move(fd));
    return Status::Ok();
  }
  hello.shm_name[kMaxShmName - 1] = '\0';
  Result<std::unique_ptr<ShmSegment>> seg = MapShm(hello.shm_name, hello.ring_bytes, false);
  ::shm_unlink(hello.shm_name);
  if (!seg.ok()) return PeerError(peer, seg.status());
  seg.value()->header()->mapped.v.store(1, std::memory_order_release);
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
  std::vector<pollfd> fds;
  std::vector<int> fd_peer;
  ShmPair* shm_wait = nullptr;
  bool tcp_pending = false;
  for (OpState& s : states) {
    if (s.complete) continue;
    Pair* p = pairs_[s.op->peer].get();
    short ev = p->is_shm() ? POLLIN : (s.op->kind == Op::kSend ? POLLOUT : POLLIN);
    tcp_pending |= !p->is_shm();
    if (p->is_shm() && !shm_wait) shm_wait = static_cast<ShmPair*>(p);
    bool merged = false;
    for (pollfd& f : fds) {
      if (f.fd == p->fd()) f.events |= ev, merged = true;
    }
    if (!merged) fds.push_back(pollfd{p->fd(), ev, 0}), fd_peer.push_back(s.op->peer);
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
  if (shm_wait) {
    if (options_.spin) {
      const Deadline spin_until = Clock::now() + std::chrono::microseconds(kSpinUs);
      size_t remaining;
      while (Clock::now() < spin_until) {
        // No PAUSE here: under KVM, pause loops trigger PAUSE-loop exits that deschedule
        // the spinning vCPU, which made 4 KiB allreduces 5x slower on this VM.
        for (int i = 0; i < 64; ++i) asm volatile("" ::: "memory");
        Result<bool> r = ProgressAll(states, &remaining);
        if (!r.ok()) return r.status();
        if (*r) return *progressed = true, Status::Ok();
      }
    }
    uint32_t seen = shm_wait->PrepareWait();
    size_t remaining;
    Result<bool> r = ProgressAll(states, &remaining);
    if (!r.ok() || *r) {
      shm_wait->CancelWait();
      if (!r.ok()) return r.status();
      return *progressed = true, Status::Ok();
    }
    shm_wait->Wait(seen, tcp_pending ? 1000 : std::min(ms, 20) * 1000);
    ms = 0;  // then only look at the sockets
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
      // The peer may have written its last bytes and exited: drain what it left first.
      size_t remaining;
      Result<bool> r = ProgressAll(states, &remaining);
      if (!r.ok()) return r.status();
      for (const OpState& s : states) {
        if (!s.complete && s.op->peer == fd_peer[i]) {
          return PeerError(fd_peer[i],
                           Unavailable("connection closed: the peer process is gone"));
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
  return l;
}

Result<std::unique_ptr<Transport>> MakeSocketTransport(int rank, PeerTable peers,
                                                       Listener listener,
                                                       const TransportOptions& options) {
  if (rank < 0 || rank >= peers.size()) return InvalidArgument("rank outside the peer table");
  if (peers.address_of_rank.size() != peers.port_of_rank.size()) {
    return InvalidArgument("peer table columns differ in length");
  }
  for (uint32_t a : peers.address_of_rank) {
    if (a >= peers.addresses.size()) return InvalidArgument("peer table address out of range");
  }
  if (options.shm_ring_bytes < 4096 || (options.shm_ring_bytes & (options.shm_ring_bytes - 1))) {
    return InvalidArgument("shm_ring_bytes must be a power of two >= 4096");
  }
  return std::unique_ptr<Transport>(
      new SocketTransport(rank, std::move(peers), std::move(listener), options));
}

}  // namespace ringrun::runtime
