#include "launcher/elastic/membership.h"

#include <algorithm>
#include <cmath>

namespace ringrun::launcher::elastic {
namespace {

constexpr double kCooldownJitter = 0.25;  // the cooldown's spread above its base
constexpr int kMaxCooldownDoublings = 30;

std::string Seconds(std::chrono::milliseconds d) {
  const auto ms = d.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

}  // namespace

Result<MembershipPolicy> MembershipPolicy::Create(const MembershipOptions& o, const Clock& clock) {
  if (o.min_np < 1)
    return InvalidArgument("--min-np must be at least 1, got " + std::to_string(o.min_np));
  if (o.np < o.min_np) {
    return InvalidArgument("-np " + std::to_string(o.np) + " is less than --min-np " +
                           std::to_string(o.min_np));
  }
  if (o.max_np < o.np) {
    return InvalidArgument("--max-np " + std::to_string(o.max_np) + " is less than -np " +
                           std::to_string(o.np));
  }
  if (o.reset_limit && *o.reset_limit < 0) {
    return InvalidArgument("--reset-limit must not be negative, got " +
                           std::to_string(*o.reset_limit));
  }
  if (o.cooldown && (o.cooldown->first.count() < 0 || o.cooldown->second < o.cooldown->first)) {
    return InvalidArgument("--blacklist-cooldown-range " +
                           std::to_string(o.cooldown->first.count()) + " " +
                           std::to_string(o.cooldown->second.count()) + ": want 0 <= MIN <= MAX");
  }
  return MembershipPolicy(o, clock);
}

MembershipPolicy::MembershipPolicy(const MembershipOptions& options, const Clock& clock)
    : options_(options), clock_(clock), created_(clock.Now()), jitter_(options.jitter_seed) {}

void MembershipPolicy::OnDiscovery(const HostSet& hosts) {
  if (!(hosts == discovered_)) discovery_changed_ = true;
  discovered_ = hosts;
}

void MembershipPolicy::OnBroken() {
  if (current_) broken_ = true;
}

Status MembershipPolicy::OnRankGone(int rank, bool failed) {
  if (!current_) return InvalidArgument("a rank gone before the first generation");
  if (rank < 0 || rank >= static_cast<int>(current_->ranks.size())) {
    return InvalidArgument("rank " + std::to_string(rank) + " is not in generation " +
                           std::to_string(current_->number));
  }
  dead_ranks_.insert(rank);
  if (failed) broken_ = true;
  return Status::Ok();
}

Status MembershipPolicy::OnFailure(const Failure& failure) {
  if (!current_) return InvalidArgument("a failure reported before the first generation");
  const int size = static_cast<int>(current_->ranks.size());
  auto check = [&](int rank) -> Status {
    if (rank < 0 || rank >= size) {
      return InvalidArgument("rank " + std::to_string(rank) + " is not in generation " +
                             std::to_string(current_->number) + " (size " + std::to_string(size) +
                             ")");
    }
    return Status::Ok();
  };
  RINGRUN_RETURN_IF_ERROR(check(failure.root_rank));
  for (int r : failure.consequence_ranks) RINGRUN_RETURN_IF_ERROR(check(r));
  const std::string& host = current_->ranks[failure.root_rank].host;
  AddToBlacklist(host);
  // The root's host is blacklisted: every rank there goes with it.
  for (int r = 0; r < size; ++r) {
    if (current_->ranks[r].host == host) dead_ranks_.insert(r);
  }
  dead_ranks_.insert(failure.consequence_ranks.begin(), failure.consequence_ranks.end());
  broken_ = true;
  return Status::Ok();
}

void MembershipPolicy::AddToBlacklist(const std::string& host) {
  BlacklistEntry& e = blacklist_[host];
  ++e.count;
  if (!options_.cooldown) {
    e.until = Clock::TimePoint::max();
    return;
  }
  const auto [min, max] = *options_.cooldown;
  const int doublings = std::min(e.count - 1, kMaxCooldownDoublings);
  const double j = std::uniform_real_distribution<double>(0.0, kCooldownJitter)(jitter_);
  const double seconds =
      std::min(static_cast<double>(max.count()),
               static_cast<double>(min.count()) * std::ldexp(1.0, doublings) * (1.0 + j));
  e.until = clock_.Now() + std::chrono::duration_cast<Clock::TimePoint::duration>(
                               std::chrono::duration<double>(seconds));
}

void MembershipPolicy::ExpireCooldowns() {
  const Clock::TimePoint now = clock_.Now();
  for (auto& [host, e] : blacklist_) {
    if (!e.until || *e.until == Clock::TimePoint::max() || now < *e.until) continue;
    e.until.reset();
    // A listed host usable again changes the next assignment, as a host added: a reset.
    for (const Host& h : discovered_) discovery_changed_ = discovery_changed_ || h.name == host;
  }
}

std::map<std::string, Clock::TimePoint> MembershipPolicy::Blacklist() const {
  std::map<std::string, Clock::TimePoint> out;
  for (const auto& [host, e] : blacklist_) {
    if (e.until) out.emplace(host, *e.until);
  }
  return out;
}

int MembershipPolicy::UsableSlots() const {
  int slots = 0;
  for (const Host& h : discovered_) {
    auto it = blacklist_.find(h.name);
    if (it == blacklist_.end() || !it->second.until) slots += h.slots;
  }
  return slots;
}

Generation MembershipPolicy::Assign() const {
  std::map<std::string, int> usable;  // host -> slots
  for (const Host& h : discovered_) {
    auto it = blacklist_.find(h.name);
    if (it == blacklist_.end() || !it->second.until) usable.emplace(h.name, h.slots);
  }
  // Survivors per host, in rank order, as many as the host still has slots.
  std::map<std::string, std::vector<int>> survivors;
  std::vector<std::string> order;  // hosts with survivors, by their lowest surviving rank
  std::vector<std::string> previous_hosts;
  int kept = 0;
  if (current_) {
    for (int r = 0; r < static_cast<int>(current_->ranks.size()); ++r) {
      const std::string& host = current_->ranks[r].host;
      if (std::find(previous_hosts.begin(), previous_hosts.end(), host) == previous_hosts.end()) {
        previous_hosts.push_back(host);
      }
      auto u = usable.find(host);
      if (dead_ranks_.count(r) || u == usable.end()) continue;
      std::vector<int>& on_host = survivors[host];
      if (static_cast<int>(on_host.size()) >= u->second) continue;  // the host shrank
      if (on_host.empty()) order.push_back(host);
      on_host.push_back(r);
      ++kept;
    }
  }
  auto listed = [&](const std::string& h) {
    return std::find(order.begin(), order.end(), h) != order.end();
  };
  for (const std::string& h : previous_hosts) {
    if (usable.count(h) && !listed(h)) order.push_back(h);
  }
  for (const Host& h : discovered_) {
    if (usable.count(h.name) && !listed(h.name)) order.push_back(h.name);
  }
  // Survivors always stay (there are at most max_np); new slots fill what max_np leaves.
  int new_budget = std::max(0, options_.max_np - kept);
  if (current_ && !options_.refill) new_budget = 0;
  Generation next;
  next.number = current_ ? current_->number + 1 : 1;
  for (const std::string& host : order) {
    int local = 0;
    auto s = survivors.find(host);
    if (s != survivors.end()) {
      for (int r : s->second) next.ranks.push_back(RankSlot{host, local++, r});
    }
    for (; local < usable[host] && new_budget > 0; --new_budget) {
      next.ranks.push_back(RankSlot{host, local++, -1});
    }
  }
  return next;
}

Decision MembershipPolicy::End(Status status) {
  ended_ = status;
  Decision d;
  d.action = Decision::Action::kEnd;
  d.end = std::move(status);
  return d;
}

Decision MembershipPolicy::Decide() {
  if (ended_) return End(*ended_);
  ExpireCooldowns();
  const Clock::TimePoint now = clock_.Now();
  Decision d;
  Generation next = Assign();
  const int size = static_cast<int>(next.ranks.size());

  if (!current_) {
    const Clock::TimePoint start_by = created_ + options_.start_timeout;
    const Clock::TimePoint end_by = created_ + options_.elastic_timeout;
    const int need = now < start_by ? options_.np : options_.min_np;
    if (size >= need) {
      discovery_changed_ = false;
      current_ = std::move(next);
      d.action = Decision::Action::kForm;
      d.generation = *current_;
      return d;
    }
    if (now >= end_by) {
      return End(Timeout("elastic timeout (" + Seconds(options_.elastic_timeout) +
                         ") passed with " + std::to_string(UsableSlots()) +
                         " usable slots, fewer than --min-np " + std::to_string(options_.min_np) +
                         ": the job cannot start"));
    }
    d.action = Decision::Action::kWait;
    d.wait_until = now < start_by && size >= options_.min_np ? std::min(start_by, end_by) : end_by;
    d.missing = std::to_string(size) + " of " + std::to_string(need) + " slots to start";
    return d;
  }

  bool same = !broken_ && size == static_cast<int>(current_->ranks.size());
  for (int r = 0; same && r < size; ++r) same = next.ranks[r].previous_rank == r;
  if (same) {
    short_since_.reset();
    return d;  // kKeep
  }
  // Ranks that only left (exit 0) make no reset.
  const bool counts = broken_ || discovery_changed_;
  if (counts && options_.reset_limit && resets_ >= *options_.reset_limit) {
    return End(Aborted("reset limit " + std::to_string(*options_.reset_limit) +
                       " reached (--reset-limit): the job was reset " + std::to_string(resets_) +
                       " times and needs another"));
  }
  const bool any_survivor = std::any_of(next.ranks.begin(), next.ranks.end(),
                                        [](const RankSlot& s) { return s.previous_rank >= 0; });
  if (!any_survivor) {
    return End(Aborted("no rank of generation " + std::to_string(current_->number) +
                       " survives: no rank holds the committed state"));
  }
  if (size < options_.min_np) {
    if (!short_since_) short_since_ = now;
    const Clock::TimePoint end_by = *short_since_ + options_.elastic_timeout;
    if (now >= end_by) {
      return End(Timeout("elastic timeout (" + Seconds(options_.elastic_timeout) +
                         ") passed with " + std::to_string(size) + " slots, fewer than --min-np " +
                         std::to_string(options_.min_np)));
    }
    d.action = Decision::Action::kWait;
    d.wait_until = end_by;
    d.missing = std::to_string(size) + " of --min-np " + std::to_string(options_.min_np) + " slots";
    return d;
  }
  if (counts) ++resets_;
  current_ = std::move(next);
  dead_ranks_.clear();
  broken_ = false;
  discovery_changed_ = false;
  short_since_.reset();
  d.action = Decision::Action::kForm;
  d.generation = *current_;
  return d;
}

}  // namespace ringrun::launcher::elastic
