// What this build and this machine offer on the GPU side, for `ringrun --check-build` and the
// `ringrun-gpu-probe` that `ringrun --check-gpu` runs on every host. Compiled in every build;
// without CUDA the answers say so. Nothing here creates a CUDA context.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ringrun {

struct GpuBuildInfo {
  bool have_nccl = false;        // RINGRUN_HAVE_NCCL
  int nccl_header_version = 0;   // NCCL_VERSION_CODE this build was compiled against
  int nccl_runtime_version = 0;  // ncclGetVersion() of the library actually loaded
  int cuda_header_version = 0;   // CUDART_VERSION compiled against
  int cuda_runtime_version = 0;  // cudaRuntimeGetVersion(): needs no driver
};
GpuBuildInfo GetGpuBuildInfo();

struct GpuDeviceInfo {
  int index = 0;
  std::string name;  // "NVIDIA H200"
  uint64_t total_memory_bytes = 0;
  int cc_major = 0;  // compute capability
  int cc_minor = 0;
  std::string pci_bus_id;  // "0000:19:00.0"
};

struct GpuHostInfo {
  GpuBuildInfo build;
  int driver_version = 0;  // cudaDriverGetVersion(); 0: no driver
  std::vector<GpuDeviceInfo> devices;
  // Why there are no usable devices: "no CUDA driver: <CUDA's text>", "no CUDA device: ...",
  // "this build has no CUDA"; empty when devices is not empty.
  std::string error;
};
GpuHostInfo ProbeGpus();

// "13.0" from 13000; "none" for 0.
std::string FormatCudaVersion(int code);
// "2.28.9" from 22809; "none" for 0.
std::string FormatNcclVersion(int code);

// Builds with CUDA only. Why CUDA is unusable, from cudaGetDeviceCount's error (`cuda_error`,
// `error_text`) and cudaDriverGetVersion (0: no driver): "no CUDA driver: <CUDA's text>", "no CUDA
// device: ...", "CUDA driver 12.2 is older than the runtime 13.0: ...". The prefix is what
// --check-gpu shows.
std::string DescribeCudaUnavailable(int cuda_error, const char* error_text, int driver_version,
                                    int runtime_version);

}  // namespace ringrun
