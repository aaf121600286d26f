// The engine object: its construction (the thread, the doorbell, the timeline), failure state,
// Abort and Shutdown. The rest of Engine lives in the rooms that docs/engine.md lists:
// submission.cc, loop.cc, plan.cc, execution.cc, host_execution.cc, device_execution.cc.
#include "runtime/src/engine/engine.h"

#include <sched.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "runtime/src/engine/buffers.h"
#include "runtime/src/engine/doorbell.h"
#include "runtime/src/gpu/device_backend.h"  // the interface; its factories are linked with the seam

namespace ringrun::runtime::engine {

Status Engine::failure() {
  MutexLock lock(&mu_);
  return failed_;
}

Engine::Engine(std::unique_ptr<transport::Transport> transport, EngineOptions options)
    : options_(std::move(options)),
      clock_(options_.clock ? options_.clock : &SteadyClock()),
      world_([&] {
        Group g;
        for (int r = 0; r < options_.size; ++r) g.ranks.push_back(r);
        g.me = options_.rank;
        return g;
      }()),
      is_device_(options_.is_device ? options_.is_device : IsDeviceMemory),
      doorbell_(TakeDoorbell()),
      noname_counter_(8, 0),
      hierarchical_(options_.hierarchical),
      tuning_(options_.autotune.enabled),
      transport_(std::move(transport)),
      controller_(options_.size, options_.cache_capacity),
      stall_(
          options_.stall, options_.rank,
          options_.log
              ? options_.log
              : [](const std::string& m) { std::fprintf(stderr, "ringrun: %s\n", m.c_str()); }),
      fusion_(options_.fusion_threshold) {
  if (const int bell = doorbell(); bell < 0) {
    // Nothing could wake the engine thread: fail now, without one (Submit refuses, and
    // Runtime::Join reports it); the peers see this rank's connections close.
    doorbell_.store(-1);
    Status why = Internal("rank " + std::to_string(options_.rank) +
                          ": cannot make the engine's eventfd: " + std::strerror(-bell) +
                          (-bell == EMFILE ? " (the process's open-file limit, ulimit -n)" : ""));
    failed_ = why;
    if (transport_) transport_->Break(why);
    return;
  }
  if (!options_.timeline_path.empty()) {
    Status st = ApplyTimeline({true, options_.timeline_path, options_.timeline_mark_cycles});
    if (!st.ok()) {
      std::fprintf(stderr, "ringrun: rank %d: %s (no timeline)\n", options_.rank,
                   st.ToString().c_str());
    }
  }
  cpu_set_t cpus;  // this thread's, which the engine thread inherits
  confined_ = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && CPU_COUNT(&cpus) <= 1;
  controller_.set_record_announcements(static_cast<bool>(timeline_));
  if (transport_) {
    for (int r = 0; r < options_.size; ++r) {
      if (!transport_->peers().SameHost(r, options_.rank)) spans_hosts_ = true;
    }
  }
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() { Shutdown(); }

void Engine::Shutdown() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  timeline_cv_.SignalAll();  // a timeline change still waiting fails
  AbortDevice("ringrun_shutdown was called with device collectives pending");
  RingDoorbell(doorbell());
  if (thread_.joinable()) thread_.join();
  // What the engine thread owned goes now rather than with the object: the C API never
  // destroys a runtime (a call on another thread may still be in it; see c_api.cc), and the
  // peers must see this rank's connections close. The doorbell goes back to the pool, open (a
  // late Abort or submission may still ring it), and the timeline is closed. Idempotent.
  ReturnDoorbell(doorbell_.exchange(-1));
  timeline_.reset();
  {
    MutexLock lock(&device_mu_);
    device_live_ = nullptr;
  }
  device_.reset();
  transport_.reset();
  fusion_.Release();
  scratch_ = Scratch();
  std::vector<char>().swap(zeros_);
  std::vector<Slot*>().swap(by_cache_id_);
  announced_full_.Clear();
  std::vector<Response>().swap(responses_);
  uniform_plan_ = Plan();
  general_plan_ = Plan();
  MutexLock lock(&mu_);  // submissions see stop_ first and touch no slot
  std::vector<Slot*>().swap(queue_);
  slots_.Clear();
  std::vector<Slot*>().swap(free_slots_);
  slot_store_.clear();
}

void Engine::Abort(const Status& st) {
  {
    MutexLock lock(&mu_);
    if (!failed_.ok() || !abort_.ok()) return;
    abort_ = st;
  }
  AbortDevice(st.message());
  RingDoorbell(doorbell());
}

Status Engine::StartTimeline(const std::string& path, bool mark_cycles) {
  if (!options_.timeline_dynamic && options_.timeline_path.empty()) {
    return InvalidArgument(
        "the timeline is not enabled: set HOROVOD_TIMELINE=DYNAMIC (or a file) to start one from "
        "the program");
  }
  if (path.empty()) return InvalidArgument("start_timeline: an empty file name");
  return ChangeTimeline({true, path, mark_cycles});
}

Status Engine::StopTimeline() { return ChangeTimeline({}); }

Status Engine::ChangeTimeline(TimelineChange change) {
  MutexLock serial(&timeline_call_mu_);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  uint64_t mine;
  {
    MutexLock lock(&mu_);
    if (stop_) return Aborted("ringrun is shutting down");
    if (doorbell() < 0) return failed_;  // no engine thread (see the constructor)
    timeline_change_ = std::move(change);
    mine = ++timeline_posted_;
  }
  RingDoorbell(doorbell());
  MutexLock lock(&mu_);
  while (timeline_applied_ < mine) {
    if (stop_) return Aborted("ringrun was shut down before the timeline changed");
    if (!timeline_cv_.WaitUntil(&mu_, deadline) && timeline_applied_ < mine) {
      // Not taken yet: withdrawn. Taken: the engine thread applies it later.
      if (timeline_change_ && timeline_posted_ == mine) timeline_change_.reset();
      return Timeout("rank " + std::to_string(options_.rank) +
                     ": the engine did not change the timeline within " +
                     std::to_string(options_.timeout_ms) + " ms (RINGRUN_TIMEOUT_MS)");
    }
  }
  return timeline_result_;
}

Status Engine::ApplyTimeline(const TimelineChange& change) {
  if (!change.start) {
    timeline_.reset();
  } else if (!timeline_ || timeline_->path() != change.path) {
    // The launcher's file (from the start, or named again after a stop) goes to its pipe.
    const bool to_launcher = options_.timeline_fd >= 0 && change.path == options_.timeline_path;
    Result<std::unique_ptr<Timeline>> t =
        to_launcher ? Timeline::OpenPipe(options_.timeline_fd, change.path, options_.rank, clock_)
                    : Timeline::Open(change.path, options_.rank, clock_);
    if (!t.ok()) return t.status();
    timeline_.reset(std::move(t.value()));
  }
  mark_cycles_ = change.mark_cycles;
  cpu_set_t cpus;  // this thread's, which the engine thread inherits
  confined_ = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && CPU_COUNT(&cpus) <= 1;
  controller_.set_record_announcements(static_cast<bool>(timeline_));
  return Status::Ok();
}

}  // namespace ringrun::runtime::engine
