#include "runtime/src/gpu/nccl_api.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstddef>
#include <cstring>

namespace ringrun::runtime::gpu {
namespace {

// The driver's cuCtxGetCurrent, without linking libcuda: CUresult (*)(CUcontext*).
using CuCtxGetCurrentFn = int (*)(void**);

class RealNcclApi final : public NcclApi {
 public:
  cudaError_t DriverGetVersion(int* version) override { return cudaDriverGetVersion(version); }
  cudaError_t GetDeviceCount(int* count) override { return cudaGetDeviceCount(count); }
  cudaError_t GetDevice(int* device) override { return cudaGetDevice(device); }
  cudaError_t SetDevice(int device) override { return cudaSetDevice(device); }
  bool ThreadHasCudaContext() override {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD | RTLD_LOCAL);
    if (lib == nullptr) return false;
    bool has = false;
    if (auto fn = reinterpret_cast<CuCtxGetCurrentFn>(dlsym(lib, "cuCtxGetCurrent"))) {
      void* ctx = nullptr;
      has = fn(&ctx) == 0 && ctx != nullptr;
    }
    dlclose(lib);
    return has;
  }
  cudaError_t StreamCreateNonBlocking(cudaStream_t* stream) override {
    return cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking);
  }
  cudaError_t StreamDestroy(cudaStream_t stream) override { return cudaStreamDestroy(stream); }
  cudaError_t StreamQuery(cudaStream_t stream) override { return cudaStreamQuery(stream); }
  cudaError_t StreamWaitEvent(cudaStream_t stream, cudaEvent_t event) override {
    return cudaStreamWaitEvent(stream, event, 0);
  }
  cudaError_t EventCreate(cudaEvent_t* event) override {
    return cudaEventCreateWithFlags(event, cudaEventDisableTiming);
  }
  cudaError_t EventRecord(cudaEvent_t event, cudaStream_t stream) override {
    return cudaEventRecord(event, stream);
  }
  cudaError_t EventQuery(cudaEvent_t event) override { return cudaEventQuery(event); }
  cudaError_t EventDestroy(cudaEvent_t event) override { return cudaEventDestroy(event); }
  cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaStream_t stream) override {
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
  }
  cudaError_t Malloc(void** p, size_t bytes) override { return cudaMalloc(p, bytes); }
  cudaError_t Free(void* p) override { return cudaFree(p); }
  cudaError_t PointerGetDevice(const void* p, int* device) override {
    cudaPointerAttributes attr;
    std::memset(&attr, 0, sizeof(attr));
    cudaError_t e = cudaPointerGetAttributes(&attr, p);
    if (e == cudaSuccess) *device = attr.device;
    return e;
  }
  const char* CudaErrorString(cudaError_t error) override { return cudaGetErrorString(error); }

  ncclResult_t GetVersion(int* version) override { return ncclGetVersion(version); }
  ncclResult_t GetUniqueId(ncclUniqueId* id) override { return ncclGetUniqueId(id); }
  ncclResult_t CommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                  ncclConfig_t* config) override {
    return ncclCommInitRankConfig(comm, nranks, id, rank, config);
  }
  ncclResult_t CommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) override {
    return ncclCommGetAsyncError(comm, async_error);
  }
  ncclResult_t CommFinalize(ncclComm_t comm) override { return ncclCommFinalize(comm); }
  ncclResult_t CommDestroy(ncclComm_t comm) override { return ncclCommDestroy(comm); }
  ncclResult_t CommAbort(ncclComm_t comm) override { return ncclCommAbort(comm); }
  ncclResult_t AllReduce(const void* send, void* recv, size_t count, ncclDataType_t dtype,
                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) override {
    return ncclAllReduce(send, recv, count, dtype, op, comm, stream);
  }
  ncclResult_t Broadcast(const void* send, void* recv, size_t count, ncclDataType_t dtype, int root,
                         ncclComm_t comm, cudaStream_t stream) override {
    return ncclBroadcast(send, recv, count, dtype, root, comm, stream);
  }
  ncclResult_t AllGather(const void* send, void* recv, size_t send_count, ncclDataType_t dtype,
                         ncclComm_t comm, cudaStream_t stream) override {
    return ncclAllGather(send, recv, send_count, dtype, comm, stream);
  }
  ncclResult_t ReduceScatter(const void* send, void* recv, size_t recv_count, ncclDataType_t dtype,
                             ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) override {
    return ncclReduceScatter(send, recv, recv_count, dtype, op, comm, stream);
  }
  ncclResult_t GroupStart() override { return ncclGroupStart(); }
  ncclResult_t GroupEnd() override { return ncclGroupEnd(); }
  ncclResult_t Send(const void* send, size_t count, ncclDataType_t dtype, int peer, ncclComm_t comm,
                    cudaStream_t stream) override {
    return ncclSend(send, count, dtype, peer, comm, stream);
  }
  ncclResult_t Recv(void* recv, size_t count, ncclDataType_t dtype, int peer, ncclComm_t comm,
                    cudaStream_t stream) override {
    return ncclRecv(recv, count, dtype, peer, comm, stream);
  }
  ncclResult_t RedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t dtype,
                                    ncclComm_t comm) override {
    return ncclRedOpCreatePreMulSum(op, scalar, dtype, ncclScalarHostImmediate, comm);
  }
  ncclResult_t RedOpDestroy(ncclRedOp_t op, ncclComm_t comm) override {
    return ncclRedOpDestroy(op, comm);
  }
  const char* GetErrorString(ncclResult_t result) override { return ncclGetErrorString(result); }
  const char* GetLastError(ncclComm_t comm) override { return ncclGetLastError(comm); }
};

}  // namespace

// One for the process: it is the process's CUDA and NCCL (a communicator that could not be
// aborted marks it, nccl_backend.h).
std::shared_ptr<NcclApi> MakeRealNcclApi() {
  static const std::shared_ptr<NcclApi> api = std::make_shared<RealNcclApi>();
  return api;
}

// Walks the loaded-object list (no file-system access: dlopen(RTLD_NOLOAD) of a library that is
// not loaded searches the library path, ~60 us, and this runs on every collective's buffers).
// The walk itself is skipped while the loader's load/unload counters are unchanged since the
// last one: the answer cannot have changed, and the check then costs a few nanoseconds.
bool CudaDriverLoaded() {
  struct Cache {
    unsigned long long adds = ~0ull, subs = ~0ull;
    bool loaded = false;
    const Cache* older = nullptr;  // keeps every snapshot reachable: a reader may still hold one
  };
  // Immutable snapshots, one per change of the loaded set (a handful per process), never freed.
  static std::atomic<const Cache*> published{nullptr};
  struct Walk {
    const Cache* last;
    Cache now;
    bool unchanged = false;
    bool first = true;
  } walk{published.load(std::memory_order_acquire), {}};
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t size, void* arg) -> int {
        auto* w = static_cast<Walk*>(arg);
        if (w->first) {
          w->first = false;
          if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
            w->now.adds = info->dlpi_adds;
            w->now.subs = info->dlpi_subs;
            if (w->last && w->last->adds == w->now.adds && w->last->subs == w->now.subs) {
              w->unchanged = true;
              return 1;
            }
          }
        }
        const char* name = info->dlpi_name;
        if (name != nullptr && std::strstr(name, "/libcuda.so") != nullptr) {
          w->now.loaded = true;
          return 1;
        }
        return 0;
      },
      &walk);
  if (walk.unchanged) return walk.last->loaded;
  if (walk.now.adds != ~0ull) {
    auto* snapshot = new Cache(walk.now);
    snapshot->older = walk.last;
    const Cache* expected = walk.last;
    // Another thread published first: its snapshot is as good, and no one has seen ours.
    if (!published.compare_exchange_strong(expected, snapshot, std::memory_order_acq_rel)) {
      delete snapshot;
    }
  }
  return walk.now.loaded;
}

}  // namespace ringrun::runtime::gpu
