// Placement: host by host, local ranks, Horovod's cross ranks, heterogeneous slots.
#include "launcher/hosts/placement.h"

#include <catch2/catch.hpp>
#include <random>

using Catch::Matchers::Contains;
using ringrun::launcher::hosts::CheckNumProc;
using ringrun::launcher::hosts::HostSpec;
using ringrun::launcher::hosts::PlaceRanks;
using ringrun::launcher::hosts::RankPlacement;

namespace {

std::vector<ringrun::launcher::hosts::HostSpec> Hosts(
    std::vector<std::pair<std::string, int>> shape) {
  std::vector<ringrun::launcher::hosts::HostSpec> hosts;
  for (auto& [name, slots] : shape) {
    HostSpec h;
    h.name = name;
    h.slots = slots;
    hosts.push_back(h);
  }
  return hosts;
}

// The definitions, computed the slow way from (host_index, local_rank) of every rank.
void CheckAgainstDefinition(const std::vector<ringrun::launcher::hosts::RankPlacement>& p) {
  for (const ringrun::launcher::hosts::RankPlacement& r : p) {
    int local_size = 0, cross_rank = 0, cross_size = 0;
    std::vector<int> hosts_with_ranks;
    for (const RankPlacement& q : p) {
      if (q.host_index == r.host_index) ++local_size;
      if (q.local_rank == r.local_rank) {
        ++cross_size;
        if (q.host_index < r.host_index) ++cross_rank;
      }
      if (hosts_with_ranks.empty() || hosts_with_ranks.back() != q.host_index) {
        hosts_with_ranks.push_back(q.host_index);
      }
    }
    int node_rank = 0;
    while (hosts_with_ranks[static_cast<size_t>(node_rank)] != r.host_index) ++node_rank;
    CHECK(r.local_size == local_size);
    CHECK(r.cross_rank == cross_rank);
    CHECK(r.cross_size == cross_size);
    CHECK(r.node_rank == node_rank);
    CHECK(r.node_count == static_cast<int>(hosts_with_ranks.size()));
  }
}

}  // namespace

TEST_CASE("placement fills hosts in order", "[placement]") {
  auto r = ringrun::launcher::hosts::PlaceRanks(Hosts({{"a", 4}, {"b", 4}}), 8);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 8);
  for (int i = 0; i < 8; ++i) {
    const ringrun::launcher::hosts::RankPlacement& p = (*r)[static_cast<size_t>(i)];
    CHECK(p.rank == i);
    CHECK(p.host_index == i / 4);
    CHECK(p.local_rank == i % 4);
    CHECK(p.local_size == 4);
    CHECK(p.cross_rank == i / 4);
    CHECK(p.cross_size == 2);
    CHECK(p.node_rank == i / 4);
    CHECK(p.node_count == 2);
  }
}

TEST_CASE("placement with heterogeneous slots: a:1,b:2", "[placement]") {
  auto r = ringrun::launcher::hosts::PlaceRanks(Hosts({{"a", 1}, {"b", 2}}), 3);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 3);
  const auto& p = *r;
  CHECK((p[0].host_index == 0 && p[0].local_rank == 0 && p[0].local_size == 1));
  CHECK((p[0].cross_rank == 0 && p[0].cross_size == 2));
  CHECK((p[1].host_index == 1 && p[1].local_rank == 0 && p[1].local_size == 2));
  CHECK((p[1].cross_rank == 1 && p[1].cross_size == 2));
  CHECK((p[2].host_index == 1 && p[2].local_rank == 1 && p[2].local_size == 2));
  CHECK((p[2].cross_rank == 0 && p[2].cross_size == 1));
}

TEST_CASE("placement leaves later hosts empty when np is below the slots", "[placement]") {
  auto r = ringrun::launcher::hosts::PlaceRanks(Hosts({{"a", 2}, {"b", 2}, {"c", 2}}), 3);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 3);
  CHECK((*r)[2].host_index == 1);
  CHECK((*r)[2].local_size == 1);
  CHECK((*r)[0].local_size == 2);
  CHECK((*r)[1].cross_size == 1);  // only a has a local rank 1
  CHECK((*r)[2].node_count == 2);
  CheckAgainstDefinition(*r);
}

TEST_CASE("placement matches the definitions on many shapes", "[placement]") {
  std::mt19937 gen(12345);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::pair<std::string, int>> shape;
    int hosts = 1 + static_cast<int>(gen() % 6);
    int total = 0;
    for (int h = 0; h < hosts; ++h) {
      int slots = 1 + static_cast<int>(gen() % 5);
      total += slots;
      shape.push_back({"h" + std::to_string(h), slots});
    }
    int np = 1 + static_cast<int>(gen() % static_cast<unsigned>(total));
    auto r = ringrun::launcher::hosts::PlaceRanks(Hosts(shape), np);
    REQUIRE(r.ok());
    REQUIRE(static_cast<int>(r->size()) == np);
    CheckAgainstDefinition(*r);
  }
}

TEST_CASE("placement: -np larger than the slots names the slots per host", "[placement]") {
  auto r = ringrun::launcher::hosts::PlaceRanks(Hosts({{"a", 4}, {"b", 4}}), 9);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() ==
        "-np 9 exceeds the 8 slots available (a:4, b:4); --oversubscribe allows more ranks than "
        "slots");
  CHECK(ringrun::launcher::hosts::CheckNumProc(Hosts({{"a", 1}}), 2).message() ==
        "-np 2 exceeds the 1 slot available (a:1); --oversubscribe allows more ranks than slots");
}

TEST_CASE("placement: --oversubscribe gives the extra ranks to the hosts in turn", "[placement]") {
  auto r = ringrun::launcher::hosts::PlaceRanks(Hosts({{"a", 2}, {"b", 1}}), 6, true);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 6);
  // a: 2 slots + 2 extra, b: 1 slot + 1 extra; ranks numbered host by host.
  std::vector<int> hosts_of;
  for (const auto& p : *r) hosts_of.push_back(p.host_index);
  CHECK(hosts_of == std::vector<int>{0, 0, 0, 0, 1, 1});
  CHECK((*r)[3].local_size == 4);
  CHECK((*r)[5].local_rank == 1);
  CheckAgainstDefinition(*r);
  CHECK(ringrun::launcher::hosts::CheckNumProc(Hosts({{"a", 1}}), 5, true).ok());
}

TEST_CASE("placement: a long host list is summarised in the error", "[placement]") {
  std::vector<std::pair<std::string, int>> shape;
  for (int i = 0; i < 40; ++i) shape.push_back({"n" + std::to_string(i), 1});
  auto st = ringrun::launcher::hosts::CheckNumProc(Hosts(shape), 41);
  CHECK_THAT(st.message(), Contains("-np 41 exceeds the 40 slots available (n0:1, n1:1"));
  CHECK_THAT(st.message(), Contains("and 24 more hosts"));
}

TEST_CASE("placement: np must be positive, hosts non-empty", "[placement]") {
  CHECK_THAT(ringrun::launcher::hosts::PlaceRanks(Hosts({{"a", 1}}), 0).status().message(),
             Contains("-np 0: must be at least 1"));
  CHECK_THAT(ringrun::launcher::hosts::PlaceRanks(Hosts({{"a", 1}}), -1).status().message(),
             Contains("-np -1: must be at least 1"));
  CHECK_FALSE(ringrun::launcher::hosts::PlaceRanks({}, 1).ok());
  CHECK_FALSE(PlaceRanks(Hosts({{"a", 0}}), 1).ok());
}
