// A Pair moves one Transport's bytes to and from one peer: over TCP (tcp_pair.h) or through a
// shared-memory segment (shm_pair.h). Pairs are made by the transport once the peer has been
// admitted (handshake.h) and are owned by it; not thread-safe.
#pragma once

#include <cstddef>

#include "ringrun/common/fd.h"
#include "ringrun/common/status.h"
#include "runtime/src/transport/transport.h"

namespace ringrun::runtime::transport {

// The progress of one Op.
struct OpState {
  Op* op;
  size_t done = 0;    // bytes of the op moved (shm: wire bytes, including padding)
  size_t length = 0;  // shm, a length-prefixed receive: the message's length once seen (else 0)
  bool complete = false;
};

class Pair {
 public:
  explicit Pair(UniqueFd fd) : fd_(std::move(fd)) {}
  virtual ~Pair() = default;
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;
  // Moves what it can of `st` without blocking; returns whether anything moved. TCP fails with
  // kUnavailable when the peer has closed its end. Shared memory never fails here: a peer that
  // is gone shows as EOF on its lifeline (fd()), which the transport watches while it waits.
  virtual Result<bool> Progress(OpState& st) = 0;
  virtual bool is_shm() const = 0;
  // TCP: the data socket. Shared memory: the lifeline socket (readable only at the peer's end).
  int fd() const { return fd_.get(); }

 protected:
  UniqueFd fd_;
};

}  // namespace ringrun::runtime::transport
