// Small helpers for the data plane's non-blocking sockets, each bounded by a deadline.
#pragma once

#include <netinet/in.h>

#include <cstddef>
#include <string>

#include "ringrun/common/status.h"
#include "transport.h"

namespace ringrun::runtime {

// Milliseconds left until `d` (0 once it has passed), for poll(2).
int MsUntil(Deadline d);
// Waits until `fd` may be ready for `events`; kTimeout once the deadline has passed.
Status WaitFd(int fd, short events, Deadline deadline);
// Sends or receives exactly `len` bytes on a non-blocking fd, waiting up to the deadline.
// kUnavailable when the other end closes first.
Status IoFull(int fd, void* buf, size_t len, bool write, Deadline deadline);
// An IPv4 address and port; kInvalidArgument for anything else.
Result<sockaddr_in> ParseAddr(const std::string& host, uint16_t port);
// TCP_NODELAY: the data plane sends whole messages and waits for replies.
void TuneSocket(int fd);

}  // namespace ringrun::runtime
