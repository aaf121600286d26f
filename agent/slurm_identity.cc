#include "agent/slurm_identity.h"

#include <strings.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "ringrun/common/env_contract.h"

namespace ringrun::agent {
namespace {

std::string FirstLabel(const std::string& name) { return name.substr(0, name.find('.')); }

}  // namespace

Result<int> SlurmHostIndex(const std::string& hosts_csv, const std::string& nodename,
                           const std::string& hostname) {
  const std::string me = nodename.empty() ? hostname : nodename;
  const char* what = nodename.empty() ? "hostname" : "SLURMD_NODENAME";
  std::vector<std::string> hosts;
  size_t start = 0;
  while (true) {
    size_t comma = hosts_csv.find(',', start);
    hosts.push_back(hosts_csv.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  using Match = bool (*)(const std::string&, const std::string&);
  const Match rules[] = {
      [](const std::string& a, const std::string& b) { return a == b; },
      [](const std::string& a, const std::string& b) {
        return ::strcasecmp(a.c_str(), b.c_str()) == 0;
      },
      [](const std::string& a, const std::string& b) {
        return ::strcasecmp(FirstLabel(a).c_str(), FirstLabel(b).c_str()) == 0;
      },
  };
  for (Match rule : rules) {
    int found = -1;
    for (size_t i = 0; i < hosts.size(); ++i) {
      if (hosts[i].empty() || !rule(hosts[i], me)) continue;
      if (found >= 0) {
        return InvalidArgument(std::string(what) + "=" + me + " matches both '" + hosts[found] +
                               "' and '" + hosts[i] + "' in --slurm-hosts " + hosts_csv);
      }
      found = static_cast<int>(i);
    }
    if (found >= 0) return found;
  }
  return NotFound(std::string(what) + "=" + me + " is not in --slurm-hosts " + hosts_csv);
}

Result<std::string> TakeSecretFromEnvironment() {
  char* v = std::getenv(env::kAgentSecret);
  std::string secret = v ? v : "";
  // Overwrite the value where it lies, so that /proc/PID/environ (the process's initial
  // environment block) no longer shows it either; then drop the variable.
  if (v) std::memset(v, 'x', secret.size());
  ::unsetenv(env::kAgentSecret);
  if (secret.empty()) return NotFound(std::string(env::kAgentSecret) + " is not set");
  return secret;
}

}  // namespace ringrun::agent
