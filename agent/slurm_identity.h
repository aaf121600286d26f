// How an agent started by srun (launcher/starters/slurm_agent_starter.h) learns who it is: its host
// index from its Slurm node name, its secret from the environment.
#pragma once

#include <string>

#include "ringrun/common/status.h"

namespace ringrun::agent {

// The index of this node in `hosts_csv` (the job's host names by index, comma-separated).
// `nodename` is SLURMD_NODENAME (empty: unset); `hostname` is gethostname()'s answer, used when
// the node name is unset. Names match exactly, else case-insensitively, else by their first
// label ("n1" matches "n1.cluster"). No match, or two, is a NotFound/InvalidArgument naming the
// node and the list.
Result<int> SlurmHostIndex(const std::string& hosts_csv, const std::string& nodename,
                           const std::string& hostname);

// Takes the job secret from RINGRUN_AGENT_SECRET and removes the variable from this process's
// environment. NotFound when unset or empty.
Result<std::string> TakeSecretFromEnvironment();

}  // namespace ringrun::agent
