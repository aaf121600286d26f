#include "launcher/service/rendezvous.h"

#include <atomic>
#include <unordered_map>

#include "ringrun/common/peer_table.h"
#include "ringrun/common/thread_annotations.h"
#include "ringrun/common/tsan.h"

namespace ringrun::launcher::service {

struct Rendezvous::State {
  State(int n, std::string id)
      : size(n), job_id(std::move(id)), held(n, nullptr), address_of(n), port_of(n) {}

  // Constant after construction.
  const int size;
  const std::string job_id;

  Mutex mu;
  // By rank: the call waiting for the barrier, or nullptr.
  std::vector<JoinReactor*> held GUARDED_BY(mu);
  // The JoinRequest.generation being collected (or last released).
  uint32_t round GUARDED_BY(mu) = 0;
  int joined GUARDED_BY(mu) = 0;
  bool released GUARDED_BY(mu) = false;
  bool aborted GUARDED_BY(mu) = false;
  std::string abort_reason GUARDED_BY(mu);
  std::unordered_map<std::string, uint32_t> address_index GUARDED_BY(mu);
  std::vector<std::string> addresses GUARDED_BY(mu);
  std::vector<uint32_t> address_of GUARDED_BY(mu);
  std::vector<uint32_t> port_of GUARDED_BY(mu);
  std::string nccl_id GUARDED_BY(mu);
};

// One held Join call. Deleted by gRPC's OnDone. Exactly one of release, abort, cancel or
// rejection claims it (Claim) and calls Finish. Release, abort and cancel claim it under
// State::mu, so that a claimed call is no longer in State::held.
class Rendezvous::JoinReactor final : public grpc::ServerUnaryReactor {
 public:
  JoinReactor(std::shared_ptr<State> state, int rank, grpc::ByteBuffer* reply)
      : state_(std::move(state)), rank_(rank), reply_(reply) {
    RINGRUN_HAPPENS_BEFORE(this);  // gRPC calls OnCancel/OnDone on other threads
  }

  // Finish, telling ThreadSanitizer that gRPC hands the reactor on to OnDone's thread.
  void Complete(const grpc::Status& status) {
    RINGRUN_HAPPENS_BEFORE(this);
    Finish(status);
  }

  // True for the one caller that gets to finish the call.
  bool Claim() { return !finished_.exchange(true, std::memory_order_acq_rel); }

  void OnCancel() override {
    RINGRUN_HAPPENS_AFTER(this);
    {
      MutexLock lock(&state_->mu);
      if (!Claim()) return;
      // The rank gave up (deadline or disconnect) before the barrier: it may join again.
      if (state_->held[rank_] == this) {
        state_->held[rank_] = nullptr;
        --state_->joined;
      }
    }
    Complete(grpc::Status::CANCELLED);
  }
  void OnDone() override {
    RINGRUN_HAPPENS_AFTER(this);
    delete this;
  }

  const std::shared_ptr<State> state_;
  const int rank_;
  grpc::ByteBuffer* const reply_;

 private:
  std::atomic<bool> finished_{false};
};

Rendezvous::Rendezvous(int size, std::string job_id)
    : state_(std::make_shared<State>(size, std::move(job_id))) {}

Rendezvous::~Rendezvous() { Abort("the job service is shutting down"); }

grpc::ServerUnaryReactor* Rendezvous::Join(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) {
  State& s = *state_;
  v1::JoinRequest parsed;
  grpc::Slice raw;
  const bool parsed_ok =
      request->TrySingleSlice(&raw).ok()
          ? parsed.ParseFromArray(raw.begin(), static_cast<int>(raw.size()))
          : [&] {
              std::vector<grpc::Slice> slices;
              std::string bytes;
              if (!request->Dump(&slices).ok()) return false;
              for (const auto& sl : slices) {
                bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
              }
              return parsed.ParseFromString(bytes);
            }();
  const v1::JoinRequest* req = &parsed;
  auto* reactor = new JoinReactor(state_, req->rank(), response);
  auto reject = [&](grpc::StatusCode code, const std::string& msg) {
    if (reactor->Claim()) reactor->Complete(grpc::Status(code, msg));
    return reactor;
  };
  if (!parsed_ok) return reject(grpc::StatusCode::INVALID_ARGUMENT, "malformed JoinRequest");
  if (req->size() != s.size) {
    return reject(grpc::StatusCode::INVALID_ARGUMENT,
                  "rank " + std::to_string(req->rank()) + " believes the job has " +
                      std::to_string(req->size()) + " ranks; it has " + std::to_string(s.size));
  }
  if (req->rank() < 0 || req->rank() >= s.size) {
    return reject(
        grpc::StatusCode::INVALID_ARGUMENT,
        "rank " + std::to_string(req->rank()) + " outside a job of size " + std::to_string(s.size));
  }
  if (req->address().empty() || req->port() == 0 || req->port() > 65535) {
    return reject(grpc::StatusCode::INVALID_ARGUMENT,
                  "rank " + std::to_string(req->rank()) + " sent no usable data-plane endpoint");
  }
  const int r = req->rank();
  const uint32_t gen = req->generation();
  std::vector<JoinReactor*> release;
  v1::JoinReply built;
  {
    MutexLock lock(&s.mu);
    // A join after the released round, one generation on, opens the next round (the ranks
    // called ringrun_shutdown and ringrun_init again); each round is a full rendezvous.
    if (!s.aborted && s.released && gen == s.round + 1) {
      s.round = gen;
      s.released = false;
      s.joined = 0;
      s.address_index.clear();
      s.addresses.clear();
      s.nccl_id.clear();
    }
    if (s.aborted || gen != s.round || s.released || s.held[r] != nullptr) {
      grpc::Status st;
      if (s.aborted) {
        st = grpc::Status(grpc::StatusCode::ABORTED, s.abort_reason);
      } else if (gen > s.round) {
        st = grpc::Status(
            grpc::StatusCode::FAILED_PRECONDITION,
            "rank " + std::to_string(r) + " joins round " + std::to_string(gen) + " but round " +
                std::to_string(s.round) +
                (s.released ? " is the last one (rounds are joined in order)"
                            : " still waits for ranks (every rank must leave and join again)"));
      } else {
        st = grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                          "rank " + std::to_string(r) + " has already joined" +
                              (gen > 0 ? " round " + std::to_string(gen) : std::string()));
      }
      if (reactor->Claim()) reactor->Complete(st);
      return reactor;
    }
    auto [it, inserted] =
        s.address_index.emplace(req->address(), static_cast<uint32_t>(s.addresses.size()));
    if (inserted) s.addresses.push_back(req->address());
    s.address_of[r] = it->second;
    s.port_of[r] = req->port();
    if (r == 0) s.nccl_id = req->nccl_id();
    s.held[r] = reactor;
    if (++s.joined < s.size) return reactor;
    // Everyone is here: build the reply once, then hand a copy to each held call.
    built.set_size(s.size);
    for (const auto& a : s.addresses) built.add_addresses(a);
    built.mutable_address_of_rank()->Add(s.address_of.begin(), s.address_of.end());
    built.mutable_port_of_rank()->Add(s.port_of.begin(), s.port_of.end());
    built.set_nccl_id(s.nccl_id);
    built.set_job_id(s.job_id);
    s.released = true;
    release.reserve(s.size);
    for (JoinReactor*& h : s.held) {
      if (h != nullptr && h->Claim()) release.push_back(h);
      h = nullptr;
    }
  }
  // One packing and one serialization for everyone; each response references the same slice.
  // (Packing fails only for a port above 65535, which Join refuses; the columns then go as is.)
  (void)PackPeerColumns(&built);
  const std::string bytes = built.SerializeAsString();
  grpc::Slice shared(bytes);
  for (JoinReactor* h : release) {
    *h->reply_ = grpc::ByteBuffer(&shared, 1);
    h->Complete(grpc::Status::OK);
  }
  return reactor;
}

void Rendezvous::Abort(const std::string& reason) {
  std::vector<JoinReactor*> held;
  {
    MutexLock lock(&state_->mu);
    if (state_->aborted) return;
    state_->aborted = true;
    state_->abort_reason = reason;
    for (JoinReactor*& h : state_->held) {
      if (h != nullptr && h->Claim()) held.push_back(h);
      h = nullptr;
    }
  }
  for (JoinReactor* h : held) h->Complete(grpc::Status(grpc::StatusCode::ABORTED, reason));
}

int Rendezvous::joined() const {
  MutexLock lock(&state_->mu);
  return state_->joined;
}

}  // namespace ringrun::launcher::service
