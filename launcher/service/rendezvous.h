// The Join barrier of the job service: every rank publishes its data-plane endpoint, and once
// all `size` ranks have joined, each gets the whole peer table in one reply.
// Sized for 10,000 ranks: calls are held as gRPC callback reactors (no thread per caller), and
// the reply is serialized once into one reference-counted slice that every caller's response
// shares (a typed reply would be re-serialized per caller: quadratic in the job size).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
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

  // Elastic jobs: Joins with JoinRequest.elastic are matched by worker id against the newest
  // generation the launcher formed (SetGeneration), not by rank (see job.proto). A Join asking
  // for a generation newer than the newest is held until it is formed; a held Join of a worker
  // that a newer generation leaves out is refused (FAILED_PRECONDITION), so a generation that
  // lost a member before it completed goes on as the next one with the Joins already there.
  struct ElasticGeneration {
    uint32_t number = 0;             // 1 for the first; each call a larger one
    std::vector<int> workers;        // by new rank: the worker id
    std::vector<std::string> hosts;  // by new rank: the host's name
    std::string data_secret;         // the data plane's secret of this generation
    uint64_t membership_epoch = 0;
  };
  // Thread-safe. Completes the generation at once if every member is already waiting.
  void SetGeneration(ElasticGeneration generation);
  // Called once per elastic generation, when every member has joined it (on the thread that
  // completed it, outside any lock). Set before the server starts.
  void SetOnGenerationComplete(std::function<void(uint32_t generation)> f);
  // Called when a Join is held (`wanted`: the generation it waits for, the newest formed or a
  // newer one), on the thread of that Join, outside any lock. Set before the server starts.
  void SetOnJoinWaiting(std::function<void(uint32_t wanted)> f);

  // Whether each of `workers` has an elastic Join held now (waiting for its generation).
  // Thread-safe.
  bool Holds(const std::vector<int>& workers) const;
  // Those of `workers` that have no elastic Join held now, in their order. Thread-safe.
  std::vector<int> NotHeld(const std::vector<int>& workers) const;

  // How many ranks have joined so far.
  int joined() const;

 private:
  // Lifetime: held calls keep the shared state alive, so the Rendezvous may be destroyed
  // (which aborts held calls) before or after the server that routes Join to it shuts down.
  struct State;
  class JoinReactor;
  grpc::ServerUnaryReactor* ElasticJoin(const v1::JoinRequest& req, grpc::ByteBuffer* response);
  // Finishes the calls an evaluation decided (State::Outcome), outside the lock.
  struct Outcome;
  void Complete(Outcome& out);
  std::shared_ptr<State> state_;
};

}  // namespace ringrun::launcher::service
