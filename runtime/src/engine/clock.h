// The engine's clock seam (as LevelDB's Env::NowMicros): the stall inspector and the timeline
// read time only through it, so their tests inject a fake.
#pragma once

#include <chrono>
#include <cstdint>

namespace ringrun::runtime::engine {

class EngineClock {
 public:
  virtual ~EngineClock() = default;
  // Microseconds on a monotonic clock.
  virtual int64_t NowMicros() const = 0;
};

class SteadyClock final : public EngineClock {
 public:
  int64_t NowMicros() const override {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace ringrun::runtime::engine
