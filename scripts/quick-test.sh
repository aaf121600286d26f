#!/usr/bin/env bash
# The developer's loop: builds the unit-test executables and runs the unit tests that are not
# labelled slow (how long that takes: README.md, "Building and testing"). No apt, no root, no
# network namespaces; the dependencies must be installed (scripts/install-deps.sh, once, as root).
#   scripts/quick-test.sh [extra ctest args]      e.g. -R rendezvous
# scripts/test.sh is the complete run (every label, both configurations).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
configure default
cmake --build build -j"$(build_jobs)" --target launcher_unit_tests agent_unit_tests \
  ssh_unit_tests runtime_unit_tests gpu_unit_tests
cd build
ctest -L unit -LE slow -j"$(build_jobs)" --output-on-failure --timeout 120 "$@"
