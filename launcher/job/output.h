// Rank output on the launcher: tagging ("[3]<stdout>:line", horovodrun's format), optional
// timestamps, per-rank files (DIR/rank.NN/stdout|stderr), and the stderr tail kept for
// failure messages. Used from the job's main thread only: not thread-safe.
#pragma once

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>

#include "ringrun/common/line_tail.h"
#include "ringrun/common/status.h"

namespace ringrun::launcher::job {

// "rank.N" with N zero-padded to the digits of the last rank, as horovodrun's gloo_run names
// them, so that they sort: rank.07 and rank.10 in a job of 11 ranks; rank.0 alone.
std::string RankDirName(int rank, int num_ranks);

class OutputRouter {
 public:
  struct Config {
    bool echo_to_console = true;
    bool prefix_timestamp = false;
    std::string output_dir;  // empty: no files
    bool append = false;     // add to the files (a restarted job's); else truncate them
    size_t tail_lines = 10;
    FILE* out = stdout;  // where rank stdout goes
    FILE* err = stderr;  // where rank stderr goes
    std::function<void(int, bool, std::string_view)> on_line;
  };
  explicit OutputRouter(Config config);
  ~OutputRouter();
  OutputRouter(const OutputRouter&) = delete;
  OutputRouter& operator=(const OutputRouter&) = delete;

  // Creates DIR/RankDirName/ for every rank; errors name the path. A rank past num_ranks (a new
  // worker of an elastic job) gets its folder at its first line, named for its id; a failure
  // there is said once on stderr and its lines go to the console only.
  Status Open(int num_ranks);
  // `data`: whole lines each ending in '\n', or (final) a partial last line without one.
  void Write(int rank, bool is_stderr, std::string_view data);
  // The rank's last stderr lines, oldest first, joined by '\n' (LineTail::Text).
  std::string StderrTail(int rank) const;
  void Flush();

 private:
  void EmitLine(int rank, bool is_stderr, std::string_view line);
  Status OpenFiles(int rank);

  Config config_;
  std::map<int, LineTail> tails_;  // stderr, by rank
  struct Files {
    FILE* out = nullptr;
    FILE* err = nullptr;
  };
  std::map<int, Files> files_;
  int num_ranks_ = 0;       // Open's
  std::set<int> unopened_;  // ranks whose files could not be opened
};

}  // namespace ringrun::launcher::job
