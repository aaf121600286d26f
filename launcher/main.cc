// ringrun: starts a data-parallel job on one or many hosts. See README.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "launcher/check_build.h"
#include "launcher/check_gpu.h"
#include "launcher/elastic/discovery.h"
#include "launcher/hosts/placement.h"
#include "launcher/job/job.h"
#include "launcher/options.h"
#include "launcher/starters/slurm_agent_starter.h"
#include "launcher/starters/ssh_agent_starter.h"
#include "ringrun/common/log.h"

extern char** environ;

namespace ringrun::launcher {
namespace {

// The srun starter's view of the job: its hosts by index and those with ranks.
starters::SlurmStarterConfig SlurmConfigFor(const Options& options,
                                            const std::vector<hosts::RankPlacement>& placed) {
  starters::SlurmStarterConfig c;
  for (const auto& h : options.hosts) c.host_names.push_back(h.name);
  std::set<int> active;
  for (const auto& p : placed) active.insert(p.host_index);
  c.active_hosts.assign(active.begin(), active.end());
  c.overlap = options.srun_overlap;
  c.step_per_host = options.elastic.enabled;
  c.launcher_address = options.launcher_address;
  c.network_interfaces = options.network_interfaces;
  return c;
}

// --dry-run: where the hosts came from, the placement table, and nothing started.
int PrintPlacement(const Options& options, const std::vector<hosts::RankPlacement>& placed) {
  std::printf("hosts: %s\n", options.host_source.c_str());
  if (options.starter == Options::Starter::kSlurm) {
    starters::AgentLaunch launch;
    launch.service_port = 0;
    launch.agent_path = "ringrun-agent";
    launch.log_level = options.log_level;
    const starters::SlurmStarterConfig config = SlurmConfigFor(options, placed);
    launch.host_index = config.active_hosts.empty() ? 0 : config.active_hosts[0];
    std::string cmd;
    for (const auto& a : starters::BuildSrunCommand(config, launch, "LAUNCHER")) {
      cmd += (cmd.empty() ? "" : " ") + a;
    }
    if (config.step_per_host) {
      std::printf("agents: one srun step per host (an elastic job), the first: %s\n", cmd.c_str());
    } else {
      std::printf("agents: one srun step: %s\n", cmd.c_str());
    }
  } else {
    std::printf("agents: %s\n", "over SSH (forked for this machine)");
  }
  if (options.bind_to == Options::BindTo::kCore) {
    std::printf("bind-to: core (each rank to its share of its host's allowed CPUs)\n");
  }
  std::printf("%-6s %-24s %-10s %-10s %-10s %-10s\n", "rank", "host", "local_rank", "local_size",
              "cross_rank", "cross_size");
  for (const auto& p : placed) {
    std::printf("%-6d %-24s %-10d %-10d %-10d %-10d\n", p.rank,
                options.hosts[p.host_index].Display().c_str(), p.local_rank, p.local_size,
                p.cross_rank, p.cross_size);
  }
  std::printf("command:");
  for (const auto& a : options.command) std::printf(" %s", a.c_str());
  std::printf("\n");
  return 0;
}

// --host-discovery-script: the job's first hosts. A failure of its first run ends the job before
// anything starts: exit 2 for output that breaks the contract (a bad line), else 1. Until the
// script lists -np slots it is run again every --discovery-interval (a failure then is said once
// and retried), up to --start-timeout; then the job starts with --min-np slots or more, or ends
// (exit 1). The job starts with every slot listed, up to --max-np.
int DiscoverFirstHosts(Options* options) {
  elastic::DiscoveryOptions d;
  d.script = options->elastic.discovery_script;
  d.default_slots = options->elastic.slots_per_host;
  d.timeout_ms = options->elastic.discovery_timeout_s * 1000;
  Result<elastic::HostSet> found = elastic::RunDiscoveryScript(d);
  if (!found.ok()) {
    std::fprintf(stderr, "ringrun: host discovery: %s\n", found.status().message().c_str());
    return found.status().code() == Code::kInvalidArgument ? 2 : 1;
  }
  auto slots_of = [](const elastic::HostSet& set) {
    int n = 0;
    for (const elastic::Host& h : set) n += h.slots;
    return n;
  };
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::seconds(std::max(0, options->start_timeout_s));
  elastic::HostSet hosts = *found;
  bool said_waiting = false, said_failing = false;
  while (slots_of(hosts) < options->np && std::chrono::steady_clock::now() < deadline) {
    if (!said_waiting) {
      std::fprintf(stderr,
                   "ringrun: host discovery: %s lists %d slots, fewer than -np %d: waiting for "
                   "more (at most %d s, --start-timeout)\n",
                   d.script.c_str(), slots_of(hosts), options->np, options->start_timeout_s);
      said_waiting = true;
    }
    std::this_thread::sleep_until(
        std::min(deadline, std::chrono::steady_clock::now() +
                               std::chrono::seconds(options->elastic.discovery_interval_s)));
    Result<elastic::HostSet> again = elastic::RunDiscoveryScript(d);
    if (!again.ok()) {
      if (!said_failing) {
        std::fprintf(stderr, "ringrun: host discovery failed (said once, retried): %s\n",
                     again.status().message().c_str());
      }
      said_failing = true;
      continue;
    }
    said_failing = false;
    hosts = *again;
  }
  const int slots = slots_of(hosts);
  if (slots < options->elastic.min_np) {
    const bool elastic = options->elastic.min_np < options->np;
    const std::string after =
        said_waiting ? " after --start-timeout " + std::to_string(options->start_timeout_s) + " s"
                     : "";
    std::fprintf(stderr,
                 "ringrun: host discovery: %s lists %d slots, fewer than %s %d%s: the job cannot "
                 "start\n",
                 d.script.c_str(), slots, elastic ? "--min-np" : "-np", options->elastic.min_np,
                 after.c_str());
    return 1;
  }
  if (slots < options->np) {
    std::fprintf(stderr,
                 "ringrun: host discovery: %d slots after --start-timeout %d s: the job starts "
                 "with them (--min-np %d)\n",
                 slots, options->start_timeout_s, options->elastic.min_np);
  }
  options->hosts.clear();
  for (const elastic::Host& h : hosts) {
    hosts::HostSpec spec;
    spec.name = h.name;
    spec.slots = h.slots;
    options->hosts.push_back(spec);
  }
  options->np = std::min(slots, options->elastic.max_np);
  return 0;
}

int Main(int argc, char** argv) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  ParseOutcome parsed = ParseCommandLine(argc, argv, env);
  if (parsed.kind == ParseOutcome::kExitNow) {
    std::FILE* f = parsed.exit_code == 0 ? stdout : stderr;
    std::fprintf(f, "%s%s%s", parsed.exit_code == 0 ? "" : "ringrun: ", parsed.message.c_str(),
                 !parsed.message.empty() && parsed.message.back() != '\n' ? "\n" : "");
    return parsed.exit_code;
  }
  Options& options = parsed.options;
  InitLogging("ringrun", options.log_level, options.log_timestamps);
  for (const std::string& note : options.notes) std::fprintf(stderr, "ringrun: %s\n", note.c_str());
  if (options.check_build) return RunCheckBuild();
  if (!options.elastic.discovery_script.empty()) {
    if (int rc = DiscoverFirstHosts(&options); rc != 0) return rc;
  }
  // The one placement of the job: the dry run prints it, the srun step's nodes come from it, and
  // the job runs it. (--check-gpu places its own jobs, one rank per host or per GPU.)
  Result<std::vector<hosts::RankPlacement>> placed =
      hosts::PlaceRanks(options.hosts, options.np, options.oversubscribe);
  if (!placed.ok()) {
    std::fprintf(stderr, "ringrun: %s\n", placed.status().message().c_str());
    return 2;
  }
  if (options.dry_run) return PrintPlacement(options, *placed);
  auto local = starters::MakeLocalAgentStarter();
  auto remote = starters::MakeSshAgentStarter(starters::SshConfigFromOptions(options));
  const starters::SlurmStarterConfig slurm_config = SlurmConfigFor(options, *placed);
  std::unique_ptr<starters::AgentStarter> srun;
  // Every attempt of the job (--max-restarts) gets its own srun step: a starter starts one.
  auto starters_for_attempt = [&](int /*restart_count*/) {
    job::Starters starters;
    starters.local = local.get();
    starters.remote = remote.get();
    if (options.starter == Options::Starter::kSlurm) {
      // Every agent, this machine's included, starts in the attempt's srun step.
      srun = starters::MakeSlurmAgentStarter(slurm_config);
      starters.local = starters.remote = srun.get();
    }
    return starters;
  };
  if (options.check_gpu) return RunCheckGpu(options, starters_for_attempt(0));
  return job::RunJob(options, std::move(placed.value()), starters_for_attempt);
}

}  // namespace
}  // namespace ringrun::launcher

int main(int argc, char** argv) { return ringrun::launcher::Main(argc, argv); }
