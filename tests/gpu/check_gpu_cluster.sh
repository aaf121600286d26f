#!/usr/bin/env bash
# `ringrun --check-gpu` across the test cluster's hosts (scripts/test-cluster.sh up N): none has a
# GPU, so every host gets a FAIL row naming the cause and the command exits 1 within 10 s.
#   SRC_DIR=... BIN_DIR=... check_gpu_cluster.sh    (77 = skipped: not root)
SRC_DIR=${SRC_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
BIN_DIR=${BIN_DIR:-${1:?bin dir}}
export SRC_DIR BIN_DIR
# shellcheck source=../cluster/lib.sh
source "$SRC_DIR/tests/cluster/lib.sh"

read -r -a hosts <<<"$RR_HOSTS"
((${#hosts[@]} >= 2)) || { fail "the cluster has fewer than 2 hosts"; finish; }
hlist=$(printf 'root@%s,' "${hosts[@]:0:4}")
hlist=${hlist%,}

start=$(date +%s.%N)
out=$(timeout 60 "$BIN_DIR/ringrun" --check-gpu -H "$hlist" -i "$RR_KEY" \
  --ssh-known-hosts "$RR_KNOWN_HOSTS" --launcher-address "$RR_LAUNCHER_ADDR" 2>&1)
rc=$?
took=$(echo "$(date +%s.%N) - $start" | bc)
echo "$out"
[[ $rc == 1 ]] && pass "--check-gpu exit 1" || fail "--check-gpu exited $rc, expected 1"
(($(echo "$took < 10" | bc))) && pass "--check-gpu took ${took}s" || fail "--check-gpu took ${took}s (>= 10 s)"
for h in "${hosts[@]:0:4}"; do
  row=$(grep -E "^root@$h +FAIL" <<<"$out")
  expect_in "$row" "no CUDA driver: " "row for $h names the cause"
done
finish
