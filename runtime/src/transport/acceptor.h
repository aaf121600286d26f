// The accepting side of the data plane's handshake (handshake.h), for every listening socket of
// a rank: its TCP listener and its local Unix listener.
//
// Hostile connections cost the job nothing:
//   - nothing blocks: connections are accepted and their handshakes advanced as bytes arrive,
//     all of them at once, so a silent, slow or junk connection never delays the real peer;
//   - each pending connection has a short deadline (kHandshakeTimeoutMs) and at most
//     kMaxPendingConnections are held: past that the oldest one that has not yet sent a valid
//     hello is closed (then the oldest of all), so a flood cannot exhaust this rank's fds; a
//     real connector whose connection is closed under it simply tries again;
//   - a connection is refused (closed) at its first wrong byte: junk, another job's tag, a rank
//     that is not a lower one, a TCP source address that is not the claimed rank's host (unless
//     allow_nat), another user on the local socket, or a wrong proof;
//   - refusals are counted, and logged at debug level once per peer address.
// Not thread-safe: the transport drives it from its one thread.
#pragma once

#include <poll.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ringrun/common/fd.h"
#include "ringrun/common/status.h"
#include "runtime/src/transport/handshake.h"
#include "runtime/src/transport/transport.h"

namespace ringrun::runtime::transport {

inline constexpr int kHandshakeTimeoutMs = 3000;
inline constexpr size_t kMaxPendingConnections = 64;

struct AcceptorOptions {
  int rank = 0;
  const PeerTable* peers = nullptr;  // outlives the acceptor
  std::string secret;
  bool allow_nat = false;
  int handshake_timeout_ms = kHandshakeTimeoutMs;
  size_t max_pending = kMaxPendingConnections;
};

// A peer that proved itself.
struct AdmittedPeer {
  int rank = -1;
  UniqueFd fd;
  bool local = false;
  UniqueFd segment;  // local: the shared-memory segment it passed
  uint64_t ring_bytes = 0;
};

struct AcceptorCounters {
  uint64_t admitted = 0;
  uint64_t refused = 0;    // a wrong byte, address, user or proof
  uint64_t timed_out = 0;  // no complete handshake within the deadline
  uint64_t evicted = 0;    // closed to make room for newer connections
};

class Acceptor {
 public:
  // `tcp` and `local` are the listeners (not owned; `local` may be -1).
  Acceptor(AcceptorOptions options, int tcp, int local);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // Appends what to poll for: the listeners and every pending connection.
  void AddPollFds(std::vector<pollfd>* fds) const;
  // Accepts what is waiting and advances every pending handshake, without blocking. Returns the
  // peers admitted now; `admissible(rank)` says whether a rank may still be admitted (it has no
  // pair yet). Errors only for this rank's own failures (accept failing for lack of memory).
  Result<std::vector<AdmittedPeer>> Service(const std::function<bool(int)>& admissible);
  // Closes every pending connection.
  void Clear();

  const AcceptorCounters& counters() const { return counters_; }
  size_t pending() const { return pending_.size(); }

 private:
  struct Pending;
  Status AcceptFrom(int listener, bool local);
  void Refuse(Pending& p, const std::string& why, uint64_t* counter);
  // Advances one handshake; true when it is finished (admitted or refused).
  bool Advance(Pending& p, const std::function<bool(int)>& admissible,
               std::vector<AdmittedPeer>* admitted);
  void MakeRoom();

  const AcceptorOptions options_;
  const int tcp_;
  const int local_;
  const uint64_t job_tag_;
  std::deque<std::unique_ptr<Pending>> pending_;  // oldest first
  std::set<std::string> logged_;                  // peer addresses already logged
  AcceptorCounters counters_;
};

}  // namespace ringrun::runtime::transport
