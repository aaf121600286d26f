#!/bin/bash
# Attacks on a running job across the 4-host test cluster: security_test.sh CASE.
#   forged       a forger (no secret) on every rank's TCP port, from the launcher's side, and a
#                process holding the secret that claims rank 0 from rank 1's host: both refused,
#                the job computes the right answers in its normal time
#   flood        on every host, hundreds of silent connections and junk on every listener of
#                every rank (TCP and the local Unix sockets): the job ends right, in its normal time
#   service      junk bodies to the job service from a host (refused before parsing or for size),
#                idle and non-HTTP/2 connections and silent streams: the job is undisturbed
source "$(dirname "$0")/lib.sh"
CASE=${1:?usage: security_test.sh CASE}
TAG="rr-security-$CASE-$$-$RANDOM"
RINGRUN=("$BIN_DIR/ringrun" -i "$RR_KEY" --ssh-known-hosts "$RR_KNOWN_HOSTS")
HP=$RR_HOST_PREFIX
WORKER="$BIN_DIR/runtime_test_worker"
ATTACK="$BIN_DIR/ringrun-test-attack"
H8="${HP}1:2,${HP}2:2,${HP}3:2,${HP}4:2"

# Ranks of the job that start_job started last: "PID RANK" lines. Each job has a tag of its
# own, so that ranks of an earlier job that are still exiting are not counted as this one's.
ranks() {
  local p
  for p in $(pgrep -x runtime_test_wo); do
    tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qxF "RR_TEST_TAG=$JOB_TAG" || continue
    echo "$p $(tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | sed -n 's/^RINGRUN_RANK=//p')"
  done
}
pid_of_rank() { ranks | awk -v r="$1" '$2 == r { print $1 }'; }
host_of_pid() {  # the cluster host index whose namespace holds PID
  # `ip netns identify` reads PID's own namespace link; `ip netns pids` scans every process and
  # can miss one while other processes come and go.
  local ns
  ns=$(ip netns identify "$1" 2>/dev/null)
  [[ $ns == "$HP"[1-4] ]] && echo "${ns#"$HP"}"
}
# Starts `worker delayed SECONDS` with NP ranks on HOSTS; sets JOB_PID, JOB_LOG; waits for ranks.
start_job() {  # np hosts seconds
  JOB_LOG=$TMP/job.$RANDOM.log
  JOB_TAG=$TAG-$RANDOM
  JOB_T0=$(date +%s.%N)
  # The job's own end time, whatever else the test waits for meanwhile.
  {
    "${RINGRUN[@]}" -np "$1" -H "$2" -x "RR_TEST_TAG=$JOB_TAG" -x RINGRUN_TIMEOUT_MS=30000 \
      -x RINGRUN_LOG_LEVEL=debug "$WORKER" delayed "$3" >"$JOB_LOG" 2>&1
    echo "$? $(date +%s.%N)" >"$JOB_LOG.end"
  } &
  JOB_PID=$!
  cleanup_hooks+=("kill -9 $JOB_PID 2>/dev/null")
  local start=$SECONDS
  while (($(ranks | wc -l) < $1)); do
    if ((SECONDS - start > 20)); then fail "ranks did not start:"; cat "$JOB_LOG"; finish; fi
    sleep 0.05
  done
}
# Waits for the job; checks every rank's answers; sets JOB_SECS (with a fraction).
check_job() {  # np what
  local rc r end
  wait "$JOB_PID"
  read -r rc end <"$JOB_LOG.end"
  JOB_SECS=$(echo "$end - $JOB_T0" | bc)
  [[ $rc == 0 ]] && pass "$2: the job exits 0 (${JOB_SECS} s)" || { fail "$2: rc=$rc"; tail -5 "$JOB_LOG"; }
  # Refused connections, logged once per address (RINGRUN_LOG_LEVEL=debug).
  grep -a "refused a data-plane connection\|trying again" "$JOB_LOG" | head -8
  for ((r = 0; r < $1; r++)); do
    grep -qF "[$r]<stdout>:ok rank=$r size=$1" "$JOB_LOG" || fail "$2: rank $r's answers"
  done
}
baseline() {  # np hosts: seconds the job takes alone
  start_job "$1" "$2" 2
  check_job "$1" "alone"
  BASE_SECS=$JOB_SECS
}
within_normal_time() {  # what: at most twice the time alone, or 3 s more
  local limit
  limit=$(echo "if ($BASE_SECS * 2 > $BASE_SECS + 3) $BASE_SECS * 2 else $BASE_SECS + 3" | bc)
  if (($(echo "$JOB_SECS <= $limit" | bc))); then pass "$1: ${JOB_SECS} s (alone ${BASE_SECS} s)"
  else fail "$1: ${JOB_SECS} s, alone ${BASE_SECS} s"; fi
}

case $CASE in
forged)
  baseline 4 "${HP}1:1,${HP}2:1,${HP}3:1,${HP}4:1"
  start_job 4 "${HP}1:1,${HP}2:1,${HP}3:1,${HP}4:1" 2
  # From the launcher's side of the network: no secret, the right job id and tag.
  "$ATTACK" forge 5 $(ranks | awk '{ print $1 }') >"$TMP/forge" 2>&1 &
  forger=$!
  # Holding the secret (as rank 1 does), from rank 1's host, claiming rank 0 to rank 3.
  r1=$(pid_of_rank 1)
  out=$(ip netns exec "${HP}$(host_of_pid "$r1")" "$ATTACK" impersonate "$r1" "$(pid_of_rank 3)" 0 2>&1)
  expect_in "$out" "impersonating rank 0 to rank 3: refused" "a real rank's secret, claiming rank 0 from rank 1's host"
  wait $forger
  check_job 4 "forged peers"
  expect_in "$(cat "$TMP/forge")" " 0 bytes of job data received" "the forger got no job data"
  expect_not_in "$(cat "$TMP/forge")" "forged: 0 connections" "the forger reached every rank"
  within_normal_time "forged peers"
  ;;
flood)
  baseline 8 "$H8"
  start_job 8 "$H8" 2
  pids=()
  for i in 1 2 3 4; do
    on=$(for p in $(ranks | awk '{ print $1 }'); do [[ $(host_of_pid "$p") == "$i" ]] && echo "$p"; done)
    ip netns exec "${HP}$i" "$ATTACK" flood 30 150 $on >"$TMP/flood.$i" 2>&1 &
    pids+=($!)
    cleanup_hooks+=("kill $! 2>/dev/null")
  done
  check_job 8 "flooded"
  kill "${pids[@]}" 2>/dev/null
  for i in 1 2 3 4; do
    expect_in "$(cat "$TMP/flood.$i")" "300 silent TCP and 300 silent local connections open" "host $i: the flood took hold"
  done
  within_normal_time "flooded"
  ;;
service)
  start_job 4 "${HP}1:1,${HP}2:1,${HP}3:1,${HP}4:1" 4
  r0=$(pid_of_rank 0)
  target=$(tr '\0' '\n' <"/proc/$r0/environ" | sed -n 's/^RINGRUN_JOB_SERVICE=//p')
  ns="${HP}$(host_of_pid "$r0")"
  ip netns exec "$ns" "$ATTACK" service-flood 3 "$target" >"$TMP/sflood" 2>&1 &
  flooder=$!
  out=$(ip netns exec "$ns" "$ATTACK" service-junk "$target" 2>&1)
  wait $flooder
  expect_not_in "$out" "INTERNAL" "junk bodies are never parsed unauthenticated"
  expect_in "$out" "Register 1024: UNAUTHENTICATED" "a small junk Register: UNAUTHENTICATED"
  expect_in "$out" "Register 5242880: RESOURCE_EXHAUSTED" "a 5 MiB junk Register: RESOURCE_EXHAUSTED"
  expect_in "$out" "Join 5242880: RESOURCE_EXHAUSTED" "a 5 MiB junk Join: RESOURCE_EXHAUSTED"
  check_job 4 "beside the attacks on the job service"
  ;;
*) fail "unknown case $CASE" ;;
esac
wait_gone 10 ranks && pass "nothing left" || fail "left: $(ranks)"
finish
