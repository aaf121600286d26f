#!/bin/bash
# Elastic jobs over SSH on the 4-host test cluster, one rank a host, running
# examples/elastic/pytorch_synthetic_elastic.py: elastic_test.sh CASE, one CTest test per case.
#   kill   -np 4 --min-np 2, worker 2 (on host 3) killed with SIGKILL at step 23: one reset line
#          naming it, the survivors go on from the last commit and finish on 3 ranks with the
#          final parameters of --reference to 1e-12; nothing left on any host
#   minnp  the same kill with --min-np 4: the job ends at once with 137 (the killed rank's
#          128+9), naming --min-np, no reset; nothing left on any host
#   grow   -np 2 --max-np 4 with a discovery script (cat of a file) listing hosts 1 and 2; at
#          rank 0's step 10 the file lists hosts 3 and 4 too: their agents start over SSH,
#          workers 2 and 3 join at a commit, the job finishes on 4 ranks with --reference's
#          final parameters to 1e-12; prints the time from the change of the file to the first
#          step on 4 ranks (goal: --discovery-interval + 3 s) and the survivors' pause (the gap
#          across the change less a step; goal: 1 s); nothing left on any host
#   cooldown  -np 4 --min-np 2 --blacklist-cooldown-range 1 10 --reset-limit 4, the C test
#          worker, the discovery script listing the 4 hosts all along: workers 3, 4 and 5 (each
#          on host 4) fail after 100 steps of their own: host 4 is blacklisted for 1 s, back
#          with worker 4, blacklisted for 2 s, back with worker 5, whose failure needs a fifth
#          reset: the job ends with its code 3, naming --reset-limit; nothing left on any host
# Job processes are found by a unique tag in their environment (-x RR_TEST_TAG=...).
source "$(dirname "$0")/lib.sh"
CASE=${1:?usage: elastic_test.sh CASE}
PY=/usr/bin/python3
$PY -c 'import torch' 2>/dev/null || { echo "SKIP: needs Debian's python3-torch"; exit 77; }
PYDIR=$(cd "$BIN_DIR/../python" && pwd)
EX=$SRC_DIR/examples/elastic/pytorch_synthetic_elastic.py
TAG="rr-cluster-elastic-$CASE-$$-$RANDOM"
HP=$RR_HOST_PREFIX  # rr-h, or rr<K>-h for RINGRUN_CLUSTER_ID=K
H4="${HP}1:1,${HP}2:1,${HP}3:1,${HP}4:1"

tagged() { pids_with_env "RR_TEST_TAG=$TAG"; }
agents() {  # ringrun-agent processes inside the cluster's namespaces
  local i p
  for i in 1 2 3 4; do
    for p in $(ip netns pids "${HP}$i" 2>/dev/null); do
      tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q "ringrun-agent" && echo "$p"
    done
  done
}
job_left() { tagged; agents; }
# Whatever a failed check leaves is killed at exit, so that the next test starts clean.
cleanup_hooks+=('for p in $(job_left); do kill -9 "$p" 2>/dev/null; done')

# run_job MIN_NP: the example with worker 2 killed at step 23; sets OUT, RC and SECS.
run_job() {
  local start=$SECONDS
  OUT=$(timeout -k 5 90 "$BIN_DIR/ringrun" -np 4 --min-np "$1" -H "$H4" -i "$RR_KEY" \
    --ssh-known-hosts "$RR_KNOWN_HOSTS" -x "PYTHONPATH=$PYDIR" -x OMP_NUM_THREADS=1 \
    -x "RR_TEST_TAG=$TAG" $PY "$EX" --kill-worker 2 --kill-at 23 --global-batch 12 2>&1)
  RC=$?
  SECS=$((SECONDS - start))
}
killed_line="ringrun: rank 2 (worker 2) on host ${HP}3 was killed by SIGKILL (signal 9); host ${HP}3 is blacklisted"

case $CASE in
kill)
  run_job 2
  ((RC == 0)) && pass "the job exits 0 ($SECS s)" || { fail "rc=$RC after $SECS s:"; echo "$OUT"; }
  expect_in "$OUT" "$killed_line" "the reset line names worker 2, its host and the signal"
  expect_in "$OUT" "generation 2: 3 ranks (was 4), reset 1" "generation 2 has the 3 survivors"
  n=$(grep -c 'generation [0-9]*: ' <<<"$OUT")
  ((n == 1)) && pass "one reset line" || fail "$n generation lines"
  n=$(grep -c 'reset: 3 ranks' <<<"$OUT")
  ((n == 1)) && pass "one reset callback, on 3 ranks" || fail "$n 'reset: 3 ranks' lines"
  expect_in "$OUT" "epoch 1 done on 4 ranks" "the first epoch ran on 4 ranks"
  expect_in "$OUT" "epoch 5 done on 3 ranks" "the survivors finished on 3 ranks"
  n=$(grep -c 'final loss=' <<<"$OUT")
  ((n == 1)) && pass "one final line (rank 0's)" || fail "$n final lines"
  ref=$(timeout 60 env PYTHONPATH="$PYDIR" $PY "$EX" --reference 2>&1)
  if d=$($PY "$SRC_DIR/examples/elastic/compare_final.py" <(echo "$OUT") <(echo "$ref") 2>&1); then
    pass "final parameters equal --reference's (max abs difference $d)"
  else fail "final parameters differ from --reference: $d"; echo "$OUT" | tail -5; echo "$ref"; fi
  ;;
minnp)
  run_job 4
  ((RC == 137)) && pass "the job ends with the killed rank's 137 ($SECS s)" ||
    { fail "rc=$RC after $SECS s:"; echo "$OUT"; }
  ((SECS <= 30)) && pass "within 30 s" || fail "took $SECS s"
  expect_in "$OUT" "$killed_line" "the line names worker 2, its host and the signal"
  expect_in "$OUT" "3 ranks remain, fewer than --min-np 4: ending the job" "the line names --min-np"
  expect_not_in "$OUT" "generation 2" "no new generation"
  expect_not_in "$OUT" "final loss=" "no rank finished"
  ;;
grow)
  write_hosts() { printf '%s\n' "$@" >"$TMP/hosts.new" && mv "$TMP/hosts.new" "$TMP/hosts"; }
  write_hosts "${HP}1:1" "${HP}2:1"
  start=$SECONDS
  timeout -k 5 120 "$BIN_DIR/ringrun" -np 2 --max-np 4 --host-discovery-script "cat $TMP/hosts" \
    --discovery-interval 1 -i "$RR_KEY" --ssh-known-hosts "$RR_KNOWN_HOSTS" -x "PYTHONPATH=$PYDIR" \
    -x OMP_NUM_THREADS=1 -x "RR_TEST_TAG=$TAG" $PY "$EX" --epochs 8 --step-delay 0.2 --log-steps \
    >"$TMP/out" 2>&1 &
  pid=$!
  until grep -q "^\[0\]<stdout>:step 10 " "$TMP/out"; do
    if ((SECONDS - start > 60)) || ! kill -0 $pid 2>/dev/null; then
      fail "the job did not reach step 10"; cat "$TMP/out"; break
    fi
    sleep 0.1
  done
  changed=$(date +%s.%N)
  write_hosts "${HP}1:1" "${HP}2:1" "${HP}3:1" "${HP}4:1"
  wait $pid; RC=$?
  OUT=$(cat "$TMP/out")
  ((RC == 0)) && pass "the job exits 0 ($((SECONDS - start)) s)" || { fail "rc=$RC:"; echo "$OUT"; }
  expect_in "$OUT" "host discovery: host ${HP}3 (1 slots) added, host ${HP}4 (1 slots) added; generation 2: 4 ranks (was 2), reset 1; starting workers 2,3" \
    "one change: hosts 3 and 4 added, workers 2 and 3 started"
  expect_in "$OUT" "generation 2: its new workers 2,3 wait to join it; membership epoch 1" \
    "the epoch is raised once the new workers wait"
  expect_in "$OUT" "epoch 8 done on 4 ranks" "the job finished on 4 ranks"
  n=$(grep -c 'final loss=' <<<"$OUT")
  ((n == 1)) && pass "one final line (rank 0's)" || fail "$n final lines"
  ref=$(timeout 60 env PYTHONPATH="$PYDIR" $PY "$EX" --reference --epochs 8 2>&1)
  if d=$($PY "$SRC_DIR/examples/elastic/compare_final.py" <(echo "$OUT") <(echo "$ref") 2>&1); then
    pass "final parameters equal --reference's (max abs difference $d)"
  else fail "final parameters differ from --reference: $d"; fi
  if m=$($PY - "$TMP/out" "$changed" <<'PYEOF'
import re, statistics, sys
steps = [(int(m[1]), int(m[2]), float(m[3])) for m in
         re.finditer(r"^\[0\]<stdout>:step (\d+) size=(\d+) t=([0-9.]+)$", open(sys.argv[1]).read(), re.M)]
gaps = [b[2] - a[2] for a, b in zip(steps, steps[1:]) if a[1] == b[1]]
change = [b[2] - a[2] for a, b in zip(steps, steps[1:]) if a[1] == 2 and b[1] == 4]
first4 = [t for _, n, t in steps if n == 4]
if [n for n, _, _ in steps] != list(range(1, len(steps) + 1)) or not change or not first4:
    sys.exit(1)
print(f"host added -> first step on 4 ranks: {first4[0] - float(sys.argv[2]):.3f} s; "
      f"pause: {change[0] - statistics.median(gaps):.3f} s")
PYEOF
  ); then pass "$m"; else fail "a step ran twice, or no step at each size"; fi
  ;;
cooldown)
  printf '%s\n' "${HP}1:1" "${HP}2:1" "${HP}3:1" "${HP}4:1" >"$TMP/hosts"
  start=$SECONDS
  OUT=$(timeout -k 5 90 "$BIN_DIR/ringrun" -np 4 --min-np 2 --blacklist-cooldown-range 1 10 \
    --reset-limit 4 --host-discovery-script "cat $TMP/hosts" -i "$RR_KEY" \
    --ssh-known-hosts "$RR_KNOWN_HOSTS" -x "RR_TEST_TAG=$TAG" -x ELASTIC_CHECK_EVERY=50 \
    -x ELASTIC_FAIL_WORKERS=3,4,5 -x ELASTIC_FAIL_AFTER=100 \
    "$BIN_DIR/ringrun-test-elastic-worker" 100000 2>&1)
  RC=$?
  ((RC == 3)) && pass "the job ends with the failing rank's 3 ($((SECONDS - start)) s)" ||
    { fail "rc=$RC:"; echo "$OUT"; }
  expect_in "$OUT" "rank 3 (worker 3) on host ${HP}4 exited with code 3; host ${HP}4 is blacklisted for 1 s" \
    "the first failure blacklists host 4 for 1 s"
  expect_in "$OUT" "host ${HP}4: blacklist cooldown ended; generation 3: 4 ranks (was 3), reset 2 of --reset-limit 4; starting workers 4" \
    "host 4 is back after its cooldown, with worker 4"
  expect_in "$OUT" "rank 3 (worker 4) on host ${HP}4 exited with code 3; host ${HP}4 is blacklisted for 2 s" \
    "the second failure blacklists it for 2 s"
  expect_in "$OUT" "host ${HP}4: blacklist cooldown ended; generation 5: 4 ranks (was 3), reset 4 of --reset-limit 4; starting workers 5" \
    "host 4 is back again, with worker 5"
  expect_in "$OUT" "reset limit 4 reached (--reset-limit): the job was reset 4 times and needs another" \
    "the third failure ends the job, naming the limit"
  ;;
*) echo "unknown case $CASE"; exit 2 ;;
esac
wait_gone 15 job_left && pass "nothing left on any host" || fail "left: $(job_left)"
finish
