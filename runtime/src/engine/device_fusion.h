// The engine's device (CUDA) batches: what runs on the GPU backend's stream for a batch of
// ready device responses, in the same agreed order on every rank.
//
// A batch is either several allreduces that fuse (Request::Fusable: same dtype, op, scale
// factors, flags, all on device) or one collective of any kind. For each batch:
//   1. the backend's stream waits for every entry's ready event (recorded on the caller's
//      stream at submission), so no caller's buffer is read before the caller's work on it;
//   2. a fused batch is copied into the device fusion buffer (device to device, on the stream),
//      reduced by one NCCL allreduce and copied out; a lone tensor runs on its own buffers;
//   3. Finish records the result event, makes each caller stream (an _on_stream call's) wait
//      for it, and, when some entry has no stream (a handle), waits for the event on the host.
// Scale factors and AVERAGE become one NCCL PreMulSum by prescale * postscale (/ size for
// AVERAGE); MIN/MAX/PRODUCT with scale factors are refused at submission.
#pragma once

#include <vector>

#include "runtime/src/engine/controller.h"
#include "runtime/src/engine/request.h"
#include "runtime/src/engine/timeline.h"
#include "runtime/src/gpu/device_backend.h"

namespace ringrun::runtime::engine {

struct HandleState;

// One response of a batch and this rank's entry for it (never null: device collectives fail
// while a rank has joined, so every rank has an entry).
struct DeviceItem {
  const Response* response;
  Entry* entry;
};

struct DeviceBatchContext {
  gpu::DeviceBackend* backend;
  int rank = 0, size = 1;
  Timeline* timeline = nullptr;  // null: no timeline
  const Clock* clock = nullptr;
};

// Runs one batch as above. Returns once the work is enqueued and, when a handle waits for it,
// done; the error (if any) is every item's.
Status RunDeviceBatch(const DeviceBatchContext& ctx, const std::vector<DeviceItem>& batch);

// Submission-time checks of a device request that the host path does not need (the caller
// adds them to its own validation).
Status ValidateDeviceRequest(const Request& r);

// The scale and op that the backend gets for `r` (prescale * postscale, divided by `size` for
// AVERAGE with scale factors, which then becomes SUM).
void DeviceScaleAndOp(const Request& r, int size, double* scale, ringrun_op* op);

}  // namespace ringrun::runtime::engine
