// An agent started by srun: its host index from its Slurm node name, its secret from the
// environment (and gone from it afterwards).
#include "agent/slurm_identity.h"

#include <stdlib.h>

#include <catch2/catch.hpp>

using Catch::Matchers::Contains;
using ringrun::agent::SlurmHostIndex;
using ringrun::agent::TakeSecretFromEnvironment;

TEST_CASE("An srun-started agent finds its host index by node name", "[slurm]") {
  CHECK(SlurmHostIndex("n1,n2,n3", "n2", "ignored").value() == 1);
  CHECK(SlurmHostIndex("n1,n2,n3", "", "n3").value() == 2);               // SLURMD_NODENAME unset
  CHECK(SlurmHostIndex("N1,n2", "n1", "").value() == 0);                  // case
  CHECK(SlurmHostIndex("n1.cluster,n2.cluster", "n2", "").value() == 1);  // first label
  CHECK_THAT(SlurmHostIndex("n1,n2", "n9", "").status().message(),
             Contains("SLURMD_NODENAME=n9") && Contains("n1,n2"));
  CHECK_THAT(SlurmHostIndex("n1.a,n1.b", "n1", "").status().message(), Contains("both"));
}

TEST_CASE("The agent takes its secret out of the environment", "[slurm]") {
  ::setenv("RINGRUN_AGENT_SECRET", "abc", 1);
  CHECK(TakeSecretFromEnvironment().value() == "abc");
  CHECK(std::getenv("RINGRUN_AGENT_SECRET") == nullptr);
  CHECK_FALSE(TakeSecretFromEnvironment().ok());
}
