// The runtime's view of the job service: one Join call that publishes this rank's data-plane
// endpoint and returns the whole peer table. An interface, so that tests drive a fake.
#pragma once

#include <memory>
#include <string>

#include "ringrun/common/status.h"
#include "ringrun/job.pb.h"
#include "runtime/src/transport/transport.h"

namespace ringrun::runtime {

struct JoinInfo {
  int rank = 0;
  int size = 1;
  std::string address;  // where peers reach this rank's listener
  uint16_t port = 0;
  std::string nccl_id;      // rank 0 only, may be empty
  uint32_t generation = 0;  // this process's earlier successful joins (JoinRequest.generation)
  // Elastic jobs: the process's worker id (JoinRequest.worker_id); `generation` is then the
  // generation asked for, and the reply's size may differ from `size`.
  bool elastic = false;
  int worker_id = -1;
};

class JobClient {
 public:
  virtual ~JobClient() = default;
  // Blocks until every rank has joined, or fails (kTimeout at timeout_ms, kPermissionDenied for
  // a wrong secret, kAborted when the job is torn down, kUnavailable when the service is gone).
  // The table's size equals info.size.
  virtual Result<transport::PeerTable> Join(const JoinInfo& info, int timeout_ms) = 0;
};

// The JoinRequest that carries `info`.
v1::JoinRequest MakeJoinRequest(const JoinInfo& info);

// The peer table of a JoinReply (packed or not) for a job of `size` ranks (-1: any, for elastic
// jobs), checked for shape, with the elastic fields of the reply;
// `where` (who sent it) prefixes the errors. Shared by every JobClient.
Result<transport::PeerTable> PeerTableFromReply(v1::JoinReply* reply, int size,
                                                const std::string& where);

// The real client: a gRPC JobService.Join to `target` (host:port) carrying `secret`.
std::unique_ptr<JobClient> MakeGrpcJobClient(const std::string& target, const std::string& secret);

}  // namespace ringrun::runtime
