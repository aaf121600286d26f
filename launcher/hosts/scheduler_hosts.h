// Host lists handed over by a batch scheduler: Slurm (slurm.h), PBS/Torque, LSF and Grid Engine.
// ringrun reads them when no -H/--hostfile is given; Slurm hosts are started with srun, the
// others over SSH.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launcher/hosts/hostfile.h"
#include "ringrun/common/status.h"

namespace ringrun::launcher::hosts {

// PBS_NODEFILE text: one host name per line per slot; a host's lines are added up and hosts keep
// the order of their first line. Blank lines and surrounding blanks are ignored; a line with
// more than one word is an error naming the line.
Result<std::vector<HostSpec>> ParsePbsNodefile(const std::string& text, const std::string& origin);

// LSB_MCPU_HOSTS: "hostA 2 hostB 1" (name, count pairs, blank-separated). A host given twice is
// added up; an odd word count, a non-numeric or zero count is an error naming the pair.
Result<std::vector<HostSpec>> ParseLsfMcpuHosts(const std::string& value);

// PE_HOSTFILE text: "host slots queue processor-range" per line (only the first two words are
// used; the queue and range are optional). A host given twice is added up; a missing or
// non-numeric slot count is an error naming the line.
Result<std::vector<HostSpec>> ParseSgeHostfile(const std::string& text, const std::string& origin);

// Where a job's hosts came from when none were given.
struct SchedulerHosts {
  enum Kind { kSlurm, kPbs, kLsf, kSge } kind = kSlurm;
  std::vector<HostSpec> hosts;
  std::string source;        // for --dry-run and errors, e.g. "PBS_NODEFILE=/var/spool/x"
  bool inside_step = false;  // Slurm only: see SlurmAllocation
};

// The first scheduler whose variables are set in `env`, in this order: Slurm (SLURM_JOB_ID),
// PBS (PBS_NODEFILE), LSF (LSB_MCPU_HOSTS), Grid Engine (PE_HOSTFILE); nullopt when none is.
// Errors name the variable (and file and line) and the bad token.
Result<std::optional<SchedulerHosts>> HostsFromScheduler(const std::vector<std::string>& env);

}  // namespace ringrun::launcher::hosts
