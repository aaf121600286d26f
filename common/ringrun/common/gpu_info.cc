#include "ringrun/common/gpu_info.h"

#include "ringrun/gpu/config.h"

#if RINGRUN_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#endif

namespace ringrun {

#if RINGRUN_HAVE_NCCL

std::string DescribeCudaUnavailable(int cuda_error, const char* error_text, int driver_version,
                                    int runtime_version) {
  std::string text = error_text != nullptr ? error_text : "unknown CUDA error";
  text += " (cudaError " + std::to_string(cuda_error) + ")";
  if (driver_version == 0) return "no CUDA driver: " + text;
  if (cuda_error == cudaErrorNoDevice) return "no CUDA device: " + text;
  if (cuda_error == cudaErrorInsufficientDriver) {
    return "CUDA driver " + FormatCudaVersion(driver_version) + " is older than the runtime " +
           FormatCudaVersion(runtime_version) + ": " + text;
  }
  return "CUDA unusable: " + text;
}

GpuBuildInfo GetGpuBuildInfo() {
  GpuBuildInfo info;
  info.have_nccl = true;
  info.nccl_header_version = NCCL_VERSION_CODE;
  info.cuda_header_version = CUDART_VERSION;
  if (ncclGetVersion(&info.nccl_runtime_version) != ncclSuccess) info.nccl_runtime_version = 0;
  if (cudaRuntimeGetVersion(&info.cuda_runtime_version) != cudaSuccess) {
    info.cuda_runtime_version = 0;
  }
  return info;
}

GpuHostInfo ProbeGpus() {
  GpuHostInfo host;
  host.build = GetGpuBuildInfo();
  if (cudaDriverGetVersion(&host.driver_version) != cudaSuccess) host.driver_version = 0;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    host.error = DescribeCudaUnavailable(static_cast<int>(e), cudaGetErrorString(e),
                                         host.driver_version, host.build.cuda_runtime_version);
    cudaGetLastError();
    return host;
  }
  if (count == 0) {
    host.error = "no CUDA device: cudaGetDeviceCount found none";
    return host;
  }
  for (int i = 0; i < count; ++i) {
    // cudaGetDeviceProperties does not create a context.
    cudaDeviceProp prop;
    GpuDeviceInfo d;
    d.index = i;
    if (cudaError_t pe = cudaGetDeviceProperties(&prop, i); pe != cudaSuccess) {
      d.name = std::string("(cudaGetDeviceProperties: ") + cudaGetErrorString(pe) + ")";
      cudaGetLastError();
    } else {
      d.name = prop.name;
      d.total_memory_bytes = prop.totalGlobalMem;
      d.cc_major = prop.major;
      d.cc_minor = prop.minor;
    }
    char bus[32] = {0};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), i) == cudaSuccess) {
      d.pci_bus_id = bus;
    } else {
      cudaGetLastError();
    }
    host.devices.push_back(std::move(d));
  }
  return host;
}

#else  // !RINGRUN_HAVE_NCCL

GpuBuildInfo GetGpuBuildInfo() { return GpuBuildInfo{}; }

GpuHostInfo ProbeGpus() {
  GpuHostInfo host;
  host.error =
      "this build has no CUDA (configured with RINGRUN_WITH_NCCL=OFF, or CUDA/NCCL were "
      "not found)";
  return host;
}

#endif  // RINGRUN_HAVE_NCCL

}  // namespace ringrun
