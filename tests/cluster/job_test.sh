#!/bin/bash
# Whole ringrun jobs on the 4-host test cluster: job_test.sh CASE, one CTest test per case.
#   placement  hostnames, placement, environment and working directory per host; output tags
#   exitcode   a failing remote rank's exit code and message
#   agentkill  kill -9 of one agent: the job ends non-zero naming the host, its ranks die
#   launcherkill  kill -9 of ringrun: nothing of the job left on any host within 15 s
#   linkcut    a host's link goes down: the job ends within 30 s naming it; nothing left there
#   sshfail    unknown/changed host key, wrong key, unreachable address, missing agent
#   secret     the secret on no command line on any host; calls without it are refused
#   args       arguments and -x values with shell syntax arrive unchanged, nothing executes
#   restarts   --max-restarts over SSH: a failing rank, then a lost agent, restart the whole job
#              on the same hosts; counts, one job id per attempt, nothing left between attempts
# Job processes are found by a unique tag in their environment (-x RR_TEST_TAG=...).
source "$(dirname "$0")/lib.sh"
CASE=${1:?usage: job_test.sh CASE}
TAG="rr-cluster-$CASE-$$-$RANDOM"
RINGRUN=("$BIN_DIR/ringrun" -i "$RR_KEY" --ssh-known-hosts "$RR_KNOWN_HOSTS")
HP=$RR_HOST_PREFIX  # rr-h, or rr<K>-h for RINGRUN_CLUSTER_ID=K
H4="${HP}1:1,${HP}2:1,${HP}3:1,${HP}4:1"

tagged() { pids_with_env "RR_TEST_TAG=$TAG"; }
# ringrun-agent processes inside the cluster's namespaces (optionally one host: agents_on 2).
agents_on() {
  local i p
  for i in ${1:-1 2 3 4}; do
    for p in $(ip netns pids "${HP}$i" 2>/dev/null); do
      tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q "ringrun-agent" && echo "$p"
    done
  done
}
job_left() { tagged; agents_on "$@"; }
tagged_on() {  # host index: tagged processes in that namespace
  local p ns
  ns=$(readlink "/var/run/netns/${HP}$1" 2>/dev/null || true)
  for p in $(ip netns pids "${HP}$1" 2>/dev/null); do
    tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qxF "RR_TEST_TAG=$TAG" && echo "$p"
  done
}
# Starts a background job of sleeping ranks; sets JOB_PID and JOB_LOG; waits for N ranks.
start_sleeping_job() {  # n_ranks hosts seconds
  JOB_LOG=$TMP/job.log
  "${RINGRUN[@]}" -np "$1" -H "$2" -x "RR_TEST_TAG=$TAG" /bin/sleep "$3" >"$JOB_LOG" 2>&1 &
  JOB_PID=$!
  cleanup_hooks+=("kill -9 $JOB_PID 2>/dev/null")
  local start=$SECONDS
  while (( $(tagged | wc -l) < $1 )); do
    if ((SECONDS - start > 20)); then fail "ranks did not start:"; cat "$JOB_LOG"; finish; fi
    sleep 0.1
  done
}
# Waits up to LIMIT s for JOB_PID; sets JOB_RC and JOB_SECS.
wait_job() {
  local start=$SECONDS
  while kill -0 "$JOB_PID" 2>/dev/null && ((SECONDS - start < $1)); do sleep 0.1; done
  JOB_SECS=$((SECONDS - start))
  if kill -0 "$JOB_PID" 2>/dev/null; then JOB_RC=timeout; kill -9 "$JOB_PID"; wait "$JOB_PID" 2>/dev/null
  else wait "$JOB_PID"; JOB_RC=$?; fi
}

case $CASE in
placement)
  cd "$TMP" || exit 1
  out=$(timeout 60 "${RINGRUN[@]}" -np 8 -H ${HP}1:2,${HP}2:2,${HP}3:2,${HP}4:2 -x "RR_TEST_TAG=$TAG" \
    /bin/sh -c 'echo "host=$(hostname) rank=$RINGRUN_RANK local=$RINGRUN_LOCAL_RANK/$RINGRUN_LOCAL_SIZE cross=$RINGRUN_CROSS_RANK/$RINGRUN_CROSS_SIZE size=$RINGRUN_SIZE hvd=$HOROVOD_HOSTNAME/$HOROVOD_RANK torch=$RANK/$WORLD_SIZE/$LOCAL_RANK/$GROUP_RANK master=$MASTER_ADDR tag=$RR_TEST_TAG pwd=$(pwd)"' 2>&1)
  rc=$?
  [[ $rc == 0 ]] && pass "8 ranks on 4 hosts exit 0" || fail "rc=$rc: $out"
  for r in $(seq 0 7); do
    h=$((r / 2 + 1)); l=$((r % 2)); c=$((r / 2))
    expect_in "$out" "[$r]<stdout>:host=${HP}$h rank=$r local=$l/2 cross=$c/4 size=8 hvd=${HP}$h/$r torch=$r/8/$l/$c master=${RR_NET}.2 tag=$TAG pwd=$TMP" "rank $r: placement, environment, tag, cwd"
  done
  mkdir -p "$TMP/bin"
  printf '#!/bin/sh\necho "relative ok on $(hostname)"\n' >"$TMP/bin/hello"
  chmod +x "$TMP/bin/hello"
  out=$(timeout 60 "${RINGRUN[@]}" -np 2 -H ${HP}2:1,${HP}3:1 bin/hello 2>&1)
  expect_in "$out" "[1]<stdout>:relative ok on ${HP}3" "a command path relative to the launcher's directory, remotely"
  out=$(timeout 60 "${RINGRUN[@]}" -np 2 -H ${HP}2:1,${HP}3:1 --wdir /tmp /bin/pwd 2>&1)
  expect_in "$out" "[1]<stdout>:/tmp" "--wdir on a remote host"
  out=$(timeout 60 "${RINGRUN[@]}" -np 2 -H ${HP}2:1,${HP}3:1 --wdir /nonexistent-rr-dir /bin/pwd 2>&1)
  rc=$?
  [[ $rc != 0 ]] && pass "a missing --wdir fails the job" || fail "missing wdir: rc=0"
  expect_in "$out" "/nonexistent-rr-dir" "  naming the path"
  if grep -q "${HP}[23]" <<<"$out"; then pass "  naming the host"; else fail "  no host in: $out"; fi
  n=$(grep -c "/nonexistent-rr-dir" <<<"$out")
  ((n == 1)) && pass "  reported once" || fail "  reported $n times: $out"
  out=$(timeout 60 "${RINGRUN[@]}" -np 2 -H ${HP}2:1,${HP}3:1 /nonexistent-rr-cmd 2>&1)
  [[ $? != 0 ]] && pass "a missing command fails the job" || fail "missing command: rc=0"
  expect_in "$out" "/nonexistent-rr-cmd" "  naming the command"
  ;;
exitcode)
  start=$SECONDS
  out=$(timeout 60 "${RINGRUN[@]}" -np 4 -H "$H4" -x "RR_TEST_TAG=$TAG" /bin/sh -c \
    'if [ "$RINGRUN_RANK" = 2 ]; then echo "boom on $(hostname)" >&2; exit 3; fi; exec sleep 60' 2>&1)
  rc=$?
  [[ $rc == 3 ]] && pass "the failing rank's code (3) is ringrun's" || fail "rc=$rc: $out"
  expect_in "$out" "boom on ${HP}3" "its stderr is shown"
  if grep -q "rank 2.*${HP}3\|${HP}3.*rank 2" <<<"$out"; then pass "the message names rank 2 and ${HP}3"
  else fail "no rank/host in: $out"; fi
  ((SECONDS - start < 20)) && pass "the others are ended promptly" || fail "took $((SECONDS - start))s"
  wait_gone 5 job_left && pass "nothing left on any host" || fail "left: $(job_left)"
  ;;
agentkill)
  start_sleeping_job 4 "$H4" 120
  victim=$(agents_on 2 | head -1)
  [[ -n $victim ]] || { fail "no agent on ${HP}2"; finish; }
  kill -9 "$victim"
  wait_job 25
  [[ $JOB_RC != 0 && $JOB_RC != timeout ]] && pass "the job ends non-zero (rc=$JOB_RC, ${JOB_SECS}s)" ||
    fail "rc=$JOB_RC after ${JOB_SECS}s"
  expect_in "$(cat "$JOB_LOG")" "${HP}2" "the message names the host"
  wait_gone 5 tagged_on 2 && pass "${HP}2's ranks died" || fail "left on ${HP}2: $(tagged_on 2)"
  wait_gone 10 job_left && pass "nothing left on any host" || fail "left: $(job_left)"
  ;;
launcherkill)
  start_sleeping_job 4 "$H4" 120
  kill -9 "$JOB_PID"
  start=$SECONDS
  if wait_gone 15 job_left; then pass "everything gone from every host in $((SECONDS - start))s"
  else fail "still there after 15 s: $(job_left)"; fi
  ;;
linkcut)
  start_sleeping_job 4 "$H4" 120
  cleanup_hooks+=("ip link set ${RR_LINK_PREFIX}2 up")
  ip link set ${RR_LINK_PREFIX}2 down
  cut_at=$SECONDS
  wait_job 35
  [[ $JOB_RC != 0 && $JOB_RC != timeout ]] && ((JOB_SECS <= 30)) &&
    pass "the job ends non-zero within 30 s (rc=$JOB_RC, ${JOB_SECS}s)" || fail "rc=$JOB_RC after ${JOB_SECS}s"
  expect_in "$(cat "$JOB_LOG")" "${HP}2" "the message names the cut host"
  left=$((20 - (SECONDS - cut_at)))
  wait_gone $((left > 1 ? left : 1)) job_left 2 && pass "the cut host ends the job's processes by itself" ||
    fail "left on ${HP}2 20 s after the cut: $(job_left 2)"
  ip link set ${RR_LINK_PREFIX}2 up
  wait_gone 5 job_left && pass "nothing left once the link is back" || fail "left: $(job_left)"
  ;;
sshfail)
  : >"$TMP/empty_kh"
  out=$(timeout 60 "$BIN_DIR/ringrun" -i "$RR_KEY" --ssh-known-hosts "$TMP/empty_kh" -np 2 -H ${HP}1:1,${HP}2:1 /bin/true 2>&1)
  rc=$?
  [[ $rc == 1 ]] && pass "unknown host key: ringrun exits 1" || fail "rc=$rc"
  expect_in "$out" "host key unknown" "  classified"
  expect_in "$out" "--ssh-accept-new-host-keys" "  with the hint"
  [[ ! -s $TMP/empty_kh ]] && pass "  known_hosts untouched" || fail "known_hosts written"
  out=$(timeout 60 "$BIN_DIR/ringrun" -i "$RR_KEY" --ssh-known-hosts "$TMP/empty_kh" --ssh-accept-new-host-keys -np 2 -H ${HP}1:1,${HP}2:1 /bin/true 2>&1)
  [[ $? == 0 ]] && pass "--ssh-accept-new-host-keys runs the job" || fail "accept-new: $out"
  [[ $(wc -l <"$TMP/empty_kh") == 2 ]] && pass "  and appends both keys" || fail "known_hosts: $(cat "$TMP/empty_kh")"
  echo "${HP}1 $(cut -d' ' -f1,2 "$RR_CLUSTER_DIR/h3/ssh_host_ed25519_key.pub")" >"$TMP/changed_kh"
  before=$(sha256sum <"$TMP/changed_kh")
  fp=$(ssh-keygen -lf "$RR_CLUSTER_DIR/h1/ssh_host_ed25519_key.pub" | awk '{print $2}')
  out=$(timeout 60 "$BIN_DIR/ringrun" -i "$RR_KEY" --ssh-known-hosts "$TMP/changed_kh" --ssh-accept-new-host-keys -np 1 -H ${HP}1:1 /bin/true 2>&1)
  [[ $? == 1 ]] && pass "changed host key: exits 1" || fail "changed key accepted"
  expect_in "$out" "host key changed" "  classified"
  expect_in "$out" "$fp" "  with the SHA-256 fingerprint"
  [[ $(sha256sum <"$TMP/changed_kh") == "$before" ]] && pass "  known_hosts untouched" || fail "known_hosts changed"
  ssh-keygen -q -t ed25519 -N '' -f "$TMP/wrong_key"
  out=$(timeout 60 "$BIN_DIR/ringrun" -i "$TMP/wrong_key" --ssh-known-hosts "$RR_KNOWN_HOSTS" -np 1 -H ${HP}1:1 /bin/true 2>&1)
  [[ $? == 1 ]] && pass "wrong key: exits 1" || fail "wrong key accepted"
  expect_in "$out" "${HP}1: authentication denied" "  classified with the host"
  start=$(date +%s.%N)
  out=$(timeout 60 "${RINGRUN[@]}" --ssh-connect-timeout 2 -np 2 -H ${HP}1:1,${RR_NET}.250:1 /bin/true 2>&1)
  rc=$?
  took=$(echo "$(date +%s.%N) - $start" | bc -l)
  [[ $rc == 1 ]] && pass "unreachable host: exits 1" || fail "rc=$rc"
  expect_in "$out" "${RR_NET}.250" "  naming the address"
  if grep -qE "timed out|unreachable" <<<"$out"; then pass "  as a timeout"; else fail "  classification: $out"; fi
  (( $(echo "$took < 4" | bc) )) && pass "  within the connect timeout (${took}s for 2 s)" || fail "took ${took}s"
  out=$(timeout 60 "${RINGRUN[@]}" --agent-path /nonexistent/ringrun-agent -np 1 -H ${HP}2:1 /bin/true 2>&1)
  [[ $? == 1 ]] && pass "missing agent: exits 1" || fail "missing agent"
  expect_in "$out" "ringrun-agent not found at /nonexistent/ringrun-agent on host ${HP}2" "  named with path and host"
  wait_gone 5 job_left && pass "nothing left" || fail "left: $(job_left)"
  ;;
secret)
  out=$(timeout 60 "${RINGRUN[@]}" -np 4 -H "$H4" -x "RR_TEST_TAG=$TAG" /bin/sh -c \
    'if printf "%s\n" "$RINGRUN_SECRET" | grep -qsaF -f - /proc/[0-9]*/cmdline; then echo "secret=FOUND"; else echo "secret=clean len=${#RINGRUN_SECRET}"; fi; exec "$0"' \
    "$BIN_DIR/ringrun-test-unauth-client" 2>&1)
  rc=$?
  [[ $rc == 0 ]] && pass "the job runs" || fail "rc=$rc: $out"
  for r in 0 1 2 3; do
    expect_in "$out" "[$r]<stdout>:secret=clean len=64" "rank $r: the secret is on no command line of any host"
    expect_in "$out" "[$r]<stdout>:no_secret=UNAUTHENTICATED wrong_secret=UNAUTHENTICATED" "rank $r: calls without the secret are refused"
  done
  ;;
args)
  rm -f /tmp/rr-pwned-*
  ARGS=("with space" "it's" '"dq"' '$(touch /tmp/rr-pwned-1)' '`touch /tmp/rr-pwned-2`' 'a;touch /tmp/rr-pwned-3'
        $'x\ny' "ünïcødé ✓" "" '\back\slash' '$HOME' '*' "'" '--' '-x')
  XVAL=$'v a"l\'ue $(touch /tmp/rr-pwned-4);`touch /tmp/rr-pwned-5`\nline2 ü'
  hex() { printf "%s" "$1" | od -An -tx1 | tr -d ' \n'; }
  expected=
  for a in "${ARGS[@]}"; do expected+="$(hex "$a")|"; done
  expected+="x=$(hex "$XVAL")"
  out=$(timeout 60 "${RINGRUN[@]}" -np 4 -H "$H4" -x "RR_X=$XVAL" /bin/sh -c \
    'for a in "$@"; do printf "%s" "$a" | od -An -tx1 | tr -d " \n"; printf "|"; done; printf "x="; printf "%s" "$RR_X" | od -An -tx1 | tr -d " \n"; echo' \
    sh "${ARGS[@]}" 2>&1)
  rc=$?
  [[ $rc == 0 ]] && pass "the job runs" || fail "rc=$rc: $out"
  for r in 0 1 2 3; do
    expect_in "$out" "[$r]<stdout>:$expected" "rank $r (${HP}$((r + 1))): every argument and the -x value byte for byte"
  done
  if ls /tmp/rr-pwned-* >/dev/null 2>&1; then fail "something was executed: $(ls /tmp/rr-pwned-*)"; else pass "nothing in them was executed"; fi
  ;;
restarts)
  # --max-restarts over SSH: rank 2 (on host 3) fails in attempts 0 and 1, the others wait until
  # they are ended; attempt 2 runs on the same hosts and succeeds. Each rank of attempt N>0
  # checks that no process of attempt N-1 is alive on any host (one PID namespace for all).
  cat >"$TMP/worker" <<'EOF'
#!/bin/sh
n=$RINGRUN_RESTART_COUNT
echo "attempt $n on $(hostname) rank $RINGRUN_RANK torch $TORCHELASTIC_RESTART_COUNT/$TORCHELASTIC_MAX_RESTARTS job $RINGRUN_JOB_ID"
if [ "$n" -gt 0 ]; then
  for p in $(cat "$1/pids.$((n - 1))"); do
    grep -qs '^State:[[:space:]]*[^Z[:space:]]' "/proc/$p/status" && echo "left behind: $p"
  done
fi
echo $$ >>"$1/pids.$n"
if [ "$n" -lt 2 ]; then
  [ "$RINGRUN_RANK" = 2 ] && { sleep 0.3; echo "boom $n on $(hostname)" >&2; exit 5; }
  exec sleep 60
fi
exit 0
EOF
  chmod +x "$TMP/worker"
  start=$SECONDS
  out=$(timeout 90 "${RINGRUN[@]}" -np 4 -H "$H4" --grace-period 1 --max-restarts 3 \
    -x "RR_TEST_TAG=$TAG" "$TMP/worker" "$TMP" 2>&1)
  rc=$?
  [[ $rc == 0 ]] && pass "the third attempt succeeds: rc 0 ($((SECONDS - start)) s)" || fail "rc=$rc: $out"
  for a in 2 3; do
    expect_in "$out" "ringrun: restarting the job (attempt $a of 4) after rank 2 on host ${HP}3 exited with code 5" \
      "restart line $((a - 1)) names the rank, host and attempt"
  done
  for r in 0 1 2 3; do
    expect_in "$out" "[$r]<stdout>:attempt 2 on ${HP}$((r + 1)) rank $r torch 2/3" \
      "rank $r ran its third attempt on the same host, told its restart count"
  done
  expect_not_in "$out" "left behind" "no process of an attempt outlived it"
  expect_not_in "$out" "attempt 3 on" "no fourth attempt"
  n=$(grep -o 'job [0-9a-f]*$' <<<"$out" | sort -u | wc -l)
  ((n == 3)) && pass "a job id (and secret) per attempt" || fail "$n job ids in 3 attempts"
  wait_gone 5 job_left && pass "nothing left on any host" || fail "left: $(job_left)"
  # A lost agent restarts the job too: kill -9 of host 2's agent in the first attempt.
  JOB_LOG=$TMP/job.log
  "${RINGRUN[@]}" -np 4 -H "$H4" --max-restarts 1 -x "RR_TEST_TAG=$TAG" /bin/sh -c \
    'if [ "$RINGRUN_RESTART_COUNT" = 0 ]; then exec sleep 60; fi; echo "second attempt on $(hostname)"' \
    >"$JOB_LOG" 2>&1 &
  JOB_PID=$!
  cleanup_hooks+=("kill -9 $JOB_PID 2>/dev/null")
  start=$SECONDS
  while (($(tagged | wc -l) < 4)) && ((SECONDS - start < 20)); do sleep 0.1; done
  victim=$(agents_on 2 | head -1)
  [[ -n $victim ]] || { fail "no agent on ${HP}2"; finish; }
  kill -9 "$victim"
  wait_job 40
  [[ $JOB_RC == 0 ]] && pass "after a lost agent, the second attempt succeeds (${JOB_SECS}s)" ||
    fail "rc=$JOB_RC after ${JOB_SECS}s: $(cat "$JOB_LOG")"
  expect_in "$(cat "$JOB_LOG")" "restarting the job (attempt 2 of 2) after" "the restart is announced"
  expect_in "$(cat "$JOB_LOG")" "${HP}2" "naming the lost host"
  expect_in "$(cat "$JOB_LOG")" "second attempt on ${HP}2" "the lost host runs the second attempt"
  wait_gone 10 job_left && pass "nothing left on any host" || fail "left: $(job_left)"
  ;;
*) fail "unknown case $CASE" ;;
esac
finish
