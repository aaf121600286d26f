#!/usr/bin/env bash
# Launch latency: `ringrun -np 2 /bin/true` against `mpirun -np 2 /bin/true`, alternately,
# in one run. Prints the median and the best wall time of each, in milliseconds.
#   benchmarks/launch_latency.sh [ROUNDS] [BIN_DIR]
set -euo pipefail
rounds=${1:-30}
bin=${2:-$(cd "$(dirname "$0")/.." && pwd)/build/bin}
now_ns() { date +%s%N; }
declare -a rr mp
for ((i = 0; i < rounds; i++)); do
  t=$(now_ns); "$bin/ringrun" -np 2 /bin/true; rr+=($((($(now_ns) - t) / 1000)))
  t=$(now_ns); mpirun --allow-run-as-root --oversubscribe -np 2 /bin/true; mp+=($((($(now_ns) - t) / 1000)))
done
stats() {  # prints "median best" in ms
  sort -n | awk '{a[NR]=$1} END {printf "%.1f %.1f\n", a[int((NR+1)/2)]/1000, a[1]/1000}'
}
read -r rmed rbest < <(printf '%s\n' "${rr[@]}" | stats)
read -r mmed mbest < <(printf '%s\n' "${mp[@]}" | stats)
printf 'launch np=2 /bin/true, %d rounds alternating\n' "$rounds"
printf '%-8s median %7.1f ms  best %7.1f ms\n' ringrun "$rmed" "$rbest" mpirun "$mmed" "$mbest"
awk -v a="$rmed" -v b="$mmed" 'BEGIN {printf "ringrun/mpirun (median): %.2f\n", a / b}'
