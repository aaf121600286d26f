// A fake NcclApi for tests on machines without a GPU: one communicator per fake (one fake per
// simulated rank), scripted completion, and a record of what the backend asked for.
#pragma once

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/src/gpu/nccl_api.h"

namespace ringrun::runtime::testing {

class FakeNcclApi : public NcclApi {
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
    int enqueue_polls = 1;          // InProgress polls after each collective's enqueue
    int stream_polls = 2;           // NotReady answers of StreamQuery after each collective
    bool collective_hangs = false;  // the stream never drains
    ncclResult_t async_error = ncclSuccess;  // reported on the first poll after an enqueue
    ncclResult_t enqueue_result = ncclSuccess;
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
    int calls_after_end = 0;               // any call on the communicator after abort/destroy
    std::vector<std::string> collectives;  // "allreduce dtype=7 op=4 count=3"
  };

  FakeNcclApi() = default;
  explicit FakeNcclApi(Script script) : script_(script) {}

  Record record() {
    std::lock_guard<std::mutex> lock(mu_);
    return record_;
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
    std::lock_guard<std::mutex> lock(mu_);
    *device = script_.current_device;
    return cudaSuccess;
  }
  cudaError_t SetDevice(int device) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (device < 0 || device >= script_.device_count) return cudaErrorInvalidDevice;
    script_.current_device = device;
    record_.set_devices.push_back(device);
    return cudaSuccess;
  }
  bool ThreadHasCudaContext() override { return script_.thread_has_context; }
  cudaError_t StreamCreateNonBlocking(cudaStream_t* stream) override {
    *stream = reinterpret_cast<cudaStream_t>(&own_stream_);
    return cudaSuccess;
  }
  cudaError_t StreamDestroy(cudaStream_t) override { return cudaSuccess; }
  cudaError_t StreamQuery(cudaStream_t) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (script_.collective_hangs) return cudaErrorNotReady;
    if (stream_pending_ > 0) {
      --stream_pending_;
      return cudaErrorNotReady;
    }
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
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
    if (!Live(comm)) return ncclInvalidArgument;
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
    std::lock_guard<std::mutex> lock(mu_);
    if (!Live(comm)) return ncclInvalidArgument;
    ++record_.finalizes;
    return ncclSuccess;
  }
  ncclResult_t CommDestroy(ncclComm_t comm) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!Live(comm)) return ncclInvalidArgument;
    ++record_.destroys;
    comm_alive_ = false;
    return ncclSuccess;
  }
  ncclResult_t CommAbort(ncclComm_t comm) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!Live(comm)) return ncclInvalidArgument;
    ++record_.aborts;
    comm_alive_ = false;
    return ncclSuccess;
  }
  ncclResult_t AllReduce(const void*, void*, size_t count, ncclDataType_t dtype, ncclRedOp_t op,
                         ncclComm_t comm, cudaStream_t) override {
    return Enqueue(comm, "allreduce dtype=" + std::to_string(dtype) + " op=" + std::to_string(op) +
                             " count=" + std::to_string(count));
  }
  ncclResult_t Broadcast(const void*, void*, size_t count, ncclDataType_t dtype, int root,
                         ncclComm_t comm, cudaStream_t) override {
    return Enqueue(comm, "broadcast dtype=" + std::to_string(dtype) +
                             " root=" + std::to_string(root) + " count=" + std::to_string(count));
  }
  ncclResult_t AllGather(const void*, void*, size_t count, ncclDataType_t dtype, ncclComm_t comm,
                         cudaStream_t) override {
    return Enqueue(comm,
                   "allgather dtype=" + std::to_string(dtype) + " count=" + std::to_string(count));
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
  ncclComm_t Comm() { return reinterpret_cast<ncclComm_t>(&comm_storage_); }
  // Requires mu_.
  bool Live(ncclComm_t comm) {
    if (comm != Comm() || !comm_alive_) {
      ++record_.calls_after_end;
      return false;
    }
    return true;
  }
  ncclResult_t Enqueue(ncclComm_t comm, std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!Live(comm)) return ncclInvalidArgument;
    if (script_.enqueue_result != ncclSuccess) return script_.enqueue_result;
    record_.collectives.push_back(std::move(what));
    pending_ = script_.enqueue_polls;
    stream_pending_ = script_.stream_polls;
    async_pending_ = script_.async_error;
    return script_.enqueue_polls > 0 ? ncclInProgress : ncclSuccess;
  }

  std::mutex mu_;
  Script script_;                             // guarded by mu_ (mutable fields: current_device)
  Record record_;                             // guarded by mu_
  bool comm_alive_ = false;                   // guarded by mu_
  int pending_ = 0;                           // guarded by mu_: InProgress polls left; -1 forever
  int stream_pending_ = 0;                    // guarded by mu_
  ncclResult_t async_pending_ = ncclSuccess;  // guarded by mu_
  int comm_storage_ = 0;
  int own_stream_ = 0;
};

}  // namespace ringrun::runtime::testing
