// One SSH connection to one host, running one remote command: the seam between the SSH agent
// starter and libssh. MakeLibsshConnector() is the real thing; tests/ssh_unit/fake_ssh.h is the
// fake the unit tests drive.
//
// Why one command per session: the launcher opens exactly one session per remote host, for that
// host's ringrun-agent, and the session lives as long as the agent. Keeping the channel inside the
// session object means there is one owner for both and no way to outlive one with the other.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "launcher/hosts/hostfile.h"
#include "ringrun/common/defaults.h"
#include "ringrun/common/status.h"

namespace ringrun::launcher::starters {

// How the launcher reaches remote hosts; constant for a job. See SshConfigFromOptions().
struct SshConfig {
  std::string identity_file;  // -i: use only this key; empty: ssh-agent, then default keys
  int port = 0;               // -p; 0: ~/.ssh/config's Port, else 22
  std::string known_hosts;    // empty: ~/.ssh/known_hosts of the passwd entry (libssh default)
  bool accept_new_host_keys =
      false;  // append unknown keys (OpenSSH's accept-new); never changed ones
  int connect_timeout_s = kSshConnectTimeoutS;  // TCP connect and every blocking SSH step
  int connect_attempts = kSshConnectAttempts;   // total tries, counted only for transient failures
  int retry_backoff_ms = kSshRetryBackoffMs;    // doubled after each transient failure
  int fanout = kSshFanout;                      // connections in progress at once, per starter
  std::string launcher_address;                 // --launcher-address: the address agents dial back
  // --network-interfaces: take the first one's address instead (when launcher_address is empty)
  std::vector<std::string> network_interfaces;
};

// What went wrong while connecting; each kind has its own wording in messages.
enum class SshFailure {
  kNone,
  kResolution,      // the host name did not resolve
  kRefused,         // nothing listens on the port
  kTimeout,         // no answer within connect_timeout_s
  kUnreachable,     // no route to the host or network
  kTransient,       // reset or closed during the handshake (e.g. sshd's MaxStartups): retried
  kAuthDenied,      // every offered key was refused
  kHostKeyUnknown,  // not in known_hosts and accept_new_host_keys is off
  kHostKeyChanged,  // known_hosts holds another key for the host: always refused
  kOther,
};
const char* SshFailureName(SshFailure failure);
// Classifies libssh's text for a failed ssh_connect() (it only gives text, not errno).
SshFailure ClassifyConnectError(std::string_view libssh_text);
// Only transient failures are worth another try within the same launch.
inline bool IsTransient(SshFailure f) { return f == SshFailure::kTransient; }
// The Status code used for each kind.
Code SshFailureCode(SshFailure failure);

// What a running remote command produced since the last Pump().
struct ExecEvents {
  std::string stdout_data;
  std::string stderr_data;
  std::optional<int> exit_status;  // exit code, or 128+signo when the remote side reports a signal
  bool closed = false;             // the channel or the connection is gone: no further events
  Status error;                    // set when the connection failed rather than closed cleanly
};

// An authenticated connection. Not thread-safe: after Connect() returns it, one thread at a time
// uses it (the starting thread, then the starter's poller). Destroying it closes the channel and
// the connection without waiting for the peer.
class SshSession {
 public:
  virtual ~SshSession() = default;
  // Numeric local address of the TCP connection: the address the host reached us on.
  virtual std::string LocalAddress() const = 0;
  // Starts `command` through the remote user's login shell, with stdin, stdout and stderr as
  // channel streams and no pty. At most one command per session.
  virtual Status Exec(const std::string& command) = 0;
  // Writes to the command's stdin. Blocks until sent or the connect timeout passes. A command
  // that has already ended and closed its channel (a missing agent exits 127 at once) is not an
  // error here: the next Pump reports its exit status and stderr, which say why.
  virtual Status WriteStdin(std::string_view data) = 0;
  // Waits up to `timeout_ms` for the channel to make progress, or for `wake_fd` (-1: none) to
  // become readable (it is not drained), and appends what happened to *events. With 0, takes
  // what has arrived without waiting.
  virtual void Pump(int timeout_ms, int wake_fd, ExecEvents* events) = 0;
  // The descriptor that becomes readable when the session has something for Pump (the
  // connection's socket), for a caller that polls many sessions at once; -1 once closed.
  virtual int PollFd() const = 0;
  // Asks the remote command to end (a TERM signal, stdin EOF, channel close) without waiting
  // for an answer. sshd then closes the command's stdin, which ringrun-agent treats as the
  // launcher's death. Idempotent.
  virtual void Terminate() = 0;
};

struct SshConnectOutcome {
  std::unique_ptr<SshSession> session;  // set on success
  SshFailure failure = SshFailure::kNone;
  Status status;  // on failure: names the host, says what failed and quotes libssh's text
};

class SshConnector {
 public:
  virtual ~SshConnector() = default;
  // Connects to `host`, checks its host key against known_hosts and authenticates.
  // One attempt: retrying is the caller's business. Thread-safe: sessions share nothing, and
  // appends to known_hosts are serialised.
  virtual SshConnectOutcome Connect(const hosts::HostSpec& host, const SshConfig& config) = 0;
};

// The libssh implementation. Honours ~/.ssh/config (found through the passwd entry, like libssh
// does: Host aliases, HostName, User, Port, IdentityFile); the explicit settings in SshConfig and
// `user@` in the host win over it.
std::unique_ptr<SshConnector> MakeLibsshConnector();

// The address of the first of `names` that has one on this host (interfaces.h has the rule).
Result<std::string> InterfaceAddress(const std::vector<std::string>& names);

}  // namespace ringrun::launcher::starters
