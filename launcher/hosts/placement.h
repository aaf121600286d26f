// Rank placement: host by host, in the order given (Horovod's and mpirun's default).
#pragma once

#include <vector>

#include "launcher/hosts/hostfile.h"
#include "ringrun/common/status.h"

namespace ringrun::launcher::hosts {

struct RankPlacement {
  int rank = 0;
  int host_index = 0;  // index into the host list
  int local_rank = 0;  // index among the ranks on this host
  int local_size = 0;  // ranks on this host
  int cross_rank = 0;  // among ranks with this local_rank, this host's index (Horovod)
  int cross_size = 0;  // number of hosts that have a rank with this local_rank
  int node_rank = 0;   // this host's index among the hosts that have ranks (torchrun's GROUP_RANK)
  int node_count = 0;  // hosts that have ranks (GROUP_WORLD_SIZE); 0 when not computed
};

// Places np ranks. np must be in [1, total slots], or only at least 1 with `oversubscribe`: then
// every host gets its slots, and the ranks beyond go to the hosts in turn, one each (as mpirun
// --oversubscribe fills by slot). The error for too large an np names the slots per host and
// --oversubscribe. Hosts that get no rank are left out of nothing: they simply have no ranks.
// Ranks are numbered host by host, so the hosts that get ranks are a prefix of the list.
Result<std::vector<RankPlacement>> PlaceRanks(const std::vector<HostSpec>& hosts, int np,
                                              bool oversubscribe = false);

// The check PlaceRanks makes, for callers that only validate: np in [1, total slots] (or just
// np >= 1 with `oversubscribe`). "-np 9 exceeds the 8 slots available (a:4, b:4);
// --oversubscribe allows more ranks than slots"; "-np 0: must be at least 1".
Status CheckNumProc(const std::vector<HostSpec>& hosts, int np, bool oversubscribe = false);

// Sum of the slots (saturating at INT_MAX).
int TotalSlots(const std::vector<HostSpec>& hosts);

}  // namespace ringrun::launcher::hosts
