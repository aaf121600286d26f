#!/usr/bin/env bash
# Connection set-up and small-collective cost of the data plane, against another libringrun.
#   benchmarks/connect_setup.sh BUILD [OTHER_LIB_DIR] [RUNS]
# For each np in 2 4, TCP and shared memory: the first 8-byte allreduce after ringrun_init (it
# makes every connection: connect, handshake, shared-memory segment) and the steady-state mean of
# 8-byte and 1 MiB allreduces, from ringrun-bench under runtime_local_job (no ssh, no agents).
# Runs alternate between this build's library and OTHER_LIB_DIR's (LD_LIBRARY_PATH), RUNS times
# (default 9); prints the median of each. OTHER_LIB_DIR: the lib/ of a build of another commit.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=${1:?usage: connect_setup.sh BUILD [OTHER_LIB_DIR] [RUNS]}
other=${2:-}
runs=${3:-9}
job="$build/bin/runtime_local_job"
bench="$build/bin/ringrun-bench"
# time (us) of the single size row of ringrun-bench
bench_us() {  # libdir np shm args...
  local lib=$1 np=$2 shm=$3
  shift 3
  LD_LIBRARY_PATH=$lib RINGRUN_DISABLE_SHM=$((1 - shm)) "$job" "$np" "$bench" allreduce -c 0 "$@" |
    awk '!/^#/ && NF >= 5 { print $5; exit }'
}
libs=("$build/lib")
[[ -n $other ]] && libs+=("$other")
printf "%-6s %-3s %-4s %14s %14s %14s\n" lib np pair "first_8B_us" "steady_8B_us" "steady_1M_us"
for np in 2 4; do
  for shm in 0 1; do
    declare -A first=() small=() large=()
    for ((i = 0; i < runs; i++)); do
      for lib in "${libs[@]}"; do
        first[$lib]+="$(bench_us "$lib" $np $shm -b 8 -e 8 -n 1 -w 0) "
        small[$lib]+="$(bench_us "$lib" $np $shm -b 8 -e 8 -n 2000 -w 200) "
        large[$lib]+="$(bench_us "$lib" $np $shm -b 1M -e 1M -n 50 -w 10) "
      done
    done
    for lib in "${libs[@]}"; do
      name=this; [[ $lib != "$build/lib" ]] && name=other
      printf "%-6s %-3s %-4s %14s %14s %14s\n" $name $np "$([[ $shm == 1 ]] && echo shm || echo tcp)" \
        "$(tr ' ' '\n' <<<"${first[$lib]}" | grep . | median)" \
        "$(tr ' ' '\n' <<<"${small[$lib]}" | grep . | median)" \
        "$(tr ' ' '\n' <<<"${large[$lib]}" | grep . | median)"
    done
    unset first small large
  done
done
