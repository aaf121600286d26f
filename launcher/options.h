// The ringrun command line, horovodrun-compatible: its flags follow Python argparse's rules.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "launcher/elastic/discovery.h"
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
  std::string log_level = "warn";      // --log-level as spdlog names it; --verbose means "debug"
  std::optional<bool> log_timestamps;  // --log-with(out)-timestamp; unset: with --verbose only
  int timeout_s = 0;                   // --timeout: the job's wall-clock limit; 0: none
  bool report_bindings = false;        // --report-bindings: each rank's CPUs as it starts
  bool oversubscribe = false;          // --oversubscribe: more ranks than slots
  // --max-restarts (torchrun's): how many times a failed job starts again on the same hosts
  // (launcher/job/restart_policy.h); 0: never.
  int max_restarts = 0;
  // Elastic jobs (horovodrun's flags; docs/elastic.md): on when --min-np or --max-np is given.
  // The host set is fixed (-H, --hostfile, localhost): a failed rank's host is left out and the
  // survivors go on in a new generation while at least min_np of them remain.
  struct Elastic {
    bool enabled = false;
    int min_np = 0;                                 // --min-np; resolved to np when not given
    int max_np = 0;                                 // --max-np; resolved to np when not given
    int slots_per_host = 1;                         // --slots-per-host (for a discovery script)
    int elastic_timeout_s = kElasticTimeoutS;       // --elastic-timeout, HOROVOD_ELASTIC_TIMEOUT
    std::optional<int> reset_limit;                 // --reset-limit; none: unlimited
    std::optional<std::pair<int, int>> cooldown_s;  // --blacklist-cooldown-range MIN MAX
    // --host-discovery-script: a shell command line; empty: the host set is fixed. Run once
    // before the placement (its hosts are the job's) and then every discovery_interval_s.
    std::string discovery_script;
    int discovery_interval_s = elastic::kDiscoveryIntervalS;  // --discovery-interval
    int discovery_timeout_s = kDiscoveryTimeoutMs / 1000;     // --discovery-timeout
  } elastic;

  // Remote hosts (SSH).
  std::string ssh_identity_file;  // -i/--ssh-identity-file
  int ssh_port = 0;               // -p/--ssh-port; 0: ssh config or 22
  std::string ssh_known_hosts;    // --ssh-known-hosts; empty: ~/.ssh/known_hosts
  bool ssh_accept_new_host_keys = false;
  int ssh_fanout = kSshFanout;
  int ssh_connect_timeout_s = kSshConnectTimeoutS;
  std::string agent_path;        // --agent-path; empty: same absolute path as ours
  std::string launcher_address;  // --launcher-address
  // --network-interfaces: the launcher's address comes from the first that has one here, each
  // rank's data-plane address from the first its host has (RINGRUN_HOST_ADDR), and NCCL gets
  // them all (NCCL_SOCKET_IFNAME).
  std::vector<std::string> network_interfaces;
  std::string wdir;  // --wdir; empty: launcher's cwd

  // Diagnostics.
  bool check_gpu = false;            // --check-gpu
  bool check_gpu_allreduce = false;  // --allreduce (with --check-gpu)
  bool check_build = false;          // --check-build

  // One line each, for stderr before the job starts: what a flag of horovodrun's that ringrun
  // reads differently does here instead ("--gloo: ...").
  std::vector<std::string> notes;
};

// What the parser decided.
struct ParseOutcome {
  enum Kind { kRun, kExitNow } kind = kRun;
  int exit_code = 0;    // for kExitNow: 0 after --help/--version, 2 after a usage error
  std::string message;  // printed by main: to stdout for 0, stderr for 2
  Options options;
};

// Parses argv; never exits and never prints. Usage errors give kExitNow with exit_code 2 and
// a message naming the flag as written and its value, or the hostfile and line; nothing is
// started. `environ_vars` serves -x NAME and the scheduler host lists.
//
// Flags are read as horovodrun's Python argparse reads them (MatchArgs below). The command is
// argv from the first word that is not an option or an option's value (or from the word after
// "--"), unchanged: later words that look like flags are the command's. A flag given twice
// keeps its last value, except -H and --hostfile (an error); -x accumulates, a repeated NAME
// keeping its last value. On success: hosts is non-empty (localhost with np slots when none
// are given, 1 slot for --check-gpu/--check-build), np is in [1, total slots] (at least 1 with
// --oversubscribe), and command is
// non-empty unless check_gpu or check_build.
//
// Every option of horovodrun (HorovodrunOptionNames) is accepted: it sets what it sets in
// Horovod (the HOROVOD_* variables of every rank, and ringrun's own where ringrun has the
// feature), or it is accepted with a note. The elastic flags make an elastic job as in
// horovodrun: --min-np or --host-discovery-script (not --max-np alone).
// --config-file reads Horovod's YAML schema (config_file.h); a setting whose flag is also on
// the command line is left out, as horovodrun does. Error messages are one line without "ringrun:"
// or a newline; the help and version texts end with a newline.
ParseOutcome ParseCommandLine(int argc, const char* const* argv,
                              const std::vector<std::string>& environ_vars);

// The --help text: every flag with its spellings, its values and its default.
std::string UsageText();

// Every option string of horovodrun (horovod/runner/launch.py), "-np", "--num-proc", ...
const std::set<std::string>& HorovodrunOptionNames();

// ---- The matcher under ParseCommandLine, generic over a table of flags ----

// How one flag is written.
struct FlagSyntax {
  std::vector<std::string> names;  // argparse's option strings: "-np", "--num-proc", "-H"
  int nargs = 1;                   // values it takes: 0 (a switch), 1, 2 (argparse's nargs=2)
  std::string metavar;             // its values in --help and messages: "N", "MIN MAX"
};

// One flag as given: flags[flag], the name it matched (as written, or the name a prefix
// stands for), and its nargs values, none empty.
struct FlagUse {
  size_t flag = 0;
  std::string spelling;
  std::vector<std::string> values;
};

struct MatchedArgs {
  std::vector<FlagUse> uses;  // in the order given
  std::vector<std::string> command;
};

// Splits `args` (argv without argv[0]) as Python's argparse does with a REMAINDER command
// (Lib/argparse.py, _parse_optional and _get_option_tuples). A word that starts with '-' and
// is longer than "-" is a flag, looked up as: a whole name; "NAME=VALUE"; then a prefix of
// names ("--hostf" for "--hostfile", "-n" for "-np"; a word with one dash matches only names
// with one dash), where a one-letter name also matches with its value attached ("-Ha:2",
// "-p2222", "-xA=1"). Several flags matching is an error naming them all, unless exactly one
// of them has a name in `preferred` (horovodrun's names: "--start" is --start-timeout, as in
// horovodrun, though ringrun's --starter matches too). A flag takes its
// values from "=VALUE" or the attached text (nargs 1 only), else from the next nargs words.
// Where argparse differs, deliberately:
// - a value may start with '-' ("--wdir -odd"), unless the word reads as a flag or is "--";
// - several names of one flag matching a prefix are no ambiguity, nor is a one-letter switch
//   with text attached when a longer name matches too ("-hostf" is -hostfile, not -h + "ostf");
// - one-letter switches are not bundled ("-hv"), and an empty value is an error;
// - a word like "-1" or "-a b" before the command is an unknown flag, not the command's start.
// Errors are InvalidArgument, one line, naming the word and the flag.
Result<MatchedArgs> MatchArgs(const std::vector<FlagSyntax>& flags,
                              const std::vector<std::string>& args,
                              const std::set<std::string>& preferred = {});

}  // namespace ringrun::launcher
