// The timeline: a Chrome trace (JSON array format) of what the engine did with each tensor,
// which Perfetto and chrome://tracing load. Every event carries its rank as pid and is one line.
// Under ringrun's launcher the events go, already serialized, down a pipe to the rank's agent,
// which forwards them to the launcher, which writes the one file named (OpenPipe; docs/engine.md).
// Without it each rank writes its own file (Open). Either way no rank ever waits for another's
// timeline, nor for the launcher: the pipe is written without blocking, and what it cannot take
// waits in a bounded buffer (kMaxTimelinePendingBytes); events beyond that are dropped and
// counted, with a warning on stderr. A file is flushed after every negotiation round and is
// valid JSON up to the missing closing bracket when the process is killed, which the trace
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
#include "ringrun/common/fd.h"
#include "ringrun/common/status.h"

namespace ringrun::runtime::engine {

// The engine's timestamps (the timeline's, the stall inspector's, a submission's): microseconds
// on `clock`.
inline int64_t NowMicros(const Clock& clock) {
  return std::chrono::duration_cast<std::chrono::microseconds>(clock.Now().time_since_epoch())
      .count();
}

// What the launcher's pipe may hold back in a rank before events are dropped.
inline constexpr size_t kMaxTimelinePendingBytes = 8 << 20;
// How long Close waits for the pipe to take what is still held back.
inline constexpr int kTimelineCloseDrainMs = 2000;

class Timeline {
 public:
  // Opens `path` for writing (truncating it). rank is the trace's pid.
  static Result<std::unique_ptr<Timeline>> Open(const std::string& path, int rank,
                                                const Clock* clock);
  // Writes the events, one per line ("{...},\n"), to a non-blocking copy of the pipe `fd`
  // (which stays the caller's), for the launcher's file named `name` (path()), which has the
  // opening '[' and the closing ']'. Errors: `fd` is not an open pipe.
  static Result<std::unique_ptr<Timeline>> OpenPipe(int fd, const std::string& name, int rank,
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
  // Writes out what is buffered: the file's buffer, or what the pipe takes without blocking.
  void Flush();
  // Ends the file (strict JSON) and closes it; later events are dropped. For the pipe: what
  // it takes within kTimelineCloseDrainMs, then a warning that counts what was dropped. The
  // destructor does it if nobody did.
  void Close();
  // When the file was opened: its ts 0. Events that began earlier are drawn from here.
  int64_t origin_us() const { return origin_us_; }
  const std::string& path() const { return path_; }
  // The pipe's events dropped so far (0 for a file).
  uint64_t dropped() const { return dropped_; }

 private:
  Timeline(std::FILE* f, UniqueFd pipe, std::string path, int rank, const Clock* clock);
  int Row(const std::string& tensor);
  // One event, with its trailing ",\n"; printf-style.
  void Put(const char* format, ...) __attribute__((format(printf, 2, 3)));
  static int64_t WallMicros();
  // Writes pending_ to the pipe until it would block; false once the pipe is broken.
  bool Drain();

  bool open_ = true;
  std::FILE* f_;          // the file, or null for the pipe
  UniqueFd pipe_;         // the pipe, or invalid for the file
  std::string pending_;   // the pipe's events not written yet
  uint64_t dropped_ = 0;  // the pipe's events dropped: pending_ was full or the pipe broke
  const std::string path_;
  const int rank_;
  const int64_t origin_us_;
  const int64_t ts_zero_us_;  // the clock's time written as ts 0
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
