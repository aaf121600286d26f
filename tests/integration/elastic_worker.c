/* A rank of an elastic job for the integration tests (run_test.sh, t_elastic_*): it loops
 * allreduces of a known value and, when one fails, leaves and joins the next generation
 * (ringrun_shutdown, ringrun_init), as an elastic training program does.
 *
 * Usage: ringrun-test-elastic-worker STEPS [WORKER STEP kill|leave|fail]
 *   Every step allreduces (SUM) 1.0 from each rank and checks that the sum is the size. After
 *   a join, the ranks agree on the step to go on from: the fewest steps any of them completed.
 *   The worker whose RINGRUN_WORKER_ID is WORKER, on reaching STEP in the first generation,
 *   kills itself with SIGKILL (kill), exits 0 (leave) or exits 3 (fail). The worker named by
 *   ELASTIC_QUIT_ON_ERROR exits 0 at its first failed collective instead of joining again.
 *   Host updates (a discovery script): every ELASTIC_CHECK_EVERY steps (0: never, the default)
 *   the ranks allreduce (MAX) their membership epoch, and when it grew they leave and join the
 *   next generation together ("hosts updated at step N"), as check_host_updates does. A process
 *   whose first join already carries an epoch was started for a grown generation: it takes the
 *   step the others agree on. After such a join, the step to go on from is the fewest that a
 *   rank of the last generation completed.
 * Output, one line each: "joined rank=R size=S local=L/LS cross=C/CS pid=P" after every join
 * ("joined ... new" for a process started for a grown generation);
 * "error at step N: MESSAGE" for a failed collective; "done steps=N size=S pid=P" at the end.
 * Exit codes: 0 done, 1 a join failed, 2 usage, 4 a wrong sum. */
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ringrun/ringrun.h"

static uint64_t Epoch(void) {
  uint64_t e = 0;
  if (ringrun_membership_epoch(&e) != RINGRUN_OK) e = 0;
  return e;
}

/* Joins; *fresh (when not null) is set when this process was started for a grown generation:
 * its first join already carries a membership epoch. */
static int Join(int* fresh) {
  ringrun_status st = ringrun_init();
  if (st != RINGRUN_OK) {
    printf("join failed (%d): %s\n", (int)st, ringrun_error_message());
    fflush(stdout);
    return 0;
  }
  if (fresh) *fresh = Epoch() > 0;
  printf("joined rank=%d size=%d local=%d/%d cross=%d/%d pid=%d%s\n", ringrun_rank(),
         ringrun_size(), ringrun_local_rank(), ringrun_local_size(), ringrun_cross_rank(),
         ringrun_cross_size(), (int)getpid(), fresh && *fresh ? " new" : "");
  fflush(stdout);
  return 1;
}

/* The step to go on from after a join: the fewest any rank of the last generation completed
 * (a new process has none and counts LONG_MAX). 0: the allreduce failed. */
static int Agree(long* step, int fresh) {
  long mine = fresh ? LONG_MAX : *step, least = 0;
  ringrun_status st = ringrun_allreduce(&mine, &least, 1, RINGRUN_INT64, RINGRUN_MIN);
  if (st != RINGRUN_OK) {
    printf("error agreeing on the step (%d): %s\n", (int)st, ringrun_error_message());
    fflush(stdout);
    return 0;
  }
  *step = least;
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 2 && argc != 5) {
    fprintf(stderr, "usage: %s STEPS [WORKER STEP kill|leave|fail]\n", argv[0]);
    return 2;
  }
  const long steps = atol(argv[1]);
  const char* id = getenv("RINGRUN_WORKER_ID");
  const int me = id ? atoi(id) : -1;
  const int victim = argc == 5 ? atoi(argv[2]) : -2;
  const long at = argc == 5 ? atol(argv[3]) : -1;
  const char* how = argc == 5 ? argv[4] : "";
  const char* every_text = getenv("ELASTIC_CHECK_EVERY");
  const long check_every = every_text ? atol(every_text) : 0;
  /* A worker that hangs before it joins, as one stuck in its imports would. */
  const char* hang = getenv("ELASTIC_HANG_WORKER");
  if (hang && atoi(hang) == me) {
    for (;;) pause();
  }
  /* ELASTIC_FAIL_WORKERS=2,4,...: each of these workers exits 3 after ELASTIC_FAIL_AFTER (100)
     steps of its own process (a host whose ranks keep failing). */
  int fails = 0;
  const char* fail_list = getenv("ELASTIC_FAIL_WORKERS");
  for (const char* p = fail_list; p && *p;) {
    char* end;
    long w = strtol(p, &end, 10);
    if (end == p) break;
    if (w == me) fails = 1;
    p = *end == ',' ? end + 1 : end;
  }
  const char* fail_after_text = getenv("ELASTIC_FAIL_AFTER");
  const long fail_after = fail_after_text ? atol(fail_after_text) : 100;
  long taken = 0; /* steps taken by this process */
  int first_generation = 1, fresh = 0;
  if (!Join(&fresh)) return 1;
  long step = 0;
  uint64_t known = Epoch(); /* the epoch this generation answers */
  if (fresh) {
    first_generation = 0;
    while (!Agree(&step, 1)) {
      ringrun_shutdown();
      if (!Join(NULL)) return 1;
    }
  }
  while (step < steps) {
    if (check_every > 0 && step > 0 && step % check_every == 0) {
      uint64_t mine = Epoch(), latest = 0;
      ringrun_status cst = ringrun_allreduce(&mine, &latest, 1, RINGRUN_INT64, RINGRUN_MAX);
      if (cst == RINGRUN_OK && latest > known) {
        printf("hosts updated at step %ld\n", step);
        fflush(stdout);
        known = latest;
        do {
          ringrun_shutdown();
          first_generation = 0;
          if (!Join(NULL)) return 1;
        } while (!Agree(&step, 0));
        if (Epoch() > known) known = Epoch();
        continue;
      }
      if (cst != RINGRUN_OK) {
        printf("error checking the hosts at step %ld (%d): %s\n", step, (int)cst,
               ringrun_error_message());
        fflush(stdout);
        do {
          ringrun_shutdown();
          first_generation = 0;
          if (!Join(NULL)) return 1;
        } while (!Agree(&step, 0));
        continue;
      }
    }
    if (first_generation && me == victim && step == at) {
      printf("%s at step %ld\n", how, step);
      fflush(stdout);
      if (strcmp(how, "kill") == 0) raise(SIGKILL);
      return strcmp(how, "leave") == 0 ? 0 : 3;
    }
    if (fails && taken == fail_after) {
      printf("fail after %ld steps of this process, at step %ld\n", taken, step);
      fflush(stdout);
      return 3;
    }
    double one = 1.0, sum = 0.0;
    ringrun_status st = ringrun_allreduce(&one, &sum, 1, RINGRUN_FLOAT64, RINGRUN_SUM);
    if (st == RINGRUN_OK) {
      if (sum != (double)ringrun_size()) {
        printf("wrong sum %g at step %ld with size %d\n", sum, step, ringrun_size());
        return 4;
      }
      ++step;
      ++taken;
      usleep(2000);
      continue;
    }
    printf("error at step %ld (%d): %s\n", step, (int)st, ringrun_error_message());
    fflush(stdout);
    const char* quit = getenv("ELASTIC_QUIT_ON_ERROR");
    if (quit && atoi(quit) == me) {
      printf("quitting\n");
      return 0;
    }
    do { /* the next generation, until a whole one agrees on the step */
      ringrun_shutdown();
      first_generation = 0;
      if (!Join(NULL)) return 1;
    } while (!Agree(&step, 0));
  }
  printf("done steps=%ld size=%d pid=%d\n", step, ringrun_size(), (int)getpid());
  ringrun_shutdown();
  return 0;
}
