// How ringrun's public dtypes and ops map onto NCCL's. Pure functions: no CUDA or NCCL call is
// made, so the mapping is unit-tested on machines without a GPU.
//
// Where NCCL (at the version the process actually loaded) lacks a dtype or op, the answer is an
// InvalidArgument that says so; nothing ever falls back to a different type or reduction.
#pragma once

#include <nccl.h>

#include <string>

#include "ringrun/common/status.h"
#include "ringrun/ringrun.h"

namespace ringrun::runtime::gpu {

// The first NCCL that has ncclAvg and ncclBfloat16 (2.10.0, as ncclGetVersion codes it).
inline constexpr int kNcclVersionWithAvgAndBf16 = 21000;

// The first NCCL that has ncclRedOpCreatePreMulSum (2.11.0).
inline constexpr int kNcclVersionWithPreMulSum = 21100;

// FLOAT16 -> ncclFloat16, BFLOAT16 -> ncclBfloat16, ... `nccl_version` is ncclGetVersion's code.
// INT16 is InvalidArgument: NCCL has no 16-bit integer type to reduce (Horovod refuses it too).
Result<ncclDataType_t> ToNcclDataType(ringrun_dtype dtype, int nccl_version);

// The type for collectives that only copy elements (broadcast, allgather, alltoall): the
// reduction type, except INT16, which is copied as ncclFloat16, a type of the same size (NCCL
// copies its bits unchanged).
Result<ncclDataType_t> ToNcclCopyType(ringrun_dtype dtype, int nccl_version);

// SUM -> ncclSum, AVERAGE -> ncclAvg, PRODUCT -> ncclProd, MIN -> ncclMin, MAX -> ncclMax.
// AVERAGE is for floating types only (ringrun.h), whatever NCCL would do with integers.
Result<ncclRedOp_t> ToNcclRedOp(ringrun_op op, ringrun_dtype dtype, int nccl_version);

// Bytes of one element of an NCCL dtype.
size_t NcclTypeSize(ncclDataType_t dtype);

// How many leading elements of a one-rank PreMulSum (`count` elements of `elem_size` bytes) NCCL
// writes. With one rank NCCL runs its own kernel for PreMulSum, and for ncclAvg on floating types
// (ncclLaunchOneRank; seen on an H200 with NCCL 2.28.3): block b of min(32, ceil(bytes / 16 KiB))
// blocks takes [b s, (b + 1) s) with s = alignUp(count / blocks, 16 / elem_size), so the last count
// - blocks * s elements (up to 31) are never written when the division has a remainder that the
// alignment does not absorb: 2^20 + 3 floats leave the last 3 untouched. The backend issues a
// one-rank PreMulSum as the pieces this returns, one after another, and maps AVERAGE at one rank to
// SUM (a copy). Returns `count` when the kernel covers it all.
size_t NcclOneRankPreMulSumSpan(size_t count, size_t elem_size);

// `value` as one element of a floating dtype, rounded to nearest even (the scalar that
// ncclRedOpCreatePreMulSum reads); InvalidArgument for integer dtypes.
Status EncodeScalar(ringrun_dtype dtype, double value, unsigned char (&out)[8]);

}  // namespace ringrun::runtime::gpu
