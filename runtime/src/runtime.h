// The runtime object behind the C API: one per process, built by ringrun_init(). It owns the
// engine (engine/engine.h), which owns the transport, the scratch memory and the GPU backend
// (made on the first device-memory collective) and is the only thread that touches them.
//
// Thread-safety: every method may be called from any thread. The blocking collectives submit
// an unnamed request and wait for it, so their order must still match across ranks. Failure:
// argument errors are returned before any communication and change nothing; a communication
// failure breaks the runtime, and later collectives fail with the same error.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ringrun/common/defaults.h"
#include "ringrun/ringrun.h"
#include "runtime/src/collectives.h"
#include "runtime/src/engine/engine.h"
#include "runtime/src/job_client.h"
#include "runtime/src/rendezvous/foreign_job.h"
#include "runtime/src/transport/transport.h"

namespace ringrun::runtime {

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
  int join_timeout_ms = 0;  // RINGRUN_JOIN_TIMEOUT_MS; 0: kJoinTimeoutMs
  // Not in a ringrun job: another launcher's job of size > 1 that the environment shows
  // (rendezvous/foreign_job.h). Runtime::Join refuses to run such a process as size 1.
  std::optional<rendezvous::ForeignJob> foreign;
  // Not in a ringrun job: the PMIx launcher that started this process (rendezvous::PmixLauncher),
  // through whose PMIx server ringrun_init joins; empty: none. `foreign` is what is refused
  // when that server cannot be joined.
  std::string pmix_launcher;
  // What found the peers, for the log line at the join ("torch's store (torchrun)"); empty:
  // the ringrun job service (logged at debug level only).
  std::string source;
  bool use_shm = true;
  bool allow_nat = false;  // RINGRUN_ALLOW_NAT=1: see transport::TransportOptions::allow_nat
  int shm_ring_kib = 0;    // RINGRUN_SHM_RING_KIB: 0 = the transport's default
  // RINGRUN_SPIN=0|1 (any value but one starting with '0' spins): whether same-host waits
  // busy-wait; -1 = when the host's ranks do not outnumber its CPUs.
  int spin = -1;
  // The engine's knobs (ringrun.h lists the variables).
  size_t fusion_threshold = engine::kDefaultFusionThreshold;
  size_t cache_capacity = engine::kDefaultCacheCapacity;
  int64_t burst_quiet_ns = engine::kDefaultBurstQuietNs;
  engine::StallOptions stall;
  std::string timeline;               // RINGRUN_TIMELINE or HOROVOD_TIMELINE, but DYNAMIC
  bool timeline_dynamic = false;      // HOROVOD_TIMELINE=DYNAMIC
  bool timeline_mark_cycles = false;  // HOROVOD_TIMELINE_MARK_CYCLES
  // Logging (RINGRUN_LOG_LEVEL or HOROVOD_LOG_LEVEL, as spdlog names it; "" leaves it).
  std::string log_level;
  bool log_hide_time = false;  // HOROVOD_LOG_HIDE_TIME
  // HOROVOD_HIERARCHICAL_ALLREDUCE: -1 unset, 0 flat, 1 hierarchical where the layout allows.
  int hierarchical_allreduce = -1;
  // HOROVOD_AUTOTUNE and its knobs; which engine knobs are free to tune (those not set).
  engine::AutotuneOptions autotune;
  // Horovod variables that are set and mean something else here, or nothing (knobs.h): rank 0
  // logs them at init.
  std::vector<std::string> knob_notes;
  // Not from the environment: how many times this process joined before (set by
  // ringrun_init; a join after ringrun_shutdown is a new round of the job's rendezvous).
  uint32_t generation = 0;
};

// Parses the environment through `getenv` (injectable for tests). Malformed values are
// kInvalidArgument naming the variable. Without RINGRUN_RANK and RINGRUN_SIZE, `foreign` says
// whether another launcher started this process as one of several.
Result<JobEnv> ReadJobEnv(const std::function<const char*(const char*)>& getenv);

struct Shape {
  int rank = 0, size = 1, local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
};

// Engine settings that do not come from the shape.
struct EngineSettings {
  size_t fusion_threshold = engine::kDefaultFusionThreshold;
  size_t cache_capacity = engine::kDefaultCacheCapacity;
  int64_t burst_quiet_ns = engine::kDefaultBurstQuietNs;
  bool hierarchical = true;  // HOROVOD_HIERARCHICAL_ALLREDUCE != 0
  engine::AutotuneOptions autotune;
  engine::StallOptions stall;
  std::string timeline;               // path; "" for none
  bool timeline_dynamic = false;      // engine::EngineOptions::timeline_dynamic
  bool timeline_mark_cycles = false;  // engine::EngineOptions::timeline_mark_cycles
  std::function<void(const std::string&)> log;
  const Clock* clock = nullptr;
  // The GPU seam (engine::EngineOptions).
  std::function<bool(const void*)> is_device;
  std::function<std::string()> make_nccl_id;
  std::function<Result<std::unique_ptr<gpu::DeviceBackend>>(const std::string&)> make_device;
  std::function<Result<std::shared_ptr<void>>(const void*, void*)> record_event;
};

class Runtime {
 public:
  // Binds the data-plane listener, joins through `client` (unused when !env.in_job), and
  // builds the transport. Outside a job, env.foreign is refused (RefuseForeignJob). *joined (if
  // given) says whether the job service's Join succeeded, that is whether this round of the
  // rendezvous is used up, even when a later step fails.
  static Result<std::unique_ptr<Runtime>> Join(const JobEnv& env, JobClient* client,
                                               bool* joined = nullptr);
  // Over an existing transport (tests). Shape fields < 0 are derived from the peer table.
  Runtime(std::unique_ptr<transport::Transport> transport, Shape shape, int timeout_ms,
          EngineSettings settings = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const Shape& shape() const { return shape_; }
  engine::Engine& engine() { return *engine_; }

  // Submits one tensor under `name` ("": unnamed; engine::Engine::Submit) and waits; a request
  // that has not completed within the collective timeout breaks the runtime (naming the ranks
  // that did not submit it) and fails. A join waits without that bound: the other ranks may
  // train for as long as they have data (a failure or shutdown ends it). *handle (if given)
  // keeps the completed handle (a join's last rank).
  Status SubmitAndWait(std::string_view name, const engine::TensorArgs& tensor,
                       std::shared_ptr<engine::HandleState>* handle = nullptr);

  // The blocking collectives. With a `stream` (a cudaStream_t), device memory only: enqueued
  // on it, returns once enqueued.
  Status Allreduce(const void* send, void* recv, size_t count, ringrun_dtype dtype, ringrun_op op,
                   void* stream = nullptr);
  Status Broadcast(void* buf, size_t count, ringrun_dtype dtype, int root, void* stream = nullptr);
  Status Allgather(const void* send, void* recv, size_t count, ringrun_dtype dtype,
                   void* stream = nullptr);
  Status ReduceScatter(const void* send, void* recv, size_t recvcount, ringrun_dtype dtype,
                       ringrun_op op);
  Status Alltoall(const void* send, void* recv, size_t count_per_rank, ringrun_dtype dtype);
  Status Barrier();

  // The timeline from the program (engine::Engine::StartTimeline): rank 0 writes `path`, rank
  // r > 0 its own file beside it, as with RINGRUN_TIMELINE.
  Status StartTimeline(const std::string& path, bool mark_cycles);
  Status StopTimeline() { return engine_->StopTimeline(); }

 private:
  const Shape shape_;
  const int timeout_ms_;
  std::unique_ptr<engine::Engine> engine_;
};

// The shape a peer table implies for `rank`: hosts are address indices in order of first use.
Shape DeriveShape(const transport::PeerTable& peers, int rank);

}  // namespace ringrun::runtime
