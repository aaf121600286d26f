#!/usr/bin/env bash
# Training throughput on two test-cluster hosts (network namespaces joined by veth links; needs
# root): ringrun.torch.DistributedOptimizer (ringrun -H h1:1,h2:1 over SSH) against torch DDP
# (gloo, one process per namespace), same model, batch and threads (one OpenMP and one BLAS
# thread per rank), alternating in rounds; prints the median samples/s of each.
#
#   benchmarks/torch_veth.sh [BUILD_DIR]     env: ROUNDS (3), STEPS (20), BATCH (32), MODEL (mlp),
#                                            RINGRUN_CLUSTER_ID (the cluster to use)
# Brings up a 2-host cluster if none is up, and takes it down again (KEEP_CLUSTER=1 leaves it).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-20} BATCH=${BATCH:-32} MODEL=${MODEL:-mlp}
ANCHORS=${ANCHORS:-/work/shared/anchors}
[[ $(id -u) == 0 ]] || { echo "needs root" >&2; exit 1; }
P=rr${RINGRUN_CLUSTER_ID:-} NET=198.18.${RINGRUN_CLUSTER_ID:-0}
if ! "$SRC/scripts/test-cluster.sh" status >/dev/null 2>&1 && [[ -z ${KEEP_CLUSTER:-} ]]; then
  trap 'QUIET=1 "$SRC/scripts/test-cluster.sh" down' EXIT
fi
QUIET=1 "$SRC/scripts/test-cluster.sh" up 2
eval "$("$SRC/scripts/test-cluster.sh" env)"
A1=$NET.2
threads=(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)

source "$SRC/benchmarks/lib.sh"
run_ringrun() {
  env PYTHONPATH="$BUILD/python" "$BUILD/bin/ringrun" -np 2 -H "$P-h1:1,$P-h2:1" -i "$RR_KEY" \
    --ssh-known-hosts "$RR_KNOWN_HOSTS" -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 \
    /usr/bin/python3 "$SRC/benchmarks/torch_train.py" "$MODEL" "$STEPS" "$BATCH" 2>/dev/null | field samples_per_s
}
run_ddp() {
  local port=$((20000 + RANDOM % 20000)) r out
  out=$(mktemp)
  for r in 0 1; do
    ip netns exec "$P-h$((r + 1))" env "${threads[@]}" MASTER_ADDR=$A1 MASTER_PORT=$port \
      WORLD_SIZE=2 RANK=$r GLOO_SOCKET_IFNAME=eth0 \
      /usr/bin/python3 "$ANCHORS/torch_ddp_train.py" "$MODEL" "$STEPS" "$BATCH" 2>/dev/null >>"$out" &
  done
  wait
  field samples_per_s <"$out"
  rm -f "$out"
}
rr=() ddp=()
for round in $(seq "$ROUNDS"); do
  d=$(run_ddp) r=$(run_ringrun)
  echo "round $round: ddp=${d:-0} ringrun=${r:-0}" >&2
  ddp+=("${d:-0}") rr+=("${r:-0}")
done
d=$(printf '%s\n' "${ddp[@]}" | median) r=$(printf '%s\n' "${rr[@]}" | median)
awk -v m="$MODEL" -v d="$d" -v r="$r" 'BEGIN {
  printf "| %s, two veth hosts | np=2 | DDP %.1f | ringrun %.1f | %.2fx |\n", m, d, r, (d > 0 ? r / d : 0) }'
