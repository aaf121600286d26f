#include "runtime/src/gpu/nccl_mapping.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "ringrun/common/gpu_info.h"
#include "ringrun/names.h"

namespace ringrun::runtime::gpu {
namespace {

bool IsFloating(ringrun_dtype dtype) {
  return dtype == RINGRUN_FLOAT16 || dtype == RINGRUN_BFLOAT16 || dtype == RINGRUN_FLOAT32 ||
         dtype == RINGRUN_FLOAT64;
}

// IEEE binary16 bits of f, rounded to nearest even.
uint16_t FloatToHalfBits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 2^16: inf
  if (abs < 0x38800000u) {  // below 2^-14: a subnormal (or zero) in units of 2^-24
    float a;
    std::memcpy(&a, &abs, 4);
    const uint32_t n = static_cast<uint32_t>(std::nearbyint(a * 16777216.0f));
    return static_cast<uint16_t>(sign | n);  // n == 0x400 is the smallest normal: still right
  }
  const uint32_t mant = abs & 0x7fffffu;
  uint32_t h = (((abs >> 23) - 127 + 15) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry may reach inf: right
  return static_cast<uint16_t>(sign | h);
}

// bfloat16 bits of f, rounded to nearest even.
uint16_t FloatToBf16Bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace

size_t NcclOneRankPreMulSumSpan(size_t count, size_t elem_size) {
  if (count == 0 || elem_size == 0) return count;
  constexpr size_t kBytesPerBlock = size_t{16} << 10;
  const size_t blocks =
      std::min<size_t>(32, (count * elem_size + kBytesPerBlock - 1) / kBytesPerBlock);
  const size_t pack = std::max<size_t>(1, 16 / elem_size);
  const size_t per_block = (count / blocks + pack - 1) / pack * pack;
  return std::min(count, blocks * per_block);
}

size_t NcclTypeSize(ncclDataType_t dtype) {
  switch (dtype) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

Status EncodeScalar(ringrun_dtype dtype, double value, unsigned char (&out)[8]) {
  std::memset(out, 0, sizeof(out));
  switch (dtype) {
    case RINGRUN_FLOAT16: {
      const uint16_t h = FloatToHalfBits(static_cast<float>(value));
      std::memcpy(out, &h, 2);
      return Status::Ok();
    }
    case RINGRUN_BFLOAT16: {
      const uint16_t b = FloatToBf16Bits(static_cast<float>(value));
      std::memcpy(out, &b, 2);
      return Status::Ok();
    }
    case RINGRUN_FLOAT32: {
      const float f = static_cast<float>(value);
      std::memcpy(out, &f, 4);
      return Status::Ok();
    }
    case RINGRUN_FLOAT64:
      std::memcpy(out, &value, 8);
      return Status::Ok();
    default:
      return InvalidArgument("a scale factor needs a floating dtype, not dtype " +
                             std::to_string(static_cast<int>(dtype)));
  }
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
    case RINGRUN_INT16:
      return InvalidArgument("NCCL has no 16-bit integer type: int16 does not reduce on NCCL");
    case RINGRUN_DTYPE_MIN_ENUM_:
    case RINGRUN_DTYPE_MAX_ENUM_:
      break;
  }
  return InvalidArgument("dtype " + std::to_string(static_cast<int>(dtype)) +
                         " is not a ringrun_dtype");
}

Result<ncclDataType_t> ToNcclCopyType(ringrun_dtype dtype, int nccl_version) {
  if (dtype == RINGRUN_INT16) return ncclFloat16;
  return ToNcclDataType(dtype, nccl_version);
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

}  // namespace ringrun::runtime::gpu
