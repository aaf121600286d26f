// The Join barrier of the job service: every rank publishes its data-plane endpoint, and once
// all `size` ranks have joined, each gets the whole peer table in one reply.
// Sized for 10,000 ranks: calls are held as gRPC callback reactors (no thread per caller), and
// the reply is serialized once into one reference-counted slice that every caller's response
// shares (a typed reply would be re-serialized per caller: quadratic in the job size).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "ringrun/job.grpc.pb.h"

namespace ringrun::launcher::service {

class Rendezvous {
 public:
  Rendezvous(int size, std::string job_id);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // Handles one Join call (the secret is already checked by the caller). Fails the call with
  // INVALID_ARGUMENT for a bad rank/size, ALREADY_EXISTS for a rank joining a round twice,
  // FAILED_PRECONDITION for a rank joining the next round before this one is complete, and
  // ABORTED once Abort() has been called. Rounds: once every rank has joined (generation g),
  // a join with generation g+1 opens round g+1 (ranks that left and joined again). Thread-safe.
  // `request` is a serialized v1::JoinRequest; `response` receives a serialized v1::JoinReply
  // (the raw form of JobService.Join: clients use the ordinary typed stub).
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response);

  // Fails every held and future Join with ABORTED and `reason` (the job is being torn down).
  void Abort(const std::string& reason);

  // How many ranks have joined so far.
  int joined() const;

 private:
  // Lifetime: held calls keep the shared state alive, so the Rendezvous may be destroyed
  // (which aborts held calls) before or after the server that routes Join to it shuts down.
  struct State;
  class JoinReactor;
  std::shared_ptr<State> state_;
};

}  // namespace ringrun::launcher::service
