#!/usr/bin/env bash
# Soak: N ringrun jobs (default 100) on the 4-host test cluster, each hit by one random fault at a
# random moment mid-collective, each checked for a prompt end and for anything left behind.
#
#   RINGRUN_CLUSTER_ID=K scripts/soak.sh [-n JOBS] [-s SEED] [-b BUILD_DIR] [-o RESULTS.csv]
#                                        [-k KIND,KIND...]  (only these fault kinds)
#
# Needs root and the cluster up (RINGRUN_CLUSTER_ID=K scripts/test-cluster.sh up 4); it uses only
# that cluster. Each job is ringrun-bench allreduce (checked results) with 8 ranks, 2 per host,
# so both same-host shared-memory pairs and cross-host TCP carry the collectives. Once all
# 8 ranks run, the job gets one fault after a random 0.5-3 s:
#   rank-kill      kill -9 of a random rank
#   agent-kill     kill -9 of a random host's ringrun-agent
#   launcher-kill  kill -9 of ringrun
#   rank-stop      SIGSTOP of a random rank (never continued)
#   link-cut       ip link set <prefix>-v<i> down for a random host i, up again once the job
#                  has ended or the bound has passed. Its end does not wait for the cut host's
#                  sshd session (sshd's own process, stuck on a dead TCP connection); that
#                  must be gone within 5 s of the link's return.
# Fault kinds are dealt evenly (JOBS/5 each) in a shuffled order; -s SEED replays an order.
# Ranks get RINGRUN_TIMEOUT_MS=10000 (collective timeout), so a stopped rank is noticed in 10 s.
#
# After each job it records: seconds from the fault to ringrun's exit and to the end (ringrun
# gone and no job process on any host); processes left on any host (anything in the host
# namespaces but their sshd, plus ranks anywhere); listening TCP ports and Unix sockets left in
# the namespaces and ringrun's in this one; shared memory left (new /dev/shm entries, memfds held
# by leftover processes); and whether the next job starts all its ranks. Leftovers are counted
# at the fault's bound, then killed so the next job starts clean. A job passes when it ends
# within its bound with nothing left and the next job runs. Prints one line per job and a table;
# exits 1 if any job failed. The CSV (-o) has one row per job.
set -uo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD

JOBS=100
SEED=${SOAK_SEED:-$RANDOM}
BUILD=build
RESULTS=
ONLY=
while getopts "n:s:b:o:k:h" opt; do
  case $opt in
    n) JOBS=$OPTARG ;;
    s) SEED=$OPTARG ;;
    b) BUILD=$OPTARG ;;
    o) RESULTS=$OPTARG ;;
    k) ONLY=$OPTARG ;;
    *) sed -n '2,27p' "$0"; exit 2 ;;
  esac
done
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || { echo "soak: -n wants a positive number" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "soak: needs root (network namespaces)"; exit 77; }
BIN=$(cd "$BUILD/bin" 2>/dev/null && pwd) || { echo "soak: no $BUILD/bin (build first)" >&2; exit 2; }
for b in ringrun ringrun-agent ringrun-bench; do
  [[ -x $BIN/$b ]] || { echo "soak: $BIN/$b missing (build first)" >&2; exit 2; }
done
eval "$("$SRC/scripts/test-cluster.sh" env)" || exit 1
"$SRC/scripts/test-cluster.sh" status >/dev/null ||
  { echo "soak: the test cluster is not up (RINGRUN_CLUSTER_ID=${RINGRUN_CLUSTER_ID:-} scripts/test-cluster.sh up 4)" >&2; exit 1; }

NP=8
HP=$RR_HOST_PREFIX
HOSTS="${HP}1:2,${HP}2:2,${HP}3:2,${HP}4:2"
KINDS=(rank-kill agent-kill launcher-kill rank-stop link-cut)
if [[ -n $ONLY ]]; then IFS=, read -r -a KINDS <<<"$ONLY"; fi
declare -A BOUND=([rank-kill]=15 [agent-kill]=25 [launcher-kill]=15 [rank-stop]=30 [link-cut]=30)
RANDOM=$SEED
WORK=$(mktemp -d /tmp/ringrun-soak.XXXXXX)
RESULTS=${RESULTS:-$WORK/results.csv}
JOB_PID=
CUT_LINK=

cleanup() {
  [[ -n $CUT_LINK ]] && ip link set "$CUT_LINK" up 2>/dev/null
  [[ -n $JOB_PID ]] && kill -9 "$JOB_PID" 2>/dev/null
  kill_leftovers
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

RANK_COMM=ringrun-bench
# shellcheck source=scripts/soak-lib.sh
source "$SRC/scripts/soak-lib.sh"
ranks() { tagged; }
start_job() {  # tag: starts the job in the background, sets JOB_PID; 0 once all ranks run
  TAG=$1
  "$BIN/ringrun" -i "$RR_KEY" --ssh-known-hosts "$RR_KNOWN_HOSTS" -np $NP -H "$HOSTS" \
    -x "RR_SOAK_TAG=$TAG" -x RINGRUN_TIMEOUT_MS=10000 \
    "$BIN/ringrun-bench" allreduce -b 64K -e 4M -f 4 -n 200 -w 2 -c 1 -d float -o sum \
    >"$WORK/job.log" 2>&1 &
  JOB_PID=$!
  local start=$SECONDS
  while (($(ranks | wc -l) < NP)); do
    if ! kill -0 "$JOB_PID" 2>/dev/null || ((SECONDS - start > 30)); then return 1; fi
    sleep 0.1
  done
  return 0
}
pick() { local a=("$@"); ((${#a[@]})) && echo "${a[RANDOM % ${#a[@]}]}"; }

# The fault kinds, dealt evenly and shuffled.
order=()
for ((i = 0; i < JOBS; i++)); do order+=("${KINDS[i % ${#KINDS[@]}]}"); done
for ((i = JOBS - 1; i > 0; i--)); do
  j=$((RANDOM % (i + 1))); t=${order[i]}; order[i]=${order[j]}; order[j]=$t
done

shm_snapshot >"$WORK/shm.base"
echo "job,fault,target,delay_s,rc,exit_s,end_s,bound_s,in_bound,procs_left,ports_left,shm_left,next_ok,result" >"$RESULTS"
echo "soak: $JOBS jobs on ${HP}1-4, seed $SEED, results in $RESULTS"
fails=0
started_ok=
start_job "soak-$$-1"; started_ok=$?
for ((n = 1; n <= JOBS; n++)); do
  kind=${order[n - 1]}
  bound=${BOUND[$kind]}
  delay=$(echo "0.5 + 2.5 * $((RANDOM % 1000)) / 1000" | bc -l | xargs printf '%.2f')
  target=- rc=- exit_s=- end_s=- in_bound=no
  if [[ $started_ok != 0 ]]; then
    echo "job $n: did not start all $NP ranks: $(tail -3 "$WORK/job.log" | tr '\n' ' ')"
  else
    sleep "$delay"
    case $kind in
      rank-kill) target=$(pick $(ranks)); [[ -n $target ]] && kill -9 "$target" ;;
      rank-stop) target=$(pick $(ranks)); [[ -n $target ]] && kill -STOP "$target" ;;
      agent-kill) h=$((RANDOM % 4 + 1)); target=$(pick $(agents_on $h)); [[ -n $target ]] && kill -9 "$target"; target="${HP}$h:$target" ;;
      launcher-kill) target=$JOB_PID; kill -9 "$JOB_PID" ;;
      link-cut) h=$((RANDOM % 4 + 1)); CUT_LINK=${RR_LINK_PREFIX}$h; ip link set "$CUT_LINK" down; target=$CUT_LINK ;;
    esac
    t0=$(now)
    [[ $kind == link-cut ]] && SKIP_SSHD=1
    # Until the end (ringrun gone, nothing of the job on any host) or the bound.
    while true; do
      if [[ $exit_s == - ]] && ! kill -0 "$JOB_PID" 2>/dev/null; then
        exit_s=$(secs_since "$t0")
        { wait "$JOB_PID"; } 2>/dev/null; rc=$?
      fi
      if [[ $exit_s != - && -z $(left_procs) ]]; then end_s=$(secs_since "$t0"); break; fi
      (($(echo "$(now) - $t0 >= $bound" | bc))) && break
      sleep 0.2
    done
    [[ $end_s != - ]] && in_bound=yes
  fi
  if [[ -n $CUT_LINK ]]; then
    # Link back: the cut host's sshd sessions must go too (they see the launcher's reset).
    ip link set "$CUT_LINK" up; CUT_LINK=; SKIP_SSHD=
    for _ in $(seq 25); do [[ -z $(left_procs) ]] && break; sleep 0.2; done
  fi
  left=$(left_procs)
  # shellcheck disable=SC2086
  describe_procs $left >"$WORK/left"
  procs=$(grep -c . <<<"$left")
  left_ports >"$WORK/ports"
  ports=$(grep -c . "$WORK/ports")
  sed 's/^/    left: /' "$WORK/ports" >>"$WORK/left"
  shm=$(left_shm)
  kill_leftovers
  [[ $exit_s == - ]] && { kill -9 "$JOB_PID" 2>/dev/null; { wait "$JOB_PID"; } 2>/dev/null; }
  cp "$WORK/job.log" "$WORK/job-$n.log"
  # The next job (or, after the last, one more clean one that must finish) runs.
  sleep 0.5
  if ((n < JOBS)); then
    start_job "soak-$$-$((n + 1))"; started_ok=$?
    next_ok=$([[ $started_ok == 0 ]] && echo yes || echo no)
  else
    TAG="soak-$$-final"
    if timeout 120 "$BIN/ringrun" -i "$RR_KEY" --ssh-known-hosts "$RR_KNOWN_HOSTS" -np $NP -H "$HOSTS" \
         -x "RR_SOAK_TAG=$TAG" "$BIN/ringrun-bench" allreduce -b 1M -e 1M -n 5 -w 1 -c 1 \
         -d float -o sum >"$WORK/final.log" 2>&1; then next_ok=yes; else next_ok=no; fi
    JOB_PID=
  fi
  ok=$([[ $in_bound == yes && $procs == 0 && $ports == 0 && $shm == 0 && $next_ok == yes ]] && echo ok || echo FAIL)
  # A fault that found no target (the job was already over) proves nothing.
  [[ -z $target || $target == *: || $rc == 0 ]] && ok="FAIL (fault not delivered)"
  [[ $ok == ok ]] || fails=$((fails + 1))
  target=${target:--}
  printf 'job %3d %-13s %-22s delay %4ss rc %-3s exit %5ss end %5ss (bound %ss) left: %s procs %s ports %s shm; next %s: %s\n' \
    "$n" "$kind" "$target" "$delay" "$rc" "$exit_s" "$end_s" "$bound" "$procs" "$ports" "$shm" "$next_ok" "$ok"
  if [[ $ok != ok ]]; then cat "$WORK/left"; sed 's/^/    | /' "$WORK/job-$n.log" | tail -8; fi
  echo "$n,$kind,$target,$delay,$rc,$exit_s,$end_s,$bound,$in_bound,$procs,$ports,$shm,$next_ok,$ok" >>"$RESULTS"
done

# Table: per fault kind, jobs, ended in bound, median/max seconds to ringrun's exit and to the
# end, leftovers, next job runs.
echo
echo "| fault | jobs | passed | ended in bound | exit s (median / max) | end s (median / max) | bound s | procs left | ports left | shm left | next job runs |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for kind in "${KINDS[@]}" all; do
  awk -F, -v k="$kind" 'NR > 1 && (k == "all" || $2 == k)' "$RESULTS" >"$WORK/rows"
  [[ -s $WORK/rows ]] || continue
  awk -F, -v k="$kind" -v ex="$(median_max 6 "$WORK/rows")" -v en="$(median_max 7 "$WORK/rows")" -v b="${BOUND[$kind]:-15-30}" '
    {n++; if ($14 == "ok") ok++; if ($9 == "yes") inb++; p += $10; po += $11; s += $12; if ($13 == "yes") nx++}
    END {printf "| %s | %d | %d/%d | %d/%d | %s | %s | %s | %d | %d | %d | %d/%d |\n", k, n, ok, n, inb, n, ex, en, b, p, po, s, nx, n}' "$WORK/rows"
done
echo
if ((fails)); then echo "soak: $fails of $JOBS jobs failed"; exit 1; fi
echo "soak: $JOBS of $JOBS jobs ended within their bound, nothing left, the next job ran"
