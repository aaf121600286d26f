// A blocking call's lone small allreduce: one exchange that carries the data as well as the
// request (engine.h, Engine::SubmitLone).
#include <cstring>

#include "runtime/src/engine/buffers.h"
#include "runtime/src/engine/engine.h"
#include "runtime/src/engine/wire.h"

namespace ringrun::runtime::engine {
namespace {

// A lone frame: this header, then the data. It starts where a general frame starts with the
// length of its abort report, with a length no report has.
struct LoneHeader {
  uint32_t marker;
  uint8_t dtype, op;
  uint16_t zero0;
  uint32_t flags, zero1;
  uint64_t count;
  double prescale, postscale;
  uint64_t k;  // the k-th unnamed allreduce of its rank: "allreduce.noname.<k>"
};
static_assert(sizeof(LoneHeader) == 48, "a lone frame's data starts 16-byte aligned");
constexpr uint32_t kLoneMarker = 0xffffffffu;

std::string NonameAllreduce(uint64_t k) {
  return std::string(KindName(Kind::kAllreduce)) + ".noname." + std::to_string(k);
}

}  // namespace

bool Engine::IsLoneFrame(const std::string& frame) {
  uint32_t marker;
  if (frame.size() < sizeof(marker)) return false;
  std::memcpy(&marker, frame.data(), sizeof(marker));
  return marker == kLoneMarker;
}

Status Engine::LoneAsGeneral(std::string* frame) const {
  LoneHeader hd;
  if (frame->size() < sizeof(hd)) return Internal("malformed lone negotiation frame");
  std::memcpy(&hd, frame->data(), sizeof(hd));
  Request req;
  req.name = NonameAllreduce(hd.k);
  req.kind = Kind::kAllreduce;
  req.dtype = static_cast<ringrun_dtype>(hd.dtype);
  req.op = static_cast<ringrun_op>(hd.op);
  req.count = hd.count;
  req.prescale = hd.prescale, req.postscale = hd.postscale;
  req.flags = hd.flags;
  const size_t elem = DtypeSize(req.dtype);
  if (!IsValidDtype(hd.dtype) || !IsValidOp(hd.op) || elem == 0 ||
      frame->size() != sizeof(hd) + hd.count * elem) {
    return Internal("malformed lone negotiation frame");
  }
  // What Round's frame holds for this request alone: no abort report, and the request in full
  // (an unnamed request is never cached).
  std::string general;
  PutString(&general, "");
  const std::vector<int64_t> full{-1};
  general += controller_.EncodeFrame({&req}, &full);
  *frame = std::move(general);
  return Status::Ok();
}

bool Engine::SubmitLone(const TensorArgs& t, HandleState** handle) {
  if (confined_ || !transport_) return false;
  // What a plain allreduce leaves at its defaults (a blocking call sets no shape).
  if (t.stream != nullptr || t.root != 0 || t.row_elems != 1 || t.fixed || t.send_rows || t.shape) {
    return false;
  }
  const size_t elem = DtypeSize(t.dtype);
  if (elem == 0 || t.count > kLoneBytes / elem) return false;
  const size_t bytes = t.count * elem;
  if ((sizeof(LoneHeader) + bytes) * static_cast<size_t>(options_.size) > kLoneFramesBytes) {
    return false;
  }
  if (!ValidHostAllreduce(t.send, t.recv, t.count, t.dtype, t.op, t.prescale, t.postscale,
                          t.flags)) {
    return false;
  }
  // As RunHere: only while the engine thread sleeps in WaitForInput.
  if (!round_mu_.TryLock()) return false;
  uint64_t k = 0;
  {
    MutexLock lock(&mu_);
    // What RunHere requires, and moreover no rank joined (a joined rank contributes zeros, in
    // the general round) and nothing that changes frames (autotune) or wants spans (timeline).
    if (!sleeping_.load() || stop_ || !failed_.ok() || !abort_.ok() || timeline_change_ ||
        !queue_.empty() || tuning_ || timeline_ || controller_.has_pending() ||
        controller_.joined_count() != 0) {
      round_mu_.Unlock();
      return false;
    }
    k = noname_counter_[static_cast<size_t>(Kind::kAllreduce)]++;
  }
  transport_->QuietIdleWake();
  Status st;
  HandleState* h = nullptr;
  try {
    LoneHeader hd{};
    hd.marker = kLoneMarker;
    hd.dtype = static_cast<uint8_t>(t.dtype), hd.op = static_cast<uint8_t>(t.op);
    hd.flags = t.flags, hd.count = t.count;
    hd.prescale = t.prescale, hd.postscale = t.postscale;
    hd.k = k;
    lone_frame_.resize(sizeof(hd) + bytes);
    std::memcpy(lone_frame_.data(), &hd, sizeof(hd));
    if (bytes > 0) std::memcpy(lone_frame_.data() + sizeof(hd), t.send, bytes);
    // The exchange is the collective here: it busy-waits as the data plane does.
    st = Exchange(lone_frame_, &frames_, kShmSpinUs);  // a failure: the handle below carries it
    if (st.ok() && ReduceLone(frames_, t.recv)) {
      neg_lone_.store(neg_lone_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      h = NewHandleState();
      h->kind = Kind::kAllreduce;
      h->elem = elem;
      h->wait_ms = options_.timeout_ms;
      h->flags.store(HandleState::kDone | HandleState::kEngineGone, std::memory_order_release);
    } else if (st.ok()) {
      // The general round, with the frames exchanged: this rank's request as Round would have
      // announced it.
      Slot* s = LoneSlot(t, k, &h);
      std::vector<Slot*> fresh;
      fresh.swap(spare_);
      fresh.push_back(s);
      Announce(fresh);
      st = Settle(std::move(fresh), &frames_, Now());
    }
  } catch (const std::bad_alloc&) {
    st = Internal("out of memory in the engine");
  } catch (const std::exception& ex) {
    st = Internal(std::string("unexpected exception in the engine: ") + ex.what());
  }
  if (h == nullptr) {
    // Failed before the tensor had a slot: the handle carries the failure (EndHere breaks).
    h = NewHandleState();
    h->kind = Kind::kAllreduce;
    h->elem = elem;
    h->wait_ms = options_.timeout_ms;
    h->code = st.code();
    h->message = st.message();
    h->flags.store(HandleState::kDone | HandleState::kEngineGone, std::memory_order_release);
  }
  EndHere(h, st);
  *handle = h;
  return true;
}

bool Engine::ReduceLone(const std::vector<std::string>& frames, void* recv) {
  const std::string& mine = frames[static_cast<size_t>(options_.rank)];
  for (const std::string& f : frames) {
    if (f.size() != mine.size() || std::memcmp(f.data(), mine.data(), sizeof(LoneHeader)) != 0) {
      return false;
    }
  }
  LoneHeader hd;
  std::memcpy(&hd, mine.data(), sizeof(hd));
  if (hd.marker != kLoneMarker) return false;
  const size_t count = hd.count;
  if (count == 0) return true;
  // As HostAllreduce: every rank contributes (none has joined), the prescale factor first
  // (with fp16's AVERAGE folded into it), then AVERAGE's division and the postscale factor.
  const int n = options_.size;
  const ringrun_dtype dtype = static_cast<ringrun_dtype>(hd.dtype);
  const ringrun_op op = static_cast<ringrun_op>(hd.op);
  const size_t bytes = count * DtypeSize(dtype);
  const bool average = op == RINGRUN_AVERAGE;
  double pre = hd.prescale;
  if (average && dtype == RINGRUN_FLOAT16) pre /= n;
  Finish finish;
  finish.dtype = dtype;
  if (average && dtype != RINGRUN_FLOAT16) finish.divisor = n;
  finish.factor = hd.postscale;
  const ReduceFn fn = GetReduceFn(dtype, op);
  char* acc = static_cast<char*>(recv);
  if (pre != 1.0 && lone_scratch_.size() < bytes) lone_scratch_.resize(bytes);
  // In rank order on every rank, so that every rank computes the same bits.
  for (int r = 0; r < n; ++r) {
    const char* x = frames[static_cast<size_t>(r)].data() + sizeof(LoneHeader);
    if (pre != 1.0) {
      char* scaled = r == 0 ? acc : lone_scratch_.data();
      std::memcpy(scaled, x, bytes);
      if (dtype == RINGRUN_FLOAT16) {
        ScaleHalf(reinterpret_cast<uint16_t*>(scaled), reinterpret_cast<const uint16_t*>(scaled),
                  count, static_cast<float>(pre));
      } else {
        ScaleInPlace(scaled, count, dtype, pre);
      }
      x = scaled;
    }
    if (r == 0) {
      if (x != acc) CopyBytes(acc, x, bytes);
    } else {
      fn(acc, acc, x, count);
    }
  }
  if (finish.active()) finish.Apply(acc, count);
  return true;
}

Engine::Slot* Engine::LoneSlot(const TensorArgs& t, uint64_t k, HandleState** handle) {
  Entry e;
  Request& r = e.req;
  r.kind = Kind::kAllreduce, r.dtype = t.dtype, r.op = t.op, r.count = t.count;
  r.prescale = t.prescale, r.postscale = t.postscale, r.flags = t.flags;
  e.send = t.send, e.recv = t.recv;
  HandleState* h = NewHandleState();
  h->kind = Kind::kAllreduce;
  h->elem = DtypeSize(t.dtype);
  h->remaining = 1;
  h->wait_ms = options_.timeout_ms;
  const std::string name = NonameAllreduce(k);
  MutexLock lock(&mu_);
  // Nothing is in flight (SubmitLone's conditions), so no slot of that name is either.
  Slot* s = slots_.Find(name);
  if (!s) s = NewSlot(name, /*named=*/false);
  s->in_flight = true;
  MoveInto(*s, e);
  s->handle = h;
  if (s->kept) {
    h->name_ptr = s->name;
  } else {
    h->name_ = *s->name;
  }
  *handle = h;
  return s;
}

}  // namespace ringrun::runtime::engine
