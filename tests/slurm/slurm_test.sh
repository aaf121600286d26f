#!/bin/bash
# ringrun inside real Slurm 22.05 jobs on scripts/test-slurm-cluster.sh (3 nodes): slurm_test.sh CASE.
#   placement  salloc, no host list: hosts, slots (4,2,1), rank environment without the agent
#              step's SLURM_PROCID/LOCALID/NTASKS/..., output tags, --dry-run's source and srun line
#   sbatch     a batch job: ringrun from the batch script on the first node, output, a failing
#              rank's exit code becomes the job's; a one-node batch job
#   secret     the secret on no command line (srun's, the agents', scontrol show step's) and not in
#              the agents' /proc environ once started
#   bench      libringrun's collectives across the nodes (ringrun-bench, checked results)
#   rankfail   a rank fails: the job ends with its code; then a second job in the same allocation
#   restarts   --max-restarts: a failing rank restarts the job, a fresh agents step per attempt
#   scancelstep / scancel the agents' step / scancel the job
#   scanceljob
#   sigint / sigterm   Ctrl-C (SIGINT) / SIGTERM to ringrun: 130 / 143
#   kill9      kill -9 of ringrun: the agents notice, nothing is left; a second job runs
#   agentkill  kill -9 of one node's agent: the job fails naming it; a second job runs
#   srunpmix   libringrun under `srun --mpi=pmix` without ringrun (PMIx rendezvous): shape, an
#              allreduce, a rank killed after the join named by the others, srun --mpi=none refused
#   timelimit  the allocation's time limit with --signal=USR1@50: ranks see SIGUSR1, then
#              everything ends
#   elastic    -np 3 --min-np 2 on 3 nodes (salloc --no-kill), examples/elastic's worker 2 (on
#              node 3) killed with SIGKILL at step 23: node 3 is blacklisted and its own agent
#              step ends while the job goes on, the survivors finish on 2 ranks with --reference's
#              final parameters to 1e-12; --dry-run shows a step per host. Then node 2's
#              agent killed with SIGKILL after epoch 1 (a lost node): the same ending
#   nodefail   the elastic job loses node 2 (its slurmd and the job's processes there killed with
#              SIGKILL, a crash): ringrun leaves it out, Slurm marks it DOWN while the job runs
#              on (--no-kill), the survivors finish with --reference's parameters; node 2 returns
# Each fault case checks that it ends in bounded time, that no tagged process (agent or rank)
# is left on any node, and that squeue -s shows no ringrun-agents step.
source "$(dirname "$0")/../cluster/lib.sh"
eval "$("$SRC_DIR/scripts/test-slurm-cluster.sh" env)"
export SLURM_CONF
sinfo -h >/dev/null 2>&1 || { echo "FAIL: the Slurm test cluster is not up"; exit 1; }
CASE=${1:?usage: slurm_test.sh CASE}
TAG="rr-slurm-$CASE-$$-$RANDOM"
export RR_TEST_TAG=$TAG
HP=$RR_HOST_PREFIX
RINGRUN=$BIN_DIR/ringrun
PY=/usr/bin/python3
PYDIR=$(cd "$BIN_DIR/../python" && pwd)
EX=$SRC_DIR/examples/elastic/pytorch_synthetic_elastic.py

tagged() { pids_with_env "RR_TEST_TAG=$TAG"; }
# Steps named ringrun-agents of job $1 still known to Slurm.
agent_steps() { squeue -h -s -j "$1" -o '%i %j' 2>/dev/null | awk '$2 == "ringrun-agents"'; }
# The pid of this test's agent on node $1.
agent_on() {
  local p
  for p in $(tagged); do
    tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q "ringrun-agent --launcher" || continue
    tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "SLURMD_NODENAME=$1" && echo "$p"
  done
}
# Waits until every node is idle again (nodes pass through COMPLETING after a job).
wait_nodes_idle() {
  local start=$SECONDS
  while ((SECONDS - start < 60)); do
    [[ -z $(sinfo -h -N -o '%T' | grep -v '^idle$') ]] && return 0
    sleep 0.3
  done
  fail "nodes not idle after 60 s: $(sinfo -h -N -o '%N %T' | tr '\n' ' ')"
}
# Waits up to $1 s until file $2 has $3 lines matching $4.
wait_lines() {
  local start=$SECONDS
  while ((SECONDS - start < $1)); do
    local n
    n=$(grep -c -- "$4" "$2" 2>/dev/null)
    ((${n:-0} >= $3)) && return 0
    sleep 0.1
  done
  return 1
}
cleanup_hooks+=("scancel -n rr-test-$$ >/dev/null 2>&1")

# Starts, in the background, an allocation of 3 nodes x 2 tasks whose shell runs a ringrun job of
# sleeping ranks (tagged), records ringrun's pid, and after it ends prints "first rc=N", then
# runs a second ringrun job (unless $2 is "once") and prints "second rc=N".
# Sets ALLOC_PID, LOG, JOB (the Slurm job id) once the 6 ranks run.
start_fault_job() {  # extra salloc args
  LOG=$TMP/alloc.log
  cat >"$TMP/shell.sh" <<EOF
echo "job=\$SLURM_JOB_ID"
$RINGRUN --grace-period 2 bash -c 'trap "echo got-\$RINGRUN_RANK-TERM; exit 143" TERM; trap "echo got-\$RINGRUN_RANK-USR1" USR1; echo started-\$RINGRUN_RANK; while :; do sleep 0.2; done' &
echo \$! >"$TMP/ringrun.pid"
wait \$!
echo "first rc=\$?"
$RINGRUN hostname
echo "second rc=\$?"
EOF
  # shellcheck disable=SC2086
  salloc -J "rr-test-$$" -N3 --ntasks-per-node=2 $1 bash "$TMP/shell.sh" >"$LOG" 2>&1 &
  ALLOC_PID=$!
  cleanup_hooks+=("kill -9 $ALLOC_PID 2>/dev/null")
  if ! wait_lines 30 "$LOG" 6 "started-"; then fail "the ranks did not start:"; cat "$LOG"; finish; fi
  JOB=$(sed -n 's/^job=//p' "$LOG" | head -1)
  RR_PID=$(cat "$TMP/ringrun.pid")
}
# Waits up to $1 s for "first rc=" in the log; sets FIRST_RC and FIRST_SECS.
wait_first() {
  local start=$SECONDS
  wait_lines "$1" "$LOG" 1 "first rc=" || true
  FIRST_SECS=$((SECONDS - start))
  FIRST_RC=$(sed -n 's/^first rc=//p' "$LOG")
}
# Nothing of the first job is left: no tagged process on any node within $1 s (the second job
# is untagged), and no ringrun-agents step of it.
expect_nothing_left() {
  if wait_gone "$1" tagged; then pass "no agent or rank left on any node"; else
    fail "processes left: $(tagged | tr '\n' ' ')"; ps -o pid,args -p "$(tagged | tr '\n' ',' | sed 's/,$//')"; fi
}
expect_second_job() {
  if wait_lines 60 "$LOG" 1 "second rc=0"; then pass "the allocation ran a second job";
  else fail "no second job:"; cat "$LOG"; fi
  wait "$ALLOC_PID" 2>/dev/null
  wait_gone 10 agent_steps "$JOB" || fail "ringrun-agents steps left: $(agent_steps "$JOB")"
}

# The elastic example's final parameters on one process (REF), for the elastic cases.
elastic_reference() {
  $PY -c 'import torch' 2>/dev/null || { echo "SKIP: needs Debian's python3-torch"; exit 77; }
  LOG=$TMP/alloc.log
  REF=$(timeout 60 env PYTHONPATH="$PYDIR" $PY "$EX" --reference 2>&1)
}
# Starts, in the background, `-np 3 --min-np 2` of the elastic example (extra arguments: "$@")
# in an allocation of 3 nodes submitted with --no-kill; sets ALLOC_PID and start.
start_elastic_job() {
  start=$SECONDS
  salloc -J "rr-test-$$" --no-kill -N3 --ntasks-per-node=1 bash -c "echo job=\$SLURM_JOB_ID; \
    $RINGRUN -np 3 --min-np 2 -x PYTHONPATH=$PYDIR -x OMP_NUM_THREADS=1 $PY $EX --step-delay 0.1 $*; \
    echo first rc=\$?" >"$LOG" 2>&1 &
  ALLOC_PID=$!
  cleanup_hooks+=("kill -9 $ALLOC_PID 2>/dev/null")
}
# Waits up to $2 s (default 90) for the job; it must finish on 2 ranks with --reference's final
# parameters, then leave no step and no process. $1: what the job was.
end_elastic_job() {
  wait_first "${2:-90}"
  OUT=$(cat "$LOG")
  [[ $FIRST_RC == 0 ]] && pass "$1: the job exits 0 ($((SECONDS - start)) s)" || { fail "$1: rc='$FIRST_RC'"; echo "$OUT"; }
  expect_in "$OUT" "epoch 5 done on 2 ranks" "$1: the survivors finished on 2 ranks"
  if d=$($PY "$SRC_DIR/examples/elastic/compare_final.py" <(echo "$OUT") <(echo "$REF") 2>&1); then
    pass "$1: final parameters equal --reference's (max abs difference $d)"
  else fail "$1: final parameters differ from --reference: $d"; fi
  wait "$ALLOC_PID" 2>/dev/null
  JOB=$(sed -n 's/^job=//p' "$LOG" | head -1)
  wait_gone 15 agent_steps "$JOB" || fail "$1: ringrun-agents steps left: $(agent_steps "$JOB")"
  expect_nothing_left 15
}

case $CASE in
placement)
  out=$(salloc -J "rr-test-$$" -N3 -n7 "$RINGRUN" --dry-run true 2>&1)
  expect_in "$out" "hosts: Slurm job" "--dry-run names the source"
  expect_in "$out" "SLURM_TASKS_PER_NODE=4,2,1" "--dry-run shows the task counts"
  expect_in "$out" "agents: one srun step: srun --nodes=3 --ntasks=3 --ntasks-per-node=1" "--dry-run prints srun"
  out=$(salloc -J "rr-test-$$" -N3 -n7 "$RINGRUN" bash -c \
    'echo "r=$RINGRUN_RANK h=$(hostname) l=$RINGRUN_LOCAL_RANK ls=$RINGRUN_LOCAL_SIZE n=$RINGRUN_SIZE job=${SLURM_JOB_ID:-none} procid=${SLURM_PROCID-unset} localid=${SLURM_LOCALID-unset} ntasks=${SLURM_NTASKS-unset} nodeid=${SLURM_NODEID-unset} step=${SLURM_STEP_ID-unset} node=${SLURMD_NODENAME-unset} gtids=${SLURM_GTIDS-unset} agentsecret=${RINGRUN_AGENT_SECRET-unset}"; echo "err-$RINGRUN_RANK" >&2' 2>&1)
  rc=$?
  [[ $rc == 0 ]] && pass "exit code 0" || fail "exit code $rc: $out"
  for r in 0 1 2 3; do expect_in "$out" "[$r]<stdout>:r=$r h=${HP}1 l=$r ls=4 n=7" "rank $r on ${HP}1"; done
  for r in 4 5; do expect_in "$out" "[$r]<stdout>:r=$r h=${HP}2 l=$((r - 4)) ls=2 n=7" "rank $r on ${HP}2"; done
  expect_in "$out" "[6]<stdout>:r=6 h=${HP}3 l=0 ls=1 n=7" "rank 6 on ${HP}3"
  expect_in "$out" "[6]<stderr>:err-6" "stderr tagged"
  [[ $(grep -c "procid=unset localid=unset ntasks=unset nodeid=unset step=unset node=unset gtids=unset agentsecret=unset" <<<"$out") == 7 ]] &&
    pass "no rank sees the agent step's Slurm task variables" || { fail "Slurm task variables leaked:"; echo "$out"; }
  [[ $(grep -c "job=[0-9]" <<<"$out") == 7 ]] && pass "ranks see SLURM_JOB_ID" || fail "SLURM_JOB_ID missing"
  # -H still wins; the job's nodes then start through srun too.
  out=$(salloc -J "rr-test-$$" -N3 -n3 "$RINGRUN" -H "${HP}2:2" hostname 2>&1)
  expect_in "$out" "[1]<stdout>:${HP}2" "-H wins over the allocation"
  # A malformed allocation variable: exit 2, nothing started.
  out=$(SLURM_JOB_ID=1 SLURM_JOB_NODELIST="${HP}[1-x]" SLURM_TASKS_PER_NODE=1 "$RINGRUN" true 2>&1)
  rc=$?
  [[ $rc == 2 ]] && pass "malformed SLURM_JOB_NODELIST exits 2" || fail "rc $rc"
  expect_in "$out" "SLURM_JOB_NODELIST=${HP}[1-x]" "the error names the variable"
  expect_in "$out" "'1-x'" "the error names the bad token"
  ;;
sbatch)
  cat >"$TMP/job.sh" <<EOF
#!/bin/bash
$RINGRUN bash -c 'echo "r=\$RINGRUN_RANK h=\$(hostname) procid=\${SLURM_PROCID-unset} ntasks=\${SLURM_NTASKS-unset}"; [[ \$RINGRUN_RANK == 4 ]] && { sleep 2; echo bad-rank >&2; exit 7; }; sleep 30'
echo "ringrun rc=\$?"
exit 7
EOF
  start=$SECONDS
  sbatch -J "rr-test-$$" --wait -N3 --ntasks-per-node=2 -o "$TMP/job.out" "$TMP/job.sh" >/dev/null 2>&1
  rc=$?
  out=$(cat "$TMP/job.out")
  [[ $rc == 7 ]] && pass "sbatch --wait: the job's exit code is the failing rank's" || fail "sbatch rc $rc"
  ((SECONDS - start < 25)) && pass "the job ended at the failure ($((SECONDS - start)) s)" || fail "took $((SECONDS - start)) s"
  expect_in "$out" "ringrun rc=7" "ringrun exits with the rank's code"
  expect_in "$out" "rank 4 on host ${HP}3 exited with code 7" "the failure is named"
  expect_in "$out" "[4]<stderr>:bad-rank" "its stderr is shown"
  for r in 0 1; do expect_in "$out" "[$r]<stdout>:r=$r h=${HP}1 procid=unset ntasks=unset" "rank $r on the batch node"; done
  expect_in "$out" "[5]<stdout>:r=5 h=${HP}3" "rank 5 on ${HP}3"
  expect_nothing_left 15
  # One node: the launcher's own node, reached on 127.0.0.1, still through srun.
  sbatch -J "rr-test-$$" --wait -N1 -n2 -o "$TMP/one.out" --wrap "$RINGRUN bash -c 'echo r=\$RINGRUN_RANK h=\$(hostname) step=\${SLURM_STEP_ID-unset}'" >/dev/null 2>&1
  rc=$?
  out=$(cat "$TMP/one.out")
  [[ $rc == 0 ]] && pass "a one-node batch job" || fail "one-node sbatch rc $rc: $out"
  expect_in "$out" "[1]<stdout>:r=1 h=${HP}1 step=unset" "both ranks on the batch node"
  ;;
secret)
  start_fault_job "" once
  secret=
  for p in $(tagged); do
    [[ -z $secret ]] && secret=$(tr '\0' '\n' <"/proc/$p/environ" | sed -n 's/^RINGRUN_SECRET=//p')
  done
  [[ ${#secret} -ge 32 ]] && pass "found the job secret in a rank" || fail "no secret found"
  step=$(agent_steps "$JOB" | awk '{print $1}')
  [[ -n $step ]] && pass "the agents run in step $step" || fail "no ringrun-agents step"
  shown=$(scontrol show step "$step" 2>&1; squeue -s -j "$JOB" -o '%all' 2>&1)
  expect_not_in "$shown" "$secret" "scontrol/squeue do not show the secret"
  leaks=0
  for p in /proc/[0-9]*; do
    c=$( { tr "\\0" " " <"$p/cmdline"; } 2>/dev/null)
    if [[ $c == *"$secret"* ]]; then leaks=1; echo "    cmdline of ${p#/proc/}: $c"; fi
  done
  ((leaks == 0)) && pass "the secret is on no command line" || fail "the secret is on a command line"
  agents=$(for p in $(tagged); do [[ $( { tr '\0' '\n' <"/proc/$p/cmdline"; } 2>/dev/null | head -1) == */ringrun-agent ]] && echo "$p"; done)
  [[ $(wc -w <<<"$agents") == 3 ]] && pass "3 agents" || fail "agents: $agents"
  for p in $agents; do
    e=$(tr '\0' '\n' <"/proc/$p/environ")
    [[ $e == *"$secret"* ]] && fail "agent $p still shows the secret in /proc/$p/environ"
  done
  kill -INT "$RR_PID"
  wait_first 20
  ;;
bench)
  out=$(salloc -J "rr-test-$$" -N3 --ntasks-per-node=1 "$RINGRUN" "$BIN_DIR/ringrun-bench" allreduce -b 1K -e 1M -f 32 -n 3 -w 1 -c 1 -d float -o sum 2>&1)
  rc=$?
  [[ $rc == 0 ]] && pass "allreduce across 3 nodes" || { fail "allreduce rc $rc"; echo "$out"; }
  out=$(salloc -J "rr-test-$$" -N3 --ntasks-per-node=2 "$RINGRUN" "$BIN_DIR/ringrun-bench" allgather -b 1K -e 64K -f 8 -n 3 -w 1 -c 1 -d int32 -o sum 2>&1)
  rc=$?
  [[ $rc == 0 ]] && pass "allgather across 3 nodes x 2" || { fail "allgather rc $rc"; echo "$out"; }
  ;;
rankfail)
  LOG=$TMP/alloc.log
  out=$(salloc -J "rr-test-$$" -N3 --ntasks-per-node=2 bash -c "$RINGRUN bash -c 'trap \"exit 143\" TERM; [[ \$RINGRUN_RANK == 5 ]] && exit 9; while :; do sleep 0.2; done'; echo first rc=\$?; $RINGRUN hostname; echo second rc=\$?" 2>&1)
  expect_in "$out" "first rc=9" "the job ends with the rank's code"
  expect_in "$out" "rank 5 on host ${HP}3 exited with code 9" "the rank is named"
  expect_in "$out" "second rc=0" "the allocation ran a second job"
  expect_nothing_left 10
  ;;
restarts)
  # --max-restarts under Slurm: each attempt is a fresh ringrun-agents step in the allocation;
  # rank 5 (on host 3) fails in attempts 0 and 1, attempt 2 succeeds.
  out=$(salloc -J "rr-test-$$" -N3 --ntasks-per-node=2 bash -c "$RINGRUN --grace-period 1 --max-restarts 2 bash -c 'trap \"exit 143\" TERM; echo attempt \$RINGRUN_RESTART_COUNT rank \$RINGRUN_RANK on \$(hostname); if [[ \$RINGRUN_RESTART_COUNT -lt 2 ]]; then [[ \$RINGRUN_RANK == 5 ]] && exit 9; while :; do sleep 0.2; done; fi'; echo first rc=\$?" 2>&1)
  expect_in "$out" "first rc=0" "the third attempt succeeds"
  expect_in "$out" "restarting the job (attempt 2 of 3) after rank 5 on host ${HP}3 exited with code 9" "the first restart is named"
  expect_in "$out" "restarting the job (attempt 3 of 3) after rank 5 on host ${HP}3 exited with code 9" "the second restart is named"
  expect_in "$out" "[5]<stdout>:attempt 2 rank 5 on ${HP}3" "rank 5 ran its third attempt on its node"
  expect_nothing_left 10
  ;;
scancelstep)
  start_fault_job ""
  step=$(agent_steps "$JOB" | awk '{print $1}')
  scancel "$step"
  wait_first 30
  [[ -n $FIRST_RC && $FIRST_RC != 0 ]] && pass "ringrun ended ($FIRST_RC) in $FIRST_SECS s" || { fail "ringrun: '$FIRST_RC'"; cat "$LOG"; }
  expect_nothing_left 15
  expect_second_job
  ;;
scanceljob)
  start_fault_job ""
  scancel "$JOB"
  start=$SECONDS
  while kill -0 "$ALLOC_PID" 2>/dev/null && ((SECONDS - start < 30)); do sleep 0.1; done
  kill -0 "$ALLOC_PID" 2>/dev/null && fail "salloc still running 30 s after scancel" || pass "the allocation ended in $((SECONDS - start)) s"
  expect_nothing_left 15
  wait_gone 15 agent_steps "$JOB" || fail "steps left"
  ;;
sigint | sigterm)
  start_fault_job ""
  sig=${CASE#sig}
  kill -"${sig^^}" "$RR_PID"
  wait_first 20
  want=$([[ $sig == int ]] && echo 130 || echo 143)
  [[ $FIRST_RC == "$want" ]] && pass "ringrun exits $want in $FIRST_SECS s" || { fail "rc '$FIRST_RC' (want $want)"; cat "$LOG"; }
  [[ $(grep -c "got-.-TERM" "$LOG") -ge 6 || $sig == int ]] && pass "ranks got SIGTERM" || fail "ranks did not see SIGTERM"
  expect_nothing_left 15
  expect_second_job
  ;;
kill9)
  start_fault_job ""
  kill -9 "$RR_PID"
  wait_first 5
  expect_nothing_left 20
  expect_second_job
  ;;
agentkill)
  start_fault_job ""
  victim=$(agent_on "${HP}2")
  [[ -n $victim ]] || { fail "no agent on ${HP}2"; finish; }
  kill -9 "$victim"
  wait_first 30
  [[ -n $FIRST_RC && $FIRST_RC != 0 ]] && pass "ringrun ended ($FIRST_RC) in $FIRST_SECS s" || { fail "ringrun: '$FIRST_RC'"; cat "$LOG"; }
  expect_in "$(cat "$LOG")" "${HP}2" "the failure names ${HP}2"
  expect_nothing_left 15
  expect_second_job
  ;;
timelimit)
  start_fault_job "-t 1 --signal=USR1@50"
  start=$SECONDS
  # Slurm checks time limits about every 30 s: the job ends 60-100 s after it started.
  while kill -0 "$ALLOC_PID" 2>/dev/null && ((SECONDS - start < 150)); do sleep 0.5; done
  kill -0 "$ALLOC_PID" 2>/dev/null && fail "the allocation outlived its time limit by far" || pass "the allocation ended at its time limit ($((SECONDS - start)) s after the ranks started)"
  [[ $(grep -c "got-.-USR1" "$LOG") -ge 6 ]] && pass "every rank got --signal's SIGUSR1" || { fail "SIGUSR1 did not reach every rank"; cat "$LOG"; }
  expect_nothing_left 15
  wait_gone 15 agent_steps "$JOB" || fail "steps left"
  ;;
elastic)
  elastic_reference
  out=$(salloc -J "rr-test-$$" -N3 --ntasks-per-node=1 "$RINGRUN" --min-np 2 --dry-run true 2>&1)
  expect_in "$out" "agents: one srun step per host (an elastic job), the first: srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --nodelist=${HP}1 " \
    "--dry-run: a step per host"
  # Worker 2 (on node 3) kills itself at step 23.
  start_elastic_job --kill-worker 2 --kill-at 23
  if wait_lines 90 "$LOG" 1 "generation 2: "; then
    JOB=$(sed -n 's/^job=//p' "$LOG" | head -1)
    # Node 3's step ends while the other two run on.
    for _ in $(seq 100); do
      [[ $(agent_steps "$JOB" | wc -l) == 2 ]] && break
      sleep 0.1
    done
    n=$(agent_steps "$JOB" | wc -l)
    ((n == 2)) && pass "node 3's agent step ended, the other two run on" || fail "$n agent steps after the reset"
  else fail "no reset line"; fi
  end_elastic_job "a rank killed"
  expect_in "$OUT" "ringrun: rank 2 (worker 2) on host ${HP}3 was killed by SIGKILL (signal 9); host ${HP}3 is blacklisted" \
    "the reset line names worker 2, its node and the signal"
  expect_in "$OUT" "generation 2: 2 ranks (was 3), reset 1" "generation 2 has the 2 survivors"
  # A lost node: node 2's agent killed with SIGKILL (its ranks die with it) after epoch 1.
  start_elastic_job
  wait_lines 90 "$LOG" 1 "epoch 1 done" || fail "no epoch 1"
  victim=$(agent_on "${HP}2")
  [[ -n $victim ]] && kill -9 "$victim" || fail "no agent on ${HP}2"
  end_elastic_job "a lost node"
  expect_in "$OUT" "host ${HP}2 is blacklisted; generation 2: 2 ranks (was 3), reset 1" "node 2 is left out"
  ;;
nodefail)
  # Node 2 fails mid-training: its slurmd and every process of the job there (slurmstepd, the
  # agent, the rank) killed with SIGKILL at once, as a crash would leave it; only the SSH test
  # cluster's sshd stays in its namespace. Slurm marks the node DOWN once it has not answered
  # for SlurmdTimeout (30 s here); the job, submitted with --no-kill, keeps its allocation and
  # its other steps through that, and ringrun finishes on the 2 others. 0.7 s per step, so that
  # the job outlives the node's DOWN. Then node 2's slurmd starts again and the node returns.
  elastic_reference
  node=${HP}2
  slurmd_pid=$(cat "$RR_SLURM_DIR/run/slurmd-$node.pid" 2>/dev/null)
  [[ -n $slurmd_pid ]] && kill -0 "$slurmd_pid" 2>/dev/null || { fail "no slurmd on $node"; finish; }
  cleanup_hooks+=("QUIET=1 $SRC_DIR/scripts/test-slurm-cluster.sh up 3 >/dev/null 2>&1")
  start_elastic_job --step-delay 0.7
  wait_lines 90 "$LOG" 1 "epoch 1 done" || { fail "no epoch 1"; cat "$LOG"; finish; }
  killed=()
  for p in $(ip netns pids "$node"); do
    [[ $(cat "/proc/$p/comm" 2>/dev/null) == sshd ]] || killed+=("$p")
  done
  kill -9 "${killed[@]}" 2>/dev/null
  crash=$SECONDS
  # Running (not a zombie waiting for its reaper) among the killed.
  running() { local p; for p in "${killed[@]}"; do
    [[ $(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -c1) =~ ^[^Z]$ ]] && cat "/proc/$p/comm"; done; }
  wait_gone 5 running && pass "node 2's slurmd, slurmstepd, agent and rank killed (${#killed[@]} processes)" ||
    fail "still running on $node: $(running | tr '\n' ' ')"
  if wait_lines 30 "$LOG" 1 "host $node is blacklisted; generation 2: 2 ranks (was 3), reset 1"; then
    pass "ringrun leaves node 2 out ($((SECONDS - crash)) s after the crash)"
  else fail "no reset that leaves node 2 out"; cat "$LOG"; fi
  state=
  while ((SECONDS - crash < 75)); do
    state=$(sinfo -h -n "$node" -o '%T')
    [[ $state == down* ]] && break
    sleep 1
  done
  if [[ $state == down* ]]; then
    if grep -q "first rc=" "$LOG"; then fail "the job ended before Slurm marked $node DOWN: the test is too short"
    else pass "Slurm marked $node $state $((SECONDS - crash)) s after the crash; the job runs on (--no-kill)"; fi
  else fail "$node is '$state', not DOWN, $((SECONDS - crash)) s after the crash"; fi
  end_elastic_job "a failed node" 150
  # The node comes back: its slurmd starts again and the node returns to service.
  if QUIET=1 "$SRC_DIR/scripts/test-slurm-cluster.sh" up 3 >/dev/null 2>&1; then
    pass "$node's slurmd started again and every node is idle"
  else fail "the nodes did not come back: $(sinfo -h -N -o '%N %T' | tr '\n' ' ')"; fi
  ;;
srunpmix)
  # libringrun under srun --mpi=pmix, without ringrun: 3 nodes x 2 tasks join through Slurm's
  # PMIx server; rank, local and cross numbering are Slurm's; an allreduce sums.
  worker=$BIN_DIR/runtime_test_worker
  out=$(salloc -J "rr-test-$$" -N3 --ntasks-per-node=2 srun --mpi=pmix -n 6 --ntasks-per-node=2 \
    env RINGRUN_TEST_LOCAL_SIZE=2 "$worker" launched 2>&1)
  rc=$?
  [[ $rc == 0 ]] && pass "srun --mpi=pmix -n 6 across 3 nodes" || { fail "srun --mpi=pmix rc $rc"; echo "$out"; }
  for r in 0 1 2 3 4 5; do
    expect_in "$out" "launched rank=$r size=6 local=$((r % 2))/2 cross=$((r / 2))/3 sum=21" "rank $r's shape and sum"
    expect_in "$out" "rank $r of 6 found its peers through PMIx (srun (Slurm), namespace " "rank $r logs PMIx"
  done
  # A rank killed after the join: the others fail naming it, in bounded time.
  start=$SECONDS
  out=$(salloc -J "rr-test-$$" -N3 --ntasks-per-node=1 srun --mpi=pmix -n 3 bash -c \
    "RINGRUN_TIMEOUT_MS=20000 $worker loop & w=\$!; [[ \$SLURM_PROCID == 1 ]] && { sleep 3; kill -9 \$w; }; wait \$w" 2>&1)
  (( SECONDS - start < 60 )) && pass "the step ended in $((SECONDS - start)) s" || fail "the step took $((SECONDS - start)) s"
  expect_in "$out" ": peer rank 1 (" "a survivor's allreduce fails naming the killed rank"
  # srun without PMIx: refused, naming srun and how to start the step.
  out=$(salloc -J "rr-test-$$" -N2 --ntasks-per-node=1 srun --mpi=none -n 2 "$worker" check 2>&1)
  expect_in "$out" "one of 2 processes started by srun (Slurm)" "srun --mpi=none is refused"
  expect_in "$out" "srun --mpi=pmix -n 2" "the refusal says how to start it"
  expect_nothing_left 10
  ;;
*)
  echo "unknown case $CASE"; exit 2 ;;
esac
wait_nodes_idle
finish
