# Shared helpers for the integration tests (bash). Each test exports a unique tag (not RINGRUN_*:
# the launcher keeps those from ranks) into the
# environment of ringrun, so the launcher, its agents and every rank carry it; after a test,
# no process with the tag may remain (checked across /proc).
set -u
: "${BIN:?BIN must point at build/bin}"
RINGRUN="$BIN/ringrun"
PROBE="$BIN/ringrun-test-probe"
export RRTEST_JOB_TAG="rrtest-$$-$RANDOM$RANDOM"
WORK=$(mktemp -d /tmp/ringrun-it.XXXXXX)

fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "PASS: $*"; }

tagged_pids() {
  local f pid
  for f in /proc/[0-9]*/environ; do
    pid=${f#/proc/}; pid=${pid%/environ}
    [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
    if { tr '\0' '\n' < "$f"; } 2>/dev/null | grep -qx "RRTEST_JOB_TAG=$RRTEST_JOB_TAG"; then
      # Skip this shell's own subshells.
      [[ "$(cat /proc/$pid/comm 2>/dev/null)" == bash ]] && continue
      echo "$pid"
    fi
  done
}

# Fails if any process of this test's job is still alive after `within` seconds.
expect_no_orphans() {
  local within=${1:-3} left
  local end=$((SECONDS + within))
  while :; do
    left=$(tagged_pids)
    [[ -z $left ]] && return 0
    (( SECONDS >= end )) && break
    sleep 0.1
  done
  for p in $left; do echo "left behind: $p $(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null)" >&2; done
  kill -9 $left 2>/dev/null
  fail "processes of the job outlived ringrun"
}

# Waits until FILE has COUNT lines containing TEXT (the ranks' readiness lines), for at most
# SECONDS; fails the test naming what it waited for otherwise.
wait_for_lines() {  # FILE TEXT COUNT SECONDS
  local end=$((SECONDS + $4)) n
  while :; do
    n=$(grep -cF -- "$2" "$1" 2>/dev/null)
    (( ${n:-0} >= $3 )) && return 0
    (( SECONDS >= end )) && break
    sleep 0.05
  done
  echo "--- $1:" >&2; head -50 "$1" >&2 2>/dev/null
  fail "waited $4 s for $3 lines with '$2' in $1, found ${n:-0}"
}

expect_contains() {  # FILE TEXT
  grep -qF -- "$2" "$1" || { echo "--- $1:" >&2; head -50 "$1" >&2; fail "expected '$2' in $1"; }
}
expect_not_contains() {
  ! grep -qF -- "$2" "$1" || { echo "--- $1:" >&2; head -50 "$1" >&2; fail "did not expect '$2' in $1"; }
}
expect_rc() {  # WANT GOT WHAT
  [[ $1 == "$2" ]] || fail "$3: exit code $2, expected $1"
}

# Whatever happens to a test (a failed check included), it leaves no job behind.
cleanup() {
  local left
  left=$(tagged_pids)
  [[ -n $left ]] && kill -9 $left 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
