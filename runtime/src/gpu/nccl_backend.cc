// The NCCL implementation of the DeviceBackend seam (built when RINGRUN_HAVE_NCCL).
#include "runtime/src/gpu/nccl_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "ringrun/common/defaults.h"
#include "ringrun/common/thread_annotations.h"
#include "runtime/src/gpu/nccl_mapping.h"

namespace ringrun::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// Finalizing a communicator waits for peers; at teardown we wait at most this long, then abort.

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
              int nccl_version, cudaStream_t stream)
      : api_(std::move(api)),
        rank_(options.rank),
        size_(options.size),
        device_(device),
        nccl_version_(nccl_version),
        timeout_(std::chrono::milliseconds(std::max(1, options.timeout_ms))),
        poll_interval_(std::chrono::microseconds(std::max(1, options.poll_interval_us))),
        where_("rank " + std::to_string(options.rank) + "/" + std::to_string(options.size) +
               " (cuda:" + std::to_string(device) + ")"),
        own_stream_(stream) {}

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
        const auto deadline =
            Clock::now() + std::min<std::chrono::milliseconds>(
                               std::chrono::milliseconds(kNcclFinalizeTimeoutMs), timeout_);
        for (;;) {
          ncclResult_t async = ncclSuccess;
          if (api_->CommGetAsyncError(comm, &async) != ncclSuccess) break;
          if (async == ncclSuccess) {
            clean = true;
            break;
          }
          if (async != ncclInProgress || Clock::now() >= deadline) break;
          std::this_thread::sleep_for(poll_interval_);
        }
      }
      if (clean) {
        api_->CommDestroy(comm);
      } else {
        api_->CommAbort(comm);
      }
    }
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
      if (comm != nullptr) api_->CommAbort(comm);
      return s;
    }
    {
      MutexLock lock(&mu_);
      comm_ = comm;
    }
    return Wait("NCCL init", Clock::now() + timeout_, /*stream=*/nullptr, /*wait_stream=*/false);
  }

  Status Allreduce(const void* send, void* recv, size_t count, ringrun_dtype dtype, ringrun_op op,
                   void* stream, bool sync) override {
    Result<ncclDataType_t> t = ToNcclDataType(dtype, nccl_version_);
    if (!t.ok()) return t.status().Annotate(where_ + ": allreduce");
    Result<ncclRedOp_t> o = ToNcclRedOp(op, dtype, nccl_version_);
    if (!o.ok()) return o.status().Annotate(where_ + ": allreduce");
    return Collective("allreduce", stream, sync, count, [&](ncclComm_t comm, cudaStream_t s) {
      return api_->AllReduce(send, recv, count, *t, *o, comm, s);
    });
  }

  Status Broadcast(void* buf, size_t count, ringrun_dtype dtype, int root, void* stream,
                   bool sync) override {
    Result<ncclDataType_t> t = ToNcclDataType(dtype, nccl_version_);
    if (!t.ok()) return t.status().Annotate(where_ + ": broadcast");
    if (root < 0 || root >= size_) {
      return InvalidArgument(where_ + ": broadcast: root " + std::to_string(root) +
                             " is not a rank of a job of size " + std::to_string(size_));
    }
    return Collective("broadcast", stream, sync, count, [&](ncclComm_t comm, cudaStream_t s) {
      return api_->Broadcast(buf, buf, count, *t, root, comm, s);
    });
  }

  Status Allgather(const void* send, void* recv, size_t count, ringrun_dtype dtype, void* stream,
                   bool sync) override {
    Result<ncclDataType_t> t = ToNcclDataType(dtype, nccl_version_);
    if (!t.ok()) return t.status().Annotate(where_ + ": allgather");
    return Collective("allgather", stream, sync, count, [&](ncclComm_t comm, cudaStream_t s) {
      return api_->AllGather(send, recv, count, *t, comm, s);
    });
  }

  void Abort(const std::string& reason) override {
    MutexLock lock(&mu_);
    // Abort reports nothing itself: every later call returns this status.
    if (comm_ != nullptr) (void)BreakLocked(Aborted(where_ + ": aborted: " + reason));
  }

 private:
  // Enqueues one collective, waits for NCCL to accept it and, when `sync`, for the stream to
  // drain, all within the timeout. Collectives are serialized by call_mu_; mu_ is held only for
  // the short non-blocking NCCL calls, so that Abort() from another thread gets in between polls.
  template <typename Enqueue>
  Status Collective(const char* what, void* user_stream, bool sync, size_t count, Enqueue enqueue) {
    std::lock_guard<std::mutex> serial(call_mu_);
    {
      MutexLock lock(&mu_);
      if (comm_ == nullptr) return broken_;
    }
    if (count == 0) return Status::Ok();
    ScopedDevice on_device(*api_, device_);
    if (on_device.status() != cudaSuccess) {
      return CudaStatus(std::string(what) + ": cudaSetDevice", on_device.status());
    }
    cudaStream_t stream =
        user_stream != nullptr ? static_cast<cudaStream_t>(user_stream) : own_stream_;
    const auto deadline = Clock::now() + timeout_;
    {
      MutexLock lock(&mu_);
      if (comm_ == nullptr) return broken_;
      ncclResult_t r = enqueue(comm_, stream);
      if (r == ncclInvalidArgument || r == ncclInvalidUsage) {
        // Rejected before any communication: the communicator is still good.
        return NcclStatus(what, r, comm_);
      }
      if (r != ncclSuccess && r != ncclInProgress) return BreakLocked(NcclStatus(what, r, comm_));
    }
    return Wait(what, deadline, stream, /*wait_stream=*/sync);
  }

  // Polls until the communicator has nothing in progress and, with `wait_stream`, `stream` is
  // idle. A timeout or an asynchronous error aborts the communicator.
  Status Wait(const char* what, Clock::time_point deadline, cudaStream_t stream, bool wait_stream) {
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
          if (!wait_stream) return Status::Ok();
          cudaError_t e = api_->StreamQuery(stream);
          if (e == cudaSuccess) return Status::Ok();
          if (e != cudaErrorNotReady) return BreakLocked(CudaStatus(what, e));
        }
      }
      if (Clock::now() >= deadline) {
        MutexLock lock(&mu_);
        if (comm_ == nullptr) return broken_;
        return BreakLocked(Timeout(where_ + ": " + what + " did not complete within " +
                                   std::to_string(timeout_.count()) +
                                   " ms (a peer is gone or stuck); communicator aborted"));
      }
      std::this_thread::sleep_for(poll_interval_);
    }
  }

  // Ends the communicator for good; every later call returns `why`.
  Status BreakLocked(Status why) REQUIRES(mu_) {
    if (comm_ != nullptr) {
      api_->CommAbort(comm_);
      comm_ = nullptr;
      broken_ = why;
    }
    return why;
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
  const std::chrono::microseconds poll_interval_;
  const std::string where_;  // "rank 1/4 (cuda:1)", the prefix of every message
  const cudaStream_t own_stream_;

  std::mutex call_mu_;  // held for a whole collective: one at a time on the communicator

  Mutex mu_;
  ncclComm_t comm_ GUARDED_BY(mu_) = nullptr;  // nullptr once aborted or destroyed
  Status broken_ GUARDED_BY(mu_);              // why comm_ was aborted
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
  }
  auto backend = std::make_unique<NcclBackend>(api, options, device, nccl_version, stream);
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

}  // namespace ringrun::runtime
