#include "handshake.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>

#include "socket_util.h"

namespace ringrun::runtime {

uint64_t JobTag(const std::string& job_id) { return std::hash<std::string>{}(job_id) | 1; }

sockaddr_un LocalName(const std::string& address, uint16_t port, socklen_t* len) {
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  const int n = std::snprintf(un.sun_path + 1, sizeof(un.sun_path) - 1, "ringrun/%s:%u",
                              address.c_str(), static_cast<unsigned>(port));
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 +
                                std::min<size_t>(n, sizeof(un.sun_path) - 2));
  return un;
}

bool SameUser(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  return ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == ::getuid();
}

Status SendHello(int fd, const Hello& hello, int pass_fd, Deadline deadline) {
  if (pass_fd < 0) return IoFull(fd, const_cast<Hello*>(&hello), sizeof(hello), true, deadline);
  iovec iov{const_cast<Hello*>(&hello), sizeof(hello)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov, msg.msg_iovlen = 1;
  msg.msg_control = control, msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  for (;;) {
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(sizeof(hello))) return Status::Ok();
    if (n >= 0) return Internal("short hello");  // a Unix stream sends small messages whole
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return ErrnoStatus("sendmsg", errno);
    RINGRUN_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline));
  }
}

Status RecvHello(int fd, Hello* hello, UniqueFd* passed, Deadline deadline) {
  char* p = reinterpret_cast<char*>(hello);
  size_t got = 0;
  while (got < sizeof(*hello)) {
    iovec iov{p + got, sizeof(*hello) - got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov, msg.msg_iovlen = 1;
    msg.msg_control = control, msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          int received;
          std::memcpy(&received, CMSG_DATA(c), sizeof(int));
          *passed = UniqueFd(received);
        }
      }
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Unavailable("connection closed");
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return ErrnoStatus("recvmsg", errno);
    RINGRUN_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline));
  }
  return Status::Ok();
}

}  // namespace ringrun::runtime
