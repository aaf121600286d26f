// The seam between the launcher and the hosts: how one ringrun-agent gets started on a host.
// The local implementation forks the agent; the SSH one (ssh_agent_starter.h) opens one libssh
// session per host. Both hand the job secret to the agent on its stdin, never its command line.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "launcher/hosts/hostfile.h"
#include "ringrun/common/status.h"

namespace ringrun::launcher::starters {

// What every agent of a job needs to be told when it starts.
struct AgentLaunch {
  int host_index = 0;
  int service_port = 0;         // the job service's port on the launcher
  std::string service_address;  // override (--launcher-address); empty: the starter decides
  std::string secret;           // written to the agent's stdin, then a newline
  std::string agent_path;       // absolute path of ringrun-agent on the host
  std::string log_level;
};

// One started agent. Owned by the launcher's job; destroying it releases the host's resources
// (the child, or the SSH channel and session) and must not block for long.
class AgentHandle {
 public:
  virtual ~AgentHandle() = default;
  // The agent's (or the remote command's) exit status once it has ended; nullopt while running.
  // Non-blocking. 127 from a remote shell means ringrun-agent was not found.
  virtual std::optional<int> Poll() = 0;
  // Ends the agent at once (SIGKILL locally; closing the channel remotely). Idempotent.
  virtual void Kill() = 0;
  // The last lines the agent (or sshd) wrote to its stderr, for error messages.
  virtual std::string StderrTail() = 0;
};

class AgentStarter {
 public:
  virtual ~AgentStarter() = default;
  // Starts an agent on `host`; returns once the agent process exists (it registers later).
  // Thread-safe: the job calls it for several hosts at once, up to the fan-out.
  // Errors name the host and say what failed (resolution, refused, timeout, auth, host key...).
  virtual Result<std::unique_ptr<AgentHandle>> Start(const hosts::HostSpec& host,
                                                     const AgentLaunch& launch) = 0;
};

// Forks `launch.agent_path` as a child of the launcher, with PR_SET_PDEATHSIG and the secret
// on a stdin pipe that stays open: the agent treats its EOF as the launcher's death.
std::unique_ptr<AgentStarter> MakeLocalAgentStarter();

}  // namespace ringrun::launcher::starters
