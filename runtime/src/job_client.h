// The runtime's view of the job service: one Join call that publishes this rank's data-plane
// endpoint and returns the whole peer table, and (elastic jobs) a Watch of the launcher's
// notices to the running ranks. An interface, so that tests drive a fake.
#pragma once

#include <cstdint>
#include <functional>
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

// What the launcher tells a running elastic rank (job.proto, MembershipNotice).
struct MembershipNotice {
  uint64_t membership_epoch = 0;   // > 0: the membership epoch is now this
  uint32_t broken_generation = 0;  // > 0: every generation up to this one is broken...
  std::string reason;              // ...for this reason
};

// An open Watch. Destroying it cancels the stream and waits until its callback has returned
// for the last time: after the destructor, the callback is never called again.
class MembershipWatch {
 public:
  virtual ~MembershipWatch() = default;
};

class JobClient {
 public:
  using OnNotice = std::function<void(const MembershipNotice&)>;

  virtual ~JobClient() = default;
  // Blocks until every rank has joined, or fails (kTimeout at timeout_ms, kPermissionDenied for
  // a wrong secret, kAborted when the job is torn down, kUnavailable when the service is gone).
  // The table's size equals info.size.
  virtual Result<transport::PeerTable> Join(const JoinInfo& info, int timeout_ms) = 0;
  // Elastic jobs, after a successful Join: opens the job service's Watch for `worker_id` in
  // `generation` (knowing `epoch`) and returns at once. `on_notice` is called for each notice,
  // on a thread of the client's, one call at a time, until the watch is destroyed; it must not
  // block. The watch may outlive this client. Null: this client has no notices (a store's).
  // A stream that fails is logged (debug) and not opened again: the rank then learns of a lost
  // peer from its connections, or at the collective timeout.
  virtual std::unique_ptr<MembershipWatch> Watch(int /*worker_id*/, uint32_t /*generation*/,
                                                 uint64_t /*epoch*/, OnNotice /*on_notice*/) {
    return nullptr;
  }
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
