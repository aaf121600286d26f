#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "runtime/src/reduce.h"

namespace ringrun::runtime {
namespace {

float Bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bool IsNan(ringrun_dtype t, const unsigned char* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, DtypeSize(t));
  switch (t) {
    case RINGRUN_FLOAT16:
      return (v & 0x7fff) > 0x7c00;
    case RINGRUN_BFLOAT16:
      return (v & 0x7fff) > 0x7f80;
    case RINGRUN_FLOAT32:
      return (v & 0x7fffffffu) > 0x7f800000u;
    case RINGRUN_FLOAT64:
      return (v & 0x7fffffffffffffffu) > 0x7ff0000000000000u;
    default:
      return false;
  }
}

}  // namespace

TEST_CASE("the fast kernels give the portable kernels' results, bit for bit", "[reduce]") {
  // On a CPU with AVX2 and F16C, kBest is a separate build of every kernel (fp16 through F16C's
  // conversions, bf16 by hand); it must agree with the portable one everywhere, NaN excepted
  // (any NaN for a NaN). The 16-bit types are checked over every bit pattern of a, against
  // three b's; the lengths leave a tail for the scalar remainder.
  if (!HasAvx2()) WARN("no AVX2/F16C here: kBest is the portable build");
  std::mt19937_64 rng(7);
  const ringrun_dtype dtypes[] = {RINGRUN_INT8,     RINGRUN_UINT8,   RINGRUN_INT16,
                                  RINGRUN_INT32,    RINGRUN_INT64,   RINGRUN_FLOAT16,
                                  RINGRUN_BFLOAT16, RINGRUN_FLOAT32, RINGRUN_FLOAT64};
  const ringrun_op ops[] = {RINGRUN_SUM, RINGRUN_MIN, RINGRUN_MAX, RINGRUN_PRODUCT};
  for (ringrun_dtype t : dtypes) {
    const size_t elem = DtypeSize(t);
    const size_t n = elem == 2 ? 65536 + 13 : 4099;
    std::vector<unsigned char> a(n * elem), b(n * elem);
    for (auto& c : a) c = static_cast<unsigned char>(rng());
    if (elem == 2) {
      for (size_t i = 0; i < 65536; ++i) std::memcpy(&a[i * 2], &i, 2);  // every pattern
    }
    for (int variant = 0; variant < 3; ++variant) {
      for (size_t i = 0; i < b.size(); ++i) {
        b[i] = variant == 0   ? static_cast<unsigned char>(rng())
               : variant == 1 ? a[b.size() - 1 - i]  // a reversed (bytes swapped too)
                              : a[(i + 2 * elem * 977) % a.size()];
      }
      for (ringrun_op op : ops) {
        std::vector<unsigned char> want(a.size()), got(a.size());
        GetReduceFn(t, op, ReduceIsa::kPortable)(want.data(), a.data(), b.data(), n);
        GetReduceFn(t, op, ReduceIsa::kBest)(got.data(), a.data(), b.data(), n);
        size_t bad = 0, first = n;
        for (size_t i = 0; i < n; ++i) {
          const unsigned char* w = &want[i * elem];
          const unsigned char* g = &got[i * elem];
          const bool same = std::memcmp(w, g, elem) == 0 || (IsNan(t, w) && IsNan(t, g));
          if (!same && bad++ == 0) first = i;
        }
        INFO(NameOfDtype(t) << " " << NameOfOp(op) << " variant " << variant << ": first at "
                            << first);
        CHECK(bad == 0);
        // In place (dst == a) gives the same.
        std::vector<unsigned char> in_place = a;
        GetReduceFn(t, op)(in_place.data(), in_place.data(), b.data(), n);
        CHECK(std::memcmp(in_place.data(), got.data(), got.size()) == 0);
      }
    }
  }
}

TEST_CASE("min and max are commutative bit for bit: NaN wins, -0 < +0", "[reduce]") {
  // op(a, b) and op(b, a) must have the same bits, in both builds, also when the thread flushes
  // denormals (DAZ|FTZ: a float compare would see a denormal as zero); checked over every fp16
  // and bf16 pattern against shuffled ones.
  for (int daz = 0; daz < 2; ++daz)
    for (ReduceIsa isa : {ReduceIsa::kPortable, ReduceIsa::kBest}) {
      INFO("daz=" << daz);
#if defined(__x86_64__)
      const unsigned saved_csr = _mm_getcsr();
      if (daz) _mm_setcsr(saved_csr | 0x8040);
#endif
      for (ringrun_dtype t : {RINGRUN_FLOAT16, RINGRUN_BFLOAT16}) {
        std::vector<uint16_t> a(65536), b(65536), ab(65536), ba(65536);
        for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(i);
        std::mt19937 rng(3);
        b = a;
        std::shuffle(b.begin(), b.end(), rng);
        for (size_t i = 0; i < 64; ++i) b[i] = a[i] ^ 0x8000;  // +-0 against -+0, and so on
        for (ringrun_op op : {RINGRUN_MIN, RINGRUN_MAX}) {
          GetReduceFn(t, op, isa)(ab.data(), a.data(), b.data(), a.size());
          GetReduceFn(t, op, isa)(ba.data(), b.data(), a.data(), a.size());
          size_t bad = 0;
          for (size_t i = 0; i < a.size(); ++i) bad += ab[i] != ba[i];
          INFO(NameOfDtype(t) << " " << NameOfOp(op) << (isa == ReduceIsa::kBest ? " best" : ""));
          CHECK(bad == 0);
        }
      }
      const float nan = std::numeric_limits<float>::quiet_NaN();
      const float inf = std::numeric_limits<float>::infinity();
      float x[6] = {0.0f, -0.0f, nan, 1.0f, -inf, Bits(0x7fa00001)};  // the last: a signalling NaN
      float y[6] = {-0.0f, 0.0f, 1.0f, nan, nan, 2.0f};
      float mn[6], mx[6];
      GetReduceFn(RINGRUN_FLOAT32, RINGRUN_MIN, isa)(mn, x, y, 6);
      GetReduceFn(RINGRUN_FLOAT32, RINGRUN_MAX, isa)(mx, x, y, 6);
      CHECK((std::signbit(mn[0]) && mn[0] == 0 && std::signbit(mn[1]) && mn[1] == 0));
      CHECK((!std::signbit(mx[0]) && mx[0] == 0 && !std::signbit(mx[1]) && mx[1] == 0));
      for (int i = 2; i < 6; ++i) {
        INFO("element " << i);
        CHECK(std::isnan(mn[i]));
        CHECK(std::isnan(mx[i]));
      }
      double dx[2] = {0.0, std::nan("")}, dy[2] = {-0.0, -5.0}, dm[2];
      GetReduceFn(RINGRUN_FLOAT64, RINGRUN_MIN, isa)(dm, dx, dy, 2);
      // A denormal against a tiny normal, both orders: the same bits (the smaller, the denormal).
      float den[2] = {Bits(0x00020000), Bits(0x2f8c0000)}, rev[2] = {den[1], den[0]}, m1[2], m2[2];
      GetReduceFn(RINGRUN_FLOAT32, RINGRUN_MIN, isa)(m1, den, rev, 2);
      GetReduceFn(RINGRUN_FLOAT32, RINGRUN_MIN, isa)(m2, rev, den, 2);
#if defined(__x86_64__)
      _mm_setcsr(saved_csr);
#endif
      CHECK((std::signbit(dm[0]) && std::isnan(dm[1])));
      CHECK(std::memcmp(m1, m2, sizeof m1) == 0);
      CHECK(std::memcmp(&m1[0], &den[0], 4) == 0);
    }
}

#if defined(__x86_64__)
TEST_CASE("fp16 subnormals survive a thread that flushes denormals (DAZ/FTZ)", "[reduce]") {
  // -ffast-math and torch.set_flush_denormal set DAZ|FTZ in MXCSR; fp16 subnormals are normal
  // floats once widened, so nothing may pass through a float denormal on the way.
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040);  // FTZ | DAZ
  const float widened = HalfToFloat(0x0001);
  std::vector<uint16_t> a(19, 0x0100), b(19, 0x0001), out(19), avg(19, 0x0100);
  GetReduceFn(RINGRUN_FLOAT16, RINGRUN_SUM, ReduceIsa::kPortable)(out.data(), a.data(), b.data(),
                                                                  19);
  std::vector<uint16_t> fast(19);
  GetReduceFn(RINGRUN_FLOAT16, RINGRUN_SUM)(fast.data(), a.data(), b.data(), 19);  // with a tail
  DivideInPlace(avg.data(), avg.size(), RINGRUN_FLOAT16, 2);
  _mm_setcsr(saved);
  CHECK(widened == std::ldexp(1.0f, -24));
  for (size_t i = 0; i < out.size(); ++i) {
    INFO("element " << i);
    CHECK(out[i] == 0x0101);
    CHECK(fast[i] == 0x0101);
    CHECK(avg[i] == 0x0080);
  }
}
#endif

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

TEST_CASE("int16 sums and products wrap, and MIN and MAX order negatives", "[reduce]") {
  // Both builds of the kernels; 9 elements leave a scalar tail after the AVX2 loop's vectors.
  for (ReduceIsa isa : {ReduceIsa::kPortable, ReduceIsa::kBest}) {
    INFO((isa == ReduceIsa::kBest ? "best" : "portable"));
    const int16_t a[9] = {32767, -32768, -32768, 300, -1, 256, 181, 182, -7};
    const int16_t b[9] = {1, -1, 32767, 300, -1, 256, 181, 182, 3};
    int16_t d[9];
    GetReduceFn(RINGRUN_INT16, RINGRUN_SUM, isa)(d, a, b, 9);
    const int16_t sums[9] = {-32768, 32767, -1, 600, -2, 512, 362, 364, -4};
    for (int i = 0; i < 9; ++i) CHECK(d[i] == sums[i]);
    GetReduceFn(RINGRUN_INT16, RINGRUN_PRODUCT, isa)(d, a, b, 9);
    // 32767 * 1; -32768 * -1 = 32768 wraps to -32768; -32768 * 32767 = -2^31 + 2^15: 2^15 mod
    // 2^16 = -32768; 90000 - 65536; 1; 65536 -> 0; 32761 fits; 33124 - 65536; -21.
    const int16_t products[9] = {32767, -32768, -32768, 24464, 1, 0, 32761, -32412, -21};
    for (int i = 0; i < 9; ++i) CHECK(d[i] == products[i]);
    GetReduceFn(RINGRUN_INT16, RINGRUN_MIN, isa)(d, a, b, 9);
    const int16_t mins[9] = {1, -32768, -32768, 300, -1, 256, 181, 182, -7};
    for (int i = 0; i < 9; ++i) CHECK(d[i] == mins[i]);
    GetReduceFn(RINGRUN_INT16, RINGRUN_MAX, isa)(d, a, b, 9);
    const int16_t maxes[9] = {32767, -1, 32767, 300, -1, 256, 181, 182, 3};
    for (int i = 0; i < 9; ++i) CHECK(d[i] == maxes[i]);
    // AVERAGE reduces as SUM (integers take no AVERAGE at submission; see submission.cc).
    CHECK(GetReduceFn(RINGRUN_INT16, RINGRUN_AVERAGE, isa) ==
          GetReduceFn(RINGRUN_INT16, RINGRUN_SUM, isa));
  }
  CHECK(DtypeSize(RINGRUN_INT16) == 2);
  CHECK(std::string(NameOfDtype(RINGRUN_INT16)) == "int16");
  CHECK_FALSE(IsFloating(RINGRUN_INT16));
}

// ringrun.h gives its enums the range of int (RINGRUN_*_MIN_ENUM_, RINGRUN_*_MAX_ENUM_), so
// any int from a C caller is a value of the type here; the checks reject every one that is not
// a dtype or op (the ASan build runs this with -fsanitize=enum, which reports an out-of-range
// load).
TEST_CASE("any int is a ringrun_dtype or ringrun_op value, and the bad ones are rejected",
          "[reduce]") {
  for (int v : {-1, RINGRUN_NUM_DTYPES, 42, std::numeric_limits<int>::min(),
                std::numeric_limits<int>::max()}) {
    const auto d = static_cast<ringrun_dtype>(v);
    const auto o = static_cast<ringrun_op>(v);
    CHECK_FALSE(IsValidDtype(d));
    CHECK(DtypeSize(d) == 0);
    CHECK(std::string(NameOfDtype(d)) == "invalid");
    CHECK(GetReduceFn(d, RINGRUN_SUM) == nullptr);
    if (v != RINGRUN_NUM_DTYPES) {
      CHECK_FALSE(IsValidOp(o));
      CHECK(std::string(NameOfOp(o)) == "invalid");
      CHECK(GetReduceFn(RINGRUN_INT32, o) == nullptr);
    }
  }
}

}  // namespace ringrun::runtime
