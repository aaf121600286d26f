// The job's timeline (--timeline-filename FILE, or RINGRUN_TIMELINE / HOROVOD_TIMELINE naming a
// file): the launcher writes FILE, holding every rank's events. Each rank's engine writes its
// Chrome-trace events, one JSON object per line and each with its rank as pid, into a pipe from
// its agent (RegisterReply.timeline), which sends the lines up as Output on the TIMELINE stream;
// Append puts them in the file as they come, so no rank waits for another and the engine's
// synchronisation is the one it has without a timeline (docs/engine.md, "Timeline").
// Main thread only.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ringrun/common/status.h"

namespace ringrun::launcher::job {

class TimelineFile {
 public:
  // The file the ranks' environment names: `exports` (-x) over `launcher_env` ("NAME=VALUE"),
  // RINGRUN_TIMELINE over HOROVOD_TIMELINE, as libringrun reads them; relative names are the
  // ranks' working directory's (`cwd`). "" for none, or DYNAMIC (the program's per-rank files).
  static std::string Named(const std::vector<std::string>& launcher_env,
                           const std::vector<std::pair<std::string, std::string>>& exports,
                           const std::string& cwd);
  // Creates (truncates) `path` and writes the array's '['. Errors name the path and errno.
  static Result<std::unique_ptr<TimelineFile>> Open(const std::string& path);
  // Ends the array (strict JSON) and closes the file. A launcher killed before leaves it
  // without its ']', which the trace viewers accept.
  ~TimelineFile();
  TimelineFile(const TimelineFile&) = delete;
  TimelineFile& operator=(const TimelineFile&) = delete;

  // Appends the whole lines of `data`, a rank's events; a last piece without its '\n' (the
  // rank died in the middle of writing it) is dropped, so that the file stays JSON.
  void Append(std::string_view data);
  const std::string& path() const { return path_; }

 private:
  TimelineFile(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}

  std::FILE* f_;
  const std::string path_;
};

}  // namespace ringrun::launcher::job
