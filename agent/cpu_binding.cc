#include "agent/cpu_binding.h"

#include <errno.h>
#include <sched.h>

#include <algorithm>

namespace ringrun::agent {

Result<std::vector<int>> CpusForRank(const std::vector<int>& allowed, int local_size,
                                     int local_rank) {
  if (local_size < 1 || local_rank < 0 || local_rank >= local_size) {
    return InvalidArgument("local rank " + std::to_string(local_rank) + " of " +
                           std::to_string(local_size) + " ranks");
  }
  const size_t n = allowed.size();
  if (n < static_cast<size_t>(local_size)) {
    return InvalidArgument(std::to_string(local_size) + " ranks but " + std::to_string(n) +
                           (n == 1 ? " allowed CPU" : " allowed CPUs"));
  }
  std::vector<int> sorted = allowed;
  std::sort(sorted.begin(), sorted.end());
  const size_t share = n / static_cast<size_t>(local_size);
  const auto first = sorted.begin() + static_cast<std::ptrdiff_t>(share * local_rank);
  return std::vector<int>(first, first + static_cast<std::ptrdiff_t>(share));
}

Result<std::vector<int>> AllowedCpus() {
  // The kernel's mask may be wider than cpu_set_t's 1024 CPUs: grow until it fits.
  for (int ncpus = 1024; ncpus <= (1 << 20); ncpus *= 2) {
    cpu_set_t* set = CPU_ALLOC(ncpus);
    if (set == nullptr) return ErrnoStatus("sched_getaffinity: CPU_ALLOC", ENOMEM);
    const size_t size = CPU_ALLOC_SIZE(ncpus);
    CPU_ZERO_S(size, set);
    if (::sched_getaffinity(0, size, set) != 0) {
      const int err = errno;
      CPU_FREE(set);
      if (err == EINVAL) continue;
      return ErrnoStatus("sched_getaffinity", err);
    }
    std::vector<int> out;
    for (int c = 0; c < ncpus; ++c) {
      if (CPU_ISSET_S(c, size, set)) out.push_back(c);
    }
    CPU_FREE(set);
    return out;
  }
  return ErrnoStatus("sched_getaffinity", EINVAL);
}

}  // namespace ringrun::agent
