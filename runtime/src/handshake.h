// How a connection to a rank's listener becomes a pair: the connector's hello names its rank and
// the job; on the local Unix socket it carries the shared-memory segment (SCM_RIGHTS).
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <cstdint>
#include <string>

#include "ringrun/common/fd.h"
#include "ringrun/common/status.h"
#include "transport.h"

namespace ringrun::runtime {

inline constexpr uint32_t kHelloMagic = 0x52475233;  // "RGR3"

struct Hello {
  uint32_t magic;
  uint32_t rank;
  uint64_t job_tag;
  uint64_t ring_bytes;  // on the local socket: the passed segment's ring size; on TCP: 0
};

uint64_t JobTag(const std::string& job_id);

// The abstract Unix socket name (no file) of the local listener of the rank at address:port.
// Abstract names belong to a network namespace, as the TCP port does, and the port is this
// rank's while it runs, so among ringrun's ranks the name is unique. Anyone may bind an
// abstract name, so both ends also check that the other runs as the same user (SameUser).
sockaddr_un LocalName(const std::string& address, uint16_t port, socklen_t* len);
// Whether the process at the other end of a Unix socket runs as this process's user.
bool SameUser(int fd);
// Sends the hello, with `pass_fd` attached when >= 0.
Status SendHello(int fd, const Hello& hello, int pass_fd, Deadline deadline);
// Receives a hello and the fd passed with it (*passed: invalid when none came).
Status RecvHello(int fd, Hello* hello, UniqueFd* passed, Deadline deadline);

}  // namespace ringrun::runtime
