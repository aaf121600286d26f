// Test values per dtype and op whose reductions are exact in every dtype, and the expected
// results computed independently of the library's reduction code.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ringrun/ringrun.h"
#include "runtime/src/reduce.h"

namespace ringrun::runtime::testing {

inline double InputValue(ringrun_op op, ringrun_dtype d, int rank, size_t i) {
  const uint64_t h = (i * 2654435761u + static_cast<uint64_t>(rank) * 40503u) % 1000003u;
  const bool is_unsigned = d == RINGRUN_UINT8;
  switch (op) {
    case RINGRUN_PRODUCT: {
      static const double kSigned[] = {1, 2, -1, 1, -2};
      return is_unsigned ? static_cast<double>(1 + h % 2) : kSigned[h % 5];
    }
    case RINGRUN_MIN:
    case RINGRUN_MAX:
      return is_unsigned ? static_cast<double>(h % 200) : static_cast<double>(h % 200) - 100;
    case RINGRUN_AVERAGE:
      // fp16 scales its inputs by 1/np before summing: multiples of 60 (= lcm of 1..5) keep
      // every scaled input and partial sum exact, so the exact expectation below holds.
      if (d == RINGRUN_FLOAT16) return (static_cast<double>(h % 41) - 20) * 60;
      return static_cast<double>(h % 41) - 20;
    default:
      return is_unsigned ? static_cast<double>(h % 40) : static_cast<double>(h % 41) - 20;
  }
}

inline void Encode(ringrun_dtype d, double v, void* p) {
  switch (d) {
    case RINGRUN_INT8: {
      int8_t x = static_cast<int8_t>(v);
      std::memcpy(p, &x, 1);
      break;
    }
    case RINGRUN_UINT8: {
      uint8_t x = static_cast<uint8_t>(v);
      std::memcpy(p, &x, 1);
      break;
    }
    case RINGRUN_INT16: {
      int16_t x = static_cast<int16_t>(v);
      std::memcpy(p, &x, 2);
      break;
    }
    case RINGRUN_INT32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case RINGRUN_INT64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case RINGRUN_FLOAT16: {
      uint16_t x = FloatToHalf(static_cast<float>(v));
      std::memcpy(p, &x, 2);
      break;
    }
    case RINGRUN_BFLOAT16: {
      uint16_t x = FloatToBf16(static_cast<float>(v));
      std::memcpy(p, &x, 2);
      break;
    }
    case RINGRUN_FLOAT32: {
      float x = static_cast<float>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case RINGRUN_FLOAT64:
      std::memcpy(p, &v, 8);
      break;
    case RINGRUN_DTYPE_MIN_ENUM_:
    case RINGRUN_DTYPE_MAX_ENUM_:
      break;
  }
}

// Exact expected value (as the dtype's bytes) of element i.
inline void Expected(ringrun_op op, ringrun_dtype d, int np, size_t i, void* out) {
  double acc = InputValue(op, d, 0, i);
  for (int r = 1; r < np; ++r) {
    const double v = InputValue(op, d, r, i);
    switch (op) {
      case RINGRUN_SUM:
      case RINGRUN_AVERAGE:
        acc += v;
        break;
      case RINGRUN_PRODUCT:
        acc *= v;
        break;
      case RINGRUN_MIN:
        acc = std::min(acc, v);
        break;
      case RINGRUN_MAX:
        acc = std::max(acc, v);
        break;
      case RINGRUN_OP_MIN_ENUM_:
      case RINGRUN_OP_MAX_ENUM_:
        break;
    }
  }
  if (d == RINGRUN_INT8) acc = static_cast<double>(static_cast<int8_t>(static_cast<int64_t>(acc)));
  if (d == RINGRUN_UINT8)
    acc = static_cast<double>(static_cast<uint8_t>(static_cast<int64_t>(acc)));
  if (d == RINGRUN_INT16)
    acc = static_cast<double>(static_cast<int16_t>(static_cast<int64_t>(acc)));
  if (op == RINGRUN_AVERAGE && np > 1) {
    if (d == RINGRUN_FLOAT64) {
      acc /= np;
    } else {
      Encode(d, static_cast<double>(static_cast<float>(acc) / static_cast<float>(np)), out);
      return;
    }
  }
  Encode(d, acc, out);
}

inline std::vector<char> Inputs(ringrun_op op, ringrun_dtype d, int rank, size_t count) {
  const size_t e = DtypeSize(d);
  std::vector<char> v(count * e);
  for (size_t i = 0; i < count; ++i) Encode(d, InputValue(op, d, rank, i), v.data() + i * e);
  return v;
}

// "" when buf holds the expected reduction; otherwise where it first differs.
inline std::string CheckReduced(ringrun_op op, ringrun_dtype d, int np, const char* buf,
                                size_t count, size_t first_index = 0) {
  const size_t e = DtypeSize(d);
  char want[8];
  for (size_t i = 0; i < count; ++i) {
    Expected(op, d, np, first_index + i, want);
    if (std::memcmp(want, buf + i * e, e) != 0) {
      return std::string(NameOfDtype(d)) + " " + NameOfOp(op) + " count " + std::to_string(count) +
             ": element " + std::to_string(first_index + i) + " differs";
    }
  }
  return "";
}

inline const std::vector<ringrun_dtype>& AllDtypes() {
  static const std::vector<ringrun_dtype> k = {RINGRUN_INT8,     RINGRUN_UINT8,   RINGRUN_INT16,
                                               RINGRUN_INT32,    RINGRUN_INT64,   RINGRUN_FLOAT16,
                                               RINGRUN_BFLOAT16, RINGRUN_FLOAT32, RINGRUN_FLOAT64};
  return k;
}
inline std::vector<ringrun_op> OpsFor(ringrun_dtype d) {
  std::vector<ringrun_op> ops = {RINGRUN_SUM, RINGRUN_MIN, RINGRUN_MAX, RINGRUN_PRODUCT};
  if (IsFloating(d)) ops.push_back(RINGRUN_AVERAGE);
  return ops;
}

}  // namespace ringrun::runtime::testing
