// Element-wise reductions over every ringrun dtype and op, and the fp16/bf16 conversions they
// need. The loops are written so that the compiler vectorizes them (reduce.cc is built -O3
// -fno-trapping-math).
#pragma once

#include <cstddef>
#include <cstdint>

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

// dst[i] = src[i] * factor, for the floating dtypes (dst may equal src): fp16 AVERAGE's first
// step (see PreScalesAverage).
void ScaleInto(void* dst, const void* src, size_t count, ringrun_dtype dtype, double factor);

// Whether AVERAGE of this dtype scales the inputs by 1/n and sums them (NCCL's PreMulSum)
// rather than summing and dividing: fp16, whose sum can overflow (65504) where the average
// fits. Other floating types sum first, which rounds less.
inline bool PreScalesAverage(ringrun_dtype dtype) { return dtype == RINGRUN_FLOAT16; }

bool IsValidDtype(int dtype);
bool IsValidOp(int op);
bool IsFloating(ringrun_dtype dtype);
size_t DtypeSize(ringrun_dtype dtype);
const char* NameOfDtype(ringrun_dtype dtype);
const char* NameOfOp(ringrun_op op);

// IEEE binary16 and bfloat16 <-> float, round-to-nearest-even, NaN preserved as NaN.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float Bf16ToFloat(uint16_t h);
uint16_t FloatToBf16(float f);

}  // namespace ringrun::runtime
