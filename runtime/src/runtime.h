// The runtime object behind the C API: one per process, built by ringrun_init(). It owns the
// engine (engine/engine.h), which owns the transport, the scratch memory and the GPU backend
// (made on the first device-memory collective) and is the only thread that touches them.
//
// Thread-safety: every method may be called from any thread. The blocking collectives submit
// an unnamed request and wait for it, so their order must still match across ranks. Failure:
// argument errors are returned before any communication and change nothing; a communication
// failure breaks the runtime, and later collectives fail with the same error.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ringrun/common/defaults.h"
#include "ringrun/common/thread_annotations.h"
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
  // RINGRUN_SPIN=0|1|yield (any other value but one starting with '0' spins): how same-host
  // waits wait before they sleep (SameHostWaiting); -1 = unset.
  static constexpr int kYield = 2;
  int spin = -1;
  // The engine's knobs (ringrun.h lists the variables).
  size_t fusion_threshold = engine::kDefaultFusionThreshold;
  size_t cache_capacity = engine::kDefaultCacheCapacity;
  int64_t burst_quiet_ns = engine::kDefaultBurstQuietNs;
  engine::StallOptions stall;
  std::string timeline;               // RINGRUN_TIMELINE or HOROVOD_TIMELINE, but DYNAMIC
  int timeline_fd = -1;               // RINGRUN_TIMELINE_FD: the launcher's pipe, with timeline
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
  // ringrun_init; a join after ringrun_shutdown is a new round of the job's rendezvous). In an
  // elastic job: the generation to ask for, one more than the last joined.
  uint32_t generation = 0;
  // Elastic jobs (RINGRUN_ELASTIC=1, RINGRUN_WORKER_ID): the rank, size and shape come from
  // the job service's reply, not from the variables above.
  bool elastic = false;
  int worker_id = -1;
};

// Parses the environment through `getenv` (injectable for tests). Malformed values are
// kInvalidArgument naming the variable. Without RINGRUN_RANK and RINGRUN_SIZE, `foreign` says
// whether another launcher started this process as one of several.
Result<JobEnv> ReadJobEnv(const std::function<const char*(const char*)>& getenv);

// The one place that decides how a rank waits on a same-host peer (TransportOptions::spin and
// ::yield): `spin` as JobEnv::spin (-1: unset), for `local_size` ranks on a host of `cpus`
// CPUs. Unset: busy-wait while the host's ranks do not outnumber its CPUs, else poll and yield.
void SameHostWaiting(int spin, int local_size, int cpus, transport::TransportOptions* topts);

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
  int timeline_fd = -1;               // engine::EngineOptions::timeline_fd
  bool timeline_dynamic = false;      // engine::EngineOptions::timeline_dynamic
  bool timeline_mark_cycles = false;  // engine::EngineOptions::timeline_mark_cycles
  std::function<void(const std::string&)> log;
  const Clock* clock = nullptr;
  // The GPU seam (engine::EngineOptions).
  std::function<bool(const void*)> is_device;
  std::function<std::string()> make_nccl_id;
  std::function<Result<std::unique_ptr<gpu::DeviceBackend>>(const std::string&)> make_device;
  std::function<Result<std::shared_ptr<void>>(const void*, void*)> record_event;
  // How the members of a process set connect to each other (Runtime::AddProcessSet): the
  // options of the job's own transport, its secret included. Unset: a set of more than one
  // rank is refused.
  std::optional<transport::TransportOptions> set_transport;
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
  // Elastic jobs: the generation this runtime joined (0 otherwise), set by Join; and the
  // membership epoch: the one the job service gave at the join, raised by its later notices
  // (0 otherwise). Thread-safe.
  uint32_t generation() const { return generation_; }
  uint64_t membership_epoch() const { return membership_epoch_.load(std::memory_order_relaxed); }
  // A notice of the job service's Watch (job_client.h), which Join opens for an elastic rank;
  // from the client's thread. A larger epoch is kept; a broken generation that is this
  // runtime's (or a later one) fails its pending and later collectives with kUnavailable and
  // the reason, a collective in progress included (transport::Interrupt), as a lost peer's
  // closed connection would. Public for tests.
  void OnNotice(const MembershipNotice& notice);
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
  // r > 0 its own file beside it, as with RINGRUN_TIMELINE without the launcher; the file the
  // launcher writes (RINGRUN_TIMELINE_FD) is every rank's, through its pipe.
  Status StartTimeline(const std::string& path, bool mark_cycles);
  Status StopTimeline() { return engine_->StopTimeline(); }

  // Process sets, as Horovod's: subsets of the job's ranks, each with an engine of its own
  // (Horovod has a controller per set). A set's engine negotiates only among its members,
  // over connections of their own (a sub-group of the transport: the same secret and hosts,
  // a new listener per member), so names in different sets never meet, and a set's ranks
  // never wait for a non-member. Id 0 is the whole job (engine()); the ids of the others
  // are given in order of registration, a removed one's taken again first (Horovod's).
  //
  // AddProcessSet and RemoveProcessSet are collective over the whole job: every rank calls
  // them, in the same order, with the same arguments, and they meet through one allgather on
  // the job's engine (so a rank that disagrees makes every rank fail, naming it, instead of
  // hanging). ranks: distinct ranks of the job, in any order. Refused on every rank, with
  // kInvalidArgument: a bad rank, a set with the same ranks as a registered one, a rank that
  // passed other arguments. A removed set's pending collectives fail with kAborted.
  //
  // Failure: when any engine fails for good (a peer lost, a timeout, a stall shutdown), every
  // other engine of the runtime fails with the same status, so a peer loss fails every set's
  // pending work, naming the peer, even in a set that the peer is not in.
  Result<int> AddProcessSet(std::vector<int> ranks);
  Status RemoveProcessSet(int id);
  // The engine of set `id` on this rank (never destroyed before the runtime). Refused with
  // Horovod's words (`what`: "Allreduce", ...): kInvalidArgument for an id that is not
  // registered, or when this rank is not a member.
  Result<engine::Engine*> SetEngine(int id, std::string_view what);
  // This rank's rank in set `id` (-1: not a member), and the set's size; both -1 for an id
  // that is not registered.
  int SetRank(int id);
  int SetSize(int id);
  // Stops every engine (ringrun_shutdown): pending handles fail with kAborted. The Watch is
  // cancelled first (no notice is handled after it returns).
  void Shutdown();

 private:
  struct ProcessSet {
    std::vector<int> ranks;            // sorted
    int rank = -1;                     // this rank's index in ranks; -1: not a member
    engine::Engine* engine = nullptr;  // members only; owned by set_engines_
    // RemoveProcessSet is under way: the members shut their engines down one by one, so a
    // failure of this set's engine (a member's connection closing first) is no failure.
    bool removing = false;
  };
  // One fixed-size record per rank of a set's registration or removal (see AddProcessSet).
  struct SetRecord;
  Status GatherRecords(const SetRecord& mine, std::vector<SetRecord>* all) REQUIRES(admin_mu_);
  // Every engine's Abort(st) (EngineOptions::on_failure).
  void AbortAll(const Status& st);
  // Opens the job service's Watch through `client` (elastic jobs), for OnNotice.
  void StartWatch(JobClient* client, int worker_id);
  // Set `id`'s engine failed for good: AbortAll, unless the set is being removed.
  void SetFailed(int id, const Status& st);

  const Shape shape_;
  const int timeout_ms_;
  uint32_t generation_ = 0;
  std::atomic<uint64_t> membership_epoch_{0};
  // Elastic jobs: what a broken generation raises (shared with every transport of this
  // runtime; set by Join, then constant), and the Watch that delivers the notices (set by Join
  // before the runtime is published, destroyed by Shutdown).
  std::shared_ptr<transport::Interrupt> interrupt_;
  Mutex watch_mu_;
  std::unique_ptr<MembershipWatch> watch_ GUARDED_BY(watch_mu_);
  std::unique_ptr<engine::Engine> engine_;
  // Constant after construction: the job's peer table (empty without a transport), and what
  // a set's engine is built from: the global engine's options but its timeline.
  transport::PeerTable peers_;
  std::optional<transport::TransportOptions> set_transport_;
  engine::EngineOptions set_options_;
  // The timeline named at init and the launcher's pipe for it (-1: none); constant.
  std::string timeline_;
  int timeline_fd_ = -1;

  Mutex admin_mu_;  // held through AddProcessSet and RemoveProcessSet; taken before sets_mu_
  uint64_t registrations_ GUARDED_BY(admin_mu_) = 0;  // names the records' allgathers
  Mutex sets_mu_;
  std::map<int, ProcessSet> sets_ GUARDED_BY(sets_mu_);
  std::deque<int> free_ids_ GUARDED_BY(sets_mu_);
  int next_id_ GUARDED_BY(sets_mu_) = 1;
  bool shut_down_ GUARDED_BY(sets_mu_) = false;
  // Every set engine made, removed ones too: a submission on another thread may still hold
  // one (SetEngine), so an engine is shut down at removal and destroyed with the runtime.
  std::vector<std::unique_ptr<engine::Engine>> set_engines_ GUARDED_BY(sets_mu_);
};

// The shape a peer table implies for `rank`: hosts are address indices in order of first use.
Shape DeriveShape(const transport::PeerTable& peers, int rank);
// The shape of `rank` when host_of_rank names each rank's host (elastic jobs): the launcher's
// placement rule (launcher/hosts/placement.cc): local ranks count a host's ranks in rank order;
// for local rank l, cross_size is the number of hosts with more than l ranks and cross_rank
// this host's index among them, hosts in order of their first rank.
Shape ShapeFromHosts(const std::vector<std::string>& host_of_rank, int rank);

}  // namespace ringrun::runtime
