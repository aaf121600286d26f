#!/bin/bash
# libringrun under other launchers across two namespace hosts of the test cluster (issue 33),
# 2 ranks on each: launcher_test.sh CASE, one CTest test per case.
#   torchrun  one torchrun node per host, started over ssh; ringrun.torch finds its peers
#             through torch's store on host 1. Every rank checks rank, size, local_rank/local_size
#             (torchrun's LOCAL_RANK, LOCAL_WORLD_SIZE) and cross_rank/cross_size (the node, the
#             node count) against torchrun's variables, and allreduces.
#   mpirun    mpirun -H h1:2,h2:2 (Open MPI over ssh with the cluster's key); libringrun finds
#             its peers through PMIx; each rank checks its numbering and allreduces.
source "$(dirname "$0")/lib.sh"
CASE=${1:?usage: launcher_test.sh CASE}
HP=$RR_HOST_PREFIX
PY=/usr/bin/python3
SSH=(ssh -i "$RR_KEY" -o UserKnownHostsFile="$RR_KNOWN_HOSTS" -o StrictHostKeyChecking=yes
     -o BatchMode=yes -o ConnectTimeout=5)

if [[ $CASE == mpirun ]]; then
  command -v mpirun >/dev/null || { echo "SKIP: no mpirun (openmpi-bin)"; exit 77; }
  timeout 90 mpirun --allow-run-as-root -np 4 -H "${HP}1:2,${HP}2:2" \
    --mca plm_rsh_agent "${SSH[*]}" --mca oob_tcp_if_include "$RR_NET.0/24" \
    "$BIN_DIR/runtime_test_worker" launched >"$TMP/out" 2>&1
  rc=$?
  cat "$TMP/out"
  ((rc == 0)) && pass "mpirun exited 0" || fail "mpirun exited $rc"
  for r in 0 1 2 3; do
    expect_in "$(cat "$TMP/out")" "launched rank=$r size=4 local=$((r % 2))/2 cross=$((r / 2))/2 sum=10" \
      "rank $r: numbering across two hosts and the sum"
  done
  expect_in "$(cat "$TMP/out")" "data plane at $RR_NET.3:" "host 2's ranks give host 2's address"
  finish
fi

[[ $CASE == torchrun ]] || { echo "unknown case $CASE"; exit 2; }
$PY -c 'import torch' 2>/dev/null || { echo "SKIP: needs Debian's python3-torch"; exit 77; }
PYDIR=$(cd "$BIN_DIR/../python" && pwd)
master=$RR_NET.2  # host 1
port=29531
pids=()
for node in 0 1; do
  # Debian's torchrun (torch 1.13, Python 3.11) fails at start without --redirects 1 --tee 1.
  "${SSH[@]}" "root@${HP}$((node + 1))" "PYTHONPATH=$PYDIR PYTHONDONTWRITEBYTECODE=1 \
    RINGRUN_TIMEOUT_MS=20000 timeout 120 $PY -m torch.distributed.run --nnodes 2 \
    --node_rank $node --nproc_per_node 2 --redirects 1 --tee 1 --master_addr $master \
    --master_port $port $SRC_DIR/tests/python/torchrun_job.py hosts" >"$TMP/out$node" 2>&1 &
  pids+=($!)
  cleanup_hooks+=("kill $! 2>/dev/null")
done
wait "${pids[0]}"; rc0=$?
wait "${pids[1]}"; rc1=$?
cat "$TMP/out0" "$TMP/out1"
((rc0 == 0 && rc1 == 0)) && pass "both torchrun nodes exited 0" ||
  fail "torchrun nodes exited $rc0 and $rc1"
n=$(cat "$TMP/out0" "$TMP/out1" | grep -c 'of 4: local [01] of 2, cross [01] of 2, allreduce 10.0')
[[ $n == 4 ]] && pass "4 ranks on 2 hosts: local and cross ranks as torchrun's, allreduce right" ||
  fail "$n of 4 ranks reported the right shape and sum"
for node in 0 1; do
  [[ $(grep -c "host ${HP}$((node + 1))" "$TMP/out$node") == 2 ]] ||
    fail "node $node's ranks did not run on ${HP}$((node + 1))"
done
finish
