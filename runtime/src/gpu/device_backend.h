// The seam between libringrun's core and its GPU backend (NCCL). Exactly one factory file
// (nccl_backend.cc when RINGRUN_HAVE_NCCL, no_gpu_backend.cc otherwise) implements these.
//
// The core calls IsDevicePointer() on every buffer; device buffers go to the DeviceBackend,
// host buffers to the CPU transport. Dtype and op values are the public ringrun_dtype and
// ringrun_op of ringrun.h.
//
// Ordering. A submitting thread records a DeviceEvent on its stream (RecordDeviceEvent); the
// engine makes the backend's own stream wait for it (WaitFor) before any work reads the
// caller's buffers, enqueues copies and collectives on that stream, and ends each batch with
// Finish, which records the backend's result event, makes the callers' streams wait for it and,
// when asked, waits for it on the host. No call waits without a deadline.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ringrun/common/status.h"
#include "ringrun/ringrun.h"

namespace ringrun::runtime::gpu {

// True when `p` is CUDA device (or managed) memory. False in builds without CUDA and on
// machines without a driver. Never fails loudly.
bool IsDevicePointer(const void* p);

// Rank 0, before joining: an NCCL unique id (as bytes) to hand to every rank through the job
// service, or an empty string when this build or machine has no usable NCCL/GPU. Non-fatal.
std::string MaybeCreateNcclUniqueId();

// A CUDA event (the cudaEvent_t is get()), destroyed with its last reference (destroying an
// event whose work is pending is allowed: CUDA releases it once the work is done).
using DeviceEvent = std::shared_ptr<void>;

// Device memory that is freed with its last reference.
using DeviceMemory = std::shared_ptr<void>;

// Creates an event on the device that holds `buffer` and records it on `stream` (a
// cudaStream_t; nullptr: that device's legacy default stream, which follows all earlier work of
// the blocking streams). Called by submitting threads, any number at once.
Result<DeviceEvent> RecordDeviceEvent(const void* buffer, void* stream);

// What the engine needs of the GPU. Every method but Abort is called from one thread (the
// engine's). Work is enqueued on the backend's own stream in call order, and the methods return
// once it is enqueued (and NCCL has accepted it), not when it is done; only Finish waits.
// Counts are elements of `dtype`. Unsupported dtype/op combinations are InvalidArgument and
// communicate nothing, never a silent fallback. Once the communicator is aborted (a deadline
// passed, NCCL reported an asynchronous error, or Abort), every call fails with that reason.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // The backend's stream waits for `ready` (from RecordDeviceEvent) before later work.
  virtual Status WaitFor(const DeviceEvent& ready) = 0;
  // The device fusion buffer: at least `bytes` of device memory owned by the backend, kept and
  // reused, reallocated larger when a call needs more (its content is then lost). Earlier work
  // on the stream that used it stays ordered before later work, so no wait is needed between
  // batches.
  virtual Result<void*> FusionBuffer(size_t bytes) = 0;
  // Device memory that outlives the backend's batches (a result handed to the caller).
  virtual Result<DeviceMemory> Allocate(size_t bytes) = 0;
  // Device to device, on the stream.
  virtual Status Copy(void* dst, const void* src, size_t bytes) = 0;

  // recv = op over ranks of send, times `scale`. A scale other than 1 needs SUM: NCCL's
  // ncclRedOpCreatePreMulSum multiplies every input by it before the sum.
  virtual Status Allreduce(const void* send, void* recv, size_t count, ringrun_dtype dtype,
                           ringrun_op op, double scale) = 0;
  virtual Status Broadcast(void* buf, size_t count, ringrun_dtype dtype, int root) = 0;
  // recv holds counts[r] elements from every rank r, in rank order (ncclAllGather when the
  // counts are equal, else grouped ncclSend/ncclRecv).
  virtual Status Allgatherv(const void* send, void* recv, const std::vector<size_t>& counts,
                            ringrun_dtype dtype) = 0;
  // send holds size * recv_count elements; rank r gets block r of the reduction.
  virtual Status ReduceScatter(const void* send, void* recv, size_t recv_count, ringrun_dtype dtype,
                               ringrun_op op) = 0;
  // send holds send_counts[r] elements for every rank r in order; recv gets recv_counts[r]
  // from every rank r in order (grouped ncclSend/ncclRecv).
  virtual Status Alltoallv(const void* send, const std::vector<size_t>& send_counts, void* recv,
                           const std::vector<size_t>& recv_counts, ringrun_dtype dtype) = 0;

  // Ends a batch: records the result event on the stream after everything enqueued so far and
  // makes every stream of `streams` (cudaStream_t; nullptr: the legacy default stream) wait for
  // it. With `wait`, returns once the event has completed, polling it and NCCL's asynchronous
  // error within the collective timeout (a timeout or an error aborts the communicator).
  virtual Status Finish(const std::vector<void*>& streams, bool wait) = 0;

  // Aborts the communicator (ncclCommAbort) so that no call hangs; later calls fail. Safe to
  // call from another thread while a call is in progress.
  virtual void Abort(const std::string& reason) = 0;
};

// Creates the backend lazily, on the first device-memory call. `nccl_id` is what rank 0 put
// in the job service (empty: NCCL was not available on rank 0). Errors name the cause:
// "no CUDA driver: <CUDA's text>", "this build has no NCCL backend", ...
Result<std::unique_ptr<DeviceBackend>> MakeDeviceBackend(int rank, int size, int local_rank,
                                                         const std::string& nccl_id,
                                                         int timeout_ms);

}  // namespace ringrun::runtime::gpu
