#!/usr/bin/env bash
# The main job: sets ringrun up (scripts/setup.sh: dependencies, build, install into /usr/local),
# then trains the Fashion-MNIST MLP with NP ranks (default 2) on this machine under ringrun.
#   scripts/run-example.sh [NP]
set -euo pipefail
cd "$(dirname "$0")/.."
np=${1:-2}
scripts/setup.sh
exec "${PREFIX:-/usr/local}/bin/ringrun" -np "$np" build/bin/fashion_mnist
