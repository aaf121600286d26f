#!/usr/bin/env bash
# Installs the dependencies (Debian packages), builds ringrun in build/ (the `default` preset) and
# installs it with `cmake --install` into PREFIX (default /usr/local): `ringrun` and
# `ringrun-agent` land on PATH, libringrun, its headers and its CMake package beside them.
# Needs root for apt-get and /usr/local. Idempotent; a second run only rebuilds what changed.
#   scripts/setup.sh            PREFIX=/opt/ringrun scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
prefix=${PREFIX:-/usr/local}
scripts/install-deps.sh
configure default
# What the install needs, and the example (scripts/test.sh builds the rest).
cmake --build build -j"$(build_jobs)" --target ringrun ringrun-agent ringrun-gpu-probe ringrun_lib \
  fashion_mnist
cmake --install build --prefix "$prefix" >/dev/null
command -v ldconfig >/dev/null && ldconfig
echo "setup: $("$prefix/bin/ringrun" --version) and ringrun-agent installed in $prefix/bin"
