#!/usr/bin/env bash
# Start time of a 3-node job inside one Slurm allocation (needs root; the Slurm test cluster):
# the wall time of a job of 3 ranks (one per node) running /bin/true, three ways, alternating,
# ROUNDS times each, in the same `salloc -N3 --ntasks-per-node=1`:
#   slurm   ringrun /bin/true                      (agents in one srun step; hosts from Slurm)
#   ssh     ringrun --starter ssh ... /bin/true    (same hosts, agents over SSH)
#   mpirun  mpirun -np 3 /bin/true                 (Open MPI: orteds in one srun step)
# Before each run it waits until the allocation has no step left, so that no run waits for the
# previous one's step to be released. Prints the median, mean, min and max of each, in seconds.
#
#   RINGRUN_CLUSTER_ID=K benchmarks/slurm_launch.sh [BUILD_DIR]     (ROUNDS=10 by default)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
ROUNDS=${ROUNDS:-10}
[[ -x $BUILD/bin/ringrun ]] || { echo "no $BUILD/bin/ringrun: build first" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "needs root" >&2; exit 1; }

if [[ -z ${RR_INSIDE_ALLOCATION:-} ]]; then
  QUIET=1 "$SRC/scripts/test-slurm-cluster.sh" up 3
  eval "$("$SRC/scripts/test-slurm-cluster.sh" env)"
  export SLURM_CONF RR_KEY RR_KNOWN_HOSTS ROUNDS
  RR_INSIDE_ALLOCATION=1 exec salloc -Q -N3 --ntasks-per-node=1 "$0" "$BUILD"
fi

TMPD=$(mktemp -d)
trap 'rm -rf "$TMPD"' EXIT
RINGRUN=$BUILD/bin/ringrun
no_steps() {  # waits (10 s at most) until the allocation runs no step
  local i
  for i in $(seq 100); do
    [[ -z $(squeue -h -s -j "$SLURM_JOB_ID" -o '%j' | grep -vxE 'extern|batch|interactive') ]] && return 0
    sleep 0.1
  done
}
run() {  # name cmd...: appends the seconds to $TMPD/name
  local name=$1 t0 t1
  shift
  no_steps
  t0=$(date +%s%N)
  if ! "$@" >/dev/null 2>"$TMPD/err"; then
    echo "$name failed: $*" >&2
    cat "$TMPD/err" >&2
    exit 1
  fi
  t1=$(date +%s%N)
  echo "($t1 - $t0) / 1000000000" | bc -l >>"$TMPD/$name"
}
stats() {
  sort -g "$1" | awk '{a[NR]=$1; s+=$1} END {
    m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2;
    printf "%.3f %.3f %.3f %.3f\n", m, s/NR, a[1], a[NR] }'
}

for _ in $(seq "$ROUNDS"); do
  run slurm "$RINGRUN" /bin/true
  run ssh "$RINGRUN" --starter ssh -i "$RR_KEY" --ssh-known-hosts "$RR_KNOWN_HOSTS" /bin/true
  run mpirun mpirun --allow-run-as-root -np 3 /bin/true
done
echo "Slurm job $SLURM_JOB_ID, nodes $SLURM_JOB_NODELIST, $ROUNDS rounds"
printf '%-8s %8s %8s %8s %8s\n' how median_s mean_s min_s max_s
for n in slurm ssh mpirun; do printf '%-8s %8s %8s %8s %8s\n' "$n" $(stats "$TMPD/$n"); done
