/* libringrun: collectives for the ranks of a ringrun job.
 *
 * A worker calls ringrun_init() once; it joins the job that the launcher described in the
 * environment (RINGRUN_RANK, RINGRUN_SIZE, RINGRUN_JOB_SERVICE, ...). Without that environment
 * the program is a job of size 1 and every collective is a local copy, unless another launcher
 * started it as one of several (then ringrun_init fails; see there). Ranks that a PMIx
 * launcher started (mpirun, srun --mpi=pmix) join through its PMIx server in ringrun_init;
 * ranks that another launcher started join through a store instead: ringrun_init_with_store.
 *
 * Two ways to call a collective:
 *
 *   - Named, asynchronous (ringrun_*_submit): the call returns a handle at once and never waits
 *     for other ranks. A background engine (one thread per process) negotiates with the other
 *     ranks: a tensor runs once every rank has submitted its name, in one order that all ranks
 *     agree on, whatever the order (and the threads) of submission on each rank. Ready
 *     allreduces that share dtype, op, scale factors and device are fused into one collective.
 *     Submissions may come from any number of threads at once.
 *   - Blocking (ringrun_allreduce, ...): submit an unnamed request and wait for it. Every rank
 *     calls the same blocking collectives in the same order, with matching arguments.
 *
 * Names. A name identifies one tensor across ranks; every rank must submit it with the same
 * collective, dtype, element count (allreduce, broadcast, reducescatter), op, scale factors,
 * root and device (host or GPU). A difference is an error on every rank for that tensor
 * (RINGRUN_ERR_MISMATCH; the message names the tensor, the field, and which ranks sent what):
 * it never hangs and never produces a wrong result. Submitting a name that is still in flight
 * on this rank fails at once (RINGRUN_ERR_DUPLICATE_NAME). name == NULL picks
 * "<collective>.noname.<k>", where k counts this rank's unnamed submissions of that collective
 * since ringrun_init(): the same on every rank as long as every rank submits its unnamed
 * requests of each collective in the same order. Names are at most RINGRUN_MAX_NAME_BYTES bytes.
 *
 * Buffers. Everything a submission reads or writes (send and receive buffers, the count
 * arrays are copied at submission) belongs to the library from the submission until the handle
 * completes (ringrun_test/ringrun_wait return something other than RINGRUN_IN_PROGRESS): the
 * caller must neither free nor write them, nor read the receive buffers, in between. A released
 * handle that had not completed still owns its buffers until the collective completes or
 * ringrun_shutdown() returns, whichever is first.
 *
 * Failure.
 *   - Arguments are checked at submission: a rejected call returns an error, creates no handle
 *     and communicates nothing; the runtime stays usable.
 *   - A failure during communication (a peer died or was stopped, the collective timeout
 *     passed, the stall shutdown fired) breaks the runtime: every pending handle on every rank
 *     fails with a message (naming the peer, when one is to blame), and every later submission
 *     or blocking call fails fast with the same message. Nothing hangs: every wait inside the
 *     library is bounded by the collective timeout (RINGRUN_TIMEOUT_MS, default 60000).
 *   - ringrun_shutdown() fails every pending handle with RINGRUN_ERR_ABORTED; the handles stay
 *     valid (test, wait, message, release) after it.
 *   - The status of a failed call is its return value; ringrun_error_message() says why (per
 *     thread, valid until that thread's next ringrun call). A handle carries its own status and
 *     message.
 *
 * Environment read by ringrun_init (the launcher sets these from its flags):
 *   RINGRUN_TIMEOUT_MS                collective timeout (default 60000)
 *   RINGRUN_JOIN_TIMEOUT_MS           how long ringrun_init waits for every rank (default 120000)
 *   RINGRUN_DISABLE_SHM=1             same-host peers use TCP instead of shared memory
 *   RINGRUN_SPIN=0|1|yield            how a wait on a same-host peer waits before it sleeps:
 *                                     1 busy-waits up to 1 ms, yield polls and yields the CPU
 *                                     as long, 0 sleeps at once (default: 1 when the host's
 *                                     ranks do not outnumber its CPUs, else yield)
 *   RINGRUN_FUSION_THRESHOLD          fusion buffer bytes (default 64 MiB; 0 disables fusion);
 *                                     HOROVOD_FUSION_THRESHOLD is read when it is unset
 *   RINGRUN_CACHE_CAPACITY            response cache entries (default 1024)
 *   RINGRUN_BURST_QUIET_US            once woken, the engine gathers submissions into one round
 *                                     until none came for this long or a thread waits on a
 *                                     handle (default 2, at most 1000; 0: start with what
 *                                     woke it)
 *   RINGRUN_STALL_CHECK=0             no stall warnings
 *   RINGRUN_STALL_WARNING_SECONDS     a tensor submitted by some ranks and not others this long
 *                                     is reported, per missing rank (default 60)
 *   RINGRUN_STALL_SHUTDOWN_SECONDS    ... and fails the job after this long (default: never)
 *   RINGRUN_TIMELINE                  write a Chrome trace (see docs/engine.md); DYNAMIC: none
 *                                     until ringrun_start_timeline
 *   RINGRUN_LOG_LEVEL                 trace, debug, info, warn, err, critical or off
 * Horovod's runtime variables (HOROVOD_CYCLE_TIME, HOROVOD_STALL_CHECK_DISABLE, HOROVOD_TIMELINE,
 * HOROVOD_LOG_LEVEL, ...) are read too, with Horovod's units, where ringrun's own is unset; one
 * that means nothing here is logged once by rank 0 (README.md, "Horovod's variables").
 *
 * Buffers may be host or CUDA device memory (device memory is routed to the GPU backend when
 * this build has one); both buffers of a call are of the same kind. A device submission reads
 * its buffers after the work enqueued before it on the legacy default stream (and on the
 * blocking streams that it follows); its handle completes when the result is in place. Device
 * allgather and alltoall results (ringrun_handle_output) are device memory owned by the handle.
 * Scale factors on device memory need SUM or AVERAGE: they are one NCCL PreMulSum factor
 * (prescale * postscale, divided by the size for AVERAGE) in the buffer's dtype, applied to
 * each input before the sum.
 */
#ifndef RINGRUN_RINGRUN_H_
#define RINGRUN_RINGRUN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(RINGRUN_BUILDING_LIBRARY)
#define RINGRUN_API __attribute__((visibility("default")))
#else
#define RINGRUN_API
#endif

/* Every call that can fail returns one of these. The values are ABI: they never change. */
typedef enum {
  RINGRUN_OK = 0,
  RINGRUN_ERR_INVALID_ARGUMENT = 1, /* a rejected argument; nothing was communicated */
  RINGRUN_ERR_NOT_FOUND = 2,        /* a file, host or service that is not there */
  RINGRUN_ERR_TIMEOUT = 3,          /* a deadline passed (the collective or join timeout) */
  RINGRUN_ERR_UNAVAILABLE = 4,      /* a peer or the job service is gone */
  RINGRUN_ERR_PERMISSION_DENIED = 5,
  RINGRUN_ERR_ABORTED = 6,          /* shut down, or the stall shutdown fired */
  RINGRUN_ERR_INTERNAL = 7,         /* a bug or an unexpected system failure (out of memory) */
  RINGRUN_ERR_MISMATCH = 8,         /* ranks submitted one name with different arguments */
  RINGRUN_ERR_DUPLICATE_NAME = 9,   /* the name is still in flight on this rank */
  RINGRUN_ERR_NOT_INITIALIZED = 10, /* outside ringrun_init() .. ringrun_shutdown() */
  RINGRUN_ERR_JOINED = 11,   /* not possible while a rank has joined (see ringrun_join_submit) */
  RINGRUN_IN_PROGRESS = 100, /* ringrun_test: the handle has not completed yet */
  /* Not values. In each public enum, these two give it the range of int: any int that a C
   * caller passes is then a value of the type in C++ as well, which the library checks and
   * rejects, instead of undefined behaviour (C++ allows only the enumerators' bit range). */
  RINGRUN_STATUS_MIN_ENUM_ = -0x7fffffff - 1,
  RINGRUN_STATUS_MAX_ENUM_ = 0x7fffffff
} ringrun_status;

/* Integer sums and products wrap around (two's complement, modulo 2^bits). */
typedef enum {
  RINGRUN_INT8 = 0,
  RINGRUN_UINT8 = 1,
  RINGRUN_INT32 = 2,
  RINGRUN_INT64 = 3,
  RINGRUN_FLOAT16 = 4,
  RINGRUN_BFLOAT16 = 5,
  RINGRUN_FLOAT32 = 6,
  RINGRUN_FLOAT64 = 7,
  RINGRUN_INT16 = 8, /* host memory only for reductions: NCCL has no 16-bit integer */
  RINGRUN_DTYPE_MIN_ENUM_ = -0x7fffffff - 1, /* not dtypes: the range of int (see above) */
  RINGRUN_DTYPE_MAX_ENUM_ = 0x7fffffff
} ringrun_dtype;

/* AVERAGE is the SUM divided by the job size; floating types only. For FLOAT16 the inputs
 * are scaled by 1/size and then summed (as NCCL does), so that an average that fits in fp16
 * never overflows on the way; the other types sum, then divide.
 * MIN and MAX of floating types are IEEE 754-2019 minimum and maximum: NaN if any input is NaN,
 * and -0 below +0. Every rank gets the same bits for every op. Reductions of 16-bit floats
 * compute in float and round once per step, to nearest even. */
typedef enum {
  RINGRUN_SUM = 0,
  RINGRUN_AVERAGE = 1,
  RINGRUN_MIN = 2,
  RINGRUN_MAX = 3,
  RINGRUN_PRODUCT = 4,
  RINGRUN_OP_MIN_ENUM_ = -0x7fffffff - 1, /* not ops: the range of int (see ringrun_status) */
  RINGRUN_OP_MAX_ENUM_ = 0x7fffffff
} ringrun_op;

#define RINGRUN_MAX_NAME_BYTES 1024
/* Dimensions of a tensor's shape (ringrun_next_shapes). */
#define RINGRUN_MAX_DIMS 64

/* Joins the job described by the environment that ringrun sets. Calling it again while
 * initialized is a no-op returning RINGRUN_OK. Blocks until every rank has joined, or fails at
 * the join timeout. Other threads' ringrun_rank() and friends return -1 meanwhile (they do not
 * wait for it). */
RINGRUN_API ringrun_status ringrun_init(void);
/* ringrun_init for a program whose ranks compute on threads of their own while collectives
 * wait (the Python package: the training loop, autograd): `spin` replaces the default of
 * RINGRUN_SPIN (see above) when that variable is not set; 0 sleeps at once, 1 busy-waits,
 * -1 keeps the default. Another value is RINGRUN_ERR_INVALID_ARGUMENT. */
RINGRUN_API ringrun_status ringrun_init_with_spin(int spin);
/* Not in a ringrun job (no RINGRUN_RANK, RINGRUN_SIZE) but with PMIX_RANK and PMIX_NAMESPACE
 * set (Open MPI's mpirun, Slurm's srun --mpi=pmix), ringrun_init() joins through the
 * launcher's PMIx server: rank and size are PMIx's, and the process stays connected to it until
 * it exits (PMIx_Finalize runs at exit); a PMIx server that cannot be joined fails it, never
 * a job of size 1. Otherwise it runs the process as a job of size 1, unless the environment
 * shows another launcher's job of several processes: WORLD_SIZE > 1 (torchrun),
 * HOROVOD_SIZE > 1, OMPI_COMM_WORLD_SIZE > 1 (mpirun), an srun step of SLURM_NTASKS > 1,
 * PMIX_RANK > 0. Then it fails with RINGRUN_ERR_INVALID_ARGUMENT, and the message names the
 * launcher, the variables seen, why PMIx could not be joined (where it was tried) and what to
 * do. */

/* A key-value store that every rank of the job reaches, implemented by the caller: how ranks
 * that another launcher started find each other (the Python package hands in torch's
 * TCPStore under torchrun). Keys are NUL-terminated; values are bytes. Each callback returns
 * RINGRUN_OK, RINGRUN_ERR_TIMEOUT when its wait ran out, or another error; the library calls
 * them from the thread in ringrun_init_with_store, one at a time, and never after it returns.
 * Every key the library uses starts with "ringrun/". */
typedef struct ringrun_store {
  void* context; /* passed to every callback */
  /* Sets key to the `size` bytes at value, replacing any value it had. */
  ringrun_status (*set)(void* context, const char* key, const void* value, size_t size);
  /* Waits up to timeout_ms for some rank to set key, then copies up to `capacity` bytes of its
   * value to `buffer` and sets *size to the value's whole size. When that is more than
   * `capacity`, the library calls again with a buffer large enough. */
  ringrun_status (*get)(void* context, const char* key, int timeout_ms, void* buffer,
                        size_t capacity, size_t* size);
  /* Waits up to timeout_ms until each of the `count` keys is set. */
  ringrun_status (*wait)(void* context, const char* const* keys, size_t count, int timeout_ms);
  /* Adds delta to the integer under key (0 when unset), atomically for all ranks; *result
   * receives the sum. */
  ringrun_status (*add)(void* context, const char* key, int64_t delta, int64_t* result);
  /* Optional (NULL): why the last failed callback failed, kept by the store until its next
   * call; it becomes part of ringrun_error_message(). */
  const char* (*last_error)(void* context);
} ringrun_store;

/* What ringrun_init_with_store needs beyond the store. */
typedef struct ringrun_store_options {
  int rank; /* in [0, size) */
  int size; /* every rank passes the same */
  /* Where the other ranks reach this rank's data plane (this host's address as they see it).
   * It is also the host's identity: ranks that pass the same address are one host, share
   * memory, and make local_rank, local_size, cross_rank and cross_size. */
  const char* address;
  const char* job_id; /* NULL or a name for the job (the timeline and messages show it) */
  /* What started the ranks, for the line logged at the join ("torchrun"); NULL: "a store". */
  const char* source;
  int spin; /* as ringrun_init_with_spin's (-1: the default) */
} ringrun_store_options;

/* ringrun_init for ranks that another launcher started: they find each other through `store`
 * instead of the ringrun job service. Rank 0 makes the job's data-plane secret and shares it
 * through the store, so whoever can read the store can join the data plane (docs/security.md).
 * The environment's other settings (RINGRUN_TIMEOUT_MS, RINGRUN_JOIN_TIMEOUT_MS, ...) apply as
 * for ringrun_init. Calling it while initialized is a no-op returning RINGRUN_OK. Blocks until
 * every rank has joined; fails at the join timeout (rank 0's message names the ranks that did
 * not come, and the others fail with it), and with RINGRUN_ERR_INVALID_ARGUMENT for options
 * that do not fit (a NULL callback other than last_error, a rank outside [0, size), ranks
 * that disagree on the size, two processes with one rank). After ringrun_shutdown() it may be
 * called again, with the same store: every rank does, and they meet in a new round. */
RINGRUN_API ringrun_status ringrun_init_with_store(const ringrun_store* store,
                                                   const ringrun_store_options* options);

/* Leaves the job: stops the engine (pending handles fail with RINGRUN_ERR_ABORTED), closes
 * connections and shared memory. Safe to call when not initialized. Returns once the engine
 * thread has stopped: no buffer is touched after it. ringrun_init() may be called again
 * afterwards; in a job of more than one rank every rank must, and they meet in a new round of
 * the job service's rendezvous (new peer table). A call on another thread that is still running
 * fails with RINGRUN_ERR_ABORTED or RINGRUN_ERR_NOT_INITIALIZED. What is left of the runtime
 * (a few kilobytes) stays allocated until the process exits. */
RINGRUN_API void ringrun_shutdown(void);

/* Elastic jobs (ringrun --min-np/--max-np; docs/elastic.md). When a rank of the job fails
 * (exits non-zero, is killed) or its host is lost, the survivors' pending and later
 * collectives fail fast with RINGRUN_ERR_UNAVAILABLE (the peer's connections closed) or,
 * for a peer that went silent, RINGRUN_ERR_TIMEOUT; the message names the peer's rank and its
 * host ("rank 2 on host h2 (10.0.0.3:41234)"). The runtime stays broken until the program
 * calls ringrun_shutdown() and then ringrun_init(): that init joins the next generation that
 * the launcher formed from the survivors, and ringrun_rank(), ringrun_size() and the local and
 * cross shape report the new values (the launcher's RINGRUN_RANK etc. in the environment keep
 * the first generation's). Each generation has its own data-plane secret from the job
 * service, so a process of an earlier generation cannot connect to a later one. An init by a
 * process that the new generation left out (its host was blacklisted, the job went on
 * without it) fails with RINGRUN_ERR_INVALID_ARGUMENT naming the generation; a job being torn
 * down fails it with RINGRUN_ERR_ABORTED.
 *
 * While an elastic rank is initialized, the launcher can tell it things through the job
 * service (the rank listens from its init to its shutdown, on a thread of the library's): a
 * new membership epoch (below), or that its generation is broken (a host was lost without its
 * connections closing): then its pending and later collectives fail with
 * RINGRUN_ERR_UNAVAILABLE and the launcher's reason, and it shuts down and inits as above.
 *
 * ringrun_membership_epoch sets *epoch to the membership epoch: a counter the launcher raises
 * when the job's host set changed and a new generation is pending, given with the join and
 * raised by the launcher's notices while the rank runs (0 when it never did, and in jobs that
 * are not elastic). Safe to call at any time, even before ringrun_init().
 * RINGRUN_ERR_INVALID_ARGUMENT for a NULL epoch. */
RINGRUN_API ringrun_status ringrun_membership_epoch(uint64_t* epoch);

/* The job's shape; -1 before ringrun_init(). local_* count the ranks on this host, cross_*
 * the hosts (cross_rank is this host's index among the job's hosts). */
RINGRUN_API int ringrun_rank(void);
RINGRUN_API int ringrun_size(void);
RINGRUN_API int ringrun_local_rank(void);
RINGRUN_API int ringrun_local_size(void);
RINGRUN_API int ringrun_cross_rank(void);
RINGRUN_API int ringrun_cross_size(void);

/* ---- Handles ---------------------------------------------------------------------------- */

/* One submitted collective. Opaque; every handle returned must be released exactly once. A
 * handle may be tested, waited on and read from any thread. */
typedef struct ringrun_handle_s* ringrun_handle;

/* RINGRUN_IN_PROGRESS while pending, otherwise the handle's final status. Never blocks. */
RINGRUN_API ringrun_status ringrun_test(ringrun_handle handle);
/* Blocks until the handle completes and returns its final status, or returns
 * RINGRUN_ERR_TIMEOUT after the collective timeout (the handle then stays pending and may be
 * waited on again; a tensor that some rank never submits is reported by the stall
 * inspector). */
RINGRUN_API ringrun_status ringrun_wait(ringrun_handle handle);
/* As ringrun_wait, with a timeout in milliseconds; 0 or less is ringrun_test (it returns
 * RINGRUN_IN_PROGRESS while pending, where a timeout returns RINGRUN_ERR_TIMEOUT). */
RINGRUN_API ringrun_status ringrun_wait_for(ringrun_handle handle, int timeout_ms);
/* Why the handle failed ("" while pending or after success). Never NULL; valid until the
 * handle is released. */
RINGRUN_API const char* ringrun_handle_message(ringrun_handle handle);
/* The tensor's name (as given, or the default one). Valid until the handle is released. */
RINGRUN_API const char* ringrun_handle_name(ringrun_handle handle);
/* Allgather and alltoall: the result, owned by the handle (valid until it is released):
 * *data points at *count elements of the submission's dtype, the blocks of every rank in rank
 * order. RINGRUN_ERR_INVALID_ARGUMENT for other collectives or a handle that has not
 * completed successfully. */
RINGRUN_API ringrun_status ringrun_handle_output(ringrun_handle handle, const void** data,
                                                 size_t* count);
/* Allgather and alltoall: rows[r] = the rows (first dimension) of the result that came from
 * rank r, for r < n (n must be ringrun_size()). */
RINGRUN_API ringrun_status ringrun_handle_rows(ringrun_handle handle, size_t* rows, size_t n);
/* Join: the last rank that joined; -1 for other handles or before completion. */
RINGRUN_API int ringrun_handle_last_joined_rank(ringrun_handle handle);
/* Frees the handle. A pending handle is detached: its collective still runs (the other ranks
 * expect this rank in it) and its buffers stay the library's until the collective completes or
 * ringrun_shutdown() returns. NULL is ignored. */
RINGRUN_API void ringrun_release(ringrun_handle handle);

/* ---- Submissions (asynchronous, named) -------------------------------------------------- */
/* Each returns RINGRUN_OK and sets *handle, or returns an error and leaves *handle NULL. */

/* The shapes of the tensors of this thread's next ringrun_*_submit call, so that ranks that
 * disagree fail it with RINGRUN_ERR_MISMATCH (the handle's message names each rank's shape), as
 * in Horovod: allreduce, broadcast and reducescatter need the same shape on every rank;
 * allgather and alltoall the same number of dimensions and the same dimensions after the first.
 * n is that call's number of tensors (1, or a grouped allreduce's n); tensor i has ndims[i]
 * dimensions (at most RINGRUN_MAX_DIMS), which follow those of the tensors before it in dims.
 * The next submit call on this thread takes them, whatever it returns (RINGRUN_ERR_INVALID_ARGUMENT
 * if it has another number of tensors; a barrier or join ignores them); n = 0 withdraws them.
 * A submission without shapes has none, and a rank without one is compared with nobody on its
 * shape: C callers that never call this, and the blocking calls, are checked on counts only.
 * The engine only compares shapes: counts still say what moves. A kept name's submission with
 * the same shape as its last one costs a few instructions more than one without. */
RINGRUN_API ringrun_status ringrun_next_shapes(size_t n, const int* ndims, const int64_t* dims);

/* Average over the ranks that contributed (not joined) instead of over the job's size. */
#define RINGRUN_AVERAGE_BY_CONTRIBUTORS 1u

/* recvbuf[i] = postscale * op over ranks of (prescale * sendbuf[i]), for i < count.
 * Scale factors of 1.0 cost nothing; other factors need a floating dtype. flags: 0 or
 * RINGRUN_AVERAGE_BY_CONTRIBUTORS. sendbuf == recvbuf is in place. While ranks have joined,
 * they contribute zeros; AVERAGE divides by the job's size unless the flag says otherwise. */
RINGRUN_API ringrun_status ringrun_allreduce_submit(const char* name, const void* sendbuf,
                                                    void* recvbuf, size_t count,
                                                    ringrun_dtype dtype, ringrun_op op,
                                                    double prescale, double postscale,
                                                    unsigned flags, ringrun_handle* handle);
/* n allreduces submitted at once (atomically: they are negotiated in the same round and fused
 * together, up to the fusion threshold; tensors of 256 KiB or more run straight from their
 * buffers, where a copy would cost more than it saves), completing as one handle. Tensor i is named
 * "<name>.<i>of<n>" (name NULL: a default as above). Arrays hold n entries each. */
RINGRUN_API ringrun_status ringrun_grouped_allreduce_submit(
    const char* name, size_t n, const void* const* sendbufs, void* const* recvbufs,
    const size_t* counts, ringrun_dtype dtype, ringrun_op op, double prescale, double postscale,
    unsigned flags, ringrun_handle* handle);
/* buf on every rank becomes buf of root. Fails (RINGRUN_ERR_JOINED) while a rank has joined. */
RINGRUN_API ringrun_status ringrun_broadcast_submit(const char* name, void* buf, size_t count,
                                                    ringrun_dtype dtype, int root,
                                                    ringrun_handle* handle);
/* Every rank's rows x row_elems elements of sendbuf, concatenated in rank order; rows may
 * differ from rank to rank, row_elems must not (it may be 0: only the rows travel). The
 * result is owned by the handle (ringrun_handle_output, ringrun_handle_rows). Fails while a
 * rank has joined. */
RINGRUN_API ringrun_status ringrun_allgather_submit(const char* name, const void* sendbuf,
                                                    size_t rows, size_t row_elems,
                                                    ringrun_dtype dtype, ringrun_handle* handle);
/* sendbuf holds, for each destination rank j in order, send_rows[j] rows of row_elems
 * elements (send_rows has ringrun_size() entries). The result (owned by the handle) holds the
 * blocks received from every rank, in rank order; ringrun_handle_rows says their sizes. Fails
 * while a rank has joined. */
RINGRUN_API ringrun_status ringrun_alltoall_submit(const char* name, const void* sendbuf,
                                                   const size_t* send_rows, size_t row_elems,
                                                   ringrun_dtype dtype, ringrun_handle* handle);
/* sendbuf holds size * recvcount elements; rank r gets block r of the reduction in recvbuf
 * (recvcount elements). Fails while a rank has joined. */
RINGRUN_API ringrun_status ringrun_reducescatter_submit(const char* name, const void* sendbuf,
                                                        void* recvbuf, size_t recvcount,
                                                        ringrun_dtype dtype, ringrun_op op,
                                                        ringrun_handle* handle);
/* Completes once every rank has submitted a barrier (matched by order, as unnamed requests). */
RINGRUN_API ringrun_status ringrun_barrier_submit(ringrun_handle* handle);
/* This rank has run out of work. Until every rank has joined, the other ranks' allreduces
 * complete with this rank contributing zeros (its engine takes part on its own); broadcast,
 * allgather, alltoall and reducescatter fail with RINGRUN_ERR_JOINED. Completes when every
 * rank has joined; ringrun_handle_last_joined_rank then says which rank joined last. A rank
 * submits nothing else between its join and the join's completion. Its name is "join", which
 * no other submission may take (RINGRUN_ERR_INVALID_ARGUMENT). */
RINGRUN_API ringrun_status ringrun_join_submit(ringrun_handle* handle);

/* ---- Process sets ---------------------------------------------------------------------- */
/* Horovod's process sets: subsets of the job's ranks whose collectives are negotiated among
 * themselves, with an engine (a thread that sleeps when idle) and connections of their own.
 * Names in different sets never meet, and a set's members never wait for a non-member. Id 0
 * is the whole job; a set's rank r is its r-th member in increasing job rank.
 *
 * ringrun_add_process_set and ringrun_remove_process_set are collective over the whole job:
 * every rank calls them, in the same order, with the same arguments (they meet through one
 * allgather of the job; a rank that disagrees makes the call fail with
 * RINGRUN_ERR_INVALID_ARGUMENT on every rank, naming it). add: `ranks` (n distinct ranks of the
 * job, any order; not those of a registered set) becomes a set and *id its id, the same on
 * every rank: ids count up from 1, and a removed set's id is given again first. remove: the set
 * goes; its pending collectives fail with RINGRUN_ERR_ABORTED. A failure of any set (a lost
 * peer, a timeout) breaks the whole runtime, as one of the job's collectives would.
 *
 * ringrun_next_process_set(id): the next ringrun_*_submit call on this thread runs on set `id`
 * (whatever that call returns, it takes it; 0: the job, the default; blocking calls neither use
 * nor take it). Then counts, send_rows (one entry per member), rows (ringrun_handle_rows),
 * roots (broadcast), AVERAGE's divisor and join are the set's, and its ranks are set ranks. An
 * id that is not registered, or a set this rank is not in, fails that call with
 * RINGRUN_ERR_INVALID_ARGUMENT, in Horovod's words ("Allreduce: Rank 2 is not a member of the
 * provided process set."). Sets other than the job's run host memory only: device memory is
 * refused at submission with RINGRUN_ERR_INVALID_ARGUMENT (docs/python.md says why). */
RINGRUN_API ringrun_status ringrun_add_process_set(const int* ranks, size_t n, int* id);
RINGRUN_API ringrun_status ringrun_remove_process_set(int id);
RINGRUN_API ringrun_status ringrun_next_process_set(int id);
/* This rank's rank in set `id` (-1 when not a member) and the set's size; both -1 for an id
 * that is not registered, or before ringrun_init(). */
RINGRUN_API int ringrun_process_set_rank(int id);
RINGRUN_API int ringrun_process_set_size(int id);

/* ---- Blocking calls (submit, then wait) ------------------------------------------------- */

/* recvbuf[i] = op over ranks of sendbuf[i], for i < count, on every rank. */
RINGRUN_API ringrun_status ringrun_allreduce(const void* sendbuf, void* recvbuf, size_t count,
                                             ringrun_dtype dtype, ringrun_op op);
/* buf on every rank becomes buf of root. */
RINGRUN_API ringrun_status ringrun_broadcast(void* buf, size_t count, ringrun_dtype dtype,
                                             int root);
/* recvbuf (size * count elements) holds every rank's sendbuf, in rank order. In place (as in
 * NCCL) means sendbuf == recvbuf + rank * count; any other overlap is handled by a copy. */
RINGRUN_API ringrun_status ringrun_allgather(const void* sendbuf, void* recvbuf, size_t count,
                                             ringrun_dtype dtype);
/* sendbuf holds size * recvcount elements; rank r gets block r of the reduction in recvbuf
 * (recvcount elements). sendbuf == recvbuf is allowed (the result lands at the start), as is
 * NCCL's in place form recvbuf == sendbuf + rank * recvcount. */
RINGRUN_API ringrun_status ringrun_reducescatter(const void* sendbuf, void* recvbuf,
                                                 size_t recvcount, ringrun_dtype dtype,
                                                 ringrun_op op);
/* Block j (count_per_rank elements) of sendbuf goes to rank j, which stores it as block r of
 * its recvbuf, where r is the sender. Both hold size * count_per_rank elements; in place
 * (sendbuf == recvbuf) is allowed. */
RINGRUN_API ringrun_status ringrun_alltoall(const void* sendbuf, void* recvbuf,
                                            size_t count_per_rank, ringrun_dtype dtype);
/* Returns once every rank has entered it. */
RINGRUN_API ringrun_status ringrun_barrier(void);
/* ringrun_join_submit and wait; *last_joined_rank (if not NULL) gets the last rank that
 * joined. Unlike the collectives, it waits past the collective timeout (RINGRUN_TIMEOUT_MS):
 * the other ranks may go on training for as long as they have data. A failed peer or
 * ringrun_shutdown ends the wait. A pending join is not a stall either (the stall inspector
 * does not report it), as in Horovod. */
RINGRUN_API ringrun_status ringrun_join(int* last_joined_rank);

/* ---- GPU streams ------------------------------------------------------------------------ */
/* These take CUDA device memory only and a cudaStream_t (passed as void* so that this header
 * needs no CUDA header). The collective reads the buffers after the work already enqueued on
 * `cuda_stream` (an event recorded on it at the call), runs on the library's own stream, and
 * `cuda_stream` waits for its result: work enqueued on the stream after the call sees the
 * result. They are unnamed requests, ordered like the blocking calls (every rank calls them in
 * the same order); each returns once its NCCL collective is enqueued, not when it completes.
 * Host buffers or a NULL stream are rejected before any communication. */
RINGRUN_API ringrun_status ringrun_allreduce_on_stream(const void* sendbuf, void* recvbuf,
                                                       size_t count, ringrun_dtype dtype,
                                                       ringrun_op op, void* cuda_stream);
RINGRUN_API ringrun_status ringrun_broadcast_on_stream(void* buf, size_t count, ringrun_dtype dtype,
                                                       int root, void* cuda_stream);
RINGRUN_API ringrun_status ringrun_allgather_on_stream(const void* sendbuf, void* recvbuf,
                                                       size_t count, ringrun_dtype dtype,
                                                       void* cuda_stream);

/* ---- Timeline --------------------------------------------------------------------------- */
/* The timeline (a Chrome trace; docs/engine.md, "Timeline") from the program, as Horovod's
 * start_timeline/stop_timeline. Each rank changes its own file only: no other rank waits or
 * must call them. Safe from any thread while collectives are in flight: the engine applies the
 * change between two negotiation rounds, never inside one, and the call returns once it has
 * (at most the collective timeout, RINGRUN_ERR_TIMEOUT).
 *
 * ringrun_start_timeline: rank 0 writes `path` (truncated), rank r > 0 "t.<r>.json" beside
 * "t.json", as with RINGRUN_TIMELINE without ringrun's launcher; `path` naming the file that
 * the launcher writes (--timeline-filename) sends every rank's events there. Allowed once the
 * timeline is enabled at init, as in Horovod: RINGRUN_TIMELINE or HOROVOD_TIMELINE names a file
 * (written from the start) or is DYNAMIC (nothing written until this call); else
 * RINGRUN_ERR_INVALID_ARGUMENT. A timeline open to another file is closed first (strict JSON); to
 * this file, it goes on. mark_cycles != 0: a CYCLE_START mark per negotiation round from now on
 * (the engine's cycle; HOROVOD_TIMELINE_MARK_CYCLES=1 at init), 0: none. A file that cannot be
 * opened is the call's error (RINGRUN_ERR_NOT_FOUND, ...), and the timeline open before stays open.
 * ringrun_stop_timeline: closes the file (strict JSON). With none open it does nothing and
 * returns RINGRUN_OK, as Horovod's. */
RINGRUN_API ringrun_status ringrun_start_timeline(const char* path, int mark_cycles);
RINGRUN_API ringrun_status ringrun_stop_timeline(void);

/* ---- Misc ------------------------------------------------------------------------------- */

/* Why this thread's last failing call failed ("" when it did not fail). Never NULL. */
RINGRUN_API const char* ringrun_error_message(void);
/* "RINGRUN_ERR_TIMEOUT", ...; never NULL. */
RINGRUN_API const char* ringrun_status_name(ringrun_status status);

/* Bytes of one element of dtype; 0 for a value that is not a ringrun_dtype. */
RINGRUN_API size_t ringrun_dtype_size(ringrun_dtype dtype);

/* The NCCL version this library was built with (NCCL_VERSION_CODE of its headers: 22809 for
 * 2.28.9), or 0 when it was built without NCCL (then it has no GPU backend). Horovod's
 * nccl_built() returns the same. Callable at any time, also before ringrun_init(). */
RINGRUN_API int ringrun_nccl_version(void);

#ifdef __cplusplus
}
#endif

#endif /* RINGRUN_RINGRUN_H_ */
