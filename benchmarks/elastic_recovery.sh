#!/usr/bin/env bash
# Recovery from kill -9 of one rank in an elastic job, ringrun against torchrun, on 4 namespace
# hosts of the test cluster with one rank each (needs root):
#   ringrun   ringrun -np 4 --min-np 2 -H h1:1,h2:1,h3:1,h4:1 running
#             examples/elastic/pytorch_synthetic_elastic.py: the survivors re-form to 3 ranks and
#             go on from the last commit;
#   torchrun  torchrun --max_restarts 3 (c10d rendezvous on host 1, --monitor_interval 1) on each
#             host, running benchmarks/torchrun_elastic_train.py (the same model and batches in
#             plain torch.distributed, gloo, a checkpoint file per commit): every agent restarts
#             its worker and the 4 new workers resume from the checkpoint.
# In both, worker (torchrun: rank) KILL_WORKER kills itself with SIGKILL after step KILL_AT
# (commits every 5 steps and at each epoch's end, 20 steps an epoch: 23 falls 3 steps after a
# commit). Recovery is the time from the kill (the killed worker's time.time() just before it) to
# the first step that rank 0 completes after it in the new generation (ringrun: size=3;
# torchrun: gen=1, the workers that resumed from the checkpoint), from the --log-steps lines (one
# clock: the namespaces share the machine). Every run's final parameters are checked against
# --reference to 1e-12. The two alternate, ROUNDS rounds after one warm-up round; prints a line a
# round, then the table of benchmarks/README.md's "Elastic recovery".
# Brings the cluster up with 4 hosts (scripts/test-cluster.sh up 4; RINGRUN_CLUSTER_ID picks the
# cluster) and leaves it up.
#
#   benchmarks/elastic_recovery.sh [BUILD_DIR]   env: ROUNDS (5), KILL_WORKER (2), KILL_AT (23)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$SRC/build}" && pwd)
RINGRUN=$BUILD/bin/ringrun
PY=/usr/bin/python3
EX=$SRC/examples/elastic/pytorch_synthetic_elastic.py
TR=$SRC/benchmarks/torchrun_elastic_train.py
ROUNDS=${ROUNDS:-5} KILL_WORKER=${KILL_WORKER:-2} KILL_AT=${KILL_AT:-23}
[[ -x $RINGRUN && -d $BUILD/python/ringrun ]] || { echo "no $RINGRUN or $BUILD/python: build first" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "needs root" >&2; exit 1; }
source "$SRC/benchmarks/lib.sh"

QUIET=1 "$SRC/scripts/test-cluster.sh" up 4
eval "$("$SRC/scripts/test-cluster.sh" env)"
HP=$RR_HOST_PREFIX
SSH=(ssh -i "$RR_KEY" -o UserKnownHostsFile="$RR_KNOWN_HOSTS" -o StrictHostKeyChecking=yes
     -o BatchMode=yes -o ConnectTimeout=5)
TMPD=$(mktemp -d /tmp/ringrun-elastic-recovery.XXXXXX)
TAG="rr-elastic-recovery-$$"
# Processes of this benchmark on the hosts: ringrun's ranks carry the tag in their environment,
# torchrun's processes the temporary folder on their command line.
leftovers() {
  local i p
  for i in 1 2 3 4; do
    for p in $(ip netns pids "${HP}$i" 2>/dev/null); do
      { tr '\0' '\n' <"/proc/$p/environ" | grep -qxF "RR_TEST_TAG=$TAG" ||
        tr '\0' ' ' <"/proc/$p/cmdline" | grep -qF "$TMPD"; } 2>/dev/null && echo "$p"
    done
  done
}
cleanup() {
  local p
  for p in $(leftovers); do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$TMPD"
}
trap cleanup EXIT

$PY "$EX" --reference >"$TMPD/ref" 2>&1 || { cat "$TMPD/ref" >&2; exit 1; }
# check_final OUT: the run's final line equals --reference's to 1e-12.
check_final() { $PY "$SRC/examples/elastic/compare_final.py" "$1" "$TMPD/ref"; }
# recovery OUT PATTERN: seconds from the kill line to the first (in time) line matching PATTERN
# after it; the lines of several hosts may come in any order.
recovery() {
  awk -v pat="$2" '
    function t() { match($0, / t=[0-9.]+/); return substr($0, RSTART + 3, RLENGTH - 3) + 0 }
    /kill step/ { k = t() }
    $0 ~ pat { s[++n] = t() }
    END { for (i = 1; i <= n; i++) if (s[i] > k && (!f || s[i] < f)) f = s[i]
          if (!k || !f) exit 1; printf "%.3f\n", f - k }' "$1"
}
fail_run() { echo "$1 failed:" >&2; tail -40 "$2" >&2; exit 1; }

run_ringrun() {  # round
  local out=$TMPD/ringrun.$1
  timeout 120 "$RINGRUN" -np 4 --min-np 2 -H "${HP}1:1,${HP}2:1,${HP}3:1,${HP}4:1" \
    -i "$RR_KEY" --ssh-known-hosts "$RR_KNOWN_HOSTS" \
    -x "PYTHONPATH=$BUILD/python" -x OMP_NUM_THREADS=1 -x "RR_TEST_TAG=$TAG" \
    $PY "$EX" --log-steps --kill-worker "$KILL_WORKER" --kill-at "$KILL_AT" --global-batch 12 \
    >"$out" 2>&1 || fail_run ringrun "$out"
  grep -q 'epoch 5 done on 3 ranks' "$out" || fail_run "ringrun (not 3 ranks at the end)" "$out"
  local r d
  r=$(recovery "$out" 'step [0-9]+ size=3 ') || fail_run "ringrun (no recovery)" "$out"
  d=$(check_final "$out") || fail_run "ringrun (final parameters)" "$out"
  echo "$r $d"
}

run_torchrun() {  # round
  local out=$TMPD/torchrun.$1 port=$((29700 + $1)) i pids=() rc=0
  rm -f "$TMPD/ckpt.pt"
  for i in 1 2 3 4; do
    "${SSH[@]}" "root@${HP}$i" "OMP_NUM_THREADS=1 timeout 120 $PY -m torch.distributed.run \
      --nnodes 4 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint ${HP}1:$port \
      --rdzv_id elastic-recovery-$1 --max_restarts 3 --monitor_interval 1 --redirects 1 --tee 1 \
      $TR --checkpoint $TMPD/ckpt.pt --log-steps --kill-worker $KILL_WORKER --kill-at $KILL_AT \
      --global-batch 12" >"$out.$i" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  cat "$out".[1-4] >"$out"
  ((rc == 0)) || fail_run "torchrun (exit $rc)" "$out"
  local r d
  r=$(recovery "$out" 'step [0-9]+ size=4 gen=1 ') || fail_run "torchrun (no recovery)" "$out"
  d=$(check_final "$out") || fail_run "torchrun (final parameters)" "$out"
  echo "$r $d"
}

# Warm-up (page cache, sshd's first fork on every host), not counted.
run_ringrun 0 >/dev/null
run_torchrun 0 >/dev/null
: >"$TMPD/rr"; : >"$TMPD/tr"; : >"$TMPD/rr.d"; : >"$TMPD/tr.d"
load0=$(cut -d' ' -f1 /proc/loadavg)
for round in $(seq "$ROUNDS"); do
  res=$(run_ringrun "$round"); read -r a da <<<"$res"
  res=$(run_torchrun "$round"); read -r b db <<<"$res"
  echo "round $round: ringrun ${a} s (final params vs --reference: $da), torchrun ${b} s ($db)" >&2
  echo "$a" >>"$TMPD/rr"; echo "$b" >>"$TMPD/tr"; echo "$da" >>"$TMPD/rr.d"; echo "$db" >>"$TMPD/tr.d"
  [[ -z $(leftovers) ]] || { echo "left on the hosts after round $round: $(leftovers)" >&2; exit 1; }
done
# row NAME FILE: median, min, max of FILE's times; the largest final-parameter difference.
row() { printf "| %s | %s | %s | %s | %s | %s |\n" "$1" "$(median <"$2")" "$(sort -g "$2" | head -1)" \
  "$(sort -g "$2" | tail -1)" "$ROUNDS" "$(sort -g "$2.d" | tail -1)"; }
echo "| kill -9 of worker $KILL_WORKER after step $KILL_AT, np=4 on 4 hosts | kill to next step, median s | min s | max s | rounds | final params vs --reference, max abs diff |"
echo "| --- | --- | --- | --- | --- | --- |"
row "ringrun -np 4 --min-np 2 (3 ranks go on)" "$TMPD/rr"
row "torchrun --max_restarts 3 (4 workers restart)" "$TMPD/tr"
echo "ringrun / torchrun (medians): $(echo "$(median <"$TMPD/rr") / $(median <"$TMPD/tr")" | bc -l | xargs printf '%.3f')"
echo "load average (1 min) before / after the rounds: $load0 / $(cut -d' ' -f1 /proc/loadavg)"
