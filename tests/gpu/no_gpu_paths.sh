#!/usr/bin/env bash
# The GPU path on a machine without a GPU: every GPU request fails with a message naming the
# cause, promptly, without a crash or a hang.
#   no_gpu_paths.sh BIN_DIR HAVE_NCCL(0|1)
# Exits 77 (skipped) on a machine that has a GPU.
set -u
bin=${1:?bin dir}
have_nccl=${2:?0 or 1}
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [[ $have_nccl == 1 ]]; then cause="no CUDA driver: "; else cause="this build has no CUDA"; fi
# ringrun-bench names CUDA's own error ("cudaMalloc: CUDA driver version is insufficient ...").
if [[ $have_nccl == 1 ]]; then bench_cause="CUDA driver"; else bench_cause="no CUDA runtime"; fi

# 1. The probe: one JSON line, exit 1.
timeout 20 "$bin/ringrun-gpu-probe" >"$tmp/probe.out" 2>"$tmp/probe.err"
rc=$?
if [[ $rc == 0 ]]; then echo "this machine has a GPU: skipping"; exit 77; fi
[[ $rc == 1 ]] || fail "ringrun-gpu-probe exited $rc, expected 1"
line=$(head -1 "$tmp/probe.out")
if command -v jq >/dev/null; then
  echo "$line" | jq -e '.ok == false and (.devices | length) == 0' >/dev/null ||
    fail "probe line is not the expected JSON: $line"
  err=$(echo "$line" | jq -r .error)
else
  err=$line
fi
[[ $err == *"$cause"* ]] && pass "probe: $err" || fail "probe error '$err' lacks '$cause'"
"$bin/ringrun-gpu-probe" --report-only >/dev/null || fail "probe --report-only did not exit 0"

# 2. --check-build.
if timeout 20 "$bin/ringrun" --check-build >"$tmp/cb.out" 2>&1; then
  grep -q '\[X\] CPU TCP' "$tmp/cb.out" || fail "--check-build lacks CPU TCP: $(cat "$tmp/cb.out")"
  if [[ $have_nccl == 1 ]]; then want='\[X\] NCCL 2\.'; else want='\[ \] NCCL'; fi
  grep -q "$want" "$tmp/cb.out" && pass "--check-build: $(grep NCCL "$tmp/cb.out" | head -1)" ||
    fail "--check-build lacks /$want/: $(cat "$tmp/cb.out")"
else
  fail "ringrun --check-build failed: $(cat "$tmp/cb.out")"
fi

# 3. --check-gpu on this host: a FAIL row naming the cause, exit 1 within 10 s.
start=$(date +%s.%N)
timeout 30 "$bin/ringrun" --check-gpu >"$tmp/cg.out" 2>&1
rc=$?
took=$(echo "$(date +%s.%N) - $start" | bc)
cat "$tmp/cg.out"
[[ $rc == 1 ]] || fail "--check-gpu exited $rc, expected 1"
(( $(echo "$took < 10" | bc) )) && pass "--check-gpu took ${took}s" || fail "--check-gpu took ${took}s (>= 10 s)"
grep -E '^localhost +FAIL' "$tmp/cg.out" | grep -q -- "$cause" &&
  pass "--check-gpu row names the cause" || fail "--check-gpu has no FAIL row with '$cause'"

# 4. ringrun-bench --device cuda: fails with the cause, alone and under ringrun.
if [[ -x $bin/ringrun-bench ]]; then
  for how in direct np2; do
    if [[ $how == direct ]]; then
      cmd=("$bin/ringrun-bench" allreduce --device cuda -b 1M -e 1M -n 2 -w 1)
    else
      cmd=("$bin/ringrun" -np 2 "$bin/ringrun-bench" allreduce --device cuda -b 1M -e 1M -n 2 -w 1)
    fi
    timeout 60 "${cmd[@]}" >"$tmp/bench.out" 2>&1
    rc=$?
    if [[ $rc == 0 || $rc == 124 || $rc -ge 128 ]]; then
      fail "ringrun-bench --device cuda ($how) exited $rc (expected a clean failure): $(tail -5 "$tmp/bench.out")"
    elif grep -q "$bench_cause" "$tmp/bench.out"; then
      pass "ringrun-bench --device cuda ($how): exit $rc: $(grep -m1 "$bench_cause" "$tmp/bench.out")"
    else
      fail "ringrun-bench --device cuda ($how) exit $rc without '$bench_cause': $(tail -5 "$tmp/bench.out")"
    fi
  done
else
  fail "$bin/ringrun-bench is missing"
fi

echo "no_gpu_paths: $fails failure(s)"
[[ $fails == 0 ]]
