#include "runtime/src/transport/socket_util.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace ringrun::runtime::transport {

int MsUntil(Deadline d) {
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(d - std::chrono::steady_clock::now())
          .count();
  return ms <= 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
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

}  // namespace ringrun::runtime::transport
