// The NCCL implementation of the DeviceBackend seam (built when RINGRUN_HAVE_NCCL).
#include "runtime/src/gpu/nccl_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "ringrun/common/clock.h"
#include "ringrun/common/defaults.h"
#include "ringrun/common/gpu_info.h"
#include "ringrun/common/thread_annotations.h"
#include "ringrun/names.h"
#include "runtime/src/gpu/nccl_mapping.h"

namespace ringrun::runtime::gpu {
namespace {

// The apis whose communicator could not be aborted in time (nccl_backend.h), with what was
// said then. Weak, so that a test's fake that is gone marks nothing.
struct HungAbort {
  std::weak_ptr<NcclApi> api;
  std::string why;
};
std::mutex g_hung_mu;
std::vector<HungAbort> g_hung;  // guarded by g_hung_mu

// What a hung abort on `api` said, or "" when none hung.
std::string HungAbortOn(const std::shared_ptr<NcclApi>& api) {
  std::lock_guard<std::mutex> lock(g_hung_mu);
  for (const HungAbort& h : g_hung) {
    if (h.api.lock() == api) return h.why;
  }
  return "";
}

// ncclCommAbort(comm) on a thread of its own, with the communicator's device current there;
// true when it returned within `limit`. Otherwise the thread is left to it (holding `api`) and
// `api` is marked with `why`.
bool AbortWithin(const std::shared_ptr<NcclApi>& api, ncclComm_t comm, int device,
                 std::chrono::milliseconds limit, const std::string& why) {
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto d = std::make_shared<Done>();
  std::thread([api, comm, device, d] {
    api->SetDevice(device);
    api->CommAbort(comm);
    std::lock_guard<std::mutex> lock(d->mu);
    d->done = true;
    d->cv.notify_all();
  }).detach();
  {
    std::unique_lock<std::mutex> lock(d->mu);
    if (d->cv.wait_for(lock, limit, [&] { return d->done; })) return true;
  }
  std::lock_guard<std::mutex> lock(g_hung_mu);
  g_hung.push_back(HungAbort{api, why});
  return false;
}

Code CodeForNccl(ncclResult_t r) {
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return Code::kInvalidArgument;
    case ncclRemoteError:
    case ncclSystemError:
      return Code::kUnavailable;
    default:
      return Code::kInternal;
  }
}

// Restores the calling thread's current device when a collective is done: the backend works on
// its own device without changing the program's view of which device is current.
class ScopedDevice {
 public:
  ScopedDevice(NcclApi& api, int device) : api_(api) {
    if (api_.GetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) status_ = api_.SetDevice(device);
  }
  ~ScopedDevice() {
    if (previous_ >= 0 && status_ == cudaSuccess) api_.SetDevice(previous_);
  }
  cudaError_t status() const { return status_; }

 private:
  NcclApi& api_;
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

class NcclBackend final : public DeviceBackend {
 public:
  NcclBackend(std::shared_ptr<NcclApi> api, const NcclBackendOptions& options, int device,
              int nccl_version, cudaStream_t stream, cudaEvent_t done)
      : api_(std::move(api)),
        rank_(options.rank),
        size_(options.size),
        device_(device),
        nccl_version_(nccl_version),
        timeout_(std::chrono::milliseconds(std::max(1, options.timeout_ms))),
        abort_timeout_(std::chrono::milliseconds(std::max(1, options.abort_timeout_ms))),
        poll_interval_(std::chrono::microseconds(std::max(1, options.poll_interval_us))),
        where_("rank " + std::to_string(options.rank) + "/" + std::to_string(options.size) +
               " (cuda:" + std::to_string(device) + ")"),
        own_stream_(stream),
        done_(done) {}

  ~NcclBackend() override {
    ncclComm_t comm = nullptr;
    {
      MutexLock lock(&mu_);
      comm = comm_;
      comm_ = nullptr;
    }
    if (comm != nullptr) {
      ScopedDevice on_device(*api_, device_);
      // Graceful first (flushes pending work, lets peers finish), abort if it does not end.
      bool clean = false;
      const ncclResult_t r = api_->CommFinalize(comm);
      if (r == ncclSuccess || r == ncclInProgress) {
        const auto deadline = std::chrono::steady_clock::now() +
                              std::min<std::chrono::milliseconds>(
                                  std::chrono::milliseconds(kNcclFinalizeTimeoutMs), timeout_);
        for (;;) {
          ncclResult_t async = ncclSuccess;
          if (api_->CommGetAsyncError(comm, &async) != ncclSuccess) break;
          if (async == ncclSuccess) {
            clean = true;
            break;
          }
          if (async != ncclInProgress || std::chrono::steady_clock::now() >= deadline) break;
          std::this_thread::sleep_for(poll_interval_);
        }
      }
      if (clean) {
        api_->CommDestroy(comm);
      } else if (!AbortComm(comm)) {
        return;  // the device is stuck: freeing on it could block as well, so nothing is freed
      }
    }
    if (abort_hung_) return;
    ScopedDevice on_device(*api_, device_);
    if (fusion_ != nullptr) api_->Free(fusion_);
    if (done_ != nullptr) api_->EventDestroy(done_);
    if (own_stream_ != nullptr) api_->StreamDestroy(own_stream_);
  }

  // Creates the communicator and waits for every rank to be part of it.
  Status Init(const ncclUniqueId& id) {
    ScopedDevice on_device(*api_, device_);
    if (on_device.status() != cudaSuccess) return CudaStatus("cudaSetDevice", on_device.status());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t r = api_->CommInitRankConfig(&comm, size_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      Status s = NcclStatus("NCCL init", r, comm);
      if (comm != nullptr && !AbortComm(comm)) {
        s = Status(s.code(), s.message() + "; " + AbortHungText());
      }
      return s;
    }
    {
      MutexLock lock(&mu_);
      comm_ = comm;
    }
    return Wait("NCCL init", std::chrono::steady_clock::now() + timeout_, /*event=*/nullptr);
  }

  Status WaitFor(const DeviceEvent& ready) override {
    if (!ready) return Status::Ok();
    return Cuda("cudaStreamWaitEvent", [&] {
      return api_->StreamWaitEvent(own_stream_, static_cast<cudaEvent_t>(ready.get()));
    });
  }

  Result<void*> FusionBuffer(size_t bytes) override {
    if (bytes <= fusion_bytes_) return fusion_;
    // Grows to the largest batch so far, in MiB steps: a handful of reallocations per job.
    constexpr size_t kStep = size_t{1} << 20;
    const size_t want = (bytes + kStep - 1) / kStep * kStep;
    if (fusion_ != nullptr) {
      // The old buffer may still be in use by enqueued work (an _on_stream batch): wait for the
      // stream within the deadline first (cudaFree would wait for the device without one).
      RINGRUN_RETURN_IF_ERROR(
          Cuda("cudaEventRecord", [&] { return api_->EventRecord(done_, own_stream_); }));
      {
        ScopedDevice on_device(*api_, device_);
        RINGRUN_RETURN_IF_ERROR(Wait("the device fusion buffer's last use",
                                     std::chrono::steady_clock::now() + timeout_, done_));
      }
      RINGRUN_RETURN_IF_ERROR(Cuda("cudaFree (device fusion buffer)", [&] {
        cudaError_t e = api_->Free(fusion_);
        fusion_ = nullptr, fusion_bytes_ = 0;
        return e;
      }));
    }
    void* p = nullptr;
    RINGRUN_RETURN_IF_ERROR(
        Cuda("cudaMalloc (device fusion buffer)", [&] { return api_->Malloc(&p, want); }));
    fusion_ = p, fusion_bytes_ = want;
    return fusion_;
  }

  Result<DeviceMemory> Allocate(size_t bytes) override {
    void* p = nullptr;
    RINGRUN_RETURN_IF_ERROR(Cuda("cudaMalloc", [&] { return api_->Malloc(&p, bytes); }));
    std::shared_ptr<NcclApi> api = api_;
    return DeviceMemory(p, [api](void* q) {
      if (q != nullptr) api->Free(q);
    });
  }

  Status Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return Status::Ok();
    return Cuda("cudaMemcpyAsync", [&] { return api_->MemcpyAsync(dst, src, bytes, own_stream_); });
  }

  Status Allreduce(const void* send, void* recv, size_t count, ringrun_dtype dtype, ringrun_op op,
                   double scale) override {
    Result<ncclDataType_t> t = ToNcclDataType(dtype, nccl_version_);
    if (!t.ok()) return t.status().Annotate(where_ + ": allreduce");
    if (scale == 1.0) {
      Result<ncclRedOp_t> o = OneRankSafeOp(op, dtype);
      if (!o.ok()) return o.status().Annotate(where_ + ": allreduce");
      return Collective("allreduce", count, [&](ncclComm_t comm, cudaStream_t s) {
        return api_->AllReduce(send, recv, count, *t, *o, comm, s);
      });
    }
    if (op != RINGRUN_SUM) {
      return InvalidArgument(where_ +
                             ": allreduce: a scale factor on device memory needs SUM, not " +
                             ringrun_op_name(op));
    }
    if (nccl_version_ < kNcclVersionWithPreMulSum) {
      return InvalidArgument(where_ +
                             ": allreduce: scale factors on device memory need NCCL >= 2.11 "
                             "(ncclRedOpCreatePreMulSum)");
    }
    unsigned char scalar[8];
    RINGRUN_RETURN_IF_ERROR(EncodeScalar(dtype, scale, scalar).Annotate(where_ + ": allreduce"));
    // One operator per call, destroyed once the collective is enqueued (NCCL allows it). Each
    // step is its own NCCL call on the non-blocking communicator, polled until NCCL took it.
    if (count == 0) return Status::Ok();
    ncclRedOp_t premul;
    RINGRUN_RETURN_IF_ERROR(
        Collective("ncclRedOpCreatePreMulSum", 1, [&](ncclComm_t comm, cudaStream_t) {
          return api_->RedOpCreatePreMulSum(&premul, scalar, *t, comm);
        }));
    // With one rank, NCCL's own kernel would leave the tail of some counts unwritten
    // (NcclOneRankPreMulSumSpan): the call is issued as pieces that it covers.
    const size_t elem = NcclTypeSize(*t);
    Status st;
    for (size_t done = 0; done < count && st.ok();) {
      const size_t n = size_ == 1 ? NcclOneRankPreMulSumSpan(count - done, elem) : count - done;
      const char* from = static_cast<const char*>(send) + done * elem;
      char* to = static_cast<char*>(recv) + done * elem;
      st = Collective("allreduce (premulsum)", n, [&](ncclComm_t comm, cudaStream_t s) {
        return api_->AllReduce(from, to, n, *t, premul, comm, s);
      });
      done += n;
    }
    MutexLock lock(&mu_);
    if (comm_ != nullptr) (void)api_->RedOpDestroy(premul, comm_);
    return st;
  }

  Status Broadcast(void* buf, size_t count, ringrun_dtype dtype, int root) override {
    Result<ncclDataType_t> t = ToNcclCopyType(dtype, nccl_version_);
    if (!t.ok()) return t.status().Annotate(where_ + ": broadcast");
    if (root < 0 || root >= size_) {
      return InvalidArgument(where_ + ": broadcast: root " + std::to_string(root) +
                             " is not a rank of a job of size " + std::to_string(size_));
    }
    return Collective("broadcast", count, [&](ncclComm_t comm, cudaStream_t s) {
      return api_->Broadcast(buf, buf, count, *t, root, comm, s);
    });
  }

  Status Allgatherv(const void* send, void* recv, const std::vector<size_t>& counts,
                    ringrun_dtype dtype) override {
    Result<ncclDataType_t> t = ToNcclCopyType(dtype, nccl_version_);
    if (!t.ok()) return t.status().Annotate(where_ + ": allgather");
    if (counts.size() != static_cast<size_t>(size_)) {
      return InvalidArgument(where_ + ": allgather: " + std::to_string(counts.size()) +
                             " counts for " + std::to_string(size_) + " ranks");
    }
    const bool equal =
        std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
    size_t total = 0;
    for (size_t c : counts) total += c;
    if (equal) {
      return Collective("allgather", total, [&](ncclComm_t comm, cudaStream_t s) {
        return api_->AllGather(send, recv, counts[0], *t, comm, s);
      });
    }
    const size_t elem = NcclTypeSize(*t);
    return Collective("allgather (send/recv)", total, [&](ncclComm_t comm, cudaStream_t s) {
      return Grouped([&]() -> ncclResult_t {
        size_t off = 0;
        for (int p = 0; p < size_; ++p) {
          if (counts[rank_] > 0) {
            ncclResult_t r = api_->Send(send, counts[rank_], *t, p, comm, s);
            if (r != ncclSuccess) return r;
          }
          if (counts[p] > 0) {
            ncclResult_t r =
                api_->Recv(static_cast<char*>(recv) + off * elem, counts[p], *t, p, comm, s);
            if (r != ncclSuccess) return r;
          }
          off += counts[p];
        }
        return ncclSuccess;
      });
    });
  }

  Status ReduceScatter(const void* send, void* recv, size_t recv_count, ringrun_dtype dtype,
                       ringrun_op op) override {
    Result<ncclDataType_t> t = ToNcclDataType(dtype, nccl_version_);
    if (!t.ok()) return t.status().Annotate(where_ + ": reducescatter");
    Result<ncclRedOp_t> o = OneRankSafeOp(op, dtype);
    if (!o.ok()) return o.status().Annotate(where_ + ": reducescatter");
    return Collective("reducescatter", recv_count, [&](ncclComm_t comm, cudaStream_t s) {
      return api_->ReduceScatter(send, recv, recv_count, *t, *o, comm, s);
    });
  }

  Status Alltoallv(const void* send, const std::vector<size_t>& send_counts, void* recv,
                   const std::vector<size_t>& recv_counts, ringrun_dtype dtype) override {
    Result<ncclDataType_t> t = ToNcclCopyType(dtype, nccl_version_);
    if (!t.ok()) return t.status().Annotate(where_ + ": alltoall");
    if (send_counts.size() != static_cast<size_t>(size_) ||
        recv_counts.size() != static_cast<size_t>(size_)) {
      return InvalidArgument(where_ + ": alltoall: needs one count per rank");
    }
    size_t total = 0;
    for (int p = 0; p < size_; ++p) total += send_counts[p] + recv_counts[p];
    const size_t elem = NcclTypeSize(*t);
    return Collective("alltoall", total, [&](ncclComm_t comm, cudaStream_t s) {
      return Grouped([&]() -> ncclResult_t {
        size_t send_off = 0, recv_off = 0;
        for (int p = 0; p < size_; ++p) {
          if (send_counts[p] > 0) {
            ncclResult_t r = api_->Send(static_cast<const char*>(send) + send_off * elem,
                                        send_counts[p], *t, p, comm, s);
            if (r != ncclSuccess) return r;
          }
          if (recv_counts[p] > 0) {
            ncclResult_t r = api_->Recv(static_cast<char*>(recv) + recv_off * elem, recv_counts[p],
                                        *t, p, comm, s);
            if (r != ncclSuccess) return r;
          }
          send_off += send_counts[p], recv_off += recv_counts[p];
        }
        return ncclSuccess;
      });
    });
  }

  Status Finish(const std::vector<void*>& streams, bool wait) override {
    RINGRUN_RETURN_IF_ERROR(Cuda("cudaEventRecord", [&] {
      cudaError_t e = api_->EventRecord(done_, own_stream_);
      for (size_t i = 0; i < streams.size() && e == cudaSuccess; ++i) {
        e = api_->StreamWaitEvent(static_cast<cudaStream_t>(streams[i]), done_);
      }
      return e;
    }));
    if (!wait) return Status::Ok();
    ScopedDevice on_device(*api_, device_);
    return Wait("device collectives", std::chrono::steady_clock::now() + timeout_, done_);
  }

  void Abort(const std::string& reason) override {
    MutexLock lock(&mu_);
    // Abort reports nothing itself: every later call returns this status.
    if (comm_ != nullptr) (void)BreakLocked(Aborted(where_ + ": aborted: " + reason));
  }

 private:
  // ncclGroupStart, `calls`, ncclGroupEnd (whose result is the group's: on a non-blocking
  // communicator, ncclInProgress until NCCL has taken every call).
  template <typename Calls>
  ncclResult_t Grouped(Calls calls) {
    ncclResult_t r = api_->GroupStart();
    if (r != ncclSuccess) return r;
    r = calls();
    const ncclResult_t end = api_->GroupEnd();
    return r != ncclSuccess ? r : end;
  }

  // A CUDA runtime call on the backend's device while the communicator is alive. A failure
  // is returned, not fatal to the communicator.
  template <typename Call>
  Status Cuda(const char* what, Call call) {
    MutexLock serial(&call_mu_);
    {
      MutexLock lock(&mu_);
      if (comm_ == nullptr) return broken_;
    }
    ScopedDevice on_device(*api_, device_);
    if (on_device.status() != cudaSuccess) {
      return CudaStatus(std::string(what) + ": cudaSetDevice", on_device.status());
    }
    cudaError_t e = call();
    if (e != cudaSuccess) return CudaStatus(what, e);
    return Status::Ok();
  }

  // NCCL's op for `op`; AVERAGE with one rank is SUM, which NCCL turns into a copy: NCCL's
  // one-rank AVERAGE on floating types runs the kernel that NcclOneRankPreMulSumSpan describes.
  Result<ncclRedOp_t> OneRankSafeOp(ringrun_op op, ringrun_dtype dtype) const {
    Result<ncclRedOp_t> o = ToNcclRedOp(op, dtype, nccl_version_);
    if (o.ok() && size_ == 1 && op == RINGRUN_AVERAGE) return ncclSum;
    return o;
  }

  // Enqueues one collective on the backend's stream and waits, within the timeout, for NCCL to
  // accept it (not for it to complete: Finish does that). Calls are serialized by call_mu_; mu_
  // is held only for the short non-blocking NCCL calls, so that Abort() from another thread
  // gets in between polls.
  template <typename Enqueue>
  Status Collective(const char* what, size_t count, Enqueue enqueue) {
    MutexLock serial(&call_mu_);
    {
      MutexLock lock(&mu_);
      if (comm_ == nullptr) return broken_;
    }
    if (count == 0) return Status::Ok();
    ScopedDevice on_device(*api_, device_);
    if (on_device.status() != cudaSuccess) {
      return CudaStatus(std::string(what) + ": cudaSetDevice", on_device.status());
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    {
      MutexLock lock(&mu_);
      if (comm_ == nullptr) return broken_;
      ncclResult_t r = enqueue(comm_, own_stream_);
      if (r == ncclInvalidArgument || r == ncclInvalidUsage) {
        // Rejected before any communication: the communicator is still good.
        return NcclStatus(what, r, comm_);
      }
      if (r != ncclSuccess && r != ncclInProgress) return BreakLocked(NcclStatus(what, r, comm_));
    }
    return Wait(what, deadline, nullptr);
  }

  // Polls until the communicator has nothing in progress and, with an `event`, the event has
  // completed. A timeout or an asynchronous error aborts the communicator.
  Status Wait(const char* what, Deadline deadline, cudaEvent_t event) {
    for (;;) {
      {
        MutexLock lock(&mu_);
        if (comm_ == nullptr) return broken_;
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = api_->CommGetAsyncError(comm_, &async);
        if (r != ncclSuccess) async = r;
        if (async != ncclSuccess && async != ncclInProgress) {
          return BreakLocked(NcclStatus(what, async, comm_));
        }
        if (async == ncclSuccess) {
          if (event == nullptr) return Status::Ok();
          cudaError_t e = api_->EventQuery(event);
          if (e == cudaSuccess) return Status::Ok();
          if (e != cudaErrorNotReady) return BreakLocked(CudaStatus(what, e));
        }
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        MutexLock lock(&mu_);
        if (comm_ == nullptr) return broken_;
        return BreakLocked(Timeout(where_ + ": " + what + " did not complete within " +
                                   std::to_string(timeout_.count()) +
                                   " ms (a peer is gone or stuck); communicator aborted"));
      }
      std::this_thread::sleep_for(poll_interval_);
    }
  }
  // Ends the communicator for good; every later call returns `why` (which says so when the
  // abort itself hung).
  Status BreakLocked(Status why) REQUIRES(mu_) {
    if (comm_ != nullptr) {
      if (!AbortComm(comm_)) why = Status(why.code(), why.message() + "; " + AbortHungText());
      comm_ = nullptr;
      broken_ = why;
    }
    return why;
  }

  // ncclCommAbort within abort_timeout_ (AbortWithin); false when it hung.
  bool AbortComm(ncclComm_t comm) {
    if (AbortWithin(api_, comm, device_, abort_timeout_, where_ + ": " + AbortHungText()))
      return true;
    abort_hung_ = true;
    return false;
  }
  std::string AbortHungText() const {
    return "ncclCommAbort did not return within " + std::to_string(abort_timeout_.count()) +
           " ms, the communicator could not be aborted (the GPU is left with work that hangs)";
  }

  Status NcclStatus(const std::string& what, ncclResult_t r, ncclComm_t comm) {
    std::string msg = where_ + ": " + what + ": " + api_->GetErrorString(r);
    const char* last = comm != nullptr ? api_->GetLastError(comm) : nullptr;
    if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
    return Status(CodeForNccl(r), msg);
  }

  Status CudaStatus(const std::string& what, cudaError_t e) {
    return Internal(where_ + ": " + what + ": " + api_->CudaErrorString(e) + " (cudaError " +
                    std::to_string(static_cast<int>(e)) + ")");
  }

  // Constant after construction.
  const std::shared_ptr<NcclApi> api_;
  const int rank_;
  const int size_;
  const int device_;
  const int nccl_version_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds abort_timeout_;
  const std::chrono::microseconds poll_interval_;
  const std::string where_;  // "rank 1/4 (cuda:1)", the prefix of every message
  const cudaStream_t own_stream_;
  const cudaEvent_t done_;  // the result event, recorded again by each Finish

  // The engine thread's own (the only caller of everything but Abort).
  void* fusion_ = nullptr;
  size_t fusion_bytes_ = 0;

  Mutex call_mu_;  // held for a whole call: one at a time on the communicator

  Mutex mu_;
  ncclComm_t comm_ GUARDED_BY(mu_) = nullptr;  // nullptr once aborted or destroyed
  Status broken_ GUARDED_BY(mu_);              // why comm_ was aborted
  std::atomic<bool> abort_hung_{false};        // an ncclCommAbort of ours never returned
};

// Why this machine cannot run CUDA, as an Unavailable status.
Status NoCudaStatus(NcclApi& api, cudaError_t e) {
  int driver = 0;
  if (api.DriverGetVersion(&driver) != cudaSuccess) driver = 0;
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  return Unavailable(
      DescribeCudaUnavailable(static_cast<int>(e), api.CudaErrorString(e), driver, runtime));
}

}  // namespace

Result<DeviceEvent> RecordNcclEvent(std::shared_ptr<NcclApi> api, const void* buffer,
                                    void* stream) {
  int device = 0;
  if (cudaError_t e = api->PointerGetDevice(buffer, &device); e != cudaSuccess) {
    return Internal(std::string("cudaPointerGetAttributes: ") + api->CudaErrorString(e));
  }
  ScopedDevice on_device(*api, device);
  if (on_device.status() != cudaSuccess) {
    return Internal("cudaSetDevice(" + std::to_string(device) +
                    "): " + api->CudaErrorString(on_device.status()));
  }
  cudaEvent_t event = nullptr;
  if (cudaError_t e = api->EventCreate(&event); e != cudaSuccess) {
    return Internal("cudaEventCreate on cuda:" + std::to_string(device) + ": " +
                    api->CudaErrorString(e));
  }
  if (cudaError_t e = api->EventRecord(event, static_cast<cudaStream_t>(stream));
      e != cudaSuccess) {
    api->EventDestroy(event);
    return Internal("cudaEventRecord on the caller's stream (cuda:" + std::to_string(device) +
                    "): " + api->CudaErrorString(e));
  }
  return DeviceEvent(event, [api](cudaEvent_t ev) { api->EventDestroy(ev); });
}

std::string CreateNcclUniqueId(NcclApi& api) {
  int count = 0;
  if (api.GetDeviceCount(&count) != cudaSuccess || count <= 0) return "";
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (api.GetUniqueId(&id) != ncclSuccess) return "";
  return std::string(id.internal, sizeof(id.internal));
}

Result<std::unique_ptr<DeviceBackend>> MakeNcclBackend(std::shared_ptr<NcclApi> api,
                                                       const NcclBackendOptions& options) {
  const std::string who =
      "rank " + std::to_string(options.rank) + "/" + std::to_string(options.size);
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size ||
      options.local_rank < 0) {
    return InvalidArgument(who + ": NCCL backend: bad rank/size/local rank (" +
                           std::to_string(options.local_rank) + ")");
  }
  int count = 0;
  cudaError_t e = api->GetDeviceCount(&count);
  if (e != cudaSuccess) return NoCudaStatus(*api, e).Annotate(who);
  if (count <= 0) return Unavailable(who + ": no CUDA device: cudaGetDeviceCount found none");

  if (std::string hung = HungAbortOn(api); !hung.empty()) {
    return Unavailable(who + ": NCCL cannot be used again in this process: " + hung);
  }
  int nccl_version = 0;
  if (api->GetVersion(&nccl_version) != ncclSuccess) nccl_version = 0;

  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (options.nccl_id.size() == sizeof(id.internal)) {
    std::memcpy(id.internal, options.nccl_id.data(), sizeof(id.internal));
  } else if (options.nccl_id.empty() && options.size == 1) {
    if (ncclResult_t r = api->GetUniqueId(&id); r != ncclSuccess) {
      return Internal(who + ": ncclGetUniqueId: " + api->GetErrorString(r));
    }
  } else if (options.nccl_id.empty()) {
    return Unavailable(who +
                       ": no NCCL unique id from rank 0 (rank 0's host has no usable GPU or "
                       "NCCL); device memory cannot be used in this job");
  } else {
    return InvalidArgument(who + ": NCCL unique id has " + std::to_string(options.nccl_id.size()) +
                           " bytes, expected " + std::to_string(sizeof(id.internal)));
  }

  // The program's choice wins; otherwise one device per local rank (ranks share devices
  // round-robin when there are more ranks than devices).
  int device = options.local_rank % count;
  if (api->ThreadHasCudaContext()) {
    int current = 0;
    if (api->GetDevice(&current) == cudaSuccess) device = current;
  }
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  {
    ScopedDevice on_device(*api, device);
    if (on_device.status() != cudaSuccess) {
      return Internal(who + ": cudaSetDevice(" + std::to_string(device) +
                      "): " + api->CudaErrorString(on_device.status()));
    }
    if (cudaError_t se = api->StreamCreateNonBlocking(&stream); se != cudaSuccess) {
      return Internal(who + ": cudaStreamCreate on cuda:" + std::to_string(device) + ": " +
                      api->CudaErrorString(se));
    }
    if (cudaError_t ee = api->EventCreate(&done); ee != cudaSuccess) {
      api->StreamDestroy(stream);
      return Internal(who + ": cudaEventCreate on cuda:" + std::to_string(device) + ": " +
                      api->CudaErrorString(ee));
    }
  }
  auto backend = std::make_unique<NcclBackend>(api, options, device, nccl_version, stream, done);
  RINGRUN_RETURN_IF_ERROR(backend->Init(id));
  return std::unique_ptr<DeviceBackend>(std::move(backend));
}

// The seam (device_backend.h).

bool IsDevicePointer(const void* p) {
  // No driver in the process: no CUDA memory can exist, and we must not initialize CUDA (that
  // would create a context on GPU 0 for every CPU-only rank).
  if (p == nullptr || !CudaDriverLoaded()) return false;
  cudaPointerAttributes attr;
  std::memset(&attr, 0, sizeof(attr));
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // clear the (non-sticky) error so that it does not leak to the program
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

std::string MaybeCreateNcclUniqueId() { return CreateNcclUniqueId(*MakeRealNcclApi()); }

Result<DeviceEvent> RecordDeviceEvent(const void* buffer, void* stream) {
  static const std::shared_ptr<NcclApi> api = MakeRealNcclApi();
  return RecordNcclEvent(api, buffer, stream);
}

Result<std::unique_ptr<DeviceBackend>> MakeDeviceBackend(int rank, int size, int local_rank,
                                                         const std::string& nccl_id,
                                                         int timeout_ms) {
  NcclBackendOptions options;
  options.rank = rank;
  options.size = size;
  options.local_rank = local_rank;
  options.nccl_id = nccl_id;
  options.timeout_ms = timeout_ms;
  return MakeNcclBackend(MakeRealNcclApi(), options);
}

}  // namespace ringrun::runtime::gpu
