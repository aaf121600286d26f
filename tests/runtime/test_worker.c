/* A rank that uses only the public C API (and is written in C, which keeps ringrun.h valid C).
 *   runtime_test_worker check   collectives with known answers; exit 0 when all are right
 *   runtime_test_worker loop    large allreduces until one fails; exit 3 with the error. Prints
 *                               "looping rank=R" once its first allreduce is done: every pair is
 *                               connected and the rank is inside the loop (tests wait for it)
 *   runtime_test_worker reinit  init, allreduce, shutdown, three times over, with two threads
 *                               submitting throughout (shutdown races their calls); exit 0
 *                               when each round's results are right
 *   runtime_test_worker late    every rank but rank 1 enters an allreduce 1.5 s late; rank 1,
 *                               blocked on both ring neighbours, must sleep meanwhile (under
 *                               0.4 s of CPU), not spin
 *   runtime_test_worker delayed S   sleeps S seconds after ringrun_init (its listener open, no
 *                               peer connected yet), then runs `check`
 *   runtime_test_worker oom     on rank 0, a reduce-scatter whose scratch buffer cannot be
 *                               allocated (its address space is capped first) must fail with an
 *                               error, not abort, and leave the runtime failing; rank 0 then
 *                               stays alive 3 s, and the others' reduce-scatter must fail within
 *                               2 s naming it (its connections closed); exit 0 when all that holds
 *   runtime_test_worker engine  named submissions from two threads in a per-rank order, some
 *                               handles released unwaited, ragged allgather, alltoall with
 *                               splits, a mismatch, a duplicate, join with uneven steps, and
 *                               "join" refused as another collective's name
 *   runtime_test_worker fused   steps of 64 named 16 KiB allreduces (fused) until one fails;
 *                               then every pending handle must have failed, not timed out,
 *                               naming a peer (exit 3), or exit 4
 *   runtime_test_worker stall   rank 1 never submits "late" (it sleeps 4 s); the others' handle
 *                               must fail with the stall report (exit 5), or exit 1
 *   runtime_test_worker sets    a process set of every rank but 0 through the C API: its id,
 *                               rank and size, an allreduce (AVERAGE over the set), alltoall
 *                               and its rows, a broadcast from set rank 0 and a barrier on it;
 *                               rank 0's submission refused in Horovod's words (and the set it
 *                               named taken: its next submission runs on the job); removal,
 *                               and the id given again
 *   runtime_test_worker launched   under another launcher (mpirun, srun --mpi=pmix): rank,
 *                               size, local rank and size (and cross rank and size where the
 *                               launcher says) agree with the launcher's own variables
 *                               (OMPI_COMM_WORLD_*, else SLURM_*), an allreduce of rank + 1
 *                               sums to size * (size + 1) / 2, then `check`
 *   runtime_test_worker nofd    a job of one whose process cannot open another descriptor:
 *                               ringrun_init must fail naming the eventfd and the limit, within
 *                               20 s (SIGALRM otherwise), then succeed once one is closed
 * Prints "ok rank=R size=N" on success. Works under `ringrun -np N` or the test's own env. */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "ringrun/ringrun.h"

static int g_rank = -1;

#define CHECK_RC(call)                                                                     \
  do {                                                                                     \
    if ((call) != 0) {                                                                     \
      fprintf(stderr, "rank %d: %s failed: %s\n", g_rank, #call, ringrun_error_message()); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)
#define EXPECT(cond, ...)                   \
  do {                                      \
    if (!(cond)) {                          \
      fprintf(stderr, "rank %d: ", g_rank); \
      fprintf(stderr, __VA_ARGS__);         \
      fprintf(stderr, "\n");                \
      return 1;                             \
    }                                       \
  } while (0)

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16); /* exact for the small integers used here */
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void* bad_root(void* out) {
  int32_t v = 0;
  if (ringrun_broadcast(&v, 1, RINGRUN_INT32, ringrun_size()) != 0) {
    *(char**)out = strdup(ringrun_error_message());
  }
  return NULL;
}

/* Outside a job's lifetime (before ringrun_init, after ringrun_shutdown): shape -1, and a
 * collective fails saying so. */
static int uninitialized(const char* when) {
  float x = 0;
  EXPECT(ringrun_rank() == -1 && ringrun_size() == -1, "%s: rank %d size %d", when, ringrun_rank(),
         ringrun_size());
  EXPECT(ringrun_allreduce(&x, &x, 1, RINGRUN_FLOAT32, RINGRUN_SUM) != 0 &&
             strstr(ringrun_error_message(), "not initialized") != NULL,
         "%s: allreduce: %s", when, ringrun_error_message());
  return 0;
}

static int check(void) {
  const int r = ringrun_rank(), n = ringrun_size();
  {
    /* The stream variants refuse host memory and a NULL stream, before any communication. */
    float h[2] = {1, 2};
    if (ringrun_allreduce_on_stream(h, h, 2, RINGRUN_FLOAT32, RINGRUN_SUM, (void*)h) == 0 ||
        ringrun_broadcast_on_stream(h, 2, RINGRUN_FLOAT32, 0, (void*)0) == 0 ||
        ringrun_allgather_on_stream(h, h, 1, RINGRUN_FLOAT32, (void*)h) == 0) {
      fprintf(stderr, "rank %d: an _on_stream call accepted host memory\n", r);
      return 1;
    }
  }
  const size_t counts[] = {0, 1, 7, 1023, 65537, (1u << 20) + 3};
  for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); ++c) {
    const size_t count = counts[c];
    float* f = malloc((count + 1) * sizeof(float));
    float* g = malloc((count + 1) * sizeof(float));
    uint16_t* b = malloc((count + 1) * sizeof(uint16_t));
    int8_t* i8 = malloc(count + 1);
    int64_t* i64 = malloc((count + 1) * sizeof(int64_t));
    int16_t* i16 = malloc((count + 1) * sizeof(int16_t));
    for (size_t i = 0; i < count; ++i) {
      f[i] = (float)(i % 7) + (float)r;
      b[i] = to_bf16((float)(i % 5) - (float)r);
      i8[i] = (int8_t)((i + r) % 9 - 4);
      i64[i] = (int64_t)(i * 3 + r);
      i16[i] = (int16_t)(uint16_t)(32760 + i % 5 + (size_t)r); /* near the top: sums wrap */
    }
    CHECK_RC(ringrun_allreduce(f, g, count, RINGRUN_FLOAT32, RINGRUN_SUM));
    CHECK_RC(ringrun_allreduce(f, f, count, RINGRUN_FLOAT32, RINGRUN_AVERAGE));
    CHECK_RC(ringrun_allreduce(b, b, count, RINGRUN_BFLOAT16, RINGRUN_SUM));
    CHECK_RC(ringrun_allreduce(i8, i8, count, RINGRUN_INT8, RINGRUN_MIN));
    CHECK_RC(ringrun_allreduce(i64, i64, count, RINGRUN_INT64, RINGRUN_MAX));
    CHECK_RC(ringrun_allreduce(i16, i16, count, RINGRUN_INT16, RINGRUN_SUM));
    for (size_t i = 0; i < count; ++i) {
      const float sum = (float)(n * (int)(i % 7)) + (float)(n * (n - 1) / 2);
      EXPECT(g[i] == sum, "f32 sum count %zu [%zu]: %g != %g", count, i, g[i], sum);
      EXPECT(f[i] == sum / (float)n, "f32 avg count %zu [%zu]", count, i);
      const float bsum = (float)(n * (int)(i % 5)) - (float)(n * (n - 1) / 2);
      EXPECT(from_bf16(b[i]) == bsum, "bf16 sum count %zu [%zu]", count, i);
      int8_t mn = 127;
      for (int p = 0; p < n; ++p) {
        int8_t v = (int8_t)((i + p) % 9 - 4);
        if (v < mn) mn = v;
      }
      EXPECT(i8[i] == mn, "int8 min count %zu [%zu]", count, i);
      EXPECT(i64[i] == (int64_t)(i * 3 + n - 1), "int64 max count %zu [%zu]", count, i);
      long s16 = 0;
      for (int p = 0; p < n; ++p) s16 += (int16_t)(uint16_t)(32760 + i % 5 + (size_t)p);
      EXPECT(i16[i] == (int16_t)(uint16_t)s16, "int16 sum count %zu [%zu]: %d != %d", count, i,
             i16[i], (int16_t)(uint16_t)s16);
    }
    free(f), free(g), free(b), free(i8), free(i64), free(i16);
  }
  /* Broadcast from the last rank, allgather, reduce-scatter, all-to-all, barrier. */
  int32_t bc[1000];
  for (int i = 0; i < 1000; ++i) bc[i] = r == n - 1 ? i * 7 : -1;
  CHECK_RC(ringrun_broadcast(bc, 1000, RINGRUN_INT32, n - 1));
  for (int i = 0; i < 1000; ++i) EXPECT(bc[i] == i * 7, "broadcast [%d]", i);
  double mine[3] = {r, r * 10.0, r * 100.0};
  double* all = malloc(sizeof(double) * 3 * n);
  CHECK_RC(ringrun_allgather(mine, all, 3, RINGRUN_FLOAT64));
  for (int p = 0; p < n; ++p) EXPECT(all[3 * p + 1] == p * 10.0, "allgather block %d", p);
  int32_t* rs = malloc(sizeof(int32_t) * 4 * n);
  int32_t out[4];
  for (int i = 0; i < 4 * n; ++i) rs[i] = i + r;
  CHECK_RC(ringrun_reducescatter(rs, out, 4, RINGRUN_INT32, RINGRUN_SUM));
  for (int i = 0; i < 4; ++i) {
    EXPECT(out[i] == n * (4 * r + i) + n * (n - 1) / 2, "reducescatter [%d]", i);
  }
  for (int i = 0; i < 4 * n; ++i) rs[i] = r * 1000 + i;
  CHECK_RC(ringrun_alltoall(rs, rs, 4, RINGRUN_INT32));
  for (int p = 0; p < n; ++p) EXPECT(rs[4 * p] == p * 1000 + 4 * r, "alltoall from %d", p);
  CHECK_RC(ringrun_barrier());
  /* A bad call fails with a message and changes nothing. */
  EXPECT(ringrun_allreduce(rs, rs, 4, RINGRUN_INT32, RINGRUN_AVERAGE) != 0, "AVERAGE on int");
  EXPECT(strstr(ringrun_error_message(), "AVERAGE") != NULL, "error message: %s",
         ringrun_error_message());
  EXPECT(ringrun_broadcast(bc, 1, RINGRUN_INT32, n) != 0, "root out of range");
  /* Each thread has its own last error: another thread's failure leaves this one's alone. */
  EXPECT(ringrun_allreduce(rs, rs, 4, RINGRUN_INT32, RINGRUN_AVERAGE) != 0, "AVERAGE on int");
  char* theirs = NULL;
  pthread_t t;
  EXPECT(pthread_create(&t, NULL, bad_root, &theirs) == 0 && pthread_join(t, NULL) == 0, "thread");
  EXPECT(theirs != NULL && strstr(theirs, "root") != NULL, "the thread's error: %s",
         theirs ? theirs : "(none)");
  EXPECT(strstr(ringrun_error_message(), "AVERAGE") != NULL,
         "another thread's failure replaced this thread's error: %s", ringrun_error_message());
  free(theirs);
  CHECK_RC(ringrun_barrier());
  free(all), free(rs);
  return 0;
}

static int loop(void) {
  const size_t count = 1u << 22;
  float* buf = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; ++i) buf[i] = 1.0f;
  for (long i = 0;; ++i) {
    if (ringrun_allreduce(buf, buf, count, RINGRUN_FLOAT32, RINGRUN_MAX) != 0) {
      fprintf(stderr, "rank %d: allreduce failed: %s\n", ringrun_rank(), ringrun_error_message());
      free(buf);
      return 3;
    }
    if (i == 0) {
      printf("looping rank=%d\n", ringrun_rank());
      fflush(stdout);
    }
  }
}

#define kTensors 40
#define kLen 33
static float g_bufs[kTensors][kLen];
static ringrun_handle g_handles[kTensors];
static int g_order[kTensors];

static void* submit_half(void* arg) {
  const int parity = *(const int*)arg;
  for (int i = parity; i < kTensors; i += 2) {
    const int t = g_order[i];
    char name[32];
    snprintf(name, sizeof(name), "grad.%d", t);
    if (ringrun_allreduce_submit(name, g_bufs[t], g_bufs[t], kLen, RINGRUN_FLOAT32, RINGRUN_SUM,
                                 1.0, 1.0, 0, &g_handles[t]) != RINGRUN_OK) {
      fprintf(stderr, "rank %d: submit %s: %s\n", g_rank, name, ringrun_error_message());
      g_handles[t] = NULL;
    }
  }
  return NULL;
}

static int engine(void) {
  const int r = ringrun_rank(), n = ringrun_size();
  /* Named allreduces, per-rank order, two submitting threads. */
  for (int t = 0; t < kTensors; ++t) {
    g_order[t] = t;
    for (int i = 0; i < kLen; ++i) g_bufs[t][i] = (float)(t + r);
  }
  srand(1234u + (unsigned)r);
  for (int i = kTensors - 1; i > 0; --i) {
    int j = rand() % (i + 1), x = g_order[i];
    g_order[i] = g_order[j], g_order[j] = x;
  }
  pthread_t th[2];
  int parity[2] = {0, 1};
  for (int k = 0; k < 2; ++k) pthread_create(&th[k], NULL, submit_half, &parity[k]);
  for (int k = 0; k < 2; ++k) pthread_join(th[k], NULL);
  for (int t = 0; t < kTensors; ++t) {
    EXPECT(g_handles[t] != NULL, "grad.%d was refused", t);
    if (t % 2) { /* released unwaited: the engine still completes it */
      ringrun_release(g_handles[t]);
      continue;
    }
    ringrun_status st = ringrun_wait(g_handles[t]);
    EXPECT(st == RINGRUN_OK, "grad.%d: %s: %s", t, ringrun_status_name(st),
           ringrun_handle_message(g_handles[t]));
    EXPECT(strcmp(ringrun_handle_name(g_handles[t]), "") != 0, "no name");
    ringrun_release(g_handles[t]);
  }
  CHECK_RC(ringrun_barrier()); /* after every allreduce above, released ones included */
  for (int t = 0; t < kTensors; ++t) {
    const float want = (float)(n * t + n * (n - 1) / 2);
    EXPECT(g_bufs[t][kLen - 1] == want, "grad.%d = %g, want %g", t, g_bufs[t][kLen - 1], want);
  }
  /* Ragged allgather: rank q sends q+1 rows of 3. */
  int32_t rows[64 * 3];
  for (int i = 0; i < 3 * (r + 1); ++i) rows[i] = r;
  ringrun_handle h;
  CHECK_RC(ringrun_allgather_submit("ragged", rows, (size_t)r + 1, 3, RINGRUN_INT32, &h));
  EXPECT(ringrun_wait(h) == RINGRUN_OK, "ragged: %s", ringrun_handle_message(h));
  const void* out;
  size_t count, per_rank[64];
  CHECK_RC(ringrun_handle_output(h, &out, &count));
  CHECK_RC(ringrun_handle_rows(h, per_rank, (size_t)n));
  EXPECT(count == (size_t)3 * n * (n + 1) / 2, "ragged: %zu elements", count);
  for (int q = 0, at = 0; q < n; at += 3 * (q + 1), ++q) {
    EXPECT(per_rank[q] == (size_t)q + 1 && ((const int32_t*)out)[at] == q, "ragged block %d", q);
  }
  ringrun_release(h);
  /* Alltoall with splits: rank q sends j+1 values 100q+j to rank j. */
  size_t split[64];
  int32_t a2a[64 * 65];
  int k = 0;
  for (int j = 0; j < n; ++j) {
    split[j] = (size_t)j + 1;
    for (int i = 0; i <= j; ++i) a2a[k++] = 100 * r + j;
  }
  CHECK_RC(ringrun_alltoall_submit(NULL, a2a, split, 1, RINGRUN_INT32, &h));
  EXPECT(ringrun_wait(h) == RINGRUN_OK, "alltoall: %s", ringrun_handle_message(h));
  CHECK_RC(ringrun_handle_output(h, &out, &count));
  EXPECT(count == (size_t)n * (r + 1), "alltoall: %zu elements", count);
  for (int q = 0; q < n; ++q) {
    EXPECT(((const int32_t*)out)[q * (r + 1)] == 100 * q + r, "alltoall block %d", q);
  }
  ringrun_release(h);
  /* A mismatch (count) fails on every rank. */
  float m[4] = {1, 1, 1, 1};
  CHECK_RC(ringrun_allreduce_submit("m", m, m, r == 0 ? 4 : 3, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0,
                                    1.0, 0, &h));
  if (n > 1) {
    EXPECT(ringrun_wait(h) == RINGRUN_ERR_MISMATCH &&
               strstr(ringrun_handle_message(h), "disagree on the count") != NULL,
           "mismatch: %s", ringrun_handle_message(h));
  }
  ringrun_release(h);
  /* Shapes (ringrun_next_shapes): one count, shapes (2, 3) and (3, 2), fail on every rank;
   * the next submission has none. A grouped one takes one shape per tensor. */
  {
    float sh[6] = {1, 1, 1, 1, 1, 1};
    const int nd[2] = {2, 1};
    const int64_t dims[3] = {r == 0 ? 2 : 3, r == 0 ? 3 : 2, 6};
    CHECK_RC(ringrun_next_shapes(1, nd, dims));
    CHECK_RC(
        ringrun_allreduce_submit("sh", sh, sh, 6, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0, 1.0, 0, &h));
    if (n > 1) {
      EXPECT(ringrun_wait(h) == RINGRUN_ERR_MISMATCH &&
                 strstr(ringrun_handle_message(h), "disagree on the shape: rank 0 sent (2, 3); ") !=
                     NULL,
             "shape mismatch: %s", ringrun_handle_message(h));
    } else {
      EXPECT(ringrun_wait(h) == RINGRUN_OK, "one rank's shape: %s", ringrun_handle_message(h));
    }
    ringrun_release(h);
    CHECK_RC(
        ringrun_allreduce_submit("sh", sh, sh, 6, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0, 1.0, 0, &h));
    EXPECT(ringrun_wait(h) == RINGRUN_OK, "unshaped: %s", ringrun_handle_message(h));
    ringrun_release(h);
    CHECK_RC(ringrun_next_shapes(1, nd, dims));
    EXPECT(ringrun_grouped_allreduce_submit(
               "shg", 1, (const void* const[]){sh}, (void* const[]){sh}, (const size_t[]){6},
               RINGRUN_FLOAT32, RINGRUN_SUM, 1.0, 1.0, 0, &h) == RINGRUN_OK,
           "grouped with a shape: %s", ringrun_error_message());
    EXPECT(ringrun_wait(h) == (n > 1 ? RINGRUN_ERR_MISMATCH : RINGRUN_OK), "grouped shape: %s",
           ringrun_handle_message(h));
    ringrun_release(h);
    CHECK_RC(ringrun_next_shapes(2, nd, dims)); /* two shapes for one tensor: refused */
    EXPECT(ringrun_allreduce_submit("sh", sh, sh, 6, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0, 1.0, 0,
                                    &h) == RINGRUN_ERR_INVALID_ARGUMENT,
           "two shapes for one tensor were taken");
  }
  /* A duplicate is refused at once: rank 0's "d" cannot complete before the others submit it,
   * which they do only after the barrier. */
  if (n > 1) {
    float d = 1;
    ringrun_handle dup = NULL;
    if (r == 0) {
      CHECK_RC(
          ringrun_allreduce_submit("d", &d, &d, 1, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0, 1.0, 0, &h));
      EXPECT(ringrun_allreduce_submit("d", m, m, 1, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0, 1.0, 0,
                                      &dup) == RINGRUN_ERR_DUPLICATE_NAME &&
                 dup == NULL,
             "duplicate accepted: %s", ringrun_error_message());
      EXPECT(
          ringrun_wait_for(h, 0) == RINGRUN_IN_PROGRESS && ringrun_test(h) == RINGRUN_IN_PROGRESS,
          "a pending handle: ringrun_wait_for(h, 0) = %s",
          ringrun_status_name(ringrun_wait_for(h, 0)));
      EXPECT(ringrun_wait_for(h, 5) == RINGRUN_ERR_TIMEOUT,
             "ringrun_wait_for(h, 5) did not time out");
    }
    CHECK_RC(ringrun_barrier());
    if (r != 0) {
      CHECK_RC(
          ringrun_allreduce_submit("d", &d, &d, 1, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0, 1.0, 0, &h));
    }
    EXPECT(ringrun_wait(h) == RINGRUN_OK && d == (float)n, "d: %s", ringrun_handle_message(h));
    ringrun_release(h);
  }
  /* A name seen before takes the short submission path: what it must still refuse, and a
   * changed argument that it must not hide from negotiation. */
  {
    float k[4] = {1, 1, 1, 1};
    for (int step = 0; step < 3; ++step) {
      CHECK_RC(
          ringrun_allreduce_submit("k", k, k, 2, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0, 1.0, 0, &h));
      EXPECT(ringrun_wait(h) == RINGRUN_OK, "k: %s", ringrun_handle_message(h));
      ringrun_release(h);
    }
    EXPECT(k[0] == 1.0f * (float)n * n * n, "k = %g", k[0]);
    ringrun_handle bad = NULL;
    EXPECT(ringrun_allreduce_submit("k", k, k + 1, 2, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0, 1.0, 0,
                                    &bad) == RINGRUN_ERR_INVALID_ARGUMENT &&
               bad == NULL && strstr(ringrun_error_message(), "overlap") != NULL,
           "overlap: %s", ringrun_error_message());
    EXPECT(ringrun_allreduce_submit("k", k, k, 2, RINGRUN_INT32, RINGRUN_AVERAGE, 1.0, 1.0, 0,
                                    &bad) == RINGRUN_ERR_INVALID_ARGUMENT &&
               strstr(ringrun_error_message(), "AVERAGE needs a floating dtype") != NULL,
           "average: %s", ringrun_error_message());
    EXPECT(ringrun_allreduce_submit("k", NULL, k, 2, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0, 1.0, 0,
                                    &bad) == RINGRUN_ERR_INVALID_ARGUMENT,
           "NULL: %s", ringrun_error_message());
    EXPECT(ringrun_allreduce_submit("k", k, k, 2, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0, 1.0, 64,
                                    &bad) == RINGRUN_ERR_INVALID_ARGUMENT,
           "flags: %s", ringrun_error_message());
    /* Rank 0 changes the count of a cached name: every rank fails it with a mismatch. */
    CHECK_RC(ringrun_allreduce_submit("k", k, k, r == 0 ? 3 : 2, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0,
                                      1.0, 0, &h));
    if (n > 1) {
      EXPECT(ringrun_wait(h) == RINGRUN_ERR_MISMATCH &&
                 strstr(ringrun_handle_message(h), "disagree on the count") != NULL,
             "k mismatch: %s", ringrun_handle_message(h));
    } else {
      EXPECT(ringrun_wait(h) == RINGRUN_OK, "k: %s", ringrun_handle_message(h));
    }
    ringrun_release(h);
    /* And the cached name works again once they agree. */
    k[0] = 1;
    CHECK_RC(ringrun_allreduce_submit("k", k, k, 2, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0, 1.0, 0, &h));
    EXPECT(ringrun_wait(h) == RINGRUN_OK && k[0] == (float)n, "k again: %s",
           ringrun_handle_message(h));
    ringrun_release(h);
    /* The same name as another collective in between, then as the allreduce with the very
     * arguments and buffers of before: an allreduce again, not the broadcast. */
    k[0] = (float)(r + 10);
    CHECK_RC(ringrun_broadcast_submit("k", k, 2, RINGRUN_FLOAT32, 0, &h));
    EXPECT(ringrun_wait(h) == RINGRUN_OK && k[0] == 10.0f, "k broadcast: %s (%g)",
           ringrun_handle_message(h), k[0]);
    ringrun_release(h);
    k[0] = 1;
    CHECK_RC(ringrun_allreduce_submit("k", k, k, 2, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0, 1.0, 0, &h));
    EXPECT(ringrun_wait(h) == RINGRUN_OK && k[0] == (float)n, "k after the broadcast: %s (%g)",
           ringrun_handle_message(h), k[0]);
    ringrun_release(h);
  }
  /* "join" is the join's own name: an allreduce under it is refused at submission, before
   * any join (the general path) and after one (the name has a slot on the short path). */
  for (int k = 0; k < 2; ++k) {
    float j = 1;
    h = NULL;
    EXPECT(ringrun_allreduce_submit("join", &j, &j, 1, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0, 1.0, 0,
                                    &h) == RINGRUN_ERR_INVALID_ARGUMENT &&
               h == NULL && strstr(ringrun_error_message(), "ringrun_join") != NULL,
           "an allreduce named join: %s", ringrun_error_message());
    if (k == 0) CHECK_RC(ringrun_join(NULL));
  }
  /* Join: rank q runs q+1 steps, then joins. */
  for (int step = 0; step <= r; ++step) {
    float g = 2.0f;
    CHECK_RC(ringrun_allreduce(&g, &g, 1, RINGRUN_FLOAT32, RINGRUN_SUM));
    int contributors = n - step;
    EXPECT(g == 2.0f * (float)contributors, "join step %d: %g", step, g);
  }
  int last = -2;
  CHECK_RC(ringrun_join(&last));
  EXPECT(last == n - 1, "last joined %d", last);
  return 0;
}

static int fused(void) {
  enum { kCount = 64, kElems = 4096 };
  float* bufs = malloc((size_t)kCount * kElems * sizeof(float));
  ringrun_handle hs[kCount];
  for (size_t i = 0; i < (size_t)kCount * kElems; ++i) bufs[i] = 1.0f;
  printf("looping rank=%d\n", ringrun_rank());
  fflush(stdout);
  for (;;) {
    for (int t = 0; t < kCount; ++t) {
      char name[32];
      snprintf(name, sizeof(name), "layer.%d", t);
      if (ringrun_allreduce_submit(name, bufs + (size_t)t * kElems, bufs + (size_t)t * kElems,
                                   kElems, RINGRUN_FLOAT32, RINGRUN_MAX, 1.0, 1.0, 0,
                                   &hs[t]) != RINGRUN_OK) {
        fprintf(stderr, "rank %d: submit failed: %s\n", g_rank, ringrun_error_message());
        for (int u = 0; u < t; ++u) ringrun_release(hs[u]);
        free(bufs);
        return strstr(ringrun_error_message(), "peer rank") ? 3 : 4;
      }
    }
    int failed = 0, bad = 0;
    for (int t = 0; t < kCount; ++t) {
      ringrun_status st = ringrun_wait(hs[t]);
      if (st != RINGRUN_OK) {
        ++failed;
        if (failed == 1) {
          fprintf(stderr, "rank %d: %s: %s\n", g_rank, ringrun_handle_name(hs[t]),
                  ringrun_handle_message(hs[t]));
        }
        if (st == RINGRUN_ERR_TIMEOUT || !strstr(ringrun_handle_message(hs[t]), "peer rank")) {
          fprintf(stderr, "rank %d: BAD %s: %s\n", g_rank, ringrun_handle_name(hs[t]),
                  ringrun_handle_message(hs[t]));
          ++bad;
        }
      }
      ringrun_release(hs[t]);
    }
    if (failed) {
      fprintf(stderr, "rank %d: %d handles failed, %d without naming a peer\n", g_rank, failed,
              bad);
      free(bufs);
      return bad ? 4 : 3;
    }
  }
}

static int sets(void) {
  const int r = ringrun_rank(), n = ringrun_size();
  int ranks[64], id = -1;
  for (int q = 1; q < n; ++q) ranks[q - 1] = n - q; /* any order */
  CHECK_RC(ringrun_add_process_set(ranks, (size_t)n - 1, &id));
  EXPECT(id == 1, "id %d", id);
  EXPECT(ringrun_process_set_size(id) == n - 1 && ringrun_process_set_rank(id) == r - 1,
         "set size %d rank %d", ringrun_process_set_size(id), ringrun_process_set_rank(id));
  double v = r;
  ringrun_handle h;
  CHECK_RC(ringrun_next_process_set(id));
  if (r == 0) {
    EXPECT(ringrun_allreduce_submit("x", &v, &v, 1, RINGRUN_FLOAT64, RINGRUN_AVERAGE, 1.0, 1.0, 0,
                                    &h) == RINGRUN_ERR_INVALID_ARGUMENT,
           "a non-member's submission was not refused");
    EXPECT(strcmp(ringrun_error_message(),
                  "Allreduce: Rank 0 is not a member of the provided process set.") == 0,
           "refusal: %s", ringrun_error_message());
  } else {
    CHECK_RC(ringrun_allreduce_submit("x", &v, &v, 1, RINGRUN_FLOAT64, RINGRUN_AVERAGE, 1.0, 1.0, 0,
                                      &h));
    EXPECT(ringrun_wait(h) == RINGRUN_OK, "x: %s", ringrun_handle_message(h));
    ringrun_release(h);
    EXPECT(v == n / 2.0, "average over the set %g", v);
    int32_t send[64], got_rows_ok = 1;
    size_t send_rows[64], rows[64], count = 0;
    for (int q = 0; q < n - 1; ++q) send[q] = 100 * r + q, send_rows[q] = 1;
    CHECK_RC(ringrun_next_process_set(id));
    CHECK_RC(ringrun_alltoall_submit("a2a", send, send_rows, 1, RINGRUN_INT32, &h));
    EXPECT(ringrun_wait(h) == RINGRUN_OK, "a2a: %s", ringrun_handle_message(h));
    const void* out;
    CHECK_RC(ringrun_handle_output(h, &out, &count));
    CHECK_RC(ringrun_handle_rows(h, rows, (size_t)n - 1));
    for (int q = 0; q < n - 1; ++q) {
      got_rows_ok &= rows[q] == 1 && ((const int32_t*)out)[q] == 100 * (q + 1) + (r - 1);
    }
    ringrun_release(h);
    EXPECT(count == (size_t)n - 1 && got_rows_ok, "alltoall on the set");
    int64_t b = r;
    CHECK_RC(ringrun_next_process_set(id));
    CHECK_RC(ringrun_broadcast_submit("bc", &b, 1, RINGRUN_INT64, 0, &h));
    EXPECT(ringrun_wait(h) == RINGRUN_OK && b == 1, "broadcast from set rank 0: %lld",
           (long long)b);
    ringrun_release(h);
    CHECK_RC(ringrun_next_process_set(id));
    CHECK_RC(ringrun_barrier_submit(&h));
    EXPECT(ringrun_wait(h) == RINGRUN_OK, "barrier: %s", ringrun_handle_message(h));
    ringrun_release(h);
  }
  /* The job's own, named as the set's was: never confused with it. */
  v = 1;
  CHECK_RC(ringrun_allreduce_submit("x", &v, &v, 1, RINGRUN_FLOAT64, RINGRUN_SUM, 1.0, 1.0, 0, &h));
  EXPECT(ringrun_wait(h) == RINGRUN_OK && v == n, "the job's x: %s", ringrun_handle_message(h));
  ringrun_release(h);
  CHECK_RC(ringrun_remove_process_set(id));
  EXPECT(ringrun_process_set_size(id) == -1, "removed set still there");
  EXPECT(ringrun_remove_process_set(0) == RINGRUN_ERR_INVALID_ARGUMENT, "removed the job");
  int again = -1;
  CHECK_RC(ringrun_add_process_set(ranks, 1, &again));
  EXPECT(again == id, "id %d given after removing %d", again, id);
  return 0;
}

static int stall(void) {
  float x = 1;
  if (ringrun_rank() == 1) {
    sleep(4);
    return 0;
  }
  ringrun_handle h;
  CHECK_RC(
      ringrun_allreduce_submit("late", &x, &x, 1, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0, 1.0, 0, &h));
  ringrun_status st = ringrun_wait(h);
  fprintf(stderr, "rank %d: %s: %s\n", g_rank, ringrun_status_name(st), ringrun_handle_message(h));
  const int ok = st != RINGRUN_OK && strstr(ringrun_handle_message(h), "rank 1") != NULL;
  ringrun_release(h);
  return ok ? 5 : 1;
}

/* reinit's background threads: C calls in a loop, through the shutdown on the main thread and
 * after it, until a call says the runtime is gone. Any error is fine; a crash or a hang is not. */
static void* hammer(void* arg) {
  const int t = (int)(intptr_t)arg;
  char name[32];
  float x = 1.0f;
  for (int k = 0;; ++k) {
    if (ringrun_rank() < 0) break;
    snprintf(name, sizeof name, "hammer.%d.%d", t, k);
    ringrun_handle h = NULL;
    const ringrun_status st =
        ringrun_allreduce_submit(name, &x, &x, 1, RINGRUN_FLOAT32, RINGRUN_SUM, 1.0, 1.0, 0, &h);
    if (st == RINGRUN_ERR_NOT_INITIALIZED) break;
    if (st == RINGRUN_OK) {
      ringrun_wait_for(h, 20); /* the peers may never submit this name */
      ringrun_release(h);
    }
  }
  return NULL;
}

/* The process's open file descriptors (the entries of /proc/self/fd, less the one listing it). */
static int open_fds(void) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (readdir(d)) ++n;
  closedir(d);
  return n - 3; /* ".", ".." and d's own */
}

static int reinit(void) {
  int fds[3];
  for (int round = 0; round < 3; ++round) {
    if (round > 0) CHECK_RC(ringrun_init());
    pthread_t threads[2];
    for (int t = 0; t < 2; ++t) pthread_create(&threads[t], NULL, hammer, (void*)(intptr_t)t);
    const int n = ringrun_size();
    int64_t v[3] = {ringrun_rank(), round, 1};
    CHECK_RC(ringrun_allreduce(v, v, 3, RINGRUN_INT64, RINGRUN_SUM));
    EXPECT(v[0] == (int64_t)n * (n - 1) / 2 && v[1] == (int64_t)round * n && v[2] == n,
           "round %d: allreduce gave %lld %lld %lld", round, (long long)v[0], (long long)v[1],
           (long long)v[2]);
    ringrun_shutdown(); /* while the threads still call in */
    EXPECT(ringrun_rank() == -1, "round %d: still initialized after shutdown", round);
    for (int t = 0; t < 2; ++t) pthread_join(threads[t], NULL);
    fds[round] = open_fds();
  }
  /* A stopped runtime keeps nothing open (its doorbell goes to the next one), however often a
   * program joins again. */
  EXPECT(fds[2] == fds[0], "%d descriptors open after the first shutdown, %d after the third",
         fds[0], fds[2]);
  return ringrun_init(); /* left initialized: main shuts it down */
}

static double cpu_seconds(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

static int late(void) {
  const size_t count = (size_t)4 << 20;
  float* buf = calloc(count, sizeof(float));
  EXPECT(buf != NULL, "no memory");
  CHECK_RC(ringrun_allreduce(buf, buf, count, RINGRUN_FLOAT32, RINGRUN_SUM)); /* connects */
  if (ringrun_rank() != 1) usleep(1500 * 1000);
  const double c0 = cpu_seconds();
  CHECK_RC(ringrun_allreduce(buf, buf, count, RINGRUN_FLOAT32, RINGRUN_SUM));
  const double used = cpu_seconds() - c0;
  free(buf);
  EXPECT(ringrun_rank() != 1 || used < 0.4,
         "%.2f s of CPU while waiting 1.5 s for a late rank: spinning, not sleeping", used);
  return 0;
}

static int oom(void) {
  const size_t total = (size_t)128 << 20; /* bytes of the reduce-scatter's input */
  const int n = ringrun_size();
  char* send = malloc(total);
  char* recv = malloc(total / (size_t)n);
  EXPECT(send != NULL && recv != NULL, "no memory for the buffers");
  memset(send, 0, total);
  const size_t count = total / (size_t)n / sizeof(float);
  float x = 1;
  CHECK_RC(ringrun_allreduce(&x, &x, 1, RINGRUN_FLOAT32, RINGRUN_SUM)); /* connects */
  if (ringrun_rank() != 0) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    EXPECT(ringrun_reducescatter(send, recv, count, RINGRUN_FLOAT32, RINGRUN_SUM) != 0,
           "a reduce-scatter with a rank out of memory succeeded");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    EXPECT(s < 2.0 && strstr(ringrun_error_message(), "peer rank 0 ") != NULL, "after %.2f s: %s",
           s, ringrun_error_message());
    free(send);
    free(recv);
    return 0;
  }
  /* Cap the address space 32 MiB above what is mapped now: the scratch copy (total bytes)
   * that the reduce-scatter needs cannot fit. */
  FILE* statm = fopen("/proc/self/statm", "r");
  unsigned long pages = 0;
  EXPECT(statm != NULL && fscanf(statm, "%lu", &pages) == 1, "cannot read /proc/self/statm");
  fclose(statm);
  struct rlimit lim;
  getrlimit(RLIMIT_AS, &lim);
  lim.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)32 << 20);
  EXPECT(setrlimit(RLIMIT_AS, &lim) == 0, "setrlimit failed");
  EXPECT(ringrun_reducescatter(send, recv, count, RINGRUN_FLOAT32, RINGRUN_SUM) != 0,
         "a reduce-scatter without memory for its scratch buffer succeeded");
  EXPECT(strstr(ringrun_error_message(), "out of memory") != NULL, "error: %s",
         ringrun_error_message());
  EXPECT(ringrun_allreduce(&x, &x, 1, RINGRUN_FLOAT32, RINGRUN_SUM) != 0 &&
             strstr(ringrun_error_message(), "out of memory") != NULL,
         "the runtime was usable after running out of memory mid-collective");
  sleep(3); /* alive: the others must learn of the failure from the closed connections */
  free(send);
  free(recv);
  return 0;
}

/* Before ringrun_init: the engine's eventfd cannot be made. */
static int nofd(void) {
  struct rlimit lim;
  EXPECT(getrlimit(RLIMIT_NOFILE, &lim) == 0, "getrlimit failed");
  const rlim_t was = lim.rlim_cur;
  lim.rlim_cur = 64;
  EXPECT(setrlimit(RLIMIT_NOFILE, &lim) == 0, "setrlimit failed");
  int first = -1, last = -1;
  for (int fd; (fd = open("/dev/null", O_RDONLY)) >= 0;) {
    if (first < 0) first = fd;
    last = fd;
  }
  EXPECT(last >= 0, "no descriptor was free to begin with");
  alarm(20); /* a hang fails the test (SIGALRM) instead of holding it up */
  EXPECT(ringrun_init() != RINGRUN_OK, "ringrun_init succeeded without a descriptor to spare");
  const char* msg = ringrun_error_message();
  EXPECT(strstr(msg, "eventfd") != NULL && strstr(msg, "ulimit -n") != NULL, "error: %s", msg);
  EXPECT(ringrun_rank() < 0, "a failed ringrun_init left a runtime");
  /* All of them back, and the limit: a sanitizer needs descriptors at exit (its leak check
   * reads /proc/self/maps). */
  for (int fd = first; fd <= last; ++fd) close(fd);
  lim.rlim_cur = was;
  EXPECT(setrlimit(RLIMIT_NOFILE, &lim) == 0, "setrlimit back failed");
  EXPECT(ringrun_init() == RINGRUN_OK, "ringrun_init failed again: %s", ringrun_error_message());
  float x = 2.0f;
  EXPECT(ringrun_allreduce(&x, &x, 1, RINGRUN_FLOAT32, RINGRUN_SUM) == RINGRUN_OK && x == 2.0f,
         "allreduce after a retried init");
  ringrun_shutdown();
  alarm(0);
  printf("ok nofd\n");
  return 0;
}

/* The launcher's value of the first of two variables that is set, or -1. */
static int launcher_int(const char* name, const char* other) {
  const char* v = getenv(name);
  if (v == NULL && other != NULL) v = getenv(other);
  return v != NULL && *v != '\0' ? atoi(v) : -1;
}

static int launched(void) {
  const int rank = launcher_int("OMPI_COMM_WORLD_RANK", "SLURM_PROCID");
  const int size = launcher_int("OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS");
  const int local_rank = launcher_int("OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID");
  /* Slurm says how many tasks each node has only as a list ("2(x2)"): the test says it. */
  const int local_size = launcher_int("OMPI_COMM_WORLD_LOCAL_SIZE", "RINGRUN_TEST_LOCAL_SIZE");
  const int cross_rank = launcher_int("SLURM_NODEID", NULL);
  const int cross_size = launcher_int("SLURM_NNODES", NULL);
  EXPECT(rank >= 0 && size > 0 && local_rank >= 0, "no launcher variables (OMPI_ or SLURM_)");
  EXPECT(ringrun_rank() == rank, "ringrun_rank %d, launcher's %d", ringrun_rank(), rank);
  EXPECT(ringrun_size() == size, "ringrun_size %d, launcher's %d", ringrun_size(), size);
  EXPECT(ringrun_local_rank() == local_rank, "ringrun_local_rank %d, launcher's %d",
         ringrun_local_rank(), local_rank);
  EXPECT(local_size < 0 || ringrun_local_size() == local_size,
         "ringrun_local_size %d, launcher's %d", ringrun_local_size(), local_size);
  EXPECT(cross_rank < 0 || ringrun_cross_rank() == cross_rank,
         "ringrun_cross_rank %d, launcher's %d", ringrun_cross_rank(), cross_rank);
  EXPECT(cross_size < 0 || ringrun_cross_size() == cross_size,
         "ringrun_cross_size %d, launcher's %d", ringrun_cross_size(), cross_size);
  if (local_size == size) {
    EXPECT(ringrun_cross_rank() == 0 && ringrun_cross_size() == 1, "one host: cross %d of %d",
           ringrun_cross_rank(), ringrun_cross_size());
  }
  int64_t v = rank + 1;
  CHECK_RC(ringrun_allreduce(&v, &v, 1, RINGRUN_INT64, RINGRUN_SUM));
  EXPECT(v == (int64_t)size * (size + 1) / 2, "allreduce of rank + 1: %lld", (long long)v);
  printf("launched rank=%d size=%d local=%d/%d cross=%d/%d sum=%lld\n", ringrun_rank(),
         ringrun_size(), ringrun_local_rank(), ringrun_local_size(), ringrun_cross_rank(),
         ringrun_cross_size(), (long long)v);
  fflush(stdout);
  return check();
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "check";
  if (strcmp(mode, "nofd") == 0) return nofd();
  if (uninitialized("before ringrun_init") != 0) return 2;
  if (ringrun_init() != 0) {
    fprintf(stderr, "ringrun_init failed: %s\n", ringrun_error_message());
    return 2;
  }
  g_rank = ringrun_rank();
  int rc = strcmp(mode, "loop") == 0     ? loop()
           : strcmp(mode, "oom") == 0    ? oom()
           : strcmp(mode, "reinit") == 0 ? reinit()
           : strcmp(mode, "late") == 0   ? late()
           : strcmp(mode, "delayed") == 0
               ? (sleep(argc > 2 ? (unsigned)atoi(argv[2]) : 2u), check())
           : strcmp(mode, "engine") == 0   ? engine()
           : strcmp(mode, "fused") == 0    ? fused()
           : strcmp(mode, "stall") == 0    ? stall()
           : strcmp(mode, "sets") == 0     ? sets()
           : strcmp(mode, "launched") == 0 ? launched()
                                           : check();
  if (rc == 0) printf("ok rank=%d size=%d\n", ringrun_rank(), ringrun_size());
  ringrun_shutdown();
  if (rc == 0 && uninitialized("after ringrun_shutdown") != 0) return 1;
  return rc;
}
