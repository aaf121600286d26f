// Device execution: the GPU backend (made at the first device collective), the ready events
// recorded at submission, and the batches that run on it (device_fusion.h says what a batch
// does on the backend's stream).
#include <algorithm>
#include <cstring>

#include "runtime/src/engine/device_fusion.h"
#include "runtime/src/engine/engine.h"
#include "runtime/src/gpu/device_backend.h"  // the interface; its factories are linked with the seam

namespace ringrun::runtime::engine {

Result<gpu::DeviceBackend*> Engine::Device() {
  if (device_) return device_.get();
  if (!device_error_.ok()) return device_error_;
  // The NCCL id is made now, at the first device collective, and travels over the CPU
  // transport: a CPU-only job never loads the CUDA driver for it.
  std::string id;
  if (options_.rank == 0) {
    if (options_.make_nccl_id) {
      id = options_.make_nccl_id();
    } else {
      id = gpu::MaybeCreateNcclUniqueId();
    }
  }
  if (transport_) {
    std::vector<char> buf(4 + 512, 0);
    uint32_t len = static_cast<uint32_t>(std::min<size_t>(id.size(), 512));
    std::memcpy(buf.data(), &len, 4);
    std::memcpy(buf.data() + 4, id.data(), len);
    RINGRUN_RETURN_IF_ERROR(runtime::Broadcast(Context(), world_, buf.data(), buf.size(), 0));
    std::memcpy(&len, buf.data(), 4);
    id.assign(buf.data() + 4, std::min<uint32_t>(len, 512));
  }
  Result<std::unique_ptr<gpu::DeviceBackend>> made =
      options_.make_device ? options_.make_device(id)
                           : gpu::MakeDeviceBackend(options_.rank, options_.size,
                                                    options_.local_rank, id, options_.timeout_ms);
  if (!made.ok()) {
    device_error_ = made.status().Annotate("GPU backend");
    return device_error_;
  }
  device_ = std::move(made.value());
  {
    MutexLock lock(&device_mu_);
    device_live_ = device_.get();
  }
  return device_.get();
}

void Engine::AbortDevice(const std::string& reason) {
  MutexLock lock(&device_mu_);
  if (device_abort_.empty()) device_abort_ = reason;
  // Only work in progress is aborted: an idle communicator is finalized cleanly at the end.
  if (device_busy_ && device_live_ != nullptr) device_live_->Abort(reason);
}

Status Engine::RecordReady(Entry& e) {
  const void* buffer = e.send != nullptr ? e.send : e.recv;
  Result<std::shared_ptr<void>> ready = options_.record_event
                                            ? options_.record_event(buffer, e.stream)
                                            : gpu::RecordDeviceEvent(buffer, e.stream);
  if (!ready.ok()) return ready.status();
  e.ready = std::move(ready.value());
  return Status::Ok();
}

Status Engine::RunDevice(Batch& b) {
  Result<gpu::DeviceBackend*> dev = Device();
  if (!dev.ok()) return dev.status();
  std::vector<DeviceItem> items;
  for (size_t i = 0; i < b.responses.size(); ++i) items.push_back({b.responses[i], b.locals[i]});
  {
    MutexLock lock(&device_mu_);
    if (!device_abort_.empty()) return Aborted(device_abort_);
    device_busy_ = true;
  }
  Status st = RunDeviceBatch({*dev, options_.rank, options_.size, timeline_.get(), clock_}, items);
  if (!st.ok()) {
    // This rank may have enqueued less of the batch than its peers (or more): its NCCL calls
    // are no longer in step with theirs, and its next one would pair with another batch of
    // theirs (NCCL matches calls by order). Abort the communicator: this rank's later device
    // work fails with this reason, and the peers' unmatched call ends at their deadline.
    AbortDevice("rank " + std::to_string(options_.rank) +
                ": an earlier device collective failed here: " + st.message());
  }
  MutexLock lock(&device_mu_);
  device_busy_ = false;
  return st;
}

}  // namespace ringrun::runtime::engine
