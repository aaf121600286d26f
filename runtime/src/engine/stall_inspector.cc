#include "runtime/src/engine/stall_inspector.h"

#include <algorithm>
#include <cstdio>

namespace ringrun::runtime::engine {

int64_t StallInspector::NextCheckUs(const std::vector<PendingView>& pending) const {
  if (!options_.enabled) return -1;
  int64_t next = -1;
  auto consider = [&](int64_t t) { next = next < 0 ? t : std::min(next, t); };
  for (const PendingView& p : pending) {
    // The first warning a warning time after the name was first announced; then one more
    // every warning time while it stays pending (Horovod's inspector warns at every check).
    const int64_t last = LastWarnedUs(p);
    consider((last >= 0 ? last : p.first_us) + options_.warning_us);
    if (options_.shutdown_us > 0) consider(p.first_us + options_.shutdown_us);
  }
  return next;
}

int64_t StallInspector::LastWarnedUs(const PendingView& p) const {
  auto w = warned_.find(*p.name);
  return w != warned_.end() && w->second >= p.first_us ? w->second : -1;
}

int64_t StallInspector::EarliestCheckUs(int64_t oldest_us) const {
  if (!options_.enabled || oldest_us < 0) return -1;
  int64_t wait = options_.warning_us;
  if (options_.shutdown_us > 0) wait = std::min(wait, options_.shutdown_us);
  return oldest_us + wait;
}

std::string StallInspector::Report(const std::vector<PendingView>& pending, int64_t now_us,
                                   int64_t min_us) const {
  if (pending.empty()) return "";
  const int size = static_cast<int>(pending[0].announced.size());
  std::vector<std::vector<std::string>> missing(size);
  for (const PendingView& p : pending) {
    if (now_us - p.first_us < min_us) continue;
    for (int r = 0; r < size; ++r) {
      if (!p.announced[r]) missing[r].push_back(*p.name);
    }
  }
  std::string out;
  for (int r = 0; r < size; ++r) {
    if (missing[r].empty()) continue;
    std::sort(missing[r].begin(), missing[r].end());
    const size_t n = missing[r].size();
    out += "\n  rank " + std::to_string(r) + " has not submitted " + std::to_string(n) +
           (n == 1 ? " tensor: " : " tensors: ");
    for (size_t i = 0; i < std::min(n, options_.names_per_rank); ++i) {
      out += (i ? ", " : "") + missing[r][i];
    }
    if (n > options_.names_per_rank) {
      out += " and " + std::to_string(n - options_.names_per_rank) + " more";
    }
  }
  if (out.empty()) return "";
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%g", static_cast<double>(min_us) / 1e6);
  return std::string("stalled for more than ") + secs +
         " s: tensors submitted by some ranks and not by others:" + out;
}

Status StallInspector::Check(const std::vector<PendingView>& pending, int64_t now_us) {
  if (!options_.enabled) return Status::Ok();
  if (options_.shutdown_us > 0) {
    std::string report = Report(pending, now_us, options_.shutdown_us);
    if (!report.empty()) {
      return Aborted("stall shutdown (RINGRUN_STALL_SHUTDOWN_SECONDS): " + report);
    }
  }
  // Names no longer pending are forgotten: a later stall of the same name is a new one.
  std::map<std::string, int64_t> still;
  bool due = false;
  for (const PendingView& p : pending) {
    const int64_t last = LastWarnedUs(p);
    if (now_us - p.first_us >= options_.warning_us &&
        (last < 0 || now_us - last >= options_.warning_us)) {
      due = true;
    } else if (last >= 0) {
      still.emplace(*p.name, last);
    }
  }
  if (due) {
    // One report over every stalled name, as each check of Horovod's; each name reported
    // now waits a warning time before the next.
    for (const PendingView& p : pending) {
      if (now_us - p.first_us >= options_.warning_us) still[*p.name] = now_us;
    }
  }
  warned_.swap(still);
  if (due && rank_ == 0) {
    std::string report = Report(pending, now_us, options_.warning_us);
    if (!report.empty()) sink_("warning: " + report);
  }
  return Status::Ok();
}

}  // namespace ringrun::runtime::engine
