// Element-wise reductions over every ringrun dtype and op, and the fp16/bf16 conversions they
// need. The loops are written so that the compiler vectorizes them (reduce.cc is built -O3
// -fno-trapping-math).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ringrun/names.h"
#include "ringrun/ringrun.h"

namespace ringrun::runtime {

// dst[i] = a[i] OP b[i] for i < count. dst may equal a or b; otherwise no overlap.
// fp16/bf16 are widened to float, reduced, and rounded back to nearest-even.
using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t count);

// Which build of the kernels: the fastest this CPU runs (AVX2 with F16C on x86-64 CPUs that
// have them), or the baseline-ISA one (the reference the tests compare the fast one against).
enum class ReduceIsa { kBest, kPortable };

// The reduction for (dtype, op); AVERAGE reduces as SUM (the caller scales afterwards).
// nullptr for an invalid pair.
ReduceFn GetReduceFn(ringrun_dtype dtype, ringrun_op op, ReduceIsa isa = ReduceIsa::kBest);

// Whether kBest is the AVX2/F16C build here.
bool HasAvx2();

// buf[i] /= divisor, for the floating dtypes (AVERAGE's last step).
void DivideInPlace(void* buf, size_t count, ringrun_dtype dtype, double divisor);
// buf[i] *= factor, for the floating dtypes (a pre- or postscale factor).
void ScaleInPlace(void* buf, size_t count, ringrun_dtype dtype, double factor);

// What AVERAGE and a postscale factor do to a reduced result: buf[i] = buf[i] / divisor, then
// * factor, each step skipped when it is 1 (the same two roundings as DivideInPlace followed by
// ScaleInPlace). The collectives apply it to each piece of a result as its last reduction
// writes it, while the piece is still in cache, instead of in a pass of its own afterwards.
struct Finish {
  ringrun_dtype dtype = RINGRUN_FLOAT32;
  double divisor = 1.0;
  double factor = 1.0;
  bool active() const { return divisor != 1.0 || factor != 1.0; }
  void Apply(void* buf, size_t count) const;
};

// fp16 AVERAGE scales the inputs by 1/n and sums them (NCCL's PreMulSum) rather than summing
// and dividing: an fp16 sum can overflow (65504) where the average fits. The other floating
// types sum first, which rounds less. This is its first step: dst[i] = src[i] * factor, in
// float and rounded once (dst may equal src).
void ScaleHalf(uint16_t* dst, const uint16_t* src, size_t count, float factor);

// Inline: every submission calls them.
inline bool IsValidDtype(int d) { return d >= 0 && d < RINGRUN_NUM_DTYPES; }
inline bool IsValidOp(int o) { return o >= 0 && o < RINGRUN_NUM_OPS; }
inline bool IsFloating(ringrun_dtype d) {
  return d == RINGRUN_FLOAT16 || d == RINGRUN_BFLOAT16 || d == RINGRUN_FLOAT32 ||
         d == RINGRUN_FLOAT64;
}
inline size_t DtypeSize(ringrun_dtype d) {
  switch (d) {
    case RINGRUN_INT8:
    case RINGRUN_UINT8:
      return 1;
    case RINGRUN_INT16:
    case RINGRUN_FLOAT16:
    case RINGRUN_BFLOAT16:
      return 2;
    case RINGRUN_INT32:
    case RINGRUN_FLOAT32:
      return 4;
    case RINGRUN_INT64:
    case RINGRUN_FLOAT64:
      return 8;
    case RINGRUN_DTYPE_MIN_ENUM_:
    case RINGRUN_DTYPE_MAX_ENUM_:
      break;
  }
  return 0;
}
// "float32", "sum": the names of ringrun/names.h.
inline const char* NameOfDtype(ringrun_dtype dtype) { return ringrun_dtype_name(dtype); }
inline const char* NameOfOp(ringrun_op op) { return ringrun_op_name(op); }

// IEEE binary16 and bfloat16 <-> float, round-to-nearest-even, NaN preserved as NaN.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float Bf16ToFloat(uint16_t h);
uint16_t FloatToBf16(float f);

}  // namespace ringrun::runtime
