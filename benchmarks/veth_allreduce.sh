#!/usr/bin/env bash
# Two-host allreduce over the namespace cluster's veth links (needs root): ringrun against the
# peer programs (benchmarks/README.md) run the same way, in alternating rounds, one rank on each
# of rr-h1 and rr-h2:
#   ringrun       ringrun -np 2 -H rr-h1:1,rr-h2:1 ringrun-bench allreduce (float sum, mean time)
#   openmpi-tcp   the peers' mpi_bench under mpirun over the same SSH hosts, --mca btl tcp,self
#   gloo          the peers' gloo_bench, one process per namespace (GLOO_HOST = its address)
#   torch-gloo    the peers' torch_allreduce.py, one process per namespace (if python3-torch)
#   null-ring     build/bin/null_ring: the peers' ring_limit data movement across the two hosts,
#                 the transport ceiling: time_us is its best iteration (as ring_limit reports
#                 it); null-ring-mean is its mean iteration, as every other program reports
# Every line is the peers' format (NAME np= bytes= time_us= algbw_GBps= busbw_GBps=); the
# summary gives the median over the rounds of each.
#
#   benchmarks/veth_allreduce.sh [BUILD_DIR]     ROUNDS (3), BYTES (64M as bytes), ITERS (10)
#
# Brings up a 2-host cluster if none is up, and takes it down again (KEEP_CLUSTER=1 leaves it).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
ROUNDS=${ROUNDS:-3}
BYTES=${BYTES:-67108864}
ITERS=${ITERS:-10}
ANCHORS=${RINGRUN_PEERS:?set RINGRUN_PEERS to the peer programs folder (benchmarks/README.md)}
OUT=${ANCHORS_BUILD:-/tmp/ringrun-anchors}
[[ $(id -u) == 0 ]] || { echo "needs root" >&2; exit 1; }
for b in ringrun ringrun-bench null_ring; do
  [[ -x $BUILD/bin/$b ]] || { echo "no $BUILD/bin/$b: build first" >&2; exit 1; }
done
[[ -x $OUT/mpi_bench && -x $OUT/gloo_bench ]] || bash "$ANCHORS/run.sh" build

# A cluster that was up already stays up; one brought up here goes down at exit.
if ! "$SRC/scripts/test-cluster.sh" status >/dev/null 2>&1 && [[ -z ${KEEP_CLUSTER:-} ]]; then
  trap 'QUIET=1 "$SRC/scripts/test-cluster.sh" down' EXIT
fi
QUIET=1 "$SRC/scripts/test-cluster.sh" up 2
eval "$("$SRC/scripts/test-cluster.sh" env)"
A1=198.18.0.2 A2=198.18.0.3

run_ringrun() {
  "$BUILD/bin/ringrun" -np 2 -H rr-h1:1,rr-h2:1 -i "$RR_KEY" --ssh-known-hosts "$RR_KNOWN_HOSTS" \
    "$BUILD/bin/ringrun-bench" allreduce -b "$BYTES" -e "$BYTES" -n "$ITERS" -w 3 -c 0 --json |
    sed -n 's/^\[0\]<stdout>://p' | grep '^{' |
    sed -E 's/.*"np":([0-9]+).*"bytes":([0-9]+).*"time_us":([0-9.]+).*"algbw_GBps":([0-9.]+).*"busbw_GBps":([0-9.]+).*/ringrun np=\1 bytes=\2 time_us=\3 algbw_GBps=\4 busbw_GBps=\5/'
}
run_mpi() {
  mpirun --allow-run-as-root -np 2 -H rr-h1:1,rr-h2:1 --bind-to none \
    --mca plm_rsh_agent ssh \
    --mca plm_rsh_args "-i $RR_KEY -o UserKnownHostsFile=$RR_KNOWN_HOSTS -o BatchMode=yes" \
    --mca oob_tcp_if_include 198.18.0.0/24 --mca btl tcp,self \
    --mca btl_tcp_if_include 198.18.0.0/24 \
    "$OUT/mpi_bench" "$BYTES" "$BYTES" "$ITERS" 2>/dev/null | sed 's/^mpi /openmpi-tcp /'
}
run_gloo() {
  local store
  store=$(mktemp -d)
  ip netns exec rr-h1 env GLOO_HOST=$A1 "$OUT/gloo_bench" 0 2 "$store" "$BYTES" "$BYTES" "$ITERS" &
  ip netns exec rr-h2 env GLOO_HOST=$A2 "$OUT/gloo_bench" 1 2 "$store" "$BYTES" "$BYTES" "$ITERS" >/dev/null
  wait
  rm -rf "$store"
}
run_torch() {
  /usr/bin/python3 -c 'import torch' 2>/dev/null || return 0
  local port=$((20000 + RANDOM % 20000)) r
  for r in 0 1; do
    ip netns exec "rr-h$((r + 1))" env OMP_NUM_THREADS=1 MASTER_ADDR=$A1 MASTER_PORT=$port \
      WORLD_SIZE=2 RANK=$r GLOO_SOCKET_IFNAME=eth0 \
      /usr/bin/python3 "$ANCHORS/torch_allreduce.py" "$BYTES" "$BYTES" "$ITERS" 2>/dev/null &
  done
  wait
}
run_null_ring() {
  local port=$((20000 + RANDOM % 20000))
  # Its mean iteration too, as "null-ring-mean", to set beside the others' means.
  ip netns exec rr-h1 "$BUILD/bin/null_ring" 0 "$BYTES" "$ITERS" $A1:$port $A2:$port |
    awk '{ print; for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
           a = v["bytes"] / v["mean_us"] / 1e3
           printf "null-ring-mean np=%s bytes=%s time_us=%s algbw_GBps=%.3f busbw_GBps=%.3f\n",
                  v["np"], v["bytes"], v["mean_us"], a, a * 2 * (v["np"] - 1) / v["np"] }' &
  ip netns exec rr-h2 "$BUILD/bin/null_ring" 1 "$BYTES" "$ITERS" $A1:$port $A2:$port
  wait
}

raw=$(mktemp)
for round in $(seq "$ROUNDS"); do
  echo "# round $round"
  { run_ringrun; run_mpi; run_gloo; run_torch; run_null_ring; } | tee -a "$raw"
done
echo "# median over $ROUNDS rounds: time_us / busbw_GBps"
awk -f "$SRC/benchmarks/median_table.awk" "$raw"
rm -f "$raw"
