#include "launcher/service/rendezvous.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <unordered_map>

#include "ringrun/common/peer_table.h"
#include "ringrun/common/thread_annotations.h"
#include "ringrun/common/tsan.h"

namespace ringrun::launcher::service {

// What to finish once State::mu is released.
struct Rendezvous::Outcome {
  std::vector<std::pair<JoinReactor*, grpc::Status>> rejected;
  std::vector<JoinReactor*> released;
  std::string reply;  // serialized, for `released`
  uint32_t completed = 0;
  uint32_t waiting = 0;  // a Join is held for this generation (or its round is incomplete)
};

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

  // Elastic Joins, by worker id (SetGeneration).
  struct ElasticJoin {
    JoinReactor* reactor = nullptr;
    std::string address;
    uint32_t port = 0;
    uint32_t wants = 0;  // JoinRequest.generation
  };
  std::map<int, ElasticJoin> elastic_joins GUARDED_BY(mu);
  ElasticGeneration generation GUARDED_BY(mu);  // number 0: none formed yet
  bool generation_complete GUARDED_BY(mu) = false;
  std::function<void(uint32_t)> on_generation_complete;  // set before any Join
  std::function<void(uint32_t)> on_join_waiting;         // set before any Join

  // Refuses the held Joins that the newest generation leaves out, and completes it when every
  // member waits for it.
  void Evaluate(Outcome* out) REQUIRES(mu);
};

// One held Join call. Deleted by gRPC's OnDone. Exactly one of release, abort, cancel or
// rejection claims it (Claim) and calls Finish. Release, abort and cancel claim it under
// State::mu, so that a claimed call is no longer in State::held.
class Rendezvous::JoinReactor final : public grpc::ServerUnaryReactor {
 public:
  JoinReactor(std::shared_ptr<State> state, int rank, grpc::ByteBuffer* reply, bool elastic = false)
      : state_(std::move(state)), rank_(rank), reply_(reply), elastic_(elastic) {
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
      if (elastic_) {
        auto it = state_->elastic_joins.find(rank_);
        if (it != state_->elastic_joins.end() && it->second.reactor == this) {
          state_->elastic_joins.erase(it);
        }
      } else if (state_->held[rank_] == this) {
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
  const int rank_;  // elastic: the worker id
  grpc::ByteBuffer* const reply_;
  const bool elastic_;

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
  if (parsed_ok && req->elastic()) return ElasticJoin(parsed, response);
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
    for (auto& [worker, j] : state_->elastic_joins) {
      if (j.reactor != nullptr && j.reactor->Claim()) held.push_back(j.reactor);
    }
    state_->elastic_joins.clear();
  }
  for (JoinReactor* h : held) h->Complete(grpc::Status(grpc::StatusCode::ABORTED, reason));
}

namespace {

std::string GenerationText(uint32_t g) { return "generation " + std::to_string(g); }

}  // namespace

void Rendezvous::State::Evaluate(Outcome* out) {
  if (generation.number == 0) return;
  const ElasticGeneration& g = generation;
  // Held Joins for this generation (or an older one) of workers it leaves out: refused.
  for (auto it = elastic_joins.begin(); it != elastic_joins.end();) {
    const int w = it->first;
    ElasticJoin& j = it->second;
    const bool member = std::find(g.workers.begin(), g.workers.end(), w) != g.workers.end();
    if (j.wants <= g.number && !member) {
      if (j.reactor->Claim()) {
        out->rejected.emplace_back(
            j.reactor,
            grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                         "worker " + std::to_string(w) + " asked to join " +
                             GenerationText(j.wants) + ", but " + GenerationText(g.number) +
                             " of the job was formed without it (it failed, left, or its host "
                             "was blacklisted): it may not join again"));
      }
      it = elastic_joins.erase(it);
      continue;
    }
    ++it;
  }
  if (generation_complete) return;
  for (int w : g.workers) {
    auto it = elastic_joins.find(w);
    if (it == elastic_joins.end() || it->second.wants > g.number) return;
  }
  // Every member waits: one reply for all.
  v1::JoinReply built;
  const int n = static_cast<int>(g.workers.size());
  built.set_size(n);
  std::unordered_map<std::string, uint32_t> index;
  for (int r = 0; r < n; ++r) {
    const ElasticJoin& j = elastic_joins.at(g.workers[r]);
    auto [a, inserted] = index.emplace(j.address, static_cast<uint32_t>(built.addresses_size()));
    if (inserted) built.add_addresses(j.address);
    built.add_address_of_rank(a->second);
    built.add_port_of_rank(j.port);
    built.add_worker_of_rank(g.workers[r]);
    built.add_host_of_rank(g.hosts[r]);
  }
  built.set_job_id(job_id);
  built.set_generation(g.number);
  built.set_data_secret(g.data_secret);
  built.set_membership_epoch(g.membership_epoch);
  (void)PackPeerColumns(&built);
  out->reply = built.SerializeAsString();
  for (int w : g.workers) {
    auto it = elastic_joins.find(w);
    if (it->second.reactor->Claim()) out->released.push_back(it->second.reactor);
    elastic_joins.erase(it);
  }
  generation_complete = true;
  out->completed = g.number;
}

grpc::ServerUnaryReactor* Rendezvous::ElasticJoin(const v1::JoinRequest& req,
                                                  grpc::ByteBuffer* response) {
  State& s = *state_;
  const int w = req.worker_id();
  auto* reactor = new JoinReactor(state_, w, response, /*elastic=*/true);
  auto reject = [&](grpc::StatusCode code, const std::string& msg) {
    if (reactor->Claim()) reactor->Complete(grpc::Status(code, msg));
    return reactor;
  };
  if (w < 0) return reject(grpc::StatusCode::INVALID_ARGUMENT, "a negative worker id");
  if (req.address().empty() || req.port() == 0 || req.port() > 65535) {
    return reject(grpc::StatusCode::INVALID_ARGUMENT,
                  "worker " + std::to_string(w) + " sent no usable data-plane endpoint");
  }
  Outcome out;
  {
    MutexLock lock(&s.mu);
    if (s.aborted) {
      if (reactor->Claim())
        out.rejected.emplace_back(reactor, grpc::Status(grpc::StatusCode::ABORTED, s.abort_reason));
    } else if (s.elastic_joins.count(w)) {
      if (reactor->Claim()) {
        out.rejected.emplace_back(
            reactor, grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                                  "worker " + std::to_string(w) + " is already joining"));
      }
    } else if (req.generation() <= s.generation.number && s.generation_complete &&
               std::find(s.generation.workers.begin(), s.generation.workers.end(), w) !=
                   s.generation.workers.end()) {
      if (reactor->Claim()) {
        out.rejected.emplace_back(
            reactor, grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                                  "worker " + std::to_string(w) + " has already joined " +
                                      GenerationText(s.generation.number)));
      }
    } else {
      s.elastic_joins[w] = State::ElasticJoin{reactor, req.address(), req.port(),
                                              std::max<uint32_t>(1, req.generation())};
      s.Evaluate(&out);
      auto held = s.elastic_joins.find(w);
      if (held != s.elastic_joins.end() && held->second.reactor == reactor) {
        out.waiting = std::max(held->second.wants, s.generation.number);
      }
    }
  }
  Complete(out);
  return reactor;
}

void Rendezvous::Complete(Outcome& out) {
  for (auto& [r, st] : out.rejected) r->Complete(st);
  if (!out.released.empty()) {
    grpc::Slice shared(out.reply);
    for (JoinReactor* h : out.released) {
      *h->reply_ = grpc::ByteBuffer(&shared, 1);
      h->Complete(grpc::Status::OK);
    }
  }
  if (out.completed != 0 && state_->on_generation_complete) {
    state_->on_generation_complete(out.completed);
  }
  if (out.waiting != 0 && state_->on_join_waiting) state_->on_join_waiting(out.waiting);
}

void Rendezvous::SetGeneration(ElasticGeneration generation) {
  Outcome out;
  {
    MutexLock lock(&state_->mu);
    state_->generation = std::move(generation);
    state_->generation_complete = false;
    state_->Evaluate(&out);
  }
  Complete(out);
}

void Rendezvous::SetOnGenerationComplete(std::function<void(uint32_t)> f) {
  state_->on_generation_complete = std::move(f);
}

void Rendezvous::SetOnJoinWaiting(std::function<void(uint32_t)> f) {
  state_->on_join_waiting = std::move(f);
}

bool Rendezvous::Holds(const std::vector<int>& workers) const { return NotHeld(workers).empty(); }

std::vector<int> Rendezvous::NotHeld(const std::vector<int>& workers) const {
  MutexLock lock(&state_->mu);
  std::vector<int> out;
  for (int w : workers) {
    if (state_->elastic_joins.count(w) == 0) out.push_back(w);
  }
  return out;
}

int Rendezvous::joined() const {
  MutexLock lock(&state_->mu);
  return state_->joined;
}

}  // namespace ringrun::launcher::service
