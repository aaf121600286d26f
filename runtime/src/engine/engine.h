// The engine: one background thread per process that negotiates, fuses and runs the named
// collectives that any thread submits (ringrun.h states the user contract; docs/engine.md the
// design).
//
// Threads. Submit, Abort and Shutdown may be called from any thread (WaitHandle, handles.h). One
// thread at a time touches the Transport, the controller, the fusion buffer and the device
// backend (not locked; only the backend's thread-safe Abort is called from Shutdown and Abort,
// under device_mu_): the one holding round_mu_, which is the engine thread but while it sleeps,
// when a blocking call's thread may take it and run its own round (Submit's run_here; device
// work stays on the engine thread). mu_ guards the submission queue, the names in flight and the
// failure state.
//
// Idle. With nothing submitted and nothing arriving, the engine thread sleeps in
// Transport::WaitForInput on its doorbell (an eventfd that a submission rings only when the
// engine sleeps) and on every peer: no timer, no polling, no traffic. It wakes early only for
// the stall inspector, and only while some tensor is pending.
//
// Rounds. A round starts when this rank has new submissions or a peer has started one: an
// allgather of every rank's frame (the requests it announces; see controller.h) in
// ceil(log2 n) steps (Exchange), so every rank learns the same facts and computes the same
// responses. Work submitted while a round or its collectives run waits for the next round: the
// batch grows with the load and never waits for a timer.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ringrun/common/clock.h"
#include "ringrun/common/defaults.h"
#include "ringrun/common/thread_annotations.h"
#include "runtime/src/collectives.h"
#include "runtime/src/engine/controller.h"
#include "runtime/src/engine/fusion_buffer.h"
#include "runtime/src/engine/handles.h"
#include "runtime/src/engine/name_table.h"
#include "runtime/src/engine/request.h"
#include "runtime/src/engine/stall_inspector.h"
#include "runtime/src/engine/timeline.h"
#include "runtime/src/engine/tuner.h"
#include "runtime/src/transport/transport.h"

namespace ringrun::runtime::gpu {
class DeviceBackend;
}

namespace ringrun::runtime::engine {

inline constexpr size_t kDefaultFusionThreshold = size_t{64} << 20;
inline constexpr size_t kDefaultCacheCapacity = 1024;
inline constexpr int64_t kDefaultBurstQuietNs = 2000;
// The name of every join request (ringrun_join_submit); no other submission may take it.
inline constexpr std::string_view kJoinName = "join";
// Allreduces at least this large run straight from the caller's buffers instead of through
// the fusion buffer: copying a tensor in and out costs more than the per-collective latency
// that fusing it saves (measured: the copies were a quarter of a ResNet-50 step's time).
inline constexpr size_t kDirectAllreduceBytes = 256 << 10;
// A blocking call's allreduce of at most this many bytes, whose frames over all ranks come to
// at most kLoneFramesBytes, may travel in its round's frame (Engine::SubmitLone).
inline constexpr size_t kLoneBytes = 4 << 10;
inline constexpr size_t kLoneFramesBytes = 16 << 10;

struct EngineOptions {
  int rank = 0, size = 1, local_rank = 0;
  int timeout_ms = 60000;
  size_t fusion_threshold = kDefaultFusionThreshold;  // 0: no fusion
  size_t cache_capacity = kDefaultCacheCapacity;
  // Allreduce may go hierarchical where the layout allows (CollectiveContext::hierarchical).
  bool hierarchical = true;
  StallOptions stall;
  // A burst of submissions is gathered into one round: once woken with work, the engine goes
  // on taking submissions until none came for this long, or some thread waits on a handle, or
  // 32 such windows passed (CollectBurst). 0: a round starts with what woke the engine; so is
  // it when the engine thread may run on one CPU only (it would share it with the submitter).
  int64_t burst_quiet_ns = kDefaultBurstQuietNs;
  // The timeline (timeline.h): the file written from the start ("": none), whether the program
  // may start and stop one (StartTimeline; as Horovod, once HOROVOD_TIMELINE names a file or
  // DYNAMIC), and whether it marks every round with Horovod's CYCLE_START.
  std::string timeline_path;
  // With timeline_path: the launcher's pipe (RINGRUN_TIMELINE_FD) that takes the events instead
  // of the file, which the launcher writes (Timeline::OpenPipe, on a copy of the fd); -1: none.
  // StartTimeline(timeline_path) goes there too; any other path is a file of the rank's.
  int timeline_fd = -1;
  bool timeline_dynamic = false;
  bool timeline_mark_cycles = false;
  // Autotuning (tuner.h; HOROVOD_AUTOTUNE): must be enabled on every rank or none (Hello
  // checks). Rank 0 tunes; every rank applies its choices at the same round.
  AutotuneOptions autotune;
  // Where stall warnings go (default: stderr).
  std::function<void(const std::string&)> log;
  // Called once, on the engine thread and with no lock held, when the engine fails for good
  // (not at Shutdown): the runtime aborts its other engines with `st` (process sets). It must
  // not destroy this engine.
  std::function<void(const Status& st)> on_failure;
  const Clock* clock = nullptr;  // default: SteadyClock()
  // The GPU seam (tests inject fakes): whether a pointer is device memory, and the backend's
  // factory, called on the engine thread at the first device collective with the NCCL id that
  // rank 0 made (make_nccl_id, rank 0 only) and broadcast over the CPU transport. Unset: the
  // build's own (gpu/device_backend.h), or none.
  std::function<bool(const void*)> is_device;
  std::function<std::string()> make_nccl_id;
  std::function<Result<std::unique_ptr<gpu::DeviceBackend>>(const std::string& nccl_id)>
      make_device;
  // Records a device entry's ready event at submission, on the submitting thread: a CUDA event
  // on the device of `buffer`, recorded on `stream` (nullptr: the legacy default stream).
  // Unset: the build's RecordDeviceEvent.
  std::function<Result<std::shared_ptr<void>>(const void* buffer, void* stream)> record_event;
};

// The process's copy of a tensor name, never freed: handles that outlive the runtime keep
// naming their tensor, and a submission copies no string into its handle. Only names that are
// kept in slots (Engine::kKeptSlots per runtime) are interned.
const std::string* InternName(std::string_view name);

class Engine {
 public:
  // transport may be null (a job of one). Starts the engine thread, which first exchanges
  // frames once (connecting the pairs that negotiation uses and checking that every rank's
  // settings agree).
  Engine(std::unique_ptr<transport::Transport> transport, EngineOptions options);
  ~Engine();  // Shutdown()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The one way in: validates and queues the n tensors at `tensors` (read during the call,
  // not kept) under one handle, all or none, and never waits for other ranks. `name` names a
  // lone tensor, or a group's base name (group: a grouped allreduce, whose tensors are
  // "<name>.<i>of<n>"); empty: a default that is the same on every rank (the k-th unnamed
  // submission of its kind). Several tensors must be a group. On success *handle is the
  // caller's reference (ReleaseHandle drops it). Refused: kInvalidArgument (a bad argument,
  // named), kDuplicate (a name still in flight on this rank), kAborted (shutting down), or the
  // failure that broke the engine. A named allreduce of host memory whose name has a kept slot
  // (the commonest submission of training) is queued without a lookup of its buffers, and
  // builds no string, Entry or error (QueueKept).
  //
  // run_here: the caller waits for the handle next (a blocking call). When the engine thread
  // sleeps, nothing else is queued or pending, and the tensor is host memory, the round runs on
  // the calling thread before Submit returns (RunHere): no thread is woken on this rank, and
  // when the round makes the tensor ready, the handle is done on return.
  Status Submit(std::string_view name, const TensorArgs* tensors, size_t n, bool group,
                HandleState** handle, bool run_here = false);
  int timeout_ms() const { return options_.timeout_ms; }
  // Breaks the runtime with `st` (from any thread): the engine fails everything pending with
  // it, naming the ranks that have not submitted what is pending. For a blocking call that
  // gave up waiting.
  void Abort(const Status& st);
  // Stops the engine thread; pending handles fail with kAborted. Idempotent.
  void Shutdown();
  const EngineOptions& options() const { return options_; }
  // Start or stop the timeline from any thread, while collectives are in flight: the engine
  // thread applies the change between two rounds (never inside one), and the call waits until
  // it has, at most the collective timeout (kTimeout). StartTimeline opens `path` (truncating
  // it) after closing the one open, or, when `path` is the one open, keeps writing it; either
  // way mark_cycles says from now on whether rounds are marked. Refused: kInvalidArgument when
  // the timeline was not enabled (timeline_path and timeline_dynamic unset, as Horovod refuses
  // without HOROVOD_TIMELINE), the error of opening `path` (the open timeline then stays),
  // kAborted once shutting down. StopTimeline closes the file (strict JSON); with none open it
  // does nothing and succeeds, as Horovod's.
  Status StartTimeline(const std::string& path, bool mark_cycles);
  Status StopTimeline();
  // This rank's transport counters (transport::Counters; zeros without a transport). From any
  // thread, until Shutdown (which drops the transport).
  transport::Counters transport_counters() const {
    return transport_ ? transport_->counters() : transport::Counters{};
  }
  // What negotiation alone did on this rank: exchanges of frames (the hello and every round),
  // and the messages and bytes it sent (heads and tails); and the rounds of blocking calls
  // that their lone frames completed (SubmitLone). From any thread.
  struct NegotiationCounters {
    uint64_t rounds = 0, messages_sent = 0, bytes_sent = 0, lone_rounds = 0;
  };
  NegotiationCounters negotiation_counters() const {
    return {neg_rounds_.load(std::memory_order_relaxed),
            neg_messages_.load(std::memory_order_relaxed),
            neg_bytes_.load(std::memory_order_relaxed), neg_lone_.load(std::memory_order_relaxed)};
  }
  // OK until the engine fails for good (a broken transport, a stall shutdown, no doorbell at
  // construction); then what every later submission is refused with.
  Status failure();

 private:
  // Ready responses that run as one: several fusable allreduces, or one collective.
  struct Batch {
    std::vector<const Response*> responses;
    std::vector<Entry*> locals;  // this rank's entry of each response (nullptr: joined)
    size_t bytes = 0;            // of the responses packed into the fusion buffer
  };
  // Where a submitted tensor lives on this rank while in flight: one per name. A named tensor
  // keeps its slot after it completes (up to kKeptSlots of them), so that submitting the name
  // again costs one hash lookup and allocates nothing; an unnamed one (its name is made up
  // and never repeats) returns it to free_slots_.
  struct Slot : Entry {
    // First: on the cache line of Entry::handle, the other field that both threads write.
    bool in_flight = false;  // mu_: submitted and not complete; the engine owns the Entry
    const std::string* name = nullptr;  // constant while in slots_ (its key views it)
    std::string own_name;               // the storage of an unnamed slot's name
    bool kept = false;                  // stays in slots_ after completion
    // The engine thread's: the cache id it was announced under (-1: announced in full), and
    // that entry's version when the request was last compared with it.
    int64_t cache_id = -1;
    uint32_t cache_version = 0;
    // Set by MoveInto when an argument changed (mu_), cleared by the engine once it has
    // compared the request with the cache again.
    bool args_changed = true;
    // mu_: the slot holds a host allreduce that QueueKept checked (arguments and
    // buffers) and wrote, unchanged since (MoveInto clears it).
    bool fast_ok = false;
  };
  static constexpr size_t kKeptSlots = 16384;
  // Submit's short path for t, a lone named allreduce: queues it when its name has a kept
  // slot that is not in flight and t is host memory with valid arguments (true: *handle is the
  // caller's). Otherwise it does nothing and returns false, and Submit takes its general path,
  // which also says what is wrong. Builds no string; checks nothing again when the arguments
  // and buffers are those of the name's last submission through here.
  bool QueueKept(std::string_view name, const TensorArgs& t, HandleState** handle);
  // Whether Validate would accept these arguments for an allreduce of host memory.
  bool ValidHostAllreduce(const void* send, void* recv, size_t count, ringrun_dtype dtype,
                          ringrun_op op, double prescale, double postscale, uint32_t flags) const;
  // Submit's way for a blocking call's (run_here) unnamed allreduce of at most kLoneBytes of
  // host memory, when RunHere would run its round here (the engine thread sleeps, nothing else
  // is queued or pending, no timeline or autotune) and no rank has joined (lone.cc). Its
  // round's frame is a *lone frame*: the request's arguments and its data. When every rank's
  // frame is a lone frame of the same call, every rank reduces the data of all, in rank order,
  // and the call is done after one exchange, without the controller, the name tables or a
  // slot. Any other round (a peer's engine thread answered, a peer is in another call, the
  // arguments differ) is the general one: every rank reads each lone frame as the frame that
  // announces its request in full (LoneAsGeneral), and it goes on as RunHere's round. Returns
  // false when this way does not apply, having done nothing; true with *handle the caller's
  // (done, unless the general round left it pending).
  bool SubmitLone(const TensorArgs& t, HandleState** handle);
  // Its round once the frames are in: the reduction when every frame agrees (true), or false.
  bool ReduceLone(const std::vector<std::string>& frames, void* recv);
  // The slot of SubmitLone's tensor for the general round, as SubmitGeneral makes it, under
  // the k-th unnamed allreduce's name; *handle the caller's.
  Slot* LoneSlot(const TensorArgs& t, uint64_t k, HandleState** handle);
  static bool IsLoneFrame(const std::string& frame);
  // Rewrites a lone frame as the general frame that announces its request in full (kInternal
  // when malformed).
  Status LoneAsGeneral(std::string* frame) const;
  // RunHere's end, holding round_mu_ after a round that ran here for h: breaks on a failure,
  // leaves the peers' wake-ups quiet when h is done and nothing is pending (the next call runs
  // the next round) or wakes the engine thread to take over, and lets go of round_mu_.
  void EndHere(HandleState* h, const Status& st) RELEASE(round_mu_);
  // Submit's path for everything else, which says what is wrong with a refused submission.
  Status SubmitGeneral(std::string_view name, const TensorArgs* tensors, size_t n, bool group,
                       HandleState** handle, bool run_here);
  // Submit's run_here, after h was queued without ringing the doorbell: runs the round on this
  // thread when it can take round_mu_ (the engine thread sleeps) and h's is all there is to
  // do; otherwise wakes the engine thread as a submission does.
  void RunHere(HandleState* h);
  Slot* NewSlot(std::string_view name, bool named) REQUIRES(mu_);
  void ReleaseSlot(Slot* s) REQUIRES(mu_) {  // not in flight any more
    s->in_flight = false;
    if (s->kept) return;
    slots_.Erase(*s->name);
    free_slots_.push_back(s);
  }
  // e's arguments into s (mu_ held, s not in flight).
  static void MoveInto(Slot& s, Entry& e);
  // r's arguments (all but the name and send_rows) and `device` into q, writing only fields
  // that differ; whether any did. R: a Request or a TensorArgs.
  template <typename R>
  static bool UpdateArgs(Request& q, const R& r, bool device);
  // This rank's slot for a ready response, or nullptr (the rank had joined).
  Slot* Local(const Response& r);
  void Loop();
  void SleepOnDoorbell(Deadline deadline);
  Status Hello();
  // One negotiation round announcing `fresh`. A non-empty `abort` tells every rank to fail
  // with it (the stall shutdown); a peer's abort comes back as kAborted with its text.
  Status Round(std::vector<Slot*> fresh, const std::string& abort = "");
  // Round's parts: the bookkeeping of the requests announced (announce_, announce_ids_, the
  // slots by cache id or name), and everything after the exchange of frames (`start`: when
  // the round started).
  void Announce(const std::vector<Slot*>& fresh);
  // uniform: every rank's frame is the same, and *frames holds it once (Exchange's uniform).
  Status Settle(std::vector<Slot*> fresh, std::vector<std::string>* frames, int64_t start,
                bool uniform = false);
  // Round, with an exception turned into the status that breaks the engine.
  Status GuardedRound(std::vector<Slot*> fresh);
  // Every rank's frame (by rank), `mine` among them: Bruck's allgather, ceil(log2 n) steps, each
  // one message to rank - 2^k and one from rank + 2^k (a head, and a tail when longer; one
  // exchange with the peer at n = 2). A rank asleep is woken by the first step that reaches
  // it, so a round started by any rank reaches every rank.
  // spin_us: how long to busy-wait for a partner's message (the transport's Run).
  // uniform (optional): set when every rank's frame turned out to be the same (the exchange
  // saw one run of equal frames); the result then holds that frame once instead of n copies,
  // so that a warm round costs no O(n) copying or comparing of frames. The frames go to
  // *frames, whose strings keep their capacity for the next exchange.
  Status Exchange(const std::string& mine, std::vector<std::string>* frames,
                  int spin_us = kNegotiationSpinUs, bool* uniform = nullptr);
  // Exchange's runs of equal frames: all[first] stands for ranks first .. first + repeat - 1.
  struct FrameRun {
    int first;
    int repeat;
  };
  // A fusion plan: batches[0, planned) made of the responses [of, of + n).
  struct Plan {
    std::vector<Batch> batches;  // kept with their vectors' capacity
    const Response* of = nullptr;
    size_t n = 0, planned = 0;
  };
  // Plans and runs n ready responses. uniform: a uniform round's (Controller::uniform);
  // repeated: moreover the previous uniform round's, unchanged (Controller::repeated), so that
  // its plan still holds.
  void Execute(const Response* responses, size_t n, bool uniform = false, bool repeated = false);
  void RunPlan(Plan& p);
  Status RunBatch(Batch& b);
  Status RunAllreduce(const Response& r, Entry* e);
  Status RunFused(Batch& b);
  // One function per collective kind (host memory; e: this rank's entry, never null: these
  // fail while a rank has joined).
  Status RunBroadcast(const Response& r, Entry* e);
  Status RunAllgather(const Response& r, Entry* e);
  Status RunAlltoall(const Response& r, Entry* e);
  Status RunReduceScatter(const Response& r, Entry* e);
  // The timeline span of a collective that moved `bytes`, from t0 to now.
  void SpanMoved(const Request& q, const char* phase, int64_t t0, size_t bytes);
  Status RunDevice(Batch& b);
  // Records e's ready event on its caller's stream (device entries, at submission).
  Status RecordReady(Entry& e);
  void AbortDevice(const std::string& reason);
  // Allreduce of host buffers (several: one ring over all, see AllreduceSegments) with the
  // request's op, scale factors and averaging; `span`: the timeline row, or nullptr for none.
  Status HostAllreduce(std::vector<Segment> segments, const Request& req, int contributors,
                       const char* span);
  // Whether an allreduce goes through the fusion buffer (small) rather than in place.
  static bool Packed(const Request& req, size_t threshold) {
    const size_t bytes = req.count * req.ElemBytes();
    return bytes <= threshold && bytes < kDirectAllreduceBytes;
  }
  Result<gpu::DeviceBackend*> Device();
  // Finishes this rank's entry e (nullptr: none, the rank had joined); its handle is marked
  // done, and its name freed, by the NotifyCompleted that follows.
  void Complete(Entry* e, Code code, const std::string& message);
  void NotifyCompleted();
  // Fails everything pending and queued with st; later submissions fail with it too.
  void FailAll(const Status& st);
  // Appends to `fresh` what is submitted while a burst goes on (see burst_quiet_ns).
  void CollectBurst(std::vector<Slot*>& fresh);
  CollectiveContext Context();
  int64_t Now() const { return NowMicros(*clock_); }
  // A timeline change posted for the engine thread (StartTimeline, StopTimeline).
  struct TimelineChange {
    bool start = false;
    std::string path;
    bool mark_cycles = false;
  };
  Status ChangeTimeline(TimelineChange change);
  // The engine thread's side: applies a change taken from timeline_change_.
  Status ApplyTimeline(const TimelineChange& change);
  // Autotune's hook (autotune.cc). While tuning_, rank 0's frame starts with a block that says
  // whether the tuner chose new settings (PutTuned), and every rank takes it from rank 0's
  // frame and applies it before running that round (TakeTuned), so all switch at the same
  // round. The block of the final choice ends tuning_ on every rank: from then on frames are
  // as without autotune, and nothing of it runs per round.
  void StartTuner();  // on the engine thread, after Hello
  void PutTuned(std::string* frame);
  Status TakeTuned(std::string* rank0_frame);
  void ObserveRound(const Response* responses, size_t n, int64_t start_us);  // rank 0's tuner
  void ApplyTuned(const TunedParams& p);

  const EngineOptions options_;
  const Clock* const clock_;
  const Group world_;
  const std::function<bool(const void*)> is_device_;
  // An eventfd from a process-wide pool (never closed); -1 once Shutdown put it back.
  std::atomic<int> doorbell_;
  int doorbell() const { return doorbell_.load(std::memory_order_relaxed); }

  // The right to run a round (and so to touch everything below that is "the engine thread's
  // own"): the engine thread holds it at all times but while it sleeps in
  // Transport::WaitForInput, which unlocks it; a blocking caller that takes it then runs its
  // round itself (RunHere). Taken before mu_.
  Mutex round_mu_;

  // Guarded by mu_ (taken once per submission: the futex Mutex, one compare-and-swap). The
  // fields of a Slot marked "mu_" are guarded by it too.
  Mutex mu_;
  std::vector<Slot*> queue_ GUARDED_BY(mu_);
  // Slots by name (their keys view *Slot::name), unnamed tensors' made-up names included.
  NameTable<Slot> slots_ GUARDED_BY(mu_);
  std::deque<Slot> slot_store_ GUARDED_BY(mu_);  // grows; never moves a slot
  std::vector<Slot*> free_slots_ GUARDED_BY(mu_);
  size_t kept_slots_ GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> noname_counter_ GUARDED_BY(mu_);  // by Kind
  bool stop_ GUARDED_BY(mu_) = false;
  Status abort_ GUARDED_BY(mu_);
  Status failed_ GUARDED_BY(mu_);
  // A timeline change waiting for the engine thread, and its number; the number and result of
  // the last one applied (timeline_cv_ tells, and Shutdown). One change at a time:
  // timeline_call_mu_ is held through ChangeTimeline.
  std::optional<TimelineChange> timeline_change_ GUARDED_BY(mu_);
  uint64_t timeline_posted_ GUARDED_BY(mu_) = 0;
  uint64_t timeline_applied_ GUARDED_BY(mu_) = 0;
  Status timeline_result_ GUARDED_BY(mu_);
  CondVar timeline_cv_;
  Mutex timeline_call_mu_;  // taken before mu_
  std::atomic<bool> sleeping_{false};
  // Submissions pushed so far: written under mu_, read by CollectBurst without it.
  std::atomic<uint64_t> pushed_{0};

  // Whether the engine thread may run on one CPU only (ranks bound to a core each): it then
  // shares it with the submitting thread. Constant after construction.
  bool confined_ = false;
  // The engine thread's own, or a thread's that holds round_mu_ (RunHere).
  int64_t burst_quiet_ns_ = 0;  // options_.burst_quiet_ns, or 0 when confined to one CPU
  bool hierarchical_ = false;   // options_.hierarchical, or the tuner's choice
  // Autotune (see StartTuner): whether frames carry rank 0's block; rank 0's tuner while it
  // tries settings, and its choice not sent yet (final: the last).
  bool tuning_ = false;
  std::unique_ptr<Tuner> tuner_;
  std::optional<TunedParams> proposal_;
  bool proposal_final_ = false;
  std::unique_ptr<transport::Transport> transport_;
  bool spans_hosts_ = false;  // some rank is on another host (its ring runs over TCP)
  Controller controller_;
  StallInspector stall_;
  FusionBuffer fusion_;
  Scratch scratch_;
  TimelineHolder timeline_;
  bool mark_cycles_ = false;  // a CYCLE_START per round while the timeline is open
  // Announced and not complete: by the cache id they were announced under, or by name.
  std::vector<Slot*> by_cache_id_;
  NameTable<Slot> announced_full_;
  std::unique_ptr<gpu::DeviceBackend> device_;
  Status device_error_;
  // Shutdown and Abort (other threads) abort the device backend while a device batch runs, so
  // that its wait ends at once instead of at the collective timeout.
  Mutex device_mu_;
  gpu::DeviceBackend* device_live_ GUARDED_BY(device_mu_) = nullptr;  // device_.get() once made
  bool device_busy_ GUARDED_BY(device_mu_) = false;                   // a device batch is running
  std::string device_abort_ GUARDED_BY(device_mu_);  // why later device batches fail
  std::vector<char> zeros_;
  std::vector<HandleState*> completed_;   // done, waiters not yet woken
  std::vector<Slot*> spare_;              // an empty vector whose capacity the queue reuses
  std::vector<Slot*> finished_;           // complete: their slots are freed at NotifyCompleted
  std::vector<const Request*> announce_;  // Round's, kept for its capacity
  std::vector<Response> responses_;       // the controller's output (see Controller::Apply)
  Plan uniform_plan_, general_plan_;      // Execute's, for uniform rounds and for the others
  std::vector<size_t> open_;
  std::vector<int64_t> announce_ids_;
  std::string lone_frame_;  // SubmitLone's frame, kept for its capacity
  // Exchange's buffers, kept for their capacity (Round and SubmitLone hold round_mu_): the
  // frames it fills for them, its runs, its messages and its ops.
  std::vector<std::string> frames_;
  std::vector<FrameRun> exchange_runs_;
  std::string exchange_out_, exchange_in_;
  std::vector<transport::Op> exchange_ops_;
  std::vector<char> lone_scratch_;  // ReduceLone's scaled copy of a rank's data
  // negotiation_counters(): written by the thread that holds round_mu_, read by any.
  std::atomic<uint64_t> neg_rounds_{0}, neg_messages_{0}, neg_bytes_{0}, neg_lone_{0};

  std::thread thread_;
};

}  // namespace ringrun::runtime::engine
