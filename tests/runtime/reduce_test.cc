#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "reduce.h"

namespace ringrun::runtime {
namespace {

float Bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

TEST_CASE("fp16 conversions round to nearest even", "[reduce]") {
  CHECK(FloatToHalf(1.0f) == 0x3c00);
  CHECK(FloatToHalf(-2.0f) == 0xc000);
  CHECK(FloatToHalf(65504.0f) == 0x7bff);
  CHECK(FloatToHalf(65536.0f) == 0x7c00);  // overflow -> inf
  CHECK(FloatToHalf(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK((FloatToHalf(std::nanf("")) & 0x7fff) > 0x7c00);
  CHECK(FloatToHalf(5.9604645e-8f) == 0x0001);  // smallest subnormal
  CHECK(FloatToHalf(0.0f) == 0x0000);
  CHECK(FloatToHalf(-0.0f) == 0x8000);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
  CHECK(FloatToHalf(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even): rounds up.
  CHECK(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  // Just above a tie rounds up.
  CHECK(FloatToHalf(Bits(0x3f801001)) == 0x3c01);
  // Every half value survives the round trip.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaN payloads
    REQUIRE(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))) == h);
  }
  CHECK(HalfToFloat(0x0001) == std::ldexp(1.0f, -24));
  CHECK(std::isinf(HalfToFloat(0x7c00)));
  CHECK(std::isnan(HalfToFloat(0x7e00)));
}

TEST_CASE("bf16 conversions round to nearest even", "[reduce]") {
  CHECK(FloatToBf16(1.0f) == 0x3f80);
  CHECK(FloatToBf16(Bits(0x3f808000)) == 0x3f80);  // tie, even stays
  CHECK(FloatToBf16(Bits(0x3f818000)) == 0x3f82);  // tie, odd rounds up
  CHECK(FloatToBf16(Bits(0x3f808001)) == 0x3f81);
  CHECK((FloatToBf16(std::nanf("")) & 0x7fff) > 0x7f80);
  CHECK(Bf16ToFloat(0x3f80) == 1.0f);
}

TEST_CASE("fp16 sums are computed in float and rounded once", "[reduce]") {
  // 2048 + 1 is not representable in fp16 (spacing 2): ties to even -> 2048; 2048 + 3 -> 2052.
  uint16_t a[3] = {FloatToHalf(2048), FloatToHalf(2048), FloatToHalf(0.1f)};
  uint16_t b[3] = {FloatToHalf(1), FloatToHalf(3), FloatToHalf(0.2f)};
  uint16_t d[3];
  GetReduceFn(RINGRUN_FLOAT16, RINGRUN_SUM)(d, a, b, 3);
  CHECK(HalfToFloat(d[0]) == 2048);
  CHECK(HalfToFloat(d[1]) == 2052);
  CHECK(d[2] == FloatToHalf(HalfToFloat(a[2]) + HalfToFloat(b[2])));
}

TEST_CASE("reductions of every dtype and op", "[reduce]") {
  int32_t a[5] = {1, -5, 7, 100, -3}, b[5] = {2, 4, -7, 1, -3}, d[5];
  GetReduceFn(RINGRUN_INT32, RINGRUN_MIN)(d, a, b, 5);
  CHECK(d[1] == -5);
  GetReduceFn(RINGRUN_INT32, RINGRUN_MAX)(d, a, b, 5);
  CHECK(d[3] == 100);
  GetReduceFn(RINGRUN_INT32, RINGRUN_PRODUCT)(d, a, b, 5);
  CHECK(d[4] == 9);
  int8_t x = 127, y = 1, z;
  GetReduceFn(RINGRUN_INT8, RINGRUN_SUM)(&z, &x, &y, 1);  // wraps, no UB
  CHECK(z == -128);
  double p[2] = {1.5, 2}, q[2] = {2, 0.25};
  GetReduceFn(RINGRUN_FLOAT64, RINGRUN_PRODUCT)(p, p, q, 2);  // dst == a
  CHECK(p[0] == 3.0);
  CHECK(p[1] == 0.5);
  CHECK(GetReduceFn(static_cast<ringrun_dtype>(42), RINGRUN_SUM) == nullptr);
  float f[2] = {3, 9};
  DivideInPlace(f, 2, RINGRUN_FLOAT32, 3);
  CHECK(f[0] == 1.0f);
  CHECK(f[1] == 3.0f);
}

}  // namespace ringrun::runtime
