# Shared helpers for the cluster tests (sourced). Needs the cluster from scripts/test-cluster.sh.
set -uo pipefail

SRC_DIR=${SRC_DIR:?SRC_DIR must name the source tree}
BIN_DIR=${BIN_DIR:?BIN_DIR must name the bin directory of the build}
[[ $(id -u) == 0 ]] || { echo "SKIP: cluster tests need root"; exit 77; }
eval "$("$SRC_DIR/scripts/test-cluster.sh" env)"
"$SRC_DIR/scripts/test-cluster.sh" status >/dev/null ||
  { echo "FAIL: the test cluster is not up (scripts/test-cluster.sh up 4)"; exit 1; }

TMP=$(mktemp -d /tmp/ringrun-cluster-test.XXXXXX)
FAILS=0
cleanup_hooks=()
on_exit() {
  local h
  for h in "${cleanup_hooks[@]}"; do eval "$h" || true; done
  rm -rf "$TMP"
}
trap on_exit EXIT

fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
pass() { echo "ok: $*"; }
# expect_in OUTPUT NEEDLE WHAT
expect_in() {
  if grep -qF -- "$2" <<<"$1"; then pass "$3"; else fail "$3: no '$2' in:"; echo "$1" | sed 's/^/    /'; fi
}
expect_not_in() {
  if grep -qF -- "$2" <<<"$1"; then fail "$3: unexpected '$2' in:"; echo "$1" | sed 's/^/    /'; else pass "$3"; fi
}
# PIDs (any host: the namespaces share the pid namespace) whose environment holds NAME=VALUE.
pids_with_env() {
  local p
  for p in /proc/[0-9]*; do
    if tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -qxF -- "$1"; then echo "${p#/proc/}"; fi
  done
}
# PIDs whose command line contains STRING.
pids_with_cmdline() {
  local p
  for p in /proc/[0-9]*; do
    [[ ${p#/proc/} == "$$" || ${p#/proc/} == "$BASHPID" ]] && continue
    if tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -qF -- "$1"; then echo "${p#/proc/}"; fi
  done
}
# wait_gone SECONDS CMD...: waits until CMD prints nothing; returns 1 if it never does.
wait_gone() {
  local limit=$1 start=$SECONDS
  shift
  while ((SECONDS - start < limit)); do
    [[ -z $("$@") ]] && return 0
    sleep 0.2
  done
  [[ -z $("$@") ]]
}
finish() {
  if ((FAILS)); then echo "$FAILS check(s) failed"; exit 1; fi
  echo "all checks passed"
  exit 0
}
