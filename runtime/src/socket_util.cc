#include "socket_util.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace ringrun::runtime {

int MsUntil(Deadline d) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d - Clock::now()).count();
  return ms <= 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

Status WaitFd(int fd, short events, Deadline deadline) {
  pollfd pfd{fd, events, 0};
  int ms = MsUntil(deadline);
  if (ms == 0) return Timeout("timed out");
  if (::poll(&pfd, 1, ms) < 0 && errno != EINTR) return ErrnoStatus("poll", errno);
  return Status::Ok();
}

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

}  // namespace ringrun::runtime
