#include "launcher/check_build.h"

#include <dlfcn.h>
#include <google/protobuf/stubs/common.h>
#include <grpcpp/grpcpp.h>
#include <libssh/libssh.h>

#include <algorithm>
#include <cstdio>

#include "ringrun/common/gpu_info.h"
#include "ringrun/common/version.h"
#include "ringrun/gpu/config.h"
#if RINGRUN_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace ringrun::launcher {
namespace {

#if RINGRUN_HAVE_NCCL
// Calls `int fn(int*)` from the first library of `paths` that loads; 0 if none does.
int DlVersion(std::initializer_list<const char*> paths, const char* symbol) {
  for (const char* path : paths) {
    void* lib = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) continue;
    int version = 0;
    using Fn = int (*)(int*);
    if (auto fn = reinterpret_cast<Fn>(::dlsym(lib, symbol))) fn(&version);
    ::dlclose(lib);
    if (version > 0) return version;
  }
  return 0;
}
#endif

// What this build has. The launcher does not link CUDA or NCCL (they would cost every job's
// start-up tens of milliseconds); the versions of the libraries present come through dlopen.
GpuBuildInfo BuildInfo() {
  GpuBuildInfo info;
#if RINGRUN_HAVE_NCCL
  info.have_nccl = true;
  info.cuda_header_version = CUDART_VERSION;
  info.nccl_header_version = NCCL_VERSION_CODE;
  const std::string cudart = "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
  info.cuda_runtime_version =
      DlVersion({cudart.c_str(), RINGRUN_CUDART_PATH}, "cudaRuntimeGetVersion");
  const std::string nccl = "libnccl.so." + std::to_string(NCCL_MAJOR);
  info.nccl_runtime_version = DlVersion({nccl.c_str(), RINGRUN_NCCL_PATH}, "ncclGetVersion");
#endif
  return info;
}

std::string Box(bool have) { return have ? "    [X] " : "    [ ] "; }

std::string Row(const std::string& name, const std::string& value) {
  std::string padded = "    " + name;
  padded.resize(std::max<size_t>(padded.size() + 1, 20), ' ');
  return padded + value + "\n";
}

}  // namespace

std::string CheckBuildText() {
  const GpuBuildInfo gpu = BuildInfo();

  std::string nccl = "NCCL";
  if (gpu.have_nccl) {
    nccl += " " + FormatNcclVersion(gpu.nccl_runtime_version);
    if (gpu.nccl_runtime_version != gpu.nccl_header_version) {
      nccl += " (built against " + FormatNcclVersion(gpu.nccl_header_version) + ")";
    }
  } else {
    nccl += " (not in this build: RINGRUN_WITH_NCCL=OFF or CUDA/NCCL not found)";
  }
  std::string cuda = "none (built without CUDA)";
  if (gpu.have_nccl) {
    cuda = FormatCudaVersion(gpu.cuda_runtime_version);
    if (gpu.cuda_runtime_version != gpu.cuda_header_version) {
      cuda += " (built against " + FormatCudaVersion(gpu.cuda_header_version) + ")";
    }
  }

  std::string out = std::string("ringrun v") + RINGRUN_VERSION_STRING + ":\n\n";
  out += "Available backends:\n";
  out += Box(true) + "CPU TCP\n";
  out += Box(true) + "CPU shared memory\n";
  out += Box(gpu.have_nccl) + nccl + "\n\n";
  out += "Available libraries:\n";
  out += Row("CUDA runtime", cuda);
  out += Row("libssh", ssh_version(0));
  out += Row("gRPC", grpc::Version());
  out += Row("Protobuf", google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION));
  return out;
}

int RunCheckBuild() {
  const std::string text = CheckBuildText();
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace ringrun::launcher
