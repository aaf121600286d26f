// Version formatting for the GPU reports: pure, and linked by the launcher, which must not
// load CUDA or NCCL just to start a job.
#include <string>

#include "ringrun/common/gpu_info.h"

namespace ringrun {

std::string FormatCudaVersion(int code) {
  if (code <= 0) return "none";
  return std::to_string(code / 1000) + "." + std::to_string((code % 1000) / 10);
}

std::string FormatNcclVersion(int code) {
  if (code <= 0) return "none";
  if (code < 10000) {  // NCCL_VERSION(X,Y,Z) before 2.9: X*1000 + Y*100 + Z
    return std::to_string(code / 1000) + "." + std::to_string((code % 1000) / 100) + "." +
           std::to_string(code % 100);
  }
  return std::to_string(code / 10000) + "." + std::to_string((code % 10000) / 100) + "." +
         std::to_string(code % 100);
}

}  // namespace ringrun
