// Joining a job that a PMIx launcher started (Open MPI's mpirun, Slurm's srun --mpi=pmix): the
// rendezvous Store (store.h) over this process's PMIx client, and what PMIx says of the job.
//
// PMIx is not one shared key-value table: each process puts values under its own name
// (PMIx_Put, published by PMIx_Commit) and reads another process's by naming that process
// (PMIx_Get). The PMIx server holds such a get until the named process has committed the key,
// up to a timeout, so no fence is needed and no rank waits for ranks it does not read: Get and
// Wait ask the rank that sets each key, which `setter_of` names (store_job_client.h's SetterOf).
// A get that finds the named process's data without the key (a server that answered with what
// was committed before) asks again, refreshing its copy, until the deadline. Add fails with
// kInvalidArgument: no key here is written by several ranks, and the store join adds nothing.
//
// Lifetime: libpmix's client is one per process. ConnectPmix initializes it (PMIx_Init) and it
// stays connected until the process exits; PMIx_Finalize runs then (atexit), because Open MPI's
// mpirun fails a job one of whose processes connected and exited without finalizing ("exiting
// improperly"). Keys are per round ("ringrun/<generation>/"), so a later ringrun_init reuses
// the store. Thread-safety: as store.h (one caller at a time).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "runtime/src/rendezvous/store.h"

namespace ringrun::runtime::rendezvous {

// What the PMIx server says of this process's job.
struct PmixJob {
  std::string nspace;  // the job's PMIx namespace
  int rank = 0, size = 1;
  int local_size = -1;     // PMIX_LOCAL_SIZE: the job's processes on this node; -1 unknown
  std::string rank0_host;  // PMIX_HOSTNAME of rank 0; empty unknown
};

class PmixStore : public Store {
 public:
  virtual const PmixJob& job() const = 0;
};

// Connects this process to its PMIx server (at most once per process: see the lifetime above).
// kUnavailable when this libringrun was built without PMIx (RINGRUN_WITH_PMIX) or the server
// cannot be reached; the message names the PMIx call and its error.
Result<std::unique_ptr<PmixStore>> ConnectPmix(std::function<int(const std::string&)> setter_of);

// The data-plane address this rank advertises in `job`: 127.0.0.1 when every rank runs on this
// node, else this host's address on the route to rank 0's host (from where rank 0's host, and
// so presumably the others, can reach it), else the first interface's that is not loopback.
// Ranks that give one address are one host to ringrun (shared memory, local_rank).
Result<std::string> PmixHostAddress(const PmixJob& job);

}  // namespace ringrun::runtime::rendezvous
