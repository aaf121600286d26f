#include "launcher/job/environment.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "launcher/hosts/slurm.h"
#include "ringrun/common/env_contract.h"

namespace ringrun::launcher::job {
namespace {

// The denylist. A rank inherits the launcher's environment except for these, because they
// describe the launching shell or session (meaningless or misleading in a rank, and wrong on
// another host), or because they are a launcher-to-rank contract of some earlier job (ringrun
// run inside a ringrun, horovodrun, torchrun, mpirun or srun rank) that would make a rank
// believe it is someone else. `-x NAME` passes a denied variable anyway.
//
// Exact names:
//   shell state      SHLVL PWD OLDPWD _ PS1 PS2 PS3 PS4 PROMPT_COMMAND COLUMNS LINES HISTFILE
//                    BASH_ENV ENV
//   login session    SSH_CLIENT SSH_CONNECTION SSH_TTY SSH_AUTH_SOCK SSH_AGENT_PID
//                    SSH_ORIGINAL_COMMAND SSH_ASKPASS XDG_SESSION_ID XDG_SESSION_TYPE
//                    XDG_SESSION_CLASS XDG_SESSION_DESKTOP XDG_RUNTIME_DIR XDG_SEAT XDG_VTNR
//                    DBUS_SESSION_BUS_ADDRESS
//                    (SSH_AUTH_SOCK is the launcher's own agent socket: ringrun itself uses it
//                    to authenticate, but it is a path on the launcher's host and a credential;
//                    ranks get it only through -x SSH_AUTH_SOCK.)
//   terminal / GUI   TERM_SESSION_ID WINDOWID DISPLAY XAUTHORITY WAYLAND_DISPLAY TMUX
//                    TMUX_PANE STY WINDOW ITERM_SESSION_ID KONSOLE_DBUS_SESSION
//                    VTE_VERSION GPG_TTY
//   host identity    HOSTNAME (Docker and some shells export it: on another host it lies;
//                    ranks have gethostname() and RINGRUN_HOSTNAME)
//   contracts        every name ContractVariableNames() lists (ours, Horovod's, torchrun's),
//                    Horovod's HOROVOD_CONTROLLER
//                    HOROVOD_CPU_OPERATIONS HOROVOD_GLOO_RENDEZVOUS_ADDR
//                    HOROVOD_GLOO_RENDEZVOUS_PORT HOROVOD_GLOO_IFACE, Open MPI's
//                    OMPI_UNIVERSE_SIZE OMPI_FIRST_RANKS OMPI_APP_CTX_NUM_PROCS
//                    OMPI_NUM_APP_CTX OMPI_COMMAND OMPI_ARGV, MPICH's MPI_LOCALRANKID
//                    MPI_LOCALNRANKS, Slurm's task identity SLURM_PROCID SLURM_LOCALID
//                    SLURM_NODEID
// Prefixes:
//   (RINGRUN_* contract names are denied by name, above; RINGRUN_ tuning knobs such as
//   RINGRUN_TIMEOUT_MS and RINGRUN_DISABLE_SHM pass, like NCCL_*.)
//   TORCHELASTIC_        torchrun's agent state (run id, restart count, error file)
//   OMPI_COMM_WORLD_     Open MPI rank identity
//   OMPI_MCA_orte_ OMPI_MCA_ess_ OMPI_MCA_pmix  Open MPI's wiring to its daemons
//   PMI_ PMIX_           process-manager connections of an enclosing MPI job
//   MV2_COMM_WORLD_      MVAPICH rank identity
// Not denied: tuning and configuration (HOROVOD_FUSION_THRESHOLD, NCCL_*, OMPI_MCA_btl,
// CUDA_VISIBLE_DEVICES, PATH, HOME, TERM, LANG, ...).
const std::unordered_set<std::string_view>& DeniedNames() {
  static const std::unordered_set<std::string_view> kNames = {
      "SHLVL",
      "PWD",
      "OLDPWD",
      "_",
      "PS1",
      "PS2",
      "PS3",
      "PS4",
      "PROMPT_COMMAND",
      "COLUMNS",
      "LINES",
      "HISTFILE",
      "BASH_ENV",
      "ENV",
      "SSH_CLIENT",
      "SSH_CONNECTION",
      "SSH_TTY",
      "SSH_AUTH_SOCK",
      "SSH_AGENT_PID",
      "SSH_ORIGINAL_COMMAND",
      "SSH_ASKPASS",
      "XDG_SESSION_ID",
      "XDG_SESSION_TYPE",
      "XDG_SESSION_CLASS",
      "XDG_SESSION_DESKTOP",
      "XDG_RUNTIME_DIR",
      "XDG_SEAT",
      "XDG_VTNR",
      "DBUS_SESSION_BUS_ADDRESS",
      "TERM_SESSION_ID",
      "WINDOWID",
      "DISPLAY",
      "XAUTHORITY",
      "WAYLAND_DISPLAY",
      "TMUX",
      "TMUX_PANE",
      "STY",
      "WINDOW",
      "ITERM_SESSION_ID",
      "KONSOLE_DBUS_SESSION",
      "VTE_VERSION",
      "GPG_TTY",
      "HOSTNAME",
      "HOROVOD_CONTROLLER",
      "HOROVOD_CPU_OPERATIONS",
      "HOROVOD_GLOO_RENDEZVOUS_ADDR",
      "HOROVOD_GLOO_RENDEZVOUS_PORT",
      "HOROVOD_GLOO_IFACE",
      "OMPI_UNIVERSE_SIZE",
      "OMPI_FIRST_RANKS",
      "OMPI_APP_CTX_NUM_PROCS",
      "OMPI_NUM_APP_CTX",
      "OMPI_COMMAND",
      "OMPI_ARGV",
      "MPI_LOCALRANKID",
      "MPI_LOCALNRANKS",
      "SLURM_PROCID",
      "SLURM_LOCALID",
      "SLURM_NODEID",
  };
  return kNames;
}

constexpr std::string_view kDeniedPrefixes[] = {
    "TORCHELASTIC_", "OMPI_COMM_WORLD_", "OMPI_MCA_orte_", "OMPI_MCA_ess_", "OMPI_MCA_pmix", "PMI_",
    "PMIX_",         "MV2_COMM_WORLD_",
};

bool IsValidName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
    bool digit = c >= '0' && c <= '9';
    if (!(alpha || (digit && i > 0))) return false;
  }
  return true;
}

// An environment being assembled: each name once, a later Set replacing in place.
class EnvBuilder {
 public:
  void Set(const std::string& name, const std::string& value) {
    auto [it, inserted] = index_.emplace(name, entries_.size());
    if (inserted) {
      entries_.push_back(name + "=" + value);
    } else {
      entries_[it->second] = name + "=" + value;
    }
  }
  bool Has(const std::string& name) const { return index_.count(name) != 0; }
  std::vector<std::string> Take() && { return std::move(entries_); }

 private:
  std::vector<std::string> entries_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace

const std::vector<std::string>& ContractVariableNames() {
  static const std::vector<std::string> kNames = {
      env::kRank,
      env::kSize,
      env::kLocalRank,
      env::kLocalSize,
      env::kCrossRank,
      env::kCrossSize,
      env::kHostname,
      env::kJobId,
      env::kJobService,
      env::kSecret,
      env::kHostAddr,
      env::kHostIndex,
      env::kRestartCount,
      "HOROVOD_RANK",
      "HOROVOD_SIZE",
      "HOROVOD_LOCAL_RANK",
      "HOROVOD_LOCAL_SIZE",
      "HOROVOD_CROSS_RANK",
      "HOROVOD_CROSS_SIZE",
      "HOROVOD_HOSTNAME",
      "RANK",
      "WORLD_SIZE",
      "LOCAL_RANK",
      "LOCAL_WORLD_SIZE",
      "GROUP_RANK",
      "GROUP_WORLD_SIZE",
      "ROLE_RANK",
      "ROLE_WORLD_SIZE",
      "MASTER_ADDR",
      "MASTER_PORT",
      "ROLE_NAME",
      "TORCHELASTIC_RUN_ID",
      "TORCHELASTIC_RESTART_COUNT",
      "TORCHELASTIC_MAX_RESTARTS",
  };
  return kNames;
}

bool IsContractVariable(const std::string& name) {
  static const std::unordered_set<std::string> kSet(ContractVariableNames().begin(),
                                                    ContractVariableNames().end());
  return kSet.count(name) != 0;
}

bool IsDeniedVariable(const std::string& name) {
  if (DeniedNames().count(name) != 0 || IsContractVariable(name)) return true;
  if (hosts::IsSlurmTaskVariable(name)) return true;  // the launcher's own Slurm task (slurm.h)
  for (std::string_view prefix : kDeniedPrefixes) {
    if (name.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

Result<std::pair<std::string, std::string>> ParseExportFlag(
    const std::string& flag, const std::vector<std::string>& launcher_env) {
  size_t eq = flag.find('=');
  std::string name = flag.substr(0, eq);
  if (name.empty()) {
    return InvalidArgument("-x " + flag +
                           ": missing variable name (write -x NAME or -x NAME=VALUE)");
  }
  if (!IsValidName(name)) {
    return InvalidArgument("-x " + flag + ": '" + name +
                           "' is not a valid variable name (letters, digits and '_', not "
                           "starting with a digit)");
  }
  if (IsContractVariable(name)) {
    return InvalidArgument("-x " + flag + ": " + name +
                           " is set by ringrun for every rank and cannot be exported");
  }
  if (eq != std::string::npos) return std::make_pair(name, flag.substr(eq + 1));
  const std::string prefix = name + "=";
  for (const std::string& entry : launcher_env) {
    if (entry.compare(0, prefix.size(), prefix) == 0) {
      return std::make_pair(name, entry.substr(prefix.size()));
    }
  }
  return InvalidArgument("-x " + name + ": " + name +
                         " is not set in the launcher's environment (write -x " + name +
                         "=VALUE to give it a value)");
}

const std::vector<std::string>& ThreadCountVariables() {
  static const std::vector<std::string> kNames = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                  "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                                                  "GOTO_NUM_THREADS"};
  return kNames;
}

int DefaultThreadsPerRank(const std::vector<std::string>& launcher_env,
                          const std::vector<std::pair<std::string, std::string>>& exports,
                          int local_size, int host_cores) {
  if (local_size <= 1) return 0;
  for (const std::string& name : ThreadCountVariables()) {
    const std::string prefix = name + "=";
    for (const std::string& entry : launcher_env) {
      if (entry.compare(0, prefix.size(), prefix) == 0) return 0;
    }
    for (const auto& kv : exports) {
      if (kv.first == name) return 0;
    }
  }
  return std::max(1, host_cores / local_size);
}

std::vector<std::string> BuildRankEnvironment(
    const std::vector<std::string>& launcher_env,
    const std::vector<std::pair<std::string, std::string>>& exports,
    const hosts::RankPlacement& placement, const JobContext& job) {
  EnvBuilder env;
  for (const std::string& entry : launcher_env) {
    size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    std::string name = entry.substr(0, eq);
    if (IsDeniedVariable(name) || env.Has(name)) continue;
    env.Set(name, entry.substr(eq + 1));
  }
  for (const auto& [name, value] : exports) {
    if (name.empty()) continue;
    env.Set(name, value);
  }
  if (job.threads_per_rank > 0) {
    const std::string threads = std::to_string(job.threads_per_rank);
    for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}) {
      env.Set(name, threads);
    }
  }

  const std::string rank = std::to_string(placement.rank);
  const std::string size = std::to_string(job.size);
  const std::string local_rank = std::to_string(placement.local_rank);
  const std::string local_size = std::to_string(placement.local_size);
  const std::string cross_rank = std::to_string(placement.cross_rank);
  const std::string cross_size = std::to_string(placement.cross_size);

  env.Set(env::kRank, rank);
  env.Set(env::kSize, size);
  env.Set(env::kLocalRank, local_rank);
  env.Set(env::kLocalSize, local_size);
  env.Set(env::kCrossRank, cross_rank);
  env.Set(env::kCrossSize, cross_size);
  env.Set(env::kHostname, job.hostname);
  env.Set(env::kJobId, job.job_id);
  env.Set(env::kJobService, job.job_service);
  env.Set(env::kSecret, job.secret);
  env.Set(env::kHostAddr, job.host_addr);
  env.Set(env::kHostIndex, std::to_string(placement.host_index));
  env.Set(env::kRestartCount, std::to_string(job.restart_count));

  env.Set("HOROVOD_RANK", rank);
  env.Set("HOROVOD_SIZE", size);
  env.Set("HOROVOD_LOCAL_RANK", local_rank);
  env.Set("HOROVOD_LOCAL_SIZE", local_size);
  env.Set("HOROVOD_CROSS_RANK", cross_rank);
  env.Set("HOROVOD_CROSS_SIZE", cross_size);
  env.Set("HOROVOD_HOSTNAME", job.hostname);

  env.Set("RANK", rank);
  env.Set("WORLD_SIZE", size);
  env.Set("LOCAL_RANK", local_rank);
  env.Set("LOCAL_WORLD_SIZE", local_size);
  env.Set("GROUP_RANK", std::to_string(placement.node_rank));
  if (placement.node_count > 0) env.Set("GROUP_WORLD_SIZE", std::to_string(placement.node_count));
  env.Set("ROLE_RANK", rank);
  env.Set("ROLE_WORLD_SIZE", size);
  env.Set("MASTER_ADDR", job.master_addr);
  env.Set("MASTER_PORT", std::to_string(job.master_port));
  // As torchrun's workers find them: torch.distributed.is_torchelastic_launched() is true, one
  // role, one run id across restarts, and the restart count and limit (--max-restarts).
  env.Set("ROLE_NAME", "default");
  env.Set("TORCHELASTIC_RUN_ID", job.run_id.empty() ? job.job_id : job.run_id);
  env.Set("TORCHELASTIC_RESTART_COUNT", std::to_string(job.restart_count));
  env.Set("TORCHELASTIC_MAX_RESTARTS", std::to_string(job.max_restarts));
  return std::move(env).Take();
}

}  // namespace ringrun::launcher::job
