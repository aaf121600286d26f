#!/usr/bin/env bash
# The main job: installs dependencies, builds, and trains the Fashion-MNIST MLP with two ranks
# on this machine under ringrun. Usage: scripts/run-example.sh [NP]
set -euo pipefail
cd "$(dirname "$0")/.."
np=${1:-2}
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"${RINGRUN_BUILD_JOBS:-2}" --target ringrun ringrun-agent fashion_mnist
exec build/bin/ringrun -np "$np" build/bin/fashion_mnist
