#!/usr/bin/env bash
# Launch at scale over SSH on the namespace cluster (needs root):
#  1. launch + init + first allreduce on 16 hosts x 2 ranks: `ringrun ... ringrun-bench allreduce`
#     (4 bytes, one warm-up and one timed call) against `mpirun ... mpi_bench 4 4 1` (the
#     anchors' Open MPI program: MPI_Init, the same two allreduces, MPI_Finalize), over the same
#     hosts, alternating, ROUNDS times each;
#  2. the same ringrun command over HOSTS hosts x 2 ranks (32 by default), with the launcher's CPU
#     time, peak memory and peak thread count, and its threads while every rank of a job over
#     those hosts runs (the agents started).
# Brings the cluster up with HOSTS hosts (scripts/test-cluster.sh up) and leaves it up.
#
#   benchmarks/ssh_scale.sh [BUILD_DIR]    (ROUNDS=5, HOSTS=32, FANOUT=32 by default)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$SRC/build}
RINGRUN=$BUILD/bin/ringrun
BENCH=$BUILD/bin/ringrun-bench
ROUNDS=${ROUNDS:-5}
HOSTS=${HOSTS:-32}
FANOUT=${FANOUT:-32}
ANCHORS=${ANCHORS_BUILD:-/tmp/ringrun-anchors}
[[ -x $RINGRUN && -x $BENCH ]] || { echo "no $RINGRUN or $BENCH: build first" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "needs root" >&2; exit 1; }
(( HOSTS >= 16 )) || { echo "HOSTS must be at least 16" >&2; exit 2; }
[[ -x $ANCHORS/mpi_bench ]] || "$SRC/../shared/anchors/run.sh" build >/dev/null

QUIET=1 "$SRC/scripts/test-cluster.sh" up "$HOSTS"
eval "$("$SRC/scripts/test-cluster.sh" env)"
SSH_OPTS=(-i "$RR_KEY" --ssh-known-hosts "$RR_KNOWN_HOSTS" --ssh-fanout "$FANOUT")

hosts_list() { local n=$1 i out=; for i in $(seq "$n"); do out+="${out:+,}rr-h$i:2"; done; echo "$out"; }

now() { date +%s.%N; }
# time_cmd CMD...: seconds, or fails loudly if the command fails.
time_cmd() {
  local t0 t1
  t0=$(now)
  if ! "$@" >/dev/null 2>"$TMPD/err"; then
    echo "command failed: $*" >&2
    tail -20 "$TMPD/err" >&2
    exit 1
  fi
  t1=$(now)
  echo "$t1 - $t0" | bc -l
}
stats() {  # reads numbers, prints "median mean min max"
  sort -g | awk '{a[NR]=$1; s+=$1} END {
    m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2;
    printf "%.3f %.3f %.3f %.3f\n", m, s/NR, a[1], a[NR] }'
}

TMPD=$(mktemp -d)
trap 'rm -rf "$TMPD"' EXIT

rr_cmd() {  # HOSTS
  echo "$RINGRUN" -np $(($1 * 2)) -H "$(hosts_list "$1")" "${SSH_OPTS[@]}" \
    "$BENCH" allreduce -b 4 -e 4 -n 1 -w 1 -c 0
}
H16=$(hosts_list 16)
MPI=(mpirun --allow-run-as-root -np 32 -H "$H16" --mca plm_rsh_agent ssh
     --mca plm_rsh_args "-i $RR_KEY -o UserKnownHostsFile=$RR_KNOWN_HOSTS -o BatchMode=yes"
     --mca oob_tcp_if_include 198.18.0.0/24 --mca btl_tcp_if_include 198.18.0.0/24
     --mca btl tcp,self "$ANCHORS/mpi_bench" 4 4 1)
read -r -a RR16 <<<"$(rr_cmd 16)"

# Warm-up (page cache, sshd's first fork on every host).
time_cmd "${RR16[@]}" >/dev/null
time_cmd "${MPI[@]}" >/dev/null

: >"$TMPD/rr"; : >"$TMPD/mpi"
for _ in $(seq "$ROUNDS"); do
  time_cmd "${RR16[@]}" >>"$TMPD/rr"
  time_cmd "${MPI[@]}" >>"$TMPD/mpi"
done
echo "# 16 SSH hosts x 2 ranks: launch + init + first allreduce, $ROUNDS alternating rounds (seconds: median mean min max)"
echo "ringrun  $(stats <"$TMPD/rr")"
echo "mpirun   $(stats <"$TMPD/mpi")"

read -r -a RRN <<<"$(rr_cmd "$HOSTS")"
: >"$TMPD/n"
for _ in $(seq "$ROUNDS"); do time_cmd "${RRN[@]}" >>"$TMPD/n"; done
echo "# $HOSTS SSH hosts x 2 ranks, fan-out $FANOUT: launch + init + first allreduce (seconds: median mean min max)"
echo "ringrun  $(stats <"$TMPD/n")"
# The launcher's own cost over HOSTS hosts: CPU seconds, peak RSS, peak threads (sampled).
"${RRN[@]}" >/dev/null 2>"$TMPD/err" &
pid=$!
peak=0
while kill -0 "$pid" 2>/dev/null; do
  t=$(awk '/^Threads:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
  (( ${t:-0} > peak )) && peak=$t
  sleep 0.02
done
wait "$pid" || { tail -20 "$TMPD/err" >&2; exit 1; }
/usr/bin/time -f "%U %S %M" -o "$TMPD/time" "${RRN[@]}" >/dev/null 2>"$TMPD/err" ||
  { tail -20 "$TMPD/err" >&2; exit 1; }
read -r user sys rss <"$TMPD/time"
# Its threads while every rank runs (the agents started): ranks that print "up" and sleep.
"$RINGRUN" -np $((HOSTS * 2)) -H "$(hosts_list "$HOSTS")" "${SSH_OPTS[@]}" \
  sh -c 'echo up; sleep 3' >"$TMPD/up" 2>"$TMPD/err" &
pid=$!
running=0
for _ in $(seq 600); do
  if (( $(grep -c 'up$' "$TMPD/up") == HOSTS * 2 )); then
    running=$(awk '/^Threads:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    break
  fi
  sleep 0.02
done
wait "$pid" || { tail -20 "$TMPD/err" >&2; exit 1; }
printf "launcher over %d hosts: cpu_s=%.2f (user %.2f sys %.2f) max_rss_MB=%.1f peak_threads=%d running_threads=%d\n" \
  "$HOSTS" "$(echo "$user + $sys" | bc -l)" "$user" "$sys" "$(echo "$rss / 1024" | bc -l)" "$peak" "$running"
