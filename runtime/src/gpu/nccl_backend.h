// The NCCL DeviceBackend, parameterized by its NcclApi so that tests drive it with a fake.
// The seam functions of device_backend.h call these with MakeRealNcclApi().
//
// Lifecycle: the bootstrap is Horovod's: rank 0 calls CreateNcclUniqueId() before joining and
// puts the bytes in its JoinRequest; the job service hands them to every rank in the JoinReply;
// every rank then creates its backend from them. The communicator is non-blocking
// (ncclConfig_t::blocking = 0): init and every collective are polled with
// ncclCommGetAsyncError against a deadline, and a timeout, an asynchronous error or Abort()
// ends the communicator with ncclCommAbort, after which every call fails with that reason.
//
// ncclCommAbort can hang itself (a kernel that never ends, a proxy thread stuck on a peer that
// is gone), so it runs on a thread of its own and the backend waits for it abort_timeout_ms at
// most. Past that the communicator is left to that thread, and `api` (in production the
// process's CUDA and NCCL) is marked: a GPU whose communicator could not be aborted cannot be
// trusted with another one, so every later MakeNcclBackend on that api fails, saying why. In an
// elastic job the rank then fails where it would have hung, and the job goes on without it.
#pragma once

#include <memory>
#include <string>

#include "ringrun/common/defaults.h"
#include "runtime/src/gpu/device_backend.h"
#include "runtime/src/gpu/nccl_api.h"

namespace ringrun::runtime::gpu {

struct NcclBackendOptions {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  // NCCL_UNIQUE_ID_BYTES bytes from rank 0. Empty is accepted only at size 1 (the backend then
  // makes its own id).
  std::string nccl_id;
  // Bound on init and on each collective (enqueue, and completion when synchronous).
  int timeout_ms = kDefaultCollectiveTimeoutMs;
  // How often a pending operation is polled.
  int poll_interval_us = 100;
  // Bound on ncclCommAbort (see above).
  int abort_timeout_ms = kNcclAbortTimeoutMs;
};

// The bytes of a fresh ncclUniqueId, or "" when this machine has no usable GPU (no driver, no
// device) or NCCL fails. Never fatal: a job without GPUs must still start.
// Cost: loads and initializes the CUDA driver (cudaGetDeviceCount) but creates no context.
std::string CreateNcclUniqueId(NcclApi& api);

// Chooses the device (the calling thread's current one when it already has a CUDA context,
// else local_rank modulo the device count), creates a stream and the communicator, and waits
// for init within the timeout. Errors: "no CUDA driver: <CUDA's text>", "no CUDA device",
// "NCCL init ... timed out", "... could not be aborted", with rank and device named.
Result<std::unique_ptr<DeviceBackend>> MakeNcclBackend(std::shared_ptr<NcclApi> api,
                                                       const NcclBackendOptions& options);

// RecordDeviceEvent (device_backend.h) through `api`: an event on the device that holds
// `buffer`, recorded on `stream`, destroyed through `api` with its last reference.
Result<DeviceEvent> RecordNcclEvent(std::shared_ptr<NcclApi> api, const void* buffer, void* stream);

}  // namespace ringrun::runtime::gpu
