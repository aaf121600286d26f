// Element-wise reductions over every ringrun dtype and op, and the fp16/bf16 conversions they
// need. The loops are written so that the compiler vectorizes them (this file is built -O3).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ringrun/ringrun.h"

namespace ringrun::runtime {

// dst[i] = a[i] OP b[i] for i < count. dst may equal a or b; otherwise no overlap.
// fp16/bf16 are widened to float, reduced, and rounded back to nearest-even.
using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t count);

// The reduction for (dtype, op); AVERAGE reduces as SUM (the caller scales afterwards).
// nullptr for an invalid pair.
ReduceFn GetReduceFn(ringrun_dtype dtype, ringrun_op op);

// buf[i] /= divisor, for the floating dtypes (AVERAGE's last step).
void DivideInPlace(void* buf, size_t count, ringrun_dtype dtype, double divisor);

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
