// Planning: which of a round's ready responses run together. Every rank builds the same plan
// from the same responses, so every rank runs the same collectives in the same order.
#include "runtime/src/engine/engine.h"

namespace ringrun::runtime::engine {

inline Engine::Slot* Engine::Local(const Response& r) {
  if (r.cache_id >= 0 && static_cast<size_t>(r.cache_id) < by_cache_id_.size()) {
    if (Slot* s = by_cache_id_[static_cast<size_t>(r.cache_id)]) return s;
  }
  return announced_full_.Find(r.req.name);
}

void Engine::Execute(const Response* responses, size_t n, bool uniform, bool repeated) {
  // Fusion plan: each allreduce joins the first open batch it can fuse with and that has room;
  // every rank builds the same plan from the same responses. Uniform rounds keep theirs apart
  // from the other rounds' (a barrier between two steps does not replace the step's plan).
  Plan& p = uniform ? uniform_plan_ : general_plan_;
  std::vector<Batch>& plan = p.batches;  // its batches keep their vectors' capacity
  if (repeated && p.of == responses && p.n == n) {
    // The same responses as the last uniform round (Controller::repeated): the same plan,
    // which depends on nothing else; only this round's slots are looked up again.
    for (size_t k = 0; k < p.planned; ++k) {
      Batch& b = plan[k];
      for (size_t i = 0; i < b.responses.size(); ++i) b.locals[i] = Local(*b.responses[i]);
    }
    RunPlan(p);
    return;
  }
  size_t planned = 0;
  auto new_batch = [&](const Response* r, Entry* local, size_t packed_bytes) {
    if (plan.size() <= planned) plan.emplace_back();
    Batch& b = plan[planned++];
    b.responses.assign(1, r), b.locals.assign(1, local), b.bytes = packed_bytes;
  };
  std::vector<size_t>& open = open_;
  open.clear();
  const size_t threshold = fusion_.threshold();
  for (size_t i = 0; i < n; ++i) {
    const Response& r = responses[i];
    Entry* local = Local(r);
    const size_t bytes = r.req.count * (r.req.kind == Kind::kAllreduce ? r.req.ElemBytes() : 0);
    // Small allreduces are packed into the fusion buffer. Between hosts, large host ones join
    // the batch without a copy (one ring over the buffers as they are: AllreduceSegments), which
    // saves a ring's round trips per tensor. On one host each runs alone: its ring then finds
    // its few MB still in cache for the allgather, which one ring over a whole batch does not.
    const bool packed = Packed(r.req, threshold);
    const bool fusable = r.type == Response::kRun && r.req.kind == Kind::kAllreduce &&
                         threshold > 0 && (packed || (!r.req.device && spans_hosts_));
    const size_t packed_bytes = packed ? bytes : 0;
    if (fusable) {
      bool placed = false;
      for (size_t k : open) {
        Batch& b = plan[k];
        if (b.responses[0]->req.Fusable(r.req) && b.bytes + packed_bytes <= threshold) {
          b.responses.push_back(&r), b.locals.push_back(local), b.bytes += packed_bytes;
          placed = true;
          break;
        }
      }
      if (placed) continue;
      open.push_back(planned);
    }
    new_batch(&r, local, packed_bytes);
  }
  p.of = responses, p.n = n, p.planned = planned;
  RunPlan(p);
}

}  // namespace ringrun::runtime::engine
