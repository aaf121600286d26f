/* The names of ringrun_dtype and ringrun_op values, and the reverse: one table, shared by the
 * library's error messages, ringrun-bench and the tests. A name is the enum's suffix in lower
 * case ("float16", "average"); parsing ignores case, so "FLOAT16" and "Average" parse too.
 * Header-only (static inline), valid C and C++; no symbol is added to libringrun. */
#ifndef RINGRUN_NAMES_H_
#define RINGRUN_NAMES_H_

#include <stddef.h>
#include <strings.h>

#include "ringrun/ringrun.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RINGRUN_NUM_DTYPES 9 /* 0 (RINGRUN_INT8) .. 8 (RINGRUN_INT16) */
#define RINGRUN_NUM_OPS 5    /* RINGRUN_SUM .. RINGRUN_PRODUCT */

/* "float32"; "invalid" for a value outside the enum. */
static inline const char* ringrun_dtype_name(int dtype) {
  static const char* const kNames[RINGRUN_NUM_DTYPES] = {
      "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64", "int16"};
  return dtype >= 0 && dtype < RINGRUN_NUM_DTYPES ? kNames[dtype] : "invalid";
}
/* "sum"; "invalid" for a value outside the enum. */
static inline const char* ringrun_op_name(int op) {
  static const char* const kNames[RINGRUN_NUM_OPS] = {"sum", "average", "min", "max", "product"};
  return op >= 0 && op < RINGRUN_NUM_OPS ? kNames[op] : "invalid";
}
/* The dtype named `name` (any case) into *dtype: 0, or -1 when no dtype has that name. */
static inline int ringrun_dtype_from_name(const char* name, ringrun_dtype* dtype) {
  for (int i = 0; i < RINGRUN_NUM_DTYPES; ++i) {
    if (strcasecmp(name, ringrun_dtype_name(i)) == 0) {
      *dtype = (ringrun_dtype)i;
      return 0;
    }
  }
  return -1;
}
/* The op named `name` (any case) into *op: 0, or -1 when no op has that name. */
static inline int ringrun_op_from_name(const char* name, ringrun_op* op) {
  for (int i = 0; i < RINGRUN_NUM_OPS; ++i) {
    if (strcasecmp(name, ringrun_op_name(i)) == 0) {
      *op = (ringrun_op)i;
      return 0;
    }
  }
  return -1;
}

#ifdef __cplusplus
}
#endif

#endif /* RINGRUN_NAMES_H_ */
