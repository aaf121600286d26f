#!/usr/bin/env bash
# One-host allreduce, ringrun against the peer programs (RINGRUN_PEERS/run.sh allreduce, see
# benchmarks/README.md:
# Open MPI with its default shared memory and over TCP, Gloo, torch-gloo, the null-ring and
# memcpy ceilings), in alternating rounds, float sum, sizes MIN..MAX by 4x:
#
#   benchmarks/host_allreduce.sh [BUILD_DIR]     ROUNDS (5), NP (2), MIN (4096), MAX (67108864),
#                                                ITERS (20; ringrun also warms up 5)
#
# Every round prints its raw lines (the peers' format), framed by cpu_pingpong: on a VM whose
# two vCPUs sometimes do not share an L3 (round trip ~350 ns instead of ~60 ns), every
# same-host copy is several times slower while that lasts, for every program alike. The summary
# gives, per size and program, the median over the rounds of time_us and busbw_GBps.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
ROUNDS=${ROUNDS:-5} NP=${NP:-2} MIN=${MIN:-4096} MAX=${MAX:-67108864} ITERS=${ITERS:-20}
ANCHORS=${RINGRUN_PEERS:?set RINGRUN_PEERS to the peer programs folder (benchmarks/README.md)}
for b in ringrun ringrun-bench cpu_pingpong; do
  [[ -x $BUILD/bin/$b ]] || { echo "no $BUILD/bin/$b: build first" >&2; exit 1; }
done
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT

for round in $(seq "$ROUNDS"); do
  echo "# round $round: $("$BUILD/bin/cpu_pingpong")"
  "$BUILD/bin/ringrun" -np "$NP" "$BUILD/bin/ringrun-bench" allreduce -b "$MIN" -e "$MAX" -f 4 \
    -n "$ITERS" -w 5 -c 1 --json | sed -n 's/^\[0\]<stdout>://p' | grep '^{' |
    sed -E 's/.*"np":([0-9]+).*"bytes":([0-9]+).*"time_us":([0-9.]+).*"algbw_GBps":([0-9.]+).*"busbw_GBps":([0-9.]+).*"wrong":([-0-9]+).*/ringrun np=\1 bytes=\2 time_us=\3 algbw_GBps=\4 busbw_GBps=\5 wrong=\6/' |
    tee -a "$raw"
  bash "$ANCHORS/run.sh" allreduce "$NP" "$MIN" "$MAX" "$ITERS" | tee -a "$raw"
  echo "# round $round done: $("$BUILD/bin/cpu_pingpong")"
done

echo "# median over $ROUNDS rounds: time_us / busbw_GBps"
awk -f "$SRC/benchmarks/median_table.awk" "$raw"
