#include "runtime/src/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define RINGRUN_AVX2 __attribute__((target("avx2,f16c")))
#endif

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

// MIN and MAX of floats are IEEE 754-2019 minimum and maximum: NaN if either is NaN (the
// default quiet NaN), -0 below +0. They are computed on integer keys, not float compares: a
// thread that flushes denormals (DAZ, as -ffast-math and torch.set_flush_denormal set) compares
// a denormal as zero, which made min(d, x) and min(x, d) differ. (Ranks also agree on every
// op's bits because the collectives apply each reduction in the same operand order on every
// rank; see Op::incoming_first.)
template <typename T>
using BitsOf = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;

template <typename T>
BitsOf<T> ToBits(T v) {
  BitsOf<T> u;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}
template <typename T>
T FromBits(BitsOf<T> u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}
template <typename T>
constexpr BitsOf<T> kMagnitude = ~BitsOf<T>{0} >> 1;  // every bit but the sign
template <typename T>
constexpr BitsOf<T> kInfBits = sizeof(T) == 4 ? BitsOf<T>(0x7f800000u)
                                              : BitsOf<T>(0x7ff0000000000000ull);
template <typename T>
constexpr BitsOf<T> kQuietNanBits = sizeof(T) == 4 ? BitsOf<T>(0x7fc00000u)
                                                   : BitsOf<T>(0x7ff8000000000000ull);
template <typename T>
bool IsNanBits(BitsOf<T> u) {
  return (u & kMagnitude<T>) > kInfBits<T>;
}
// A signed integer in the order of the value (for non-NaNs): negatives have their magnitude
// bits flipped, so -0 sorts just below +0 and denormals by value.
template <typename T>
std::make_signed_t<BitsOf<T>> OrderKey(BitsOf<T> u) {
  using S = std::make_signed_t<BitsOf<T>>;
  const BitsOf<T> negative = static_cast<BitsOf<T>>(static_cast<S>(u) >> (8 * sizeof(T) - 1));
  return static_cast<S>(u ^ (negative & kMagnitude<T>));
}
struct Sum {
  template <typename T>
  static T Apply(T a, T b) {
    return a + b;
  }
};
struct Prod {
  template <typename T>
  static T Apply(T a, T b) {
    return a * b;
  }
};
template <bool kMin>
struct MinMax {
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      const BitsOf<T> ua = ToBits(a), ub = ToBits(b);
      const auto ka = OrderKey<T>(ua), kb = OrderKey<T>(ub);
      const BitsOf<T> pick = (kMin ? kb < ka : ka < kb) ? ub : ua;
      const bool nan = IsNanBits<T>(ua) || IsNanBits<T>(ub);
      return FromBits<T>(nan ? kQuietNanBits<T> : pick);
    } else {
      return (kMin ? b < a : a < b) ? b : a;
    }
  }
};
using Min = MinMax<true>;
using Max = MinMax<false>;

// Integer sums and products wrap (computed in an unsigned type: no undefined overflow). Types
// narrower than int compute in unsigned int: uint16_t operands would be promoted to int, whose
// product (65535 * 65535) overflows.
template <typename T, typename Op>
T ApplyInt(T a, T b) {
  using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
  if constexpr (std::is_same_v<Op, Sum>) {
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else if constexpr (std::is_same_v<Op, Prod>) {
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return Op::Apply(a, b);
  }
}

// Every kernel is built twice: for the baseline ISA, and (x86-64) for AVX2 with F16C, chosen at
// run time when the CPU has them. The bodies are always-inline templates instantiated inside
// both wrappers, so the compiler vectorizes each for its target.
#define RINGRUN_INLINE inline __attribute__((always_inline))

template <typename T, typename Op>
RINGRUN_INLINE void NativeBody(void* dst, const void* a, const void* b, size_t n) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if constexpr (std::is_integral_v<T>) {
    for (size_t i = 0; i < n; ++i) d[i] = ApplyInt<T, Op>(x[i], y[i]);
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = Op::Apply(x[i], y[i]);
  }
}

// 16-bit floats: blocks of widened floats, so that each of the three loops vectorizes (the
// conversions are branch-free, and this file is built with -fno-trapping-math so that the
// compiler may compute both sides of their selects).
template <float (*ToF)(uint16_t), uint16_t (*FromF)(float), typename Op>
RINGRUN_INLINE void Body16(void* dst, const void* a, const void* b, size_t n) {
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

template <typename T, typename Op>
void ReduceNative(void* dst, const void* a, const void* b, size_t n) {
  NativeBody<T, Op>(dst, a, b, n);
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float), typename Op>
void Reduce16(void* dst, const void* a, const void* b, size_t n) {
  Body16<ToF, FromF, Op>(dst, a, b, n);
}

#if defined(RINGRUN_AVX2)
template <typename T, typename Op>
RINGRUN_AVX2 void ReduceNativeAvx2(void* dst, const void* a, const void* b, size_t n) {
  NativeBody<T, Op>(dst, a, b, n);
}

// Op on eight floats, with the scalar Apply's semantics: MIN/MAX pick an operand by its integer
// order key (no float compares: DAZ-proof), and give the default NaN for a NaN.
template <typename Op>
RINGRUN_AVX2 RINGRUN_INLINE __m256 Apply8(__m256 a, __m256 b) {
  if constexpr (std::is_same_v<Op, Sum>) {
    return _mm256_add_ps(a, b);
  } else if constexpr (std::is_same_v<Op, Prod>) {
    return _mm256_mul_ps(a, b);
  } else {
    const __m256i nan_bits = _mm256_set1_epi32(0x7fc00000);
    static_assert(std::is_same_v<Op, Min> || std::is_same_v<Op, Max>);
    const __m256i ia = _mm256_castps_si256(a), ib = _mm256_castps_si256(b);
    const __m256i mag = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i ka = _mm256_xor_si256(ia, _mm256_and_si256(_mm256_srai_epi32(ia, 31), mag));
    const __m256i kb = _mm256_xor_si256(ib, _mm256_and_si256(_mm256_srai_epi32(ib, 31), mag));
    const __m256i take_b =
        std::is_same_v<Op, Min> ? _mm256_cmpgt_epi32(ka, kb) : _mm256_cmpgt_epi32(kb, ka);
    const __m256i nan = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_and_si256(ia, mag), inf),
                                        _mm256_cmpgt_epi32(_mm256_and_si256(ib, mag), inf));
    const __m256i r = _mm256_blendv_epi8(_mm256_blendv_epi8(ia, ib, take_b), nan_bits, nan);
    return _mm256_castsi256_ps(r);
  }
}

// fp16 with F16C's conversions (exact, round to nearest even), eight elements at a time.
template <typename Op>
RINGRUN_AVX2 void ReduceHalfF16c(void* dst, const void* a, const void* b, size_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 fx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    const __m256 fy = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(Apply8<Op>(fx, fy), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) d[i] = FloatToHalf(Op::Apply(HalfToFloat(x[i]), HalfToFloat(y[i])));
}

// bf16 sixteen elements at a time, with FloatToBf16's rounding and NaN rule. Interleaving with
// zeros widens a bf16 to the float with the same top bits (unpack works within each 128-bit
// half, so the floats come out in a shuffled order, which packus below undoes).
RINGRUN_AVX2 RINGRUN_INLINE __m256i Bf16Round(__m256 f) {  // the bf16 in each lane's low half
  const __m256i u = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

template <typename Op>
RINGRUN_AVX2 void ReduceBf16Avx2(void* dst, const void* a, const void* b, size_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  const __m256i zero = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i vx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i vy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + i));
    const __m256 lo = Apply8<Op>(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, vx)),
                                 _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, vy)));
    const __m256 hi = Apply8<Op>(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, vx)),
                                 _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, vy)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm256_packus_epi32(Bf16Round(lo), Bf16Round(hi)));
  }
  for (; i < n; ++i) d[i] = FloatToBf16(Op::Apply(Bf16ToFloat(x[i]), Bf16ToFloat(y[i])));
}
#endif

template <typename Op>
ReduceFn PortableForOp(ringrun_dtype dtype) {
  switch (dtype) {
    case RINGRUN_INT8:
      return &ReduceNative<int8_t, Op>;
    case RINGRUN_UINT8:
      return &ReduceNative<uint8_t, Op>;
    case RINGRUN_INT16:
      return &ReduceNative<int16_t, Op>;
    case RINGRUN_INT32:
      return &ReduceNative<int32_t, Op>;
    case RINGRUN_INT64:
      return &ReduceNative<int64_t, Op>;
    case RINGRUN_FLOAT16:
      return &Reduce16<HalfToFloat, FloatToHalf, Op>;
    case RINGRUN_BFLOAT16:
      return &Reduce16<Bf16ToFloat, FloatToBf16, Op>;
    case RINGRUN_FLOAT32:
      return &ReduceNative<float, Op>;
    case RINGRUN_FLOAT64:
      return &ReduceNative<double, Op>;
    case RINGRUN_DTYPE_MIN_ENUM_:
    case RINGRUN_DTYPE_MAX_ENUM_:
      break;
  }
  return nullptr;
}

#if defined(RINGRUN_AVX2)
template <typename Op>
ReduceFn Avx2ForOp(ringrun_dtype dtype) {
  switch (dtype) {
    case RINGRUN_INT8:
      return &ReduceNativeAvx2<int8_t, Op>;
    case RINGRUN_UINT8:
      return &ReduceNativeAvx2<uint8_t, Op>;
    case RINGRUN_INT16:
      return &ReduceNativeAvx2<int16_t, Op>;
    case RINGRUN_INT32:
      return &ReduceNativeAvx2<int32_t, Op>;
    case RINGRUN_INT64:
      return &ReduceNativeAvx2<int64_t, Op>;
    case RINGRUN_FLOAT16:
      return &ReduceHalfF16c<Op>;
    case RINGRUN_BFLOAT16:
      return &ReduceBf16Avx2<Op>;
    case RINGRUN_FLOAT32:
      return &ReduceNativeAvx2<float, Op>;
    case RINGRUN_FLOAT64:
      return &ReduceNativeAvx2<double, Op>;
    case RINGRUN_DTYPE_MIN_ENUM_:
    case RINGRUN_DTYPE_MAX_ENUM_:
      break;
  }
  return nullptr;
}
#endif

template <typename Op>
ReduceFn ForOp(ringrun_dtype dtype, ReduceIsa isa) {
#if defined(RINGRUN_AVX2)
  if (isa == ReduceIsa::kBest && HasAvx2()) return Avx2ForOp<Op>(dtype);
#endif
  (void)isa;
  return PortableForOp<Op>(dtype);
}

}  // namespace

// Branch-free conversions (after F. Giesen's "half <-> float" notes), so loops vectorize.
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  const uint32_t shifted = em << 13;  // exponent and mantissa in a float's places
  const uint32_t exponent = em & 0x7c00u;
  // Normal: rebias the exponent (127 - 15). Inf/NaN: exponent all ones.
  const uint32_t normal = shifted + (static_cast<uint32_t>(127 - 15) << 23);
  const uint32_t special = shifted | 0x7f800000u;
  // Subnormal or zero: m * 2^-24 = (2^-14 + m * 2^-24) - 2^-14, a difference of normal floats,
  // so that it stays exact when the thread flushes denormals (DAZ/FTZ, as -ffast-math sets).
  const float two_m14 = BitsFloat(113u << 23);
  const uint32_t subnormal = FloatBits(BitsFloat(shifted + (113u << 23)) - two_m14);
  const uint32_t bits = exponent == 0x7c00u ? special : (exponent == 0 ? subnormal : normal);
  return BitsFloat(bits | sign);
}

uint16_t FloatToHalf(float f) {
  uint32_t u = FloatBits(f);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  // Every case is computed and one selected, so that loops over it vectorize.
  // Overflow to inf, or inf/NaN (NaN stays NaN: quiet bit and the top of the payload).
  const uint32_t special = u > 0x7f800000u ? (0x7e00u | ((u >> 13) & 0x3ffu)) : 0x7c00u;
  // Subnormal or zero: adding 0.5 aligns the mantissa and lets the FPU round.
  const float magic = BitsFloat(0x3f000000u);
  const uint32_t subnormal = FloatBits(BitsFloat(u) + magic) - FloatBits(magic);
  // Normal: rebias, and round to nearest even.
  const uint32_t normal =
      (u + (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + ((u >> 13) & 1u)) >> 13;
  const uint32_t out = u >= 0x47800000u ? special : (u < 0x38800000u ? subnormal : normal);
  return static_cast<uint16_t>(out | (sign >> 16));
}

float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? ((u >> 16) | 0x40u) : rounded);
}

bool HasAvx2() {
#if defined(RINGRUN_AVX2)
  // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports knows no "f16c".
  unsigned a = 0, b = 0, c = 0, d = 0;
  static const bool has =
      __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
  return has;
#else
  return false;
#endif
}

ReduceFn GetReduceFn(ringrun_dtype dtype, ringrun_op op, ReduceIsa isa) {
  if (!IsValidDtype(dtype)) return nullptr;
  switch (op) {
    case RINGRUN_SUM:
    case RINGRUN_AVERAGE:
      return ForOp<Sum>(dtype, isa);
    case RINGRUN_MIN:
      return ForOp<Min>(dtype, isa);
    case RINGRUN_MAX:
      return ForOp<Max>(dtype, isa);
    case RINGRUN_PRODUCT:
      return ForOp<Prod>(dtype, isa);
    case RINGRUN_OP_MIN_ENUM_:
    case RINGRUN_OP_MAX_ENUM_:
      break;
  }
  return nullptr;
}

void ScaleHalf(uint16_t* dst, const uint16_t* src, size_t n, float factor) {
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToHalf(HalfToFloat(src[i]) * factor);
}

void DivideInPlace(void* buf, size_t n, ringrun_dtype dtype, double divisor) {
  // Dividing by a power of two is multiplying by its reciprocal, exactly (both round the same
  // exact value), and a multiply costs a fraction of a divide.
  int exp;
  if (std::frexp(divisor, &exp) == 0.5 && exp > -100 && exp < 100) {
    ScaleInPlace(buf, n, dtype, 1.0 / divisor);
    return;
  }
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

void ScaleInPlace(void* buf, size_t n, ringrun_dtype dtype, double f) {
  switch (dtype) {
    case RINGRUN_FLOAT32: {
      float* p = static_cast<float*>(buf);
      const float g = static_cast<float>(f);
      for (size_t i = 0; i < n; ++i) p[i] *= g;
      break;
    }
    case RINGRUN_FLOAT64: {
      double* p = static_cast<double*>(buf);
      for (size_t i = 0; i < n; ++i) p[i] *= f;
      break;
    }
    case RINGRUN_FLOAT16:
      ScaleHalf(static_cast<uint16_t*>(buf), static_cast<uint16_t*>(buf), n, static_cast<float>(f));
      break;
    case RINGRUN_BFLOAT16: {
      uint16_t* p = static_cast<uint16_t*>(buf);
      const float g = static_cast<float>(f);
      for (size_t i = 0; i < n; ++i) p[i] = FloatToBf16(Bf16ToFloat(p[i]) * g);
      break;
    }
    default:
      break;  // integers are never scaled (refused at submission)
  }
}

void Finish::Apply(void* buf, size_t count) const {
  if (divisor != 1.0) DivideInPlace(buf, count, dtype, divisor);
  if (factor != 1.0) ScaleInPlace(buf, count, dtype, factor);
}

}  // namespace ringrun::runtime
