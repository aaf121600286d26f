// Membership of an elastic job: which hosts and ranks form each generation. A pure policy:
// events in (discovery results, rank failures), decisions out; it starts and ends nothing, and
// reads time only through the Clock it is given, so that tests drive it by hand.
//
// The launcher's elastic jobs on a fixed host set use it (launcher/job/job.cc), with refill
// off: it starts no process in a running job.
//
// The rules:
//   - Hosts. The usable hosts are the last discovery result less the blacklisted hosts. A host
//     whose ranks failed first (the root cause of a failure) is blacklisted; hosts whose ranks
//     failed afterwards, as a consequence (their peers went away under them), are not: their
//     slots are used again. The caller tells the two apart (OnFailure).
//   - Cooldown. Without a cooldown range a blacklisted host stays blacklisted. With [MIN, MAX]
//     seconds, its n-th blacklisting (n = 1, 2, ...) lasts min(MAX, MIN * 2^(n-1) * (1 + j))
//     seconds, j uniform in [0, 0.25) (the jitter spreads hosts that failed together): the first
//     in [MIN, 1.25 MIN), the second in [2 MIN, 2.5 MIN), ..., never more than MAX. After it the
//     host is usable again if discovery still lists it; its count n is kept.
//   - Ranks. A generation's ranks are grouped by host (contiguous ranks, local ranks from 0).
//     Survivors (ranks of the previous generation whose process lives on and whose host is
//     still usable) keep their relative order; the lowest surviving rank becomes rank 0, the
//     rank that holds the last commit. Hosts with survivors come first, ordered by their lowest
//     surviving rank, each host's survivors before its new slots; then hosts without survivors,
//     in the previous generation's order, then new hosts in discovery order. Never more than
//     max_np ranks: slots are filled in that order until max_np.
//   - A host that discovery no longer lists, or lists with fewer slots, loses those ranks (its
//     highest previous ranks first); that is a change, not a failure: no blacklisting.
//   - Start. The first generation waits for np slots until start_timeout, then for min_np
//     slots until elastic_timeout (both from the policy's construction); it takes every usable
//     slot up to max_np. At elastic_timeout with fewer than min_np slots, the job ends.
//   - Changes. A failure, or a discovery result that changes the next assignment (a host added
//     or un-blacklisted while below max_np, a host removed or shrunk), needs a new generation:
//     a reset. When resets reach reset_limit, the next needed reset ends the job instead, naming
//     the limit. A discovery result that changes nothing (a new host while at max_np) is no
//     reset.
//   - Too few. A reset with fewer than min_np slots among survivors and usable hosts waits for
//     discovery, until elastic_timeout after the reset became needed; then the job ends. A
//     failure that leaves no survivor ends the job: no rank holds the committed state.
//
// Not thread-safe: one owner (the launcher's job loop) calls it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "launcher/elastic/discovery.h"
#include "ringrun/common/clock.h"
#include "ringrun/common/defaults.h"
#include "ringrun/common/status.h"

namespace ringrun::launcher::elastic {

struct MembershipOptions {
  int np = 1;                      // -np: slots the first generation waits for until start_timeout
  int min_np = 1;                  // --min-np: never fewer ranks
  int max_np = 1;                  // --max-np: never more ranks
  std::optional<int> reset_limit;  // --reset-limit; none: unlimited
  // --blacklist-cooldown-range MIN MAX; none: a blacklisted host stays blacklisted.
  std::optional<std::pair<std::chrono::seconds, std::chrono::seconds>> cooldown;
  std::chrono::milliseconds start_timeout{std::chrono::seconds(kDefaultStartTimeoutS)};
  std::chrono::milliseconds elastic_timeout{std::chrono::seconds(kElasticTimeoutS)};
  uint64_t jitter_seed = 0;  // the cooldown jitter's generator
  // Whether a generation after the first may have new processes (RankSlot::previous_rank -1) in
  // free slots. false: every later generation is made of survivors only (a launcher that starts
  // no process in a running job).
  bool refill = true;
};

// One rank of a generation (its index in Generation::ranks is its rank).
struct RankSlot {
  std::string host;
  int local_rank = 0;
  int previous_rank = -1;  // its rank in the previous generation; -1: a new process
};

struct Generation {
  int number = 0;  // 1 for the first
  std::vector<RankSlot> ranks;
};

struct Decision {
  enum class Action {
    kKeep,  // nothing to do: the current generation goes on (or there is none to make yet)
    kWait,  // a generation is needed but too few slots: decide again after the next discovery
    kForm,  // form `generation` now
    kEnd,   // end the job with `end`
  };
  Action action = Action::kKeep;
  Generation generation;  // kForm
  // kWait: decide again after the next discovery, and at wait_until at the latest (a deadline
  // falls there: the start timeout, or the elastic timeout that ends the job unless slots
  // come); `missing` says what lacks.
  Clock::TimePoint wait_until{};
  std::string missing;
  Status end;  // kEnd
};

// A failure of the current generation's ranks.
struct Failure {
  int root_rank = -1;                  // the rank that failed first: its host is blacklisted
  std::vector<int> consequence_ranks;  // ranks that failed after it (hosts not blacklisted)
};

class MembershipPolicy {
 public:
  // `clock` outlives the policy. Options are checked: 1 <= min_np <= np <= max_np, MIN <= MAX.
  static Result<MembershipPolicy> Create(const MembershipOptions& options, const Clock& clock);

  // The latest discovery result: the hosts available now.
  void OnDiscovery(const HostSet& hosts);
  // The current generation's ranks failed. Every call blacklists its root's host: report the
  // generation's first failure once, and what failed after it, within the same generation, as
  // consequences. Errors: no current generation, a rank not in it.
  Status OnFailure(const Failure& failure);
  // A rank of the current generation is gone without blame on its host: `failed` false, it
  // exited 0 (left the job); true, it failed as a consequence of a failure already reported
  // (OnFailure) to an earlier generation. Either needs a new generation; one that is needed
  // only because ranks left is not counted as a reset (nor limited by reset_limit). Errors: no
  // current generation, a rank not in it.
  Status OnRankGone(int rank, bool failed);
  // The current generation broke with no rank lost (a collective failed on a rank stopped past
  // the collective timeout, or on a link that dropped and came back): the next generation has
  // the same ranks, and it counts as a reset. Nobody is blacklisted.
  void OnBroken();

  // What to do now. A kForm decision is taken as done: the generation it names becomes the
  // current one (failures to start it come back through OnFailure). After kEnd every call
  // returns the same kEnd.
  Decision Decide();

  int resets() const { return resets_; }
  const std::optional<Generation>& current() const { return current_; }
  // Blacklisted hosts and the end of their cooldown (Clock::TimePoint::max(): forever).
  std::map<std::string, Clock::TimePoint> Blacklist() const;

 private:
  MembershipPolicy(const MembershipOptions& options, const Clock& clock);
  void ExpireCooldowns();
  void AddToBlacklist(const std::string& host);
  Generation Assign() const;  // the next assignment from survivors and usable hosts
  int UsableSlots() const;
  Decision End(Status status);

  MembershipOptions options_;
  const Clock& clock_;
  Clock::TimePoint created_;
  std::mt19937_64 jitter_;
  HostSet discovered_;
  struct BlacklistEntry {
    int count = 0;                          // blacklistings so far
    std::optional<Clock::TimePoint> until;  // set while blacklisted; max(): for ever
  };
  std::map<std::string, BlacklistEntry> blacklist_;
  std::optional<Generation> current_;
  std::set<int> dead_ranks_;                     // of current_: processes gone
  bool broken_ = false;                          // current_ failed: a reset is needed
  bool discovery_changed_ = false;               // since current_ was formed
  std::optional<Clock::TimePoint> short_since_;  // when a needed generation began to wait
  int resets_ = 0;
  std::optional<Status> ended_;
};

}  // namespace ringrun::launcher::elastic
