#!/usr/bin/env bash
# Launch latency over SSH on the namespace cluster (needs root):
#  1. `ringrun -np 4 -H rr-h1:1,...,rr-h4:1 /bin/true` against `mpirun` over the same four SSH
#     hosts, alternating, ROUNDS times each;
#  2. ringrun's launch time over 1, 2, 4, 8 and 16 hosts (one rank each).
# Brings the cluster up with 16 hosts (scripts/test-cluster.sh up 16) and leaves it up.
#
#   benchmarks/ssh_launch.sh [BUILD_DIR]      (ROUNDS=10 by default; FANOUT for --ssh-fanout)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$SRC/build}
RINGRUN=$BUILD/bin/ringrun
ROUNDS=${ROUNDS:-10}
FANOUT=${FANOUT:-32}
[[ -x $RINGRUN ]] || { echo "no $RINGRUN: build first" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "needs root" >&2; exit 1; }

QUIET=1 "$SRC/scripts/test-cluster.sh" up 16
eval "$("$SRC/scripts/test-cluster.sh" env)"
SSH_OPTS=(-i "$RR_KEY" --ssh-known-hosts "$RR_KNOWN_HOSTS" --ssh-fanout "$FANOUT")

hosts_list() { local n=$1 i out=; for i in $(seq "$n"); do out+="${out:+,}rr-h$i:1"; done; echo "$out"; }

now() { date +%s.%N; }
# time_cmd CMD...: seconds, or fails loudly if the command fails.
time_cmd() {
  local t0 t1
  t0=$(now)
  if ! "$@" >/dev/null 2>"$TMPD/err"; then
    echo "command failed: $*" >&2
    cat "$TMPD/err" >&2
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

H4=$(hosts_list 4)
MPI=(mpirun --allow-run-as-root -np 4 -H "$H4" --mca plm_rsh_agent ssh
     --mca plm_rsh_args "-i $RR_KEY -o UserKnownHostsFile=$RR_KNOWN_HOSTS -o BatchMode=yes"
     --mca oob_tcp_if_include 198.18.0.0/24 --mca btl_tcp_if_include 198.18.0.0/24 /bin/true)
RR=("$RINGRUN" -np 4 -H "$H4" "${SSH_OPTS[@]}" /bin/true)

# Warm-up (page cache, sshd's first fork).
time_cmd "${RR[@]}" >/dev/null
time_cmd "${MPI[@]}" >/dev/null

: >"$TMPD/rr"; : >"$TMPD/mpi"
for _ in $(seq "$ROUNDS"); do
  time_cmd "${RR[@]}" >>"$TMPD/rr"
  time_cmd "${MPI[@]}" >>"$TMPD/mpi"
done
echo "# 4 SSH hosts, /bin/true, $ROUNDS alternating rounds (seconds: median mean min max)"
echo "ringrun  $(stats <"$TMPD/rr")"
echo "mpirun   $(stats <"$TMPD/mpi")"

echo "# ringrun launch time over N hosts, one rank each, fan-out $FANOUT (median mean min max)"
for n in 1 2 4 8 16; do
  hl=$(hosts_list "$n")
  : >"$TMPD/n"
  for _ in $(seq "$ROUNDS"); do
    time_cmd "$RINGRUN" -np "$n" -H "$hl" "${SSH_OPTS[@]}" /bin/true >>"$TMPD/n"
  done
  printf "hosts=%-3d %s\n" "$n" "$(stats <"$TMPD/n")"
done
