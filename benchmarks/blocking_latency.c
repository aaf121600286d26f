/* The latency of one blocking float-sum allreduce, call by call: the median and the 99th
 * percentile of N timed calls (after W untimed ones), per size. Built two ways from this one
 * file, so both sides time the same loop:
 *   cc -O2 blocking_latency.c -lringrun          ringrun_allreduce
 *   mpicc -O2 -DWITH_MPI blocking_latency.c      MPI_Allreduce (Open MPI)
 * Usage: blocking_latency N W BYTES...   Rank 0 prints one line per size:
 *   NAME np=P bytes=B median_us=M p99_us=Q mean_us=A */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef WITH_MPI
#include <mpi.h>
#define NAME "openmpi"
#else
#include "ringrun/ringrun.h"
#define NAME "ringrun"
#endif

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static int allreduce(const float* in, float* out, size_t n) {
#ifdef WITH_MPI
  return MPI_Allreduce(in, out, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS;
#else
  return ringrun_allreduce(in, out, n, RINGRUN_FLOAT32, RINGRUN_SUM) != RINGRUN_OK;
#endif
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s N W BYTES...\n", argv[0]);
    return 2;
  }
  const int iters = atoi(argv[1]), warm = atoi(argv[2]);
  int rank, size;
#ifdef WITH_MPI
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
#else
  if (ringrun_init() != RINGRUN_OK) {
    fprintf(stderr, "ringrun_init: %s\n", ringrun_error_message());
    return 1;
  }
  rank = ringrun_rank(), size = ringrun_size();
#endif
  double* t = malloc(sizeof(double) * (size_t)iters);
  int failed = 0;
  for (int a = 3; a < argc && !failed; ++a) {
    const size_t bytes = strtoull(argv[a], 0, 0), n = bytes / sizeof(float);
    float* in = malloc(bytes + 4);
    float* out = malloc(bytes + 4);
    for (size_t i = 0; i < n; ++i) in[i] = 1.0f;
    for (int i = 0; i < warm && !failed; ++i) failed |= allreduce(in, out, n);
    double sum = 0;
    for (int i = 0; i < iters && !failed; ++i) {
      const double t0 = now_us();
      failed |= allreduce(in, out, n);
      t[i] = now_us() - t0;
      sum += t[i];
    }
    if (n > 0 && out[0] != (float)size) failed = 1;
    qsort(t, (size_t)iters, sizeof(double), cmp);
    if (rank == 0 && !failed) {
      printf("%s np=%d bytes=%zu median_us=%.2f p99_us=%.2f mean_us=%.2f\n", NAME, size, bytes,
             t[iters / 2], t[(size_t)(iters * 0.99)], sum / iters);
      fflush(stdout);
    }
    free(in);
    free(out);
  }
  free(t);
#ifdef WITH_MPI
  MPI_Finalize();
#else
  ringrun_shutdown();
#endif
  return failed;
}
