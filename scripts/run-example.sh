#!/usr/bin/env bash
# The main job: sets ringrun up (scripts/setup.sh: dependencies, build, install into /usr/local),
# then trains a PyTorch CNN on Fashion-MNIST (examples/pytorch) with NP ranks (default 2) on this
# machine under ringrun; rank 0 ends by printing test_accuracy=0.XXXX.
#   scripts/run-example.sh [NP]        the PyTorch example (import ringrun.torch as hvd)
#   scripts/run-example.sh cpp [NP]    the C++ example (examples/fashion_mnist, libringrun alone)
set -euo pipefail
cd "$(dirname "$0")/.."
which=pytorch
if [[ ${1:-} == cpp || ${1:-} == pytorch ]]; then which=$1; shift; fi
np=${1:-2}
scripts/setup.sh
ringrun="${PREFIX:-/usr/local}/bin/ringrun"
if [[ $which == cpp ]]; then
  exec "$ringrun" -np "$np" build/bin/fashion_mnist
fi
exec "$ringrun" -np "$np" /usr/bin/python3 examples/pytorch/train_fashion_mnist.py
