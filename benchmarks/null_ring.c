// null_ring: the "null ring" transport ceiling of the peer programs' ring_limit.c (see
// benchmarks/README.md), across hosts. ring_limit forks its ranks on one host over loopback;
// this runs one rank per process,
// wherever it is started, with the same data movement: NP ranks in a ring, each sending a chunk
// of BYTES/NP to the next and receiving one from the previous, 2(NP-1) times per iteration, with
// no reduction (the bytes a ring allreduce must move, at the links' speed). The send runs on a
// thread, the receive on the caller, exactly as in ring_limit. Rank 0 prints ring_limit's line
// (time_us: the best iteration, as ring_limit reports it) and mean_us, the mean iteration.
//
//   null_ring RANK BYTES ITERS ADDR:PORT ADDR:PORT ...     (one endpoint per rank, in rank order)
//
// Each rank listens on its own endpoint and connects to the next rank's (retrying until it
// listens, for up to 30 s). benchmarks/veth_allreduce.sh runs it on two namespace hosts.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double Now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

struct Io {
  int fd;
  char* buf;
  size_t n;
};

static void* SendAll(void* p) {
  struct Io* a = p;
  for (size_t s = 0; s < a->n;) {
    ssize_t k = send(a->fd, a->buf + s, a->n - s, 0);
    if (k <= 0) {
      perror("null_ring: send");
      exit(3);
    }
    s += (size_t)k;
  }
  return NULL;
}

static void RecvAll(int fd, char* b, size_t n) {
  for (size_t s = 0; s < n;) {
    ssize_t k = recv(fd, b + s, n - s, 0);
    if (k <= 0) {
      fprintf(stderr, "null_ring: recv: %s\n", k == 0 ? "connection closed" : strerror(errno));
      exit(4);
    }
    s += (size_t)k;
  }
}

static int ParseEndpoint(const char* s, struct sockaddr_in* sa) {
  char host[64];
  const char* colon = strrchr(s, ':');
  if (colon == NULL || (size_t)(colon - s) >= sizeof(host)) return -1;
  memcpy(host, s, (size_t)(colon - s));
  host[colon - s] = '\0';
  memset(sa, 0, sizeof(*sa));
  sa->sin_family = AF_INET;
  sa->sin_port = htons((uint16_t)atoi(colon + 1));
  return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -1;
}

int main(int argc, char** argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: null_ring RANK BYTES ITERS ADDR:PORT ADDR:PORT ...\n");
    return 2;
  }
  const int rank = atoi(argv[1]);
  const size_t bytes = strtoull(argv[2], NULL, 0);
  const int iters = atoi(argv[3]);
  const int np = argc - 4;
  struct sockaddr_in me, next;
  if (rank < 0 || rank >= np || ParseEndpoint(argv[4 + rank], &me) != 0 ||
      ParseEndpoint(argv[4 + (rank + 1) % np], &next) != 0) {
    fprintf(stderr, "null_ring: bad rank or endpoint\n");
    return 2;
  }
  int one = 1;
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(ls, (struct sockaddr*)&me, sizeof me) != 0 || listen(ls, 1) != 0) {
    perror("null_ring: bind/listen");
    return 1;
  }
  int nxt = -1;
  for (double t0 = Now(); Now() - t0 < 30;) {
    nxt = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(nxt, (struct sockaddr*)&next, sizeof next) == 0) break;
    close(nxt);
    nxt = -1;
    usleep(10000);
  }
  if (nxt < 0) {
    fprintf(stderr, "null_ring: rank %d: cannot reach %s\n", rank, argv[4 + (rank + 1) % np]);
    return 1;
  }
  int prv = accept(ls, NULL, NULL);
  setsockopt(nxt, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(prv, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const size_t chunk = bytes / (size_t)np;
  char* sb = malloc(chunk);
  char* rb = malloc(chunk);
  memset(sb, rank, chunk);
  double best = 1e9, sum = 0;
  for (int it = 0; it <= iters; it++) {
    double t0 = Now();
    for (int step = 0; step < 2 * (np - 1); step++) {
      pthread_t t;
      struct Io a = {nxt, sb, chunk};
      pthread_create(&t, NULL, SendAll, &a);
      RecvAll(prv, rb, chunk);
      pthread_join(t, NULL);
    }
    double s = Now() - t0;
    if (it > 0) {  // the first pass warms up
      if (s < best) best = s;
      sum += s;
    }
  }
  if (rank == 0) {
    double algbw = (double)bytes / best / 1e9;
    printf("null-ring np=%d bytes=%zu time_us=%.1f algbw_GBps=%.3f busbw_GBps=%.3f mean_us=%.1f\n",
           np, bytes, best * 1e6, algbw, algbw * 2.0 * (np - 1) / np, sum / iters * 1e6);
  }
  return 0;
}
