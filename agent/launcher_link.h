// The seam between the agent and the launcher: registration, then the Session stream (events
// up, commands down). The gRPC implementation talks to the job service; tests use a fake.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ringrun/common/clock.h"
#include "ringrun/common/status.h"
#include "ringrun/job.pb.h"

namespace ringrun::agent {

class LauncherLink {
 public:
  virtual ~LauncherLink() = default;

  // Announces the agent and returns its ranks. Blocks until the reply, at most `timeout_ms`.
  // Errors carry the service's message; kAborted means the job was torn down before this host's
  // turn (the launcher explains why itself).
  virtual Result<v1::RegisterReply> Register(const v1::RegisterRequest& request,
                                             int timeout_ms) = 0;
  // Opens the Session and sends Hello. After this, the calls below are meaningful.
  virtual Status OpenSession(int host_index) = 0;

  // Queues one event for the launcher; never blocks. Thread-safe.
  virtual void Send(v1::AgentEvent event) = 0;
  // Bytes queued and not yet written (the agent stops reading ranks' output beyond a limit).
  virtual size_t queued_bytes() = 0;
  // The commands received since the last call, in order; pings are not included.
  virtual std::vector<v1::AgentCommand> TakeCommands() = 0;
  // When the launcher was last heard from (any message, pings included), on the link's clock.
  virtual Clock::TimePoint last_heard() = 0;
  // True once the launcher's side of the Session has ended (closed or broken).
  virtual bool session_over() = 0;
  // An fd that becomes readable when a command arrives or the session ends, for poll(); the
  // reader drains it with read(). -1 when the link has none (fakes).
  virtual int wake_fd() = 0;

  // Ends the Session. Unless `lost`, first hands every queued event to the launcher and waits
  // for it to close its side, each within `timeout_ms`. Called once, last.
  virtual void Close(bool lost, int timeout_ms) = 0;
};

// The job service at `target` ("host:port"), every call carrying `secret`. The Session's
// last_heard() is read on `clock`.
std::unique_ptr<LauncherLink> MakeGrpcLauncherLink(const std::string& target,
                                                   const std::string& secret, const Clock& clock);

}  // namespace ringrun::agent
