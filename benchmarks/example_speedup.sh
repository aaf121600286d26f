#!/usr/bin/env bash
# The training example's speed-up: `ringrun -np 1` and `-np 2 build/bin/fashion_mnist` (its
# defaults, or the arguments given) in alternating runs, wall time of the whole ringrun command.
# Prints each run, then the medians and the ratio of the medians.
#
#   benchmarks/example_speedup.sh [BUILD_DIR] [-- fashion_mnist args]     ROUNDS (5)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$SRC/build
if [[ $# -gt 0 && $1 != -- ]]; then BUILD=$(cd "$1" && pwd); shift; fi
[[ ${1:-} == -- ]] && shift
ROUNDS=${ROUNDS:-5}
for b in ringrun fashion_mnist cpu_pingpong; do
  [[ -x $BUILD/bin/$b ]] || { echo "no $BUILD/bin/$b: build first" >&2; exit 1; }
done
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for round in $(seq "$ROUNDS"); do
  for np in 1 2; do
    t0=$(date +%s.%N)
    acc=$("$BUILD/bin/ringrun" -np "$np" "$BUILD/bin/fashion_mnist" "$@" |
          sed -n 's/^\[0\]<stdout>:test_accuracy=//p')
    t1=$(date +%s.%N)
    wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
    echo "round=$round np=$np wall_s=$wall test_accuracy=$acc $("$BUILD/bin/cpu_pingpong" | cut -d' ' -f3)"
    echo "$np $wall" >>"$raw"
  done
done
awk '{ w[$1, ++n[$1]] = $2 }
  function median(np,   i, j, m, v, t) {
    m = n[np]; for (i = 1; i <= m; i++) v[i] = w[np, i] + 0
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    return (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2 }
  END { a = median(1); b = median(2)
        printf "median np=1 %.2f s, np=2 %.2f s, speed-up %.2fx\n", a, b, a / b }' "$raw"
