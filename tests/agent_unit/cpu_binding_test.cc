// --bind-to core: the rule that gives each local rank its share of the agent's CPUs.
#include "agent/cpu_binding.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace ringrun::agent {
namespace {

using Cpus = std::vector<int>;

Cpus Share(const Cpus& allowed, int local_size, int local_rank) {
  Result<Cpus> r = CpusForRank(allowed, local_size, local_rank);
  INFO(r.status().message());
  REQUIRE(r.ok());
  return r.value();
}

TEST_CASE("cpu binding: one CPU each when ranks and CPUs match", "[cpu_binding]") {
  CHECK(Share({0, 1}, 2, 0) == Cpus{0});
  CHECK(Share({0, 1}, 2, 1) == Cpus{1});
}

TEST_CASE("cpu binding: contiguous equal shares, the remainder unused", "[cpu_binding]") {
  const Cpus eight = {0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(Share(eight, 2, 0) == Cpus{0, 1, 2, 3});
  CHECK(Share(eight, 2, 1) == Cpus{4, 5, 6, 7});
  CHECK(Share(eight, 3, 0) == Cpus{0, 1});
  CHECK(Share(eight, 3, 1) == Cpus{2, 3});
  CHECK(Share(eight, 3, 2) == Cpus{4, 5});  // 6 and 7 are left over
  CHECK(Share(eight, 8, 7) == Cpus{7});
}

TEST_CASE("cpu binding: one rank gets every allowed CPU", "[cpu_binding]") {
  CHECK(Share({0, 1, 2}, 1, 0) == Cpus{0, 1, 2});
}

TEST_CASE("cpu binding: shares follow the allowed CPUs, gaps and order included", "[cpu_binding]") {
  // A cgroup or srun gave the agent CPUs 2, 3, 8, 9, 10 (listed in any order).
  const Cpus allowed = {10, 2, 9, 3, 8};
  CHECK(Share(allowed, 2, 0) == Cpus{2, 3});
  CHECK(Share(allowed, 2, 1) == Cpus{8, 9});
  CHECK(Share({5}, 1, 0) == Cpus{5});
}

TEST_CASE("cpu binding: more ranks than CPUs is an error giving the counts", "[cpu_binding]") {
  Result<Cpus> r = CpusForRank({0, 1}, 3, 0);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "3 ranks but 2 allowed CPUs");
  r = CpusForRank({4}, 2, 1);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "2 ranks but 1 allowed CPU");
  CHECK_FALSE(CpusForRank({}, 1, 0).ok());
}

TEST_CASE("cpu binding: a local rank outside 0..local_size-1 is an error", "[cpu_binding]") {
  CHECK_FALSE(CpusForRank({0, 1}, 2, 2).ok());
  CHECK_FALSE(CpusForRank({0, 1}, 2, -1).ok());
  CHECK_FALSE(CpusForRank({0, 1}, 0, 0).ok());
}

TEST_CASE("cpu binding: CPU lists read as the kernel writes them", "[cpu_binding]") {
  CHECK(CpuListText({}) == "");
  CHECK(CpuListText({0}) == "0");
  CHECK(CpuListText({2, 3}) == "2-3");
  CHECK(CpuListText({0, 1, 4, 6, 7}) == "0-1,4,6-7");
  CHECK(CpuListText({1, 3, 5}) == "1,3,5");
}

TEST_CASE("cpu binding: the agent's allowed CPUs are read from the kernel", "[cpu_binding]") {
  Result<Cpus> cpus = AllowedCpus();
  REQUIRE(cpus.ok());
  REQUIRE_FALSE(cpus->empty());
  CHECK(std::is_sorted(cpus->begin(), cpus->end()));
}

}  // namespace
}  // namespace ringrun::agent
