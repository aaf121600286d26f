#!/usr/bin/env bash
# A blocking allreduce's latency call by call (benchmarks/blocking_latency.c): ringrun against
# Open MPI's MPI_Allreduce on one host, in alternating rounds, each program timing N calls per
# size with the same loop; then, per program and size, the median over the rounds of each
# round's median and 99th percentile.
#
#   benchmarks/blocking_latency.sh [BUILD_DIR...]   ROUNDS (5), NP (2), N (10000), W (1000),
#                                                   SIZES ("4 4096"), BIND (ringrun's
#                                                   --bind-to, none by default)
#
# Several build folders (a baseline's first) run in turn in every round, each named by its
# folder. Open MPI runs as ../shared/anchors/run.sh runs it (--bind-to none, --oversubscribe).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
source "$SRC/benchmarks/lib.sh"
BUILDS=("$@")
[[ ${#BUILDS[@]} -gt 0 ]] || BUILDS=("$SRC/build")
ROUNDS=${ROUNDS:-5} NP=${NP:-2} N=${N:-10000} W=${W:-1000} SIZES=${SIZES:-4 4096}
BIND=${BIND:-none}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mpicc -O2 -DWITH_MPI -o "$out/mpi" "$SRC/benchmarks/blocking_latency.c"
for b in "${BUILDS[@]}"; do
  b=$(cd "$b" && pwd)
  cc -O2 -I"$SRC/runtime/include" -o "$out/rr.${b//\//_}" "$SRC/benchmarks/blocking_latency.c" \
    -L"$b/lib" -Wl,-rpath,"$b/lib" -lringrun
done
for round in $(seq "$ROUNDS"); do
  echo "# round $round, load average $(cut -d' ' -f1 /proc/loadavg)"
  for b in "${BUILDS[@]}"; do
    b=$(cd "$b" && pwd)
    # shellcheck disable=SC2086
    "$b/bin/ringrun" -np "$NP" --bind-to "$BIND" "$out/rr.${b//\//_}" "$N" "$W" $SIZES |
      sed -n "s|^\[0\]<stdout>:ringrun |ringrun($b) |p" | tee -a "$out/raw"
  done
  # shellcheck disable=SC2086
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$NP" "$out/mpi" "$N" "$W" $SIZES \
    2>/dev/null | tee -a "$out/raw"
done
echo "# median over $ROUNDS rounds of each round's median and p99 (us)"
for name in $(cut -d' ' -f1 "$out/raw" | sort -u); do
  for s in $SIZES; do
    sel=$(grep -F "$name " "$out/raw" | grep " bytes=$s ") || continue
    printf '%s bytes=%s median_us=%s p99_us=%s\n' "$name" "$s" \
      "$(grep -o 'median_us=[0-9.]*' <<<"$sel" | cut -d= -f2 | median)" \
      "$(grep -o 'p99_us=[0-9.]*' <<<"$sel" | cut -d= -f2 | median)"
  done
done
