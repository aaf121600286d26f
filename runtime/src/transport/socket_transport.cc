// TCP and shared-memory pairs under one Transport, with lazy connection setup.
//
// Connection rule: the lower rank connects to the higher; the higher accepts on its listener,
// and the two prove to each other that they hold the job's secret (handshake.h, acceptor.h).
// The connector waits for the peer's answer, so every rank serves its listeners whenever it
// waits inside the transport: connecting, waiting for a peer to connect, or in a Run's data
// phase. A rank that is not inside the transport (computing between collectives) answers once
// it next is; its connectors wait until then, or their deadline. Same-host pairs with shared
// memory on: the connector reaches the peer's local listener, an abstract Unix socket named
// after the peer's TCP endpoint, and passes it a shared-memory segment (shm_pair.h). Where the
// local listener cannot be reached (another network namespace, say), the pair is TCP
// (tcp_pair.h).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

#include "ringrun/common/defaults.h"
#include "runtime/src/transport/acceptor.h"
#include "runtime/src/transport/handshake.h"
#include "runtime/src/transport/shm_pair.h"
#include "runtime/src/transport/socket_util.h"
#include "runtime/src/transport/tcp_pair.h"
#include "runtime/src/transport/transport.h"

namespace ringrun::runtime::transport {

std::string PeerTable::Describe(int r) const {
  if (r < 0 || r >= size()) return "rank " + std::to_string(r);
  const std::string host =
      r < static_cast<int>(host_of_rank.size()) ? " on host " + host_of_rank[r] : "";
  return "rank " + std::to_string(JobRank(r)) + host + " (" + address(r) + ":" +
         std::to_string(port_of_rank[r]) + ")";
}

namespace {

// Busy-wait this long on a shared-memory pair before sleeping on its futex (only when this
// host's ranks do not outnumber its CPUs). Waking a sleeping rank costs tens of microseconds
// under a hypervisor, paid once per collective phase when ranks arrive a little apart; Open MPI
// and NCCL poll without end (measured: benchmarks/README.md, "Data-plane constants").
constexpr int kSpinUs = kShmSpinUs;    // defaults.h
constexpr int kPollsBeforeClock = 64;  // polls of a spinning Wait before it reads the clock

class SocketTransport final : public Transport {
 public:
  SocketTransport(int rank, PeerTable peers, Listener listener, const TransportOptions& options)
      : rank_(rank),
        peers_(std::move(peers)),
        listener_(std::move(listener)),
        options_(options),
        job_tag_(JobTag(peers_.job_id)),
        acceptor_(
            [&] {
              AcceptorOptions a;
              a.rank = rank_;
              a.peers = &peers_;
              a.secret = options_.secret;
              a.allow_nat = options_.allow_nat;
              return a;
            }(),
            listener_.fd.get(), listener_.local.valid() ? listener_.local.get() : -1),
        pairs_(peers_.size()) {}

  ~SocketTransport() override {
    const AcceptorCounters& c = acceptor_.counters();
    if (c.refused + c.timed_out + c.evicted > 0) {
      spdlog::debug(
          "rank {}: data plane: {} peers admitted; {} connections refused, {} timed out, {} "
          "closed to make room",
          rank_, c.admitted, c.refused, c.timed_out, c.evicted);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return peers_.size(); }
  const PeerTable& peers() const override { return peers_; }

  using Transport::Run;
  Status Run(std::vector<Op>& ops, Deadline deadline, int spin_us) override {
    if (!broken_.ok()) return broken_;
    const int wait_us = spin_us < 0 ? kSpinUs : std::min(spin_us, kSpinUs);
    spin_us_ = options_.spin ? wait_us : 0;
    // Yield only where the Run is a chain of small hand-offs (latency). A yield stays on its
    // own CPU's queue: yielding ranks that share a CPU pass it between them while ranks with
    // bytes to move wait on the other one, where sleeping ones would leave it to those that can
    // run (measured: 1 MiB at np=4 on 2 CPUs took twice as long yielding).
    size_t largest = 0;
    for (const Op& op : ops) {
      largest = std::max(largest, op.bytes);
      rounds_run_ = std::max(rounds_run_, op.round);
    }
    yield_us_ = !options_.spin && options_.yield && largest <= kSmallMessageBytes ? wait_us : 0;
    Status st = RunOps(ops, deadline);
    if (!st.ok()) Break(st);
    return st;
  }
  Status WaitForInput(int doorbell, Deadline deadline, bool* peer_input, Mutex* asleep) override;
  void QuietIdleWake() override {
    for (const std::unique_ptr<Pair>& p : pairs_) {
      if (p && p->is_shm()) static_cast<ShmPair*>(p.get())->QuietIdleWake();
    }
  }
  bool RearmIdleWake() override {
    bool input = false;
    for (const std::unique_ptr<Pair>& p : pairs_) {
      if (p && p->is_shm()) input |= static_cast<ShmPair*>(p.get())->ArmIdleWake();
    }
    return input;
  }
  bool LeaveIdleWakeQuiet() override {
    for (const std::unique_ptr<Pair>& p : pairs_) {
      if (p && p->is_shm()) static_cast<ShmPair*>(p.get())->LeaveIdleWakeQuiet();
    }
    return false;  // a TCP peer's input wakes the sleeper's poll() by itself
  }
  Status status() const override { return broken_; }
  Counters counters() const override {
    Counters c;
    c.messages_sent = messages_sent_.load(std::memory_order_relaxed);
    c.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
    c.connections = connections_.load(std::memory_order_relaxed);
    c.connections_made = connections_made_.load(std::memory_order_relaxed);
    return c;
  }
  void Break(const Status& st) override {
    if (!broken_.ok()) return;
    // Close every connection, so that peers waiting on this rank fail at once too instead of
    // waiting for their timeout.
    broken_ = st;
    pairs_.clear();
    connections_.store(0, std::memory_order_relaxed);
    acceptor_.Clear();
  }

 private:
  Status RunOps(std::vector<Op>& ops, Deadline deadline);
  Status EnsureConnected(const std::vector<Op>& ops, Deadline deadline);
  // Connects to a higher rank, retrying while the peer closes connections mid-handshake (it
  // may have closed ours to make room for others), until the deadline.
  Status Connect(int peer, Deadline deadline);
  // One try: kUnavailable from the handshake is worth another (*retry).
  Status ConnectOnce(int peer, Deadline deadline, bool* retry);
  // A shared-memory pair through the peer's local listener; false when it cannot be reached.
  Result<bool> ConnectLocal(int peer, Deadline deadline, bool* retry);
  Result<UniqueFd> ConnectTcp(int peer, Deadline deadline);
  // The connector's side of the handshake on a connected socket (handshake.h). Serves this
  // rank's own listeners while it waits.
  Status Handshake(int peer, int fd, int pass_fd, uint64_t ring_bytes, Deadline deadline);
  // Waits up to the deadline for `fd` (when >= 0) or a listener; serves the listeners.
  Status WaitAndServe(int fd, short events, Deadline deadline);
  int spin_us_ = 0;   // the current Run's busy-wait on a shared-memory pair
  int yield_us_ = 0;  // ... or its polling with sched_yield (TransportOptions::yield)
  // The last negotiation exchange that a Run took part in (Op::round): a peer that asks this
  // rank to join the next one wakes WaitForInput.
  uint64_t rounds_run_ = 0;
  // The current Run's first wait on a shared-memory pair (unset: none yet), and whether it has
  // woken the peers whose wake-ups are quiet (KickQuietPeers) and asked those it receives from
  // in a negotiation exchange to join it (AskToJoin).
  std::optional<std::chrono::steady_clock::time_point> waiting_since_;
  bool kicked_ = false;
  // RunOps' op states and Wait's list of pairs, kept for their capacity (one Run at a time).
  std::vector<OpState> states_;
  std::vector<ShmPair*> shm_waits_;
  // Wakes every same-host peer whose engine sleeps with its wake-ups quiet (kQuietWaiting): all
  // of them, not only this Run's, so that a round that reaches a rank through another peer
  // wakes it at once from then on.
  void KickQuietPeers() {
    for (const std::unique_ptr<Pair>& p : pairs_) {
      if (p && p->is_shm()) static_cast<ShmPair*>(p.get())->KickIfQuiet();
    }
  }
  // Asks the same-host peers that this Run waits to receive from in a negotiation exchange
  // (Op::round) to join it: the round may have reached this rank through another, and reach
  // them only through a rank that has stopped.
  void AskToJoin(const std::vector<OpState>& states) {
    for (const OpState& s : states) {
      if (s.complete || s.op->kind != Op::kRecv || s.op->round == 0) continue;
      Pair* p = pairs_[s.op->peer].get();
      if (p->is_shm()) static_cast<ShmPair*>(p)->AskToJoin(s.op->round);
    }
  }
  // Advances pending handshakes and makes pairs of the peers that proved themselves.
  Status ServeListeners();
  // The status raised on options_.interrupt, or OK.
  Status Interrupted() const {
    return options_.interrupt && options_.interrupt->raised() ? options_.interrupt->why()
                                                              : Status::Ok();
  }
  Status PeerError(int peer, const Status& st) const {
    return Status(st.code(), "rank " + std::to_string(peers_.JobRank(rank_)) + ": peer " +
                                 peers_.Describe(peer) + ": " + st.message());
  }
  Status Wait(std::vector<OpState>& states, Deadline deadline, bool* progressed);
  Result<bool> ProgressAll(std::vector<OpState>& states, size_t* remaining);

  // pairs_[peer] = p, counted.
  void Adopt(int peer, std::unique_ptr<Pair> p) {
    pairs_[peer] = std::move(p);
    connections_.fetch_add(1, std::memory_order_relaxed);
    connections_made_.fetch_add(1, std::memory_order_relaxed);
  }

  const int rank_;
  const PeerTable peers_;
  const Listener listener_;
  const TransportOptions options_;
  const uint64_t job_tag_;
  Acceptor acceptor_;
  std::vector<std::unique_ptr<Pair>> pairs_;  // by peer rank; made on first use
  Status broken_;
  // counters(): written by the thread that Runs, read by any.
  std::atomic<uint64_t> messages_sent_{0}, bytes_sent_{0};
  std::atomic<int> connections_{0}, connections_made_{0};
};

Status SocketTransport::ServeListeners() {
  Result<std::vector<AdmittedPeer>> admitted =
      acceptor_.Service([this](int r) { return r >= 0 && r < size() && !pairs_[r]; });
  if (!admitted.ok()) return admitted.status();
  for (AdmittedPeer& a : *admitted) {
    if (!a.local) {
      Adopt(a.rank, std::make_unique<TcpPair>(std::move(a.fd)));
      continue;
    }
    Result<std::unique_ptr<ShmSegment>> seg = MapShm(a.segment.get(), a.ring_bytes, false);
    if (!seg.ok()) return PeerError(a.rank, seg.status());
    Adopt(a.rank, std::make_unique<ShmPair>(std::move(a.fd), std::move(seg.value()), 1));
  }
  return Status::Ok();
}

Status SocketTransport::WaitAndServe(int fd, short events, Deadline deadline) {
  RINGRUN_RETURN_IF_ERROR(Interrupted());  // a connection to a frozen peer never completes
  std::vector<pollfd> fds;
  if (fd >= 0) fds.push_back(pollfd{fd, events, 0});
  acceptor_.AddPollFds(&fds);
  const int ms = MsUntil(deadline);
  if (ms == 0) return Timeout("timed out");
  // At most 100 ms, so that pending handshakes past their deadline are closed.
  int rc = ::poll(fds.data(), fds.size(), std::min(ms, 100));
  if (rc < 0 && errno != EINTR) return ErrnoStatus("poll", errno);
  return ServeListeners();
}

Status SocketTransport::Handshake(int peer, int fd, int pass_fd, uint64_t ring_bytes,
                                  Deadline deadline) {
  ConnectHello hello;
  hello.rank = static_cast<uint32_t>(rank_);
  hello.to_rank = static_cast<uint32_t>(peer);
  hello.job_tag = job_tag_;
  hello.ring_bytes = ring_bytes;
  Result<Nonce> nonce = FreshNonce();
  if (!nonce.ok()) return nonce.status();
  hello.nonce = *nonce;
  uint8_t out[kConnectHelloBytes];
  EncodeConnectHello(hello, out);
  uint8_t in[kAcceptHelloBytes];
  Proof proof{};
  uint8_t admitted = 0;
  size_t sent = 0, got = 0, proof_sent = 0, admitted_got = 0;
  for (;;) {
    short wait_for = POLLIN;
    if (sent < sizeof(out)) {
      RINGRUN_RETURN_IF_ERROR(SendSome(fd, out, sizeof(out), &sent, pass_fd));
      if (sent < sizeof(out)) wait_for = POLLOUT;
    } else if (got < sizeof(in)) {
      RINGRUN_RETURN_IF_ERROR(RecvSome(fd, in, sizeof(in), &got, nullptr));
      if (got == sizeof(in)) {
        Result<AcceptHello> reply = DecodeAcceptHello(in, sizeof(in));
        if (!reply.ok()) return PermissionDenied("not a ringrun rank: " + reply.status().message());
        const Proof expected = HandshakeProof(options_.secret, ProofRole::kAcceptor, hello,
                                              static_cast<uint32_t>(peer), reply->nonce);
        if (reply->rank != static_cast<uint32_t>(peer) || !ProofEquals(expected, reply->proof)) {
          return PermissionDenied(
              "its listener did not prove that it holds this job's secret (another job's rank, "
              "or an impostor, on its port)");
        }
        proof = HandshakeProof(options_.secret, ProofRole::kConnector, hello,
                               static_cast<uint32_t>(peer), reply->nonce);
        continue;
      }
    } else if (proof_sent < proof.size()) {
      RINGRUN_RETURN_IF_ERROR(SendSome(fd, proof.data(), proof.size(), &proof_sent, -1));
      if (proof_sent == proof.size()) continue;
      wait_for = POLLOUT;
    } else {
      RINGRUN_RETURN_IF_ERROR(RecvSome(fd, &admitted, 1, &admitted_got, nullptr));
      if (admitted_got == 1) {
        if (admitted != kAdmittedByte) return PermissionDenied("not admitted");
        return Status::Ok();
      }
    }
    RINGRUN_RETURN_IF_ERROR(WaitAndServe(fd, wait_for, deadline));
  }
}

Result<bool> SocketTransport::ConnectLocal(int peer, Deadline deadline, bool* retry) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoStatus("socket", errno);
  socklen_t len;
  const sockaddr_un un = LocalName(peers_.address(peer), peers_.port_of_rank[peer], &len);
  while (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&un), len) != 0) {
    if (errno == EINTR) continue;
    if (errno == EAGAIN) {  // its backlog is full: it is accepting
      RINGRUN_RETURN_IF_ERROR(WaitAndServe(-1, 0, std::min(deadline, DeadlineAfter(1))));
      continue;
    }
    if (errno == ECONNREFUSED || errno == ENOENT) return false;  // not in this namespace
    return ErrnoStatus("connect to its local socket", errno);
  }
  // Someone else's socket under the peer's name: not the peer, so reach it over TCP.
  if (!SameUser(fd.get())) return false;
  UniqueFd mem(::memfd_create("ringrun-pair", MFD_CLOEXEC));
  if (!mem.valid()) return ErrnoStatus("memfd_create", errno);
  Result<std::unique_ptr<ShmSegment>> seg = MapShm(mem.get(), options_.shm_ring_bytes, true);
  if (!seg.ok()) return seg.status();
  Status st = Handshake(peer, fd.get(), mem.get(), options_.shm_ring_bytes,
                        std::min(deadline, DeadlineAfter(kHandshakeTimeoutMs)));
  if (!st.ok()) {
    *retry = st.code() == Code::kUnavailable || st.code() == Code::kTimeout;
    return st.Annotate("handshake on its local socket");
  }
  Adopt(peer, std::make_unique<ShmPair>(std::move(fd), std::move(seg.value()), 0));
  return true;
}

Result<UniqueFd> SocketTransport::ConnectTcp(int peer, Deadline deadline) {
  Result<sockaddr_in> sa = ParseAddr(peers_.address(peer), peers_.port_of_rank[peer]);
  if (!sa.ok()) return sa.status();
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoStatus("socket", errno);
  TuneSocket(fd.get());
  // From this rank's own address, which the peer checks against the peer table. Where it is not
  // this host's (NAT), the kernel picks one, and the peer must allow NAT.
  Result<sockaddr_in> me = ParseAddr(peers_.address(rank_), 0);
  if (me.ok()) (void)::bind(fd.get(), reinterpret_cast<const sockaddr*>(&*me), sizeof(*me));
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&*sa), sizeof(*sa)) != 0) {
    if (errno != EINPROGRESS) return ErrnoStatus("connect", errno);
    for (;;) {
      pollfd pfd{fd.get(), POLLOUT, 0};
      if (::poll(&pfd, 1, 0) > 0) break;
      Status st = WaitAndServe(fd.get(), POLLOUT, deadline);
      if (st.code() == Code::kTimeout) return Timeout("connect timed out");
      RINGRUN_RETURN_IF_ERROR(st);
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return ErrnoStatus("connect", err);
  }
  return fd;
}

Status SocketTransport::ConnectOnce(int peer, Deadline deadline, bool* retry) {
  *retry = false;
  if (options_.use_shm && peers_.SameHost(rank_, peer)) {
    Result<bool> local = ConnectLocal(peer, deadline, retry);
    if (!local.ok() || *local) return local.status();
  }
  Result<UniqueFd> fd = ConnectTcp(peer, deadline);
  if (!fd.ok()) return fd.status();
  Status st =
      Handshake(peer, fd->get(), -1, 0, std::min(deadline, DeadlineAfter(kHandshakeTimeoutMs)));
  if (!st.ok()) {
    *retry = st.code() == Code::kUnavailable || st.code() == Code::kTimeout;
    return st.Annotate("handshake");
  }
  Adopt(peer, std::make_unique<TcpPair>(std::move(fd.value())));
  return Status::Ok();
}

Status SocketTransport::Connect(int peer, Deadline deadline) {
  int tries = 0;
  for (;;) {
    bool retry = false;
    Status st = ConnectOnce(peer, deadline, &retry);
    ++tries;
    if (st.ok()) return st;
    RINGRUN_RETURN_IF_ERROR(Interrupted());  // said as raised, not as a peer's failure
    if (!retry || MsUntil(deadline) == 0) {
      if (tries > 1) {
        st = Status(st.code(), st.message() + " (after " + std::to_string(tries) +
                                   " tries; a peer that refuses every try may hold another "
                                   "secret, or see this rank behind NAT: RINGRUN_ALLOW_NAT=1)");
      }
      return PeerError(peer, st);
    }
    spdlog::debug("rank {}: peer {}: {}; trying again", rank_, peers_.Describe(peer), st.message());
    // Back off (2 ms doubling to 256 ms), serving this rank's own listeners meanwhile.
    const Deadline retry_at = std::min(deadline, DeadlineAfter(2 << std::min(tries, 7)));
    while (std::chrono::steady_clock::now() < retry_at) {
      Status waited = WaitAndServe(-1, 0, retry_at);
      if (!waited.ok() && waited.code() != Code::kTimeout) return PeerError(peer, waited);
    }
  }
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
      Status st = WaitAndServe(-1, 0, deadline);  // returns a raised interrupt first
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
  // The distinct shared-memory pairs with pending ops.
  std::vector<ShmPair*>& shm_waits = shm_waits_;
  shm_waits.clear();
  bool tcp_pending = false;
  for (OpState& s : states) {
    if (s.complete) continue;
    Pair* p = pairs_[s.op->peer].get();
    tcp_pending |= !p->is_shm();
    if (p->is_shm() && std::find(shm_waits.begin(), shm_waits.end(), p) == shm_waits.end()) {
      shm_waits.push_back(static_cast<ShmPair*>(p));
    }
  }
  if (!shm_waits.empty() && spin_us_ > 0) {
    // A same-host partner's message usually comes within a few polls: those read no clock
    // (two reads of it cost about as much as a small exchange's own work).
    size_t remaining;
    for (int i = 0; i < kPollsBeforeClock; ++i) {
      Result<bool> r = ProgressAll(states, &remaining);
      if (!r.ok()) return r.status();
      if (*r) return *progressed = true, Status::Ok();
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
    const auto now = std::chrono::steady_clock::now();
    if (!waiting_since_) waiting_since_ = now;
    if (spin_us_ > 0) {
      const Deadline spin_until = now + std::chrono::microseconds(spin_us_);
      size_t remaining;
      for (unsigned i = 1;; ++i) {
        // No PAUSE here: under KVM, pause loops trigger PAUSE-loop exits that deschedule
        // the spinning vCPU.
        Result<bool> r = ProgressAll(states, &remaining);
        if (!r.ok()) return r.status();
        if (*r) return *progressed = true, Status::Ok();
        if (i % 32 == 0 && std::chrono::steady_clock::now() >= spin_until)
          break;  // the clock costs more than a poll
      }
    }
    if (yield_us_ > 0) {
      // Ranks outnumber the CPUs: the peer this rank waits for may be off any CPU, and waking
      // it from a futex costs a wake-up on every hand-off. Polling between yields hands the CPU
      // to whichever rank can run (the peer, or another waiter that polls and yields in turn).
      const Deadline yield_until = now + std::chrono::microseconds(yield_us_);
      size_t remaining;
      for (;;) {
        Result<bool> r = ProgressAll(states, &remaining);
        if (!r.ok()) return r.status();
        if (*r) return *progressed = true, Status::Ok();
        if (std::chrono::steady_clock::now() >= yield_until) break;
        ::sched_yield();
      }
    }
    // A peer whose wake-ups are quiet is woken once this Run has waited kQuietKickUs; until
    // then the sleep below ends in time for it.
    int sleep_us = tcp_pending ? 1000 : std::min(ms, 20) * 1000;
    if (!kicked_) {
      const int64_t waited = std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::steady_clock::now() - *waiting_since_)
                                 .count();
      if (waited >= kQuietKickUs) {
        KickQuietPeers();
        AskToJoin(states);
        kicked_ = true;
      } else {
        sleep_us = std::min<int>(sleep_us, static_cast<int>(kQuietKickUs - waited));
      }
    }
    std::vector<std::atomic<uint32_t>*> bells;
    std::vector<uint32_t> seen;
    for (ShmPair* p : shm_waits) seen.push_back(p->PrepareWait()), bells.push_back(p->bell());
    size_t remaining;
    Result<bool> r = ProgressAll(states, &remaining);
    if (r.ok() && !*r) WaitForBells(bells, seen, sleep_us);
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
  // This rank's listeners too: a peer may be connecting for a later Run and waits for our
  // side of the handshake.
  const size_t data_fds = fds.size();
  acceptor_.AddPollFds(&fds);
  int rc = ::poll(fds.data(), fds.size(), std::min(ms, 1000));
  if (rc < 0 && errno != EINTR) return ErrnoStatus("poll", errno);
  for (size_t i = data_fds; rc > 0 && i < fds.size(); ++i) {
    if (fds[i].revents) {
      RINGRUN_RETURN_IF_ERROR(ServeListeners());
      break;
    }
  }
  for (size_t i = 0; rc > 0 && i < data_fds; ++i) {
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
    if (n > 0) {  // a late wake-up byte from the peer (see ShmPair::ArmIdleWake)
      DrainWakeBytes(fds[i].fd);
      *progressed = true;
      return Status::Ok();
    }
  }
  return Status::Ok();
}

Status SocketTransport::WaitForInput(int doorbell, Deadline deadline, bool* peer_input,
                                     Mutex* asleep) {
  *peer_input = false;
  if (!broken_.ok()) return broken_;
  std::vector<pollfd> fds{pollfd{doorbell, POLLIN, 0}};
  std::vector<bool> is_shm{false};
  std::vector<ShmPair*> shm;
  bool ready = false;
  // A peer waiting for this rank in its next negotiation exchange (Op::round) is input too.
  // Looked at only while `asleep` is held: a round that another thread runs meanwhile may be
  // that exchange, and the request is then stale.
  auto asked = [this](ShmPair* p) { return p->AskedToJoin(rounds_run_ + 1); };
  for (const std::unique_ptr<Pair>& p : pairs_) {
    if (!p) continue;
    if (p->is_shm()) {
      shm.push_back(static_cast<ShmPair*>(p.get()));
      ready |= shm.back()->ArmIdleWake();  // armed before the look at join (AskToJoin)
      ready |= asked(shm.back());
    }
    fds.push_back(pollfd{p->fd(), POLLIN, 0});
    is_shm.push_back(p->is_shm());
  }
  // The listeners too: a connection (hostile ones included) is answered while this rank is
  // idle, not left in the backlog until its next collective.
  const size_t npairs = fds.size();
  acceptor_.AddPollFds(&fds);
  if (ready && asleep && options_.yield && !options_.spin) {
    // Ranks outnumber the CPUs: a peer's frame came before this thread slept, most likely the
    // peer's next blocking call while this rank's program, which has not had a CPU yet, is
    // about to make its own. Running that round here would take it from the program (whose
    // call then waits for this thread through a futex, and the next round comes here again);
    // so leave it to the program a moment, yielding with `asleep` unlocked.
    //
    // The pairs are looked at only with `asleep` held: a round that the program runs meanwhile
    // may break the transport, which frees them. While the program holds it, it runs the
    // round, so this thread only yields.
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kIdleYieldUs);
    auto pending = [&] {
      for (ShmPair* p : shm) {
        if (p->HasInput() || asked(p)) return true;
      }
      return false;
    };
    bool held = true;
    while (std::chrono::steady_clock::now() < until) {
      if (held) {
        if (!broken_.ok()) return broken_;
        if (!pending()) break;
        asleep->Unlock();
        held = false;
      }
      ::sched_yield();
      held = asleep->TryLock();
    }
    if (!held) asleep->Lock();
    if (!broken_.ok()) return broken_;
    ready = false;
    for (ShmPair* p : shm) {
      ready |= p->RearmUnlessQuiet();
      ready |= asked(p);
    }
  }
  const int ms = ready ? 0 : deadline == Deadline::max() ? -1 : MsUntil(deadline);
  if (asleep && ms != 0) asleep->Unlock();
  int rc = ::poll(fds.data(), fds.size(), ms);
  const int err = errno;
  if (asleep && ms != 0) {
    asleep->Lock();
    // Another thread ran a round meanwhile, and it may have broken the transport (its pairs
    // are gone then).
    if (!broken_.ok()) return broken_;
  }
  for (ShmPair* p : shm) {
    p->DisarmIdleWake();
    *peer_input |= p->HasInput() || asked(p);
  }
  if (rc < 0 && err != EINTR) return ErrnoStatus("poll", err);
  for (size_t i = npairs; rc > 0 && i < fds.size(); ++i) {
    if (fds[i].revents) {
      RINGRUN_RETURN_IF_ERROR(ServeListeners());
      break;
    }
  }
  for (size_t i = 1; rc > 0 && i < npairs; ++i) {
    if (!fds[i].revents) continue;
    // TCP: bytes or EOF. A lifeline: only EOF (the peer is gone, which the next Run reports);
    // bytes there are late wake-ups, and its data is in the rings (HasInput above).
    char c;
    ssize_t n = ::recv(fds[i].fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
    if (n == 0 || (n > 0 && !is_shm[i]) || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      *peer_input = true;
    }
  }
  return Status::Ok();
}

Status SocketTransport::RunOps(std::vector<Op>& ops, Deadline deadline) {
  uint64_t sends = 0, sent = 0;
  for (const Op& op : ops) {
    if (op.kind == Op::kSend) ++sends, sent += op.bytes;
  }
  // One writer: a plain store, not a locked read-modify-write, on every Run.
  messages_sent_.store(messages_sent_.load(std::memory_order_relaxed) + sends,
                       std::memory_order_relaxed);
  bytes_sent_.store(bytes_sent_.load(std::memory_order_relaxed) + sent, std::memory_order_relaxed);
  RINGRUN_RETURN_IF_ERROR(EnsureConnected(ops, deadline));
  waiting_since_.reset();
  kicked_ = false;
  std::vector<OpState>& states = states_;
  states.clear();
  for (Op& op : ops) states.push_back(OpState{&op});
  for (;;) {
    size_t remaining;
    Result<bool> moved = ProgressAll(states, &remaining);
    if (!moved.ok()) return moved.status();
    if (remaining == 0) return Status::Ok();
    if (*moved) continue;
    // Checked only when nothing moved: a Run that progresses is never the one that hangs.
    if (Status st = Interrupted(); !st.ok()) return st;
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
  if (options.secret.empty()) {
    return InvalidArgument(
        "no job secret (RINGRUN_SECRET): the data plane admits only peers that hold it");
  }
  return std::unique_ptr<Transport>(
      new SocketTransport(rank, std::move(peers), std::move(listener), options));
}

}  // namespace ringrun::runtime::transport