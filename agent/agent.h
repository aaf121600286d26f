// ringrun-agent: one per host. It registers with the job service, spawns this host's ranks,
// streams their output and exit status, and ends them when the launcher says so, when it
// loses the launcher (stdin EOF, a broken Session, or heartbeat silence), or when it is
// terminated itself. No rank outlives the agent.
//
// RunAgent is the driver: it owns the process's signals (a signalfd), poll() and registration,
// and leaves the rules to AgentLoop (agent_loop.h), the launcher to a LauncherLink
// (launcher_link.h) and the ranks' processes to the Spawner (process.h).
#pragma once

#include <string>

#include "agent/process.h"

namespace ringrun::agent {

struct AgentConfig {
  std::string launcher_target;  // host:port of the job service
  int host_index = 0;
  std::string secret;
  int register_timeout_ms = 0;  // Register's deadline
  int stdin_fd = 0;             // watched for EOF (the launcher's death); -1: not watched
};

// Runs the agent to completion and returns its exit code: 0 when every rank was reported and
// the launcher closed the session, 1 after losing the launcher or failing to register.
int RunAgent(const AgentConfig& config, Spawner& spawner);

}  // namespace ringrun::agent
