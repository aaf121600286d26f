# shellcheck shell=bash
# Helpers of the soaks, scripts/soak.sh and scripts/elastic-soak.sh (sourced, after
# `eval "$(scripts/test-cluster.sh env)"`). They read HP (the host name prefix, rr<K>-h),
# RR_CLUSTER_DIR, RANK_COMM (the job's rank program, as /proc/PID/comm has it: its first 15
# characters), TAG (the job's RR_SOAK_TAG), JOB_PID (ringrun, or empty), WORK (holding
# shm.base, written by shm_snapshot before the first job) and SKIP_SSHD (below).

now() { date +%s.%N; }
secs_since() { echo "$(now) - $1" | bc -l | xargs printf '%.1f'; }
# PIDs in host i's namespace other than its sshd daemon.
host_pids() {
  local sshd
  sshd=$(cat "$RR_CLUSTER_DIR/h$1/sshd.pid" 2>/dev/null)
  ip netns pids "${HP}$1" 2>/dev/null | grep -vx "${sshd:-none}"
}
all_host_pids() { local i; for i in 1 2 3 4; do host_pids "$i"; done; }
# The job's ranks (RANK_COMM processes carrying its tag), wherever they run. Only those
# processes are read: scanning every process's environment takes seconds on a loaded machine,
# long enough for a job to end before its fault.
tagged() {
  local p
  for p in $(pgrep -x "$RANK_COMM"); do
    tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qxF "RR_SOAK_TAG=$TAG" && echo "$p"
  done
}
agents_on() {
  local p
  for p in $(host_pids "$1"); do
    tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q ringrun-agent && echo "$p"
  done
}
# Every process of the job: in the host namespaces, the tagged ranks anywhere, and ringrun.
left_procs() {
  local p
  { all_host_pids; tagged; [[ -n $JOB_PID ]] && kill -0 "$JOB_PID" 2>/dev/null && echo "$JOB_PID"; } |
    sort -u | while read -r p; do
      # With SKIP_SSHD set: not the cut host's sshd session, which waits on its dead TCP
      # connection (sshd's, not ringrun's) until the link returns.
      [[ -n ${SKIP_SSHD:-} && $(cat "/proc/$p/comm" 2>/dev/null) == sshd ]] || echo "$p"
    done
}
# "    left: pid ..." lines for the PIDs given.
describe_procs() {
  local p
  for p in "$@"; do
    echo "    left: pid $p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-100) [$(awk '/^State/{print $2}' "/proc/$p/status" 2>/dev/null)] netns $(ip netns identify "$p" 2>/dev/null)"
  done
}
# Listening TCP ports and Unix sockets in the host namespaces (sshd's excepted), and the
# launcher's here (other programs on this machine have ports of their own).
left_ports() {
  local i
  for i in 1 2 3 4; do
    ip netns exec "${HP}$i" ss -Htlnp 2>/dev/null | grep -v '"sshd"' | sed "s/^/${HP}$i tcp: /"
    ip netns exec "${HP}$i" ss -Hxlp 2>/dev/null | grep -v '"sshd"' | sed "s/^/${HP}$i unix: /"
  done
  if [[ -n $JOB_PID ]]; then
    ss -Htlnp 2>/dev/null | grep "pid=$JOB_PID," | sed 's/^/launcher tcp: /'
  fi
}
shm_snapshot() { find /dev/shm -maxdepth 1 -iname '*ringrun*' -printf '%f\n' 2>/dev/null | sort; }
# New ringrun entries in /dev/shm since shm.base, and memfds held by the job's processes.
left_shm() {
  local n p
  n=$(comm -13 "$WORK/shm.base" <(shm_snapshot) | grep -c .)
  for p in $(left_procs); do
    n=$((n + $(find "/proc/$p/fd" -lname 'memfd:*' 2>/dev/null | grep -c .)))
  done
  echo "$n"
}
kill_leftovers() {
  local p
  for p in $(left_procs 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
}
# The median and the maximum of the numbers in column COL of the CSV rows in FILE: "m / max".
median_max() {
  cut -d, -f"$1" "$2" | grep -E '^[0-9.]+$' | sort -n |
    awk '{v[NR] = $1} END {if (NR == 0) {print "-"; exit}
         m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.1f / %.1f", m, v[NR]}'
}
