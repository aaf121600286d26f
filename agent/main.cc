// ringrun-agent --launcher HOST:PORT --host-index N [--log-level L]
// The job secret is the first line of stdin; stdin then stays open, and its EOF means the
// launcher is gone.
// ringrun-agent --launcher HOST:PORT --slurm-hosts NAME0,NAME1,... [--log-level L]
// Started by srun (launcher/starters/slurm_agent_starter.h): the host index is this node's position
// in the list, the secret is in RINGRUN_AGENT_SECRET, and stdin (srun's /dev/null) is not watched.
#include <poll.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "agent/agent.h"
#include "agent/slurm_identity.h"
#include "ringrun/common/defaults.h"
#include "ringrun/common/log.h"
#include "ringrun/common/version.h"

namespace {

// Reads one line from fd 0 within the deadline, byte by byte so nothing beyond it is taken.
bool ReadSecretLine(std::string* out) {
  out->clear();
  while (out->size() < 1024) {
    pollfd p{0, POLLIN, 0};
    if (::poll(&p, 1, ringrun::kSecretReadTimeoutMs) <= 0) return false;
    char c;
    ssize_t n = ::read(0, &c, 1);
    if (n <= 0) return false;
    if (c == '\n') return !out->empty();
    out->push_back(c);
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ringrun-agent: runs one host's ranks for a ringrun job (started by ringrun)"};
  std::string target, level = "warn";
  int host_index = 0;
  int start_timeout_s = ringrun::kDefaultStartTimeoutS;
  app.add_option("--launcher", target, "host:port of the job service")->required();
  std::string slurm_hosts;
  auto* index_opt =
      app.add_option("--host-index", host_index, "this host's index in the job's host list");
  auto* slurm_opt = app.add_option("--slurm-hosts", slurm_hosts,
                                   "under srun: the job's host names by index (comma-separated)");
  index_opt->excludes(slurm_opt);
  app.add_option("--log-level", level, "trace|debug|info|warn|error|critical|off");
  app.add_option("--start-timeout", start_timeout_s, "seconds to wait for registration");
  app.set_version_flag("--version", std::string("ringrun-agent ") + RINGRUN_VERSION_STRING);
  CLI11_PARSE(app, argc, argv);
  if (!ringrun::InitLogging("ringrun-agent", level)) {
    std::fprintf(stderr, "ringrun-agent: --log-level %s: unknown level\n", level.c_str());
    return 2;
  }
  ringrun::agent::AgentConfig config;
  config.launcher_target = target;
  config.host_index = host_index;
  config.register_timeout_ms = (start_timeout_s + 10) * 1000;
  config.stdin_fd = 0;
  spdlog::debug("started");
  if (!slurm_opt->empty()) {
    // Before anything can copy the environment: the secret leaves it at once.
    auto secret = ringrun::agent::TakeSecretFromEnvironment();
    const char* node = std::getenv("SLURMD_NODENAME");
    char host[256] = "";
    ::gethostname(host, sizeof(host) - 1);
    auto index = ringrun::agent::SlurmHostIndex(slurm_hosts, node ? node : "", host);
    if (!secret.ok() || !index.ok()) {
      spdlog::error("{}: {}", host, (secret.ok() ? index.status() : secret.status()).message());
      return 2;
    }
    config.secret = *secret;
    config.host_index = *index;
    config.stdin_fd = -1;
  } else if (index_opt->empty()) {
    std::fprintf(stderr, "ringrun-agent: --host-index or --slurm-hosts is required\n");
    return 2;
  } else if (!ReadSecretLine(&config.secret)) {
    spdlog::error("no job secret on stdin (ringrun-agent is started by ringrun)");
    return 2;
  }
  auto spawner = ringrun::agent::MakeForkExecSpawner();
  return ringrun::agent::RunAgent(config, *spawner);
}
