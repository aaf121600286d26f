// --bind-to core: which CPUs each rank of a host is confined to.
//
// The rule: the agent's allowed CPUs (its affinity mask: the whole machine, or what a scheduler,
// cgroup or taskset gave it), in ascending order, are cut into local_size contiguous shares of
// allowed / local_size CPUs each; the rank with local rank i gets share i, and the remainder
// (the last allowed % local_size CPUs) is left unused. CPUs are logical CPUs in the kernel's
// numbering; the machine's topology (sockets, hyperthread siblings) is not consulted.
#pragma once

#include <string>
#include <vector>

#include "ringrun/common/spawn.h"  // CpuListText
#include "ringrun/common/status.h"

namespace ringrun::agent {

// Set in a bound rank's environment to its CpuListText ("0", "2-3"); absent when unbound.
inline constexpr char kCpusVariable[] = "RINGRUN_CPUS";

// The CPUs of the rank with `local_rank` among `local_size` ranks, given the agent's `allowed`
// CPUs (any order, no duplicates). Fails, with a message giving the counts, when there are
// more ranks than allowed CPUs; fails when local_rank is not in [0, local_size). Pure.
Result<std::vector<int>> CpusForRank(const std::vector<int>& allowed, int local_size,
                                     int local_rank);

// The calling thread's allowed CPUs (sched_getaffinity), ascending. Errors name the syscall.
Result<std::vector<int>> AllowedCpus();

}  // namespace ringrun::agent
