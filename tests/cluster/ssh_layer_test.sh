#!/bin/bash
# The SSH layer on the test cluster, through ssh_smoke (the real starter, a fake agent):
# the remote command and the secret, host keys (unknown, accepted, changed), a wrong key,
# refused, unreachable and unresolvable hosts, a missing agent, Kill() ending the remote side.
source "$(dirname "$0")/lib.sh"
SMOKE="$BIN_DIR/ssh_smoke"
FAKE="$SRC_DIR/tests/cluster/fake_agent.sh"
H1=${RR_NET}.2
smoke() { timeout 30 "$SMOKE" "$@" 2>&1; }

# 1. A normal start: the command line, the secret on stdin, output relayed, Kill() ends it.
out=$(smoke --host "root@$H1" -i "$RR_KEY" --known-hosts "$RR_KNOWN_HOSTS" --agent-path "$FAKE" \
      --kill-after-ms 1500 --wait-s 5)
expect_in "$out" "hostname=${RR_HOST_PREFIX}1" "the agent runs on ${RR_HOST_PREFIX}1"
expect_in "$out" "arg0=--launcher" "--launcher is the first argument"
expect_in "$out" "arg1=${RR_NET}.1:1" "the launcher address is the SSH socket's local address"
expect_in "$out" "arg3=0" "--host-index"
expect_in "$out" "secret_len=64" "the secret arrives as the first stdin line"
expect_in "$out" "secret_in_cmdline=no" "the secret is on no command line"
expect_in "$out" "[agent root@$H1] stdout works" "output is relayed with the host"
expect_in "$out" "exit=137" "Kill() reports 137"
if wait_gone 5 pids_with_cmdline "$FAKE"; then pass "Kill() leaves nothing on the host"
else fail "fake agent still running after Kill(): $(pids_with_cmdline "$FAKE")"; fi

# 2. By name (from /etc/hosts), and --launcher-address.
out=$(smoke --host ${RR_HOST_PREFIX}2 -i "$RR_KEY" --known-hosts "$RR_KNOWN_HOSTS" --agent-path "$FAKE" \
      --launcher-address ${RR_NET}.99 --kill-after-ms 1000 --wait-s 5)
expect_in "$out" "hostname=${RR_HOST_PREFIX}2" "a host name from /etc/hosts"
expect_in "$out" "arg1=${RR_NET}.99:1" "--launcher-address overrides the socket address"

# 3. A missing agent, and a failing one.
out=$(smoke --host "$H1" -i "$RR_KEY" --known-hosts "$RR_KNOWN_HOSTS" \
      --agent-path /nonexistent/ringrun-agent --wait-s 10)
expect_in "$out" "exit=127" "a missing agent exits 127"
expect_in "$out" "not found at /nonexistent/ringrun-agent" "and is described with its path"
out=$(smoke --host "$H1" -i "$RR_KEY" --known-hosts "$RR_KNOWN_HOSTS" --agent-path /bin/false --wait-s 10)
expect_in "$out" "exit=1" "the remote exit status comes back"

# 4. Host keys.
: >"$TMP/empty_kh"
out=$(smoke --host "$H1" -i "$RR_KEY" --known-hosts "$TMP/empty_kh" --agent-path /bin/true)
expect_in "$out" "start failed: permission denied" "an unknown host key is refused"
expect_in "$out" "host key unknown" "  and classified"
expect_in "$out" "SHA256:" "  with its fingerprint"
expect_in "$out" "--ssh-accept-new-host-keys" "  and the hint to accept it"
[[ ! -s $TMP/empty_kh ]] && pass "  known_hosts untouched" || fail "known_hosts was written"

: >"$TMP/new_kh"
out=$(smoke --host "$H1" -i "$RR_KEY" --known-hosts "$TMP/new_kh" --accept-new --agent-path /bin/true)
expect_in "$out" "exit=0" "--accept-new accepts an unknown key"
expect_in "$(cat "$TMP/new_kh")" "$H1" "  and appends it"
out=$(smoke --host "$H1" -i "$RR_KEY" --known-hosts "$TMP/new_kh" --agent-path /bin/true)
expect_in "$out" "exit=0" "  after which the host is known"

echo "$H1 $(cut -d' ' -f1,2 "$RR_CLUSTER_DIR/h2/ssh_host_ed25519_key.pub")" >"$TMP/changed_kh"
before=$(sha256sum <"$TMP/changed_kh")
real_fp=$(ssh-keygen -lf "$RR_CLUSTER_DIR/h1/ssh_host_ed25519_key.pub" | awk '{print $2}')
out=$(smoke --host "$H1" -i "$RR_KEY" --known-hosts "$TMP/changed_kh" --accept-new --agent-path /bin/true)
expect_in "$out" "host key changed" "a changed host key is refused, even with --accept-new"
expect_in "$out" "$real_fp" "  naming the server's SHA-256 fingerprint"
[[ $(sha256sum <"$TMP/changed_kh") == "$before" ]] && pass "  known_hosts untouched" || fail "known_hosts changed"

# 5. A key the host does not accept.
ssh-keygen -q -t ed25519 -N '' -f "$TMP/wrong_key"
out=$(smoke --host "$H1" -i "$TMP/wrong_key" --known-hosts "$RR_KNOWN_HOSTS" --agent-path /bin/true)
expect_in "$out" "authentication denied" "a wrong key is denied"
expect_in "$out" "$H1: authentication denied for user root" "  naming the host and user"

# 6. Refused, unreachable, unresolvable.
out=$(smoke --host "$H1" --port 2222 -i "$RR_KEY" --known-hosts "$RR_KNOWN_HOSTS" --agent-path /bin/true)
expect_in "$out" "connection refused" "a closed port is refused"
expect_in "$out" "$H1" "  naming the host"
start=$SECONDS
out=$(smoke --host ${RR_NET}.250 --timeout 2 -i "$RR_KEY" --known-hosts "$RR_KNOWN_HOSTS" --agent-path /bin/true)
took=$((SECONDS - start))
expect_in "$out" "start failed" "an unreachable address fails"
if grep -qE "timed out|unreachable" <<<"$out"; then pass "  classified as timeout/unreachable"; else fail "  classification: $out"; fi
((took <= 4)) && pass "  within the connect timeout (${took}s for 2s)" || fail "took ${took}s for a 2s timeout"
out=$(timeout 30 unshare --net "$SMOKE" --host rr-nosuch.invalid -i "$RR_KEY" --agent-path /bin/true 2>&1)
expect_in "$out" "name resolution failed" "an unknown name is a resolution failure"
expect_in "$out" "rr-nosuch.invalid" "  naming the host"

finish
