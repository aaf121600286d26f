#include "launcher/check_build.h"

#include <google/protobuf/stubs/common.h>
#include <grpcpp/grpcpp.h>
#include <libssh/libssh.h>

#include <algorithm>
#include <cstdio>

#include "gpu/gpu_info.h"
#include "ringrun/common/version.h"

namespace ringrun::launcher {
namespace {

std::string Box(bool have) { return have ? "    [X] " : "    [ ] "; }

std::string Row(const std::string& name, const std::string& value) {
  std::string padded = "    " + name;
  padded.resize(std::max<size_t>(padded.size() + 1, 20), ' ');
  return padded + value + "\n";
}

}  // namespace

std::string CheckBuildText() {
  using runtime::FormatCudaVersion;
  using runtime::FormatNcclVersion;
  const runtime::GpuBuildInfo gpu = runtime::GetGpuBuildInfo();

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
