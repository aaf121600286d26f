#!/usr/bin/env bash
# A multi-host test cluster on one machine (needs root).
#
#   scripts/test-cluster.sh up N     N hosts rr-h1..rr-hN, each a network namespace on the bridge
#                                    rr-br0 with address 198.18.0.(i+1)/24 and its own sshd, host
#                                    key and hostname (unshare --uts). The bridge, 198.18.0.1, is
#                                    the launcher's side. Hosts beyond N are removed.
#   scripts/test-cluster.sh down     removes everything, also after a crash: every process in the
#                                    namespaces (stray agents and ranks included), the namespaces,
#                                    links, routes, /etc/hosts lines and the state directory.
#   scripts/test-cluster.sh status   prints the hosts and whether their sshd answers (exit 1 if not).
#   scripts/test-cluster.sh env      prints shell assignments for tests (RR_KEY, RR_KNOWN_HOSTS, ...).
#
# Both up and down are idempotent. The state directory (RINGRUN_CLUSTER_DIR, default
# /tmp/ringrun-cluster) holds id_ed25519 (the client key, root's only authorized key), known_hosts
# (names and addresses of every host), hosts (name address lines) and h<i>/ (sshd config, host key,
# log). /etc/hosts gets "198.18.0.x rr-hI" lines marked "# ringrun-test-cluster".
#
# `up` raises the kernel's ARP table limits (net.ipv4.neigh.default.gc_thresh2/3, shared by all
# namespaces) to fit N hosts that all talk to each other; they are never lowered.
#
# Only 198.18.0.0/24 is used, only on links created here; a blackhole route for 198.18.0.0/15
# keeps any other test-net address from leaving the machine.
#
# Several clusters can live side by side (two checkouts testing at once): RINGRUN_CLUSTER_ID=K
# (1..99) names everything rr<K>-... instead of rr-..., uses 198.18.K.0/24 and its own state
# directory, lock and /etc/hosts marker. The blackhole route goes with the last bridge.
set -euo pipefail

CID=${RINGRUN_CLUSTER_ID:-}
if [[ -n $CID ]]; then
  [[ $CID =~ ^[1-9][0-9]?$ ]] || { echo "test-cluster: RINGRUN_CLUSTER_ID must be 1..99, not '$CID'" >&2; exit 2; }
fi
P="rr$CID"  # name prefix: rr (default cluster) or rr<K>
STATE=${RINGRUN_CLUSTER_DIR:-/tmp/ringrun-cluster$CID}
LOCK=/tmp/ringrun-cluster$CID.lock
BRIDGE=$P-br0
NET=198.18.${CID:-0}
MARK="# ringrun-test-cluster$CID"
MAX_HOSTS=200
ROOT_HOME=$(getent passwd root | cut -d: -f6)

die() { echo "test-cluster: $*" >&2; exit 1; }
log() { [[ -n ${QUIET:-} ]] || echo "test-cluster: $*" >&2; }

host_addr() { echo "$NET.$(( $1 + 1 ))"; }

existing_hosts() {  # indices of rr-h<i> namespaces, sorted
  ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^$P-h\([0-9][0-9]*\)\$/\1/p" | sort -n
}

sshd_alive() {  # i
  local pidfile="$STATE/h$1/sshd.pid" pid
  [[ -s $pidfile ]] || return 1
  pid=$(cat "$pidfile")
  kill -0 "$pid" 2>/dev/null || return 1
  # A zombie (killed, not yet reaped) has no namespace links; a live sshd is in its host's.
  local ns
  ns=$(readlink "/proc/$pid/ns/net" 2>/dev/null) || return 1
  [[ -n $ns && $ns != "$(readlink /proc/self/ns/net)" ]]
}

port_open() {  # addr, within a second
  timeout 1 bash -c "exec 3<>/dev/tcp/$1/22" 2>/dev/null
}

remove_host() {  # i: kill everything in the namespace, then remove it and its link
  local i=$1 ns="$P-h$1" pids
  if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$ns"; then
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [[ -n $pids ]]; then
      # shellcheck disable=SC2086
      kill -9 $pids 2>/dev/null || true
      for _ in $(seq 50); do
        [[ -z $(ip netns pids "$ns" 2>/dev/null) ]] && break
        sleep 0.1
      done
    fi
    ip netns del "$ns" 2>/dev/null || true
  fi
  ip link del "$P-v$i" 2>/dev/null || true
  rm -rf "${STATE:?}/h$i"
}

ensure_base() {
  command -v sshd >/dev/null || [[ -x /usr/sbin/sshd ]] || die "sshd not found (apt-get install openssh-server)"
  mkdir -p "$STATE" /run/sshd
  chmod 700 "$STATE"
  chmod 755 /run/sshd
  [[ -f $STATE/id_ed25519 ]] || ssh-keygen -q -t ed25519 -N '' -C ringrun-test-cluster -f "$STATE/id_ed25519"
  cp "$STATE/id_ed25519.pub" "$STATE/authorized_keys"
  : >"$STATE/empty_rc"
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
  fi
  ip addr replace "$NET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  ip route show type blackhole 2>/dev/null | grep -q '^blackhole 198.18.0.0/15' ||
    ip route add blackhole 198.18.0.0/15
}

make_host() {  # i
  local i=$1 ns="$P-h$1" addr dir
  addr=$(host_addr "$i")
  dir="$STATE/h$i"
  remove_host "$i"
  mkdir -p "$dir"
  ssh-keygen -q -t ed25519 -N '' -C "$P-h$i" -f "$dir/ssh_host_ed25519_key"
  cat >"$dir/sshd_config" <<EOF
Port 22
ListenAddress $addr
HostKey $dir/ssh_host_ed25519_key
PidFile $dir/sshd.pid
AuthorizedKeysFile $STATE/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
MaxStartups 500
MaxSessions 100
X11Forwarding no
AllowTcpForwarding no
AllowAgentForwarding no
PermitTunnel no
PrintMotd no
PrintLastLog no
LogLevel INFO
EOF
  ip netns add "$ns"
  ip link add "$P-v$i" type veth peer name "$P-p$i"
  ip link set "$P-p$i" netns "$ns"
  ip link set "$P-v$i" master "$BRIDGE" up
  ip -n "$ns" link set "$P-p$i" name eth0
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  # sshd daemonizes; the daemon keeps the namespace, the UTS namespace with the hostname and a
  # private mount namespace in which root's ~/.bashrc is empty: Debian's bash sources it for
  # every command sshd runs, and this machine's (pyenv init) costs ~0.4 s of CPU per login,
  # which a clean host would not pay (RINGRUN_CLUSTER_KEEP_BASHRC=1 keeps it).
  local rc_mount=
  if [[ -z ${RINGRUN_CLUSTER_KEEP_BASHRC:-} && -f $ROOT_HOME/.bashrc ]]; then
    rc_mount="mount --bind '$STATE/empty_rc' '$ROOT_HOME/.bashrc' && "
  fi
  ip netns exec "$ns" unshare --uts --mount /bin/sh -c \
    "${rc_mount}hostname $P-h$i && exec /usr/sbin/sshd -f '$dir/sshd_config' -E '$dir/sshd.log'"
}

update_names() {  # n: known_hosts, hosts file and /etc/hosts for hosts 1..n
  local n=$1 i addr tmp
  : >"$STATE/known_hosts.new"
  : >"$STATE/hosts.new"
  for i in $(seq "$n"); do
    addr=$(host_addr "$i")
    echo "$P-h$i,$addr $(cut -d' ' -f1,2 "$STATE/h$i/ssh_host_ed25519_key.pub")" >>"$STATE/known_hosts.new"
    echo "$P-h$i $addr" >>"$STATE/hosts.new"
  done
  mv "$STATE/known_hosts.new" "$STATE/known_hosts"
  mv "$STATE/hosts.new" "$STATE/hosts"
  # /etc/hosts may be a bind mount: rewrite it in place, never replace it.
  tmp=$(mktemp)
  grep -v -- "$MARK\$" /etc/hosts >"$tmp" || true
  for i in $(seq "$n"); do echo "$(host_addr "$i") $P-h$i $MARK" >>"$tmp"; done
  cat "$tmp" >/etc/hosts
  rm -f "$tmp"
}

# The kernel's ARP table is one table for every namespace, with its limits (gc_thresh2/3)
# counted over all of them: N hosts whose ranks all talk to each other need about N*(N+1)
# entries (each host's peers and the bridge), and past gc_thresh3 (1024 by default, so about
# 31 hosts) connects fail with "No route to host" ("neighbor table overflow" in dmesg). Raised
# for N hosts, never lowered (room for the other clusters beside this one).
ensure_neigh_table() {  # N
  local need=$((2 * ($1 + 1) * ($1 + 1) + 1024)) key cur
  for key in gc_thresh2 gc_thresh3; do
    cur=$(sysctl -n "net.ipv4.neigh.default.$key")
    ((cur >= need)) || sysctl -q -w "net.ipv4.neigh.default.$key=$need"
    need=$((need * 2))
  done
}

cmd_up() {
  local n=${1:-}
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= MAX_HOSTS)) || die "usage: up N (1..$MAX_HOSTS)"
  ensure_base
  ensure_neigh_table "$n"
  local i
  for i in $(existing_hosts); do ((i > n)) && remove_host "$i"; done
  for i in $(seq "$n"); do
    if ip netns list | awk '{print $1}' | grep -qx "$P-h$i" && sshd_alive "$i" &&
       ip link show "$P-v$i" >/dev/null 2>&1; then
      continue
    fi
    log "starting $P-h$i ($(host_addr "$i"))"
    make_host "$i"
  done
  update_names "$n"
  for i in $(seq "$n"); do
    local ok= start=$SECONDS
    while ((SECONDS - start < 15)); do
      if port_open "$(host_addr "$i")"; then ok=1; break; fi
      sleep 0.05
    done
    [[ -n $ok ]] || die "$P-h$i: sshd does not answer on $(host_addr "$i"):22 (see $STATE/h$i/sshd.log)"
  done
  log "up: $n hosts, state in $STATE"
}

cmd_down() {
  local i
  for i in $(existing_hosts); do remove_host "$i"; done
  # Links left by a crash between "ip link add" and "ip netns add".
  for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^$P-[vp][0-9]+\$" || true); do
    ip link del "$l" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  # The blackhole route protects every cluster: it goes with the last bridge.
  if ! ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' | grep -qE '^rr[0-9]*-br0'; then
    ip route del blackhole 198.18.0.0/15 2>/dev/null || true
  fi
  if grep -q -- "$MARK\$" /etc/hosts 2>/dev/null; then
    local tmp
    tmp=$(mktemp)
    grep -v -- "$MARK\$" /etc/hosts >"$tmp" || true
    cat "$tmp" >/etc/hosts
    rm -f "$tmp"
  fi
  rm -rf "${STATE:?}"
  log "down"
}

cmd_status() {
  local hosts i bad=0
  hosts=$(existing_hosts)
  if [[ -z $hosts ]]; then echo "no hosts"; return 1; fi
  for i in $hosts; do
    local addr state
    addr=$(host_addr "$i")
    if sshd_alive "$i" && port_open "$addr"; then state=up; else state=DOWN; bad=1; fi
    echo "$P-h$i $addr sshd=$state procs=$(ip netns pids "$P-h$i" 2>/dev/null | wc -l)"
  done
  return $bad
}

cmd_env() {
  echo "RR_CLUSTER_DIR=$STATE"
  echo "RR_KEY=$STATE/id_ed25519"
  echo "RR_KNOWN_HOSTS=$STATE/known_hosts"
  echo "RR_LAUNCHER_ADDR=$NET.1"
  echo "RR_NET=$NET"
  echo "RR_HOST_PREFIX=$P-h"
  echo "RR_LINK_PREFIX=$P-v"  # the bridge side of host i's link is $P-v<i>
  echo "RR_HOSTS=\"$(existing_hosts | sed "s/^/$P-h/" | tr '\n' ' ' | sed 's/ $//')\""
}

[[ $(id -u) == 0 ]] || die "needs root (network namespaces, sshd)"
cmd=${1:-}
shift || true
exec 9>"$LOCK"
flock -w 120 9 || die "another test-cluster.sh holds $LOCK"
case $cmd in
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  *) die "usage: $0 up N | down | status | env" ;;
esac
