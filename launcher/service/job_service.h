// The job service: the gRPC face of a running job. Every call is checked against the job's
// secret first (UNAUTHENTICATED otherwise), before its body is parsed: Register, Join and Watch
// are raw methods that parse their request only once the caller is known, and Session reads
// none before the check. Every method is a callback method, so that a job of 1,000 hosts and 10,000
// ranks holds no thread per agent or rank: a Session is a reactor that reads events as they
// come and writes commands one at a time, and one timer thread of the service pings every
// Session and ends those whose agent fell silent. A Watch (an elastic rank's notices) is a
// reactor that writes one notice at a time from a queue of its own. Register answers through
// JobEvents::OnRegisterAsync when the job provides it (Job does); otherwise it runs the
// blocking OnRegister on a thread of its own, one per registering agent.
#pragma once

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "launcher/service/rendezvous.h"
#include "ringrun/common/thread_annotations.h"
#include "ringrun/job.grpc.pb.h"

namespace ringrun::launcher::service {

// What the service reports to the job. Called from gRPC threads, the service's timer thread,
// and (OnSessionEnded) the thread that calls JobService::Close, never under the service's
// lock (they may call Send and Close); implementations are thread-safe.
class JobEvents {
 public:
  using RegisterDone = std::function<void(grpc::Status, v1::RegisterReply)>;

  virtual ~JobEvents() = default;
  // An agent registered: answer it through `done`, exactly once, from any thread (possibly
  // before returning), by the start deadline. It runs on a gRPC thread and must not block.
  // Returns false, without calling `done`, when this JobEvents answers only through
  // OnRegister below. `peer_address` is the agent's IP as we see it.
  virtual bool OnRegisterAsync(const v1::RegisterRequest& /*req*/,
                               const std::string& /*peer_address*/, const RegisterDone& /*done*/) {
    return false;
  }
  // The blocking form, for a JobEvents without OnRegisterAsync: may block until the job can
  // answer, and must return by the start deadline. The service calls it on a thread of its own.
  virtual grpc::Status OnRegister(const v1::RegisterRequest& /*req*/,
                                  const std::string& /*peer_address*/,
                                  v1::RegisterReply* /*reply*/) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "registration is not served");
  }
  // One event from a host's Session stream, in stream order.
  virtual void OnAgentEvent(int host_index, const v1::AgentEvent& event) = 0;
  // The host's Session ended. `clean` when the agent closed it after reporting all its ranks;
  // otherwise `why` says what broke (stream error, heartbeat silence). Called once, after the
  // Session's last OnAgentEvent and before the agent is told the Session is over, so that the
  // agent's exit cannot overtake it.
  virtual void OnSessionEnded(int host_index, bool clean, const std::string& why) = 0;
};

// Join is a raw callback method: the Rendezvous hands every rank the same serialized reply.
// Watch is raw so that its request is parsed only once the caller is known.
class JobService final
    : public v1::JobService::WithRawCallbackMethod_Watch<
          v1::JobService::WithRawCallbackMethod_Join<v1::JobService::WithRawCallbackMethod_Register<
              v1::JobService::WithCallbackMethod_Session<v1::JobService::Service>>>> {
 public:
  // `events` may be null for a service that only serves Join (tests, benchmarks): Register
  // and Session then fail with UNIMPLEMENTED.
  JobService(std::string secret, JobEvents* events, Rendezvous* rendezvous,
             int heartbeat_interval_ms, int heartbeat_timeout_ms);
  ~JobService() override;

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* reply) override;
  grpc::ServerBidiReactor<v1::AgentEvent, v1::AgentCommand>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                 grpc::ByteBuffer* reply) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Watch(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* req) override;

  // Elastic jobs: every generation up to `generation` is broken, for `reason` (job.proto,
  // MembershipNotice). Tells every open Watch of such a generation now, and every later Watch
  // that asks for one at once. A call with an older generation than an earlier call's changes
  // nothing. Thread-safe; dropped once the service is closed.
  void BreakGeneration(uint32_t generation, const std::string& reason);
  // Elastic jobs: the membership epoch is now `epoch` (ignored unless larger than the last):
  // tells every open Watch now, and every later Watch that asks with a lower one at once.
  // Thread-safe; dropped once the service is closed.
  void RaiseMembershipEpoch(uint64_t epoch);

  // Queues a command for one host's Session. Commands wait for the Session to read them, so a
  // host whose Session has not opened yet gets them when it opens (an agent can be told to end
  // its ranks between its registration and its Session). Dropped once the service is closed.
  // Thread-safe.
  void Send(int host_index, const v1::AgentCommand& command);
  // Ends every Session promptly (the job is over) and refuses new ones. Thread-safe,
  // idempotent. The sessions' OnSessionEnded calls follow as their streams wind down (by the
  // server's Shutdown at the latest).
  void Close();

  // How many Sessions are open now (tests, benchmarks). Thread-safe.
  int open_sessions() const;
  // How many Watches are open now (tests). Thread-safe.
  int open_watches() const;

 private:
  class SessionReactor;
  class WatchReactor;
  struct Outbox {
    std::deque<v1::AgentCommand> queue;
    SessionReactor* session = nullptr;  // the open Session that serves it
  };

  // Pings every open Session each heartbeat interval and ends those silent past the timeout.
  void Tick();
  // Starts the next write of `session` if it has none in flight and something to send; returns
  // the message to pass to StartWrite outside mu_, or null.
  const v1::AgentCommand* NextWrite(SessionReactor* session) REQUIRES(mu_);
  // Queues `notice` on `watch`; returns the watch when the caller must now start its write
  // (WatchReactor::Write, outside mu_), or null.
  WatchReactor* Post(WatchReactor* watch, const v1::MembershipNotice& notice) REQUIRES(mu_);

  // Constant after construction.
  const std::string secret_;
  JobEvents* const events_;
  Rendezvous* const rendezvous_;
  const int heartbeat_interval_ms_;
  const int heartbeat_timeout_ms_;

  mutable Mutex mu_;
  CondVar cv_;                                      // closed_ was set
  std::map<int, Outbox> outboxes_ GUARDED_BY(mu_);  // by host, while it may be read
  bool closed_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> registers_ GUARDED_BY(mu_);  // blocking OnRegister calls
  // Elastic jobs: the open Watches (each removes itself when gRPC is done with it), the newest
  // broken generation (0: none) and why, and the membership epoch.
  std::vector<WatchReactor*> watches_ GUARDED_BY(mu_);
  uint32_t broken_generation_ GUARDED_BY(mu_) = 0;
  std::string broken_reason_ GUARDED_BY(mu_);
  uint64_t membership_epoch_ GUARDED_BY(mu_) = 0;
  std::thread ticker_;  // runs Tick(); only when `events` is set; joined at destruction
};

// Sets the server options that keep hostile connections from costing a job anything: the
// request size cap, the HTTP/2 handshake deadline, keepalive. For every server of JobService.
void ConfigureJobServer(grpc::ServerBuilder* builder);

// Parses grpc's peer string ("ipv4:1.2.3.4:567", "ipv6:[::1]:567") into the bare address.
std::string PeerAddress(const std::string& grpc_peer);

}  // namespace ringrun::launcher::service
