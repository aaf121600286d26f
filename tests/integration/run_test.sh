#!/usr/bin/env bash
# Integration tests of the control plane on one host: real ringrun, agents and ranks.
# Usage: BIN=build/bin run_test.sh NAME
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

t_env_contract() {
  "$RINGRUN" -np 3 -H localhost:2,127.0.0.1:1 -x RINGRUN_TEST_X=hello "$PROBE" env \
    >"$WORK/out" 2>"$WORK/err" || fail "ringrun failed: $(cat "$WORK/err")"
  for r in 0 1 2; do
    expect_contains "$WORK/out" "[$r]<stdout>:RINGRUN_RANK=$r"
    expect_contains "$WORK/out" "[$r]<stdout>:HOROVOD_RANK=$r"
    expect_contains "$WORK/out" "[$r]<stdout>:RANK=$r"
    expect_contains "$WORK/out" "[$r]<stdout>:RINGRUN_SIZE=3"
    expect_contains "$WORK/out" "[$r]<stdout>:WORLD_SIZE=3"
    expect_contains "$WORK/out" "[$r]<stdout>:RINGRUN_TEST_X=hello"
    expect_contains "$WORK/out" "[$r]<stdout>:MASTER_ADDR=127.0.0.1"
    expect_contains "$WORK/out" "[$r]<stdout>:CWD=$PWD"
  done
  expect_contains "$WORK/out" "[1]<stdout>:LOCAL_RANK=1"
  expect_contains "$WORK/out" "[1]<stdout>:LOCAL_WORLD_SIZE=2"
  expect_contains "$WORK/out" "[2]<stdout>:RINGRUN_LOCAL_RANK=0"
  expect_contains "$WORK/out" "[2]<stdout>:HOROVOD_LOCAL_SIZE=1"
  expect_contains "$WORK/out" "[2]<stdout>:RINGRUN_CROSS_RANK=1"
  expect_contains "$WORK/out" "[2]<stdout>:HOROVOD_CROSS_SIZE=2"
  expect_contains "$WORK/out" "[1]<stdout>:RINGRUN_CROSS_SIZE=1"
  expect_contains "$WORK/out" "[2]<stdout>:GROUP_RANK=1"
  expect_contains "$WORK/out" "[2]<stdout>:RINGRUN_HOSTNAME=127.0.0.1"
  # One MASTER_PORT for the whole job, and a real port number.
  local ports
  ports=$(grep -o 'MASTER_PORT=[0-9]*' "$WORK/out" | sort -u | wc -l)
  [[ $ports == 1 ]] || fail "ranks disagree on MASTER_PORT"
  # The launching shell's session variables stay behind.
  SHLVL=7 OLDPWD=/nowhere "$RINGRUN" -np 1 "$PROBE" env >"$WORK/out2" 2>&1
  expect_not_contains "$WORK/out2" "SHLVL="
  expect_not_contains "$WORK/out2" "OLDPWD="
  expect_no_orphans
}

t_args_integrity() {
  local args=("two words" "it's \"quoted\"" '$(touch '"$WORK"'/pwned)' '`touch '"$WORK"'/pwned2`'
              'a;touch '"$WORK"'/pwned3' $'line1\nline2' "naïve 日本語" "" "--np" "-x" "*" '\')
  "$RINGRUN" -np 2 "$PROBE" args "${args[@]}" >"$WORK/out" 2>"$WORK/err" ||
    fail "ringrun failed: $(cat "$WORK/err")"
  local i=0 a hex
  for a in "${args[@]}"; do
    hex=$(printf '%s' "$a" | od -An -tx1 | tr -d ' \n')
    for r in 0 1; do expect_contains "$WORK/out" "[$r]<stdout>:arg$i=$hex"; done
    i=$((i + 1))
  done
  [[ ! -e $WORK/pwned && ! -e $WORK/pwned2 && ! -e $WORK/pwned3 ]] || fail "an argument was executed"
  expect_no_orphans
}

t_output_integrity() {
  local n=20000
  "$RINGRUN" -np 2 "$PROBE" lines $n >"$WORK/out" 2>"$WORK/err" || fail "ringrun failed"
  for r in 0 1; do
    grep -F "[$r]<stdout>:r$r l" "$WORK/out" | sed "s/^\[$r\]<stdout>:r$r l\([0-9]*\) the quick brown fox jumps over the lazy dog$/\1/" \
      >"$WORK/seq$r"
    seq 0 $((n - 1)) >"$WORK/want"
    cmp -s "$WORK/seq$r" "$WORK/want" || fail "rank $r: lines lost, reordered or mixed"
    expect_contains "$WORK/out" "[$r]<stdout>:r$r partial"
  done
  local total
  total=$(wc -l <"$WORK/out")
  [[ $total == $((2 * n + 2)) ]] || fail "expected $((2 * n + 2)) lines, got $total"
  # Every line is whole: nothing but tagged lines.
  ! grep -vE '^\[[01]\]<stdout>:r[01] (l[0-9]+ the quick brown fox jumps over the lazy dog|partial)$' \
    "$WORK/out" | grep -q . || fail "a line was mixed or mangled"
  expect_no_orphans
}

t_exit_code() {
  local rc
  "$RINGRUN" -np 3 --grace-period 2 "$PROBE" fail 1 7 >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 7 $rc "a rank exiting 7"
  expect_contains "$WORK/err" "rank 1 on host localhost exited with code 7"
  expect_contains "$WORK/err" "rank 1: something went wrong"
  [[ $(grep -c "exited with code" "$WORK/err") == 1 ]] || fail "the failure was reported more than once"
  expect_no_orphans
  "$RINGRUN" -np 2 "$PROBE" signal 0 11 >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 139 $rc "a rank killed by SIGSEGV"
  expect_contains "$WORK/err" "rank 0 on host localhost was killed by SIGSEGV"
  expect_no_orphans
  "$RINGRUN" -np 2 /bin/true; rc=$?
  expect_rc 0 $rc "/bin/true"
  "$RINGRUN" -np 1 /nonexistent/prog >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 127 $rc "a missing command"
  expect_contains "$WORK/err" "/nonexistent/prog"
  "$RINGRUN" -np 1 --wdir /nonexistent-dir /bin/true >"$WORK/out" 2>"$WORK/err"; rc=$?
  [[ $rc != 0 ]] || fail "a missing working directory was accepted"
  expect_contains "$WORK/err" "/nonexistent-dir"
  expect_no_orphans
}

t_teardown_time() {
  # A failing rank ends the job; a rank that ignores SIGTERM is killed after the grace period.
  local start rc
  start=$(date +%s%N)
  "$RINGRUN" -np 3 --grace-period 1 "$PROBE" fail 2 3 >"$WORK/out" 2>"$WORK/err"; rc=$?
  local ms=$(( ($(date +%s%N) - start) / 1000000 ))
  expect_rc 3 $rc "failing rank"
  (( ms < 5000 )) || fail "teardown took $ms ms"
  expect_no_orphans
  start=$(date +%s%N)
  "$RINGRUN" -np 2 --grace-period 1 "$PROBE" ignore-term 60 >"$WORK/out" 2>"$WORK/err" &
  local pid=$!
  wait_for_lines "$WORK/out" "ignoring SIGTERM" 2 20
  kill -TERM $pid
  wait $pid; rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  expect_rc 143 $rc "SIGTERM to ringrun"
  (( ms < 6000 )) || fail "a rank ignoring SIGTERM survived $ms ms"
  wait
  expect_no_orphans
}

t_sigint() {
  "$RINGRUN" -np 2 "$PROBE" sleep 60 >"$WORK/out" 2>"$WORK/err" &
  local pid=$! rc
  wait_for_lines "$WORK/out" "sleeping" 2 20
  kill -INT $pid
  wait $pid; rc=$?
  expect_rc 130 $rc "SIGINT"
  expect_no_orphans
  # A second Ctrl-C kills at once, even ranks that ignore the first.
  "$RINGRUN" -np 2 --grace-period 30 "$PROBE" ignore-term 60 >"$WORK/out" 2>"$WORK/err" &
  pid=$!
  wait_for_lines "$WORK/out" "ignoring SIGTERM" 2 20
  local start=$SECONDS
  kill -TERM $pid
  wait_for_lines "$WORK/err" "received: forwarding it to every rank" 1 10  # the first is handled
  kill -TERM $pid
  wait $pid; rc=$?
  expect_rc 143 $rc "SIGTERM twice"
  (( SECONDS - start < 5 )) || fail "a second signal did not kill at once"
  expect_no_orphans
}

t_sigusr() {
  "$RINGRUN" -np 2 "$PROBE" sleep 3 >"$WORK/out" 2>"$WORK/err" &
  local pid=$! rc
  wait_for_lines "$WORK/out" "sleeping" 2 20
  kill -USR1 $pid
  wait_for_lines "$WORK/out" "got SIGUSR1" 2 10
  kill -USR2 $pid
  wait $pid; rc=$?
  expect_rc 0 $rc "the job after SIGUSR1/SIGUSR2"
  for r in 0 1; do
    expect_contains "$WORK/out" "[$r]<stdout>:rank $r got SIGUSR1"
    expect_contains "$WORK/out" "[$r]<stdout>:rank $r got SIGUSR2"
  done
  expect_no_orphans
}

t_start_timeout() {
  # An "agent" that never registers.
  printf '#!/bin/sh\nexec sleep 60\n' >"$WORK/agent"; chmod +x "$WORK/agent"
  local start=$SECONDS rc
  "$RINGRUN" -np 1 --start-timeout 2 --agent-path "$WORK/agent" /bin/true >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 1 $rc "start timeout"
  (( SECONDS - start < 8 )) || fail "the start timeout took $((SECONDS - start)) s"
  expect_contains "$WORK/err" "start timeout"
  expect_contains "$WORK/err" "localhost"
  expect_no_orphans
}

t_launcher_killed() {
  # kill -9 of the launcher: its agents and ranks go too.
  "$RINGRUN" -np 2 "$PROBE" sleep 60 >"$WORK/out" 2>"$WORK/err" &
  local pid=$!
  wait_for_lines "$WORK/out" "sleeping" 2 20
  kill -9 $pid
  wait $pid 2>/dev/null
  expect_no_orphans 15
}

t_hygiene() {
  # Ranks start with an empty signal mask, nothing ignored, and no inherited fds,
  # even when ringrun itself was started with signals blocked or ignored.
  trap '' USR1 HUP
  "$RINGRUN" -np 1 "$PROBE" hygiene >"$WORK/out" 2>"$WORK/err" || fail "ringrun failed"
  trap - USR1 HUP
  expect_contains "$WORK/out" "SigBlk:	0000000000000000"
  expect_contains "$WORK/out" "SigIgn:	0000000000000000"
  expect_not_contains "$WORK/out" "open"
  expect_no_orphans
}

t_output_files() {
  "$RINGRUN" -np 2 --output-filename "$WORK/logs" --prefix-timestamp "$PROBE" fail 1 4 \
    >"$WORK/out" 2>"$WORK/err"
  [[ -f $WORK/logs/rank.0/stdout && -f $WORK/logs/rank.1/stderr ]] || fail "no per-rank files"
  expect_contains "$WORK/logs/rank.1/stderr" "rank 1: something went wrong"
  grep -qE '^[A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9][0-9] [0-9:]{8} [0-9]{4}\[1\]<stderr>:rank 1: something went wrong' \
    "$WORK/err" || fail "no timestamped line on the console: $(cat "$WORK/err")"
  expect_no_orphans
}

t_usage_errors() {
  local rc
  "$RINGRUN" -np 0 /bin/true 2>"$WORK/err"; rc=$?
  expect_rc 2 $rc "-np 0"
  expect_contains "$WORK/err" "-np"
  "$RINGRUN" --bogus /bin/true 2>"$WORK/err"; rc=$?
  expect_rc 2 $rc "an unknown flag"
  expect_contains "$WORK/err" "--bogus"
  printf 'localhost slots=abc\n' >"$WORK/hosts"
  "$RINGRUN" --hostfile "$WORK/hosts" /bin/true 2>"$WORK/err"; rc=$?
  expect_rc 2 $rc "slots=abc"
  expect_contains "$WORK/err" "$WORK/hosts:1"
  "$RINGRUN" -np 1 --bind-to socket touch "$WORK/started" 2>"$WORK/err"; rc=$?
  expect_rc 2 $rc "--bind-to socket"
  expect_contains "$WORK/err" "--bind-to socket"
  [[ ! -e $WORK/started ]] || fail "--bind-to socket started the command"
  "$RINGRUN" -np 1 --host localhost touch "$WORK/started" 2>"$WORK/err"; rc=$?
  expect_rc 2 $rc "an ambiguous prefix"
  expect_contains "$WORK/err" "--host: it could be --hosts, --hostfile"
  [[ ! -e $WORK/started ]] || fail "an ambiguous prefix started the command"
  "$RINGRUN" -np 4 --dry-run -H localhost:2,127.0.0.1:2 /bin/true >"$WORK/out"; rc=$?
  expect_rc 0 $rc "--dry-run"
  expect_contains "$WORK/out" "127.0.0.1"
  "$RINGRUN" --version >"$WORK/out"; rc=$?
  expect_rc 0 $rc "--version"
  expect_contains "$WORK/out" "ringrun"
  expect_no_orphans
}

t_torch_env() {
  # An unmodified torch.distributed program with init_method="env://" finds its peers.
  if ! /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
    echo "SKIP: python3-torch is not installed"; exit 77
  fi
  cat >"$WORK/t.py" <<'PY'
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank={dist.get_rank()} world={dist.get_world_size()} sum={t.item()}")
dist.destroy_process_group()
PY
  OMP_NUM_THREADS=1 "$RINGRUN" -np 3 /usr/bin/python3 "$WORK/t.py" >"$WORK/out" 2>"$WORK/err" ||
    fail "torch job failed: $(tail -20 "$WORK/err")"
  for r in 0 1 2; do expect_contains "$WORK/out" "[$r]<stdout>:rank=$r world=3 sum=6.0"; done
  expect_no_orphans
}

t_engine_under_ringrun() {
  # The engine through the launcher: named submissions, the timeline flag (the launcher writes
  # the file named, a strict-JSON Chrome trace holding every rank's events under its rank as
  # pid, with rank 0's announcements of every rank; no rank writes a file of its own), and the
  # stall flags (a rank that never submits fails the job).
  local worker="$BIN/runtime_test_worker" r rc
  "$RINGRUN" -np 3 --timeline-filename "$WORK/tl.json" --fusion-threshold-mb 1 "$worker" engine \
    >"$WORK/out" 2>"$WORK/err" || fail "engine mode: $(tail -5 "$WORK/err")"
  for r in 0 1 2; do
    expect_contains "$WORK/out" "[$r]<stdout>:ok rank=$r size=3"
    [[ ! -e $WORK/tl.$r.json ]] || fail "rank $r wrote tl.$r.json beside the launcher's file"
  done
  ! grep -q 'timeline' "$WORK/err" || fail "timeline warnings: $(cat "$WORK/err")"
  /usr/bin/python3 - "$WORK/tl.json" <<'PY' || fail "the launcher's timeline is not every rank's: $(head -c 600 "$WORK/tl.json")"
import json, sys
events = json.load(open(sys.argv[1]))  # strict JSON: the launcher closed it
for r in range(3):
    mine = [e for e in events if e.get("pid") == r]
    names = {e["name"] for e in mine}
    assert {"process_name", "NEGOTIATE", "ALLREDUCE", "ROUND"} <= names, (r, names)
    assert any(e["name"] == "process_name" and e["args"]["name"] == f"rank {r}" for e in mine)
a = [e["args"]["announced_after_us"] for e in events if e["name"] == "NEGOTIATE" and e["pid"] == 0]
assert any(len(x) == 3 for x in a), a[:3]
PY
  "$RINGRUN" -np 2 --stall-check-warning-time-seconds 0.5 --stall-check-shutdown-time-seconds 1 \
    "$worker" stall >"$WORK/out" 2>"$WORK/err"
  rc=$?
  [[ $rc != 0 ]] || fail "a stalled job succeeded"
  expect_contains "$WORK/err" "stall shutdown"
  expect_contains "$WORK/err" "rank 1 has not submitted 1 tensor: late"
  expect_no_orphans
}

t_runtime_under_ringrun() {
  # libringrun joined through the launcher's real job service: TCP and shared memory.
  local worker="$BIN/runtime_test_worker" np shm
  for shm in 0 1; do
    for np in 1 2 3 5; do
      RINGRUN_DISABLE_SHM=$shm "$RINGRUN" -np $np "$worker" check >"$WORK/out" 2>"$WORK/err" ||
        fail "np=$np disable_shm=$shm: $(tail -5 "$WORK/err")"
      for ((r = 0; r < np; r++)); do expect_contains "$WORK/out" "[$r]<stdout>:ok rank=$r size=$np"; done
    done
  done
  # A rank killed in the middle of allreduces: the job ends with its signal, nothing hangs.
  local rc start
  "$RINGRUN" -np 3 -x RINGRUN_TIMEOUT_MS=20000 "$worker" loop >"$WORK/out" 2>"$WORK/err" &
  local pid=$!
  wait_for_lines "$WORK/out" "looping rank=" 3 30  # every rank inside its allreduce loop
  local victim
  victim=$(for p in $(tagged_pids); do
    tr '\0' '\n' 2>/dev/null </proc/$p/environ | grep -qx RINGRUN_RANK=1 && echo $p; done | head -1)
  [[ -n $victim ]] || fail "rank 1 not found"
  start=$SECONDS
  kill -9 "$victim"
  wait $pid; rc=$?
  expect_rc 137 $rc "a rank killed by SIGKILL"
  (( SECONDS - start < 15 )) || fail "the job took $((SECONDS - start)) s to end"
  expect_contains "$WORK/err" "rank 1 on host localhost was killed by SIGKILL"
  expect_no_orphans
  ls /dev/shm | grep -q "ringrun-" && fail "shared-memory segments left: $(ls /dev/shm | grep ringrun-)"
  return 0
}

t_training_example() {
  # The README's main job, one epoch: np=1 and np=2 train the same model (same global batch and
  # seed), and both learn. The 10-epoch figures: benchmarks/README.md (example_speedup.sh).
  [[ -d /usr/share/datasets/fashion-mnist ]] || { echo "SKIP: dataset-fashion-mnist is not installed"; exit 77; }
  local np acc1 acc2 rc
  for np in 1 2; do
    "$RINGRUN" -np $np "$BIN/fashion_mnist" --epochs 1 >"$WORK/out$np" 2>"$WORK/err$np"; rc=$?
    expect_rc 0 $rc "fashion_mnist at np=$np"
    expect_contains "$WORK/out$np" "[0]<stdout>:fashion_mnist: np=$np batch=128"
    expect_contains "$WORK/out$np" "[0]<stdout>:epoch 1 train_loss="
  done
  acc1=$(sed -n 's/^\[0\]<stdout>:test_accuracy=//p' "$WORK/out1")
  acc2=$(sed -n 's/^\[0\]<stdout>:test_accuracy=//p' "$WORK/out2")
  [[ -n $acc1 && -n $acc2 ]] || fail "no test_accuracy line"
  awk -v a="$acc1" -v b="$acc2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0.80 && b > 0.80 && d <= 0.005) }' ||
    fail "one epoch: test accuracy np=1 $acc1, np=2 $acc2 (want > 0.80 each, within 0.005)"
  expect_no_orphans
}

t_collective_bench() {
  # ringrun-bench under ringrun: every collective at np=3 checks its results (-c 1) and prints
  # one JSON object per size on rank 0 only, busbw = algbw x nccl-tests' factor; the table form;
  # a 16-bit dtype with AVERAGE; bad arguments are usage errors (exit 2).
  local op rc rows factor
  for op in allreduce broadcast allgather reducescatter; do
    "$RINGRUN" -np 3 "$BIN/ringrun-bench" $op -b 1K -e 64K -f 8 -n 2 -w 1 -c 1 --json \
      >"$WORK/$op" 2>"$WORK/$op.err"; rc=$?
    expect_rc 0 $rc "ringrun-bench $op"
    expect_not_contains "$WORK/$op" "[1]<stdout>:"
    rows=$(grep -c "^\[0\]<stdout>:{\"op\":\"$op\",\"np\":3," "$WORK/$op")
    [[ $rows == 3 ]] || { cat "$WORK/$op" >&2; fail "$op: $rows JSON rows, expected 3 (1K, 8K, 64K)"; }
    case $op in allreduce) factor=1.3333 ;; broadcast) factor=1 ;; *) factor=0.6667 ;; esac
    sed -n 's/^\[0\]<stdout>://p' "$WORK/$op" | awk -F'[:,}]' -v f=$factor -v op=$op '
      { for (i = 1; i < NF; i++) v[$i] = $(i + 1)
        if (v["\"wrong\""] != 0) { print op ": wrong=" v["\"wrong\""]; bad = 1 }
        # Both are printed to 4 decimals: compare within that rounding (and 1%).
        d = v["\"busbw_GBps\""] - v["\"algbw_GBps\""] * f; if (d < 0) d = -d
        if (d > 0.0001 * (1 + f) + 0.01 * v["\"busbw_GBps\""]) { print op ": busbw " v["\"busbw_GBps\""] " algbw " v["\"algbw_GBps\""]; bad = 1 }
        if (v["\"time_us\""] <= 0) { print op ": time_us " v["\"time_us\""]; bad = 1 } }
      END { exit bad }' || fail "$op: bad rows in $(cat "$WORK/$op")"
  done
  "$RINGRUN" -np 2 "$BIN/ringrun-bench" allreduce -b 4K -e 1M -f 16 -n 2 -w 1 -c 1 -d half -o avg \
    >"$WORK/table" 2>&1; rc=$?
  expect_rc 0 $rc "ringrun-bench allreduce -d half -o avg"
  expect_contains "$WORK/table" "size        count     type   redop       time    algbw    busbw  #wrong"
  rows=$(grep -cE '^\[0\]<stdout>: +[0-9]+ +[0-9]+ +float16 +average .* 0$' "$WORK/table")
  [[ $rows == 3 ]] || { cat "$WORK/table" >&2; fail "table: $rows rows with #wrong 0, expected 3"; }
  "$BIN/ringrun-bench" allreduce -b 8K -e 4K >"$WORK/usage" 2>&1; rc=$?
  expect_rc 2 $rc "ringrun-bench with MIN > MAX"
  expect_contains "$WORK/usage" "usage: ringrun-bench"
  "$BIN/ringrun-bench" allreduce -d float17 >"$WORK/usage" 2>&1; rc=$?
  expect_rc 2 $rc "ringrun-bench -d float17"
  expect_contains "$WORK/usage" "bad value for -d: float17"
  expect_no_orphans
}

t_installed_package() {
  # `cmake --install` of this build into a fresh prefix, then a separate project that finds it
  # with find_package(ringrun), links ringrun::ringrun from C and C++, and runs alone (a job of
  # size 1) and under ringrun -np 2.
  local build=$BIN/.. rc
  cmake --install "$build" --prefix "$WORK/prefix" >"$WORK/install.log" 2>&1 ||
    { cat "$WORK/install.log" >&2; fail "cmake --install"; }
  for f in include/ringrun/ringrun.h include/ringrun/ringrun.hpp lib/cmake/ringrun/ringrunConfig.cmake; do
    [[ -f $WORK/prefix/$f ]] || fail "cmake --install did not install $f"
  done
  ls "$WORK"/prefix/lib*/libringrun.so >/dev/null 2>&1 || fail "cmake --install did not install libringrun.so"
  mkdir -p "$WORK/consumer"
  cat >"$WORK/consumer/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.16)
project(consumer C CXX)
find_package(ringrun REQUIRED)
add_executable(c_app app.c)
target_link_libraries(c_app PRIVATE ringrun::ringrun)
add_executable(cxx_app app.cc)
target_link_libraries(cxx_app PRIVATE ringrun::ringrun)
CMAKE
  cat >"$WORK/consumer/app.c" <<'C'
#include <stdio.h>
#include <ringrun/ringrun.h>
int main(void) {
  if (ringrun_init() != 0) { fprintf(stderr, "%s\n", ringrun_error_message()); return 1; }
  double x = ringrun_rank() + 1;
  if (ringrun_allreduce(&x, &x, 1, RINGRUN_FLOAT64, RINGRUN_SUM) != 0) return 1;
  printf("c rank=%d size=%d sum=%g\n", ringrun_rank(), ringrun_size(), x);
  ringrun_shutdown();
  return 0;
}
C
  cat >"$WORK/consumer/app.cc" <<'CXX'
#include <cstdio>
#include <vector>
#include <ringrun/ringrun.hpp>
int main() {
  ringrun::Session s;
  std::vector<float> v(3, float(s.rank() + 1));
  s.Allreduce(v);
  std::printf("cxx rank=%d size=%d sum=%g epoch=%llu\n", s.rank(), s.size(), double(v[2]),
              static_cast<unsigned long long>(s.membership_epoch()));
  try {  // one split per rank, or an error (not a read past the vector)
    s.AlltoallAsync("short", v.data(), std::vector<size_t>(size_t(s.size()) + 1, 1));
    std::printf("cxx: AlltoallAsync took a rows vector of the wrong size\n");
    return 1;
  } catch (const ringrun::Error& e) {
    std::printf("cxx rank=%d: %s\n", s.rank(), e.what());
  }
  return 0;
}
CXX
  (cmake -S "$WORK/consumer" -B "$WORK/consumer/build" -DCMAKE_PREFIX_PATH="$WORK/prefix" &&
     cmake --build "$WORK/consumer/build") >"$WORK/consumer.log" 2>&1 ||
    { tail -30 "$WORK/consumer.log" >&2; fail "a project using find_package(ringrun) did not build"; }
  "$WORK/consumer/build/c_app" >"$WORK/alone" 2>&1; rc=$?
  expect_rc 0 $rc "c_app outside ringrun"
  expect_contains "$WORK/alone" "c rank=0 size=1 sum=1"
  "$RINGRUN" -np 2 "$WORK/consumer/build/c_app" >"$WORK/c2" 2>&1; rc=$?
  expect_rc 0 $rc "c_app under ringrun -np 2"
  expect_contains "$WORK/c2" "[1]<stdout>:c rank=1 size=2 sum=3"
  "$RINGRUN" -np 2 "$WORK/consumer/build/cxx_app" >"$WORK/cxx2" 2>&1; rc=$?
  expect_rc 0 $rc "cxx_app under ringrun -np 2"
  expect_contains "$WORK/cxx2" "[0]<stdout>:cxx rank=0 size=2 sum=3 epoch=0"
  expect_contains "$WORK/cxx2" "[1]<stdout>:cxx rank=1: AlltoallAsync: rows has 3 entries, one per rank is 2"
  # The installed library is the one that ran, not the build tree's.
  ldd "$WORK/consumer/build/c_app" | grep -q "$WORK/prefix/lib.*/libringrun.so" ||
    fail "c_app does not load the installed libringrun.so: $(ldd "$WORK/consumer/build/c_app" | grep ringrun)"
  expect_no_orphans
}

# A CPU list ("0-2,5") as the numbers in it, one per line.
expand_cpus() {
  local part
  IFS=, read -ra parts <<<"$1"
  for part in "${parts[@]}"; do
    if [[ $part == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
  done
}

# --bind-to core: each rank runs on its own share of this machine's CPUs (the launcher's mask cut
# into equal, contiguous parts) and RINGRUN_CPUS names it; --bind-to none keeps the launcher's
# mask; more ranks than CPUs binds nothing, with one warning.
t_bind_to() {
  local mine report='echo "cpus=$(grep Cpus_allowed_list /proc/self/status | cut -f2) env=${RINGRUN_CPUS-unset}"'
  mine=$(grep Cpus_allowed_list /proc/self/status | cut -f2)
  local -a cpus
  mapfile -t cpus < <(expand_cpus "$mine")
  local n=${#cpus[@]}
  (( n >= 1 )) || fail "cannot read this process's CPUs ($mine)"

  "$RINGRUN" -np 2 --bind-to none sh -c "$report" >"$WORK/none" 2>"$WORK/err" ||
    fail "ringrun --bind-to none failed: $(cat "$WORK/err")"
  for r in 0 1; do expect_contains "$WORK/none" "[$r]<stdout>:cpus=$mine env=unset"; done

  if (( n < 2 )); then
    echo "SKIP: this process may use $n CPU; --bind-to core needs 2"
    exit 77
  fi
  "$RINGRUN" -np 2 --bind-to core sh -c "$report" >"$WORK/core" 2>"$WORK/err" ||
    fail "ringrun --bind-to core failed: $(cat "$WORK/err")"
  expect_not_contains "$WORK/err" "allowed CPU"
  local share=$((n / 2)) r line got want
  for r in 0 1; do
    line=$(grep -F "[$r]<stdout>:cpus=" "$WORK/core") || fail "no report from rank $r"
    got=${line#*cpus=}; got=${got%% *}
    [[ $line == *" env=$got" ]] || fail "rank $r: RINGRUN_CPUS does not match its CPUs: $line"
    want=$(printf '%s\n' "${cpus[@]:$((r * share)):$share}")
    [[ $(expand_cpus "$got") == "$want" ]] ||
      fail "rank $r runs on CPUs $got, expected share $r of $n ($(echo $want))"
  done
  if (( n == 2 )); then
    expect_contains "$WORK/core" "[0]<stdout>:cpus=${cpus[0]} env=${cpus[0]}"
    expect_contains "$WORK/core" "[1]<stdout>:cpus=${cpus[1]} env=${cpus[1]}"
  fi

  if (( n <= 32 )); then
    "$RINGRUN" -np $((n + 1)) --bind-to core sh -c "$report" >"$WORK/over" 2>"$WORK/err" ||
      fail "ringrun -np $((n + 1)) --bind-to core failed: $(cat "$WORK/err")"
    for ((r = 0; r <= n; r++)); do expect_contains "$WORK/over" "[$r]<stdout>:cpus=$mine env=unset"; done
    expect_contains "$WORK/err" "$((n + 1)) ranks but $n allowed CPUs"
    [[ $(grep -c "allowed CPU" "$WORK/err") == 1 ]] || fail "the warning is not said once: $(cat "$WORK/err")"
  fi
  expect_no_orphans
}

# horovodrun's flags where they change what ranks see: their variables, their addresses, their
# folders, their working directory, the job's time limit, placement beyond the slots.
t_horovodrun_flags() {
  local rc start
  printf 'params:\n  cache_capacity: 77\n  fusion_threshold_mb: 64\nlogging:\n  level: INFO\n' \
    >"$WORK/cfg.yaml"
  "$RINGRUN" -np 2 --config-file "$WORK/cfg.yaml" --fusion-threshold-mb 4 --cycle-time-ms 2 \
    --log-level WARNING --tcp --network-interfaces lo --hierarchical-allreduce --gloo \
    --timeline-filename "$WORK/tl.json" env >"$WORK/out" 2>"$WORK/err" ||
    fail "ringrun with horovodrun's flags failed: $(cat "$WORK/err")"
  for r in 0 1; do
    expect_contains "$WORK/out" "[$r]<stdout>:HOROVOD_FUSION_THRESHOLD=4194304"
    expect_contains "$WORK/out" "[$r]<stdout>:RINGRUN_FUSION_THRESHOLD=4194304"
    expect_contains "$WORK/out" "[$r]<stdout>:HOROVOD_CACHE_CAPACITY=77"
    expect_contains "$WORK/out" "[$r]<stdout>:HOROVOD_CYCLE_TIME=2"
    expect_contains "$WORK/out" "[$r]<stdout>:HOROVOD_LOG_LEVEL=WARNING"
    expect_contains "$WORK/out" "[$r]<stdout>:RINGRUN_LOG_LEVEL=warn"
    expect_contains "$WORK/out" "[$r]<stdout>:HOROVOD_HIERARCHICAL_ALLREDUCE=1"
    expect_contains "$WORK/out" "[$r]<stdout>:HOROVOD_TIMELINE=$WORK/tl.json"
    expect_contains "$WORK/out" "[$r]<stdout>:NCCL_IB_DISABLE=1"
    expect_contains "$WORK/out" "[$r]<stdout>:NCCL_SOCKET_IFNAME=lo"
    expect_contains "$WORK/out" "[$r]<stdout>:RINGRUN_HOST_ADDR=127.0.0.1"
  done
  expect_contains "$WORK/err" "ringrun: --gloo: ringrun's own controller"
  [[ $(grep -c -- "--gloo" "$WORK/err") == 1 ]] || fail "the --gloo note is not said once: $(cat "$WORK/err")"
  "$RINGRUN" -np 1 -wdir "$WORK" "$PROBE" env >"$WORK/out" 2>"$WORK/err" ||
    fail "-wdir failed: $(cat "$WORK/err")"
  expect_contains "$WORK/out" "[0]<stdout>:CWD=$WORK"

  # The data plane's interface must exist on the rank's host.
  "$RINGRUN" -np 1 --network-interfaces nosuchif0 touch "$WORK/started" >"$WORK/out" 2>"$WORK/err"
  rc=$?
  (( rc != 0 )) || fail "--network-interfaces nosuchif0 succeeded"
  expect_contains "$WORK/err" "nosuchif0: no such interface"
  [[ ! -e $WORK/started ]] || fail "--network-interfaces nosuchif0 started the command"

  # Rank folders sort: rank.00 .. rank.10; -prefix-output-with-timestamp as horovodrun spells it.
  "$RINGRUN" -np 11 --output-filename "$WORK/logs" --prefix-output-with-timestamp sh -c 'echo hi' \
    >"$WORK/out" 2>"$WORK/err" || fail "-np 11 --output-filename failed: $(cat "$WORK/err")"
  for r in 00 07 10; do
    [[ $(cat "$WORK/logs/rank.$r/stdout") == hi ]] || fail "no $WORK/logs/rank.$r/stdout"
  done
  [[ ! -e $WORK/logs/rank.7 ]] || fail "an unpadded rank folder"
  grep -qE '^[A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9][0-9] [0-9:]{8} [0-9]{4}\[3\]<stdout>:hi' \
    "$WORK/out" || fail "no timestamped line: $(head -3 "$WORK/out")"

  # --timeout: a hang ends with a message naming the flag, exit 124, and nothing left behind.
  start=$SECONDS
  "$RINGRUN" -np 2 --timeout 2 --grace-period 1 "$PROBE" sleep 60 >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 124 $rc "--timeout 2"
  (( SECONDS - start < 10 )) || fail "--timeout 2 took $((SECONDS - start)) s"
  expect_contains "$WORK/err" "--timeout 2: the job ran longer than 2 s"
  expect_no_orphans

  # --report-bindings: each rank's CPUs, or that it is not bound.
  "$RINGRUN" -np 2 --report-bindings /bin/true >"$WORK/out" 2>"$WORK/err" ||
    fail "--report-bindings failed: $(cat "$WORK/err")"
  expect_contains "$WORK/err" "rank 0 on localhost (pid "
  expect_contains "$WORK/err" "): not bound (--bind-to none)"
  "$RINGRUN" -np 1 --bind-to core --report-bindings /bin/true >"$WORK/out" 2>"$WORK/err" ||
    fail "--bind-to core --report-bindings failed: $(cat "$WORK/err")"
  expect_contains "$WORK/err" "): bound to CPUs "

  # More ranks than slots: refused naming --oversubscribe, and run with it.
  "$RINGRUN" -np 3 -H localhost:2 touch "$WORK/started" 2>"$WORK/err"; rc=$?
  expect_rc 2 $rc "-np 3 on 2 slots"
  expect_contains "$WORK/err" "--oversubscribe allows more ranks than slots"
  [[ ! -e $WORK/started ]] || fail "-np 3 on 2 slots started the command"
  "$RINGRUN" -np 3 -H localhost:2 --oversubscribe "$PROBE" env >"$WORK/out" 2>"$WORK/err" ||
    fail "--oversubscribe failed: $(cat "$WORK/err")"
  expect_contains "$WORK/out" "[2]<stdout>:RINGRUN_LOCAL_SIZE=3"

  # Elastic usage errors: exit 2, nothing started.
  "$RINGRUN" -np 2 --min-np 3 touch "$WORK/started" 2>"$WORK/err"; rc=$?
  expect_rc 2 $rc "--min-np above -np"
  expect_contains "$WORK/err" "--min-np 3 is more than -np 2"
  "$RINGRUN" -np 2 --min-np 1 --host-discovery-script ./d.sh -H localhost:2 touch "$WORK/started" \
    2>"$WORK/err"; rc=$?
  expect_rc 2 $rc "--host-discovery-script with -H"
  expect_contains "$WORK/err" "--host-discovery-script and -H cannot be used together"
  [[ ! -e $WORK/started ]] || fail "an elastic usage error started the command"
  expect_no_orphans
}

# Open MPI's mpirun, as root here; its ranks carry this test's tag (mpirun passes its environment).
mpirun_np() {  # NP ARGS...
  command -v mpirun >/dev/null || { echo "SKIP: no mpirun (openmpi-bin)"; exit 77; }
  local np=$1
  shift
  mpirun --allow-run-as-root --oversubscribe -np "$np" "$@"
}

# The rank of mpirun's job whose OMPI_COMM_WORLD_RANK is $1.
mpirun_rank_pid() {
  for p in $(tagged_pids); do
    tr '\0' '\n' 2>/dev/null </proc/$p/environ | grep -qx "OMPI_COMM_WORLD_RANK=$1" && echo $p
  done | head -1
}

t_mpirun() {
  # libringrun under mpirun, without ringrun: joined through PMIx, its numbering the launcher's.
  local worker="$BIN/runtime_test_worker" r
  mpirun_np 4 "$worker" launched >"$WORK/out" 2>"$WORK/err" ||
    fail "mpirun -np 4: $(tail -5 "$WORK/err")"
  for r in 0 1 2 3; do
    expect_contains "$WORK/out" "launched rank=$r size=4 local=$r/4 cross=0/1 sum=10"
    expect_contains "$WORK/out" "ok rank=$r size=4"
    expect_contains "$WORK/out" "rank $r of 4 found its peers through PMIx (mpirun (Open MPI), namespace "
  done
  # Over TCP alone; named submissions from two threads; three rounds of init and shutdown.
  mpirun_np 3 -x RINGRUN_DISABLE_SHM=1 "$worker" check >"$WORK/out" 2>"$WORK/err" ||
    fail "mpirun -np 3, no shared memory: $(tail -5 "$WORK/err")"
  for r in 0 1 2; do expect_contains "$WORK/out" "ok rank=$r size=3"; done
  mpirun_np 4 "$worker" engine >"$WORK/out" 2>"$WORK/err" || fail "engine: $(tail -5 "$WORK/err")"
  mpirun_np 3 "$worker" reinit >"$WORK/out" 2>"$WORK/err" || fail "reinit: $(tail -5 "$WORK/err")"
  mpirun_np 1 "$worker" check >"$WORK/out" 2>"$WORK/err" || fail "-np 1: $(tail -5 "$WORK/err")"
  expect_contains "$WORK/out" "ok rank=0 size=1"
  # Under ringrun, ringrun's job wins over PMIx variables left in the environment.
  PMIX_RANK=0 PMIX_NAMESPACE=stale "$RINGRUN" -np 2 "$worker" check >"$WORK/out" 2>"$WORK/err" ||
    fail "ringrun with PMIX_ variables: $(tail -5 "$WORK/err")"
  expect_contains "$WORK/out" "[1]<stdout>:ok rank=1 size=2"
  expect_not_contains "$WORK/out" "through PMIx"
  # mpirun's variables without a PMIx server to join: refused, naming mpirun and why.
  local rc
  OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=1 PMIX_RANK=1 PMIX_NAMESPACE=stale \
    "$worker" check >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 2 $rc "mpirun's variables, no PMIx server"
  expect_contains "$WORK/err" "one of 4 processes started by mpirun (Open MPI)"
  expect_contains "$WORK/err" "its PMIx server could not be joined: PMIx_Init: "
  expect_contains "$WORK/err" "ringrun -np 4"
  OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=1 "$worker" check >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 2 $rc "mpirun's variables, no PMIX_"
  expect_contains "$WORK/err" "one of 4 processes started by mpirun (Open MPI) (OMPI_COMM_WORLD_SIZE=4"
  expect_no_orphans
}

t_mpirun_kill() {
  # A rank of an mpirun job killed in the middle of allreduces: mpirun ends the job in bounded
  # time, naming it; with --enable-recovery mpirun leaves the others running, and they fail by
  # themselves in bounded time, naming a closed peer. Then a rank that never joins.
  local worker="$BIN/runtime_test_worker" recovery rc start pid victim r
  for recovery in "" --enable-recovery; do
    mpirun_np 4 $recovery -x RINGRUN_TIMEOUT_MS=20000 "$worker" loop >"$WORK/out" 2>"$WORK/err" &
    pid=$!
    wait_for_lines "$WORK/out" "looping rank=" 4 30
    victim=
    for _ in $(seq 50); do
      victim=$(mpirun_rank_pid 2)
      [[ -n $victim ]] && break
      sleep 0.1
    done
    if [[ -z $victim ]]; then
      for p in $(tagged_pids); do
        echo "tagged: $p $(cat /proc/$p/comm 2>/dev/null) $(tr '\0' '\n' 2>/dev/null </proc/$p/environ | grep OMPI_COMM_WORLD_RANK=)" >&2
      done
      cat "$WORK/out" >&2
      fail "rank 2 not found"
    fi
    start=$SECONDS
    kill -9 "$victim"
    wait $pid; rc=$?
    (( SECONDS - start < 15 )) || fail "mpirun $recovery took $((SECONDS - start)) s to end"
    if [[ -z $recovery ]]; then
      [[ $rc != 0 ]] || fail "mpirun exited 0 with a rank killed"
      # mpirun names rank 2, unless a survivor's failure (naming it) reached mpirun first.
      grep -qE "process rank 2 with PID|: peer rank 2 \(127.0.0.1:" "$WORK/err" ||
        fail "neither mpirun nor a survivor named rank 2: $(grep -v info "$WORK/err" | head -20)"
    else
      # Each survivor names the first of its peers whose connection it found closed: rank 2, or
      # a survivor that had failed already (ranks 1 and 3 usually name rank 2, not always).
      expect_contains "$WORK/err" ": peer rank 2 (127.0.0.1:"
      [[ $(grep -c "allreduce failed: rank [013]: peer rank [0-3] (127.0.0.1:" "$WORK/err") == 3 ]] ||
        fail "not every survivor failed naming a peer"
    fi
    expect_no_orphans
  done
  # A rank that exits before it joins. mpirun ends the job naming it when the others had
  # connected to PMIx first; else they fail at the join timeout, naming it.
  start=$SECONDS
  mpirun_np 4 -x RINGRUN_JOIN_TIMEOUT_MS=3000 sh -c \
    '[ "$OMPI_COMM_WORLD_RANK" = 3 ] && exit 0; exec "$0" check' "$worker" >"$WORK/out" 2>"$WORK/err"
  rc=$?
  [[ $rc != 0 ]] || fail "mpirun exited 0 with a rank that never joined"
  (( SECONDS - start < 15 )) || fail "a rank that never joined: $((SECONDS - start)) s"
  if ! grep -q "due to process rank 3 with PID" "$WORK/err" &&
    ! grep -qF "ringrun_init failed: rank 0: rank 3 (of 4) did not join within" "$WORK/err"; then
    echo "--- mpirun exited $rc after $((SECONDS - start)) s; stdout:" >&2
    head -50 "$WORK/out" >&2
    expect_contains "$WORK/err" "ringrun_init failed: rank 0: rank 3 (of 4) did not join within"
  fi
  if grep -q "did not join within" "$WORK/err"; then
    [[ $(grep "ringrun_init failed: " "$WORK/err" | grep -vc "rank 3 (of 4) did not join") == 0 ]] ||
      fail "a rank failed without naming rank 3: $(grep 'ringrun_init failed' "$WORK/err")"
  fi
  expect_no_orphans
}

# A rank for the --max-restarts tests ($WORK/restart_worker DIR FAILS [hang]): it prints its
# attempt and contract, records its pid (and its child's) in DIR/pids.N for attempt N, and checks
# that no process of attempt N-1 is alive (PIDs are not reused within a test's seconds). While RINGRUN_RESTART_COUNT < FAILS, rank 1 exits 10+N
# and the others ignore SIGTERM and wait (only the teardown's SIGKILL ends them); later, every
# rank exits 0, or with "hang" prints "attempt N sleeping" and sleeps.
make_restart_worker() {
  cat >"$WORK/restart_worker" <<'EOF'
#!/bin/sh
dir=$1 fails=$2 n=$RINGRUN_RESTART_COUNT
echo "rank $RINGRUN_RANK attempt $n torchelastic $TORCHELASTIC_RESTART_COUNT/$TORCHELASTIC_MAX_RESTARTS run $TORCHELASTIC_RUN_ID job $RINGRUN_JOB_ID"
if [ "$n" -gt 0 ]; then
  for p in $(cat "$dir/pids.$((n - 1))"); do
    # Alive, not a zombie waiting to be reaped.
    grep -qs '^State:[[:space:]]*[^Z[:space:]]' "/proc/$p/status" &&
      echo "left behind by attempt $((n - 1)): pid $p"
  done
fi
echo $$ >>"$dir/pids.$n"
if [ "$n" -lt "$fails" ]; then
  if [ "$RINGRUN_RANK" = 1 ]; then
    sleep 0.3
    echo "rank 1 fails in attempt $n" >&2
    exit $((10 + n))
  fi
  trap '' TERM
  sleep 60 &
  echo $! >>"$dir/pids.$n"
  wait
fi
if [ "${3:-}" = hang ]; then
  echo "attempt $n sleeping"
  exec sleep 60
fi
exit 0
EOF
  chmod +x "$WORK/restart_worker"
}

t_restarts() {
  # Rank 1 fails in attempts 0 and 1; attempt 2 succeeds: ringrun exits 0 after 3 attempts.
  make_restart_worker
  local rc
  "$RINGRUN" -np 3 -H localhost:2,127.0.0.1:1 --grace-period 0.5 --max-restarts 3 \
    --output-filename "$WORK/logs" "$WORK/restart_worker" "$WORK" 2 >"$WORK/out" 2>"$WORK/err"
  rc=$?
  expect_rc 0 $rc "a job that succeeds in its third attempt"
  expect_contains "$WORK/err" \
    "ringrun: restarting the job (attempt 2 of 4) after rank 1 on host localhost exited with code 10"
  expect_contains "$WORK/err" \
    "ringrun: restarting the job (attempt 3 of 4) after rank 1 on host localhost exited with code 11"
  [[ $(grep -c "restarting the job" "$WORK/err") == 2 ]] || fail "expected 2 restart lines"
  expect_contains "$WORK/err" "rank 1 fails in attempt 1"  # each failure's stderr is quoted
  for r in 0 1 2; do
    for n in 0 1 2; do
      expect_contains "$WORK/out" "[$r]<stdout>:rank $r attempt $n torchelastic $n/3 "
    done
    expect_not_contains "$WORK/out" "[$r]<stdout>:rank $r attempt 3"
  done
  # Every rank of an attempt is gone before the next starts: none saw a pid of the one before.
  expect_not_contains "$WORK/out" "left behind"
  # --output-filename: later attempts append, so that the files hold every attempt in order.
  [[ $(grep -c "^rank 2 attempt [012] " "$WORK/logs/rank.2/stdout") == 3 ]] ||
    fail "rank.2/stdout lacks an attempt: $(cat "$WORK/logs/rank.2/stdout")"
  expect_contains "$WORK/logs/rank.1/stderr" "rank 1 fails in attempt 0"
  expect_contains "$WORK/logs/rank.1/stderr" "rank 1 fails in attempt 1"
  [[ -s $WORK/pids.1 && -s $WORK/pids.2 && ! -e $WORK/pids.3 ]] || fail "not exactly 3 attempts"
  # A fresh job (id, secret, service) per attempt; torchrun's run id is one for all of them.
  local jobs runs
  jobs=$(grep -o ' job [0-9a-f]*$' "$WORK/out" | sort -u | wc -l)
  runs=$(grep -o ' run [0-9a-f]* ' "$WORK/out" | sort -u | wc -l)
  [[ $jobs == 3 ]] || fail "expected 3 job ids, one per attempt, found $jobs"
  [[ $runs == 1 ]] || fail "expected one TORCHELASTIC_RUN_ID, found $runs"
  expect_no_orphans
  # Without --max-restarts, the count is 0 and the job ends at the first failure.
  rm -f "$WORK"/pids.*
  "$RINGRUN" -np 2 --grace-period 0.5 "$WORK/restart_worker" "$WORK" 1 >"$WORK/out" 2>"$WORK/err"
  rc=$?
  expect_rc 10 $rc "the first failure without --max-restarts"
  expect_contains "$WORK/out" "[0]<stdout>:rank 0 attempt 0 torchelastic 0/0 "
  expect_not_contains "$WORK/err" "restart"
  expect_no_orphans
}

t_restarts_exhausted() {
  # Every attempt fails, each with its own code: ringrun exits with the last one's.
  make_restart_worker
  local rc
  "$RINGRUN" -np 2 --grace-period 0.5 --max_restarts 2 "$WORK/restart_worker" "$WORK" 99 \
    >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 12 $rc "three failed attempts (the last exits 12)"
  [[ $(grep -c "restarting the job" "$WORK/err") == 2 ]] || fail "expected 2 restart lines"
  expect_contains "$WORK/err" \
    "ringrun: no restarts left (--max-restarts 2): every one of the 3 attempts failed; exit code 12, the last attempt's"
  expect_not_contains "$WORK/out" "left behind"
  expect_no_orphans
  # A failure that would repeat itself is not restarted.
  "$RINGRUN" -np 2 --max-restarts 2 "$WORK/no-such-command" >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 127 $rc "a missing command"
  expect_contains "$WORK/err" "not restarting the job (--max-restarts 2): what could not start"
  expect_not_contains "$WORK/err" "restarting the job (attempt"
  # Usage errors exit 2 naming the flag, and start nothing.
  "$RINGRUN" -np 1 --max-restarts -1 touch "$WORK/started" 2>"$WORK/err"; rc=$?
  expect_rc 2 $rc "--max-restarts -1"
  expect_contains "$WORK/err" "--max-restarts -1: must be at least 0"
  "$RINGRUN" -np 1 --max-restarts three touch "$WORK/started" 2>"$WORK/err"; rc=$?
  expect_rc 2 $rc "--max-restarts three"
  expect_contains "$WORK/err" "--max-restarts three: not a whole number"
  "$RINGRUN" -np 1 --max-restarts 1 --min-np 1 touch "$WORK/started" 2>"$WORK/err"; rc=$?
  expect_rc 2 $rc "--min-np beside --max-restarts"
  expect_contains "$WORK/err" "--max-restarts and an elastic job (--min-np, --host-discovery-script) cannot be"
  [[ ! -e $WORK/started ]] || fail "a usage error started the command"
  expect_no_orphans
}

t_restarts_sigint() {
  # Ctrl-C during the second attempt (restart count 1) ends the job: 130, no third attempt.
  make_restart_worker
  local pid rc
  "$RINGRUN" -np 2 --grace-period 0.5 --max-restarts 5 "$WORK/restart_worker" "$WORK" 1 hang \
    >"$WORK/out" 2>"$WORK/err" &
  pid=$!
  wait_for_lines "$WORK/out" "attempt 1 sleeping" 2 30
  kill -INT $pid
  wait $pid; rc=$?
  expect_rc 130 $rc "SIGINT during the second attempt"
  [[ $(grep -c "restarting the job" "$WORK/err") == 1 ]] || fail "expected exactly 1 restart line"
  expect_contains "$WORK/err" "SIGINT received: forwarding it to every rank"
  [[ ! -e $WORK/pids.2 ]] || fail "a third attempt started after SIGINT"
  expect_not_contains "$WORK/out" "left behind"
  expect_no_orphans
}

# Elastic jobs on two "hosts" of this machine (localhost and 127.0.0.1, an agent each).
ELASTIC_HOSTS=localhost:2,127.0.0.1:2

# The pid of every "joined" line of worker W in $WORK/out, one per line.
elastic_pids() { grep -F "[$1]<stdout>:joined " "$WORK/out" | sed 's/.* pid=//' | sort -u; }

# The pid of this test's agent of host index H; status 1 when there is none.
agent_of_host() {
  local p
  for p in $(tagged_pids); do
    if [[ $(cat /proc/$p/comm 2>/dev/null) == ringrun-agent ]] &&
       tr '\0' ' ' </proc/$p/cmdline | grep -q -- "--host-index $1 "; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

t_elastic_kill() {
  # Rank 2 of 4 (on 127.0.0.1) is killed -9 mid-run: its host is blacklisted and its other rank
  # (3) ended; ranks 0 and 1 (on localhost) go on as generation 2 of size 2, in the same
  # processes, and the job ends with 0.
  local worker="$BIN/ringrun-test-elastic-worker" rc w
  "$RINGRUN" -np 4 --min-np 2 -H $ELASTIC_HOSTS "$worker" 300 2 100 kill \
    >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 0 $rc "an elastic job that lost a rank: $(tail -5 "$WORK/err")"
  expect_contains "$WORK/err" "rank 2 (worker 2) on host 127.0.0.1 was killed by SIGKILL (signal 9)"
  expect_contains "$WORK/err" "host 127.0.0.1 is blacklisted, its workers 3 are ended"
  expect_contains "$WORK/err" "generation 2: 2 ranks (was 4), reset 1"
  [[ $(grep -c "generation" "$WORK/err") == 1 ]] || fail "expected one reset line: $(cat "$WORK/err")"
  for w in 0 1; do
    expect_contains "$WORK/out" "[$w]<stdout>:joined rank=$w size=4 local=$w/2 cross=0/2 "
    expect_contains "$WORK/out" "[$w]<stdout>:joined rank=$w size=2 local=$w/2 cross=0/1 "
    expect_contains "$WORK/out" "[$w]<stdout>:done steps=300 size=2"
    [[ $(elastic_pids $w | wc -l) == 1 ]] || fail "worker $w changed process: $(elastic_pids $w)"
    # The failed collective names a rank of 127.0.0.1 and that host.
    grep -F "[$w]<stdout>:error at step" "$WORK/out" | grep -qE "rank [23] on host 127\.0\.0\.1" ||
      fail "worker $w's error does not name the failed rank and host: $(grep -F "[$w]" "$WORK/out" | grep error)"
  done
  expect_not_contains "$WORK/out" "[2]<stdout>:done"
  expect_not_contains "$WORK/out" "[3]<stdout>:done"
  expect_no_orphans
}

t_elastic_agent_lost() {
  # The agent of 127.0.0.1 is killed -9 mid-run (its ranks die with it, unreported): the host is
  # lost and blacklisted, and localhost's ranks go on as generation 2 of size 2.
  local worker="$BIN/ringrun-test-elastic-worker" rc w pid agent
  "$RINGRUN" -np 4 --min-np 2 -H $ELASTIC_HOSTS "$worker" 2000 >"$WORK/out" 2>"$WORK/err" &
  pid=$!
  wait_for_lines "$WORK/out" "joined rank=" 4 30
  agent=$(agent_of_host 1) || fail "no agent for host index 1"
  kill -9 "$agent"
  wait $pid; rc=$?
  expect_rc 0 $rc "an elastic job that lost an agent: $(tail -5 "$WORK/err")"
  expect_contains "$WORK/err" "lost the agent on host 127.0.0.1"
  expect_contains "$WORK/err" "(workers 2,3 were running); host 127.0.0.1 is blacklisted; generation 2: 2 ranks (was 4), reset 1"
  for w in 0 1; do
    expect_contains "$WORK/out" "[$w]<stdout>:done steps=2000 size=2"
    [[ $(elastic_pids $w | wc -l) == 1 ]] || fail "worker $w changed process"
  done
  expect_no_orphans
}

t_elastic_frozen_host() {
  # The agent of 127.0.0.1 and its ranks are stopped (SIGSTOP): nothing closes, as when a link
  # is cut or a host freezes. The launcher loses the agent (heartbeat or keepalive) and breaks
  # generation 1 through the ranks' Watch: the survivors' allreduces fail within the heartbeat
  # timeout + 2 s (not at the 60 s collective timeout), they re-form with 2 ranks and finish.
  local worker="$BIN/ringrun-test-elastic-worker" rc w pid agent stopped start ms
  local bound_ms=12000  # kHeartbeatTimeoutMs + 2 s
  "$RINGRUN" -np 4 --min-np 2 -H $ELASTIC_HOSTS "$worker" 3000 >"$WORK/out" 2>"$WORK/err" &
  pid=$!
  wait_for_lines "$WORK/out" "joined rank=" 4 30
  agent=$(agent_of_host 1) || fail "no agent for host index 1"
  stopped="$agent $(elastic_pids 2) $(elastic_pids 3)"
  [[ $(wc -w <<<"$stopped") == 3 ]] || fail "expected an agent and two ranks, got: $stopped"
  start=$(date +%s%N)
  kill -STOP $stopped
  # Both survivors report their failed allreduce.
  local end=$((SECONDS + 30))
  until [[ $(grep -cE '^\[[01]\]<stdout>:error at step' "$WORK/out") -ge 2 ]]; do
    (( SECONDS < end )) || { kill -CONT $stopped; fail "the survivors did not fail within 30 s: $(tail -5 "$WORK/err")"; }
    sleep 0.05
  done
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  echo "survivors failed $ms ms after SIGSTOP (bound $bound_ms ms)"
  (( ms <= bound_ms )) || { kill -CONT $stopped; fail "the survivors failed $ms ms after SIGSTOP, more than $bound_ms"; }
  # The stopped agent is lost by its missing heartbeats or by the gRPC keepalive of its
  # connection (8 s), whichever comes first.
  local lost="lost the agent on host 127.0.0.1: (no heartbeat from the agent for 10 s|the connection to the agent broke) \(workers 2,3 were running\)"
  grep -qE "^\[[01]\]<stdout>:error at step [0-9]+ \(4\): rank [01]: generation 1 of the job is broken: $lost" "$WORK/out" ||
    fail "no survivor named the broken generation: $(grep 'error at' "$WORK/out")"
  wait_for_lines "$WORK/out" "joined rank=" 6 30
  # The stopped ones go on: their agent finds its session gone and ends them, and they cannot
  # join generation 2.
  kill -CONT $stopped
  wait $pid; rc=$?
  expect_rc 0 $rc "an elastic job with a frozen host: $(tail -5 "$WORK/err")"
  grep -qE "$lost; host 127.0.0.1 is blacklisted; generation 2: 2 ranks \(was 4\), reset 1" "$WORK/err" ||
    fail "no reset line: $(cat "$WORK/err")"
  for w in 0 1; do
    expect_contains "$WORK/out" "[$w]<stdout>:joined rank=$w size=2 "
    expect_contains "$WORK/out" "[$w]<stdout>:done steps=3000 size=2"
    [[ $(elastic_pids $w | wc -l) == 1 ]] || fail "worker $w changed process"
  done
  expect_no_orphans 10
}

t_elastic_leave() {
  # A rank that exits 0 leaves: the others go on without it, no host blamed, no reset counted
  # (--reset-limit 0 allows none).
  local worker="$BIN/ringrun-test-elastic-worker" rc w
  "$RINGRUN" -np 4 --min-np 2 --reset-limit 0 -H $ELASTIC_HOSTS "$worker" 200 3 50 leave \
    >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 0 $rc "an elastic job with a rank leaving: $(tail -5 "$WORK/err")"
  expect_contains "$WORK/err" "rank 3 (worker 3) on host 127.0.0.1 exited 0 and left the job"
  expect_contains "$WORK/err" "generation 2: 3 ranks (was 4), reset 0"
  expect_not_contains "$WORK/err" "blacklisted"
  for w in 0 1 2; do
    expect_contains "$WORK/out" "[$w]<stdout>:joined rank=$w size=3 "
    expect_contains "$WORK/out" "[$w]<stdout>:done steps=200 size=3"
  done
  expect_contains "$WORK/out" "[2]<stdout>:joined rank=2 size=3 local=0/1 cross=1/2 "
  expect_no_orphans
  # A survivor that exits 0 instead of joining the generation formed after a failure: the
  # others' Join does not wait for it; worker 0 goes on alone, at size 1. Worker 1's exit
  # follows worker 2's kill by little (its collective fails on the closed connection): the
  # launcher forms generation 2 with workers 0 and 1 and then generation 3 without worker 1,
  # or, when both exits reach it before it forms one, generation 2 without either.
  "$RINGRUN" -np 4 --min-np 1 -H $ELASTIC_HOSTS -x ELASTIC_QUIT_ON_ERROR=1 "$worker" 200 2 50 kill \
    >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 0 $rc "a survivor leaving a forming generation: $(tail -5 "$WORK/err")"
  if grep -qF "generation 2: 2 ranks (was 4), reset 1" "$WORK/err"; then
    expect_contains "$WORK/err" "rank 1 (worker 1) on host localhost exited 0 and left the job; generation 3: 1 ranks (was 2), reset 1"
  else
    expect_contains "$WORK/err" "rank 1 (worker 1) on host localhost exited 0 and left the job; "
    expect_contains "$WORK/err" "rank 2 (worker 2) on host 127.0.0.1 was killed by SIGKILL (signal 9); "
    expect_contains "$WORK/err" "host 127.0.0.1 is blacklisted, its workers 3 are ended; generation 2: 1 ranks (was 4), reset 1"
    expect_not_contains "$WORK/err" "generation 3"
  fi
  expect_contains "$WORK/out" "[0]<stdout>:joined rank=0 size=1 local=0/1 cross=0/1 "
  expect_contains "$WORK/out" "[0]<stdout>:done steps=200 size=1"
  expect_no_orphans
}

t_elastic_limits() {
  # The failure that needs a reset beyond --reset-limit ends the job naming the limit, with the
  # failed rank's exit code; so does one that leaves fewer than --min-np ranks.
  local worker="$BIN/ringrun-test-elastic-worker" rc
  "$RINGRUN" -np 4 --min-np 2 --reset-limit 0 -H $ELASTIC_HOSTS "$worker" 300 2 50 kill \
    >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 137 $rc "--reset-limit 0"
  expect_contains "$WORK/err" "reset limit 0 reached (--reset-limit)"
  expect_not_contains "$WORK/err" "generation 2"
  expect_no_orphans
  "$RINGRUN" -np 4 --min-np 3 -H $ELASTIC_HOSTS "$worker" 300 1 50 fail \
    >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 3 $rc "below --min-np"
  expect_contains "$WORK/err" "rank 1 (worker 1) on host localhost exited with code 3"
  expect_contains "$WORK/err" "2 ranks remain, fewer than --min-np 3: ending the job"
  expect_no_orphans
  # Within the limit: a failure (exit 3) with --reset-limit 1 is one reset, and the job goes on.
  "$RINGRUN" -np 4 --min-np 2 --reset-limit 1 -H $ELASTIC_HOSTS "$worker" 200 3 50 fail \
    >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 0 $rc "one reset within --reset-limit 1: $(tail -5 "$WORK/err")"
  expect_contains "$WORK/err" "generation 2: 2 ranks (was 4), reset 1 of --reset-limit 1"
  expect_no_orphans
}

# Writes the hosts file that the tests' discovery script cats, at once (a run never reads half
# of it): one argument per line.
write_hosts() {
  printf '%s\n' "$@" >"$WORK/hosts.new"
  mv "$WORK/hosts.new" "$WORK/hosts"
}


t_elastic_stopped_rank() {
  # A rank stopped (SIGSTOP) past the collective timeout: no process or agent is lost, the
  # others' collectives fail and they ask for generation 2. After the heartbeat timeout + 2 s
  # the launcher forms it with the same ranks (a reset, nobody blacklisted) and breaks
  # generation 1; the stopped rank never comes to the join: --start-timeout after the first
  # member did, it counts as the failure (its host blacklisted, its agent's ranks ended), and
  # the two others finish as generation 3. Then the same stop, continued 2 s later: the
  # stopped rank joins generation 2 with the others and all four finish, nobody blacklisted.
  local worker="$BIN/ringrun-test-elastic-worker" rc pid victim
  "$RINGRUN" -np 4 --min-np 2 --start-timeout 3 -H $ELASTIC_HOSTS -x RINGRUN_TIMEOUT_MS=3000 \
    "$worker" 3000 >"$WORK/out" 2>"$WORK/err" &
  pid=$!
  wait_for_lines "$WORK/out" "joined rank=" 4 30
  victim=$(elastic_pids 3)
  kill -STOP $victim
  wait $pid; rc=$?
  kill -CONT $victim 2>/dev/null
  expect_rc 0 $rc "a stopped rank: $(tail -5 "$WORK/err")"
  expect_contains "$WORK/err" "a collective of generation 1 failed with no rank or host lost (a rank stopped, or a link that dropped?): its ranks form the next one; generation 2: 4 ranks (was 4), reset 1"
  expect_contains "$WORK/err" "rank 3 (worker 3) on host 127.0.0.1 did not come to the join of generation 2 within 3 s (--start-timeout): stopped, or cut off; host 127.0.0.1 is blacklisted, its workers 2 are ended; generation 3: 2 ranks (was 4), reset 2"
  for w in 0 1; do expect_contains "$WORK/out" "[$w]<stdout>:done steps=3000 size=2"; done
  expect_no_orphans
  "$RINGRUN" -np 4 --min-np 2 --start-timeout 3 -H $ELASTIC_HOSTS -x RINGRUN_TIMEOUT_MS=3000 \
    "$worker" 3000 >"$WORK/out" 2>"$WORK/err" &
  pid=$!
  wait_for_lines "$WORK/out" "joined rank=" 4 30
  victim=$(elastic_pids 3)
  kill -STOP $victim
  sleep 2
  kill -CONT $victim
  wait $pid; rc=$?
  expect_rc 0 $rc "a rank stopped and continued: $(tail -5 "$WORK/err")"
  expect_not_contains "$WORK/err" "blacklisted"
  for w in 0 1 2 3; do expect_contains "$WORK/out" "[$w]<stdout>:done steps=3000 size=4"; done
  expect_no_orphans
}

t_elastic_discovery_up() {
  # The discovery script (cat of a file) lists localhost:2; once ranks 0 and 1 run, the file
  # gains 127.0.0.1:2. The launcher starts an agent there and workers 2 and 3, waits until they
  # wait in generation 2's Join, then raises the membership epoch: workers 0 and 1 see it at
  # their next check (every 50 steps), leave generation 1 and join 2 in their own processes,
  # with no failed collective; the newcomers take their step; all four finish at size 4.
  local worker="$BIN/ringrun-test-elastic-worker" rc w pid
  write_hosts localhost:2
  "$RINGRUN" -np 2 --max-np 4 --host-discovery-script "cat $WORK/hosts" -x ELASTIC_CHECK_EVERY=50 \
    --output-filename "$WORK/logs" "$worker" 4000 >"$WORK/out" 2>"$WORK/err" &
  pid=$!
  wait_for_lines "$WORK/out" "<stdout>:joined " 2 30
  write_hosts localhost:2 127.0.0.1:2
  wait $pid; rc=$?
  expect_rc 0 $rc "a job that gained a host: $(tail -5 "$WORK/err")"
  expect_contains "$WORK/err" "host discovery: host 127.0.0.1 (2 slots) added; generation 2: 4 ranks (was 2), reset 1; starting workers 2,3"
  expect_contains "$WORK/err" "generation 2: its new workers 2,3 wait to join it; membership epoch 1"
  [[ $(grep -c "generation" "$WORK/err") == 2 ]] || fail "expected one change: $(cat "$WORK/err")"
  for w in 0 1; do
    expect_contains "$WORK/out" "[$w]<stdout>:joined rank=$w size=2 local=$w/2 cross=0/1 "
    expect_contains "$WORK/out" "[$w]<stdout>:hosts updated at step "
    expect_contains "$WORK/out" "[$w]<stdout>:joined rank=$w size=4 local=$w/2 cross=0/2 "
    expect_contains "$WORK/out" "[$w]<stdout>:done steps=4000 size=4"
    [[ $(elastic_pids $w | wc -l) == 1 ]] || fail "worker $w changed process: $(elastic_pids $w)"
  done
  for w in 2 3; do
    expect_contains "$WORK/out" "[$w]<stdout>:joined rank=$w size=4 local=$((w - 2))/2 cross=1/2 "
    grep -F "[$w]<stdout>:joined " "$WORK/out" | head -1 | grep -q " new$" ||
      fail "worker $w's first join is not that of a new process"
    expect_contains "$WORK/out" "[$w]<stdout>:done steps=4000 size=4"
  done
  # --output-filename: a folder per worker, new workers' included.
  for w in 0 1 2 3; do expect_contains "$WORK/logs/rank.$w/stdout" "done steps=4000 size=4"; done
  expect_not_contains "$WORK/out" "error"
  expect_no_orphans
}

t_elastic_discovery_hang() {
  # The script adds 127.0.0.1:2, where worker 3 hangs before its Join (as in its imports). After
  # --start-timeout it counts as failed: its host is blacklisted, worker 2 is ended with it, and
  # workers 0 and 1, which trained on, finish at size 2. Nothing is left.
  local worker="$BIN/ringrun-test-elastic-worker" rc w pid
  write_hosts localhost:2
  "$RINGRUN" -np 2 --max-np 4 --start-timeout 3 --host-discovery-script "cat $WORK/hosts" \
    -x ELASTIC_CHECK_EVERY=50 -x ELASTIC_HANG_WORKER=3 \
    "$worker" 6000 >"$WORK/out" 2>"$WORK/err" &
  pid=$!
  wait_for_lines "$WORK/out" "<stdout>:joined " 2 30
  write_hosts localhost:2 127.0.0.1:2
  wait $pid; rc=$?
  expect_rc 0 $rc "a job whose newcomer hung: $(tail -5 "$WORK/err")"
  expect_contains "$WORK/err" "starting workers 2,3"
  expect_contains "$WORK/err" "rank 3 (worker 3) on host 127.0.0.1 did not join within 3 s of its start (--start-timeout)"
  expect_contains "$WORK/err" "host 127.0.0.1 is blacklisted"
  for w in 0 1; do
    expect_contains "$WORK/out" "[$w]<stdout>:done steps=6000 size=2"
    [[ $(elastic_pids $w | wc -l) == 1 ]] || fail "worker $w changed process: $(elastic_pids $w)"
  done
  expect_not_contains "$WORK/out" "[2]<stdout>:done"
  expect_not_contains "$WORK/out" "[3]<stdout>:done"
  expect_no_orphans
}

t_elastic_discovery_cooldown() {
  # Both hosts listed all along. Workers 2, 4 and 6 (each on 127.0.0.1) fail after 100 steps of
  # their own: the host is blacklisted for [1, 1.25) s, then [2, 2.5) s; each time its cooldown
  # ends, new workers start there and join; the third failure needs a fifth reset, past
  # --reset-limit 4: the job ends with the failing rank's code, naming the limit. Nothing is left.
  local worker="$BIN/ringrun-test-elastic-worker" rc pid
  write_hosts localhost:2 127.0.0.1:2
  "$RINGRUN" -np 4 --min-np 2 --blacklist-cooldown-range 1 10 --reset-limit 4 \
    --host-discovery-script "cat $WORK/hosts" -x ELASTIC_CHECK_EVERY=50 \
    -x ELASTIC_FAIL_WORKERS=2,4,6 -x ELASTIC_FAIL_AFTER=100 \
    "$worker" 100000 >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 3 $rc "the reset limit: $(tail -5 "$WORK/err")"
  expect_contains "$WORK/err" "rank 2 (worker 2) on host 127.0.0.1 exited with code 3; host 127.0.0.1 is blacklisted for 1 s"
  expect_contains "$WORK/err" "generation 2: 2 ranks (was 4), reset 1 of --reset-limit 4"
  expect_contains "$WORK/err" "host 127.0.0.1: blacklist cooldown ended; generation 3: 4 ranks (was 2), reset 2 of --reset-limit 4; starting workers 4,5"
  expect_contains "$WORK/err" "(worker 4) on host 127.0.0.1 exited with code 3; host 127.0.0.1 is blacklisted for 2 s"
  expect_contains "$WORK/err" "host 127.0.0.1: blacklist cooldown ended; generation 5: 4 ranks (was 2), reset 4 of --reset-limit 4; starting workers 6,7"
  expect_contains "$WORK/err" "(worker 6) on host 127.0.0.1 exited with code 3"
  expect_contains "$WORK/err" "reset limit 4 reached (--reset-limit)"
  for w in 4 5 6 7; do expect_contains "$WORK/out" "[$w]<stdout>:joined rank=$((w % 2 + 2)) size=4 "; done
  for w in 0 1; do
    [[ $(elastic_pids $w | wc -l) == 1 ]] || fail "worker $w changed process: $(elastic_pids $w)"
  done
  expect_no_orphans
}

t_elastic_discovery_no_holder() {
  # Workers 0 and 1 (localhost) never check for host updates, so workers 2 and 3 (127.0.0.1,
  # added by the script) wait in their join and generation 2 never completes. Worker 0 fails:
  # localhost is blacklisted, and the only ranks left are the new ones, which never got the
  # committed state: the job ends, saying so, instead of training on from their initial values.
  local worker="$BIN/ringrun-test-elastic-worker" rc pid
  write_hosts localhost:2
  "$RINGRUN" -np 2 --min-np 1 --max-np 4 --host-discovery-script "cat $WORK/hosts" \
    -x ELASTIC_FAIL_WORKERS=0 -x ELASTIC_FAIL_AFTER=3000 "$worker" 100000 >"$WORK/out" 2>"$WORK/err" &
  pid=$!
  wait_for_lines "$WORK/out" "<stdout>:joined " 2 30
  write_hosts localhost:2 127.0.0.1:2
  wait $pid; rc=$?
  expect_rc 3 $rc "no rank holds the state: $(tail -5 "$WORK/err")"
  expect_contains "$WORK/err" "starting workers 2,3"
  expect_contains "$WORK/err" "rank 0 (worker 0) on host localhost exited with code 3; host localhost is blacklisted"
  expect_contains "$WORK/err" "no rank holds the committed state: workers 2,3 remain, started in the running job and never in a generation that every member joined"
  expect_not_contains "$WORK/out" "size=2 local=0/2 cross=0/1 new"
  expect_no_orphans
}

t_elastic_discovery_from_one() {
  # A job that starts with one rank (-np 1) still joins the job service: its generation
  # completes and its Watch hears the epoch when the script adds a host, so it grows to 2.
  local worker="$BIN/ringrun-test-elastic-worker" rc pid
  write_hosts localhost:1
  "$RINGRUN" -np 1 --max-np 2 --host-discovery-script "cat $WORK/hosts" -x ELASTIC_CHECK_EVERY=50 \
    "$worker" 3000 >"$WORK/out" 2>"$WORK/err" &
  pid=$!
  wait_for_lines "$WORK/out" "<stdout>:joined " 1 30
  write_hosts localhost:1 127.0.0.1:1
  wait $pid; rc=$?
  expect_rc 0 $rc "a job of one rank that gained a host: $(tail -5 "$WORK/err")"
  expect_contains "$WORK/err" "generation 2: 2 ranks (was 1), reset 1; starting workers 1"
  expect_contains "$WORK/out" "[0]<stdout>:joined rank=0 size=2 "
  for w in 0 1; do expect_contains "$WORK/out" "[$w]<stdout>:done steps=3000 size=2"; done
  [[ $(elastic_pids 0 | wc -l) == 1 ]] || fail "worker 0 changed process: $(elastic_pids 0)"
  expect_no_orphans
}

t_elastic_discovery_down() {
  # The script lists both hosts, then localhost:2 alone: workers 2 and 3 (on 127.0.0.1) leave,
  # no host is blacklisted, and workers 0 and 1 finish as generation 2 of size 2.
  local worker="$BIN/ringrun-test-elastic-worker" rc w pid
  write_hosts localhost:2 127.0.0.1:2
  "$RINGRUN" -np 4 --min-np 2 --host-discovery-script "cat $WORK/hosts" -x ELASTIC_CHECK_EVERY=50 \
    "$worker" 4000 >"$WORK/out" 2>"$WORK/err" &
  pid=$!
  wait_for_lines "$WORK/out" "<stdout>:joined " 4 30
  write_hosts localhost:2
  wait $pid; rc=$?
  expect_rc 0 $rc "a job that lost a host to discovery: $(tail -5 "$WORK/err")"
  expect_contains "$WORK/err" "host discovery: host 127.0.0.1 removed; generation 2: 2 ranks (was 4), reset 1; workers 2,3 leave"
  expect_not_contains "$WORK/err" "blacklisted"
  expect_not_contains "$WORK/err" "exited with code"
  for w in 0 1; do
    expect_contains "$WORK/out" "[$w]<stdout>:joined rank=$w size=2 local=$w/2 cross=0/1 "
    expect_contains "$WORK/out" "[$w]<stdout>:done steps=4000 size=2"
    [[ $(elastic_pids $w | wc -l) == 1 ]] || fail "worker $w changed process: $(elastic_pids $w)"
  done
  expect_not_contains "$WORK/out" "[2]<stdout>:done"
  expect_not_contains "$WORK/out" "[3]<stdout>:done"
  expect_no_orphans
}

t_elastic_discovery_errors() {
  # The script's first run: a bad line ends the job before anything starts (exit 2), naming the
  # line; a failing script, or too few slots for -np, exit 1.
  local worker="$BIN/ringrun-test-elastic-worker" rc w
  printf '#!/bin/sh\necho localhost:2\necho h2:x\n' >"$WORK/bad.sh"
  chmod +x "$WORK/bad.sh"
  "$RINGRUN" -np 2 --host-discovery-script "$WORK/bad.sh" touch "$WORK/started" 2>"$WORK/err"; rc=$?
  expect_rc 2 $rc "a bad line at the first run"
  expect_contains "$WORK/err" "ringrun: host discovery: $WORK/bad.sh: line 2 'h2:x': "
  "$RINGRUN" -np 2 --host-discovery-script 'echo no inventory >&2; exit 5' touch "$WORK/started" \
    2>"$WORK/err"; rc=$?
  expect_rc 1 $rc "a failing script at the first run"
  expect_contains "$WORK/err" "exited with code 5; its stderr ends:"
  expect_contains "$WORK/err" "no inventory"
  "$RINGRUN" -np 3 --start-timeout 2 --discovery-interval 1 --host-discovery-script 'echo localhost:2' \
    touch "$WORK/started" 2>"$WORK/err"; rc=$?
  expect_rc 1 $rc "too few slots until the start timeout"
  expect_contains "$WORK/err" "lists 2 slots, fewer than -np 3: waiting for more (at most 2 s, --start-timeout)"
  expect_contains "$WORK/err" "lists 2 slots, fewer than -np 3 after --start-timeout 2 s: the job cannot start"
  [[ ! -e $WORK/started ]] || fail "a failed first discovery started the command"
  # Slots that come while the job waits to start: -np of them start it.
  printf '#!/bin/sh\nif [ -e %s ]; then echo localhost:2; else touch %s; echo localhost:1; fi\n' \
    "$WORK/once" "$WORK/once" >"$WORK/grow.sh"
  chmod +x "$WORK/grow.sh"
  "$RINGRUN" -np 2 --discovery-interval 1 --host-discovery-script "$WORK/grow.sh" \
    "$worker" 200 >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 0 $rc "slots that came before the start: $(tail -5 "$WORK/err")"
  expect_contains "$WORK/err" "lists 1 slots, fewer than -np 2: waiting for more"
  for w in 0 1; do expect_contains "$WORK/out" "[$w]<stdout>:done steps=200 size=2"; done
  # At the start timeout, --min-np slots start the job.
  "$RINGRUN" -np 3 --min-np 2 --start-timeout 2 --discovery-interval 1 \
    --host-discovery-script 'echo localhost:2' "$worker" 200 >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 0 $rc "--min-np slots at the start timeout: $(tail -5 "$WORK/err")"
  expect_contains "$WORK/err" "2 slots after --start-timeout 2 s: the job starts with them (--min-np 2)"
  for w in 0 1; do expect_contains "$WORK/out" "[$w]<stdout>:done steps=200 size=2"; done
  expect_no_orphans
  # Later runs that fail, or hang past --discovery-timeout: said once each, the job goes on.
  printf '#!/bin/sh\nif [ -e %s ]; then echo no inventory >&2; exit 3; fi\ntouch %s\necho localhost:2\n' \
    "$WORK/ran" "$WORK/ran" >"$WORK/flaky.sh"
  chmod +x "$WORK/flaky.sh"
  "$RINGRUN" -np 2 --min-np 1 --host-discovery-script "$WORK/flaky.sh" "$worker" 2500 \
    >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 0 $rc "a script failing after the start: $(tail -5 "$WORK/err")"
  [[ $(grep -c "host discovery failed" "$WORK/err") == 1 ]] || fail "not said once: $(cat "$WORK/err")"
  expect_contains "$WORK/err" "host discovery failed, the job goes on with the hosts it has"
  expect_contains "$WORK/err" "exited with code 3; its stderr ends:"
  for w in 0 1; do expect_contains "$WORK/out" "[$w]<stdout>:done steps=2500 size=2"; done
  expect_no_orphans
  printf '#!/bin/sh\nif [ -e %s ]; then sleep 30; fi\ntouch %s\necho localhost:2\n' \
    "$WORK/ran2" "$WORK/ran2" >"$WORK/hang.sh"
  chmod +x "$WORK/hang.sh"
  "$RINGRUN" -np 2 --min-np 1 --host-discovery-script "$WORK/hang.sh" --discovery-timeout 1 \
    "$worker" 2500 >"$WORK/out" 2>"$WORK/err"; rc=$?
  expect_rc 0 $rc "a script hanging after the start: $(tail -5 "$WORK/err")"
  [[ $(grep -c "host discovery failed" "$WORK/err") == 1 ]] || fail "not said once: $(cat "$WORK/err")"
  expect_contains "$WORK/err" "no exit within 1000 ms; killed it (its process group)"
  for w in 0 1; do expect_contains "$WORK/out" "[$w]<stdout>:done steps=2500 size=2"; done
  expect_no_orphans
}

name=${1:?test name}
"t_$name"
pass "$name"
