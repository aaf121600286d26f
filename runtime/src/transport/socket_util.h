// Small helpers for the data plane's sockets.
#pragma once

#include <netinet/in.h>

#include <cstddef>
#include <string>

#include "ringrun/common/status.h"
#include "runtime/src/transport/transport.h"

namespace ringrun::runtime::transport {

// Milliseconds left until `d` (0 once it has passed), for poll(2).
int MsUntil(Deadline d);
// An IPv4 address and port; kInvalidArgument for anything else.
Result<sockaddr_in> ParseAddr(const std::string& host, uint16_t port);
// TCP_NODELAY: the data plane sends whole messages and waits for replies.
void TuneSocket(int fd);

}  // namespace ringrun::runtime::transport
