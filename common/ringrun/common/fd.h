// One owner per file descriptor.
#pragma once

#include <utility>

#include "ringrun/common/status.h"

namespace ringrun {

// A non-copyable owner of one fd; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.Release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) Reset(o.Release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};
// pipe2(O_CLOEXEC).
Result<Pipe> MakePipe();
Status SetNonBlocking(int fd, bool on);
// Writes all of buf, retrying on EINTR and short writes (blocking fd).
Status WriteAll(int fd, const void* buf, size_t len);

}  // namespace ringrun
