// The stall inspector: names, for each rank, the tensors it has not submitted while other ranks
// have, once they have waited RINGRUN_STALL_WARNING_SECONDS (and again every such period while
// they wait, as Horovod's), and fails the job after
// RINGRUN_STALL_SHUTDOWN_SECONDS when that is set. It reads the replicated negotiation table,
// so it works the same whether a name travelled in full or as a cache id. It never polls: the
// engine sleeps until NextCheckUs() (only while something is pending).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/src/engine/controller.h"

namespace ringrun::runtime::engine {

struct StallOptions {
  bool enabled = true;
  int64_t warning_us = 60'000'000;
  int64_t shutdown_us = 0;  // 0: never
  size_t names_per_rank = 5;
};

class StallInspector {
 public:
  using Sink = std::function<void(const std::string&)>;
  // `sink` receives warnings (on rank 0 only: every rank sees the same table).
  StallInspector(StallOptions options, int rank, Sink sink)
      : options_(options), rank_(rank), sink_(std::move(sink)) {}

  // When the engine must look again, or -1 when nothing can stall.
  int64_t NextCheckUs(const std::vector<PendingView>& pending) const;
  // The earliest time at which a name pending since oldest_us can need a look (-1: never): a
  // bound that costs nothing to compute, for the steady state, where names wait microseconds.
  int64_t EarliestCheckUs(int64_t oldest_us) const;
  // Warns when a name has stalled for a warning time, or for another warning time since it was
  // last warned about; returns kAborted with the report once the shutdown time has passed for
  // some name.
  Status Check(const std::vector<PendingView>& pending, int64_t now_us);
  // The report over names stalled for at least `min_us` (empty when none).
  std::string Report(const std::vector<PendingView>& pending, int64_t now_us, int64_t min_us) const;

 private:
  const StallOptions options_;
  const int rank_;
  Sink sink_;
  // When this stall of p's name was last warned about, or -1 (not yet, or an earlier stall).
  int64_t LastWarnedUs(const PendingView& p) const;
  std::map<std::string, int64_t> warned_;  // pending names warned about: when, last
};

}  // namespace ringrun::runtime::engine
