// The engine: one background thread per process that negotiates, fuses and runs the named
// collectives that any thread submits (ringrun.h states the user contract; docs/engine.md the
// design).
//
// Threads. Submit, Wait and Shutdown may be called from any thread. The engine thread is the
// only one that touches the Transport, the controller, the fusion buffer and the device backend
// (confined to it, not locked; only the backend's thread-safe Abort is called from Shutdown and
// Abort, under device_mu_). mu_ guards the submission queue, the names in flight and the
// failure state.
//
// Idle. With nothing submitted and nothing arriving, the engine thread sleeps in
// Transport::WaitForInput on its doorbell (an eventfd that a submission rings only when the
// engine sleeps) and on every peer: no timer, no polling, no traffic. It wakes early only for
// the stall inspector, and only while some tensor is pending.
//
// Rounds. A round starts when this rank has new submissions or a peer has started one: every
// rank sends every other its frame (the requests it announces; see controller.h) and receives
// theirs, so every rank learns the same facts and computes the same responses. Work submitted
// while a round or its collectives run waits for the next round: the batch grows with the load
// and never waits for a timer.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ringrun/common/fd.h"
#include "runtime/src/collectives.h"
#include "runtime/src/engine/clock.h"
#include "runtime/src/engine/controller.h"
#include "runtime/src/engine/fusion_buffer.h"
#include "runtime/src/engine/request.h"
#include "runtime/src/engine/stall_inspector.h"
#include "runtime/src/engine/timeline.h"
#include "runtime/src/transport.h"

namespace ringrun::runtime {
class DeviceBackend;
}

namespace ringrun::runtime::engine {

inline constexpr size_t kDefaultFusionThreshold = size_t{64} << 20;
inline constexpr size_t kDefaultCacheCapacity = 1024;

struct EngineOptions {
  int rank = 0, size = 1, local_rank = 0;
  int timeout_ms = 60000;
  size_t fusion_threshold = kDefaultFusionThreshold;  // 0: no fusion
  size_t cache_capacity = kDefaultCacheCapacity;
  StallOptions stall;
  std::string timeline_path;  // "": no timeline
  // Where stall warnings go (default: stderr).
  std::function<void(const std::string&)> log;
  const EngineClock* clock = nullptr;  // default: the steady clock
  // The GPU seam (tests inject fakes): whether a pointer is device memory, and the backend's
  // factory, called on the engine thread at the first device collective with the NCCL id that
  // rank 0 made (make_nccl_id, rank 0 only) and broadcast over the CPU transport. Unset: the
  // build's own (gpu/device_backend.h), or none.
  std::function<bool(const void*)> is_device;
  std::function<std::string()> make_nccl_id;
  std::function<Result<std::unique_ptr<DeviceBackend>>(const std::string& nccl_id)> make_device;
  // Records a device entry's ready event at submission, on the submitting thread: a CUDA event
  // on the device of `buffer`, recorded on `stream` (nullptr: the legacy default stream).
  // Unset: the build's RecordDeviceEvent.
  std::function<Result<std::shared_ptr<void>>(const void* buffer, void* stream)> record_event;
};

// The object behind a ringrun_handle.
struct HandleState {
  std::mutex mu;
  std::condition_variable cv;
  // Guarded by mu.
  bool done = false;
  ringrun_status status = RINGRUN_OK;
  std::string message;
  int remaining = 0;  // entries not complete yet
  // Constant after submission.
  std::string name;
  Kind kind = Kind::kAllreduce;
  size_t elem = 0;
  // Written by the engine before done is set; read after.
  std::vector<char> output;
  std::vector<size_t> rows;
  int last_joined = -1;
  // Device allgather/alltoall through a handle: the result, in device memory that the handle
  // owns (freed with it), instead of `output`.
  std::shared_ptr<void> device_output;
  size_t device_output_bytes = 0;
};

struct SubmitResult {
  ringrun_status status = RINGRUN_OK;
  std::string message;
  std::shared_ptr<HandleState> handle;
};

class Engine {
 public:
  // transport may be null (a job of one). Starts the engine thread, which first meets every
  // peer once (connecting all pairs and checking that their settings agree).
  Engine(std::unique_ptr<Transport> transport, EngineOptions options);
  ~Engine();  // Shutdown()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues entries atomically (one handle for all of them); an empty name gets
  // the default. A group's entries (group: a grouped allreduce) are named
  // "<name>.<i>of<n>" after entries[0]'s name. Never waits for other ranks.
  SubmitResult Submit(std::vector<Entry> entries, bool group = false);
  // Waits for `h` up to timeout_ms (< 0: the collective timeout); RINGRUN_ERR_TIMEOUT if it
  // has not completed by then.
  static ringrun_status Wait(HandleState& h, int timeout_ms);
  int timeout_ms() const { return options_.timeout_ms; }
  // Breaks the runtime with `st` (from any thread): the engine fails everything pending with
  // it, naming the ranks that have not submitted what is pending. For a blocking call that
  // gave up waiting.
  void Abort(const Status& st);
  // Stops the engine thread; pending handles fail with RINGRUN_ERR_ABORTED. Idempotent.
  void Shutdown();
  const EngineOptions& options() const { return options_; }

 private:
  struct Batch;
  void Loop();
  void SleepOnDoorbell(Deadline deadline);
  Status Hello();
  // One negotiation round announcing `fresh`. A non-empty `abort` tells every rank to fail
  // with it (the stall shutdown); a peer's abort comes back as kAborted with its text.
  Status Round(std::vector<Entry> fresh, const std::string& abort = "");
  Result<std::vector<std::string>> Exchange(const std::string& mine);
  void Execute(std::vector<Response>& responses);
  Status RunBatch(Batch& b);
  Status RunAllreduce(const Response& r, Entry* e);
  Status RunFused(Batch& b);
  Status RunOther(const Response& r, Entry* e);
  Status RunDevice(Batch& b);
  // Records e's ready event on its caller's stream (device entries, at submission).
  Status RecordReady(Entry& e);
  void AbortDevice(const std::string& reason);
  // Allreduce of host buffers (several: one ring over all, see AllreduceSegments) with the
  // request's op, scale factors and averaging; `span`: the timeline row, or nullptr for none.
  Status HostAllreduce(std::vector<Segment> segments, const Request& req, int contributors,
                       const char* span);
  // Whether an allreduce goes through the fusion buffer (small) rather than in place.
  static bool Packed(const Request& req, size_t threshold);
  Result<DeviceBackend*> Device();
  // Finishes this rank's entry e (nullptr: none, the rank had joined); its handle is marked
  // done, and its name freed, by the NotifyCompleted that follows.
  void Complete(Entry* e, ringrun_status st, const std::string& message);
  void NotifyCompleted();
  // Fails everything pending and queued with st; later submissions fail with it too.
  void FailAll(ringrun_status code, const Status& st);
  CollectiveContext Context();
  int64_t Now() const { return clock_->NowMicros(); }

  const EngineOptions options_;
  SteadyClock steady_;
  const EngineClock* const clock_;
  const Group world_;
  const std::function<bool(const void*)> is_device_;
  UniqueFd doorbell_;  // eventfd

  std::mutex mu_;
  std::vector<Entry> queue_;                   // guarded by mu_
  std::unordered_set<std::string> in_flight_;  // names submitted and not complete; mu_
  std::vector<uint64_t> noname_counter_;       // by Kind; mu_
  bool stop_ = false;                          // mu_
  Status abort_;                               // mu_
  ringrun_status failed_code_ = RINGRUN_OK;    // mu_
  std::string failed_message_;                 // mu_
  std::atomic<bool> sleeping_{false};

  // The engine thread's own.
  std::unique_ptr<Transport> transport_;
  bool spans_hosts_ = false;  // some rank is on another host (its ring runs over TCP)
  Controller controller_;
  StallInspector stall_;
  FusionBuffer fusion_;
  Scratch scratch_;
  std::unique_ptr<Timeline> timeline_;
  std::unordered_map<std::string, Entry> entries_;  // announced, by name
  std::unique_ptr<DeviceBackend> device_;
  Status device_error_;
  // Shutdown and Abort (other threads) abort the device backend while a device batch runs, so
  // that its wait ends at once instead of at the collective timeout.
  std::mutex device_mu_;
  DeviceBackend* device_live_ = nullptr;  // device_mu_: device_.get() once made
  bool device_busy_ = false;              // device_mu_: a device batch is running
  std::string device_abort_;              // device_mu_: why later device batches fail
  std::vector<char> zeros_;
  std::vector<std::shared_ptr<HandleState>> completed_;  // done, waiters not yet woken
  std::vector<Entry> spare_;                 // an empty vector whose capacity the queue reuses
  std::vector<std::string> finished_names_;  // to leave in_flight_ at NotifyCompleted

  std::thread thread_;
};

// The ringrun_status of a Status (Code values 1..7 are the same numbers).
ringrun_status ToRingrunStatus(const Status& st);

}  // namespace ringrun::runtime::engine
