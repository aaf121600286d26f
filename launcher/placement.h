// Rank placement: host by host, in the order given (Horovod's and mpirun's default).
#pragma once

#include <vector>

#include "launcher/hostfile.h"
#include "ringrun/common/status.h"

namespace ringrun::launcher {

struct RankPlacement {
  int rank = 0;
  int host_index = 0;   // index into the host list
  int local_rank = 0;   // index among the ranks on this host
  int local_size = 0;   // ranks on this host
  int cross_rank = 0;   // among ranks with this local_rank, this host's index (Horovod)
  int cross_size = 0;   // number of hosts that have a rank with this local_rank
};

// Places np ranks. np must be in [1, total slots]; the error for too large an np names the
// slots per host. Hosts that get no rank are left out of nothing: they simply have no ranks.
Result<std::vector<RankPlacement>> PlaceRanks(const std::vector<HostSpec>& hosts, int np);

}  // namespace ringrun::launcher
