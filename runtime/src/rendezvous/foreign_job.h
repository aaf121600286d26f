// Another launcher's job around this process, read from its environment. Where ringrun_init
// finds no ringrun job to join (and no PMIx server to join through: PmixLauncher), a process
// that torchrun, mpirun, srun or horovodrun started as one of several must not run as a job of
// size 1: every rank would believe it is rank 0, nothing would be averaged and checkpoints
// would collide, without an error.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ringrun/common/status.h"

namespace ringrun::runtime::rendezvous {

struct ForeignJob {
  std::string launcher;           // "torchrun", "mpirun (Open MPI)", ...
  int size = -1;                  // the job's size, -1 when the environment does not say
  std::vector<std::string> seen;  // "NAME=value" of the variables that show it, in order
  std::string advice;             // what to do instead
};

// The job of more than one process that the environment shows, if any. Looked at, in this
// order (the first that shows a job of size > 1 is named; `seen` lists what each showed):
//   torchrun      WORLD_SIZE > 1 (torch's env:// contract; with RANK, MASTER_ADDR, ...)
//   horovodrun    HOROVOD_SIZE > 1
//   mpirun        OMPI_COMM_WORLD_SIZE > 1 (Open MPI)
//   srun          SLURM_PROCID in a step (SLURM_STEP_ID) of SLURM_STEP_NUM_TASKS (else
//                 SLURM_NTASKS) > 1; a batch script is not a step and is not refused
//   PMIx          PMIX_RANK > 0 (a PMIx launcher that says no size: only a rank other than 0
//                 shows that there are several)
// A single process, or a job of size 1 under any of them, shows none.
std::optional<ForeignJob> DetectForeignJob(const std::function<const char*(const char*)>& getenv);

// The launcher that started this process through PMIx, which ringrun_init joins (pmix_store.h):
// "mpirun (Open MPI)" (OMPI_COMM_WORLD_SIZE set), "srun (Slurm)" (SLURM_STEP_ID set) or "a PMIx
// launcher", when PMIX_RANK and PMIX_NAMESPACE are both set; nullopt otherwise. (Whether
// RINGRUN_RANK, which wins, is set is the caller's to check.)
std::optional<std::string> PmixLauncher(const std::function<const char*(const char*)>& getenv);

// The refusal ringrun_init returns for `job`: kInvalidArgument naming the launcher, the
// variables seen, why its PMIx server could not be joined (`pmix_failure`, where one was
// tried) and what to do.
Status RefuseForeignJob(const ForeignJob& job, const std::string& pmix_failure = "");

}  // namespace ringrun::runtime::rendezvous
