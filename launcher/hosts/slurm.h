// Slurm: reading an allocation (the hostlist grammar, task counts) and the environment rules
// for ranks started inside one. The srun starter itself is in slurm_agent_starter.h.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "launcher/hosts/hostfile.h"
#include "ringrun/common/status.h"

namespace ringrun::launcher::hosts {

// Expands a Slurm hostlist expression as Slurm 22.05's hostlist_create does (and as
// `scontrol show hostnames EXPR` prints it), in the same order, duplicates kept:
//  - tokens are separated by ',', ' ' or '\t' outside brackets; empty tokens are skipped;
//  - a token is a plain name or a name with bracketed range lists "[1-3,07,10-12]";
//  - a range "lo-hi" or a single "lo" is zero-padded to the width of lo as written
//    ("n[08-10]" gives n08 n09 n10, "n[8-10]" gives n8 n9 n10);
//  - several brackets in one name give every combination, in Slurm's order: the last bracket
//    varies fastest, then the first, the second, ... ("a[1-2]b[3-4]" gives a1b3 a1b4 a2b3 a2b4);
//  - nothing may follow the last ']' ("n[1-2]-ib" is an error, as in Slurm).
// Errors (InvalidArgument) quote the bad token and say what is wrong: an empty or inverted range,
// a non-digit bound, unbalanced brackets, a range of more than 65536 names. Stricter than Slurm
// in two corners Slurm never produces itself: it accepts blanks or '+' inside brackets and an
// empty upper bound ("n[1-]"), which are errors here.
Result<std::vector<std::string>> ExpandHostlist(std::string_view expr);

// Expands a Slurm count list such as SLURM_TASKS_PER_NODE: "2(x3),1" gives 2 2 2 1.
// Counts are in [0, 65536] and repeats in [1, 65536]; errors quote the bad element.
Result<std::vector<int>> ExpandCountList(std::string_view list);

// A Slurm allocation as ringrun uses it.
struct SlurmAllocation {
  std::string job_id;
  std::vector<HostSpec> hosts;  // slots from the task counts; nodes with 0 tasks are left out
  bool inside_step = false;     // ringrun itself runs inside an srun step (SLURM_STEP_ID set)
  std::string source;           // e.g. "Slurm job 12 (SLURM_JOB_NODELIST=n[1-3], ...)"
};

// The value of NAME in `env` ("NAME=VALUE" strings); empty when unset.
std::string EnvValue(const std::vector<std::string>& env, std::string_view name);

// True when `env` describes a Slurm job: SLURM_JOB_ID (or the older SLURM_JOBID) is set.
bool InSlurmJob(const std::vector<std::string>& env);

// Reads the allocation from `env`. Hosts come from SLURM_JOB_NODELIST (or SLURM_NODELIST) and
// slots from SLURM_TASKS_PER_NODE; inside an srun step, from SLURM_STEP_NODELIST and
// SLURM_STEP_TASKS_PER_NODE, which are the step's (the others then mix job and step). Errors
// name the variable, its value and the bad token; more counts than nodes are tolerated (Slurm
// sets that for some layouts), fewer are an error. Call only when InSlurmJob(env).
Result<SlurmAllocation> ReadSlurmAllocation(const std::vector<std::string>& env);

// What --starter FLAG ("ssh", "slurm", "auto" or "") means for `hosts` given `env`.
struct StarterChoice {
  bool srun = false;     // one srun step (slurm_agent_starter.h); else SSH and local forks
  bool overlap = false;  // the step must overlap ringrun's own (ringrun runs inside a step)
};
// "slurm" needs a Slurm job (else InvalidArgument naming the flag). "auto" and "" choose srun
// inside a Slurm job when every host (none with a user@) is a node of the job, which holds when
// the hosts came from the job; an empty host list (a localhost job) stays forked.
Result<StarterChoice> ChooseStarter(const std::string& flag, const std::vector<std::string>& env,
                                    const std::vector<HostSpec>& hosts);

// Variables that describe one Slurm task (the launcher's own, or an agent's) and must not reach
// ranks, which frameworks would read as their own rank or size: SLURM_PROCID, SLURM_LOCALID,
// SLURM_NODEID, SLURM_NTASKS, SLURM_NPROCS, SLURM_GTIDS, SLURM_TASK_PID, SLURM_STEP_*,
// SLURM_STEPID, SLURMD_NODENAME, SLURM_SRUN_COMM_*, SLURM_LAUNCH_NODE_IPADDR, SLURM_CPU_BIND*,
// ... Job-wide variables (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_CONF, ...) pass.
bool IsSlurmTaskVariable(std::string_view name);

}  // namespace ringrun::launcher::hosts
