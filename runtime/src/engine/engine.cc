#include "runtime/src/engine/engine.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_set>

#include "ringrun/common/defaults.h"
#include "runtime/src/engine/device_fusion.h"
#include "runtime/src/engine/wire.h"
#include "runtime/src/gpu/device_backend.h"  // the interface; its factories are linked with the seam
#include "runtime/src/reduce.h"

namespace ringrun::runtime::engine {
namespace {

// A frame travels as a fixed-size head (its length and first bytes) and, when longer, a tail:
// steady-state frames fit the head, so a round is one exchange.
constexpr size_t kFrameHeadBytes = 1024;
constexpr uint32_t kHelloMagic = 0x72726531;  // "rre1"
// Allreduces at least this large run straight from the caller's buffers instead of through
// the fusion buffer: copying a tensor in and out costs more than the per-collective latency
// that fusing it saves (measured: the copies were a quarter of a ResNet-50 step's time).
constexpr size_t kDirectAllreduceBytes = 256 << 10;

// The start of the program's heap (the break at exec), from /proc/self/stat; 0 if unknown.
uintptr_t HeapStart() {
  static const uintptr_t start = [] {
    std::FILE* f = std::fopen("/proc/self/stat", "r");
    if (!f) return uintptr_t{0};
    char buf[2048];
    const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    buf[n] = '\0';
    // Fields after the command name (which may hold spaces and parentheses): start_brk is
    // field 47 (proc(5)).
    const char* p = std::strrchr(buf, ')');
    if (!p) return uintptr_t{0};
    for (int i = 0; i < 45; ++i) {  // the i-th space after it precedes field i + 3
      p = std::strchr(p + 1, ' ');
      if (!p) return uintptr_t{0};
    }
    return static_cast<uintptr_t>(std::strtoull(p + 1, nullptr, 10));
  }();
  return start;
}

bool BuildIsDevice(const void* p) {
  if (p == nullptr) return false;
  // Memory in the program's heap (from its start to the current break) is host memory: no
  // need to ask the loader whether CUDA is there and CUDA what p is, which costs more than the
  // rest of a small submission.
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), start = HeapStart();
  if (start != 0 && a >= start && a < reinterpret_cast<uintptr_t>(::sbrk(0))) return false;
  return gpu::IsDevicePointer(p);
}

// memcpy for the fusion buffer's tensors, many of which are a few bytes (biases, norms): up to
// 16 bytes in two overlapping loads and stores instead of a call.
inline void CopyBytes(void* dst, const void* src, size_t n) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  if (n > 16) {
    std::memcpy(d, s, n);
  } else if (n >= 8) {
    uint64_t a, b;
    std::memcpy(&a, s, 8), std::memcpy(&b, s + n - 8, 8);
    std::memcpy(d, &a, 8), std::memcpy(d + n - 8, &b, 8);
  } else if (n >= 4) {
    uint32_t a, b;
    std::memcpy(&a, s, 4), std::memcpy(&b, s + n - 4, 4);
    std::memcpy(d, &a, 4), std::memcpy(d + n - 4, &b, 4);
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = s[i];
  }
}

bool PartialOverlap(const void* a, const void* b, size_t bytes) {
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  return x != y && bytes > 0 && x < y + bytes && y < x + bytes;
}

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

namespace {

// Per-thread caches of released handle states: a step submits hundreds of tensors before it
// releases any, more than malloc's per-thread cache holds, and a cached state is reused without
// being built again. A cache is a list through HandleState::next_free, headed by a trivially
// destructible thread_local (constant-initialized: one TLS access, no guard, and still
// readable after the thread's destructors ran); the first state cached on a thread registers
// the owner whose destructor frees the list at the thread's exit.
constexpr uint32_t kHandleCacheMax = 4096;
struct HandleCache {
  HandleState* top = nullptr;
  uint32_t count = 0;
  bool owned = false;  // the owner below is registered
  bool gone = false;   // the owner ran: free, do not cache (a late release, from a destructor)
};
// Initial-exec: a thread's cache is one %fs-relative access instead of a call to
// __tls_get_addr (two per release and one per submission otherwise). It takes 24 bytes of the
// static TLS that glibc keeps for libraries loaded later with dlopen (Python loads this one so).
__attribute__((tls_model("initial-exec"))) thread_local HandleCache t_handles;
struct HandleCacheOwner {
  ~HandleCacheOwner() {
    t_handles.gone = true;
    while (HandleState* h = t_handles.top) {
      t_handles.top = h->next_free;
      delete h;
    }
    t_handles.count = 0;
  }
};

// Resets h and keeps it in this thread's cache (cache: the thread submits; the engine thread
// never does, so what it recycles is freed).
void Recycle(HandleState* h, bool cache) {
  HandleCache& c = t_handles;
  if (!cache || c.gone || c.count >= kHandleCacheMax) {
    delete h;
    return;
  }
  if (!c.owned) {
    thread_local HandleCacheOwner owner;  // registers its destructor, once per thread
    (void)owner;
    c.owned = true;
  }
  h->flags.store(0, std::memory_order_relaxed);
  h->name_ptr = nullptr;
  h->status = RINGRUN_OK;
  if (!h->message.empty()) h->message.clear();
  h->remaining = 0;
  h->kind = Kind::kAllreduce;
  h->elem = 0;
  h->wait_ms = 0;
  if (h->output.capacity() > (size_t{64} << 10)) {  // a cache keeps no large results
    std::vector<char>().swap(h->output);
  } else {
    h->output.clear();
  }
  h->rows.clear();
  h->last_joined = -1;
  if (h->device_output) h->device_output.reset();
  h->device_output_bytes = 0;
  h->next_free = c.top;
  c.top = h;
  ++c.count;
}

// Threads inside Engine::Wait, in every engine of the process (see CollectBurst).
std::atomic<int> g_waiters{0};

// Doorbells (eventfds) come from a process-wide pool and are never closed. A stopped engine may
// still be rung by a call on another thread (the C API never destroys a runtime; see
// c_api.cc), and a closed descriptor's number could by then belong to another file. A stopped
// engine puts its doorbell back for the next one, so a program that joins again and again holds
// as many doorbells as it ever ran engines at once, not one per ringrun_init. A late ring on a
// reused doorbell wakes the engine that holds it now, which finds nothing queued and sleeps
// again. A child made by fork() inherits the pool but not its engines: sharing a parent's
// eventfd, one process's drain could swallow the other's ring, so the child closes its copies
// and makes its own.
struct DoorbellPool {
  std::mutex mu;
  pid_t owner = 0;        // the process whose doorbells `free` holds (mu)
  std::vector<int> free;  // guarded by mu
};
DoorbellPool& Doorbells() {
  static DoorbellPool* pool = new DoorbellPool;  // never destroyed, as the doorbells
  return *pool;
}
// A doorbell, or -errno when no eventfd could be made (the process's descriptor limit).
int TakeDoorbell() {
  DoorbellPool& pool = Doorbells();
  {
    std::lock_guard<std::mutex> lock(pool.mu);
    if (pool.owner != ::getpid()) {
      for (int fd : pool.free) ::close(fd);  // a parent's, inherited across fork()
      pool.free.clear();
      pool.owner = ::getpid();
    }
    if (!pool.free.empty()) {
      const int fd = pool.free.back();
      pool.free.pop_back();
      uint64_t stale;
      (void)!::read(fd, &stale, sizeof(stale));  // rings meant for its last engine
      return fd;
    }
  }
  const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  return fd >= 0 ? fd : -errno;
}
void ReturnDoorbell(int fd) {
  if (fd < 0) return;
  DoorbellPool& pool = Doorbells();
  std::lock_guard<std::mutex> lock(pool.mu);
  if (pool.owner != ::getpid()) return;  // an engine made before fork(): not this process's
  pool.free.push_back(fd);
}

}  // namespace

HandleState* NewHandleState() {
  HandleCache& c = t_handles;
  if (HandleState* h = c.top) {
    c.top = h->next_free;
    --c.count;
    return h;
  }
  return new HandleState;
}

void ReleaseHandle(HandleState* h) {
  // The usual case, a handle released after it completed: the engine has let go already and
  // never touches h again, so nobody races for the last reference and no read-modify-write is
  // needed to take it.
  if (h->flags.load(std::memory_order_acquire) & HandleState::kEngineGone) {
    Recycle(h, true);
    return;
  }
  if (h->flags.fetch_or(HandleState::kReleased) & HandleState::kEngineGone) Recycle(h, true);
}

void EngineDone(HandleState* h) {
  if (h->flags.fetch_or(HandleState::kEngineGone) & HandleState::kReleased) Recycle(h, false);
}

std::shared_ptr<HandleState> ShareHandle(HandleState* h) {
  return std::shared_ptr<HandleState>(h, ReleaseHandle);
}

const std::string* InternName(std::string_view name) {
  static std::mutex mu;
  static auto* names = new std::unordered_set<std::string, std::hash<std::string>>;  // never freed
  std::lock_guard<std::mutex> lock(mu);
  return &*names->emplace(name).first;
}

size_t NameHash::operator()(std::string_view s) const noexcept {
  const char* p = s.data();
  const size_t size = s.size();
  uint64_t h = 0x9e3779b97f4a7c15ull ^ size;
  auto mix = [&h](uint64_t v) {
    h = (h ^ v) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  };
  uint64_t v = 0;
  if (size >= 8) {
    size_t i = 0;
    for (; i + 8 < size; i += 8) {
      std::memcpy(&v, p + i, 8);
      mix(v);
    }
    std::memcpy(&v, p + size - 8, 8);  // the last 8 bytes (overlapping the previous ones)
  } else {
    for (size_t i = 0; i < size; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  }
  h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
  return static_cast<size_t>(h ^ (h >> 29));
}

ringrun_status ToRingrunStatus(const Status& st) {
  return st.ok() ? RINGRUN_OK : static_cast<ringrun_status>(st.code());
}

Status Engine::failure() {
  std::lock_guard<Mutex> lock(mu_);
  if (failed_code_ == RINGRUN_OK) return Status::Ok();
  return Status(static_cast<Code>(failed_code_), failed_message_);
}

Engine::Engine(std::unique_ptr<transport::Transport> transport, EngineOptions options)
    : options_(std::move(options)),
      clock_(options_.clock ? options_.clock : &steady_),
      world_([&] {
        Group g;
        for (int r = 0; r < options_.size; ++r) g.ranks.push_back(r);
        g.me = options_.rank;
        return g;
      }()),
      is_device_(options_.is_device ? options_.is_device : BuildIsDevice),
      doorbell_(TakeDoorbell()),
      noname_counter_(8, 0),
      transport_(std::move(transport)),
      controller_(options_.size, options_.cache_capacity),
      stall_(
          options_.stall, options_.rank,
          options_.log
              ? options_.log
              : [](const std::string& m) { std::fprintf(stderr, "ringrun: %s\n", m.c_str()); }),
      fusion_(options_.fusion_threshold) {
  if (const int bell = doorbell(); bell < 0) {
    // Nothing could wake the engine thread: fail now, without one (Submit refuses, and
    // Runtime::Join reports it); the peers see this rank's connections close.
    doorbell_.store(-1);
    Status why = Internal("rank " + std::to_string(options_.rank) +
                          ": cannot make the engine's eventfd: " + std::strerror(-bell) +
                          (-bell == EMFILE ? " (the process's open-file limit, ulimit -n)" : ""));
    failed_code_ = ToRingrunStatus(why);
    failed_message_ = why.message();
    if (transport_) transport_->Break(why);
    return;
  }
  if (!options_.timeline_path.empty()) {
    Result<std::unique_ptr<Timeline>> t =
        Timeline::Open(options_.timeline_path, options_.rank, clock_);
    if (t.ok()) {
      timeline_ = std::move(t.value());
    } else {
      std::fprintf(stderr, "ringrun: rank %d: %s (no timeline)\n", options_.rank,
                   t.status().ToString().c_str());
    }
  }
  controller_.set_record_announcements(timeline_ != nullptr);
  if (transport_) {
    for (int r = 0; r < options_.size; ++r) {
      if (!transport_->peers().SameHost(r, options_.rank)) spans_hosts_ = true;
    }
  }
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() { Shutdown(); }

void Engine::Shutdown() {
  {
    std::lock_guard<Mutex> lock(mu_);
    stop_ = true;
  }
  AbortDevice("ringrun_shutdown was called with device collectives pending");
  const uint64_t one = 1;
  (void)!::write(doorbell(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  // What the engine thread owned goes now rather than with the object: the C API never
  // destroys a runtime (a call on another thread may still be in it; see c_api.cc), and the
  // peers must see this rank's connections close. The doorbell goes back to the pool, open (a
  // late Abort or submission may still ring it), and the Timeline object stays (submissions
  // test its pointer without a lock), closed. Idempotent.
  ReturnDoorbell(doorbell_.exchange(-1));
  if (timeline_) timeline_->Close();
  {
    std::lock_guard<std::mutex> lock(device_mu_);
    device_live_ = nullptr;
  }
  device_.reset();
  transport_.reset();
  fusion_.Release();
  scratch_ = Scratch();
  std::vector<char>().swap(zeros_);
  std::vector<Slot*>().swap(by_cache_id_);
  announced_full_.Clear();
  std::vector<Response>().swap(responses_);
  uniform_plan_ = Plan();
  general_plan_ = Plan();
  std::lock_guard<Mutex> lock(mu_);  // submissions see stop_ first and touch no slot
  std::vector<Slot*>().swap(queue_);
  slots_.Clear();
  std::vector<Slot*>().swap(free_slots_);
  slot_store_.clear();
}

SubmitResult Engine::Submit(std::vector<Entry> entries, bool group) {
  SubmitResult out;
  const std::string name = entries.empty() ? std::string() : entries[0].req.name;
  if (!group && entries.size() > 1) {
    out.status = RINGRUN_ERR_INVALID_ARGUMENT;
    out.message = "several entries in one submission must be a group";
    return out;
  }
  HandleState* h = nullptr;
  out.status = Submit(entries.data(), entries.size(), name, group, &h, &out.message);
  if (h) out.handle = ShareHandle(h);
  return out;
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

}  // namespace

template <typename R>
inline bool Engine::UpdateArgs(Request& q, const R& r) {
  // Field by field, writing only what changed, and never the name (the slot keeps its own):
  // the engine thread read this slot last step, and a field left alone stays in both cores'
  // caches instead of moving back and forth each step.
  bool changed = Update(q.kind, r.kind) | Update(q.dtype, r.dtype) | Update(q.op, r.op);
  changed |= Update(q.device, r.device) | Update(q.root, r.root) | Update(q.count, r.count);
  changed |= Update(q.row_elems, r.row_elems) | Update(q.flags, r.flags);
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
  s.fast_ok = false;  // written by the general path: SubmitAllreduceFast checks again
  Request& q = s.req;
  bool changed = UpdateArgs(q, e.req);
  if (q.send_rows != e.req.send_rows) q.send_rows = std::move(e.req.send_rows), changed = true;
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

inline void Engine::ReleaseSlot(Slot* s) {
  s->in_flight = false;
  if (s->kept) return;
  slots_.Erase(*s->name);
  free_slots_.push_back(s);
}

ringrun_status Engine::Submit(Entry* entries, size_t n, std::string_view name, bool group,
                              HandleState** handle, std::string* message) {
  *handle = nullptr;
  if (n == 0) {
    *message = "nothing to submit";
    return RINGRUN_ERR_INVALID_ARGUMENT;
  }
  const int64_t now = timeline_ ? Now() : 0;  // submit_us: for the timeline only
  for (size_t i = 0; i < n; ++i) {
    Entry& e = entries[i];
    const bool send_device = is_device_(e.send);
    const bool recv_device = e.recv == e.send ? send_device : is_device_(e.recv);
    e.req.device = send_device || recv_device;
    Status st = name.size() > RINGRUN_MAX_NAME_BYTES
                    ? InvalidArgument("name longer than " + std::to_string(RINGRUN_MAX_NAME_BYTES) +
                                      " bytes")
                    : Validate(e, options_.size, send_device, recv_device);
    if (st.ok() && e.req.device) st = RecordReady(e);
    if (!st.ok()) {
      *message = (name.empty() ? std::string(KindName(e.req.kind)) : std::string(name)) + ": " +
                 st.message();
      return RINGRUN_ERR_INVALID_ARGUMENT;
    }
    e.submit_us = now;
  }
  if (name == kJoinName && !group && entries[0].req.kind != Kind::kJoin) {
    // Every rank's controller counts a rank that announces "join" as joined as soon as it sees
    // the announcement, before any mismatch is found.
    *message = "'join' is the name of ringrun_join's request; choose another name";
    return RINGRUN_ERR_INVALID_ARGUMENT;
  }
  HandleState* h = NewHandleState();
  // Refused after this point: the engine never saw the handle, and the caller never gets it.
  auto refuse = [&](ringrun_status st, std::string why) {
    h->flags.store(HandleState::kDone | HandleState::kEngineGone);
    ReleaseHandle(h);
    *message = std::move(why);
    return st;
  };
  const Kind kind = entries[0].req.kind;
  h->kind = kind;
  h->elem = kind == Kind::kBarrier || kind == Kind::kJoin ? 0 : DtypeSize(entries[0].req.dtype);
  h->remaining = static_cast<int>(n);
  h->wait_ms = options_.timeout_ms;
  {
    std::lock_guard<Mutex> lock(mu_);
    if (stop_) return refuse(RINGRUN_ERR_ABORTED, "ringrun is shutting down");
    if (failed_code_ != RINGRUN_OK) return refuse(failed_code_, failed_message_);
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
            RINGRUN_ERR_DUPLICATE_NAME,
            "tensor '" + std::string(nm) +
                "' is still in flight on this rank (submitted again before it completed)");
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
  if (sleeping_.load() && sleeping_.exchange(false)) {
    const uint64_t one = 1;
    (void)!::write(doorbell(), &one, sizeof(one));
  }
  *handle = h;
  return RINGRUN_OK;
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
  // The build's own check called directly (not through the std::function): it is inlined.
  auto device = [this](const void* p) {
    return options_.is_device ? is_device_(p) : BuildIsDevice(p);
  };
  return !device(send) && (recv == send || !device(recv));
}

bool Engine::SubmitAllreduceFast(std::string_view name, const void* send, void* recv, size_t count,
                                 ringrun_dtype dtype, ringrun_op op, double prescale,
                                 double postscale, uint32_t flags, HandleState** handle) {
  if (name.empty() || name.size() > RINGRUN_MAX_NAME_BYTES || name == kJoinName) return false;
  const int64_t now = timeline_ ? Now() : 0;
  const size_t hash = NameHash{}(name);
  HandleState* h = nullptr;
  bool validated = false;
  for (;;) {
    {
      std::lock_guard<Mutex> lock(mu_);
      if (stop_ || failed_code_ != RINGRUN_OK) return false;
      // A new name, an unnamed slot's, or one in flight (a duplicate) takes the general path.
      Slot* s = slots_.Find(name, hash);
      if (s == nullptr || !s->kept || s->in_flight) return false;
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
          // The arguments as Submit's caller would have built the request (the name stays the
          // slot's own; no string or vector is built).
          struct {
            Kind kind = Kind::kAllreduce;
            ringrun_dtype dtype;
            ringrun_op op;
            bool device = false;
            int32_t root = 0;
            uint64_t count;
            uint64_t row_elems = 1;
            uint32_t flags;
            bool fixed = false;
            double prescale, postscale;
          } r;
          r.dtype = dtype, r.op = op, r.count = count, r.flags = flags;
          r.prescale = prescale, r.postscale = postscale;
          bool changed = UpdateArgs(s->req, r);
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
  if (sleeping_.load() && sleeping_.exchange(false)) {  // as in Submit
    const uint64_t one = 1;
    (void)!::write(doorbell(), &one, sizeof(one));
  }
  *handle = h;
  return true;
}

ringrun_status Engine::Wait(HandleState& h, int timeout_ms) {
  if (h.done()) return h.status;
  // Counted process-wide (an engine may be gone by the time a waiter leaves): CollectBurst
  // stops gathering as soon as anyone waits, whichever engine's handle it is.
  g_waiters.fetch_add(1, std::memory_order_relaxed);
  std::unique_lock<std::mutex> lock(h.mu);
  h.flags.fetch_or(HandleState::kWaiting);
  const bool done = h.cv.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                                  [&] { return (h.flags.load() & HandleState::kDone) != 0; });
  g_waiters.fetch_sub(1, std::memory_order_relaxed);
  return done ? h.status : RINGRUN_ERR_TIMEOUT;
}

void Engine::CollectBurst(std::vector<Slot*>& fresh) {
  // A step's tensors submitted back to back (a fraction of a microsecond apart) would otherwise
  // be cut at whichever submission woke the engine: a first round with the few queued by the
  // time the engine thread ran, a second with the rest, on a machine where the two threads run
  // on different cores. The quiet window is far below the gaps between a framework's gradient
  // hooks, so overlap with backward is kept; a waiter ends it at once, so a blocking call pays
  // nothing for it.
  const int64_t quiet = burst_quiet_ns_;
  if (quiet <= 0 || fresh.empty()) return;
  uint64_t seen = pushed_.load(std::memory_order_relaxed);
  const auto start = std::chrono::steady_clock::now();
  auto last = start;
  bool growing = false;
  while (g_waiters.load(std::memory_order_relaxed) == 0) {
    for (int i = 0; i < 8; ++i) CpuRelax();
    const auto now = std::chrono::steady_clock::now();
    const uint64_t p = pushed_.load(std::memory_order_relaxed);
    if (p != seen) {
      seen = p, last = now, growing = true;
    } else if (now - last >= std::chrono::nanoseconds(growing ? quiet : quiet / 8)) {
      break;  // before any growth, an eighth: a lone submission is not held up
    }
    if (now - start >= std::chrono::nanoseconds(32 * quiet)) break;
  }
  std::lock_guard<Mutex> lock(mu_);
  fresh.insert(fresh.end(), queue_.begin(), queue_.end());
  queue_.clear();
}

void Engine::SleepOnDoorbell(Deadline deadline) {
  pollfd p{doorbell(), POLLIN, 0};
  int ms = -1;
  if (deadline != Deadline::max()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    ms = std::max<int>(0, static_cast<int>(left.count()) + 1);
  }
  (void)::poll(&p, 1, ms);
}

void Engine::Abort(const Status& st) {
  {
    std::lock_guard<Mutex> lock(mu_);
    if (failed_code_ != RINGRUN_OK || !abort_.ok()) return;
    abort_ = st;
  }
  AbortDevice(st.message());
  const uint64_t one = 1;
  (void)!::write(doorbell(), &one, sizeof(one));
}

void Engine::Loop() {
  // A thread confined to one CPU (ranks bound to a core each) shares it with the submitting
  // thread: nothing can be submitted while this thread spins, so a burst is never gathered.
  burst_quiet_ns_ = options_.burst_quiet_ns;
  cpu_set_t cpus;
  if (::sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && CPU_COUNT(&cpus) <= 1) {
    burst_quiet_ns_ = 0;
  }
  Status st = Hello();
  if (!st.ok()) FailAll(ToRingrunStatus(st), st);
  for (;;) {
    std::vector<Slot*> fresh;
    fresh.swap(spare_);  // an empty vector with the capacity of an earlier round's
    bool failed;
    Status abort;
    {
      std::lock_guard<Mutex> lock(mu_);
      if (stop_) break;
      fresh.swap(queue_);
      failed = failed_code_ != RINGRUN_OK;
      abort = std::exchange(abort_, Status::Ok());
    }
    if (!abort.ok() && !failed) {
      // A blocking call gave up waiting: name who is missing, then break (no buffer of a
      // returning call may stay in use).
      std::string who = stall_.Report(controller_.Pending(), Now(), 0);
      Status why(abort.code(), abort.message() + (who.empty() ? "" : ": " + who));
      if (transport_) transport_->Break(why);
      FailAll(ToRingrunStatus(why), why);  // fresh's slots are in flight: it fails them too
      continue;
    }
    if (failed) {
      // Broken: what was queued before the failure fails with it; then sleep until shutdown.
      if (!fresh.empty()) {
        std::string m;
        ringrun_status c;
        {
          std::lock_guard<Mutex> lock(mu_);
          c = failed_code_, m = failed_message_;
        }
        FailAll(c, Status(Code::kUnavailable, m));
      }
      SleepOnDoorbell(Deadline::max());
      uint64_t drained;
      (void)!::read(doorbell(), &drained, sizeof(drained));
      continue;
    }
    bool peer_input = false;
    if (fresh.empty()) {
      sleeping_.store(true);
      {
        std::lock_guard<Mutex> lock(mu_);
        if (stop_ || !queue_.empty() || !abort_.ok()) {
          sleeping_.store(false);
          continue;
        }
      }
      // The full look at what is pending (it builds a list) only once a stall is possible.
      int64_t check = stall_.EarliestCheckUs(controller_.OldestPendingUs());
      if (check >= 0 && check <= Now()) check = stall_.NextCheckUs(controller_.Pending());
      Deadline deadline = Deadline::max();
      if (check >= 0) {
        deadline = std::chrono::steady_clock::now() +
                   std::chrono::microseconds(std::max<int64_t>(0, check - Now()));
      }
      Status wst;
      if (transport_) {
        wst = transport_->WaitForInput(doorbell(), deadline, &peer_input);
      } else {
        SleepOnDoorbell(deadline);
      }
      sleeping_.store(false);
      uint64_t drained;
      (void)!::read(doorbell(), &drained, sizeof(drained));
      if (!wst.ok()) {
        // As a failed round: the peers must see this rank's connections close, not wait for
        // it until their timeout.
        if (transport_) transport_->Break(wst);
        FailAll(ToRingrunStatus(wst), wst);
        continue;
      }
      if (check >= 0 && Now() >= check) {
        Status sst = stall_.Check(controller_.Pending(), Now());
        if (!sst.ok()) {
          // Tell every rank in one more round, so that all fail with the report (not with
          // "connection closed" by the first rank to give up), then break.
          Status told = Round({}, sst.message());
          Status why = told.code() == Code::kAborted ? told : sst;
          if (transport_) transport_->Break(why);
          FailAll(RINGRUN_ERR_ABORTED, why);
          continue;
        }
      }
      {
        std::lock_guard<Mutex> lock(mu_);
        if (stop_) break;
        fresh.swap(queue_);
      }
      if (fresh.empty() && !peer_input) continue;
    }
    CollectBurst(fresh);
    try {
      st = Round(std::move(fresh));
    } catch (const std::bad_alloc&) {
      st = Internal("out of memory in the engine");
    } catch (const std::exception& ex) {
      st = Internal(std::string("unexpected exception in the engine: ") + ex.what());
    }
    if (!st.ok()) {
      if (transport_) transport_->Break(st);
      FailAll(ToRingrunStatus(st), st);
    }
  }
  FailAll(RINGRUN_ERR_ABORTED, Aborted("ringrun_shutdown was called with the collective pending"));
  if (timeline_) timeline_->Flush();
}

Status Engine::Hello() {
  if (!transport_) return Status::Ok();
  // Meets every peer once: connects all pairs (WaitForInput needs them) and checks that the
  // settings every rank must share agree.
  std::string mine;
  Put<uint32_t>(&mine, kHelloMagic);
  Put<uint64_t>(&mine, options_.fusion_threshold);
  Put<uint64_t>(&mine, options_.cache_capacity);
  Result<std::vector<std::string>> all = Exchange(mine);
  if (!all.ok()) return all.status();
  for (int r = 0; r < options_.size; ++r) {
    if ((*all)[r] != mine) {
      return InvalidArgument(
          "rank " + std::to_string(r) + " runs with other engine settings than rank " +
          std::to_string(options_.rank) +
          " (RINGRUN_FUSION_THRESHOLD and RINGRUN_CACHE_CAPACITY must be the same on every rank)");
    }
  }
  return Status::Ok();
}

CollectiveContext Engine::Context() {
  return CollectiveContext{transport_.get(), DeadlineAfter(options_.timeout_ms), &scratch_};
}

Result<std::vector<std::string>> Engine::Exchange(const std::string& mine) {
  const int n = options_.size, me = options_.rank;
  std::vector<std::string> all(n);
  all[me] = mine;
  if (n == 1) return all;
  std::string head(kFrameHeadBytes, '\0');
  const uint32_t len = static_cast<uint32_t>(mine.size());
  std::memcpy(head.data(), &len, 4);
  std::memcpy(head.data() + 4, mine.data(), std::min(mine.size(), kFrameHeadBytes - 4));
  std::vector<std::string> heads(n, std::string(kFrameHeadBytes, '\0'));
  std::vector<transport::Op> ops;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    ops.push_back(transport::Op::Send(p, head.data(), kFrameHeadBytes));
    ops.push_back(transport::Op::Recv(p, heads[p].data(), kFrameHeadBytes));
  }
  RINGRUN_RETURN_IF_ERROR(
      transport_->Run(ops, DeadlineAfter(options_.timeout_ms), kNegotiationSpinUs));
  ops.clear();
  const size_t inline_bytes = kFrameHeadBytes - 4;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    uint32_t plen;
    std::memcpy(&plen, heads[p].data(), 4);
    all[p].assign(heads[p].data() + 4, std::min<size_t>(plen, inline_bytes));
    if (plen > inline_bytes) {
      all[p].resize(plen);
      ops.push_back(transport::Op::Recv(p, all[p].data() + inline_bytes, plen - inline_bytes));
    }
    if (mine.size() > inline_bytes) {
      ops.push_back(transport::Op::Send(p, mine.data() + inline_bytes, mine.size() - inline_bytes));
    }
  }
  if (!ops.empty()) {
    RINGRUN_RETURN_IF_ERROR(
        transport_->Run(ops, DeadlineAfter(options_.timeout_ms), kNegotiationSpinUs));
  }
  return all;
}

Status Engine::Round(std::vector<Slot*> fresh, const std::string& abort) {
  const int64_t start = Now();
  announce_.clear();
  announce_ids_.clear();
  for (Slot* s : fresh) {
    // The id it travelled under last time still fits if neither its arguments nor that cache
    // entry changed since it was compared with it.
    if (s->cache_id < 0 || s->args_changed ||
        controller_.CacheVersion(static_cast<uint32_t>(s->cache_id)) != s->cache_version) {
      Update(s->cache_id, controller_.CachedId(s->req, s->cache_id));
      if (s->cache_id >= 0) {
        s->cache_version = controller_.CacheVersion(static_cast<uint32_t>(s->cache_id));
      }
      s->args_changed = false;
    }
    if (s->cache_id >= 0) {
      const size_t id = static_cast<size_t>(s->cache_id);
      if (by_cache_id_.size() <= id) by_cache_id_.resize(std::max(id + 1, 2 * by_cache_id_.size()));
      by_cache_id_[id] = s;
    } else {
      announced_full_.Insert(*s->name, s);
    }
    announce_.push_back(&s->req);
    announce_ids_.push_back(s->cache_id);
  }
  // A frame: the abort report (usually empty), then the controller's part.
  std::string frame;
  PutString(&frame, abort);
  frame += controller_.EncodeFrame(announce_, &announce_ids_);
  Result<std::vector<std::string>> frames = Exchange(frame);
  if (!frames.ok()) return frames.status();
  for (std::string& f : *frames) {
    size_t pos = 0;
    std::string report;
    if (!GetString(f, &pos, &report)) return Internal("malformed negotiation frame");
    if (!report.empty()) return Aborted(report);
    f.erase(0, pos);
  }
  const Response* responses = nullptr;
  Result<size_t> ready = controller_.Apply(*frames, Now(), &responses_, &responses);
  if (!ready.ok()) return ready.status();
  if (timeline_) {
    timeline_->Mark("ROUND", start,
                    "\"round\": " + std::to_string(controller_.round()) + ", \"announced\": " +
                        std::to_string(fresh.size()) + ", \"ready\": " + std::to_string(*ready));
  }
  Execute(responses, *ready, controller_.uniform(), controller_.repeated());
  if (timeline_) timeline_->Flush();
  fresh.clear();
  spare_.swap(fresh);  // its capacity serves the submission queue again
  return Status::Ok();
}

inline Engine::Slot* Engine::Local(const Response& r) {
  if (r.cache_id >= 0 && static_cast<size_t>(r.cache_id) < by_cache_id_.size()) {
    if (Slot* s = by_cache_id_[static_cast<size_t>(r.cache_id)]) return s;
  }
  return announced_full_.Find(r.req.name);
}

struct Engine::Batch {
  std::vector<const Response*> responses;
  std::vector<Entry*> locals;  // this rank's entry of each response (nullptr: joined)
  size_t bytes = 0;            // of the responses packed into the fusion buffer
};

inline bool Engine::Packed(const Request& req, size_t threshold) {
  const size_t bytes = req.count * req.ElemBytes();
  return bytes <= threshold && bytes < kDirectAllreduceBytes;
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
      FailAll(ToRingrunStatus(transport_->status()), transport_->status());  // notifies all
      return;
    }
    const ringrun_status code = ToRingrunStatus(st);
    for (Entry* e : b.locals) Complete(e, code, st.message());
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
      std::string who;
      for (size_t k = 0; k < x->announced_us.size(); ++k) {
        if (x->announced_us[k] < 0) continue;
        who += (who.empty() ? "" : ", ") + std::string("\"rank ") + std::to_string(k) +
               "\": " + std::to_string(x->announced_us[k] - local->submit_us);
      }
      timeline_->Span(x->req.name, "NEGOTIATE", local->submit_us, now,
                      "\"announced_after_us\": {" + who + "}");
    }
  }
  if (r.req.device) return RunDevice(b);
  if (b.responses.size() > 1) return RunFused(b);
  Entry* e = b.locals[0];
  if (r.type == Response::kJoinDone) {
    if (e) e->handle->last_joined = r.last_joined;
    return Status::Ok();
  }
  if (r.req.kind == Kind::kAllreduce) return RunAllreduce(r, e);
  return RunOther(r, e);
}

Status Engine::HostAllreduce(std::vector<Segment> segments, const Request& req, int contributors,
                             const char* span) {
  const int n = options_.size;
  const ringrun_dtype dtype = req.dtype;
  const size_t elem = DtypeSize(dtype);
  size_t total = 0;
  for (const Segment& sg : segments) total += sg.count;
  if (total == 0) return Status::Ok();
  const int divisor = (req.flags & RINGRUN_AVERAGE_BY_CONTRIBUTORS) ? std::max(contributors, 1) : n;
  const bool average = req.op == RINGRUN_AVERAGE && divisor > 1;
  const ReduceFn fn = GetReduceFn(dtype, req.op);
  double pre = req.prescale;
  if (average && dtype == RINGRUN_FLOAT16) pre /= divisor;  // see ScaleHalf
  if (pre != 1.0) {
    for (Segment& sg : segments) {
      if (sg.send != sg.recv) std::memcpy(sg.recv, sg.send, sg.count * elem);
      if (dtype == RINGRUN_FLOAT16) {
        ScaleHalf(static_cast<uint16_t*>(sg.recv), static_cast<const uint16_t*>(sg.recv), sg.count,
                  static_cast<float>(pre));
      } else {
        ScaleInPlace(sg.recv, sg.count, dtype, pre);
      }
      sg.send = sg.recv;
    }
  }
  Finish finish;
  finish.dtype = dtype;
  if (average && dtype != RINGRUN_FLOAT16) finish.divisor = divisor;
  finish.factor = req.postscale;
  const int64_t t0 = Now();
  if (transport_) {
    RINGRUN_RETURN_IF_ERROR(
        runtime::AllreduceSegments(Context(), world_, segments, dtype, fn, &finish));
  } else {
    for (const Segment& sg : segments) {
      if (sg.send != sg.recv) std::memcpy(sg.recv, sg.send, sg.count * elem);
      finish.Apply(sg.recv, sg.count);
    }
  }
  if (timeline_ && span) {
    const char* algo = transport_ ? AllreduceAlgorithm(*transport_, world_, total, elem) : "local";
    timeline_->Span(span, "ALLREDUCE", t0, Now(),
                    "\"bytes\": " + std::to_string(total * elem) + ", \"buffers\": " +
                        std::to_string(segments.size()) + ", \"algorithm\": \"" + algo + "\"");
  }
  return Status::Ok();
}

Status Engine::RunAllreduce(const Response& r, Entry* e) {
  const size_t bytes = r.req.count * r.req.ElemBytes();
  if (e) {
    return HostAllreduce({Segment{e->send, e->recv, r.req.count}}, r.req, r.contributors,
                         r.req.name.c_str());
  }
  // Joined: contribute zeros.
  if (zeros_.size() < bytes) zeros_.resize(bytes);
  std::memset(zeros_.data(), 0, bytes);
  return HostAllreduce({Segment{zeros_.data(), zeros_.data(), r.req.count}}, r.req, r.contributors,
                       r.req.name.c_str());
}

Status Engine::RunFused(Batch& b) {
  const Request& key = b.responses[0]->req;
  const size_t elem = key.ElemBytes();
  const size_t threshold = fusion_.threshold();
  // Packed() for this batch's dtype (every response in it has key's).
  auto packed = [&](const Request& q) {
    const size_t bytes = q.count * elem;
    return bytes <= threshold && bytes < kDirectAllreduceBytes;
  };
  // The small ones are packed into the fusion buffer (one segment); the large ones are segments
  // of their own, reduced where they are. A joined rank contributes zeros for each.
  // (Only while ranks have joined: this rank has an entry for every response otherwise.)
  size_t zero_bytes = 0;
  if (b.responses[0]->contributors != options_.size) {
    for (size_t i = 0; i < b.responses.size(); ++i) {
      if (!b.locals[i] && !packed(b.responses[i]->req)) {
        zero_bytes += b.responses[i]->req.count * elem;
      }
    }
  }
  if (zero_bytes > 0) {
    if (zeros_.size() < zero_bytes) zeros_.resize(zero_bytes);
    std::memset(zeros_.data(), 0, zero_bytes);
  }
  char* buf = b.bytes > 0 ? fusion_.data() : nullptr;
  std::vector<Segment> segments;
  if (buf) segments.push_back(Segment{buf, buf, b.bytes / elem});
  size_t off = 0, zero_off = 0;
  const int64_t t0 = Now();
  for (size_t i = 0; i < b.responses.size(); ++i) {
    const Request& q = b.responses[i]->req;
    const size_t bytes = q.count * elem;
    if (!packed(q)) {
      if (b.locals[i]) {
        segments.push_back(Segment{b.locals[i]->send, b.locals[i]->recv, q.count});
      } else {
        segments.push_back(Segment{zeros_.data() + zero_off, zeros_.data() + zero_off, q.count});
        zero_off += bytes;
      }
    } else if (bytes > 0) {
      if (b.locals[i]) {
        CopyBytes(buf + off, b.locals[i]->send, bytes);
      } else {
        std::memset(buf + off, 0, bytes);
      }
      off += bytes;
    }
  }
  const int64_t t1 = Now();
  RINGRUN_RETURN_IF_ERROR(
      HostAllreduce(std::move(segments), key, b.responses[0]->contributors, nullptr));
  const int64_t t2 = Now();
  off = 0;
  size_t total = 0;
  for (size_t i = 0; i < b.responses.size(); ++i) {
    const Request& q = b.responses[i]->req;
    const size_t bytes = q.count * elem;
    total += bytes;
    if (!packed(q)) continue;
    if (b.locals[i] && bytes > 0) CopyBytes(b.locals[i]->recv, buf + off, bytes);
    off += bytes;
  }
  if (timeline_) {
    const int64_t t3 = Now();
    const char* algo =
        transport_ ? AllreduceAlgorithm(*transport_, world_, total / elem, elem) : "local";
    const std::string args = "\"fused_bytes\": " + std::to_string(total) +
                             ", \"fused_tensors\": " + std::to_string(b.responses.size()) +
                             ", \"packed_bytes\": " + std::to_string(b.bytes) +
                             ", \"algorithm\": \"" + algo + "\"";
    for (const Response* r : b.responses) {
      if (Packed(r->req, threshold))
        timeline_->Span(r->req.name, "MEMCPY_IN_FUSION_BUFFER", t0, t1);
      timeline_->Span(r->req.name, "ALLREDUCE", t1, t2, args);
      if (Packed(r->req, threshold))
        timeline_->Span(r->req.name, "MEMCPY_OUT_FUSION_BUFFER", t2, t3);
    }
  }
  return Status::Ok();
}

Status Engine::RunOther(const Response& r, Entry* e) {
  const Request& q = r.req;
  const int n = options_.size, me = options_.rank;
  const size_t elem = q.kind == Kind::kBarrier ? 1 : q.ElemBytes();
  const int64_t t0 = Now();
  size_t moved = 0;
  Status st;
  switch (q.kind) {
    case Kind::kBarrier:
      break;  // every rank has entered it: that is what made it ready
    case Kind::kBroadcast:
      moved = q.count * elem;
      if (transport_) st = runtime::Broadcast(Context(), world_, e->recv, moved, q.root);
      break;
    case Kind::kAllgather: {
      std::vector<size_t> bytes(n);
      size_t total = 0;
      for (int k = 0; k < n; ++k) {
        bytes[k] = r.by_rank[k]->count * r.by_rank[k]->row_elems * elem;
        total += bytes[k];
      }
      moved = total;
      void* out;
      if (q.fixed) {
        out = e->recv;
        const char* mine = static_cast<char*>(out) + me * bytes[me];
        if (bytes[me] > 0 && PartialOverlap(e->send, out, total) && e->send != mine) {
          char* copy = scratch_.Get(2, bytes[me]);
          std::memcpy(copy, e->send, bytes[me]);
          e->send = copy;
        }
      } else {
        e->handle->output.resize(total);
        out = e->handle->output.data();
        e->handle->rows.assign(n, 0);
        for (int k = 0; k < n; ++k) e->handle->rows[k] = r.by_rank[k]->count;
      }
      if (transport_) {
        st = Allgatherv(Context(), world_, e->send, out, bytes);
      } else if (bytes[me] > 0 && out != e->send) {
        std::memmove(out, e->send, bytes[me]);
      }
      break;
    }
    case Kind::kAlltoall: {
      const Request& mine = *r.by_rank[me];
      std::vector<size_t> send_bytes(n), recv_bytes(n);
      size_t total = 0, send_total = 0;
      for (int k = 0; k < n; ++k) {
        send_bytes[k] = mine.send_rows[k] * mine.row_elems * elem;
        recv_bytes[k] = r.by_rank[k]->send_rows[me] * r.by_rank[k]->row_elems * elem;
        total += recv_bytes[k];
        send_total += send_bytes[k];
      }
      moved = total;
      void* out;
      const void* send = e->send;
      if (q.fixed) {
        out = e->recv;
        // Nothing to copy when this rank sends nothing (the buffers may then be null, and
        // scratch_ hands out none: memcpy of a null pointer is undefined even for 0 bytes).
        if (send_total > 0 && (PartialOverlap(send, out, total) || send == out)) {
          char* copy = scratch_.Get(1, send_total);
          std::memcpy(copy, send, send_total);
          send = copy;
        }
      } else {
        e->handle->output.resize(total);
        out = e->handle->output.data();
        e->handle->rows.assign(n, 0);
        for (int k = 0; k < n; ++k) e->handle->rows[k] = r.by_rank[k]->send_rows[me];
      }
      if (transport_) {
        st = Alltoallv(Context(), world_, send, send_bytes, out, recv_bytes);
      } else if (total > 0) {
        std::memmove(out, send, total);
      }
      break;
    }
    case Kind::kReduceScatter: {
      const size_t recvcount = q.count;
      moved = recvcount * elem * n;
      if (recvcount == 0) break;
      const bool average = q.op == RINGRUN_AVERAGE && n > 1;
      const void* send = e->send;
      ringrun_op op = q.op;
      if (average && q.dtype == RINGRUN_FLOAT16) {  // see ScaleHalf
        const size_t total = recvcount * static_cast<size_t>(n);
        uint16_t* scaled = reinterpret_cast<uint16_t*>(scratch_.Get(3, total * sizeof(uint16_t)));
        ScaleHalf(scaled, static_cast<const uint16_t*>(send), total, 1.0f / static_cast<float>(n));
        send = scaled, op = RINGRUN_SUM;
      }
      if (transport_) {
        st = runtime::ReduceScatter(Context(), world_, send, e->recv, recvcount, q.dtype,
                                    GetReduceFn(q.dtype, op));
      } else if (send != e->recv) {
        std::memmove(e->recv, send, recvcount * elem);
      }
      if (st.ok() && average && q.dtype != RINGRUN_FLOAT16) {
        DivideInPlace(e->recv, recvcount, q.dtype, n);
      }
      break;
    }
    case Kind::kAllreduce:
    case Kind::kJoin:
      break;
  }
  if (timeline_ && q.kind != Kind::kBarrier) {
    timeline_->Span(q.name,
                    std::string(KindName(q.kind)) == "broadcast" ? "BROADCAST"
                    : q.kind == Kind::kAllgather                 ? "ALLGATHER"
                    : q.kind == Kind::kAlltoall                  ? "ALLTOALL"
                                                                 : "REDUCESCATTER",
                    t0, Now(), "\"bytes\": " + std::to_string(moved));
  }
  return st;
}

Result<gpu::DeviceBackend*> Engine::Device() {
  if (device_) return device_.get();
  if (!device_error_.ok()) return device_error_;
  // The NCCL id is made now, at the first device collective, and travels over the CPU
  // transport: a CPU-only job never loads the CUDA driver for it.
  std::string id;
  if (options_.rank == 0) {
    if (options_.make_nccl_id) {
      id = options_.make_nccl_id();
    } else {
      id = gpu::MaybeCreateNcclUniqueId();
    }
  }
  if (transport_) {
    std::vector<char> buf(4 + 512, 0);
    uint32_t len = static_cast<uint32_t>(std::min<size_t>(id.size(), 512));
    std::memcpy(buf.data(), &len, 4);
    std::memcpy(buf.data() + 4, id.data(), len);
    RINGRUN_RETURN_IF_ERROR(runtime::Broadcast(Context(), world_, buf.data(), buf.size(), 0));
    std::memcpy(&len, buf.data(), 4);
    id.assign(buf.data() + 4, std::min<uint32_t>(len, 512));
  }
  Result<std::unique_ptr<gpu::DeviceBackend>> made =
      options_.make_device ? options_.make_device(id)
                           : gpu::MakeDeviceBackend(options_.rank, options_.size,
                                                    options_.local_rank, id, options_.timeout_ms);
  if (!made.ok()) {
    device_error_ = made.status().Annotate("GPU backend");
    return device_error_;
  }
  device_ = std::move(made.value());
  {
    std::lock_guard<std::mutex> lock(device_mu_);
    device_live_ = device_.get();
  }
  return device_.get();
}

void Engine::AbortDevice(const std::string& reason) {
  std::lock_guard<std::mutex> lock(device_mu_);
  if (device_abort_.empty()) device_abort_ = reason;
  // Only work in progress is aborted: an idle communicator is finalized cleanly at the end.
  if (device_busy_ && device_live_ != nullptr) device_live_->Abort(reason);
}

Status Engine::RecordReady(Entry& e) {
  const void* buffer = e.send != nullptr ? e.send : e.recv;
  Result<std::shared_ptr<void>> ready = options_.record_event
                                            ? options_.record_event(buffer, e.stream)
                                            : gpu::RecordDeviceEvent(buffer, e.stream);
  if (!ready.ok()) return ready.status();
  e.ready = std::move(ready.value());
  return Status::Ok();
}

Status Engine::RunDevice(Batch& b) {
  Result<gpu::DeviceBackend*> dev = Device();
  if (!dev.ok()) return dev.status();
  std::vector<DeviceItem> items;
  for (size_t i = 0; i < b.responses.size(); ++i) items.push_back({b.responses[i], b.locals[i]});
  {
    std::lock_guard<std::mutex> lock(device_mu_);
    if (!device_abort_.empty()) return Aborted(device_abort_);
    device_busy_ = true;
  }
  Status st = RunDeviceBatch({*dev, options_.rank, options_.size, timeline_.get(), clock_}, items);
  if (!st.ok()) {
    // This rank may have enqueued less of the batch than its peers (or more): its NCCL calls
    // are no longer in step with theirs, and its next one would pair with another batch of
    // theirs (NCCL matches calls by order). Abort the communicator: this rank's later device
    // work fails with this reason, and the peers' unmatched call ends at their deadline.
    AbortDevice("rank " + std::to_string(options_.rank) +
                ": an earlier device collective failed here: " + st.message());
  }
  std::lock_guard<std::mutex> lock(device_mu_);
  device_busy_ = false;
  return st;
}

inline void Engine::Complete(Entry* e, ringrun_status st, const std::string& message) {
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
  if (st != RINGRUN_OK && h->status == RINGRUN_OK) {
    h->status = st;
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
    std::lock_guard<Mutex> lock(mu_);
    for (Slot* s : finished_) ReleaseSlot(s);
  }
  finished_.clear();
  for (HandleState* h : completed_) {
    // Nobody sleeps on it (the usual case): done and let go in one read-modify-write.
    uint8_t v = h->flags.load(std::memory_order_relaxed);
    while (!(v & HandleState::kWaiting)) {
      if (h->flags.compare_exchange_weak(v, v | HandleState::kDone | HandleState::kEngineGone)) {
        break;
      }
    }
    if (!(v & HandleState::kWaiting)) {
      if (v & HandleState::kReleased) Recycle(h, false);
      continue;
    }
    h->flags.fetch_or(HandleState::kDone);
    // The waiter holds mu from setting kWaiting until it sleeps: once we have held it, the
    // waiter sleeps (and is woken below) or sees kDone. Notified after unlocking, a waiter
    // does not wake only to block on the mutex we hold. Our share keeps h alive meanwhile.
    { std::lock_guard<std::mutex> lock(h->mu); }
    h->cv.notify_all();
    EngineDone(h);
  }
  completed_.clear();
}

void Engine::FailAll(ringrun_status code, const Status& st) {
  // Every slot in flight belongs to the engine: queued, announced, or taken from the queue by
  // a round that did not announce it.
  std::vector<Slot*> pending;
  {
    std::lock_guard<Mutex> lock(mu_);
    if (failed_code_ == RINGRUN_OK) {
      failed_code_ = code;
      failed_message_ = st.message();
    }
    queue_.clear();
    for (Slot& s : slot_store_) {
      if (s.in_flight && s.handle) pending.push_back(&s);
    }
  }
  for (Slot* s : pending) Complete(s, code, st.message());
  NotifyCompleted();
}

}  // namespace ringrun::runtime::engine
