#include "runtime/src/rendezvous/foreign_job.h"

#include <cerrno>
#include <cstdlib>

namespace ringrun::runtime::rendezvous {
namespace {

// The value of a variable as a non-negative integer, or -1 (unset, empty or not a number).
long Count(const char* v) {
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  return errno != 0 || *end != '\0' || x < 0 ? -1 : x;
}

class Seen {
 public:
  explicit Seen(const std::function<const char*(const char*)>& getenv) : getenv_(getenv) {}
  // The variable's value (null when unset); a set one is listed in `seen`.
  const char* Get(const char* name) {
    const char* v = getenv_(name);
    if (v != nullptr) seen_.push_back(std::string(name) + "=" + v);
    return v;
  }
  std::vector<std::string> Take() { return std::move(seen_); }

 private:
  const std::function<const char*(const char*)>& getenv_;
  std::vector<std::string> seen_;
};

std::string Ringrun(long size) {
  return "`ringrun -np " + (size > 1 ? std::to_string(size) : std::string("N")) + " ...`";
}

}  // namespace

std::optional<ForeignJob> DetectForeignJob(const std::function<const char*(const char*)>& getenv) {
  {
    Seen s(getenv);
    const long size = Count(s.Get("WORLD_SIZE"));
    if (size > 1) {
      std::vector<std::string> missing;
      for (const char* name : {"RANK", "MASTER_ADDR", "MASTER_PORT"}) {
        if (s.Get(name) == nullptr) missing.push_back(name);
      }
      for (const char* name :
           {"LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID"}) {
        s.Get(name);
      }
      std::string lacking;
      for (const std::string& m : missing) lacking += (lacking.empty() ? "" : ", ") + m;
      return ForeignJob{
          "torchrun (torch's env:// contract)", static_cast<int>(size), s.Take(),
          "from Python, ringrun.init() (and ringrun.torch.init()) joins through torch's store "
          "when RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are all set" +
              (lacking.empty() ? std::string() : " (" + lacking + " not set here)") +
              "; from C or C++, call ringrun_init_with_store with a store the ranks share; or "
              "start the job with " +
              Ringrun(size)};
    }
  }
  {
    Seen s(getenv);
    const long size = Count(s.Get("HOROVOD_SIZE"));
    if (size > 1) {
      s.Get("HOROVOD_RANK");
      return ForeignJob{"horovodrun", static_cast<int>(size), s.Take(),
                        "ringrun does not join horovodrun's rendezvous: start the job with " +
                            Ringrun(size) + " (it takes horovodrun's flags)"};
    }
  }
  {
    Seen s(getenv);
    const long size = Count(s.Get("OMPI_COMM_WORLD_SIZE"));
    if (size > 1) {
      s.Get("OMPI_COMM_WORLD_RANK");
      s.Get("PMIX_RANK");
      return ForeignJob{"mpirun (Open MPI)", static_cast<int>(size), s.Take(),
                        "ringrun joins an mpirun job through PMIx (Open MPI 4 or later, which "
                        "sets PMIX_RANK and PMIX_NAMESPACE, and a libringrun built with PMIx); "
                        "or start the job with " +
                            Ringrun(size) + " (with -H or --hostfile for several hosts)"};
    }
  }
  {
    Seen s(getenv);
    const char* procid = s.Get("SLURM_PROCID");
    const char* step = s.Get("SLURM_STEP_ID");
    long size = Count(s.Get("SLURM_STEP_NUM_TASKS"));
    if (size < 0) size = Count(s.Get("SLURM_NTASKS"));
    if (procid != nullptr && step != nullptr && size > 1) {
      return ForeignJob{"srun (Slurm)", static_cast<int>(size), s.Take(),
                        "start the step with `srun --mpi=pmix -n " + std::to_string(size) +
                            "` (ringrun joins it through PMIx), or run `ringrun` once in the "
                            "allocation (it starts the ranks on the allocation's nodes)"};
    }
  }
  {
    Seen s(getenv);
    if (Count(s.Get("PMIX_RANK")) > 0) {
      return ForeignJob{"a PMIx launcher (mpirun or srun --mpi=pmix)", -1, s.Take(),
                        "ringrun joins a PMIx job when PMIX_RANK and PMIX_NAMESPACE are set "
                        "and its PMIx server can be reached; or start the job with " +
                            Ringrun(-1)};
    }
  }
  return std::nullopt;
}

std::optional<std::string> PmixLauncher(const std::function<const char*(const char*)>& getenv) {
  auto set = [&](const char* name) {
    const char* v = getenv(name);
    return v != nullptr && *v != '\0';
  };
  if (!set("PMIX_RANK") || !set("PMIX_NAMESPACE")) return std::nullopt;
  if (set("OMPI_COMM_WORLD_SIZE")) return "mpirun (Open MPI)";
  if (set("SLURM_STEP_ID")) return "srun (Slurm)";
  return "a PMIx launcher";
}

Status RefuseForeignJob(const ForeignJob& job, const std::string& pmix_failure) {
  std::string seen;
  for (const std::string& v : job.seen) seen += (seen.empty() ? "" : " ") + v;
  return InvalidArgument("this process is one of " +
                         (job.size > 1 ? std::to_string(job.size) : std::string("several")) +
                         " processes started by " + job.launcher + " (" + seen +
                         "), but it has no ringrun rendezvous to join" +
                         (pmix_failure.empty()
                              ? std::string()
                              : " (its PMIx server could not be joined: " + pmix_failure + ")") +
                         "; it will not run as a job of size 1. To join: " + job.advice + ".");
}

}  // namespace ringrun::runtime::rendezvous
