#!/usr/bin/env bash
# Runs every test (what .ci/run runs): installs the dependencies, checks the format, builds and
# installs the `default` preset (scripts/setup.sh), builds the `nonccl` preset too, then runs the
# unit, integration, slow, python, cluster (the 10-job soak among them) and slurm tests, then the
# sanitizer builds and the fuzzers (scripts/sanitize.sh, scripts/fuzz.sh). Needs root (apt-get,
# /usr/local, the cluster tests' network namespaces, Slurm). For a quick loop while changing
# code: scripts/quick-test.sh.
#   scripts/test.sh [extra ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
scripts/install-deps.sh
scripts/check-format.sh
scripts/setup.sh
cmake --build build -j"$(build_jobs)"
# The configuration without CUDA/NCCL must build too; its GPU seam has its own unit tests.
configure nonccl
cmake --build build-nonccl -j"$(build_jobs)" --target ringrun ringrun-agent gpu_unit_tests
build-nonccl/bin/gpu_unit_tests
cd build
# Everything but the cluster in parallel, then the cluster tests one at a time (they share
# the namespace hosts, brought up and torn down by a CTest fixture).
ctest -LE 'cluster|slurm' -j2 --output-on-failure --timeout 600 "$@"
ctest -L cluster --output-on-failure --timeout 600 "$@"
ctest -L slurm --output-on-failure --timeout 600 "$@"
cd ..
# ASan+UBSan over the unit and integration tests, TSan over the threaded ones (build-asan and
# build-tsan), then each fuzz target for 25 s from its committed corpus (build-asan).
scripts/sanitize.sh all
scripts/fuzz.sh -t 25
