// The engine thread: its sleep, the gathering of a burst of submissions, and the negotiation
// rounds (engine.h says when a round starts; controller.h what a frame holds).
#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "ringrun/common/defaults.h"
#include "runtime/src/engine/doorbell.h"
#include "runtime/src/engine/engine.h"
#include "runtime/src/engine/wire.h"

namespace ringrun::runtime::engine {
namespace {

// A frame travels as a fixed-size head (its length and first bytes) and, when longer, a tail:
// steady-state frames fit the head, so a round is one exchange.
constexpr size_t kFrameHeadBytes = 1024;
// A tail at most this long is sent with its head: it fits the small ring of a shared-memory pair
// (kSmallMessageBytes) and a socket's buffer, whatever the partner is doing.
constexpr size_t kEagerTailBytes = 8 << 10;
constexpr uint32_t kHelloMagic = 0x72726531;  // "rre1"

}  // namespace

void Engine::CollectBurst(std::vector<Slot*>& fresh) {
  // A step's tensors submitted back to back (a fraction of a microsecond apart) would otherwise
  // be cut at whichever submission woke the engine: a first round with the few queued by the
  // time the engine thread ran, a second with the rest, on a machine where the two threads run
  // on different cores. The quiet window is far below the gaps between a framework's gradient
  // hooks, so overlap with backward is kept; a waiter ends it at once, so a blocking call pays
  // nothing for it.
  const int64_t quiet = burst_quiet_ns_;
  if (quiet <= 0 || fresh.empty()) return;
  uint64_t seen = pushed_.load(std::memory_order_relaxed);
  const auto start = std::chrono::steady_clock::now();
  auto last = start;
  bool growing = false;
  while (!SomeoneWaits()) {
    for (int i = 0; i < 8; ++i) CpuRelax();
    const auto now = std::chrono::steady_clock::now();
    const uint64_t p = pushed_.load(std::memory_order_relaxed);
    if (p != seen) {
      seen = p, last = now, growing = true;
    } else if (now - last >= std::chrono::nanoseconds(growing ? quiet : quiet / 8)) {
      break;  // before any growth, an eighth: a lone submission is not held up
    }
    if (now - start >= std::chrono::nanoseconds(32 * quiet)) break;
  }
  MutexLock lock(&mu_);
  fresh.insert(fresh.end(), queue_.begin(), queue_.end());
  queue_.clear();
}

void Engine::SleepOnDoorbell(Deadline deadline) {
  pollfd p{doorbell(), POLLIN, 0};
  int ms = -1;
  if (deadline != Deadline::max()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    ms = std::max<int>(0, static_cast<int>(left.count()) + 1);
  }
  (void)::poll(&p, 1, ms);
}

void Engine::Loop() {
  // A thread confined to one CPU (ranks bound to a core each) shares it with the submitting
  // thread: nothing can be submitted while this thread spins, so a burst is never gathered.
  burst_quiet_ns_ = confined_ ? 0 : options_.burst_quiet_ns;
  MutexLock round(&round_mu_);  // unlocked only while asleep in WaitForInput
  Status st = Hello();
  if (!st.ok()) FailAll(st);
  if (st.ok()) StartTuner();
  for (;;) {
    std::vector<Slot*> fresh;
    fresh.swap(spare_);  // an empty vector with the capacity of an earlier round's
    bool failed;
    Status abort;
    std::optional<TimelineChange> change;
    uint64_t change_number = 0;
    {
      MutexLock lock(&mu_);
      if (stop_) break;
      fresh.swap(queue_);
      failed = !failed_.ok();
      abort = std::exchange(abort_, Status::Ok());
      if (timeline_change_) change.swap(timeline_change_), change_number = timeline_posted_;
    }
    if (change) {
      // Between rounds: no collective is running, and the change holds from the next round on.
      Status applied = ApplyTimeline(*change);
      MutexLock lock(&mu_);
      timeline_applied_ = change_number, timeline_result_ = std::move(applied);
      timeline_cv_.SignalAll();
    }
    if (!abort.ok() && !failed) {
      // A blocking call gave up waiting: name who is missing, then break (no buffer of a
      // returning call may stay in use).
      std::string who = stall_.Report(controller_.Pending(), Now(), 0);
      Status why(abort.code(), abort.message() + (who.empty() ? "" : ": " + who));
      if (transport_) transport_->Break(why);
      FailAll(why);  // fresh's slots are in flight: it fails them too
      continue;
    }
    if (failed) {
      // Broken: what was queued before the failure fails with it; then sleep until shutdown.
      if (!fresh.empty()) {
        Status failure;
        {
          MutexLock lock(&mu_);
          failure = failed_;
        }
        FailAll(failure);
      }
      SleepOnDoorbell(Deadline::max());
      DrainDoorbell(doorbell());
      continue;
    }
    bool peer_input = false;
    if (fresh.empty()) {
      sleeping_.store(true);
      {
        MutexLock lock(&mu_);
        if (stop_ || !queue_.empty() || !abort_.ok() || timeline_change_) {
          sleeping_.store(false);
          continue;
        }
      }
      // The full look at what is pending (it builds a list) only once a stall is possible.
      int64_t check = stall_.EarliestCheckUs(controller_.OldestPendingUs());
      if (check >= 0 && check <= Now()) check = stall_.NextCheckUs(controller_.Pending());
      Deadline deadline = Deadline::max();
      if (check >= 0) {
        deadline = std::chrono::steady_clock::now() +
                   std::chrono::microseconds(std::max<int64_t>(0, check - Now()));
      }
      Status wst;
      if (transport_) {
        wst = transport_->WaitForInput(doorbell(), deadline, &peer_input, &round_mu_);
      } else {
        SleepOnDoorbell(deadline);
      }
      sleeping_.store(false);
      DrainDoorbell(doorbell());
      if (!wst.ok()) {
        // As a failed round: the peers must see this rank's connections close, not wait for
        // it until their timeout.
        if (transport_) transport_->Break(wst);
        FailAll(wst);
        continue;
      }
      if (check >= 0 && Now() >= check) {
        Status sst = stall_.Check(controller_.Pending(), Now());
        if (!sst.ok()) {
          // Tell every rank in one more round, so that all fail with the report (not with
          // "connection closed" by the first rank to give up), then break.
          Status told = Round({}, sst.message());
          Status why = told.code() == Code::kAborted ? told : sst;
          if (transport_) transport_->Break(why);
          FailAll(Aborted(why.message()));
          continue;
        }
      }
      {
        MutexLock lock(&mu_);
        if (stop_) break;
        fresh.swap(queue_);
      }
      if (fresh.empty() && !peer_input) continue;
    }
    CollectBurst(fresh);
    st = GuardedRound(std::move(fresh));
    if (!st.ok()) {
      if (transport_) transport_->Break(st);
      FailAll(st);
    }
  }
  FailAll(Aborted("ringrun_shutdown was called with the collective pending"));
  if (timeline_) timeline_->Flush();
}

Status Engine::GuardedRound(std::vector<Slot*> fresh) {
  try {
    return Round(std::move(fresh));
  } catch (const std::bad_alloc&) {
    return Internal("out of memory in the engine");
  } catch (const std::exception& ex) {
    return Internal(std::string("unexpected exception in the engine: ") + ex.what());
  }
}

void Engine::RunHere(HandleState* h) {
  // Only while the engine thread sleeps in WaitForInput (the lock fails otherwise, and the
  // engine thread takes the queue as it does any submission's), and only where it has CPUs
  // of its own: confined to the caller's CPU, the engine thread's next round after blocking
  // calls run here takes longer (docs/engine.md, "Limits").
  if (!confined_ && transport_ && round_mu_.TryLock()) {
    std::vector<Slot*> fresh;
    {
      MutexLock lock(&mu_);
      // Asleep after its first exchange (sleeping_), h's lone host tensor and nothing else, no
      // pending name whose response could be a device batch, no timeline change or abort: what the
      // engine thread would do is exactly this round.
      if (sleeping_.load() && !stop_ && failed_.ok() && abort_.ok() && !timeline_change_ &&
          queue_.size() == 1 && queue_[0]->handle == h && !queue_[0]->req.device &&
          controller_.OldestPendingUs() < 0) {
        fresh.swap(spare_);
        fresh.swap(queue_);
      }
    }
    if (!fresh.empty()) {
      // The peers' frames arrive for this thread now: they need not wake the engine thread.
      transport_->QuietIdleWake();
      EndHere(h, GuardedRound(std::move(fresh)));
      return;
    }
    round_mu_.Unlock();
  }
  if (sleeping_.load() && sleeping_.exchange(false)) RingDoorbell(doorbell());
}

void Engine::EndHere(HandleState* h, const Status& st) {
  if (!st.ok()) {
    transport_->Break(st);
    FailAll(st);
  }
  // The engine thread takes over what is left: the tensor when the peers have not submitted it
  // yet (the stall inspector's deadline is the engine thread's), or the failure.
  bool wake = !st.ok() || !h->done() || controller_.OldestPendingUs() >= 0;
  if (wake) {
    if (st.ok()) transport_->RearmIdleWake();
  } else {
    // Done: this program's next call, which usually follows at once, runs the peers' next
    // round too, so their messages do not wake the engine thread (which would take that round
    // and hand its result back through a futex) unless they wait long for this rank.
    wake = transport_->LeaveIdleWakeQuiet();
  }
  round_mu_.Unlock();
  if (wake) RingDoorbell(doorbell());
}

Status Engine::Hello() {
  if (!transport_) return Status::Ok();
  // The first exchange: connects the pairs that negotiation uses (WaitForInput watches them)
  // and checks that the settings every rank must share agree.
  std::string mine;
  Put<uint32_t>(&mine, kHelloMagic);
  Put<uint64_t>(&mine, options_.fusion_threshold);
  Put<uint64_t>(&mine, options_.cache_capacity);
  Put<uint8_t>(&mine, options_.hierarchical ? 1 : 0);
  Put<uint8_t>(&mine, options_.autotune.enabled ? 1 : 0);
  std::vector<std::string> all;
  RINGRUN_RETURN_IF_ERROR(Exchange(mine, &all));
  for (int r = 0; r < options_.size; ++r) {
    if (all[r] != mine) {
      return InvalidArgument(
          "rank " + std::to_string(r) + " runs with other engine settings than rank " +
          std::to_string(options_.rank) +
          " (RINGRUN_FUSION_THRESHOLD, RINGRUN_CACHE_CAPACITY, HOROVOD_HIERARCHICAL_ALLREDUCE and "
          "HOROVOD_AUTOTUNE must be the same on every rank)");
    }
  }
  return Status::Ok();
}

CollectiveContext Engine::Context() {
  return CollectiveContext{transport_.get(), DeadlineAfter(options_.timeout_ms), &scratch_,
                           hierarchical_};
}

Status Engine::Exchange(const std::string& mine, std::vector<std::string>* frames, int spin_us,
                        bool* uniform) {
  // An allgather of frames by Bruck's algorithm: at step k this rank sends the frames it holds
  // (its own and those of the next 2^k - 1 ranks) to rank - 2^k and receives as many from
  // rank + 2^k, so after ceil(log2 n) steps it holds all n, for any n. A message carries its
  // frames as runs of equal frames (repeat, frame): where every rank announces the same (the
  // steady state), each message is one frame long whatever n is.
  // Every buffer here (the frames, the messages, the runs and the ops) keeps its capacity from
  // one exchange to the next: a blocking call's exchange allocates nothing.
  const int n = options_.size, me = options_.rank;
  if (uniform != nullptr) *uniform = false;
  std::vector<std::string>& all = *frames;
  all.resize(static_cast<size_t>(n));
  all[me].assign(mine);
  if (n == 1) return Status::Ok();
  const Deadline deadline = DeadlineAfter(options_.timeout_ms);
  auto bump = [](std::atomic<uint64_t>& c, uint64_t by) {  // one writer: no locked add
    c.store(c.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
  };
  bump(neg_rounds_, 1);
  // Every rank runs the same exchanges in the same order, so their count numbers them alike.
  const uint64_t round = neg_rounds_.load(std::memory_order_relaxed);
  // The frames held: this rank's and the next ones', as many as dist at the start of a step.
  std::vector<FrameRun>& runs = exchange_runs_;
  runs.assign(1, FrameRun{me, 1});
  std::string& out = exchange_out_;
  std::string& in = exchange_in_;
  std::vector<transport::Op>& ops = exchange_ops_;
  for (int dist = 1; dist < n; dist *= 2) {
    const int count = std::min(dist, n - dist);  // frames sent, and received
    const int to = (me - dist % n + n) % n, from = (me + dist) % n;
    // The first `count` frames held: [u32 length of what follows][runs: u32 repeat, frame].
    out.assign(4, '\0');
    for (int left = count, i = 0; left > 0; ++i) {
      const int take = std::min(left, runs[i].repeat);
      Put<uint32_t>(&out, static_cast<uint32_t>(take));
      PutString(&out, all[runs[i].first]);
      left -= take;
    }
    const uint32_t len = static_cast<uint32_t>(out.size() - 4);
    std::memcpy(out.data(), &len, 4);
    // A fixed-size head, and the rest (the tail) when longer. A short tail goes with the head,
    // so that the exchange costs one wait for the partner's head; a longer one after it (both
    // sides sending long tails before reading either could fill the pair both ways). The
    // receiver learns the tail's length from the head.
    const size_t tail = 4 + size_t{len} > kFrameHeadBytes ? 4 + size_t{len} - kFrameHeadBytes : 0;
    out.resize(std::max(out.size(), kFrameHeadBytes), '\0');
    in.resize(kFrameHeadBytes);  // no need to clear it: only what arrives is read
    // The head starts with its length: a same-host pair moves only the bytes it uses.
    ops.assign(1, transport::Op::Send(to, out.data(), kFrameHeadBytes));
    ops.back().length_prefixed = true;
    bump(neg_messages_, tail > 0 ? 2 : 1);
    bump(neg_bytes_, kFrameHeadBytes + tail);
    const bool eager = tail > 0 && tail <= kEagerTailBytes;
    if (eager) ops.push_back(transport::Op::Send(to, out.data() + kFrameHeadBytes, tail));
    ops.push_back(transport::Op::Recv(from, in.data(), kFrameHeadBytes));
    ops.back().round = round;
    ops.back().length_prefixed = true;
    RINGRUN_RETURN_IF_ERROR(transport_->Run(ops, deadline, spin_us));
    uint32_t in_len;
    std::memcpy(&in_len, in.data(), 4);
    ops.clear();
    if (tail > 0 && !eager) {
      ops.push_back(transport::Op::Send(to, out.data() + kFrameHeadBytes, tail));
    }
    if (4 + size_t{in_len} > kFrameHeadBytes) {
      in.resize(4 + size_t{in_len});
      ops.push_back(transport::Op::Recv(from, in.data() + kFrameHeadBytes,
                                        4 + size_t{in_len} - kFrameHeadBytes));
      ops.back().round = round;
    }
    if (!ops.empty()) RINGRUN_RETURN_IF_ERROR(transport_->Run(ops, deadline, spin_us));
    // The frames of ranks from, from + 1, ... (count of them), appended to those held; each
    // read where it lies in the message.
    in.resize(4 + size_t{in_len});
    size_t pos = 4;
    int got = 0;
    while (got < count) {
      uint32_t repeat, frame_len;
      if (!Get(in, &pos, &repeat) || !Get(in, &pos, &frame_len) || in.size() - pos < frame_len ||
          repeat == 0 || repeat > static_cast<uint32_t>(count - got)) {
        return Internal("malformed negotiation message from " + transport_->peers().Describe(from));
      }
      const char* frame = in.data() + pos;
      pos += frame_len;
      const int first = (from + got) % n;
      const std::string& last = all[runs.back().first];
      if (last.size() == frame_len && std::memcmp(last.data(), frame, frame_len) == 0) {
        runs.back().repeat += static_cast<int>(repeat);
      } else {
        all[first].assign(frame, frame_len);
        runs.push_back(FrameRun{first, static_cast<int>(repeat)});
      }
      got += static_cast<int>(repeat);
    }
    if (pos != in.size()) {
      return Internal("malformed negotiation message from " + transport_->peers().Describe(from));
    }
  }
  if (uniform != nullptr && runs.size() == 1) {
    // One run of n equal frames (its first is this rank's own): the frame once.
    *uniform = true;
    if (me != 0) all[0].swap(all[me]);
    all.resize(1);
    return Status::Ok();
  }
  // Every rank's frame in its own slot.
  for (const FrameRun& r : runs) {
    for (int i = 1; i < r.repeat; ++i) all[(r.first + i) % n].assign(all[r.first]);
  }
  return Status::Ok();
}

Status Engine::Round(std::vector<Slot*> fresh, const std::string& abort) {
  const int64_t start = Now();
  Announce(fresh);
  // A frame: rank 0's autotune block (while tuning), the abort report (usually empty), then
  // the controller's part.
  std::string frame;
  if (tuning_) PutTuned(&frame);
  PutString(&frame, abort);
  frame += controller_.EncodeFrame(announce_, &announce_ids_);
  bool uniform = false;
  RINGRUN_RETURN_IF_ERROR(Exchange(frame, &frames_, kNegotiationSpinUs, &uniform));
  return Settle(std::move(fresh), &frames_, start, uniform);
}

void Engine::Announce(const std::vector<Slot*>& fresh) {
  announce_.clear();
  announce_ids_.clear();
  for (Slot* s : fresh) {
    // The id it travelled under last time still fits if neither its arguments nor that cache
    // entry changed since it was compared with it.
    if (s->cache_id < 0 || s->args_changed ||
        controller_.CacheVersion(static_cast<uint32_t>(s->cache_id)) != s->cache_version) {
      const int64_t id = controller_.CachedId(s->req, s->cache_id);
      if (s->cache_id != id) s->cache_id = id;  // written only when it changes
      if (s->cache_id >= 0) {
        s->cache_version = controller_.CacheVersion(static_cast<uint32_t>(s->cache_id));
      }
      s->args_changed = false;
    }
    if (s->cache_id >= 0) {
      const size_t id = static_cast<size_t>(s->cache_id);
      if (by_cache_id_.size() <= id) by_cache_id_.resize(std::max(id + 1, 2 * by_cache_id_.size()));
      by_cache_id_[id] = s;
    } else {
      announced_full_.Insert(*s->name, s);
    }
    announce_.push_back(&s->req);
    announce_ids_.push_back(s->cache_id);
  }
}

Status Engine::Settle(std::vector<Slot*> fresh, std::vector<std::string>* frames, int64_t start,
                      bool uniform) {
  // A lone frame (a peer's blocking call, lone.cc) stands for its request in full.
  for (std::string& f : *frames) {
    if (IsLoneFrame(f)) RINGRUN_RETURN_IF_ERROR(LoneAsGeneral(&f));
  }
  if (tuning_) RINGRUN_RETURN_IF_ERROR(TakeTuned(&(*frames)[0]));
  for (std::string& f : *frames) {
    size_t pos = 0;
    std::string report;
    if (!GetString(f, &pos, &report)) return Internal("malformed negotiation frame");
    if (!report.empty()) return Aborted(report);
    f.erase(0, pos);
  }
  const Response* responses = nullptr;
  Result<size_t> ready = controller_.Apply(*frames, Now(), &responses_, &responses, uniform);
  if (!ready.ok()) return ready.status();
  if (timeline_) {
    if (mark_cycles_) timeline_->MarkCycle(start);
    timeline_->Mark("ROUND", start,
                    "\"round\": " + std::to_string(controller_.round()) + ", \"announced\": " +
                        std::to_string(fresh.size()) + ", \"ready\": " + std::to_string(*ready));
  }
  Execute(responses, *ready, controller_.uniform(), controller_.repeated());
  if (tuner_) ObserveRound(responses, *ready, start);
  if (timeline_) timeline_->Flush();
  fresh.clear();
  spare_.swap(fresh);  // its capacity serves the submission queue again
  return Status::Ok();
}

}  // namespace ringrun::runtime::engine
