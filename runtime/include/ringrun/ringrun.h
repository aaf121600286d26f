/* libringrun: collectives for the ranks of a ringrun job.
 *
 * A worker calls ringrun_init() once; it joins the job that the launcher described in the
 * environment (RINGRUN_RANK, RINGRUN_SIZE, RINGRUN_JOB_SERVICE, ...). Without that environment
 * the program is a job of size 1 and every collective is a local copy.
 *
 * Contract of every collective:
 *   - returns 0 on success and non-zero on failure; ringrun_error_message() then says why
 *     (per thread, valid until that thread's next ringrun call);
 *   - every rank calls the same collectives in the same order with matching arguments;
 *   - sendbuf == recvbuf means in place;
 *   - arguments are checked before any communication: a rejected call (bad dtype, op, root,
 *     NULL buffer, AVERAGE on an integer type, not initialized) communicates nothing and leaves
 *     the runtime usable;
 *   - a failure during communication (a peer died, the timeout passed) leaves the runtime
 *     broken: every later collective fails fast with the same message;
 *   - every wait is bounded by the collective timeout (RINGRUN_TIMEOUT_MS, default 60000);
 *     a peer that dies is reported by rank and host, at the latest when the timeout passes;
 *   - calls from several threads are serialized; buffers may be host or CUDA device memory
 *     (device memory is routed to the GPU backend when this build has one).
 *
 * Tuning environment (read by ringrun_init): RINGRUN_TIMEOUT_MS, RINGRUN_DISABLE_SHM=1
 * (same-host peers use TCP instead of shared memory).
 */
#ifndef RINGRUN_RINGRUN_H_
#define RINGRUN_RINGRUN_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(RINGRUN_BUILDING_LIBRARY)
#define RINGRUN_API __attribute__((visibility("default")))
#else
#define RINGRUN_API
#endif

typedef enum {
  RINGRUN_INT8,
  RINGRUN_UINT8,
  RINGRUN_INT32,
  RINGRUN_INT64,
  RINGRUN_FLOAT16,
  RINGRUN_BFLOAT16,
  RINGRUN_FLOAT32,
  RINGRUN_FLOAT64
} ringrun_dtype;

/* AVERAGE is the SUM divided by the job size; floating types only. For FLOAT16 the inputs
 * are scaled by 1/size and then summed (as NCCL does), so that an average that fits in fp16
 * never overflows on the way; the other types sum, then divide.
 * MIN and MAX of floating types are IEEE 754-2019 minimum and maximum: NaN if any input is NaN,
 * and -0 below +0. Every rank gets the same bits for every op. Reductions of 16-bit floats
 * compute in float and round once per step, to nearest even. */
typedef enum { RINGRUN_SUM, RINGRUN_AVERAGE, RINGRUN_MIN, RINGRUN_MAX, RINGRUN_PRODUCT } ringrun_op;

/* Joins the job described by the environment that ringrun sets. Calling it again while
 * initialized is a no-op returning 0. Blocks until every rank has joined, or fails at the join
 * timeout. */
RINGRUN_API int ringrun_init(void);
/* Leaves the job: closes connections and shared memory. Safe to call when not initialized.
 * ringrun_init() may be called again afterwards; in a job of more than one rank every rank
 * must, and they meet in a new round of the job service's rendezvous (new peer table). */
RINGRUN_API void ringrun_shutdown(void);

/* The job's shape; -1 before ringrun_init(). local_* count the ranks on this host, cross_*
 * the hosts (cross_rank is this host's index among the job's hosts). */
RINGRUN_API int ringrun_rank(void);
RINGRUN_API int ringrun_size(void);
RINGRUN_API int ringrun_local_rank(void);
RINGRUN_API int ringrun_local_size(void);
RINGRUN_API int ringrun_cross_rank(void);
RINGRUN_API int ringrun_cross_size(void);

/* recvbuf[i] = op over ranks of sendbuf[i], for i < count, on every rank. */
RINGRUN_API int ringrun_allreduce(const void* sendbuf, void* recvbuf, size_t count,
                                  ringrun_dtype dtype, ringrun_op op);
/* buf on every rank becomes buf of root. */
RINGRUN_API int ringrun_broadcast(void* buf, size_t count, ringrun_dtype dtype, int root);
/* recvbuf (size * count elements) holds every rank's sendbuf, in rank order. In place (as in
 * NCCL) means sendbuf == recvbuf + rank * count; any other overlap is handled by a copy. */
RINGRUN_API int ringrun_allgather(const void* sendbuf, void* recvbuf, size_t count,
                                  ringrun_dtype dtype); /* rank order */
/* sendbuf holds size * recvcount elements; rank r gets block r of the reduction in recvbuf
 * (recvcount elements). sendbuf == recvbuf is allowed (the result lands at the start), as is
 * NCCL's in place form recvbuf == sendbuf + rank * recvcount. */
RINGRUN_API int ringrun_reducescatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                      ringrun_dtype dtype, ringrun_op op);
/* Block j (count_per_rank elements) of sendbuf goes to rank j, which stores it as block r of
 * its recvbuf, where r is the sender. Both hold size * count_per_rank elements; in place
 * (sendbuf == recvbuf) is allowed. */
RINGRUN_API int ringrun_alltoall(const void* sendbuf, void* recvbuf, size_t count_per_rank,
                                 ringrun_dtype dtype);
/* Returns once every rank has entered it. */
RINGRUN_API int ringrun_barrier(void);

/* GPU streams. The calls above are synchronous on device memory too: the result is in place
 * when they return. These variants take CUDA device memory only and a cudaStream_t (passed as
 * void* so that this header needs no CUDA header): they enqueue the NCCL collective on
 * `cuda_stream` and return at once; the result is ready when the stream reaches it. Host
 * buffers or a NULL stream are rejected before any communication. */
RINGRUN_API int ringrun_allreduce_async(const void* sendbuf, void* recvbuf, size_t count,
                                        ringrun_dtype dtype, ringrun_op op, void* cuda_stream);
RINGRUN_API int ringrun_broadcast_async(void* buf, size_t count, ringrun_dtype dtype, int root,
                                        void* cuda_stream);
RINGRUN_API int ringrun_allgather_async(const void* sendbuf, void* recvbuf, size_t count,
                                        ringrun_dtype dtype, void* cuda_stream);

/* Why this thread's last failing call failed ("" when it did not fail). Never NULL. */
RINGRUN_API const char* ringrun_error_message(void);

/* Bytes of one element of dtype; 0 for a value that is not a ringrun_dtype. */
RINGRUN_API size_t ringrun_dtype_size(ringrun_dtype dtype);

#ifdef __cplusplus
}
#endif

#endif /* RINGRUN_RINGRUN_H_ */
