// The runtime object behind the C API: one per process, built by ringrun_init(). It owns the
// transport, the scratch memory, and the GPU backend (made on the first device-memory call).
//
// Thread-safety: every collective takes mu_, so calls from several threads are serialized (the
// order in which they run must still match across ranks). Shape accessors are lock-free.
// Failure: argument errors are returned before any communication and change nothing; a
// communication failure breaks the transport, and later collectives fail with the same error.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "ringrun/common/defaults.h"
#include "ringrun/ringrun.h"
#include "runtime/src/collectives.h"
#include "runtime/src/job_client.h"
#include "runtime/src/transport.h"

namespace ringrun::runtime {

class DeviceBackend;

// What the launcher told this rank (env_contract.h), plus tuning knobs.
struct JobEnv {
  bool in_job = false;  // false: no RINGRUN_RANK/RINGRUN_SIZE, a job of size 1
  int rank = 0, size = 1;
  int local_rank = -1, local_size = -1, cross_rank = -1, cross_size = -1;  // -1: derive
  std::string job_service;                                                 // host:port
  std::string secret;
  std::string host_addr = "127.0.0.1";  // where this rank listens and what it advertises
  std::string job_id;
  int timeout_ms = kDefaultCollectiveTimeoutMs;
  int join_timeout_ms = 0;  // 0: kJoinTimeoutMs
  bool use_shm = true;
  int shm_ring_kib = 0;  // RINGRUN_SHM_RING_KIB: 0 = the transport's default
  // Not from the environment: how many times this process joined before (set by
  // ringrun_init; a join after ringrun_shutdown is a new round of the job's rendezvous).
  uint32_t generation = 0;
};

// Parses the environment through `getenv` (injectable for tests). Malformed values are
// kInvalidArgument naming the variable.
Result<JobEnv> ReadJobEnv(const std::function<const char*(const char*)>& getenv);

struct Shape {
  int rank = 0, size = 1, local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
};

class Runtime {
 public:
  // Binds the data-plane listener, joins through `client` (unused when !env.in_job), and
  // builds the transport. *joined (if given) says whether the job service's Join succeeded,
  // that is whether this round of the rendezvous is used up, even when a later step fails.
  static Result<std::unique_ptr<Runtime>> Join(const JobEnv& env, JobClient* client,
                                               bool* joined = nullptr);
  // Over an existing transport (tests). Shape fields < 0 are derived from the peer table.
  Runtime(std::unique_ptr<Transport> transport, Shape shape, int timeout_ms,
          std::string nccl_id = "");
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const Shape& shape() const { return shape_; }

  // With a `stream` (a cudaStream_t), device memory only: enqueued on it, returns at once.
  Status Allreduce(const void* send, void* recv, size_t count, ringrun_dtype dtype, ringrun_op op,
                   void* stream = nullptr);
  Status Broadcast(void* buf, size_t count, ringrun_dtype dtype, int root, void* stream = nullptr);
  Status Allgather(const void* send, void* recv, size_t count, ringrun_dtype dtype,
                   void* stream = nullptr);
  Status ReduceScatter(const void* send, void* recv, size_t recvcount, ringrun_dtype dtype,
                       ringrun_op op);
  Status Alltoall(const void* send, void* recv, size_t count_per_rank, ringrun_dtype dtype);
  Status Barrier();

  // Breaks the host data plane with `st` (as a failed collective would: connections close, so
  // peers fail at once) and returns the status every later host collective fails with. For
  // failures outside the transport, such as running out of memory mid-collective. In a job of
  // one there is nothing to break: it returns `st`.
  Status Break(Status st);

 private:
  CollectiveContext Context();
  // The host data plane's first failure (OK while it works): every later host collective,
  // empty ones included, fails with it.
  Status HostStatus() const;
  // Device memory: both buffers on the device -> true with *backend set; mixed -> error.
  Result<bool> RouteToDevice(const void* a, const void* b, DeviceBackend** backend);

  // Constant after construction.
  const Shape shape_;
  const int timeout_ms_;
  const std::string nccl_id_;
  const Group world_;

  std::mutex mu_;  // serializes collectives; guards everything below
  std::unique_ptr<Transport> transport_;
  Scratch scratch_;
  std::unique_ptr<DeviceBackend> device_;
  Status device_error_;
};

// The shape a peer table implies for `rank`: hosts are address indices in order of first use.
Shape DeriveShape(const PeerTable& peers, int rank);

}  // namespace ringrun::runtime
