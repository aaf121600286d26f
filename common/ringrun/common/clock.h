// Time, in one place.
//   - Clock is the seam: code whose rules depend on time (grace periods, heartbeats, start
//     timeouts, the stall inspector, the timeline) reads it through a Clock, so that tests move
//     time by hand instead of sleeping.
//   - Deadline is what every blocking wait takes (a point on std::chrono::steady_clock); code
//     that only bounds a syscall by it reads steady_clock directly.
#pragma once

#include <atomic>
#include <chrono>

namespace ringrun {

// The end of a bounded wait.
using Deadline = std::chrono::steady_clock::time_point;

inline Deadline DeadlineAfter(int timeout_ms) {
  return std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
}

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  // Monotonic. Thread-safe.
  virtual TimePoint Now() const = 0;
};

// std::chrono::steady_clock. Stateless; lives for the whole program.
inline const Clock& SteadyClock() {
  class Steady final : public Clock {
   public:
    TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  };
  static const Steady clock;
  return clock;
}

// A clock that moves only when told to (tests). Thread-safe.
class ManualClock final : public Clock {
 public:
  ManualClock() : now_(std::chrono::steady_clock::now().time_since_epoch().count()) {}
  TimePoint Now() const override { return TimePoint(TimePoint::duration(now_.load())); }
  void Advance(std::chrono::milliseconds ms) {
    now_ += std::chrono::duration_cast<TimePoint::duration>(ms).count();
  }

 private:
  std::atomic<TimePoint::rep> now_;
};

}  // namespace ringrun
