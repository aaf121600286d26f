#include "ringrun/common/fd.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

namespace ringrun {

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Result<Pipe> MakePipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoStatus("pipe2", errno);
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

Status SetNonBlocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) return ErrnoStatus("fcntl(F_GETFL)", errno);
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (::fcntl(fd, F_SETFL, flags) != 0) return ErrnoStatus("fcntl(F_SETFL)", errno);
  return Status::Ok();
}

Status WriteAll(int fd, const void* buf, size_t len) {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("write", errno);
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace ringrun
