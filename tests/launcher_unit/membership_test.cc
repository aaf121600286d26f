// The membership policy (launcher/elastic/membership.h) on a manual clock: start, scale down on
// a failure, scale up on discovery, the blacklist and its cooldown, the reset limit, and the
// bounds min_np and max_np.
#include "launcher/elastic/membership.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <vector>

namespace ringrun::launcher::elastic {
namespace {

using Action = Decision::Action;
using std::chrono::milliseconds;
using std::chrono::seconds;

MembershipOptions Options(int np, int min_np, int max_np) {
  MembershipOptions o;
  o.np = np;
  o.min_np = min_np;
  o.max_np = max_np;
  return o;
}

// "host:local_rank<-previous_rank" for each rank, in rank order ("new" for a new process).
std::vector<std::string> Layout(const Generation& g) {
  std::vector<std::string> out;
  for (const RankSlot& s : g.ranks) {
    out.push_back(s.host + ":" + std::to_string(s.local_rank) + "<-" +
                  (s.previous_rank < 0 ? "new" : std::to_string(s.previous_rank)));
  }
  return out;
}

MembershipPolicy Make(const MembershipOptions& o, const Clock& clock) {
  Result<MembershipPolicy> p = MembershipPolicy::Create(o, clock);
  REQUIRE(p.ok());
  return std::move(p).value();
}

// Discovers `hosts` and forms the first generation on them.
Decision Start(MembershipPolicy& p, const HostSet& hosts) {
  p.OnDiscovery(hosts);
  Decision d = p.Decide();
  REQUIRE(d.action == Action::kForm);
  REQUIRE(d.generation.number == 1);
  return d;
}

// A policy whose first generation is formed on `hosts`.
MembershipPolicy Started(const MembershipOptions& o, const Clock& clock, const HostSet& hosts) {
  MembershipPolicy p = Make(o, clock);
  (void)Start(p, hosts);
  return p;
}

TEST_CASE("membership: the first generation fills hosts in discovery order", "[membership]") {
  ManualClock clock;
  MembershipPolicy p = Make(Options(4, 2, 8), clock);
  Decision d = Start(p, {{"a", 2}, {"b", 3}});
  CHECK(Layout(d.generation) ==
        std::vector<std::string>{"a:0<-new", "a:1<-new", "b:0<-new", "b:1<-new", "b:2<-new"});
  CHECK(p.resets() == 0);
  // Nothing changed: nothing to do.
  CHECK(p.Decide().action == Action::kKeep);
}

TEST_CASE("membership: a host failure scales down, survivors keep their order", "[membership]") {
  ManualClock clock;
  MembershipPolicy p = Started(Options(6, 2, 6), clock, {{"a", 2}, {"b", 2}, {"c", 2}});
  p.OnDiscovery({{"a", 2}, {"b", 2}, {"c", 2}});
  // Rank 2 (on b) failed first; rank 4 (on c) failed as a consequence.
  REQUIRE(p.OnFailure({2, {4}}).ok());
  Decision d = p.Decide();
  REQUIRE(d.action == Action::kForm);
  CHECK(d.generation.number == 2);
  // b is gone; c keeps its survivor (old rank 5) and its failed slot runs a new process.
  CHECK(Layout(d.generation) == std::vector<std::string>{"a:0<-0", "a:1<-1", "c:0<-5", "c:1<-new"});
  CHECK(p.resets() == 1);
}

TEST_CASE("membership: rank 0 of the new generation is the lowest survivor", "[membership]") {
  ManualClock clock;
  MembershipPolicy p = Started(Options(4, 1, 4), clock, {{"a", 2}, {"b", 2}});
  // a's ranks died: rank 1 first, rank 0 as a consequence.
  REQUIRE(p.OnFailure({1, {0}}).ok());
  Decision d = p.Decide();
  REQUIRE(d.action == Action::kForm);
  CHECK(Layout(d.generation) == std::vector<std::string>{"b:0<-2", "b:1<-3"});
}

TEST_CASE("membership: only the first failing host is blacklisted", "[membership]") {
  ManualClock clock;
  MembershipPolicy p = Started(Options(6, 2, 6), clock, {{"a", 2}, {"b", 2}, {"c", 2}});
  // Rank 3 (on b) failed first; ranks 0 (on a) and 4 (on c) followed.
  REQUIRE(p.OnFailure({3, {0, 4}}).ok());
  CHECK(p.Blacklist().size() == 1);
  CHECK(p.Blacklist().count("b") == 1);
  // No cooldown range: for ever.
  CHECK(p.Blacklist().at("b") == Clock::TimePoint::max());
  Decision d = p.Decide();
  REQUIRE(d.action == Action::kForm);
  // a and c run new processes in their failed slots; b is out.
  CHECK(Layout(d.generation) ==
        std::vector<std::string>{"a:0<-1", "a:1<-new", "c:0<-5", "c:1<-new"});
}

TEST_CASE("membership: discovery adding a host scales up, up to max_np", "[membership]") {
  ManualClock clock;
  MembershipPolicy p = Started(Options(4, 2, 7), clock, {{"a", 2}, {"b", 2}});
  p.OnDiscovery({{"a", 2}, {"b", 2}, {"c", 2}});
  Decision d = p.Decide();
  REQUIRE(d.action == Action::kForm);
  CHECK(Layout(d.generation) ==
        std::vector<std::string>{"a:0<-0", "a:1<-1", "b:0<-2", "b:1<-3", "c:0<-new", "c:1<-new"});
  CHECK(p.resets() == 1);
  // Another host: only one slot left below max_np.
  p.OnDiscovery({{"a", 2}, {"b", 2}, {"c", 2}, {"d", 4}});
  d = p.Decide();
  REQUIRE(d.action == Action::kForm);
  CHECK(d.generation.ranks.size() == 7);
  CHECK(Layout(d.generation).back() == "d:0<-new");
  // At max_np a new host changes nothing: no reset.
  p.OnDiscovery({{"a", 2}, {"b", 2}, {"c", 2}, {"d", 4}, {"e", 8}});
  CHECK(p.Decide().action == Action::kKeep);
  CHECK(p.resets() == 2);
}

TEST_CASE("membership: a host that discovery drops or shrinks loses its ranks, unblacklisted",
          "[membership]") {
  ManualClock clock;
  MembershipPolicy p = Started(Options(6, 2, 6), clock, {{"a", 2}, {"b", 2}, {"c", 2}});
  p.OnDiscovery({{"a", 1}, {"c", 2}});
  Decision d = p.Decide();
  REQUIRE(d.action == Action::kForm);
  CHECK(Layout(d.generation) == std::vector<std::string>{"a:0<-0", "c:0<-4", "c:1<-5"});
  CHECK(p.Blacklist().empty());
}

TEST_CASE("membership: never more than max_np ranks", "[membership]") {
  ManualClock clock;
  MembershipPolicy p = Make(Options(2, 1, 3), clock);
  Decision d = Start(p, {{"a", 8}, {"b", 8}});
  CHECK(Layout(d.generation) == std::vector<std::string>{"a:0<-new", "a:1<-new", "a:2<-new"});
}

TEST_CASE("membership: the cooldown grows per blacklisting within the range, then expires",
          "[membership]") {
  ManualClock clock;
  MembershipOptions o = Options(4, 1, 4);
  o.cooldown = std::make_pair(seconds(10), seconds(30));
  o.jitter_seed = 7;
  MembershipPolicy p = Started(o, clock, {{"a", 2}, {"b", 2}});
  p.OnDiscovery({{"a", 2}, {"b", 2}});

  // First blacklisting: [10 s, 12.5 s).
  REQUIRE(p.OnFailure({2, {}}).ok());
  auto cooldown = p.Blacklist().at("b") - clock.Now();
  CHECK(cooldown >= seconds(10));
  CHECK(cooldown < milliseconds(12500));
  REQUIRE(p.Decide().action == Action::kForm);  // generation 2 on a alone
  CHECK(p.resets() == 1);
  clock.Advance(seconds(9));
  CHECK(p.Decide().action == Action::kKeep);
  clock.Advance(milliseconds(3500));
  // b is usable again: it joins, and that is a reset (as a host added).
  Decision d = p.Decide();
  REQUIRE(d.action == Action::kForm);
  CHECK(Layout(d.generation) ==
        std::vector<std::string>{"a:0<-0", "a:1<-1", "b:0<-new", "b:1<-new"});
  CHECK(p.Blacklist().empty());
  CHECK(p.resets() == 2);

  // Second: [20 s, 25 s).
  REQUIRE(p.OnFailure({3, {}}).ok());
  cooldown = p.Blacklist().at("b") - clock.Now();
  CHECK(cooldown >= seconds(20));
  CHECK(cooldown < seconds(25));
  REQUIRE(p.Decide().action == Action::kForm);
  clock.Advance(seconds(25));
  REQUIRE(p.Decide().action == Action::kForm);

  // Third: 40 s and more, clamped to the range's 30 s.
  REQUIRE(p.OnFailure({2, {}}).ok());
  CHECK(p.Blacklist().at("b") - clock.Now() == seconds(30));
}

TEST_CASE("membership: the reset limit ends the job, naming the limit", "[membership]") {
  ManualClock clock;
  MembershipOptions o = Options(4, 1, 4);
  o.reset_limit = 1;
  MembershipPolicy p = Started(o, clock, {{"a", 2}, {"b", 2}});
  p.OnDiscovery({{"a", 2}, {"b", 2}});
  REQUIRE(p.OnFailure({3, {}}).ok());
  REQUIRE(p.Decide().action == Action::kForm);
  CHECK(p.resets() == 1);
  REQUIRE(p.OnFailure({1, {}}).ok());
  Decision d = p.Decide();
  REQUIRE(d.action == Action::kEnd);
  CHECK(d.end.code() == Code::kAborted);
  CHECK(d.end.message() ==
        "reset limit 1 reached (--reset-limit): the job was reset 1 times and needs another");
  // Ended for good.
  CHECK(p.Decide().action == Action::kEnd);
}

TEST_CASE("membership: a scale-up counts as a reset too", "[membership]") {
  ManualClock clock;
  MembershipOptions o = Options(2, 1, 8);
  o.reset_limit = 0;
  MembershipPolicy p = Started(o, clock, {{"a", 2}});
  p.OnDiscovery({{"a", 2}, {"b", 2}});
  Decision d = p.Decide();
  REQUIRE(d.action == Action::kEnd);
  CHECK_THAT(d.end.message(), Catch::StartsWith("reset limit 0 reached"));
}

TEST_CASE("membership: below min_np the policy waits for slots until the elastic timeout",
          "[membership]") {
  ManualClock clock;
  MembershipOptions o = Options(6, 4, 6);
  o.elastic_timeout = seconds(60);
  MembershipPolicy p = Started(o, clock, {{"a", 2}, {"b", 2}, {"c", 2}});
  p.OnDiscovery({{"a", 2}, {"b", 2}, {"c", 2}});
  REQUIRE(p.OnFailure({0, {}}).ok());
  REQUIRE(p.Decide().action == Action::kForm);  // 4 left: min_np holds

  REQUIRE(p.OnFailure({0, {}}).ok());  // b's rank 0 of generation 2: 2 left
  const Clock::TimePoint failed_at = clock.Now();
  Decision d = p.Decide();
  REQUIRE(d.action == Action::kWait);
  CHECK(d.wait_until == failed_at + seconds(60));
  CHECK(d.missing == "2 of --min-np 4 slots");
  clock.Advance(seconds(30));
  d = p.Decide();
  REQUIRE(d.action == Action::kWait);
  CHECK(d.wait_until == failed_at + seconds(60));  // the wait's start does not move
  // A new host comes in time.
  p.OnDiscovery({{"a", 2}, {"b", 2}, {"c", 2}, {"d", 2}});
  d = p.Decide();
  REQUIRE(d.action == Action::kForm);
  CHECK(Layout(d.generation) ==
        std::vector<std::string>{"c:0<-2", "c:1<-3", "d:0<-new", "d:1<-new"});

  // And one that does not come: the job ends at the timeout.
  REQUIRE(p.OnFailure({3, {}}).ok());
  REQUIRE(p.Decide().action == Action::kWait);
  clock.Advance(seconds(60));
  d = p.Decide();
  REQUIRE(d.action == Action::kEnd);
  CHECK(d.end.code() == Code::kTimeout);
  CHECK(d.end.message() == "elastic timeout (60 s) passed with 2 slots, fewer than --min-np 4");
}

TEST_CASE("membership: a failure that leaves no survivor ends the job", "[membership]") {
  ManualClock clock;
  MembershipPolicy p = Started(Options(2, 1, 4), clock, {{"a", 1}, {"b", 1}});
  p.OnDiscovery({{"a", 1}, {"b", 1}, {"c", 2}});
  REQUIRE(p.OnFailure({0, {1}}).ok());
  Decision d = p.Decide();
  REQUIRE(d.action == Action::kEnd);
  CHECK(d.end.message() == "no rank of generation 1 survives: no rank holds the committed state");
}

TEST_CASE("membership: the start waits for np, then takes min_np after the start timeout",
          "[membership]") {
  ManualClock clock;
  MembershipOptions o = Options(4, 2, 8);
  o.start_timeout = seconds(30);
  o.elastic_timeout = seconds(120);
  const Clock::TimePoint created = clock.Now();
  MembershipPolicy p = Make(o, clock);
  Decision d = p.Decide();  // nothing discovered yet
  REQUIRE(d.action == Action::kWait);
  CHECK(d.wait_until == created + seconds(120));
  CHECK(d.missing == "0 of 4 slots to start");
  p.OnDiscovery({{"a", 2}});
  d = p.Decide();
  REQUIRE(d.action == Action::kWait);
  CHECK(d.wait_until == created + seconds(30));  // min_np is there: the start timeout matters
  CHECK(d.missing == "2 of 4 slots to start");
  clock.Advance(seconds(30));
  d = p.Decide();
  REQUIRE(d.action == Action::kForm);
  CHECK(Layout(d.generation) == std::vector<std::string>{"a:0<-new", "a:1<-new"});
}

TEST_CASE("membership: fewer than min_np at the elastic timeout ends the start", "[membership]") {
  ManualClock clock;
  MembershipOptions o = Options(4, 2, 8);
  o.start_timeout = seconds(30);
  o.elastic_timeout = seconds(120);
  MembershipPolicy p = Make(o, clock);
  p.OnDiscovery({{"a", 1}});
  clock.Advance(seconds(119));
  REQUIRE(p.Decide().action == Action::kWait);
  clock.Advance(seconds(1));
  Decision d = p.Decide();
  REQUIRE(d.action == Action::kEnd);
  CHECK(d.end.code() == Code::kTimeout);
  CHECK(d.end.message() ==
        "elastic timeout (120 s) passed with 1 usable slots, fewer than --min-np 2: the job "
        "cannot start");
}

TEST_CASE("membership: options and failures are checked", "[membership]") {
  ManualClock clock;
  CHECK_FALSE(MembershipPolicy::Create(Options(2, 3, 4), clock).ok());
  CHECK_FALSE(MembershipPolicy::Create(Options(4, 2, 3), clock).ok());
  CHECK_FALSE(MembershipPolicy::Create(Options(1, 0, 1), clock).ok());
  MembershipOptions o = Options(1, 1, 1);
  o.cooldown = std::make_pair(seconds(10), seconds(5));
  CHECK_FALSE(MembershipPolicy::Create(o, clock).ok());

  MembershipPolicy p = Make(Options(1, 1, 1), clock);
  CHECK_FALSE(p.OnFailure({0, {}}).ok());  // no generation yet
  p.OnDiscovery({{"a", 1}});
  REQUIRE(p.Decide().action == Action::kForm);
  Status s = p.OnFailure({1, {}});
  CHECK(s.message() == "rank 1 is not in generation 1 (size 1)");
}

TEST_CASE("membership: without refill a later generation is survivors only", "[membership]") {
  ManualClock clock;
  MembershipOptions o = Options(6, 2, 6);
  o.refill = false;
  MembershipPolicy p = Started(o, clock, {{"a", 2}, {"b", 2}, {"c", 2}});
  REQUIRE(p.OnFailure({3, {0, 4}}).ok());
  Decision d = p.Decide();
  REQUIRE(d.action == Action::kForm);
  CHECK(Layout(d.generation) == std::vector<std::string>{"a:0<-1", "c:0<-5"});
  CHECK(p.resets() == 1);
}

TEST_CASE("membership: ranks that leave make a generation but no reset", "[membership]") {
  ManualClock clock;
  MembershipOptions o = Options(4, 2, 4);
  o.refill = false;
  o.reset_limit = 0;
  MembershipPolicy p = Started(o, clock, {{"a", 2}, {"b", 2}});
  REQUIRE(p.OnRankGone(3, false).ok());
  Decision d = p.Decide();
  REQUIRE(d.action == Action::kForm);
  CHECK(Layout(d.generation) == std::vector<std::string>{"a:0<-0", "a:1<-1", "b:0<-2"});
  CHECK(p.resets() == 0);
  CHECK(p.Blacklist().empty());
  // A consequence of a failure is a reset, without blacklisting: here beyond the limit.
  REQUIRE(p.OnRankGone(0, true).ok());
  d = p.Decide();
  REQUIRE(d.action == Action::kEnd);
  CHECK(d.end.message() ==
        "reset limit 0 reached (--reset-limit): the job was reset 0 times and needs another");
  CHECK(p.Blacklist().empty());
  CHECK_FALSE(p.OnRankGone(7, false).ok());
}

}  // namespace
}  // namespace ringrun::launcher::elastic
