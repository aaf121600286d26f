// The AgentStarter inside a Slurm allocation: every agent of the job starts in ONE srun step,
//   srun --nodes=N --ntasks=N --ntasks-per-node=1 --nodelist=H1,...,HN --kill-on-bad-exit=1
//        --cpu-bind=none --mpi=none --job-name=ringrun-agents [--overlap]
//        AGENT --launcher ADDR:PORT --slurm-hosts NAME0,NAME1,... --log-level L
// (what Open MPI's plm/slurm does for its daemons). Each agent finds its host index by looking
// its node name (SLURMD_NODENAME) up in --slurm-hosts, the job's host list by index.
//
// The secret travels in srun's environment (RINGRUN_AGENT_SECRET), never on a command line:
// scontrol shows a step's command line to any user, not its environment; the agent unsets it at
// once, and ranks get their environment from the launcher, not from the agent.
//
// srun runs in its own process group (a Ctrl-C at the terminal reaches ringrun only, which
// forwards it to the ranks itself), with stdin on /dev/null, default signal dispositions and an
// environment without the variables of the launcher's own Slurm task that srun would read as
// options (SLURM_NTASKS, SLURM_CPU_BIND, SLURM_EXACT, ...). Its stdout and stderr (the agents'
// own log lines among them) are relayed to ringrun's stderr as "[srun] line".
//
// --overlap: not passed, like mpirun: the agent step holds the CPUs of its nodes while the job
// runs, so a second ordinary step on those nodes waits for it instead of oversubscribing the
// ranks; a user who wants one anyway runs it with `srun --overlap`, which overlaps every step.
// Passed only when ringrun itself runs inside a step (SLURM_STEP_ID set), whose resources would
// otherwise block the agent step forever.
//
// Start() is called once per host; the first call starts the step for every host of the job
// and each call returns a handle on that shared step: Poll() is srun's exit status (the highest
// of the agents', 128+signal for a killed one), Kill() ends the whole step (SIGTERM to srun,
// which SIGKILLs the agents, whose ranks die with them; SIGKILL to srun 5 s later).
//
// An elastic job (step_per_host) loses and regains hosts one at a time, which one step for all
// cannot follow: a step's failed node ends it (or, with srun --no-kill, leaves it running
// without that node, which Slurm then never gives back to it), and a step cannot be ended on
// one node only. So each Start() runs a step of its own, --nodes=1 on that host: a lost node
// ends its own step, Kill() ends one host's agent, and a host back from the blacklist gets a
// new step. The allocation itself must outlive a failed node: that is the job's own
// --no-kill (salloc/sbatch), docs/elastic.md.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "launcher/starters/agent_starter.h"

namespace ringrun::launcher::starters {

struct SlurmStarterConfig {
  std::vector<std::string> host_names;          // the job's hosts by index (Slurm node names)
  std::vector<int> active_hosts;                // the indices that get an agent, ascending
  bool overlap = false;                         // pass --overlap (ringrun runs inside a step)
  bool step_per_host = false;                   // a step for each Start() (an elastic job)
  std::string srun = "srun";                    // found on PATH unless it holds a '/'
  std::string launcher_address;                 // --launcher-address
  std::vector<std::string> network_interfaces;  // --network-interfaces
};

// The srun argv for `launch` with agents dialling `address` (without the secret): the step of
// every active host, or with step_per_host, the step of host `launch.host_index`.
std::vector<std::string> BuildSrunCommand(const SlurmStarterConfig& config,
                                          const AgentLaunch& launch, const std::string& address);

// The environment srun gets: `env` without the launcher's Slurm task variables, plus
// RINGRUN_AGENT_SECRET=secret.
std::vector<std::string> BuildSrunEnvironment(const std::vector<std::string>& env,
                                              const std::string& secret);

// The address agents dial: the configured one, the interface's, 127.0.0.1 when every active
// host is this machine, else this machine's source address on the route to the first other host.
Result<std::string> SlurmLauncherAddress(const SlurmStarterConfig& config);

std::unique_ptr<AgentStarter> MakeSlurmAgentStarter(SlurmStarterConfig config);

}  // namespace ringrun::launcher::starters
