#include "runtime/src/gpu/nccl_mapping.h"

#include <string>

#include "ringrun/names.h"
#include "runtime/src/gpu/gpu_info.h"

namespace ringrun::runtime {
namespace {

bool IsFloating(ringrun_dtype dtype) {
  return dtype == RINGRUN_FLOAT16 || dtype == RINGRUN_BFLOAT16 || dtype == RINGRUN_FLOAT32 ||
         dtype == RINGRUN_FLOAT64;
}

}  // namespace

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

Result<ncclDataType_t> ToNcclDataType(ringrun_dtype dtype, int nccl_version) {
  switch (dtype) {
    case RINGRUN_INT8:
      return ncclInt8;
    case RINGRUN_UINT8:
      return ncclUint8;
    case RINGRUN_INT32:
      return ncclInt32;
    case RINGRUN_INT64:
      return ncclInt64;
    case RINGRUN_FLOAT16:
      return ncclFloat16;
    case RINGRUN_FLOAT32:
      return ncclFloat32;
    case RINGRUN_FLOAT64:
      return ncclFloat64;
    case RINGRUN_BFLOAT16:
      if (nccl_version < kNcclVersionWithAvgAndBf16) {
        return InvalidArgument(
            "BFLOAT16 on device memory needs NCCL >= 2.10; this process has NCCL " +
            FormatNcclVersion(nccl_version));
      }
      return ncclBfloat16;
    case RINGRUN_DTYPE_MIN_ENUM_:
    case RINGRUN_DTYPE_MAX_ENUM_:
      break;
  }
  return InvalidArgument("dtype " + std::to_string(static_cast<int>(dtype)) +
                         " is not a ringrun_dtype");
}

Result<ncclRedOp_t> ToNcclRedOp(ringrun_op op, ringrun_dtype dtype, int nccl_version) {
  switch (op) {
    case RINGRUN_SUM:
      return ncclSum;
    case RINGRUN_PRODUCT:
      return ncclProd;
    case RINGRUN_MIN:
      return ncclMin;
    case RINGRUN_MAX:
      return ncclMax;
    case RINGRUN_AVERAGE:
      if (!IsFloating(dtype)) {
        return InvalidArgument(std::string("AVERAGE is for floating types, not ") +
                               ringrun_dtype_name(dtype));
      }
      if (nccl_version < kNcclVersionWithAvgAndBf16) {
        return InvalidArgument(
            "AVERAGE on device memory needs NCCL >= 2.10 (ncclAvg); this process has NCCL " +
            FormatNcclVersion(nccl_version));
      }
      return ncclAvg;
    case RINGRUN_OP_MIN_ENUM_:
    case RINGRUN_OP_MAX_ENUM_:
      break;
  }
  return InvalidArgument("op " + std::to_string(static_cast<int>(op)) + " is not a ringrun_op");
}

}  // namespace ringrun::runtime
