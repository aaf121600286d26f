// Execution: running a plan's batches (host or device, by kind) and completing this rank's
// entries and their handles.
#include <algorithm>

#include "runtime/src/engine/engine.h"

namespace ringrun::runtime::engine {

void Engine::RunPlan(Plan& p) {
  std::vector<Batch>& plan = p.batches;
  for (size_t k = 0; k < p.planned; ++k) {
    Batch& b = plan[k];
    const Response& first = *b.responses[0];
    if (first.type == Response::kError) {
      Complete(b.locals[0], first.error_code, first.error);
      continue;
    }
    Status st = RunBatch(b);
    if (!st.ok() && transport_ && !transport_->status().ok()) {
      FailAll(transport_->status());  // notifies all
      return;
    }
    for (Entry* e : b.locals) Complete(e, st.code(), st.message());
  }
  NotifyCompleted();
}

Status Engine::RunBatch(Batch& b) {
  const Response& r = *b.responses[0];
  if (timeline_) {
    const int64_t now = Now();
    for (size_t i = 0; i < b.responses.size(); ++i) {
      const Response* x = b.responses[i];
      const Entry* local = b.locals[i];
      if (!local) continue;
      // Submitted before the timeline started (no timestamp, or an earlier one): from its start.
      const int64_t from = std::max(local->submit_us, timeline_->origin_us());
      std::string who;
      for (size_t k = 0; k < x->announced_us.size(); ++k) {
        if (x->announced_us[k] < 0) continue;
        who += (who.empty() ? "" : ", ") + std::string("\"rank ") + std::to_string(k) +
               "\": " + std::to_string(x->announced_us[k] - from);
      }
      timeline_->Span(x->req.name, "NEGOTIATE", from, now, "\"announced_after_us\": {" + who + "}");
    }
  }
  if (r.req.device) return RunDevice(b);
  if (b.responses.size() > 1) return RunFused(b);
  Entry* e = b.locals[0];
  if (r.type == Response::kJoinDone) {
    if (e) e->handle->last_joined = r.last_joined;
    return Status::Ok();
  }
  switch (r.req.kind) {
    case Kind::kAllreduce:
      return RunAllreduce(r, e);
    case Kind::kBroadcast:
      return RunBroadcast(r, e);
    case Kind::kAllgather:
      return RunAllgather(r, e);
    case Kind::kAlltoall:
      return RunAlltoall(r, e);
    case Kind::kReduceScatter:
      return RunReduceScatter(r, e);
    case Kind::kBarrier:  // every rank has entered it: that is what made it ready
    case Kind::kJoin:     // kJoinDone above
      return Status::Ok();
  }
  return Internal("unknown collective kind");
}

// Inlined into its callers: it runs once per entry on the completion path.
__attribute__((always_inline)) inline void Engine::Complete(Entry* e, Code code,
                                                            const std::string& message) {
  if (!e) return;  // joined: this rank had nothing under that name
  Slot* s = static_cast<Slot*>(e);
  if (!s->handle) return;  // completed already (a failure after part of a round)
  if (s->cache_id >= 0) {
    Slot*& by_id = by_cache_id_[static_cast<size_t>(s->cache_id)];
    if (by_id == s) by_id = nullptr;
  } else {
    announced_full_.Erase(*s->name);
  }
  if (s->ready) s->ready.reset();
  HandleState* h = s->handle;
  if (code != Code::kOk && h->code == Code::kOk) {
    h->code = code;
    h->message = message;
  }
  if (--h->remaining == 0) completed_.push_back(h);
  s->handle = nullptr;
  finished_.push_back(s);
}

void Engine::NotifyCompleted() {
  // The names become free for resubmission before any handle is seen done, under one lock for
  // the whole round. Handles are marked done and their waiters woken after the whole round's
  // work: a thread waiting on one handle after another then finds the next ones done instead
  // of being woken, and preempting the engine, once per handle.
  if (!finished_.empty()) {
    MutexLock lock(&mu_);
    for (Slot* s : finished_) ReleaseSlot(s);
  }
  finished_.clear();
  for (HandleState* h : completed_) CompleteHandle(h);
  completed_.clear();
}

void Engine::FailAll(const Status& st) {
  // Every slot in flight belongs to the engine: queued, announced, or taken from the queue by
  // a round that did not announce it.
  std::vector<Slot*> pending;
  bool first = false;  // the engine's failure, not its shutdown
  {
    MutexLock lock(&mu_);
    if (failed_.ok()) failed_ = st, first = !stop_;
    queue_.clear();
    for (Slot& s : slot_store_) {
      if (s.in_flight && s.handle) pending.push_back(&s);
    }
  }
  for (Slot* s : pending) Complete(s, st.code(), st.message());
  NotifyCompleted();
  if (first && options_.on_failure) options_.on_failure(st);
}

}  // namespace ringrun::runtime::engine
