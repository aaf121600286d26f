#!/usr/bin/env bash
# Runs every test: installs dependencies, builds both configurations (with and without NCCL),
# then runs the unit, integration and cluster tests (the 10-job soak among them), then the
# sanitizer builds and the fuzzers (scripts/sanitize.sh, scripts/fuzz.sh). Needs root (cluster
# tests create network namespaces). Usage: scripts/test.sh [extra ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${RINGRUN_BUILD_JOBS:-2}
scripts/install-deps.sh
scripts/check-format.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs"
# The configuration without CUDA/NCCL must build too; its GPU seam has its own unit tests.
cmake -S . -B build-nonccl -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRINGRUN_WITH_NCCL=OFF >/dev/null
cmake --build build-nonccl -j"$jobs" --target ringrun ringrun-agent ringrun gpu_unit_tests
(cd build-nonccl && ctest -R '^gpu_unit' --output-on-failure)
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
