// The seam between libringrun's core and its GPU backend (NCCL). Exactly one factory file
// (nccl_backend.cc when RINGRUN_HAVE_NCCL, no_gpu_backend.cc otherwise) implements these.
//
// The core calls IsDevicePointer() on every buffer; device buffers go to the DeviceBackend,
// host buffers to the CPU transport. Dtype and op values are the public ringrun_dtype and
// ringrun_op of ringrun.h.
#pragma once

#include <memory>
#include <string>

#include "ringrun/common/status.h"
#include "ringrun/ringrun.h"

namespace ringrun::runtime {

// True when `p` is CUDA device (or managed) memory. False in builds without CUDA and on
// machines without a driver. Never fails loudly.
bool IsDevicePointer(const void* p);

// Rank 0, before joining: an NCCL unique id (as bytes) to hand to every rank through the job
// service, or an empty string when this build or machine has no usable NCCL/GPU. Non-fatal.
std::string MaybeCreateNcclUniqueId();

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // `stream` is a cudaStream_t (nullptr: the backend's own stream). With `sync`, the call
  // returns once the result is in place; without, it returns once enqueued on `stream`.
  // Unsupported dtype/op combinations are InvalidArgument, never a silent fallback.
  virtual Status Allreduce(const void* send, void* recv, size_t count, ringrun_dtype dtype,
                           ringrun_op op, void* stream, bool sync) = 0;
  virtual Status Broadcast(void* buf, size_t count, ringrun_dtype dtype, int root, void* stream,
                           bool sync) = 0;
  virtual Status Allgather(const void* send, void* recv, size_t count, ringrun_dtype dtype,
                           void* stream, bool sync) = 0;
  // Aborts the communicator (ncclCommAbort) so that no call hangs; later calls fail. Safe to
  // call from another thread while a collective is in flight.
  virtual void Abort(const std::string& reason) = 0;
};

// Creates the backend lazily, on the first device-memory call. `nccl_id` is what rank 0 put
// in the job service (empty: NCCL was not available on rank 0). Errors name the cause:
// "no CUDA driver: <CUDA's text>", "this build has no NCCL backend", ...
Result<std::unique_ptr<DeviceBackend>> MakeDeviceBackend(int rank, int size, int local_rank,
                                                         const std::string& nccl_id,
                                                         int timeout_ms);

}  // namespace ringrun::runtime
