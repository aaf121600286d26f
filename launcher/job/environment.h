// The environment each rank starts with: the launcher's own, minus the denylist, plus -x
// settings, plus the contract (RINGRUN_*, HOROVOD_*, torchrun's RANK/WORLD_SIZE/...).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "launcher/hosts/placement.h"
#include "ringrun/common/status.h"

namespace ringrun::launcher::job {

// Variables that describe the launching shell or session and must not reach ranks
// (documented in the README): e.g. SHLVL, PWD, OLDPWD, _, TERM_SESSION_ID, SSH_*,
// DISPLAY, XDG_SESSION_*, XAUTHORITY, WINDOWID, PROMPT_COMMAND, PS1, and any RINGRUN_*,
// HOROVOD_*, RANK-style contract variable already set.
// The full list, with the reason for each entry, is in environment.cc.
bool IsDeniedVariable(const std::string& name);

// True for the names BuildRankEnvironment sets for every rank (RINGRUN_RANK, HOROVOD_SIZE,
// RANK, MASTER_PORT, ...). They cannot be exported with -x. All of them are also denied.
bool IsContractVariable(const std::string& name);

// The names BuildRankEnvironment sets, in the order it sets them.
const std::vector<std::string>& ContractVariableNames();

// Parses one "-x NAME[=VALUE]": a bare NAME takes its value from `launcher_env`; an unset
// bare NAME or an invalid name is an InvalidArgument naming the flag. NAME must be
// [A-Za-z_][A-Za-z0-9_]*; VALUE is taken byte for byte (it may be empty or contain '=').
// A denied name may be exported explicitly (the user asked for it); a contract name may not.
Result<std::pair<std::string, std::string>> ParseExportFlag(
    const std::string& flag, const std::vector<std::string>& launcher_env);

// Everything the contract needs beyond the placement.
struct JobContext {
  std::string job_id;
  std::string job_service;  // host:port of the job service as seen from the rank's host
  std::string secret;
  std::string hostname;     // the rank's host, as in the host list
  std::string host_addr;    // the rank's host address as the launcher sees it
  std::string master_addr;  // rank 0's host address
  int master_port = 0;      // a port found free on rank 0's host
  int size = 0;
  int restart_count = 0;  // the attempt's (--max-restarts): 0 for the first
  int max_restarts = 0;   // --max-restarts
  std::string run_id;     // TORCHELASTIC_RUN_ID, one for every attempt; empty: job_id
  // > 0: the rank gets OMP_NUM_THREADS and the BLAS thread counts set to this (see
  // DefaultThreadsPerRank); 0: they are left as inherited.
  int threads_per_rank = 0;
};

// The variables that choose a rank's compute threads: OMP_NUM_THREADS and the BLAS libraries'
// own counts (OPENBLAS_NUM_THREADS, MKL_NUM_THREADS, BLIS_NUM_THREADS, GOTO_NUM_THREADS).
const std::vector<std::string>& ThreadCountVariables();

// Threads per rank: when a host runs several ranks (local_size > 1) and none of
// ThreadCountVariables is set in `launcher_env` or by an export, the host's ranks share its
// cores: max(1, host_cores / local_size). Otherwise 0 (leave them alone: one rank per host
// uses every core; a value the user set, with -x or in the environment, wins).
int DefaultThreadsPerRank(const std::vector<std::string>& launcher_env,
                          const std::vector<std::pair<std::string, std::string>>& exports,
                          int local_size, int host_cores);

// launcher_env: "NAME=VALUE" strings (environ). Exports override the launcher's values;
// contract variables override both. Order: inherited, then exports, then contract.
// Each name appears once in the result: a later setting replaces an earlier one in place (the
// variable keeps the position where it first appeared). Entries of launcher_env without '=' or
// with an empty name are dropped; for a name given twice in launcher_env the first wins, as
// getenv() would have it. Inherited entries whose name IsDeniedVariable are dropped.
// Contract values: RINGRUN_* and HOROVOD_* from the placement and `job` (RINGRUN_RESTART_COUNT =
// job.restart_count); torchrun's RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (= placement.node_rank),
// GROUP_WORLD_SIZE (= placement.node_count; left out when 0), ROLE_RANK, ROLE_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, ROLE_NAME ("default"), TORCHELASTIC_RUN_ID (= job.run_id, else
// job.job_id), TORCHELASTIC_RESTART_COUNT (= job.restart_count) and TORCHELASTIC_MAX_RESTARTS
// (= job.max_restarts). With
// job.threads_per_rank > 0, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS are set
// to it (after the exports).
std::vector<std::string> BuildRankEnvironment(
    const std::vector<std::string>& launcher_env,
    const std::vector<std::pair<std::string, std::string>>& exports,
    const hosts::RankPlacement& placement, const JobContext& job);

}  // namespace ringrun::launcher::job
