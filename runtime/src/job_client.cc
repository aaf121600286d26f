#include "runtime/src/job_client.h"

#include <spdlog/spdlog.h>

#include "ringrun/common/auth.h"
#include "ringrun/common/defaults.h"
#include "ringrun/common/peer_table.h"
#include "ringrun/job.grpc.pb.h"

namespace ringrun::runtime {
namespace {

Status FromGrpc(const grpc::Status& s, const std::string& target) {
  const std::string m = "job service " + target + ": Join: " + s.error_message();
  switch (s.error_code()) {
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return Timeout(m);
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return PermissionDenied(m);
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::CANCELLED:
      return Aborted(m);
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return InvalidArgument(m);
    case grpc::StatusCode::UNAVAILABLE:
      return Unavailable(m);
    default:
      return Internal(m);
  }
}

// The Watch stream, as a callback reactor: no thread of its own. Its stub (and channel) is
// shared with the client that opened it, so it may outlive that client.
class GrpcWatch final : public MembershipWatch,
                        public grpc::ClientReadReactor<v1::MembershipNotice> {
 public:
  GrpcWatch(std::shared_ptr<v1::JobService::Stub> stub, const std::string& secret,
            std::string target, const v1::WatchRequest& request, JobClient::OnNotice on_notice)
      : stub_(std::move(stub)), target_(std::move(target)), on_notice_(std::move(on_notice)) {
    AttachSecret(&ctx_, secret);
    stub_->async()->Watch(&ctx_, &request, this);
    StartRead(&notice_);
    StartCall();
  }
  ~GrpcWatch() override {
    ctx_.TryCancel();
    MutexLock lock(&mu_);
    while (!done_) cv_.Wait(&mu_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone follows
    MembershipNotice n;
    n.membership_epoch = notice_.membership_epoch();
    n.broken_generation = notice_.broken_generation();
    n.reason = notice_.reason();
    on_notice_(n);
    StartRead(&notice_);
  }
  void OnDone(const grpc::Status& s) override {
    if (!s.ok() && s.error_code() != grpc::StatusCode::CANCELLED) {
      spdlog::debug("ringrun: job service {}: Watch ended: {}", target_, s.error_message());
    }
    MutexLock lock(&mu_);
    done_ = true;
    cv_.SignalAll();
  }

 private:
  const std::shared_ptr<v1::JobService::Stub> stub_;
  const std::string target_;
  const JobClient::OnNotice on_notice_;
  grpc::ClientContext ctx_;
  v1::MembershipNotice notice_;  // the read in flight; read callbacks only
  Mutex mu_;
  CondVar cv_;  // done_ was set
  bool done_ GUARDED_BY(mu_) = false;
};

class GrpcJobClient final : public JobClient {
 public:
  GrpcJobClient(std::string target, std::string secret)
      : target_(std::move(target)),
        secret_(std::move(secret)),
        stub_(v1::JobService::NewStub(MakeChannel(target_, kKeepaliveMs, kKeepaliveTimeoutMs))) {}

  std::unique_ptr<MembershipWatch> Watch(int worker_id, uint32_t generation, uint64_t epoch,
                                         OnNotice on_notice) override {
    v1::WatchRequest req;
    req.set_worker_id(worker_id);
    req.set_generation(generation);
    req.set_membership_epoch(epoch);
    return std::make_unique<GrpcWatch>(stub_, secret_, target_, req, std::move(on_notice));
  }

  Result<transport::PeerTable> Join(const JoinInfo& info, int timeout_ms) override {
    grpc::ClientContext ctx;
    AttachSecret(&ctx, secret_);
    ctx.set_deadline(DeadlineAfterMs(timeout_ms));
    ctx.set_wait_for_ready(true);  // the service may still be coming up
    const v1::JoinRequest req = MakeJoinRequest(info);
    v1::JoinReply reply;
    grpc::Status s = stub_->Join(&ctx, req, &reply);
    if (!s.ok()) return FromGrpc(s, target_);
    return PeerTableFromReply(&reply, info.elastic ? -1 : info.size, "job service " + target_);
  }

 private:
  const std::string target_;
  const std::string secret_;
  std::shared_ptr<v1::JobService::Stub> stub_;
};

}  // namespace

v1::JoinRequest MakeJoinRequest(const JoinInfo& info) {
  v1::JoinRequest req;
  req.set_rank(info.rank);
  req.set_size(info.size);
  req.set_address(info.address);
  req.set_port(info.port);
  req.set_nccl_id(info.nccl_id);
  req.set_generation(info.generation);
  if (info.elastic) {
    req.set_elastic(true);
    req.set_worker_id(info.worker_id);
  }
  return req;
}

Result<transport::PeerTable> PeerTableFromReply(v1::JoinReply* reply, int size,
                                                const std::string& where) {
  if (Status st = UnpackPeerColumns(reply); !st.ok()) return st.Annotate(where);
  transport::PeerTable t;
  t.addresses.assign(reply->addresses().begin(), reply->addresses().end());
  t.address_of_rank.assign(reply->address_of_rank().begin(), reply->address_of_rank().end());
  t.port_of_rank.assign(reply->port_of_rank().begin(), reply->port_of_rank().end());
  t.nccl_id = reply->nccl_id();
  t.job_id = reply->job_id();
  t.host_of_rank.assign(reply->host_of_rank().begin(), reply->host_of_rank().end());
  t.worker_of_rank.assign(reply->worker_of_rank().begin(), reply->worker_of_rank().end());
  t.generation = reply->generation();
  t.data_secret = reply->data_secret();
  t.membership_epoch = reply->membership_epoch();
  if (size < 0) size = reply->size();
  if (reply->size() != size || t.size() != size ||
      t.address_of_rank.size() != t.port_of_rank.size()) {
    return Internal(where + ": Join reply has a peer table of size " + std::to_string(t.size()) +
                    ", expected " + std::to_string(size));
  }
  for (uint32_t a : t.address_of_rank) {
    if (a >= t.addresses.size()) return Internal(where + ": Join reply address out of range");
  }
  return t;
}

std::unique_ptr<JobClient> MakeGrpcJobClient(const std::string& target, const std::string& secret) {
  return std::make_unique<GrpcJobClient>(target, secret);
}

}  // namespace ringrun::runtime
