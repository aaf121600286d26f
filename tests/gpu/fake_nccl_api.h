// A fake NcclApi for tests on machines without a GPU.
//
// "Device memory" is host memory. A stream is a queue of operations that run in order: copies,
// event records and waits, host functions and gates that a test adds, and NCCL calls. A
// FakeGpuWorld joins the fakes of several ranks (ranks as threads): the k-th NCCL operation of
// every rank (a collective, or one ncclGroupStart..ncclGroupEnd of sends and receives) runs
// once every rank's stream has reached it, and moves and reduces bytes between the ranks'
// buffers as NCCL would, so tests check values. A fake without a world is a rank alone: its
// NCCL operations complete without moving data. Scripted delays, hangs and errors drive the
// backend's polling, deadlines and aborts; a record says what the backend asked for.
//
// Work advances only inside calls to the fake (every call runs what can run), as a GPU that
// progresses while the host polls.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "runtime/src/gpu/nccl_api.h"
#include "runtime/src/gpu/nccl_mapping.h"

namespace ringrun::runtime::gpu::testing {

class FakeNcclApi;

// Shared by the fakes of the ranks of one test job.
class FakeGpuWorld {
 public:
  explicit FakeGpuWorld(int size) : size_(size), ranks_(size, nullptr) {}
  int size() const { return size_; }

 private:
  friend class FakeNcclApi;
  // One NCCL operation as each rank issued it.
  struct Part {
    std::string kind;  // "allreduce", "broadcast", "allgather", "reducescatter", "group"
    const void* send = nullptr;
    void* recv = nullptr;
    size_t count = 0;
    ncclDataType_t dtype = ncclFloat32;
    int op = ncclSum;
    double scalar = 1.0;  // premulsum
    int root = 0;
    struct P2p {
      bool send;
      int peer;
      const void* sbuf;
      void* rbuf;
      size_t count;
    };
    std::vector<P2p> p2p;  // group
  };
  struct Match {
    std::vector<bool> arrived;
    std::vector<Part> parts;
    bool done = false;
  };
  std::mutex mu_;
  const int size_;
  std::vector<FakeNcclApi*> ranks_;    // guarded by mu_
  std::map<uint64_t, Match> matches_;  // guarded by mu_: by sequence number
};

class FakeNcclApi : public gpu::NcclApi {
 public:
  // Script (set before use).
  struct Script {
    cudaError_t device_count_error = cudaSuccess;
    int driver_version = 13000;
    int device_count = 2;
    bool thread_has_context = false;
    int current_device = 0;
    int nccl_version = 22809;
    unsigned char id_seed = 0;      // GetUniqueId fills byte i with (seed + 37 * i)
    int init_polls = 2;             // GetAsyncError answers InProgress this often after init
    bool init_hangs = false;        // ... or forever
    int enqueue_polls = 1;          // InProgress polls after each NCCL enqueue
    int stream_polls = 2;           // queries an NCCL operation takes once it can run
    bool collective_hangs = false;  // NCCL operations never complete
    ncclResult_t async_error = ncclSuccess;  // reported on the first poll after an enqueue
    ncclResult_t enqueue_result = ncclSuccess;
    int failing_malloc = 0;    // the n-th Malloc (1-based) fails with cudaErrorMemoryAllocation
    bool abort_hangs = false;  // CommAbort blocks until ReleaseHungAborts()
  };

  // What happened.
  struct Record {
    std::vector<int> set_devices;
    std::string init_id;  // the unique id's bytes given to CommInitRankConfig
    int init_rank = -1;
    int init_nranks = -1;
    int init_blocking = -1;  // config->blocking
    int aborts = 0;
    int destroys = 0;
    int finalizes = 0;
    int calls_after_end = 0;  // any call on the communicator after abort/destroy
    // NCCL calls in order: "allreduce dtype=7 op=4 count=3", "premulsum dtype=7 scalar=0.5",
    // "group start", "send dtype=7 peer=1 count=2", "recv ...", "group end", ...
    std::vector<std::string> collectives;
    int events_created = 0;
    int events_destroyed = 0;
    int mallocs = 0;
    int frees = 0;
    int copies = 0;
    // Every cudaStreamWaitEvent as "<stream>-><event>" with names from Name().
    std::vector<std::string> stream_waits;
  };

  FakeNcclApi() : FakeNcclApi(Script{}) {}
  explicit FakeNcclApi(Script script) : FakeNcclApi(script, nullptr, 0) {}
  // Rank `rank` of `world` (the world must outlive the fake).
  FakeNcclApi(Script script, std::shared_ptr<FakeGpuWorld> world, int rank)
      : script_(script),
        world_(world ? world : std::make_shared<FakeGpuWorld>(1)),
        solo_(world == nullptr),
        rank_(world == nullptr ? 0 : rank) {
    std::lock_guard<std::mutex> lock(world_->mu_);
    world_->ranks_[rank_] = this;
    default_stream_ = NewStreamLocked("default");
  }
  ~FakeNcclApi() override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    world_->ranks_[rank_] = nullptr;
  }

  // CommAborts that are hanging or have hung (Script::abort_hangs); ReleaseHungAborts lets them
  // (and later ones) return.
  int hung_aborts() {
    std::lock_guard<std::mutex> lock(hang_mu_);
    return hung_aborts_;
  }
  void ReleaseHungAborts() {
    std::lock_guard<std::mutex> lock(hang_mu_);
    hang_released_ = true;
    hang_cv_.notify_all();
  }
  Record record() {
    std::lock_guard<std::mutex> lock(world_->mu_);
    return record_;
  }

  // Test controls. A stream of nullptr is this rank's legacy default stream.
  // Adds fn to `stream` (as a kernel would run): called, under the fake's lock, when reached.
  void EnqueueHostFn(cudaStream_t stream, std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(world_->mu_);
    Op op;
    op.kind = Op::kHostFn;
    op.fn = std::move(fn);
    StreamOf(stream)->ops.push_back(std::move(op));
    ProgressLocked(false);
  }
  // Adds a gate to `stream`: later work waits until OpenGate(id).
  int EnqueueGate(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(world_->mu_);
    Op op;
    op.kind = Op::kGate;
    op.gate = next_gate_++;
    gates_[op.gate] = false;
    StreamOf(stream)->ops.push_back(std::move(op));
    return op.gate;
  }
  void OpenGate(int id) {
    std::lock_guard<std::mutex> lock(world_->mu_);
    gates_[id] = true;
    ProgressLocked(false);
  }
  // The name of a stream or event for Record::stream_waits: "default", "s1" (streams in order
  // of creation), "e3" (events likewise).
  std::string Name(const void* stream_or_event) {
    std::lock_guard<std::mutex> lock(world_->mu_);
    if (stream_or_event == nullptr) return "default";
    for (auto& s : streams_) {
      if (s.get() == stream_or_event) return s->name;
    }
    for (auto& e : events_) {
      if (e.get() == stream_or_event) return "e" + std::to_string(e->id);
    }
    return "?";
  }
  // Whether `p` is memory that Malloc returned (and not yet freed).
  bool IsAllocated(const void* p) {
    std::lock_guard<std::mutex> lock(world_->mu_);
    for (const auto& [base, bytes] : allocations_) {
      const char* b = static_cast<const char*>(base);
      if (p >= b && p < b + bytes) return true;
    }
    return false;
  }
  size_t live_allocations() {
    std::lock_guard<std::mutex> lock(world_->mu_);
    return allocations_.size();
  }

  cudaError_t DriverGetVersion(int* version) override {
    *version = script_.driver_version;
    return cudaSuccess;
  }
  cudaError_t GetDeviceCount(int* count) override {
    if (script_.device_count_error != cudaSuccess) return script_.device_count_error;
    *count = script_.device_count;
    return cudaSuccess;
  }
  cudaError_t GetDevice(int* device) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    *device = script_.current_device;
    return cudaSuccess;
  }
  cudaError_t SetDevice(int device) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    if (device < 0 || device >= script_.device_count) return cudaErrorInvalidDevice;
    script_.current_device = device;
    record_.set_devices.push_back(device);
    return cudaSuccess;
  }
  bool ThreadHasCudaContext() override { return script_.thread_has_context; }
  cudaError_t StreamCreateNonBlocking(cudaStream_t* stream) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    *stream =
        reinterpret_cast<cudaStream_t>(NewStreamLocked("s" + std::to_string(streams_.size())));
    return cudaSuccess;
  }
  cudaError_t StreamDestroy(cudaStream_t) override { return cudaSuccess; }
  cudaError_t StreamQuery(cudaStream_t stream) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    ProgressLocked(true);
    return StreamOf(stream)->ops.empty() ? cudaSuccess : cudaErrorNotReady;
  }
  cudaError_t StreamWaitEvent(cudaStream_t stream, cudaEvent_t event) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    Event* e = reinterpret_cast<Event*>(event);
    Stream* s = StreamOf(stream);
    record_.stream_waits.push_back(s->name + "->e" + std::to_string(e->id));
    Op op;
    op.kind = Op::kWait;
    op.event = e;
    op.generation = e->recorded;
    s->ops.push_back(std::move(op));
    ProgressLocked(false);
    return cudaSuccess;
  }
  cudaError_t EventCreate(cudaEvent_t* event) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    events_.push_back(std::make_unique<Event>());
    events_.back()->id = ++record_.events_created;
    *event = reinterpret_cast<cudaEvent_t>(events_.back().get());
    return cudaSuccess;
  }
  cudaError_t EventRecord(cudaEvent_t event, cudaStream_t stream) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    Event* e = reinterpret_cast<Event*>(event);
    if (e->destroyed) return cudaErrorInvalidResourceHandle;
    Op op;
    op.kind = Op::kRecord;
    op.event = e;
    op.generation = ++e->recorded;
    StreamOf(stream)->ops.push_back(std::move(op));
    ProgressLocked(false);
    return cudaSuccess;
  }
  cudaError_t EventQuery(cudaEvent_t event) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    ProgressLocked(true);
    Event* e = reinterpret_cast<Event*>(event);
    return e->reached >= e->recorded ? cudaSuccess : cudaErrorNotReady;
  }
  cudaError_t EventDestroy(cudaEvent_t event) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    reinterpret_cast<Event*>(event)->destroyed = true;  // kept: pending waits may name it
    ++record_.events_destroyed;
    return cudaSuccess;
  }
  cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaStream_t stream) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    ++record_.copies;
    Op op;
    op.kind = Op::kCopy;
    op.dst = dst, op.src = src, op.bytes = bytes;
    StreamOf(stream)->ops.push_back(std::move(op));
    ProgressLocked(false);
    return cudaSuccess;
  }
  cudaError_t Malloc(void** p, size_t bytes) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    if (++record_.mallocs == script_.failing_malloc) return cudaErrorMemoryAllocation;
    *p = ::operator new(bytes == 0 ? 1 : bytes);
    allocations_[*p] = bytes;
    return cudaSuccess;
  }
  cudaError_t Free(void* p) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    if (allocations_.erase(p) == 0) return cudaErrorInvalidValue;
    ++record_.frees;
    ::operator delete(p);
    return cudaSuccess;
  }
  cudaError_t PointerGetDevice(const void*, int* device) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    *device = script_.current_device;
    return cudaSuccess;
  }
  const char* CudaErrorString(cudaError_t e) override {
    switch (e) {
      case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient for CUDA runtime version";
      case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
      default:
        return "fake CUDA error";
    }
  }

  ncclResult_t GetVersion(int* version) override {
    *version = script_.nccl_version;
    return ncclSuccess;
  }
  ncclResult_t GetUniqueId(ncclUniqueId* id) override {
    for (size_t i = 0; i < sizeof(id->internal); ++i) {
      id->internal[i] = static_cast<char>(script_.id_seed + 37 * i);
    }
    return ncclSuccess;
  }
  ncclResult_t CommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                  ncclConfig_t* config) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    record_.init_id.assign(id.internal, sizeof(id.internal));
    record_.init_rank = rank;
    record_.init_nranks = nranks;
    record_.init_blocking = config != nullptr ? config->blocking : -1;
    comm_alive_ = true;
    pending_ = script_.init_hangs ? -1 : script_.init_polls;
    *comm = Comm();
    return ncclInProgress;
  }
  ncclResult_t CommGetAsyncError(ncclComm_t comm, ncclResult_t* async) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    if (!Live(comm)) return ncclInvalidArgument;
    ProgressLocked(false);
    if (async_pending_ != ncclSuccess) {
      *async = async_pending_;
      return ncclSuccess;
    }
    if (pending_ < 0) {
      *async = ncclInProgress;
    } else if (pending_ > 0) {
      --pending_;
      *async = ncclInProgress;
    } else {
      *async = ncclSuccess;
    }
    return ncclSuccess;
  }
  ncclResult_t CommFinalize(ncclComm_t comm) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    if (!Live(comm)) return ncclInvalidArgument;
    ++record_.finalizes;
    return ncclSuccess;
  }
  ncclResult_t CommDestroy(ncclComm_t comm) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    if (!Live(comm)) return ncclInvalidArgument;
    ++record_.destroys;
    comm_alive_ = false;
    return ncclSuccess;
  }
  ncclResult_t CommAbort(ncclComm_t comm) override {
    if (script_.abort_hangs) {
      std::unique_lock<std::mutex> hang(hang_mu_);
      ++hung_aborts_;
      hang_cv_.wait(hang, [&] { return hang_released_; });
    }
    std::lock_guard<std::mutex> lock(world_->mu_);
    if (!Live(comm)) return ncclInvalidArgument;
    ++record_.aborts;
    comm_alive_ = false;
    // As ncclCommAbort ends the communicator's kernels: its pending operations end undone.
    for (auto& s : streams_) {
      for (Op& op : s->ops) {
        if (op.kind == Op::kNccl) op.aborted = true;
      }
    }
    ProgressLocked(false);
    return ncclSuccess;
  }
  ncclResult_t AllReduce(const void* send, void* recv, size_t count, ncclDataType_t dtype,
                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    FakeGpuWorld::Part p;
    p.kind = "allreduce", p.send = send, p.recv = recv, p.count = count, p.dtype = dtype;
    p.op = op;
    auto it = premul_.find(static_cast<int>(op));
    if (it != premul_.end()) p.scalar = it->second;
    return EnqueueLocked(comm, stream, std::move(p),
                         "allreduce dtype=" + std::to_string(dtype) +
                             " op=" + (it != premul_.end() ? "premulsum" : std::to_string(op)) +
                             " count=" + std::to_string(count));
  }
  ncclResult_t Broadcast(const void* send, void* recv, size_t count, ncclDataType_t dtype, int root,
                         ncclComm_t comm, cudaStream_t stream) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    FakeGpuWorld::Part p;
    p.kind = "broadcast", p.send = send, p.recv = recv, p.count = count, p.dtype = dtype;
    p.root = root;
    return EnqueueLocked(comm, stream, std::move(p),
                         "broadcast dtype=" + std::to_string(dtype) +
                             " root=" + std::to_string(root) + " count=" + std::to_string(count));
  }
  ncclResult_t AllGather(const void* send, void* recv, size_t count, ncclDataType_t dtype,
                         ncclComm_t comm, cudaStream_t stream) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    FakeGpuWorld::Part p;
    p.kind = "allgather", p.send = send, p.recv = recv, p.count = count, p.dtype = dtype;
    return EnqueueLocked(
        comm, stream, std::move(p),
        "allgather dtype=" + std::to_string(dtype) + " count=" + std::to_string(count));
  }
  ncclResult_t ReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t dtype,
                             ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    FakeGpuWorld::Part p;
    p.kind = "reducescatter", p.send = send, p.recv = recv, p.count = count, p.dtype = dtype;
    p.op = op;
    return EnqueueLocked(comm, stream, std::move(p),
                         "reducescatter dtype=" + std::to_string(dtype) +
                             " op=" + std::to_string(op) + " count=" + std::to_string(count));
  }
  ncclResult_t GroupStart() override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    record_.collectives.push_back("group start");
    in_group_ = true;
    group_ = FakeGpuWorld::Part();
    group_.kind = "group";
    group_stream_ = nullptr;
    return ncclSuccess;
  }
  ncclResult_t GroupEnd() override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    in_group_ = false;
    if (group_.p2p.empty()) {
      record_.collectives.push_back("group end");
      return ncclSuccess;
    }
    return EnqueueLocked(Comm(), group_stream_, std::move(group_), "group end");
  }
  ncclResult_t Send(const void* send, size_t count, ncclDataType_t dtype, int peer, ncclComm_t comm,
                    cudaStream_t stream) override {
    return P2p(true, send, nullptr, count, dtype, peer, comm, stream);
  }
  ncclResult_t Recv(void* recv, size_t count, ncclDataType_t dtype, int peer, ncclComm_t comm,
                    cudaStream_t stream) override {
    return P2p(false, nullptr, recv, count, dtype, peer, comm, stream);
  }
  ncclResult_t RedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t dtype,
                                    ncclComm_t comm) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    if (!Live(comm)) return ncclInvalidArgument;
    const double v = Load(dtype, scalar);
    const int id = static_cast<int>(ncclNumOps) + next_op_++;
    premul_[id] = v;
    *op = static_cast<ncclRedOp_t>(id);
    char text[64];
    std::snprintf(text, sizeof(text), "%g", v);
    record_.collectives.push_back("premulsum dtype=" + std::to_string(dtype) + " scalar=" + text);
    return ncclSuccess;
  }
  ncclResult_t RedOpDestroy(ncclRedOp_t op, ncclComm_t comm) override {
    std::lock_guard<std::mutex> lock(world_->mu_);
    if (!Live(comm)) return ncclInvalidArgument;
    return premul_.erase(static_cast<int>(op)) ? ncclSuccess : ncclInvalidArgument;
  }
  const char* GetErrorString(ncclResult_t r) override {
    switch (r) {
      case ncclRemoteError:
        return "remote process exited or there was a network error";
      case ncclSystemError:
        return "unhandled system error";
      case ncclInvalidArgument:
        return "invalid argument";
      default:
        return "fake NCCL error";
    }
  }
  const char* GetLastError(ncclComm_t) override { return "fake last error"; }

 private:
  struct Event {
    int id = 0;
    uint64_t recorded = 0;  // records enqueued
    uint64_t reached = 0;   // records that their stream has reached
    bool destroyed = false;
  };
  struct Op {
    enum Kind { kCopy, kRecord, kWait, kHostFn, kGate, kNccl } kind = kCopy;
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
    Event* event = nullptr;
    uint64_t generation = 0;
    std::function<void()> fn;
    int gate = 0;
    uint64_t seq = 0;  // kNccl: the world's sequence number
    int polls = 0;     // kNccl: queries left once it could run
    bool aborted = false;
  };
  struct Stream {
    std::string name;
    std::deque<Op> ops;
  };

  ncclComm_t Comm() { return reinterpret_cast<ncclComm_t>(&comm_storage_); }
  Stream* NewStreamLocked(std::string name) {
    streams_.push_back(std::make_unique<Stream>());
    streams_.back()->name = std::move(name);
    return streams_.back().get();
  }
  Stream* StreamOf(cudaStream_t s) {
    return s == nullptr ? default_stream_ : reinterpret_cast<Stream*>(s);
  }
  // Requires the world's lock.
  bool Live(ncclComm_t comm) {
    if (comm != Comm() || !comm_alive_) {
      ++record_.calls_after_end;
      return false;
    }
    return true;
  }

  ncclResult_t P2p(bool is_send, const void* sbuf, void* rbuf, size_t count, ncclDataType_t dtype,
                   int peer, ncclComm_t comm, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(world_->mu_);
    if (!Live(comm)) return ncclInvalidArgument;
    if (!in_group_) return ncclInvalidUsage;  // the backend always groups them
    record_.collectives.push_back(
        std::string(is_send ? "send" : "recv") + " dtype=" + std::to_string(dtype) +
        " peer=" + std::to_string(peer) + " count=" + std::to_string(count));
    group_.dtype = dtype;
    group_stream_ = stream;
    group_.p2p.push_back({is_send, peer, sbuf, rbuf, count});
    return ncclSuccess;
  }

  ncclResult_t EnqueueLocked(ncclComm_t comm, cudaStream_t stream, FakeGpuWorld::Part part,
                             std::string what) {
    if (!Live(comm)) return ncclInvalidArgument;
    if (script_.enqueue_result != ncclSuccess) return script_.enqueue_result;
    record_.collectives.push_back(std::move(what));
    Op op;
    op.kind = Op::kNccl;
    op.seq = seq_++;
    op.polls = script_.stream_polls;
    if (!solo_) {
      FakeGpuWorld::Match& m = world_->matches_[op.seq];
      m.arrived.resize(world_->size_, false);
      m.parts.resize(world_->size_);
      m.parts[rank_] = std::move(part);
    }
    StreamOf(stream)->ops.push_back(std::move(op));
    pending_ = script_.enqueue_polls;
    async_pending_ = script_.async_error;
    ProgressLocked(false);
    return script_.enqueue_polls > 0 ? ncclInProgress : ncclSuccess;
  }

  // Runs what can run on every rank's streams. `poll`: a query, which counts down the
  // scripted completion delay of NCCL operations.
  void ProgressLocked(bool poll) {
    for (bool changed = true; changed;) {
      changed = false;
      for (FakeNcclApi* r : world_->ranks_) {
        if (r != nullptr) changed |= r->RunStreamsLocked(poll && r == this);
      }
      poll = false;
    }
  }

  bool RunStreamsLocked(bool poll) {
    bool changed = false;
    for (auto& s : streams_) {
      while (!s->ops.empty()) {
        Op& op = s->ops.front();
        if (!RunLocked(op, poll)) break;
        s->ops.pop_front();
        changed = true;
      }
    }
    return changed;
  }

  // Whether `op` is done (running it if it can run now).
  bool RunLocked(Op& op, bool poll) {
    switch (op.kind) {
      case Op::kCopy:
        std::memmove(op.dst, op.src, op.bytes);
        return true;
      case Op::kRecord:
        op.event->reached = std::max(op.event->reached, op.generation);
        return true;
      case Op::kWait:
        return op.event->reached >= op.generation;
      case Op::kHostFn:
        op.fn();
        return true;
      case Op::kGate:
        return gates_[op.gate];
      case Op::kNccl: {
        if (op.aborted) return true;
        if (!solo_) {
          FakeGpuWorld::Match& m = world_->matches_[op.seq];
          m.arrived[rank_] = true;
          if (!m.done) {
            for (bool a : m.arrived) {
              if (!a) return false;
            }
            Execute(m.parts);
            m.done = true;
          }
        }
        if (script_.collective_hangs) return false;
        if (op.polls > 0) {
          if (poll) --op.polls;
          return false;
        }
        return true;
      }
    }
    return true;
  }

  static double Load(ncclDataType_t t, const void* p) {
    switch (t) {
      case ncclInt8:
        return *static_cast<const int8_t*>(p);
      case ncclUint8:
        return *static_cast<const uint8_t*>(p);
      case ncclInt32:
        return *static_cast<const int32_t*>(p);
      case ncclInt64:
        return static_cast<double>(*static_cast<const int64_t*>(p));
      case ncclFloat32:
        return *static_cast<const float*>(p);
      case ncclFloat64:
        return *static_cast<const double*>(p);
      case ncclBfloat16: {
        uint32_t x = static_cast<uint32_t>(*static_cast<const uint16_t*>(p)) << 16;
        float f;
        std::memcpy(&f, &x, 4);
        return f;
      }
      default:
        return 0;  // float16 is not simulated
    }
  }
  static void Store(ncclDataType_t t, double v, void* p) {
    switch (t) {
      case ncclInt8:
        *static_cast<int8_t*>(p) = static_cast<int8_t>(v);
        break;
      case ncclUint8:
        *static_cast<uint8_t*>(p) = static_cast<uint8_t>(v);
        break;
      case ncclInt32:
        *static_cast<int32_t*>(p) = static_cast<int32_t>(v);
        break;
      case ncclInt64:
        *static_cast<int64_t*>(p) = static_cast<int64_t>(v);
        break;
      case ncclFloat32:
        *static_cast<float*>(p) = static_cast<float>(v);
        break;
      case ncclFloat64:
        *static_cast<double*>(p) = v;
        break;
      default:
        break;
    }
  }

  // Runs one matched NCCL operation over every rank's buffers: every output is computed from
  // the inputs first, then written (in place is then right).
  static void Execute(const std::vector<FakeGpuWorld::Part>& parts) {
    const int n = static_cast<int>(parts.size());
    const FakeGpuWorld::Part& p0 = parts[0];
    const size_t elem = NcclTypeSize(p0.dtype);
    std::vector<std::pair<void*, std::vector<char>>> writes;
    auto reduce = [&](size_t count, const std::function<const char*(int)>& input, int op,
                      double scalar) {
      std::vector<char> out(count * elem);
      for (size_t i = 0; i < count; ++i) {
        double acc = 0;
        for (int r = 0; r < n; ++r) {
          double v = Load(p0.dtype, input(r) + i * elem);
          if (op >= static_cast<int>(ncclNumOps)) v *= scalar;
          if (r == 0) {
            acc = v;
          } else if (op == ncclProd) {
            acc *= v;
          } else if (op == ncclMin) {
            acc = std::min(acc, v);
          } else if (op == ncclMax) {
            acc = std::max(acc, v);
          } else {
            acc += v;
          }
        }
        if (op == ncclAvg) acc /= n;
        Store(p0.dtype, acc, out.data() + i * elem);
      }
      return out;
    };
    if (p0.kind == "allreduce") {
      std::vector<char> out = reduce(
          p0.count, [&](int r) { return static_cast<const char*>(parts[r].send); }, p0.op,
          p0.scalar);
      for (int r = 0; r < n; ++r) writes.push_back({parts[r].recv, out});
    } else if (p0.kind == "reducescatter") {
      for (int r = 0; r < n; ++r) {
        writes.push_back({parts[r].recv, reduce(
                                             p0.count,
                                             [&](int k) {
                                               return static_cast<const char*>(parts[k].send) +
                                                      r * p0.count * elem;
                                             },
                                             p0.op, 1.0)});
      }
    } else if (p0.kind == "broadcast") {
      const FakeGpuWorld::Part& root = parts[p0.root];
      const char* src = static_cast<const char*>(root.send);
      std::vector<char> data(src, src + p0.count * elem);
      for (int r = 0; r < n; ++r) writes.push_back({parts[r].recv, data});
    } else if (p0.kind == "allgather") {
      std::vector<char> all;
      for (int r = 0; r < n; ++r) {
        const char* src = static_cast<const char*>(parts[r].send);
        all.insert(all.end(), src, src + p0.count * elem);
      }
      for (int r = 0; r < n; ++r) writes.push_back({parts[r].recv, all});
    } else if (p0.kind == "group") {
      // The i-th send from a to b meets the i-th receive on b from a.
      for (int b = 0; b < n; ++b) {
        std::map<int, int> taken;
        for (const auto& rv : parts[b].p2p) {
          if (rv.send) continue;
          int seen = 0;
          for (const auto& sd : parts[rv.peer].p2p) {
            if (!sd.send || sd.peer != b) continue;
            if (seen++ == taken[rv.peer]) {
              const size_t c = std::min(sd.count, rv.count) * NcclTypeSize(parts[rv.peer].dtype);
              const char* src = static_cast<const char*>(sd.sbuf);
              writes.push_back({rv.rbuf, std::vector<char>(src, src + c)});
              break;
            }
          }
          ++taken[rv.peer];
        }
      }
    }
    for (auto& [dst, bytes] : writes) {
      if (!bytes.empty()) std::memcpy(dst, bytes.data(), bytes.size());
    }
  }

  Script script_;       // guarded by the world's lock (mutable fields: current_device)
  std::mutex hang_mu_;  // a hanging CommAbort (Script::abort_hangs) waits on hang_cv_
  std::condition_variable hang_cv_;
  int hung_aborts_ = 0;         // guarded by hang_mu_
  bool hang_released_ = false;  // guarded by hang_mu_
  const std::shared_ptr<FakeGpuWorld> world_;
  const bool solo_;
  const int rank_;
  // Guarded by the world's lock.
  Record record_;
  bool comm_alive_ = false;
  int pending_ = 0;  // InProgress polls left; -1 forever
  ncclResult_t async_pending_ = ncclSuccess;
  uint64_t seq_ = 0;
  std::vector<std::unique_ptr<Stream>> streams_;
  Stream* default_stream_ = nullptr;
  std::vector<std::unique_ptr<Event>> events_;
  std::map<int, bool> gates_;
  int next_gate_ = 1;
  std::map<int, double> premul_;
  int next_op_ = 0;
  std::map<void*, size_t> allocations_;
  bool in_group_ = false;
  FakeGpuWorld::Part group_;
  cudaStream_t group_stream_ = nullptr;
  int comm_storage_ = 0;
};

}  // namespace ringrun::runtime::gpu::testing
