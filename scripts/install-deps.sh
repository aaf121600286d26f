#!/usr/bin/env bash
# Installs exactly what building and testing ringrun need, from Debian packages.
# Idempotent and quiet; run as root (CI does). CUDA and NCCL come from /usr/local/cuda when
# present and are optional.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config clang-format
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libssh-dev libcli11-dev libspdlog-dev catch2 zlib1g-dev libssl-dev
  libyaml-cpp-dev  # --config-file
  openssh-server openssh-client iproute2 procps util-linux
  openmpi-bin libopenmpi-dev libgloo-dev
  libpmix-dev  # joining mpirun and srun --mpi=pmix jobs (RINGRUN_WITH_PMIX)
  slurmctld slurmd slurm-client munge  # the slurm tests: a real Slurm 22.05 (scripts/test-slurm-cluster.sh)
  dataset-fashion-mnist
  python3-torch  # torch.distributed for the env:// contract test; ringrun.torch's framework
  python3-numpy python3-pytest python3-venv  # the Python package, its tests (tests/python)
  libopenblas0-pthread  # an optimized libblas.so.3 for torch (the reference BLAS is ~10x slower)
  clang clang-14 llvm-14 libclang-rt-14-dev libfuzzer-14-dev  # sanitizer builds, libFuzzer, symbolizer
  bc  # scripts/soak.sh and the cluster tests' timings
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
