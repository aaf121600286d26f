// What the process tests read from a child.
#pragma once

#include <unistd.h>

#include <string>

namespace ringrun {

// Everything until end-of-file on `fd` (a finished child's stdout pipe).
inline std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

}  // namespace ringrun
