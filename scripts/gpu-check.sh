#!/usr/bin/env bash
# The GPU checks, for a machine with one or more NVIDIA GPUs, CUDA and NCCL at /usr/local/cuda.
# Builds ringrun with NCCL, then runs:
#   1. a 1-rank NCCL job: gpu_collectives (every dtype, device memory) at np=1;
#   2. two ranks on one GPU with distinct NCCL_HOSTID: allreduce/broadcast/allgather for every dtype;
#   2c. the engine's device path alone at np=2 (gpu_collectives engine): fused named device
#      allreduces with scale factors (one NCCL PreMulSum), reducescatter, alltoall with splits,
#      ragged allgather (results in device memory owned by the handle), an _on_stream call
#      ordered on the program's own stream, with a timeline that must show the NCCL spans;
#   3. ringrun --check-gpu --allreduce;
#   4. ringrun-bench --device cuda at np=1 and np=2 (busbw at 1 MiB and 256 MiB);
#   5. a peer stopped (SIGSTOP) and a peer killed (SIGKILL) in the middle of an allreduce: the
#      other rank must fail (NCCL aborted) within the collective timeout;
#   6. ringrun.torch on CUDA tensors at np=1 and np=2 (tests/gpu/torch_cuda_check.py; SKIP when
#      the machine's torch has no CUDA);
#   (1 and 2 include the engine's device checks: named device allreduces submitted in a
#   different order per rank, negotiated and run on NCCL, the NCCL id made at the first device
#   collective and broadcast over the CPU transport; and a CPU-only job must not load CUDA.)
# and prints a short table last. Designed to fit in 10 minutes (the build is most of it).
#
#   scripts/gpu-check.sh [--prebuilt] [BUILD_DIR]   default build-gpu; JOBS=N for the build's
#                                                   parallelism; PYTHON=... for step 6's interpreter
#   --prebuilt   BUILD_DIR was built elsewhere (-DRINGRUN_WITH_NCCL=ON, on a machine with the build's
#                dependencies): skip the build. BUILD_DIR/bin, BUILD_DIR/lib and BUILD_DIR/python
#                are used as they are; LD_LIBRARY_PATH must reach libringrun's dependencies, NCCL
#                and the CUDA runtime on this machine.
# Exit 0 when every step passed.
set -uo pipefail

SRC=$(cd "$(dirname "$0")/.." && pwd)
PREBUILT=0
if [[ ${1:-} == --prebuilt ]]; then
  PREBUILT=1
  shift
fi
BUILD=${1:-$SRC/build-gpu}
PYTHON=${PYTHON:-/usr/bin/python3}
JOBS=${JOBS:-$(nproc)}
TIMEOUT_MS=${GPU_CHECK_TIMEOUT_MS:-8000}   # RINGRUN_TIMEOUT_MS of the kill tests
TMP=$(mktemp -d /tmp/ringrun-gpu-check.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
BIN=$BUILD/bin

rows=()
failed=0
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
# row NAME PASS|FAIL SECONDS DETAIL
row() {
  rows+=("$(printf '%-34s %-5s %7ss  %s' "$1" "$2" "$3" "$4")")
  [[ $2 == PASS ]] || failed=$((failed + 1))
  echo "== $1: $2 ($3 s) $4"
}

echo "== host: $(hostname); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

# 0. Build.
t=$(now)
if ((PREBUILT)); then
  row "build (prebuilt, not built here)" PASS "$(since "$t")" "$BUILD"
else
  gen=(-G Ninja)  # a folder that already has a cache keeps its generator
  [[ -f $BUILD/CMakeCache.txt ]] && gen=()
  if cmake -S "$SRC" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DRINGRUN_WITH_NCCL=ON \
       >"$TMP/cmake.log" 2>&1 &&
     cmake --build "$BUILD" -j "$JOBS" --target ringrun ringrun-agent ringrun-gpu-probe \
       ringrun-bench gpu_collectives runtime_test_worker ringrun_python >"$TMP/build.log" 2>&1; then
    row "build (RINGRUN_WITH_NCCL=ON)" PASS "$(since "$t")" "$(grep -m1 'NCCL backend' "$TMP/cmake.log" | sed 's/^-- //')"
  else
    tail -30 "$TMP/cmake.log" "$TMP/build.log"
    row "build (RINGRUN_WITH_NCCL=ON)" FAIL "$(since "$t")" "see the log above"
    printf '%s\n' "${rows[@]}"
    exit 1
  fi
fi
"$BIN/ringrun" --check-build

# Ranks sharing one GPU need distinct NCCL host ids (else NCCL refuses a duplicate GPU), and
# -x cannot differ per rank: this wrapper sets it from the rank, keeps NCCL on loopback, sets the
# collective timeout, and records the rank's pid for the kill tests.
WRAP=$TMP/per-rank.sh
cat >"$WRAP" <<EOF
#!/bin/sh
export NCCL_HOSTID=host-\$RINGRUN_RANK
export NCCL_SOCKET_IFNAME=lo
export NCCL_IB_DISABLE=1
export RINGRUN_TIMEOUT_MS=\${RINGRUN_TIMEOUT_MS:-$TIMEOUT_MS}
echo \$\$ > $TMP/rank-\$RINGRUN_RANK.pid
exec "\$@"
EOF
chmod +x "$WRAP"

# 1. One rank.
t=$(now)
out=$(timeout 120 "$BIN/ringrun" -np 1 "$BIN/gpu_collectives" 2>&1)
rc=$?
echo "$out" | tail -5
row "1-rank NCCL job (gpu_collectives)" "$([[ $rc == 0 ]] && echo PASS || echo FAIL)" "$(since "$t")" \
  "exit $rc; $(grep -m1 -o 'checks=[0-9]* failures=[0-9]*' <<<"$out")"

# 2. Two ranks on one GPU.
t=$(now)
out=$(timeout 180 "$BIN/ringrun" -np 2 "$WRAP" "$BIN/gpu_collectives" 2>&1)
rc=$?
echo "$out" | tail -8
row "2 ranks, 1 GPU, every dtype" "$([[ $rc == 0 ]] && echo PASS || echo FAIL)" "$(since "$t")" \
  "exit $rc; $(grep -o 'rank [0-9]/2 checks=[0-9]* failures=[0-9]*' <<<"$out" | tr '\n' ' ')"

# 2b. A CPU-only job through the engine: the NCCL id is made at the first device collective,
# so a host-only job never looks for libcuda.
t=$(now)
out=$(timeout 120 "$BIN/ringrun" -np 2 -x LD_DEBUG=libs "$BIN/runtime_test_worker" check 2>&1)
rc=$?
cuda_loads=$(grep -c 'find library=libcuda\.so' <<<"$out")
row "CPU-only job loads no libcuda" "$([[ $rc == 0 && $cuda_loads == 0 ]] && echo PASS || echo FAIL)" \
  "$(since "$t")" "exit $rc; libcuda lookups: $cuda_loads"

# 2c. The engine's device path at np=2: fusion, scale factors, every collective, streams.
t=$(now)
out=$(timeout 120 "$BIN/ringrun" -np 2 --timeline-filename "$TMP/dev-timeline.json" "$WRAP" \
        "$BIN/gpu_collectives" engine 2>&1)
rc=$?
echo "$out" | tail -6
spans=$(cat "$TMP"/dev-timeline.json "$TMP"/dev-timeline.*.json 2>/dev/null | grep -c 'NCCL_ALLREDUCE')
row "engine device path, np=2" "$([[ $rc == 0 && $spans -gt 0 ]] && echo PASS || echo FAIL)" \
  "$(since "$t")" "exit $rc; $(grep -o 'rank [0-9]/2 checks=[0-9]* failures=[0-9]*' <<<"$out" | tr '\n' ' ')NCCL_ALLREDUCE spans: $spans"

# 3. --check-gpu --allreduce.
t=$(now)
out=$(timeout 120 "$BIN/ringrun" --check-gpu --allreduce 2>&1)
rc=$?
echo "$out"
row "--check-gpu --allreduce" "$([[ $rc == 0 ]] && echo PASS || echo FAIL)" "$(since "$t")" \
  "exit $rc; $(grep -m1 -o 'OK [0-9.]* GB/s[^)]*)' <<<"$out" || true)"

# 4. ringrun-bench --device cuda at np=1 and np=2 (np=2 shares the GPU through the wrapper).
json_at() {  # BYTES < JSON lines -> "algbw A, busbw B GB/s, wrong N" of the line for BYTES
  grep -m1 "\"bytes\":$1," |
    sed -E 's/.*"algbw_GBps":([0-9.]+).*"busbw_GBps":([0-9.]+).*"wrong":([0-9]+).*/algbw \1, busbw \2 GB\/s, wrong \3/'
}
bench_row() {  # NP PREFIX...
  local np=$1 t rc out small large
  shift
  t=$(now)
  out=$(timeout 150 "$BIN/ringrun" -np "$np" "$@" "$BIN/ringrun-bench" allreduce --device cuda \
        -b 1M -e 256M -f 256 -n 20 -w 5 -c 1 --json 2>&1)
  rc=$?
  # Rank 0's JSON lines, without the launcher's "[0]<stdout>:" tag (no jq needed).
  local json
  json=$(sed -n 's/^\[0\]<stdout>://p' <<<"$out" | grep '^{')
  echo "$json" | head -4
  small=$(json_at 1048576 <<<"$json")
  large=$(json_at 268435456 <<<"$json")
  local wrong
  wrong=$(grep -o '"wrong":[0-9]*' <<<"$json" | cut -d: -f2 | awk '{ s += $1 } END { print s + 0 }')
  local ok=FAIL
  [[ $rc == 0 && -n $large && $wrong == 0 ]] && ok=PASS
  [[ $ok == PASS ]] || echo "$out" | tail -5
  row "ringrun-bench --device cuda np=$np" "$ok" "$(since "$t")" "1M: ${small:-?}; 256M: ${large:-?}"
}
bench_row 1
bench_row 2 "$WRAP"

# 5. A peer stopped or killed in the middle of allreduces: the survivor's NCCL call must fail
# (deadline -> ncclCommAbort) and the job end within the collective timeout.
kill_row() {  # SIGNAL
  local sig=$1 t rc out pid1 start took limit
  rm -f "$TMP"/rank-*.pid
  "$BIN/ringrun" -np 2 "$WRAP" "$BIN/ringrun-bench" allreduce --device cuda -b 64M -e 64M \
    -n 1000000 -w 1 -c 0 >"$TMP/kill-$sig.log" 2>&1 &
  local job=$!
  for _ in $(seq 300); do [[ -s $TMP/rank-1.pid && -s $TMP/rank-0.pid ]] && break; sleep 0.1; done
  sleep 5   # well inside the allreduce loop (init and warm-up done)
  pid1=$(cat "$TMP/rank-1.pid" 2>/dev/null)
  if ! kill -0 "$job" 2>/dev/null; then  # nothing to interrupt: the job never reached its loop
    wait "$job"
    rc=$?
    tail -5 "$TMP/kill-$sig.log"
    row "peer SIG$sig mid-allreduce" FAIL "0.0" "the job ended (exit $rc) before the signal"
    return
  fi
  start=$(now)
  if [[ -n $pid1 ]]; then kill "-$sig" "$pid1"; fi
  limit=$(( TIMEOUT_MS / 1000 + 15 ))
  for _ in $(seq $((limit * 10))); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  took=$(since "$start")
  if kill -0 "$job" 2>/dev/null; then
    kill -9 "$job" 2>/dev/null
    [[ -n $pid1 ]] && kill -9 "$pid1" 2>/dev/null
    wait "$job" 2>/dev/null
    row "peer SIG$sig mid-allreduce" FAIL "$took" "job still running after ${limit}s"
    return
  fi
  wait "$job"
  rc=$?
  out=$(grep -i -m2 -E 'abort|did not complete|timed out|remote|exited|killed|signal' "$TMP/kill-$sig.log" | tr '\n' ' ')
  local ok=FAIL
  if [[ $rc != 0 && -n $pid1 ]]; then
    if [[ $sig == STOP ]]; then
      # Only the survivor's own deadline can end this job: the stopped rank never exits.
      grep -q -E 'did not complete within|aborted' "$TMP/kill-$sig.log" && ok=PASS
    else
      ok=PASS
    fi
  fi
  [[ $ok == PASS ]] || tail -8 "$TMP/kill-$sig.log"
  row "peer SIG$sig mid-allreduce" "$ok" "$took" "exit $rc (timeout ${TIMEOUT_MS} ms): ${out:0:110}"
}
kill_row STOP
kill_row KILL

# 6. ringrun.torch with CUDA tensors (the Python package's GPU path).
for np in 1 2; do
  t=$(now)
  out=$(PYTHONPATH=$BUILD/python timeout 180 "$BIN/ringrun" -np "$np" "$WRAP" "$PYTHON" \
          "$SRC/tests/gpu/torch_cuda_check.py" 2>&1)
  rc=$?
  if grep -q "has no CUDA" <<<"$out"; then
    rows+=("$(printf '%-34s %-5s %7ss  %s' "ringrun.torch CUDA, np=$np" SKIP "$(since "$t")" "torch without CUDA")")
    continue
  fi
  [[ $rc == 0 ]] || tail -15 <<<"$out"
  row "ringrun.torch CUDA, np=$np" "$([[ $rc == 0 ]] && echo PASS || echo FAIL)" "$(since "$t")" \
    "$(tail -1 <<<"$out" | cut -c1-100)"
done

echo
echo "ringrun gpu-check on $(hostname), $(date -u +%Y-%m-%dT%H:%MZ)"
printf '%-34s %-5s %8s  %s\n' "STEP" "RESULT" "TIME" "DETAIL"
printf '%s\n' "${rows[@]}"
echo "$failed step(s) failed"
((failed == 0))
