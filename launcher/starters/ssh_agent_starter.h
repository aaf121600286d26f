// The AgentStarter for remote hosts: one libssh session per host, running
//   test -e 'AGENT' || exit 127; exec 'AGENT' --launcher 'ADDR:PORT' --host-index 'N' --log-level
//   'L'
// through the remote login shell (every piece single-quoted), then writing the job secret as the
// first line of the agent's stdin, which stays open for the agent's life: when the launcher dies
// or the session is closed, sshd closes it and the agent ends its ranks.
//
// ADDR is, in order: AgentLaunch::service_address (--launcher-address); the address of
// SshConfig::network_interfaces (--network-interfaces); else the local address of this host's SSH
// connection, i.e. the address the host already reached us on.
//
// Once an agent runs, one I/O thread per starter (its poller) drives every agent's session:
// it waits in poll() on their sockets, relays each agent's stdout and stderr to the launcher's
// stderr, one line per write, as "[agent HOST] line", keeps the last kStderrTailLines stderr
// lines for StderrTail(), and records the exit status for Poll(). So the threads of a job over
// N SSH hosts are the poller and, while agents start, up to config.fanout starting threads
// (the job's), not N.
// Exit status 127 means ringrun-agent is not at that path on the host (the remote shell's
// convention; the command checks for it first and prints nothing itself), 126 that it is not
// executable; 255 that the SSH connection failed (StderrTail() then ends with the reason).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "launcher/options.h"
#include "launcher/starters/agent_starter.h"
#include "launcher/starters/ssh_session.h"

namespace ringrun::launcher::starters {

// The --ssh-* settings, --launcher-address and --network-interfaces of a parsed command line.
SshConfig SshConfigFromOptions(const Options& options);

// Real libssh starter. Start() is thread-safe; at most config.fanout connections are in progress
// at once across all callers. Transient connect failures are retried (config.connect_attempts in
// all, with backoff); the others fail at once with a classified, host-named Status.
std::unique_ptr<AgentStarter> MakeSshAgentStarter(const SshConfig& config);
// The same over any connector (tests pass a fake). `connector` must outlive the starter's use.
std::unique_ptr<AgentStarter> MakeSshAgentStarter(const SshConfig& config,
                                                  std::shared_ptr<SshConnector> connector);

// POSIX-shell single quoting: the result is one word that any sh-family shell turns back into
// exactly `word`, whatever bytes it holds (quotes, newlines, $(...), backticks, non-ASCII, "").
std::string ShellQuote(std::string_view word);
// The remote command line above. `address` is the launcher address as agents must dial it
// (IPv6 literals get brackets).
std::string BuildAgentCommand(const AgentLaunch& launch, const std::string& address);

// The message the job shows for a remote agent that ended with `exit_code` before it was asked
// to (e.g. "rr-h2: ringrun-agent not found at /opt/x/ringrun-agent (exit status 127)").
std::string DescribeRemoteAgentExit(const std::string& host, const std::string& agent_path,
                                    int exit_code);

}  // namespace ringrun::launcher::starters
