#!/usr/bin/env bash
# Elastic soak: N elastic jobs (default 100) on the 4-host test cluster, each hit by random
# faults at a random moment, each checked for its final state and for anything left behind.
#
#   RINGRUN_CLUSTER_ID=K scripts/elastic-soak.sh [-n JOBS] [-s SEED] [-b BUILD_DIR] [-o RESULTS.csv]
#                                                [-k KIND,KIND...] [-t STEPS] [-l LOG_DIR]
#
# Needs root and the cluster up (RINGRUN_CLUSTER_ID=K scripts/test-cluster.sh up 4); it uses only
# that cluster. BUILD_DIR/bin (default build/bin; the BIN_DIR variable names another) holds
# ringrun, ringrun-agent and ringrun-test-elastic-worker; the ranks load libringrun from
# BUILD_DIR/lib (LD_LIBRARY_PATH), so a copy of a build runs its own. Each job is
#   ringrun -np 4 --min-np 2 -H h1:1,h2:1,h3:1,h4:1 ringrun-test-elastic-worker STEPS
# over SSH (tests/integration/elastic_worker.c: every step allreduces 1.0 from each rank and
# checks that the sum is the size; after a failed collective a rank joins the next generation;
# each survivor ends with "done steps=STEPS size=S"). STEPS is 4000 by default (a few seconds).
# ringrun gets --start-timeout 5 (how long a member may take to come to a join once another
# has); ranks get RINGRUN_TIMEOUT_MS=5000 (collective timeout) and HOROVOD_GLOO_TIMEOUT_SECONDS=40
# (how long a join waits for its generation). Once all 4 ranks have joined, the job gets its
# fault after a random 0.3-2.5 s:
#   rank-kill       kill -9 of a random rank
#   agent-kill      kill -9 of a random host's ringrun-agent
#   rank-stop       SIGSTOP of a random rank, never continued
#   rank-stop-cont  SIGSTOP of a random rank, SIGCONT 1-8 s later
#   link-cut        ip link set <prefix>-v<i> down for a random host i, up again once ringrun
#                   has exited (or the bound passed)
#   link-flap       the same link down for 1-4 s only
#   multi           2 or 3 faults (rank-kill or agent-kill) on distinct hosts, 0.2-1.5 s apart;
#                   with 3, one rank remains: fewer than --min-np 2
# Fault kinds are dealt evenly in a shuffled order; -s SEED replays the order, targets and times
# (the machine's timing still varies).
#
# A job passes when ringrun exits within the bound (90 s after the first fault) and either
#   finished: ringrun exited 0, every "done" line says steps=STEPS and size=S where S (>= 2) is
#     the number of done lines, no rank saw a wrong sum, and every worker on a host that no fault
#     touched printed done; or
#   failed: the faults touched 3 of the 4 hosts (one rank left), and ringrun exited non-zero
#     with a line naming the cause (fewer than --min-np, the reset limit, no surviving rank, the
#     elastic timeout); a job that fails while 2 or more hosts were untouched fails the soak;
# and nothing is left 15 s after ringrun's exit (and the link's return): no process in the host
# namespaces but their sshd daemons, no worker with the job's tag (RR_SOAK_TAG) anywhere, no
# listening port or Unix socket in the namespaces, no new ringrun entry in /dev/shm and no memfd
# held by a leftover. "expected" is the outcome that the faults call for (3 faulted hosts:
# failed; otherwise finished); a job that finishes where it was expected to fail (a fault that
# found its rank already leaving) passes and is counted. Prints one line per job and a table;
# exits 1 if any job failed. The CSV (-o) has one
# row per job; -l keeps each job's output (ringrun's and the ranks') as LOG_DIR/job-N.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
SRC=$PWD

JOBS=100
SEED=${SOAK_SEED:-$RANDOM}
BUILD=build
RESULTS=
ONLY=
STEPS=4000
LOGS=
while getopts "n:s:b:o:k:t:l:h" opt; do
  case $opt in
    n) JOBS=$OPTARG ;;
    s) SEED=$OPTARG ;;
    b) BUILD=$OPTARG ;;
    o) RESULTS=$OPTARG ;;
    k) ONLY=$OPTARG ;;
    t) STEPS=$OPTARG ;;
    l) LOGS=$OPTARG ;;
    *) sed -n '2,40p' "$0"; exit 2 ;;
  esac
done
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || { echo "elastic-soak: -n wants a positive number" >&2; exit 2; }
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || { echo "elastic-soak: -t wants a positive number" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "elastic-soak: needs root (network namespaces)"; exit 77; }
BIN=$(cd "${BIN_DIR:-$BUILD/bin}" 2>/dev/null && pwd) ||
  { echo "elastic-soak: no ${BIN_DIR:-$BUILD/bin} (build first)" >&2; exit 2; }
for b in ringrun ringrun-agent ringrun-test-elastic-worker; do
  [[ -x $BIN/$b ]] || { echo "elastic-soak: $BIN/$b missing (build first)" >&2; exit 2; }
done
LIBPATH=()
[[ -d $BIN/../lib ]] && LIBPATH=(-x "LD_LIBRARY_PATH=$(cd "$BIN/../lib" && pwd)")
eval "$("$SRC/scripts/test-cluster.sh" env)" || exit 1
"$SRC/scripts/test-cluster.sh" status >/dev/null ||
  { echo "elastic-soak: the test cluster is not up (RINGRUN_CLUSTER_ID=${RINGRUN_CLUSTER_ID:-} scripts/test-cluster.sh up 4)" >&2; exit 1; }

NP=4
HP=$RR_HOST_PREFIX
HOSTS="${HP}1:1,${HP}2:1,${HP}3:1,${HP}4:1"
KINDS=(rank-kill agent-kill rank-stop rank-stop-cont link-cut link-flap multi)
if [[ -n $ONLY ]]; then IFS=, read -r -a KINDS <<<"$ONLY"; fi
BOUND=90
RANDOM=$SEED
WORK=$(mktemp -d /tmp/ringrun-elastic-soak.XXXXXX)
RESULTS=${RESULTS:-$WORK/results.csv}
JOB_PID=
CUT_LINK=
SKIP_SSHD=

cleanup() {
  [[ -n $CUT_LINK ]] && ip link set "$CUT_LINK" up 2>/dev/null
  [[ -n $JOB_PID ]] && kill -9 "$JOB_PID" 2>/dev/null
  kill_leftovers
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

RANK_COMM=ringrun-test-el  # ringrun-test-elastic-worker, as /proc/PID/comm has it
# shellcheck source=scripts/soak-lib.sh
source "$SRC/scripts/soak-lib.sh"
later_than() { (($(echo "$(now) >= $1" | bc))); }
ranks() {  # live (not zombie) ranks of the job
  local p
  for p in $(tagged); do [[ $(awk '/^State/{print $2}' "/proc/$p/status" 2>/dev/null) == Z ]] || echo "$p"; done
}
host_of() { ip netns identify "$1" 2>/dev/null | sed "s/^${HP}//"; }  # 1..4
worker_of() { tr '\0' '\n' 2>/dev/null <"/proc/$1/environ" | sed -n 's/^RINGRUN_WORKER_ID=//p'; }
# The random draws set variables (pick VAR ITEMS..., rand_s VAR MIN MAX): bash reseeds $RANDOM
# in a subshell, so a draw inside $(...) would not replay with the seed.
pick() {
  local -n _to=$1; shift
  local a=("$@")
  _to=
  ((${#a[@]})) && _to=${a[RANDOM % ${#a[@]}]}
}
rand_s() {
  local -n _to=$1
  local r=$((RANDOM % 1000))
  _to=$(echo "$2 + ($3 - $2) * $r / 1000" | bc -l | xargs printf '%.2f')
}

# One fault of KIND on a host not in FAULTED (set: HOST -> kind); appends to TARGETS.
# Draws its random numbers whether or not the target exists, so that a seed replays.
declare -A FAULTED WORKER_HOST
TARGETS=
fault() {
  local kind=$1 p h w pids=()
  local hosts=()
  for h in 1 2 3 4; do [[ -z ${FAULTED[$h]:-} ]] && hosts+=("$h"); done
  pick h "${hosts[@]}"
  [[ -n $h ]] || return 1
  case $kind in
    rank-kill | rank-stop | rank-stop-cont)
      for p in $(ranks); do [[ $(host_of "$p") == "$h" ]] && pids+=("$p"); done
      ((${#pids[@]})) || return 1
      p=${pids[0]}
      w=$(worker_of "$p")
      if [[ $kind == rank-kill ]]; then kill -9 "$p"; else kill -STOP "$p"; fi
      TARGETS+="${TARGETS:+;}$kind:${HP}$h:worker$w"
      [[ $kind == rank-stop* ]] && STOPPED+=("$p") ;;
    agent-kill)
      mapfile -t pids < <(agents_on "$h")
      ((${#pids[@]})) || return 1
      kill -9 "${pids[@]}"
      TARGETS+="${TARGETS:+;}$kind:${HP}$h" ;;
    link-cut | link-flap)
      CUT_LINK=${RR_LINK_PREFIX}$h SKIP_SSHD=1
      ip link set "$CUT_LINK" down
      TARGETS+="${TARGETS:+;}$kind:${HP}$h" ;;
  esac
  FAULTED[$h]=$kind
}

# The fault kinds, dealt evenly and shuffled.
order=()
for ((i = 0; i < JOBS; i++)); do order+=("${KINDS[i % ${#KINDS[@]}]}"); done
for ((i = JOBS - 1; i > 0; i--)); do
  j=$((RANDOM % (i + 1))); t=${order[i]}; order[i]=${order[j]}; order[j]=$t
done

shm_snapshot >"$WORK/shm.base"
echo "job,fault,targets,delay_s,rc,outcome,ranks_done,exit_s,job_s,procs_left,ports_left,shm_left,expected,as_expected,reason,result" >"$RESULTS"
echo "elastic-soak: $JOBS jobs on ${HP}1-4, $STEPS steps each, seed $SEED, results in $RESULTS"
fails=0
delay='' how='' cont_after='' flap_for='' g=''
for ((n = 1; n <= JOBS; n++)); do
  kind=${order[n - 1]}
  TAG="esoak-$$-$n"
  FAULTED=() WORKER_HOST=() STOPPED=() TARGETS='' CUT_LINK='' SKIP_SSHD=''
  rand_s delay 0.3 2.5
  # The multi fault's plan: 2 or 3 kills on distinct hosts, with the gaps between them.
  nfaults=1 gaps=()
  if [[ $kind == multi ]]; then
    nfaults=$((2 + RANDOM % 2))
    for ((f = 1; f < nfaults; f++)); do rand_s g 0.2 1.5; gaps+=("$g"); done
  fi
  rand_s cont_after 1 8
  rand_s flap_for 1 4
  rc=- outcome=- done_n=0 exit_s=- job_s=- reason='' expected=finished result=''
  t_start=$(now)
  "$BIN/ringrun" -i "$RR_KEY" --ssh-known-hosts "$RR_KNOWN_HOSTS" -np $NP --min-np 2 -H "$HOSTS" \
    -x "RR_SOAK_TAG=$TAG" --start-timeout 5 -x RINGRUN_TIMEOUT_MS=5000 -x HOROVOD_GLOO_TIMEOUT_SECONDS=40 "${LIBPATH[@]}" \
    "$BIN/ringrun-test-elastic-worker" "$STEPS" >"$WORK/job.log" 2>&1 &
  JOB_PID=$!
  started=
  while kill -0 "$JOB_PID" 2>/dev/null && ! later_than "$(echo "$t_start + 60" | bc)"; do
    if (($(grep -c 'joined rank=' "$WORK/job.log") >= NP)); then started=1; break; fi
    sleep 0.05
  done
  if [[ -n $started ]]; then
    for p in $(ranks); do WORKER_HOST[$(worker_of "$p")]=$(host_of "$p"); done
    sleep "$delay"
    t0=$(now)
    case $kind in
      multi)
        for ((f = 0; f < nfaults; f++)); do
          ((f > 0)) && sleep "${gaps[f - 1]}"
          pick how rank-kill agent-kill
          fault "$how" || break
        done ;;
      *) fault "$kind" ;;
    esac
    ((${#FAULTED[@]} >= 3)) && expected=failed
    t_cont=$(echo "$t0 + $cont_after" | bc) t_flap=$(echo "$t0 + $flap_for" | bc)
    t_bound=$(echo "$t0 + $BOUND" | bc)
    while true; do
      if [[ $kind == rank-stop-cont && ${#STOPPED[@]} -gt 0 ]] && later_than "$t_cont"; then
        kill -CONT "${STOPPED[@]}" 2>/dev/null; STOPPED=()
      fi
      if [[ $kind == link-flap && -n $CUT_LINK ]] && later_than "$t_flap"; then
        ip link set "$CUT_LINK" up; CUT_LINK='' SKIP_SSHD=''
      fi
      if ! kill -0 "$JOB_PID" 2>/dev/null; then
        exit_s=$(secs_since "$t0"); job_s=$(secs_since "$t_start")
        { wait "$JOB_PID"; } 2>/dev/null; rc=$?
        break
      fi
      later_than "$t_bound" && break
      sleep 0.1
    done
  else
    result="FAIL (did not start)"
  fi
  # The link back (a cut link stays down until ringrun has exited), then up to 15 s for the
  # job's processes to go.
  [[ -n $CUT_LINK ]] && { ip link set "$CUT_LINK" up; CUT_LINK='' SKIP_SSHD=''; }
  for _ in $(seq 75); do [[ -z $(left_procs) ]] && break; sleep 0.2; done
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
  JOB_PID=
  cp "$WORK/job.log" "$WORK/job-$n.log"
  [[ -n $LOGS ]] && mkdir -p "$LOGS" && cp "$WORK/job.log" "$LOGS/job-$n.log"

  # The outcome.
  log=$WORK/job.log
  done_n=$(grep -c '<stdout>:done steps=' "$log")
  sizes=$(sed -n 's/.*<stdout>:done steps=[0-9]* size=\([0-9]*\).*/\1/p' "$log" | sort -u)
  bad_steps=$(grep '<stdout>:done steps=' "$log" | grep -vc "done steps=$STEPS ")
  wrong=$(grep -c 'wrong sum' "$log")
  # Workers on hosts that no fault touched must have finished.
  missing=
  for w in "${!WORKER_HOST[@]}"; do
    [[ -n ${FAULTED[${WORKER_HOST[$w]}]:-} ]] && continue
    grep -q "^\[$w\]<stdout>:done steps=" "$log" || missing+=" $w"
  done
  cause=$(grep -E '^ringrun: .*(fewer than --min-np|reset limit|no rank of the last generation|survives|elastic timeout)' "$log" | tail -1)
  if [[ $rc == 0 ]]; then
    outcome="finished on $done_n"
    reason=$(grep -E '^ringrun: ' "$log" | tail -1)
    if [[ -z $result ]]; then
      if [[ $sizes != "$done_n" || $done_n -lt 2 || $bad_steps != 0 || $wrong != 0 || -n $missing ]]; then
        result="FAIL (wrong final state: sizes '$(tr '\n' ' ' <<<"$sizes")' done $done_n bad steps $bad_steps wrong sums $wrong unfaulted workers not done:${missing:- none})"
      fi
    fi
  elif [[ $rc == - ]]; then
    outcome=hung; reason="ringrun still running $BOUND s after the fault"
    [[ -z $result ]] && result="FAIL (no exit within $BOUND s)"
  else
    outcome="failed rc $rc"
    reason=${cause:-$(grep -E '^ringrun: ' "$log" | tail -1)}
    [[ -z $result && -z $cause ]] && result="FAIL (no line naming the cause)"
    [[ -z $result && $expected == finished ]] &&
      result="FAIL (failed, though only ${#FAULTED[@]} of 4 hosts were faulted)"
    [[ -z $result && $wrong != 0 ]] && result="FAIL (wrong sum)"
  fi
  [[ -z $result && -z $TARGETS ]] && result="FAIL (fault not delivered)"
  [[ -z $result && $procs$ports$shm != 000 ]] && result="FAIL (left behind)"
  result=${result:-ok}
  as_expected=$([[ ${outcome%% *} == "$expected" ]] && echo yes || echo no)
  [[ $result == ok ]] || fails=$((fails + 1))
  reason=$(tr ',' ';' <<<"$reason" | cut -c1-200)
  printf 'job %3d %-14s %-48s delay %4ss rc %-3s %-16s exit %5ss job %5ss left: %s procs %s ports %s shm; expected %s: %s\n' \
    "$n" "$kind" "${TARGETS:--}" "$delay" "$rc" "$outcome" "$exit_s" "$job_s" "$procs" "$ports" "$shm" "$([[ $as_expected == yes ]] && echo yes || echo "NO ($expected)")" "$result"
  echo "    $reason"
  if [[ $result != ok ]]; then cat "$WORK/left"; grep -v '<stdout>:joined' "$WORK/job-$n.log" | sed 's/^/    | /' | tail -12; fi
  echo "$n,$kind,${TARGETS:--},$delay,$rc,$outcome,$done_n,$exit_s,$job_s,$procs,$ports,$shm,$expected,$as_expected,$reason,$result" >>"$RESULTS"
  sleep 0.5
done

# Table: per fault kind, jobs passed, outcomes, seconds from the first fault to ringrun's exit,
# leftovers, outcomes other than the expected.
echo
echo "| fault | jobs | passed | finished (ranks at the end: jobs) | failed naming the cause | exit s after the fault (median / max) | procs / ports / shm left | outcome as expected |"
echo "|---|---|---|---|---|---|---|---|"
for kind in "${KINDS[@]}" all; do
  awk -F, -v k="$kind" 'NR > 1 && (k == "all" || $2 == k)' "$RESULTS" >"$WORK/rows"
  [[ -s $WORK/rows ]] || continue
  ex=$(median_max 8 "$WORK/rows")
  awk -F, -v k="$kind" -v ex="$ex" '
    {n++; if ($16 == "ok") ok++; p += $10; po += $11; s += $12; if ($14 == "yes") ae++
     if ($5 == "0") {fin++; by[$7]++} else if ($6 ~ /^failed/ && $16 == "ok") fl++}
    END {d = ""; for (r = 4; r >= 0; r--) if (by[r]) d = d (d == "" ? "" : ", ") r ": " by[r]
         printf "| %s | %d | %d/%d | %d (%s) | %d | %s | %d / %d / %d | %d/%d |\n",
           k, n, ok, n, fin, d == "" ? "-" : d, fl, ex, p, po, s, ae, n}' "$WORK/rows"
done
echo
if ((fails)); then echo "elastic-soak: $fails of $JOBS jobs failed"; exit 1; fi
echo "elastic-soak: $JOBS of $JOBS jobs finished with the right state or failed naming the cause; nothing left"
