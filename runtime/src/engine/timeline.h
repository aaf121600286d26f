// The timeline: a Chrome trace (JSON array format) of what the engine did with each tensor,
// which Perfetto and chrome://tracing load. Each rank writes its own file (see docs/engine.md:
// no rank ever waits for another's timeline, and the trace format needs no merging step since
// every event carries its rank as pid). The file is flushed after every negotiation round and
// is valid JSON up to the missing closing bracket when the process is killed, which the trace
// viewers accept. Off (a null Timeline*) it costs one pointer test per event site.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <unordered_map>

#include "ringrun/common/clock.h"
#include "ringrun/common/status.h"

namespace ringrun::runtime::engine {

// The engine's timestamps (the timeline's, the stall inspector's, a submission's): microseconds
// on `clock`.
inline int64_t NowMicros(const Clock& clock) {
  return std::chrono::duration_cast<std::chrono::microseconds>(clock.Now().time_since_epoch())
      .count();
}

class Timeline {
 public:
  // Opens `path` for writing (truncating it). rank is the trace's pid.
  static Result<std::unique_ptr<Timeline>> Open(const std::string& path, int rank,
                                                const Clock* clock);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // A complete event on the tensor's row: phase from start_us to end_us; args is a JSON object
  // body ("\"bytes\": 4") or empty.
  void Span(const std::string& tensor, const char* phase, int64_t start_us, int64_t end_us,
            const std::string& args = "");
  // An instant marker on the engine's row (e.g. a negotiation round).
  void Mark(const char* what, int64_t at_us, const std::string& args = "");
  // Horovod's "CYCLE_START": an instant marker across the whole trace (global scope), one per
  // engine cycle (here: per negotiation round).
  void MarkCycle(int64_t at_us);
  void Flush();
  // Ends the file (strict JSON) and closes it; later events are dropped. The destructor does
  // it if nobody did.
  void Close();
  // When the file was opened: its ts 0. Events that began earlier are drawn from here.
  int64_t origin_us() const { return origin_us_; }
  const std::string& path() const { return path_; }

 private:
  Timeline(std::FILE* f, std::string path, int rank, const Clock* clock);
  int Row(const std::string& tensor);

  std::FILE* f_;
  const std::string path_;
  const int rank_;
  const int64_t origin_us_;
  std::unordered_map<std::string, int> rows_;
};

// The engine's timeline, which it opens, writes and closes on its own thread, and which other
// threads may only test for null: a submission takes a timestamp while one is open. The test is
// one relaxed load, the only cost of a timeline that is off; a thread that tests while the
// engine opens or closes one sees either answer (a submission that saw none is drawn from the
// file's start: Timeline::Span).
class TimelineHolder {
 public:
  explicit operator bool() const { return open_.load(std::memory_order_relaxed) != nullptr; }
  // The engine thread's (or any thread's once the engine thread has stopped).
  Timeline* operator->() const { return owned_.get(); }
  Timeline* get() const { return owned_.get(); }
  // Replaces the timeline (nullptr: none); the old one is closed (Timeline::Close).
  void reset(std::unique_ptr<Timeline> t = nullptr) {
    open_.store(t.get(), std::memory_order_relaxed);
    owned_ = std::move(t);
  }

 private:
  std::unique_ptr<Timeline> owned_;
  std::atomic<Timeline*> open_{nullptr};  // owned_.get(), for other threads' test
};

// "name" with JSON escapes.
std::string JsonString(const std::string& s);

}  // namespace ringrun::runtime::engine
