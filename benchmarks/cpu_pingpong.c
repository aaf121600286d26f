// cpu_pingpong: the round trip of one cache line between two CPUs, in nanoseconds. A diagnostic
// for shared-memory figures: on a VM whose two vCPUs sometimes share an L3 (~60 ns) and sometimes
// do not (~350 ns, seconds at a time), every same-host copy between ranks is several times
// slower while they do not. The benchmark scripts print it next to their results.
//
//   cpu_pingpong [CPU_A CPU_B]      (default 0 1)
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { kRounds = 200000 };
static _Alignas(64) atomic_int flag;
static int cpu_a = 0, cpu_b = 1;

static double Now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int Pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  return pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void* Pong(void* arg) {
  (void)arg;
  Pin(cpu_b);
  for (int i = 0; i < kRounds; i++) {
    while (atomic_load_explicit(&flag, memory_order_acquire) != 2 * i + 1) {
    }
    atomic_store_explicit(&flag, 2 * i + 2, memory_order_release);
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc == 3) cpu_a = atoi(argv[1]), cpu_b = atoi(argv[2]);
  if (Pin(cpu_a) != 0) {
    fprintf(stderr, "cpu_pingpong: cannot run on CPU %d\n", cpu_a);
    return 1;
  }
  pthread_t t;
  pthread_create(&t, NULL, Pong, NULL);
  double t0 = Now();
  for (int i = 0; i < kRounds; i++) {
    atomic_store_explicit(&flag, 2 * i + 1, memory_order_release);
    while (atomic_load_explicit(&flag, memory_order_acquire) != 2 * i + 2) {
    }
  }
  double s = Now() - t0;
  pthread_join(t, NULL);
  printf("cpu-pingpong cpus=%d,%d round_trip_ns=%.0f\n", cpu_a, cpu_b, s / kRounds * 1e9);
  return 0;
}
