// The DeviceBackend seam in a build without CUDA/NCCL (RINGRUN_WITH_NCCL=OFF, or not found):
// nothing is device memory, and asking for a backend says why there is none.
#include "runtime/src/gpu/device_backend.h"

namespace ringrun::runtime::gpu {

bool IsDevicePointer(const void* /*p*/) { return false; }

std::string MaybeCreateNcclUniqueId() { return ""; }

Result<DeviceEvent> RecordDeviceEvent(const void* /*buffer*/, void* /*stream*/) {
  return Unavailable(
      "this build has no NCCL backend (configured with RINGRUN_WITH_NCCL=OFF, or CUDA/NCCL were "
      "not found); device memory cannot be used");
}

Result<std::unique_ptr<DeviceBackend>> MakeDeviceBackend(int rank, int size, int /*local_rank*/,
                                                         const std::string& /*nccl_id*/,
                                                         int /*timeout_ms*/) {
  return Unavailable("rank " + std::to_string(rank) + "/" + std::to_string(size) +
                     ": this build has no NCCL backend (configured with RINGRUN_WITH_NCCL=OFF, or "
                     "CUDA/NCCL were not found); device memory cannot be used");
}

}  // namespace ringrun::runtime::gpu
