// The data-plane seam. Collectives are written only against Transport; underneath, each peer is
// reached through a Pair (TCP, or shared memory for a peer on the same host), in the manner of
// Gloo's transport/{device,pair}.h.
//
// Semantics: messages between two ranks are matched by order and length. A Send of n bytes to
// peer p is received by exactly one Recv (or RecvReduce) of n bytes from this rank on p, in the
// order both sides issue them. There are no tags and no headers on the wire.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ringrun/common/clock.h"
#include "ringrun/common/fd.h"
#include "ringrun/common/status.h"
#include "ringrun/common/thread_annotations.h"
#include "runtime/src/reduce.h"

namespace ringrun::runtime::transport {

// One point-to-point operation of a Transport::Run.
struct Op {
  enum Kind { kSend, kRecv, kRecvReduce };
  Kind kind = kSend;
  int peer = -1;        // global rank
  void* buf = nullptr;  // kSend: the source; kRecv/kRecvReduce: the destination
  size_t bytes = 0;
  // kRecvReduce only: buf[i] = reduce(src[i], incoming[i]) over elements of elem_size bytes,
  // applied as data arrives (so reduction overlaps the transfer). src may equal buf.
  const void* src = nullptr;
  ReduceFn reduce = nullptr;
  size_t elem_size = 1;
  // reduce(incoming, src) instead of reduce(src, incoming). Floating reductions are not
  // commutative bit for bit (NaN payloads; a rounding mode or DAZ), so when two ranks each
  // combine their own value with the other's, both must put the same rank's value first.
  bool incoming_first = false;
  // kRecvReduce only, optional: applied to each piece of buf right after its reduction (the
  // last reduction of an allreduce's block: AVERAGE's division and a postscale factor).
  const Finish* finish = nullptr;
  // kRecv only, optional: the number (from 1) of the engine's negotiation exchange this receive
  // belongs to. A round reaches a rank through the rank that sends to it, so a stopped or
  // descheduled one would hide a round from a peer asleep between rounds (at n = 3 a round that
  // rank 2 starts reaches rank 0 only through rank 1). A same-host peer that this Run has waited
  // on for kQuietKickUs is asked to join that exchange (WaitForInput).
  uint64_t round = 0;
  // kSend and kRecv, optional (both sides alike): the message is a u32 length L and L bytes,
  // `bytes` at most (the rest of the buffer is padding). A same-host pair moves only those
  // 4 + L bytes (rounded up to 8) and leaves the rest of a receive's buffer as it was, so that a
  // short message costs the cache lines it uses, not its buffer's; TCP moves all `bytes`.
  bool length_prefixed = false;

  static Op Send(int peer, const void* p, size_t n) {
    Op o;
    o.kind = kSend, o.peer = peer, o.buf = const_cast<void*>(p), o.bytes = n;
    return o;
  }
  static Op Recv(int peer, void* p, size_t n) {
    Op o;
    o.kind = kRecv, o.peer = peer, o.buf = p, o.bytes = n;
    return o;
  }
  static Op RecvReduce(int peer, void* dst, const void* src, size_t n, ReduceFn fn,
                       size_t elem_size, bool incoming_first = false) {
    Op o;
    o.kind = kRecvReduce, o.peer = peer, o.buf = dst, o.bytes = n, o.src = src, o.reduce = fn;
    o.elem_size = elem_size, o.incoming_first = incoming_first;
    return o;
  }
};

// Where the ranks of a job listen: rank r at addresses[address_of_rank[r]]:port_of_rank[r].
// Ranks sharing an address index are on the same host.
struct PeerTable {
  std::vector<std::string> addresses;
  std::vector<uint32_t> address_of_rank;
  std::vector<uint32_t> port_of_rank;
  std::string nccl_id;
  std::string job_id;
  // A process set's table (runtime.h): the job's rank of each of its ranks, which messages
  // name. Empty: the table's ranks are the job's.
  std::vector<int> job_ranks;
  // Elastic jobs (the job service's Join reply, job.proto): by rank, its host's name as the
  // launcher names it (Describe names it) and its worker id; the generation joined, its data
  // plane secret, and the membership epoch. Empty or 0 otherwise.
  std::vector<std::string> host_of_rank;
  std::vector<int> worker_of_rank;
  uint32_t generation = 0;
  std::string data_secret;
  uint64_t membership_epoch = 0;

  int size() const { return static_cast<int>(port_of_rank.size()); }
  const std::string& address(int rank) const { return addresses[address_of_rank[rank]]; }
  bool SameHost(int a, int b) const { return address_of_rank[a] == address_of_rank[b]; }
  int JobRank(int rank) const {
    return rank >= 0 && rank < static_cast<int>(job_ranks.size()) ? job_ranks[rank] : rank;
  }
  // "rank 3 (10.0.0.2:4711)", for error messages; the job's rank. With host_of_rank:
  // "rank 3 on host h2 (10.0.0.2:4711)".
  std::string Describe(int rank) const;
};

// What a rank's transport has done since it was made: cheap counters (relaxed atomics, bumped
// once per Run and per connection) that the scale tests and benchmarks/scale_harness read.
struct Counters {
  uint64_t messages_sent = 0;  // Send ops issued by Run
  uint64_t bytes_sent = 0;     // their bytes
  int connections = 0;         // pairs connected now (zero once broken)
  int connections_made = 0;    // pairs ever connected, by either side
};

// Connects this rank to its peers and moves bytes. Not thread-safe: one Run at a time (but
// counters(), from any thread).
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const PeerTable& peers() const = 0;

  // Progresses all ops concurrently until every one is complete. Ops on the same peer and
  // direction complete in list order. Connections are made on first use. Fails with kTimeout
  // at the deadline and kUnavailable when a peer closes or resets its connection, naming the
  // peer. After a failure the transport is broken: it closes every connection (so that peers
  // waiting on this rank fail at once too) and every later Run fails with that status.
  // spin_us: how long to busy-wait on a same-host peer before sleeping (-1: the transport's
  // setting; never more, and none when the transport does not spin).
  virtual Status Run(std::vector<Op>& ops, Deadline deadline, int spin_us) = 0;
  Status Run(std::vector<Op>& ops, Deadline deadline) { return Run(ops, deadline, -1); }

  // Sleeps until a peer has sent this rank something it has not received yet (or closed its
  // connection), a same-host peer asks it to join its next negotiation exchange (Op::round),
  // `doorbell` (an fd, such as an eventfd) becomes readable, or `deadline` passes
  // (Deadline::max(): no deadline). Returns at once when such input is there already; never
  // reads it. *peer_input says whether a peer has input (or asks it to join). Only connected
  // pairs (and the listeners, where a peer connects) are watched: a peer that may start
  // something with this rank while it sleeps must be connected already (a Run with it happened).
  // Costs nothing while it sleeps: no timer, no polling.
  // `asleep`, when given, is a mutex the caller holds: it is unlocked while this sleeps and
  // locked again before the transport is touched (as a condition variable's wait does), so that
  // another thread that takes it meanwhile may Run this transport. That thread calls
  // QuietIdleWake when it starts and RearmIdleWake before it lets go; a transport broken by its
  // Run makes this return the failure.
  virtual Status WaitForInput(int doorbell, Deadline deadline, bool* peer_input,
                              Mutex* asleep = nullptr) = 0;
  // For a thread that Runs this transport while another sleeps in WaitForInput (holding its
  // `asleep` mutex): QuietIdleWake stops peers from waking the sleeper for the input that this
  // thread is about to receive; RearmIdleWake lets them wake it again, and returns whether a
  // peer has input already (which then wakes nobody: ring the sleeper's doorbell).
  virtual void QuietIdleWake() {}
  virtual bool RearmIdleWake() { return false; }
  // Instead of RearmIdleWake, for such a thread that expects to run the sleeper's next round as
  // well (a blocking call that completed: its program calls again, usually at once): leaves the
  // wake-ups quiet, so that a peer that starts the next round (its own next call) does not wake
  // the sleeper for a round that this thread will run. A peer whose Run has waited on this rank
  // for kQuietKickUs wakes the sleeper then, so a round that a peer starts is still answered
  // while this rank's program does not call. Returns whether the sleeper must be woken now (a
  // transport without that state rearms, and says whether a peer has input). TCP peers wake
  // the sleeper as always.
  virtual bool LeaveIdleWakeQuiet() { return RearmIdleWake(); }

  // OK while the transport works; after a failure, that failure.
  virtual Status status() const = 0;
  // Safe from any thread, while another Runs. A transport that does not count returns zeros.
  virtual Counters counters() const { return {}; }
  // Breaks the transport with `st` as a failed Run does (unless it is broken already): for a
  // failure outside it that leaves peers mid-collective with this rank (out of memory).
  virtual void Break(const Status& st) = 0;
};

// A way to stop a transport's Runs from another thread: an elastic rank told by the job service
// that its generation is broken (a peer was lost without closing its connections) raises it, and
// a Run in progress fails with the status raised, within a second, instead of waiting for its
// deadline on a peer that will never answer; so does every later Run. The transport is then
// broken as by any failure (its connections close). Raise and raised() are thread-safe; the
// first Raise wins.
class Interrupt {
 public:
  void Raise(const Status& why) {
    MutexLock lock(&mu_);
    if (raised_.load(std::memory_order_relaxed)) return;
    why_ = why;
    raised_.store(true, std::memory_order_release);
  }
  // One atomic load: cheap enough for every step of a Run.
  bool raised() const { return raised_.load(std::memory_order_acquire); }
  Status why() const {
    MutexLock lock(&mu_);
    return why_;
  }

 private:
  mutable Mutex mu_;
  std::atomic<bool> raised_{false};
  Status why_ GUARDED_BY(mu_);
};

struct TransportOptions {
  bool use_shm = true;  // shared memory for same-host peers
  // The large ring per direction of a same-host pair; a power of two in [4 KiB, 1 GiB]. (Each
  // pair also has a 32 KiB ring per direction for small messages.)
  size_t shm_ring_bytes = 1 << 20;
  // How a Run waits on a same-host peer before it sleeps on the pair's futex, for up to its
  // spin_us: spin busy-waits (a host whose ranks do not outnumber its CPUs); otherwise yield
  // polls and gives the CPU away (sched_yield) between polls, so that the peer it waits for,
  // which may not be on a CPU, gets one (ranks past the core count, as Open MPI's
  // mpi_yield_when_idle); neither: sleeps at once. The policy: runtime.cc, SameHostWaiting.
  bool spin = true;
  bool yield = false;
  // The job's secret: a peer is admitted only when it proves that it holds it, and this rank
  // talks only to peers that prove it too (handshake.h). Required.
  std::string secret;
  // Admit a TCP peer whose source address is not its host's in the peer table (NAT between
  // hosts); RINGRUN_ALLOW_NAT=1. The proof of the secret is still required.
  bool allow_nat = false;
  // When set, raising it fails this transport's Runs (Interrupt). Shared by every transport of
  // a runtime (its process sets' too).
  std::shared_ptr<Interrupt> interrupt;
};

// A bound, listening TCP socket (port 0 picks one), and this rank's local listener for
// same-host peers: an abstract Unix socket named after the TCP endpoint (invalid if it could
// not be bound; those peers then use TCP).
struct Listener {
  UniqueFd fd;
  uint16_t port = 0;
  UniqueFd local;
};
Result<Listener> Listen(const std::string& address);

// TCP between hosts, shared memory between ranks on one host. `listener` must be the socket
// this rank advertised in `peers`.
Result<std::unique_ptr<Transport>> MakeSocketTransport(int rank, PeerTable peers, Listener listener,
                                                       const TransportOptions& options);

}  // namespace ringrun::runtime::transport
