// The timeline: a Chrome trace (JSON array format) of what the engine did with each tensor,
// which Perfetto and chrome://tracing load. Each rank writes its own file (see docs/engine.md:
// no rank ever waits for another's timeline, and the trace format needs no merging step since
// every event carries its rank as pid). The file is flushed after every negotiation round and
// is valid JSON up to the missing closing bracket when the process is killed, which the trace
// viewers accept. Off (a null Timeline*) it costs one pointer test per event site.
#pragma once

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
  void Flush();
  // Ends the file (strict JSON) and closes it; later events are dropped. The destructor does
  // it if nobody did.
  void Close();

 private:
  Timeline(std::FILE* f, int rank, const Clock* clock);
  int Row(const std::string& tensor);

  std::FILE* f_;
  const int rank_;
  const int64_t origin_us_;
  std::unordered_map<std::string, int> rows_;
};

// "name" with JSON escapes.
std::string JsonString(const std::string& s);

}  // namespace ringrun::runtime::engine
