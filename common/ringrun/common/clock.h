// The time seam: code whose rules depend on time (grace periods, heartbeats, start timeouts)
// reads it through a Clock, so that tests can move time by hand instead of sleeping.
#pragma once

#include <atomic>
#include <chrono>

namespace ringrun {

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
