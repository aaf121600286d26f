// The job service: the gRPC face of a running job. Every call is checked against the job's
// secret first (UNAUTHENTICATED otherwise), before its body is parsed: Register and Join are
// raw methods that parse their request only once the caller is known, and Session reads none
// before the check. Session is a synchronous handler (one per agent); Register and Join are
// callback methods, so that 10,000 waiting ranks hold no threads (Register blocks on a thread
// of its own, one per authenticated agent).
#pragma once

#include <grpcpp/grpcpp.h>

#include <deque>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "launcher/service/rendezvous.h"
#include "ringrun/common/thread_annotations.h"
#include "ringrun/job.grpc.pb.h"

namespace ringrun::launcher::service {

// What the service reports to the job. Called from gRPC threads; implementations are
// thread-safe.
class JobEvents {
 public:
  virtual ~JobEvents() = default;
  // An agent registered. May block until the job can answer (every agent registered), and
  // must return by the start deadline. `peer_address` is the agent's IP as we see it.
  virtual grpc::Status OnRegister(const v1::RegisterRequest& req, const std::string& peer_address,
                                  v1::RegisterReply* reply) = 0;
  // One event from a host's Session stream, in stream order.
  virtual void OnAgentEvent(int host_index, const v1::AgentEvent& event) = 0;
  // The host's Session ended. `clean` when the agent closed it after reporting all its ranks;
  // otherwise `why` says what broke (stream error, heartbeat silence).
  virtual void OnSessionEnded(int host_index, bool clean, const std::string& why) = 0;
};

// Join is a raw callback method: the Rendezvous hands every rank the same serialized reply.
class JobService final
    : public v1::JobService::WithRawCallbackMethod_Join<
          v1::JobService::WithRawCallbackMethod_Register<v1::JobService::Service>> {
 public:
  // `events` may be null for a service that only serves Join (tests, benchmarks): Register
  // and Session then fail with UNIMPLEMENTED.
  JobService(std::string secret, JobEvents* events, Rendezvous* rendezvous,
             int heartbeat_interval_ms, int heartbeat_timeout_ms);
  ~JobService() override;

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* reply) override;
  grpc::Status Session(grpc::ServerContext* ctx,
                       grpc::ServerReaderWriter<v1::AgentCommand, v1::AgentEvent>* stream) override;
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                 grpc::ByteBuffer* reply) override;

  // Queues a command for one host's Session. Commands wait for the Session to read them, so a
  // host whose Session has not opened yet gets them when it opens (an agent can be told to end
  // its ranks between its registration and its Session). Dropped once the service is closed.
  // Thread-safe.
  void Send(int host_index, const v1::AgentCommand& command);
  // Ends every Session handler promptly (the job is over). Thread-safe, idempotent.
  void Close();

 private:
  struct Outbox {
    std::deque<v1::AgentCommand> queue;
    bool open = false;  // a Session handler serves it
  };

  // Constant after construction.
  const std::string secret_;
  JobEvents* const events_;
  Rendezvous* const rendezvous_;
  const int heartbeat_interval_ms_;
  const int heartbeat_timeout_ms_;

  Mutex mu_;
  CondVar cv_;  // an outbox grew, closed_ was set, or a Session's reader ended
  std::map<int, Outbox> outboxes_ GUARDED_BY(mu_);  // by host, while it may be read
  bool closed_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> registers_ GUARDED_BY(mu_);  // Register calls, joined at destruction
};

// Sets the server options that keep hostile connections from costing a job anything: the
// request size cap, the HTTP/2 handshake deadline, keepalive. For every server of JobService.
void ConfigureJobServer(grpc::ServerBuilder* builder);

// Parses grpc's peer string ("ipv4:1.2.3.4:567", "ipv6:[::1]:567") into the bare address.
std::string PeerAddress(const std::string& grpc_peer);

}  // namespace ringrun::launcher::service
