#include "reduce.h"

#include <algorithm>
#include <cstring>

namespace ringrun::runtime {
namespace {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Sum { template <typename T> static T Apply(T a, T b) { return a + b; } };
struct Prod { template <typename T> static T Apply(T a, T b) { return a * b; } };
struct Min { template <typename T> static T Apply(T a, T b) { return b < a ? b : a; } };
struct Max { template <typename T> static T Apply(T a, T b) { return a < b ? b : a; } };

// Integer sums and products wrap (computed in the unsigned type: no undefined overflow).
template <typename T, typename Op>
T ApplyInt(T a, T b) {
  using U = std::make_unsigned_t<T>;
  if constexpr (std::is_same_v<Op, Sum>) {
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else if constexpr (std::is_same_v<Op, Prod>) {
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return Op::Apply(a, b);
  }
}

template <typename T, typename Op>
void ReduceNative(void* dst, const void* a, const void* b, size_t n) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if constexpr (std::is_integral_v<T>) {
    for (size_t i = 0; i < n; ++i) d[i] = ApplyInt<T, Op>(x[i], y[i]);
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = Op::Apply(x[i], y[i]);
  }
}

// 16-bit floats: blocks of widened floats, so that each of the three loops vectorizes.
template <float (*ToF)(uint16_t), uint16_t (*FromF)(float), typename Op>
void Reduce16(void* dst, const void* a, const void* b, size_t n) {
  constexpr size_t kBlock = 256;
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  float fx[kBlock], fy[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    const size_t m = std::min(kBlock, n - base);
    for (size_t i = 0; i < m; ++i) fx[i] = ToF(x[base + i]);
    for (size_t i = 0; i < m; ++i) fy[i] = ToF(y[base + i]);
    for (size_t i = 0; i < m; ++i) d[base + i] = FromF(Op::Apply(fx[i], fy[i]));
  }
}

template <typename Op>
ReduceFn ForOp(ringrun_dtype dtype) {
  switch (dtype) {
    case RINGRUN_INT8: return &ReduceNative<int8_t, Op>;
    case RINGRUN_UINT8: return &ReduceNative<uint8_t, Op>;
    case RINGRUN_INT32: return &ReduceNative<int32_t, Op>;
    case RINGRUN_INT64: return &ReduceNative<int64_t, Op>;
    case RINGRUN_FLOAT16: return &Reduce16<HalfToFloat, FloatToHalf, Op>;
    case RINGRUN_BFLOAT16: return &Reduce16<Bf16ToFloat, FloatToBf16, Op>;
    case RINGRUN_FLOAT32: return &ReduceNative<float, Op>;
    case RINGRUN_FLOAT64: return &ReduceNative<double, Op>;
  }
  return nullptr;
}

}  // namespace

// Branch-free conversions (after F. Giesen's "half <-> float" notes), so loops vectorize.
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  // Normal and subnormal: shift into place and rescale by 2^112 (exponent bias difference).
  const float scaled = BitsFloat(em << 13) * BitsFloat(0x77800000u);  // 2^112
  uint32_t bits = FloatBits(scaled);
  // Inf/NaN: exponent all ones.
  bits = em >= 0x7c00u ? (0x7f800000u | (em & 0x3ffu) << 13) : bits;
  return BitsFloat(bits | sign);
}

uint16_t FloatToHalf(float f) {
  uint32_t u = FloatBits(f);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint16_t out;
  if (u >= 0x47800000u) {  // overflow to inf, or inf/NaN
    out = u > 0x7f800000u ? (0x7e00u | ((u >> 13) & 0x3ffu)) : 0x7c00u;
  } else if (u < 0x38800000u) {  // result is subnormal or zero: let the FPU round
    const float magic = BitsFloat(0x3f000000u);  // 0.5: adding it aligns the mantissa
    out = static_cast<uint16_t>(FloatBits(BitsFloat(u) + magic) - FloatBits(magic));
  } else {
    const uint32_t mant_odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mant_odd;  // rebias and round
    out = static_cast<uint16_t>(u >> 13);
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? ((u >> 16) | 0x40u) : rounded);
}

ReduceFn GetReduceFn(ringrun_dtype dtype, ringrun_op op) {
  if (!IsValidDtype(dtype)) return nullptr;
  switch (op) {
    case RINGRUN_SUM:
    case RINGRUN_AVERAGE: return ForOp<Sum>(dtype);
    case RINGRUN_MIN: return ForOp<Min>(dtype);
    case RINGRUN_MAX: return ForOp<Max>(dtype);
    case RINGRUN_PRODUCT: return ForOp<Prod>(dtype);
  }
  return nullptr;
}

void DivideInPlace(void* buf, size_t n, ringrun_dtype dtype, double divisor) {
  switch (dtype) {
    case RINGRUN_FLOAT32: {
      float* p = static_cast<float*>(buf);
      const float d = static_cast<float>(divisor);
      for (size_t i = 0; i < n; ++i) p[i] /= d;
      break;
    }
    case RINGRUN_FLOAT64: {
      double* p = static_cast<double*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] /= divisor;
      break;
    }
    case RINGRUN_FLOAT16: {
      uint16_t* p = static_cast<uint16_t*>(buf);
      const float d = static_cast<float>(divisor);
      for (size_t i = 0; i < n; ++i) p[i] = FloatToHalf(HalfToFloat(p[i]) / d);
      break;
    }
    case RINGRUN_BFLOAT16: {
      uint16_t* p = static_cast<uint16_t*>(buf);
      const float d = static_cast<float>(divisor);
      for (size_t i = 0; i < n; ++i) p[i] = FloatToBf16(Bf16ToFloat(p[i]) / d);
      break;
    }
    default:
      break;
  }
}

bool IsValidDtype(int d) { return d >= RINGRUN_INT8 && d <= RINGRUN_FLOAT64; }
bool IsValidOp(int o) { return o >= RINGRUN_SUM && o <= RINGRUN_PRODUCT; }
bool IsFloating(ringrun_dtype d) {
  return d == RINGRUN_FLOAT16 || d == RINGRUN_BFLOAT16 || d == RINGRUN_FLOAT32 ||
         d == RINGRUN_FLOAT64;
}

size_t DtypeSize(ringrun_dtype d) {
  switch (d) {
    case RINGRUN_INT8:
    case RINGRUN_UINT8: return 1;
    case RINGRUN_FLOAT16:
    case RINGRUN_BFLOAT16: return 2;
    case RINGRUN_INT32:
    case RINGRUN_FLOAT32: return 4;
    case RINGRUN_INT64:
    case RINGRUN_FLOAT64: return 8;
  }
  return 0;
}

const char* NameOfDtype(ringrun_dtype d) {
  static constexpr const char* kNames[] = {"int8", "uint8", "int32", "int64",
                                           "float16", "bfloat16", "float32", "float64"};
  return IsValidDtype(d) ? kNames[d] : "invalid";
}

const char* NameOfOp(ringrun_op o) {
  static constexpr const char* kNames[] = {"sum", "avg", "min", "max", "prod"};
  return IsValidOp(o) ? kNames[o] : "invalid";
}

}  // namespace ringrun::runtime
