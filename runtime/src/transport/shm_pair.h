// A shared-memory pair: two ranks on one host exchange bytes through rings in one segment that
// the connector creates (an anonymous memfd) and passes to the acceptor over the local Unix
// socket (handshake.h). The socket stays open as the peer's lifeline: its EOF means the peer
// died. Nothing has a name in any file system, so nothing is left behind however the job ends:
// the kernel frees the segment with its last mapping.
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/src/transport/pair.h"

namespace ringrun::runtime::transport {

inline constexpr size_t kMaxShmRingBytes = size_t{1} << 30;

struct alignas(64) PaddedU32 {
  std::atomic<uint32_t> v{0};
};
struct alignas(64) PaddedU64 {
  std::atomic<uint64_t> v{0};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shm needs lock-free atomics");

// A segment holds four rings ("lanes"). Lane d (0, 1) carries large messages from side d to
// side 1-d; lane 2 + d carries that direction's messages of at most kSmallMessageBytes in a
// small ring that stays hot in both cores' caches (a small message walking a large ring touches
// cold lines every time). Both sides pick the lane from the message's length, so each lane stays
// in message order. Side 0 is the connector.
constexpr size_t kSmallMessageBytes = 8 << 10;
constexpr size_t kSmallRingBytes = 32 << 10;
struct ShmHeader {
  uint64_t magic;
  uint64_t ring_bytes;   // of the large lanes
  PaddedU32 bell[2];     // bumped whenever something side s may wait for changes
  PaddedU32 waiting[2];  // side s is about to sleep on bell[s]
  PaddedU64 head[4];     // lane l: bytes produced (written by side l % 2)
  PaddedU64 tail[4];     // lane l: bytes consumed (written by side 1 - l % 2)
  PaddedU64 join[2];     // side s is asked to join this negotiation exchange (Op::round)
};
constexpr size_t kShmDataOffset = (sizeof(ShmHeader) + 4095) & ~size_t{4095};
// Each lane has a region of its ring's size plus a page and starts kLaneSkew bytes into it.
// Page-aligned rings with page-aligned user buffers put the reduction's loads and stores at the
// same offsets within a page (4K aliasing), which halves the speed of small reductions.
constexpr size_t kLaneSkew = 2048 + 64;
constexpr size_t ShmSegmentBytes(size_t ring_bytes) {
  return kShmDataOffset + 2 * (ring_bytes + 4096) + 2 * (kSmallRingBytes + 4096);
}
constexpr uint64_t kShmMagic = 0x72696e6772756e31ull;

// waiting[s] while side s sleeps in Transport::WaitForInput (1: asleep on its bell).
constexpr uint32_t kIdleWaiting = 2;
// waiting[s] while side s sleeps there but another thread of side s ran a round in its stead
// and left its wake-ups quiet (Transport::LeaveIdleWakeQuiet): a change wakes nobody, and the
// peer wakes it only once it has waited for it kQuietKickUs (defaults.h; KickIfQuiet).
constexpr uint32_t kQuietWaiting = 3;

// Reads and drops the wake-up bytes on a shared-memory pair's lifeline socket (never its EOF).
void DrainWakeBytes(int fd);

// One mapping of a segment.
class ShmSegment {
 public:
  ShmSegment(void* base, size_t len) : base_(base), len_(len) {}
  ~ShmSegment() { ::munmap(base_, len_); }
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ShmHeader* header() const { return static_cast<ShmHeader*>(base_); }
  char* data() const { return static_cast<char*>(base_) + kShmDataOffset; }

 private:
  void* base_;
  size_t len_;
};

// Maps the segment behind `fd`. create: sizes it and writes the header; otherwise checks that
// it has the layout of `ring_bytes` rings (a peer's segment is checked before use).
Result<std::unique_ptr<ShmSegment>> MapShm(int fd, size_t ring_bytes, bool create);

class ShmPair final : public Pair {
 public:
  ShmPair(UniqueFd lifeline, std::unique_ptr<ShmSegment> seg, int side)
      : Pair(std::move(lifeline)),
        seg_(std::move(seg)),
        side_(side),
        ring_bytes_(seg_->header()->ring_bytes) {}
  bool is_shm() const override { return true; }

  Result<bool> Progress(OpState& st) override;

  // Sleeping on this pair's bell: PrepareWait (returns the bell's value), re-check progress,
  // then sleep while the bell still holds that value (WaitForBells), then CancelWait.
  uint32_t PrepareWait() {
    seg_->header()->waiting[side_].v.store(1, std::memory_order_seq_cst);
    return bell()->load(std::memory_order_seq_cst);
  }
  void CancelWait() { seg_->header()->waiting[side_].v.store(0, std::memory_order_relaxed); }
  // Idle waiting (Transport::WaitForInput) sleeps in poll(), not on the bell: while armed, the
  // peer's next change writes one byte to the lifeline socket instead of waking a futex.
  // Returns whether input is there already.
  bool ArmIdleWake() {
    seg_->header()->waiting[side_].v.store(kIdleWaiting, std::memory_order_seq_cst);
    return HasInput();
  }
  void DisarmIdleWake() {
    seg_->header()->waiting[side_].v.store(0, std::memory_order_seq_cst);
    DrainWakeBytes(fd());
  }
  // For a side that slept armed while another thread of it ran rounds (SocketTransport's idle
  // yield): drops late wake-up bytes, and arms again unless that thread left the wake-ups quiet.
  // Returns whether input is there.
  bool RearmUnlessQuiet() {
    DrainWakeBytes(fd());
    std::atomic<uint32_t>& waiting = seg_->header()->waiting[side_].v;
    if (waiting.load(std::memory_order_seq_cst) != kQuietWaiting) {
      waiting.store(kIdleWaiting, std::memory_order_seq_cst);
    }
    return HasInput();
  }
  // Takes back an armed idle wake-up (another thread of this side runs the pair now). A quiet
  // one stays: the peer's changes wake nobody then either, and the word, which the peer reads
  // on every change, is not written on every blocking call (a cache line that moves between
  // the CPUs each time). A peer that waits kQuietKickUs meanwhile wakes the sleeper, which then
  // waits for the running thread's `asleep` mutex and finds nothing left to do.
  void QuietIdleWake() {
    std::atomic<uint32_t>& waiting = seg_->header()->waiting[side_].v;
    uint32_t w = waiting.load(std::memory_order_seq_cst);
    if (w == kIdleWaiting) waiting.compare_exchange_strong(w, 0, std::memory_order_seq_cst);
  }
  // After such a round, while this side's engine thread still sleeps: the peer's changes wake
  // nobody (see kQuietWaiting). Written only when it changes (see QuietIdleWake).
  void LeaveIdleWakeQuiet() {
    std::atomic<uint32_t>& waiting = seg_->header()->waiting[side_].v;
    if (waiting.load(std::memory_order_seq_cst) != kQuietWaiting) {
      waiting.store(kQuietWaiting, std::memory_order_seq_cst);
    }
  }
  // The peer's side of it: wakes this pair's other side if its wake-ups are quiet (one byte on
  // the lifeline, as Notify sends to an armed side). Whether it did.
  bool KickIfQuiet() {
    uint32_t w = kQuietWaiting;
    if (!seg_->header()->waiting[1 - side_].v.compare_exchange_strong(w, 0,
                                                                      std::memory_order_seq_cst)) {
      return false;
    }
    SendWakeByte();
    return true;
  }
  // The peer's side of Op::round: asks this pair's other side to join negotiation exchange
  // `round`, and wakes it if it sleeps in WaitForInput (armed or quiet). A side that is not
  // asleep there sees the request when it next arms (AskedToJoin after ArmIdleWake).
  void AskToJoin(uint64_t round) {
    ShmHeader* h = seg_->header();
    h->join[1 - side_].v.store(round, std::memory_order_seq_cst);
    std::atomic<uint32_t>& waiting = h->waiting[1 - side_].v;
    uint32_t w = waiting.load(std::memory_order_seq_cst);
    if ((w == kIdleWaiting || w == kQuietWaiting) &&
        waiting.compare_exchange_strong(w, 0, std::memory_order_seq_cst)) {
      SendWakeByte();
    }
  }
  // Whether the peer waits for this side in exchange `round` (the one after the last this side
  // ran: an older request is stale).
  bool AskedToJoin(uint64_t round) const {
    return seg_->header()->join[side_].v.load(std::memory_order_seq_cst) == round;
  }
  bool HasInput() const {
    ShmHeader* h = seg_->header();
    for (bool small : {false, true}) {
      const int l = GetLane(1 - side_, small).index;
      if (h->head[l].v.load(std::memory_order_seq_cst) !=
          h->tail[l].v.load(std::memory_order_relaxed)) {
        return true;
      }
    }
    return false;
  }
  // This side's bell: the peer bumps it (and wakes it when this side waits) on every change.
  std::atomic<uint32_t>* bell() const { return &seg_->header()->bell[side_].v; }

 private:
  void Notify(int other);
  void SendWakeByte();
  struct Lane {
    int index;     // into head/tail
    char* ring;    // its bytes
    size_t bytes;  // a power of two
  };
  // The lane of messages from side `from`, small or large.
  Lane GetLane(int from, bool small) const {
    char* base = seg_->data() + kLaneSkew;
    if (!small) return Lane{from, base + size_t(from) * (ring_bytes_ + 4096), ring_bytes_};
    base += 2 * (ring_bytes_ + 4096) + size_t(from) * (kSmallRingBytes + 4096);
    return Lane{2 + from, base, kSmallRingBytes};
  }
  // Ring positions are multiples of 8, so an element never straddles the wrap.
  void CopyIn(const Lane& l, uint64_t pos, const char* src, size_t len, size_t off, size_t n);
  void CopyOut(const Lane& l, uint64_t pos, Op& op, size_t off, size_t n);

  std::unique_ptr<ShmSegment> seg_;
  const int side_;
  const size_t ring_bytes_;
  // This side's send lanes (large, small): the receiver's tail when last read (acquire), so
  // that the bytes before it are free.
  uint64_t seen_tail_[2] = {0, 0};
};

// Sleeps until one of `bells` no longer holds its value in `seen`, or max_us pass.
void WaitForBells(const std::vector<std::atomic<uint32_t>*>& bells,
                  const std::vector<uint32_t>& seen, int max_us);

}  // namespace ringrun::runtime::transport
