// Submission: validation, the slots that hold a tensor while in flight, and the queue the
// engine thread takes them from (engine.h, Engine::Submit).
#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "runtime/src/engine/buffers.h"
#include "runtime/src/engine/device_fusion.h"
#include "runtime/src/engine/doorbell.h"
#include "runtime/src/engine/engine.h"

namespace ringrun::runtime::engine {
namespace {

// send_device, recv_device: whether each buffer is device memory (asked once per submission:
// the answer costs a look at the loaded libraries, and a CUDA call when CUDA is loaded).
Status Validate(const Entry& e, int size, bool send_device, bool recv_device) {
  const Request& r = e.req;
  if (r.kind == Kind::kBarrier || r.kind == Kind::kJoin) return Status::Ok();
  if (!IsValidDtype(r.dtype)) return InvalidArgument("invalid dtype " + std::to_string(r.dtype));
  const size_t elem = DtypeSize(r.dtype);
  if (r.kind == Kind::kAllreduce || r.kind == Kind::kReduceScatter) {
    if (!IsValidOp(r.op)) return InvalidArgument("invalid op " + std::to_string(r.op));
    if (r.op == RINGRUN_AVERAGE && !IsFloating(r.dtype)) {
      return InvalidArgument(std::string("AVERAGE needs a floating dtype, not ") +
                             NameOfDtype(r.dtype));
    }
  }
  if (r.kind == Kind::kAllreduce && (r.prescale != 1.0 || r.postscale != 1.0)) {
    if (!IsFloating(r.dtype)) {
      return InvalidArgument(std::string("scale factors need a floating dtype, not ") +
                             NameOfDtype(r.dtype));
    }
  }
  if (r.kind == Kind::kAllreduce && (r.flags & ~RINGRUN_AVERAGE_BY_CONTRIBUTORS)) {
    return InvalidArgument("unknown flags " + std::to_string(r.flags));
  }
  if (r.kind == Kind::kBroadcast && (r.root < 0 || r.root >= size)) {
    return InvalidArgument("root " + std::to_string(r.root) + " is not a rank of a job of size " +
                           std::to_string(size));
  }
  uint64_t factor = r.kind == Kind::kReduceScatter ? static_cast<uint64_t>(size) : 1;
  if (r.kind == Kind::kAllgather || r.kind == Kind::kAlltoall) factor = size;
  if (r.kind == Kind::kAllgather || r.kind == Kind::kAlltoall) {
    // row_elems 0 (a tensor of shape (rows, 0)) is valid: no bytes move, the rows still do.
    if (r.row_elems > SIZE_MAX / elem) return InvalidArgument("row_elems overflows");
  }
  const uint64_t unit = (r.kind == Kind::kAllgather || r.kind == Kind::kAlltoall) ? r.row_elems : 1;
  // count * elem * factor * unit must fit (multiplications: a submission is on the hot path,
  // and three divisions cost more than the rest of this function).
  uint64_t per_count = 0, total_bytes = 0;
  const bool per_count_overflows =
      __builtin_mul_overflow(uint64_t{elem}, factor, &per_count) ||
      __builtin_mul_overflow(per_count, std::max<uint64_t>(unit, 1), &per_count);
  if (per_count_overflows
          ? r.count > 0
          : __builtin_mul_overflow(r.count, per_count, &total_bytes) || total_bytes > SIZE_MAX) {
    return InvalidArgument("count overflows");
  }
  uint64_t total_rows = r.count;
  if (r.kind == Kind::kAlltoall) {
    if (r.send_rows.size() != static_cast<size_t>(size)) {
      return InvalidArgument("send_rows needs one entry per rank");
    }
    total_rows = 0;
    for (uint64_t x : r.send_rows) {
      if (x > SIZE_MAX / elem / std::max<uint64_t>(unit, 1) - total_rows) {
        return InvalidArgument("send_rows overflow");
      }
      total_rows += x;
    }
  }
  const bool has_data = total_rows > 0 && unit > 0;
  if (has_data && e.send == nullptr) return InvalidArgument("buffer is NULL");
  const bool needs_recv = r.kind == Kind::kAllreduce || r.kind == Kind::kBroadcast ||
                          r.kind == Kind::kReduceScatter || r.fixed;
  if (has_data && needs_recv && e.recv == nullptr) return InvalidArgument("buffer is NULL");
  if (r.kind == Kind::kAllreduce && PartialOverlap(e.send, e.recv, r.count * elem)) {
    return InvalidArgument("sendbuf and recvbuf overlap without being equal");
  }
  if (e.send && e.recv && send_device != recv_device) {
    return InvalidArgument("one buffer is device memory and the other host memory");
  }
  if (r.device) RINGRUN_RETURN_IF_ERROR(ValidateDeviceRequest(r));
  if (e.stream && !r.device) {
    return InvalidArgument(
        "the _on_stream calls take CUDA device memory; these buffers are host memory");
  }
  return Status::Ok();
}

}  // namespace

const std::string* InternName(std::string_view name) {
  static Mutex mu;
  static auto* names = new std::unordered_set<std::string, std::hash<std::string>>;  // never freed
  MutexLock lock(&mu);
  return &*names->emplace(name).first;
}

namespace {

// Writes value into field if it differs; whether it did.
// Bit for bit, as the response cache compares scale factors (-0.0 differs from 0.0).
inline bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

template <typename T>
bool Update(T& field, const T& value) {
  if (field == value) return false;
  field = value;
  return true;
}

// Whether t's shape is the one q holds (both unknown, or the same dimensions).
inline bool SameShape(const Request& q, const TensorArgs& t) {
  if (t.shape == nullptr) return !q.shaped;
  if (!q.shaped || q.shape.size() != t.ndims) return false;
  for (uint32_t i = 0; i < t.ndims; ++i) {
    if (q.shape[i] != t.shape[i]) return false;
  }
  return true;
}

}  // namespace

template <typename R>
inline bool Engine::UpdateArgs(Request& q, const R& r, bool device) {
  // Field by field, writing only what changed, and never the name (the slot keeps its own):
  // the engine thread read this slot last step, and a field left alone stays in both cores'
  // caches instead of moving back and forth each step.
  // Every field is updated: no short-circuit.
  bool changed = Update(q.kind, r.kind);
  changed |= Update(q.dtype, r.dtype);
  changed |= Update(q.op, r.op);
  changed |= Update(q.device, device);
  changed |= Update(q.root, r.root);
  changed |= Update(q.count, r.count);
  changed |= Update(q.row_elems, r.row_elems);
  changed |= Update(q.flags, r.flags);
  changed |= Update(q.fixed, r.fixed);
  // Bit for bit, as the response cache compares them (-0.0 == 0.0).
  if (std::memcmp(&q.prescale, &r.prescale, sizeof(double)) != 0) {
    q.prescale = r.prescale, changed = true;
  }
  if (std::memcmp(&q.postscale, &r.postscale, sizeof(double)) != 0) {
    q.postscale = r.postscale, changed = true;
  }
  return changed;
}

void Engine::MoveInto(Slot& s, Entry& e) {
  s.fast_ok = false;  // written by the general path: QueueKept checks again
  Request& q = s.req;
  bool changed = UpdateArgs(q, e.req, e.req.device);
  if (q.send_rows != e.req.send_rows) q.send_rows = std::move(e.req.send_rows), changed = true;
  if (q.shaped != e.req.shaped || q.shape != e.req.shape) {
    q.shaped = e.req.shaped, q.shape = std::move(e.req.shape), changed = true;
  }
  if (changed) s.args_changed = true;
  Update(s.send, e.send), Update(s.recv, e.recv), Update(s.stream, e.stream);
  if (s.ready || e.ready) s.ready = std::move(e.ready);
  s.submit_us = e.submit_us;
}

Engine::Slot* Engine::NewSlot(std::string_view name, bool named) {
  Slot* s;
  if (!free_slots_.empty()) {
    s = free_slots_.back();
    free_slots_.pop_back();
  } else {
    s = &slot_store_.emplace_back();
  }
  if (named && kept_slots_ < kKeptSlots) {
    s->name = InternName(name);
  } else {
    s->own_name.assign(name.data(), name.size());
    s->name = &s->own_name;
  }
  s->req.name = *s->name;
  s->kept = named && kept_slots_ < kKeptSlots;
  kept_slots_ += s->kept;
  s->cache_id = -1;
  s->args_changed = true;
  s->fast_ok = false;
  slots_.Insert(*s->name, s);
  return s;
}

Status Engine::SubmitGeneral(std::string_view name, const TensorArgs* tensors, size_t n, bool group,
                             HandleState** handle, bool run_here) {
  if (n == 0) return InvalidArgument("nothing to submit");
  if (n > 1 && !group) return InvalidArgument("several entries in one submission must be a group");
  const int64_t now = timeline_ ? Now() : 0;  // submit_us: for the timeline only
  // The tensors as the engine keeps them (moved into their slots below).
  Entry one[1];
  std::vector<Entry> many;
  Entry* entries = n == 1 ? one : (many.resize(n), many.data());
  for (size_t i = 0; i < n; ++i) {
    const TensorArgs& t = tensors[i];
    Entry& e = entries[i];
    Request& r = e.req;
    r.kind = t.kind, r.dtype = t.dtype, r.op = t.op, r.root = t.root, r.count = t.count;
    r.row_elems = t.row_elems, r.prescale = t.prescale, r.postscale = t.postscale;
    r.flags = t.flags, r.fixed = t.fixed;
    if (t.send_rows) r.send_rows.assign(t.send_rows, t.send_rows + options_.size);
    r.shaped = t.shape != nullptr;
    if (t.shape) r.shape.assign(t.shape, t.shape + t.ndims);
    e.send = t.send, e.recv = t.recv, e.stream = t.stream;
    const bool send_device = is_device_(e.send);
    const bool recv_device = e.recv == e.send ? send_device : is_device_(e.recv);
    e.req.device = send_device || recv_device;
    Status st = name.size() > RINGRUN_MAX_NAME_BYTES
                    ? InvalidArgument("name longer than " + std::to_string(RINGRUN_MAX_NAME_BYTES) +
                                      " bytes")
                    : Validate(e, options_.size, send_device, recv_device);
    if (st.ok() && e.req.device) st = RecordReady(e);
    if (!st.ok()) {
      return InvalidArgument(
          (name.empty() ? std::string(KindName(e.req.kind)) : std::string(name)) + ": " +
          st.message());
    }
    e.submit_us = now;
  }
  if (name == kJoinName && !group && entries[0].req.kind != Kind::kJoin) {
    // Every rank's controller counts a rank that announces "join" as joined as soon as it sees
    // the announcement, before any mismatch is found.
    return InvalidArgument("'join' is the name of ringrun_join's request; choose another name");
  }
  HandleState* h = NewHandleState();
  // Refused after this point: the engine never saw the handle, and the caller never gets it.
  auto refuse = [&](Status why) {
    h->flags.store(HandleState::kDone | HandleState::kEngineGone);
    ReleaseHandle(h);
    return why;
  };
  const Kind kind = entries[0].req.kind;
  h->kind = kind;
  h->elem = kind == Kind::kBarrier || kind == Kind::kJoin ? 0 : DtypeSize(entries[0].req.dtype);
  h->remaining = static_cast<int>(n);
  h->wait_ms = options_.timeout_ms;
  {
    MutexLock lock(&mu_);
    if (stop_) return refuse(Aborted("ringrun is shutting down"));
    if (!failed_.ok()) return refuse(failed_);
    // Names: a group's entries are "<base>.<i>of<n>"; an unnamed submission gets a default
    // that is the same on every rank (the n-th unnamed one of its kind).
    const bool named = !name.empty();
    std::string base;
    if (group) {
      base = named ? std::string(name)
                   : "grouped_allreduce.noname." + std::to_string(noname_counter_[7]++);
      h->name_ = base;
    } else if (!named) {
      const size_t k = static_cast<size_t>(kind);
      base = std::string(KindName(kind)) + ".noname." + std::to_string(noname_counter_[k]++);
    }
    // Duplicates (in flight, or twice in this submission) refuse the whole submission.
    Slot* one[1];
    std::vector<Slot*> many;
    Slot** taken = n == 1 ? one : (many.resize(n), many.data());
    for (size_t i = 0; i < n; ++i) {
      std::string own;
      std::string_view nm = name;
      if (group) {
        own = base + "." + std::to_string(i) + "of" + std::to_string(n);
        nm = own;
      } else if (!named) {
        nm = base;
      }
      // Made-up names are looked up too: a user may have named a tensor like one.
      Slot* s = slots_.Find(nm);
      if (s && s->in_flight) {
        for (size_t j = 0; j < i; ++j) ReleaseSlot(taken[j]);
        return refuse(
            Status(Code::kDuplicate,
                   "tensor '" + std::string(nm) +
                       "' is still in flight on this rank (submitted again before it completed)"));
      }
      if (!s) s = NewSlot(nm, named);
      s->in_flight = true;
      taken[i] = s;
    }
    for (size_t i = 0; i < n; ++i) {
      Slot* s = taken[i];
      MoveInto(*s, entries[i]);
      s->handle = h;
      if (!group) {
        if (s->kept) {
          h->name_ptr = s->name;
        } else {
          h->name_ = *s->name;
        }
      }
      queue_.push_back(s);
    }
    pushed_.store(pushed_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  // A plain load first (no write while the engine is awake): if the engine checked the queue
  // before our push, its store of true happened before that check, which mu_ orders before
  // our push, so the load sees it.
  *handle = h;
  if (run_here) {
    RunHere(h);
  } else if (sleeping_.load() && sleeping_.exchange(false)) {
    RingDoorbell(doorbell());
  }
  return Status::Ok();
}

bool Engine::ValidHostAllreduce(const void* send, void* recv, size_t count, ringrun_dtype dtype,
                                ringrun_op op, double prescale, double postscale,
                                uint32_t flags) const {
  // What Validate accepts for an allreduce of host memory, and nothing else: anything it would
  // refuse, and device memory, take the general path, which says what is wrong.
  if (!IsValidDtype(dtype) || !IsValidOp(op) || (flags & ~RINGRUN_AVERAGE_BY_CONTRIBUTORS)) {
    return false;
  }
  if ((op == RINGRUN_AVERAGE || prescale != 1.0 || postscale != 1.0) && !IsFloating(dtype)) {
    return false;
  }
  size_t bytes = 0;
  if (__builtin_mul_overflow(count, DtypeSize(dtype), &bytes)) return false;
  if (count > 0 && (send == nullptr || recv == nullptr)) return false;
  if (PartialOverlap(send, recv, bytes)) return false;
  // The build's own check called directly (not through the std::function).
  auto device = [this](const void* p) {
    return options_.is_device ? is_device_(p) : IsDeviceMemory(p);
  };
  return !device(send) && (recv == send || !device(recv));
}

// Inlined into Submit, its one caller: the commonest submission pays no call for it.
__attribute__((always_inline)) inline bool Engine::QueueKept(std::string_view name,
                                                             const TensorArgs& t,
                                                             HandleState** handle) {
  // Fields that a plain allreduce leaves at their defaults, set otherwise (or a stream): the
  // general path stores them as given.
  if (t.stream != nullptr || t.root != 0 || t.row_elems != 1 || t.fixed || t.send_rows) {
    return false;
  }
  if (name.empty() || name.size() > RINGRUN_MAX_NAME_BYTES || name == kJoinName) return false;
  const void* const send = t.send;
  void* const recv = t.recv;
  const uint64_t count = t.count;
  const ringrun_dtype dtype = t.dtype;
  const ringrun_op op = t.op;
  const double prescale = t.prescale, postscale = t.postscale;
  const uint32_t flags = t.flags;
  const int64_t now = timeline_ ? Now() : 0;
  const size_t hash = NameHash{}(name);
  HandleState* h = nullptr;
  bool validated = false;
  for (;;) {
    {
      MutexLock lock(&mu_);
      if (stop_ || !failed_.ok()) return false;
      // A new name, an unnamed slot's, or one in flight (a duplicate) takes the general path.
      Slot* s = slots_.Find(name, hash);
      // So does a shape other than its last one (the general path stores it).
      if (s == nullptr || !s->kept || s->in_flight || !SameShape(s->req, t)) return false;
      // The same arguments and buffers as this name's last submission, which was checked
      // here: valid again, and nothing in the slot changes (the steady state of training).
      const Request& q = s->req;
      const bool same = s->fast_ok && s->send == send && s->recv == recv && q.count == count &&
                        q.dtype == dtype && q.op == op && q.flags == flags &&
                        SameBits(q.prescale, prescale) && SameBits(q.postscale, postscale);
      if (same || validated) {
        h = NewHandleState();
        h->kind = Kind::kAllreduce;
        h->elem = DtypeSize(dtype);
        h->remaining = 1;
        h->wait_ms = options_.timeout_ms;
        h->name_ptr = s->name;
        s->in_flight = true;
        if (!same) {
          // The arguments as the general path would store them (the name stays the slot's
          // own; no string or vector is built).
          bool changed = UpdateArgs(s->req, t, /*device=*/false);
          if (!s->req.send_rows.empty()) s->req.send_rows.clear(), changed = true;
          if (changed) s->args_changed = true;
          Update(s->send, send), Update(s->recv, recv);
          Update(s->stream, static_cast<void*>(nullptr));
          if (s->ready) s->ready.reset();
          s->fast_ok = true;
        }
        s->submit_us = now;
        s->handle = h;
        queue_.push_back(s);
        pushed_.store(pushed_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        break;
      }
    }
    // Not what this name's last submission was: check the arguments (outside the lock: the
    // device check may ask CUDA), then look the slot up again.
    if (!ValidHostAllreduce(send, recv, count, dtype, op, prescale, postscale, flags)) {
      return false;
    }
    validated = true;
  }
  if (sleeping_.load() && sleeping_.exchange(false)) RingDoorbell(doorbell());  // as in Submit
  *handle = h;
  return true;
}

Status Engine::Submit(std::string_view name, const TensorArgs* tensors, size_t n, bool group,
                      HandleState** handle, bool run_here) {
  *handle = nullptr;
  if (n == 1 && !group && !run_here && tensors[0].kind == Kind::kAllreduce &&
      QueueKept(name, tensors[0], handle)) {
    return Status::Ok();
  }
  if (run_here && n == 1 && !group && name.empty() && tensors[0].kind == Kind::kAllreduce &&
      SubmitLone(tensors[0], handle)) {
    return Status::Ok();
  }
  return SubmitGeneral(name, tensors, n, group, handle, run_here);
}

}  // namespace ringrun::runtime::engine
