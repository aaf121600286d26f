// NcclApi: the CUDA runtime and NCCL calls the NCCL backend makes, behind one small interface,
// so that the backend's logic (device choice, the non-blocking init and collective polling,
// deadlines, aborts, the unique-id bootstrap) is tested with a fake on machines without a GPU.
//
// The methods mirror the C functions of the same name one to one and return their result codes;
// the backend turns codes into Status. Implementations must be thread-safe in the way the C
// functions are (the backend never calls two methods on one communicator at once).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>

namespace ringrun::runtime::gpu {

class NcclApi {
 public:
  virtual ~NcclApi() = default;

  // CUDA runtime.
  virtual cudaError_t DriverGetVersion(int* version) = 0;  // 0 when no driver is installed
  virtual cudaError_t GetDeviceCount(int* count) = 0;
  virtual cudaError_t GetDevice(int* device) = 0;
  virtual cudaError_t SetDevice(int device) = 0;
  // True when the calling thread already has a current CUDA context, i.e. the program has
  // chosen its device (cudaSetDevice, an allocation...). Never creates a context.
  virtual bool ThreadHasCudaContext() = 0;
  virtual cudaError_t StreamCreateNonBlocking(cudaStream_t* stream) = 0;
  virtual cudaError_t StreamDestroy(cudaStream_t stream) = 0;
  // cudaSuccess when all work on `stream` is done, cudaErrorNotReady while some is pending.
  virtual cudaError_t StreamQuery(cudaStream_t stream) = 0;
  // cudaStreamWaitEvent(stream, event, 0): later work on `stream` waits for `event`.
  virtual cudaError_t StreamWaitEvent(cudaStream_t stream, cudaEvent_t event) = 0;
  // cudaEventCreateWithFlags(event, cudaEventDisableTiming), on the current device.
  virtual cudaError_t EventCreate(cudaEvent_t* event) = 0;
  virtual cudaError_t EventRecord(cudaEvent_t event, cudaStream_t stream) = 0;
  // cudaSuccess once the work before the event's last record is done; cudaErrorNotReady before.
  virtual cudaError_t EventQuery(cudaEvent_t event) = 0;
  virtual cudaError_t EventDestroy(cudaEvent_t event) = 0;
  // cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream).
  virtual cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes,
                                  cudaStream_t stream) = 0;
  virtual cudaError_t Malloc(void** p, size_t bytes) = 0;
  virtual cudaError_t Free(void* p) = 0;
  // The device that holds `p` (cudaPointerGetAttributes).
  virtual cudaError_t PointerGetDevice(const void* p, int* device) = 0;
  virtual const char* CudaErrorString(cudaError_t error) = 0;

  // NCCL.
  virtual ncclResult_t GetVersion(int* version) = 0;
  virtual ncclResult_t GetUniqueId(ncclUniqueId* id) = 0;
  virtual ncclResult_t CommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                          ncclConfig_t* config) = 0;
  virtual ncclResult_t CommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) = 0;
  virtual ncclResult_t CommFinalize(ncclComm_t comm) = 0;
  virtual ncclResult_t CommDestroy(ncclComm_t comm) = 0;
  virtual ncclResult_t CommAbort(ncclComm_t comm) = 0;
  virtual ncclResult_t AllReduce(const void* send, void* recv, size_t count, ncclDataType_t dtype,
                                 ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t Broadcast(const void* send, void* recv, size_t count, ncclDataType_t dtype,
                                 int root, ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t AllGather(const void* send, void* recv, size_t send_count,
                                 ncclDataType_t dtype, ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t ReduceScatter(const void* send, void* recv, size_t recv_count,
                                     ncclDataType_t dtype, ncclRedOp_t op, ncclComm_t comm,
                                     cudaStream_t stream) = 0;
  virtual ncclResult_t GroupStart() = 0;
  virtual ncclResult_t GroupEnd() = 0;
  virtual ncclResult_t Send(const void* send, size_t count, ncclDataType_t dtype, int peer,
                            ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t Recv(void* recv, size_t count, ncclDataType_t dtype, int peer,
                            ncclComm_t comm, cudaStream_t stream) = 0;
  // ncclRedOpCreatePreMulSum with a host scalar (ncclScalarHostImmediate): `scalar` points at
  // one value of `dtype`.
  virtual ncclResult_t RedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t dtype,
                                            ncclComm_t comm) = 0;
  virtual ncclResult_t RedOpDestroy(ncclRedOp_t op, ncclComm_t comm) = 0;
  virtual const char* GetErrorString(ncclResult_t result) = 0;
  // NCCL's last error text for `comm` (may be nullptr or empty).
  virtual const char* GetLastError(ncclComm_t comm) = 0;
};

// The real thing: libcudart and libnccl. Stateless; each call makes a new one.
std::shared_ptr<NcclApi> MakeRealNcclApi();

// True when libcuda (the driver library) is already loaded into this process: until then the
// program cannot have any CUDA memory, and asking CUDA would load and initialize the driver.
bool CudaDriverLoaded();

}  // namespace ringrun::runtime::gpu
