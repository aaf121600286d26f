#!/usr/bin/env bash
# The launcher's control plane at N hosts, with fake agents (control_plane_bench), and
# `ringrun --dry-run` over a generated hostfile of N hosts. Prints the median over ROUNDS of
# each figure per host count.
#   benchmarks/control_plane.sh [ROUNDS] [BUILD_DIR] [HOSTS...]      (default: 5 build 100 1000)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
rounds=${1:-5}
build=${2:-$here/../build}
shift $(($# < 2 ? $# : 2))
counts=("$@")
[[ $# -gt 0 ]] || counts=(100 1000)
hostfile=$(mktemp)
trap 'rm -f "$hostfile"' EXIT
printf '%-6s %-8s %-8s %-10s %-13s %-15s %-12s\n' hosts wall_s cpu_s maxrss_mb threads_peak \
  threads_steady dry_run_s
for n in "${counts[@]}"; do
  runs=()
  for ((i = 0; i < rounds; i++)); do
    line=$("$build/bin/control_plane_bench" "$n")
    [[ $(field rc <<<"$line") == 0 && $(field agents_rc <<<"$line") == 0 ]] || {
      echo "round failed: $line" >&2
      exit 1
    }
    runs+=("$line")
  done
  for ((h = 0; h < n; h++)); do echo "node$h slots=8"; done >"$hostfile"
  dry=()
  for ((i = 0; i < rounds; i++)); do
    t=$(date +%s%N)
    "$build/bin/ringrun" --dry-run --hostfile "$hostfile" -np $((8 * n)) true >/dev/null
    dry+=("$(awk -v ns=$(($(date +%s%N) - t)) 'BEGIN { printf "%.3f", ns / 1e9 }')")
  done
  # Each round's value, then their median.
  med() { for r in "${runs[@]}"; do field "$1" <<<"$r"; done | median; }
  printf '%-6s %-8s %-8s %-10s %-13s %-15s %-12s\n' "$n" "$(med wall_s)" "$(med cpu_s)" \
    "$(med maxrss_mb)" "$(med threads_peak)" "$(med threads_steady)" \
    "$(printf '%s\n' "${dry[@]}" | median)"
done
