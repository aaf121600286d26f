// The dtype and op mapping onto NCCL, and the no-CUDA messages. Pure: no GPU needed.
#include "runtime/src/gpu/nccl_mapping.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>

#include "ringrun/common/gpu_info.h"
#include "ringrun/names.h"

using namespace ringrun;
using namespace ringrun::runtime;
using namespace ringrun::runtime::gpu;

namespace {
constexpr int kNccl = 22809;    // 2.28.9
constexpr int kOldNccl = 2804;  // 2.8.4: before ncclAvg and ncclBfloat16
}  // namespace

TEST_CASE("every ringrun dtype maps onto the NCCL type of the same layout", "[mapping]") {
  const std::pair<ringrun_dtype, ncclDataType_t> expected[] = {
      {RINGRUN_INT8, ncclInt8},       {RINGRUN_UINT8, ncclUint8},
      {RINGRUN_INT32, ncclInt32},     {RINGRUN_INT64, ncclInt64},
      {RINGRUN_FLOAT16, ncclHalf},    {RINGRUN_BFLOAT16, ncclBfloat16},
      {RINGRUN_FLOAT32, ncclFloat32}, {RINGRUN_FLOAT64, ncclFloat64}};
  for (const auto& [dtype, nccl] : expected) {
    INFO(ringrun_dtype_name(dtype));
    Result<ncclDataType_t> r = ToNcclDataType(dtype, kNccl);
    REQUIRE(r.ok());
    CHECK(*r == nccl);
  }
}

TEST_CASE("int16 has no NCCL reduction type and copies move it as a 16-bit type", "[mapping]") {
  Result<ncclDataType_t> r = ToNcclDataType(RINGRUN_INT16, kNccl);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == Code::kInvalidArgument);
  CHECK_THAT(r.status().message(),
             Catch::Contains("int16") && Catch::Contains("NCCL has no 16-bit integer type"));
  Result<ncclDataType_t> copy = ToNcclCopyType(RINGRUN_INT16, kOldNccl);
  REQUIRE(copy.ok());
  CHECK(NcclTypeSize(*copy) == 2);
  // Every other dtype is copied as the type it reduces as.
  for (ringrun_dtype dtype :
       {RINGRUN_INT8, RINGRUN_UINT8, RINGRUN_INT32, RINGRUN_INT64, RINGRUN_FLOAT16,
        RINGRUN_BFLOAT16, RINGRUN_FLOAT32, RINGRUN_FLOAT64}) {
    INFO(ringrun_dtype_name(dtype));
    Result<ncclDataType_t> c = ToNcclCopyType(dtype, kNccl);
    REQUIRE(c.ok());
    CHECK(*c == *ToNcclDataType(dtype, kNccl));
  }
  CHECK_FALSE(ToNcclCopyType(RINGRUN_BFLOAT16, kOldNccl).ok());
}

TEST_CASE("every ringrun op maps onto NCCL's for floating types", "[mapping]") {
  const std::pair<ringrun_op, ncclRedOp_t> expected[] = {{RINGRUN_SUM, ncclSum},
                                                         {RINGRUN_AVERAGE, ncclAvg},
                                                         {RINGRUN_MIN, ncclMin},
                                                         {RINGRUN_MAX, ncclMax},
                                                         {RINGRUN_PRODUCT, ncclProd}};
  for (ringrun_dtype dtype :
       {RINGRUN_FLOAT16, RINGRUN_BFLOAT16, RINGRUN_FLOAT32, RINGRUN_FLOAT64}) {
    for (const auto& [op, nccl] : expected) {
      INFO(ringrun_dtype_name(dtype) << " " << ringrun_op_name(op));
      Result<ncclRedOp_t> r = ToNcclRedOp(op, dtype, kNccl);
      REQUIRE(r.ok());
      CHECK(*r == nccl);
    }
  }
}

TEST_CASE("AVERAGE on an integer type is refused, other integer ops map", "[mapping]") {
  for (ringrun_dtype dtype :
       {RINGRUN_INT8, RINGRUN_UINT8, RINGRUN_INT16, RINGRUN_INT32, RINGRUN_INT64}) {
    INFO(ringrun_dtype_name(dtype));
    Result<ncclRedOp_t> avg = ToNcclRedOp(RINGRUN_AVERAGE, dtype, kNccl);
    REQUIRE_FALSE(avg.ok());
    CHECK(avg.status().code() == Code::kInvalidArgument);
    CHECK_THAT(avg.status().message(), Catch::Contains("AVERAGE is for floating types") &&
                                           Catch::Contains(ringrun_dtype_name(dtype)));
    CHECK(ToNcclRedOp(RINGRUN_SUM, dtype, kNccl).ok());
    CHECK(ToNcclRedOp(RINGRUN_PRODUCT, dtype, kNccl).ok());
    CHECK(ToNcclRedOp(RINGRUN_MIN, dtype, kNccl).ok());
    CHECK(ToNcclRedOp(RINGRUN_MAX, dtype, kNccl).ok());
  }
}

TEST_CASE("what an old NCCL lacks is an error naming its version, never a fallback", "[mapping]") {
  Result<ncclDataType_t> bf16 = ToNcclDataType(RINGRUN_BFLOAT16, kOldNccl);
  REQUIRE_FALSE(bf16.ok());
  CHECK(bf16.status().code() == Code::kInvalidArgument);
  CHECK_THAT(bf16.status().message(), Catch::Contains("BFLOAT16") && Catch::Contains("2.8.4"));
  Result<ncclRedOp_t> avg = ToNcclRedOp(RINGRUN_AVERAGE, RINGRUN_FLOAT32, kOldNccl);
  REQUIRE_FALSE(avg.ok());
  CHECK_THAT(avg.status().message(), Catch::Contains("ncclAvg") && Catch::Contains("2.8.4"));
  // The rest still works on the old NCCL.
  CHECK(ToNcclDataType(RINGRUN_FLOAT16, kOldNccl).ok());
  CHECK(ToNcclRedOp(RINGRUN_SUM, RINGRUN_FLOAT32, kOldNccl).ok());
}

TEST_CASE("values outside the enums are InvalidArgument", "[mapping]") {
  Result<ncclDataType_t> t = ToNcclDataType(static_cast<ringrun_dtype>(42), kNccl);
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == Code::kInvalidArgument);
  CHECK_THAT(t.status().message(), Catch::Contains("42"));
  Result<ncclRedOp_t> o = ToNcclRedOp(static_cast<ringrun_op>(-1), RINGRUN_FLOAT32, kNccl);
  REQUIRE_FALSE(o.ok());
  CHECK(o.status().code() == Code::kInvalidArgument);
}

TEST_CASE("a machine without CUDA is described as --check-gpu shows it", "[mapping]") {
  const char* text = "CUDA driver version is insufficient for CUDA runtime version";
  CHECK_THAT(DescribeCudaUnavailable(cudaErrorInsufficientDriver, text, 0, 13000),
             Catch::StartsWith(std::string("no CUDA driver: ") + text));
  CHECK_THAT(DescribeCudaUnavailable(cudaErrorInsufficientDriver, text, 12020, 13000),
             Catch::StartsWith("CUDA driver 12.2 is older than the runtime 13.0"));
  CHECK_THAT(DescribeCudaUnavailable(cudaErrorNoDevice, "no CUDA-capable device is detected", 13000,
                                     13000),
             Catch::StartsWith("no CUDA device: no CUDA-capable device"));
}

TEST_CASE("PreMulSum scalars are encoded in the dtype, rounded to nearest even", "[mapping]") {
  auto bits16 = [](ringrun_dtype t, double v) {
    unsigned char out[8];
    REQUIRE(EncodeScalar(t, v, out).ok());
    uint16_t b;
    std::memcpy(&b, out, 2);
    return b;
  };
  CHECK(bits16(RINGRUN_FLOAT16, 1.0) == 0x3c00);
  CHECK(bits16(RINGRUN_FLOAT16, 0.1) == 0x2e66);
  CHECK(bits16(RINGRUN_FLOAT16, -0.25) == 0xb400);
  CHECK(bits16(RINGRUN_FLOAT16, 65504.0) == 0x7bff);
  CHECK(bits16(RINGRUN_FLOAT16, 65520.0) == 0x7c00);           // rounds up to infinity
  CHECK(bits16(RINGRUN_FLOAT16, 1.0 / (1 << 24)) == 0x0001);   // the smallest subnormal
  CHECK(bits16(RINGRUN_FLOAT16, 1.0 + 1.0 / 2048) == 0x3c00);  // a tie: to even
  CHECK(bits16(RINGRUN_BFLOAT16, 1.0) == 0x3f80);
  CHECK(bits16(RINGRUN_BFLOAT16, 1.0 + 1.0 / 256) == 0x3f80);  // a tie: to even
  unsigned char out[8];
  REQUIRE(EncodeScalar(RINGRUN_FLOAT64, 0.125, out).ok());
  double d;
  std::memcpy(&d, out, 8);
  CHECK(d == 0.125);
  CHECK(EncodeScalar(RINGRUN_INT32, 2.0, out).code() == Code::kInvalidArgument);
}

TEST_CASE("a one-rank PreMulSum is cut where NCCL's one-rank kernel stops writing", "[mapping]") {
  // 2^20 + 3 floats: 32 blocks of 32768 elements write 2^20; the 3 left need a second call.
  CHECK(NcclOneRankPreMulSumSpan((size_t{1} << 20) + 3, 4) == size_t{1} << 20);
  CHECK(NcclOneRankPreMulSumSpan(3, 4) == 3);
  CHECK(NcclOneRankPreMulSumSpan(size_t{1} << 20, 4) == size_t{1} << 20);
  CHECK(NcclOneRankPreMulSumSpan(1027, 4) == 1027);  // one block, rounded up past the end
  CHECK(NcclOneRankPreMulSumSpan(0, 4) == 0);
  // Every count is covered in at most two pieces, each of which the kernel writes whole.
  for (size_t elem : {1, 2, 4, 8}) {
    for (size_t count = 1; count < 3000000; count = count * 3 / 2 + 7) {
      size_t done = 0;
      int pieces = 0;
      while (done < count) {
        const size_t n = NcclOneRankPreMulSumSpan(count - done, elem);
        REQUIRE(n > 0);
        CHECK(NcclOneRankPreMulSumSpan(n, elem) == n);
        done += n;
        ++pieces;
      }
      CHECK(done == count);
      CHECK(pieces <= 2);
    }
  }
}
