// AgentRegistry: agents (threads here) register, wait for every host, and get their own ranks.
#include "launcher/service/agent_registry.h"

#include <catch2/catch.hpp>
#include <thread>

namespace ringrun::launcher {
namespace {

using std::chrono::milliseconds;

// One rank per host, its argv naming the host and the address rank 0's host registered from.
std::map<int, std::vector<v1::RankSpec>> Build(
    const std::map<int, service::Registration>& registered) {
  std::map<int, std::vector<v1::RankSpec>> specs;
  for (const auto& [host, reg] : registered) {
    v1::RankSpec spec;
    spec.add_argv("host" + std::to_string(host) + "@" + registered.at(0).peer_address);
    specs[host].push_back(spec);
  }
  return specs;
}

service::Registration From(const std::string& address) {
  service::Registration r;
  r.peer_address = address;
  return r;
}

TEST_CASE("registry: every agent waits for the last, then gets its own ranks", "[registry]") {
  service::AgentRegistry registry({0, 2}, SteadyClock().Now() + std::chrono::seconds(5), Build);
  std::vector<v1::RankSpec> ranks2;
  bool late_added = false, late_got_ranks = false;  // checked after join: Catch2's assertions
  std::thread late([&] {                            // are not thread-safe
    late_added = registry.Add(2, From("10.0.0.3")).ok();
    late_got_ranks = late_added && registry.WaitForRanks(2, &ranks2).ok();
  });
  std::this_thread::sleep_for(milliseconds(20));  // host 2 usually waits; either order works
  REQUIRE(registry.Add(0, From("10.0.0.1")).ok());
  std::vector<v1::RankSpec> ranks0;
  REQUIRE(registry.WaitForRanks(0, &ranks0).ok());
  late.join();
  REQUIRE(late_added);
  REQUIRE(late_got_ranks);
  REQUIRE(ranks0.size() == 1);
  CHECK(ranks0[0].argv(0) == "host0@10.0.0.1");
  REQUIRE(ranks2.size() == 1);
  CHECK(ranks2[0].argv(0) == "host2@10.0.0.1");
  CHECK(registry.Close() == std::vector<int>{0, 2});
}

TEST_CASE("registry: a late host registers on its own, never waited for", "[registry]") {
  service::AgentRegistry registry({0}, SteadyClock().Now() + std::chrono::seconds(5), Build);
  CHECK(registry.Add(3, From("10.0.0.4")).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  registry.AddLateHost(3);
  CHECK(registry.IsLate(3));
  CHECK_FALSE(registry.IsLate(0));
  // Before the first hosts: it does not complete them.
  REQUIRE(registry.Add(3, From("10.0.0.4")).ok());
  CHECK(registry.Add(3, From("10.0.0.4")).error_code() == grpc::StatusCode::ALREADY_EXISTS);
  REQUIRE(registry.Add(0, From("10.0.0.1")).ok());
  std::vector<v1::RankSpec> ranks0;
  REQUIRE(registry.WaitForRanks(0, &ranks0).ok());
  CHECK(ranks0.size() == 1);
  const auto all = registry.Registrations();
  REQUIRE(all.size() == 2);
  CHECK(all.at(3).peer_address == "10.0.0.4");
  registry.AddLateHost(4);
  CHECK(registry.Close() == std::vector<int>{0, 3});
  CHECK(registry.Add(4, {}).error_code() == grpc::StatusCode::ABORTED);
}

TEST_CASE("registry: unknown and repeated hosts are refused", "[registry]") {
  service::AgentRegistry registry({0, 2}, SteadyClock().Now() + std::chrono::seconds(5), Build);
  CHECK(registry.Add(1, {}).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(registry.Add(0, {}).ok());
  CHECK(registry.Add(0, {}).error_code() == grpc::StatusCode::ALREADY_EXISTS);
}

TEST_CASE("registry: closing releases waiting agents and refuses later ones", "[registry]") {
  service::AgentRegistry registry({0, 2}, SteadyClock().Now() + std::chrono::seconds(5), Build);
  REQUIRE(registry.Add(0, {}).ok());
  grpc::Status waited;
  std::thread waiter([&] {
    std::vector<v1::RankSpec> ranks;
    waited = registry.WaitForRanks(0, &ranks);
  });
  std::this_thread::sleep_for(milliseconds(20));
  CHECK(registry.Close() == std::vector<int>{0});
  waiter.join();
  CHECK(waited.error_code() == grpc::StatusCode::ABORTED);
  CHECK(registry.Add(2, {}).error_code() == grpc::StatusCode::ABORTED);
  CHECK(registry.Close() == std::vector<int>{0});
}

TEST_CASE("registry: waiting ends at the deadline", "[registry]") {
  service::AgentRegistry registry({0, 2}, SteadyClock().Now() + milliseconds(50), Build);
  REQUIRE(registry.Add(0, {}).ok());
  std::vector<v1::RankSpec> ranks;
  CHECK(registry.WaitForRanks(0, &ranks).error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
}

}  // namespace
}  // namespace ringrun::launcher
