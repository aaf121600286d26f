// The ringrun command line (CLI11), horovodrun-compatible.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "launcher/hosts/hostfile.h"
#include "ringrun/common/defaults.h"
#include "ringrun/common/status.h"

namespace ringrun::launcher {

struct Options {
  // Job shape.
  int np = 0;                          // 0 until resolved: defaults to the total slots
  std::vector<hosts::HostSpec> hosts;  // resolved from -H, --hostfile, a scheduler or localhost:np
  std::string host_source;             // where hosts came from, for --dry-run
  // How agents start (--starter): kSlurm is one srun step (slurm_agent_starter.h); "auto"
  // resolves to it inside a Slurm job when every host is a node of the job, else to kSsh.
  enum class Starter { kSsh, kSlurm } starter = Starter::kSsh;
  bool srun_overlap = false;         // kSlurm from inside a step: the agent step must overlap it
  std::vector<std::string> command;  // everything after the first non-option word or "--"
  std::vector<std::pair<std::string, std::string>> exports;  // -x, resolved
  // --bind-to: kCore confines each rank to its share of its host's allowed CPUs (the agent's
  // rule, agent/cpu_binding.h). kNone, the default as in horovodrun and torchrun, leaves ranks
  // with the agent's CPUs, so that jobs sharing a host do not pile onto the same cores.
  enum class BindTo { kNone, kCore } bind_to = BindTo::kNone;

  // Timing and output.
  int start_timeout_s = kDefaultStartTimeoutS;
  int grace_ms = kDefaultGraceMs;  // --grace-period SECONDS (float accepted)
  std::string output_dir;          // --output-filename DIR
  bool prefix_timestamp = false;
  bool dry_run = false;
  std::string log_level = "warn";  // --log-level; --verbose means "debug"

  // Remote hosts (SSH).
  std::string ssh_identity_file;  // -i/--ssh-identity-file
  int ssh_port = 0;               // -p/--ssh-port; 0: ssh config or 22
  std::string ssh_known_hosts;    // --ssh-known-hosts; empty: ~/.ssh/known_hosts
  bool ssh_accept_new_host_keys = false;
  int ssh_fanout = kSshFanout;
  int ssh_connect_timeout_s = kSshConnectTimeoutS;
  std::string agent_path;         // --agent-path; empty: same absolute path as ours
  std::string launcher_address;   // --launcher-address
  std::string network_interface;  // --network-interface
  std::string wdir;               // --wdir; empty: launcher's cwd

  // Diagnostics.
  bool check_gpu = false;            // --check-gpu
  bool check_gpu_allreduce = false;  // --allreduce (with --check-gpu)
  bool check_build = false;          // --check-build
};

// What the parser decided.
struct ParseOutcome {
  enum Kind { kRun, kExitNow } kind = kRun;
  int exit_code = 0;    // for kExitNow: 0 after --help/--version, 2 after a usage error
  std::string message;  // printed by main: to stdout for 0, stderr for 2
  Options options;
};

// Parses argv; never exits and never prints. Usage errors give kExitNow with exit_code 2 and
// a message naming the flag, or the hostfile and line. `environ_vars` serves -x NAME.
//
// The command is argv from the first word that is neither an option nor an option's value
// (or from the word after "--"), unchanged: later words that look like flags are the command's.
// Options take "--flag VALUE", "--flag=VALUE", and for one-letter flags "-HVALUE"; horovodrun's
// "-np", "-hostfile" and "-cb" are accepted. A value-taking flag given twice keeps the last
// value, except -H and --hostfile (an error); -x accumulates, a repeated NAME keeping its last
// value. On success: hosts is non-empty (localhost with np slots when none are given, 1 slot
// for --check-gpu/--check-build), np is in [1, total slots], and command is non-empty unless
// check_gpu or check_build. Error messages are one line without "ringrun:" or a newline; the
// help and version texts end with a newline.
ParseOutcome ParseCommandLine(int argc, const char* const* argv,
                              const std::vector<std::string>& environ_vars);

// The --help text.
std::string UsageText();

}  // namespace ringrun::launcher
