#!/usr/bin/env bash
# The Python package's tests under real ringrun processes (CTest label `python`).
# Usage: BIN=build/bin PYDIR=build/python run.sh NAME [NP]
#   pytest FILE NP   run tests/python/FILE.py with pytest on every rank of `ringrun -np NP`
#   unit FILE...     run tests/python/FILE.py ... with pytest, without ringrun (no job)
#   interrupt        Ctrl-C (SIGINT) during a collective's wait raises KeyboardInterrupt at once,
#                    and the rank can go on (the abandoned collective keeps its buffers)
#   late_peer        a peer later than RINGRUN_TIMEOUT_MS is waited for
#   rank_raises      a rank raising mid-training ends the job with its exit code and traceback
#   example          examples/pytorch at np=2 for a few batches, then resumed from its checkpoint
#   restarts         examples/pytorch/restart_from_checkpoint.py under --max-restarts: a failure,
#                    a restart from the checkpoint, and the final loss of a run without failures
#   install          cmake --install, then import ringrun.torch from a new shell, system-wide
#                    and in a --system-site-packages venv
#   torchrun         torchrun --nproc_per_node 2 (static and c10d rendezvous): ringrun.torch
#                    joins through torch's store, checks the shape, allreduces
#   torchrun_kill    under torchrun, rank 1 is killed after the join: rank 0 fails naming it
#   torchrun_nodes   torchrun --nnodes 2 --nproc_per_node 2, both nodes on this host: one host of
#                    4 ranks to ringrun, with a warning that torchrun's LOCAL_RANK differs
#   mpirun           mpirun -np 4 (Open MPI, joined through PMIx): ringrun.torch checks the
#                    shape against OMPI_COMM_WORLD_*, allreduces, and logs that it used PMIx
#   timeline_file    ringrun -np 2 --timeline-filename t.json: the launcher writes t.json, JSON
#                    holding both ranks' events (their execution spans too) under pids 0 and 1;
#                    no rank writes t.<r>.json; stop_timeline, then start_timeline(t.json),
#                    goes back into it
#   refuse_size1     torchrun's variables of a job of 2 without a reachable store: init() fails
#                    naming torchrun and the variables, within the join timeout
#   elastic_example  examples/elastic/pytorch_synthetic_elastic.py at np=2 (no failure): its
#                    final parameters equal those of --reference (one process, plain torch)
#                    within 1e-12, and the run never reset
#   elastic_example_kill  the example under ringrun -np 4 --min-np 2 on two "hosts", worker 3
#                    killed at step 23: one reset to 2 ranks, the survivors in their own
#                    processes finish the 5 epochs from the last commit, and the final
#                    parameters equal --reference's within 1e-12
#   elastic_example_grow  the example with a discovery script (cat of a file) that lists
#                    localhost:2, then 127.0.0.1:2 as well: workers 2 and 3 start, and once
#                    they wait to join, workers 0 and 1 get HostsUpdatedInterrupt at a commit
#                    and go on as 2 of 4 ranks; the final parameters equal --reference's
#                    within 1e-12; prints the survivors' pause (the longest gap between two
#                    of rank 0's steps around the change, less the step time)
#   elastic_example_shrink  the same from both hosts to localhost:2 alone: workers 2 and 3
#                    leave, workers 0 and 1 finish as 2 ranks, the final parameters equal
#                    --reference's within 1e-12; prints the pause the same way
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${BIN:?BIN=build/bin}" "${PYDIR:?PYDIR=build/python}"
PY=/usr/bin/python3
export PYTHONPATH=$PYDIR PYTHONDONTWRITEBYTECODE=1 RINGRUN_TIMEOUT_MS=${RINGRUN_TIMEOUT_MS:-20000}
WORK=$(mktemp -d /tmp/ringrun-python-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
$PY -c 'import torch, pytest, numpy' 2>/dev/null || { echo "needs Debian's python3-torch, python3-pytest, python3-numpy"; exit 77; }

case "$1" in
pytest)
  file=$2 np=$3
  timeout 240 "$BIN/ringrun" -np "$np" $PY -m pytest -q -p no:cacheprovider -o "cache_dir=$WORK" \
    "$here/$file.py" ;;
unit)
  shift
  files=()
  for f in "$@"; do files+=("$here/$f.py"); done
  timeout 120 $PY -m pytest -q -p no:cacheprovider -o "cache_dir=$WORK" "${files[@]}" ;;
interrupt)
  out=$(timeout 60 "$BIN/ringrun" -np 2 $PY "$here/interrupt_wait.py" 2>&1) || fail "$out"
  secs=$(grep -o 'interrupted after [0-9.]*' <<<"$out" | awk '{print $3}')
  [[ -n $secs ]] || fail "no KeyboardInterrupt: $out"
  awk -v s="$secs" 'BEGIN { exit !(s < 2.0) }' || fail "KeyboardInterrupt came after $secs s"
  grep -q 'went on: \[6.0, 6.0, 6.0, 6.0\]' <<<"$out" || fail "rank 0 did not go on: $out"
  echo "interrupted after $secs s, then went on" ;;
timeline_file)
  timeout 120 "$BIN/ringrun" -np 2 --timeline-filename "$WORK/t.json" $PY -c '
import os, torch, ringrun.torch as hvd
hvd.init()
for i in range(3):
    hvd.allreduce(torch.ones(4), name=f"tl.step{i}")
hvd.broadcast(torch.ones(2), 0, name="tl.bcast")
# Stopped, then started again by the name the launcher writes: back into the launcher'"'"'s file.
hvd.stop_timeline()
hvd.allreduce(torch.ones(4), name="tl.off")
hvd.start_timeline(os.environ["HOROVOD_TIMELINE"])
hvd.allreduce(torch.ones(4), name="tl.again")
' >"$WORK/out" 2>&1 || fail "$(cat "$WORK/out")"
  [[ ! -e $WORK/t.1.json && ! -e $WORK/t.0.json ]] || fail "a rank wrote a file of its own: $(ls "$WORK")"
  $PY - "$WORK/t.json" <<'PY' || fail "t.json: $(head -c 800 "$WORK/t.json")"
import json, sys
text = open(sys.argv[1]).read()
events = json.loads(text if text.rstrip().endswith("]") else text.rstrip().rstrip(",") + "]")
for rank in (0, 1):
    mine = [e for e in events if e.get("pid") == rank]
    names = {e["name"] for e in mine}
    assert {"process_name", "NEGOTIATE", "ALLREDUCE", "BROADCAST"} <= names, (rank, names)
    tensors = {e["args"]["tensor"] for e in mine if e["name"] == "ALLREDUCE"}
    assert {"tl.step0", "tl.step1", "tl.step2", "tl.again"} <= tensors, (rank, tensors)
    assert "tl.off" not in tensors, tensors
print(len(events), "events from ranks", sorted({e["pid"] for e in events}))
PY
  ;;
late_peer)
  # RINGRUN_TIMEOUT_MS below the peer's lateness: waits with the engine are not bounded by it.
  out=$(RINGRUN_TIMEOUT_MS=500 timeout 60 "$BIN/ringrun" -np 2 $PY "$here/late_peer.py" 2>&1) || fail "$out"
  [[ $(grep -c 'rank 0 waited' <<<"$out") == 2 ]] || fail "$out"
  echo "$out" ;;
rank_raises)
  start=$(date +%s)
  timeout 60 "$BIN/ringrun" -np 2 $PY "$here/raise_mid_training.py" >"$WORK/out" 2>&1
  rc=$?
  secs=$(($(date +%s) - start))
  cat "$WORK/out"
  [[ $rc == 1 ]] || fail "exit code $rc, expected rank 1's 1"
  # Rank 0 fails too (its peer is gone), so the launcher may report either rank first; rank 1's
  # traceback must be there.
  grep -q '^\[1\]<stderr>:RuntimeError: boom at step 3 on rank 1' "$WORK/out" || fail "no traceback of rank 1"
  grep -q 'exited with code 1' "$WORK/out" || fail "the launcher did not report the exit code"
  ((secs < 30)) || fail "took $secs s (a rank hung)" ;;
elastic)
  # An elastic job (--min-np) from Python: worker 2 of 4 is killed, its host (127.0.0.1) is
  # left out, and workers 0 and 1 go on as ranks 0 and 1 of 2 after shutdown() and init().
  timeout 60 "$BIN/ringrun" -np 4 --min-np 2 -H localhost:2,127.0.0.1:2 $PY \
    "$here/elastic_rejoin.py" >"$WORK/out" 2>&1
  rc=$?
  cat "$WORK/out"
  [[ $rc == 0 ]] || fail "exit code $rc"
  grep -q 'generation 2: 2 ranks (was 4), reset 1' "$WORK/out" || fail "no reset line"
  for w in 0 1; do
    grep -q "^\[$w\]<stdout>:error: .*rank [23] on host 127\.0\.0\.1" "$WORK/out" ||
      fail "worker $w's error does not name the failed rank and host"
    grep -q "^\[$w\]<stdout>:rejoined $w 2 $w 1 0\$" "$WORK/out" || fail "worker $w did not rejoin"
    grep -q "^\[$w\]<stdout>:done $w 2 " "$WORK/out" || fail "worker $w did not finish"
  done ;;
example)
  [[ -d /usr/share/datasets/fashion-mnist ]] || { echo "needs dataset-fashion-mnist"; exit 77; }
  ex=$here/../../examples/pytorch/train_fashion_mnist.py
  timeout 200 "$BIN/ringrun" -np 2 $PY "$ex" --epochs 2 --max-batches 40 \
    --checkpoint "$WORK/ckpt" >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "example"; }
  cat "$WORK/out"
  acc=$(grep -o 'test_accuracy=[0-9.]*' "$WORK/out" | cut -d= -f2)
  [[ -n $acc && -f $WORK/ckpt ]] || fail "no test_accuracy or checkpoint"
  awk -v a="$acc" 'BEGIN { exit !(a > 0.5) }' || fail "accuracy $acc after 80 batches"
  [[ $(grep -c 'test_accuracy=' "$WORK/out") == 1 ]] || fail "test_accuracy printed by more than rank 0"
  timeout 200 "$BIN/ringrun" -np 2 $PY "$ex" --epochs 2 --max-batches 40 \
    --checkpoint "$WORK/ckpt" >"$WORK/out2" 2>&1 || { cat "$WORK/out2"; fail "resume"; }
  cat "$WORK/out2"
  grep -q 'resuming from .* after epoch 2' "$WORK/out2" || fail "did not resume"
  grep -q "test_accuracy=$acc" "$WORK/out2" || fail "resumed model differs: $(grep test_accuracy "$WORK/out2")" ;;
restarts)
  # examples/pytorch/restart_from_checkpoint.py under --max-restarts 2: rank 1 exits at step 25
  # of the first attempt; the second resumes from the step-20 checkpoint and ends with the final
  # loss of a run without failures, bit for bit.
  ex=$here/../../examples/pytorch/restart_from_checkpoint.py
  timeout 120 "$BIN/ringrun" -np 2 --max-restarts 2 $PY "$ex" --checkpoint "$WORK/ckpt" \
    --fail-at 25 >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "the restarted job"; }
  cat "$WORK/out"
  # Rank 0 may fail first, its allreduce failing on rank 1's loss: either is the first failure.
  grep -q 'restarting the job (attempt 2 of 3) after rank [01] on host localhost exited with code 1' \
    "$WORK/out" || fail "no restart line"
  grep -q 'attempt 1: starting at step 20' "$WORK/out" || fail "did not resume at step 20"
  timeout 120 "$BIN/ringrun" -np 2 $PY "$ex" --checkpoint "$WORK/ckpt2" >"$WORK/out2" 2>&1 ||
    { cat "$WORK/out2"; fail "the job without failures"; }
  want=$(grep -o 'final loss=.*' "$WORK/out2")
  [[ -n $want ]] || fail "no final loss: $(cat "$WORK/out2")"
  grep -qF "$want" "$WORK/out" || fail "after the restart: $(grep 'final loss' "$WORK/out"), without: $want" ;;
install)
  build=$(cd "$BIN/.." && pwd)
  prefix=$WORK/prefix
  cmake --install "$build" --prefix "$prefix" >"$WORK/install.log" 2>&1 || { cat "$WORK/install.log"; fail "cmake --install"; }
  site=$(find "$prefix" -type d -name dist-packages | head -1)
  [[ -f $site/ringrun/torch/__init__.py ]] || fail "package not installed under $prefix"
  grep -q "$prefix" "$site/ringrun/_config.py" || fail "_config.py does not name the installed library"
  (cd / && env -i PATH=/usr/bin:/bin PYTHONPATH="$site" $PY -c 'import ringrun.torch, ringrun; print(ringrun._lib.library_path)') \
    >"$WORK/import" 2>&1 || { cat "$WORK/import"; fail "import from the installed prefix"; }
  grep -q "^$prefix" "$WORK/import" || fail "imported the wrong library: $(cat "$WORK/import")"
  # DESTDIR (packaging): everything lands under it, _config.py naming the final path.
  DESTDIR=$WORK/dest cmake --install "$build" --prefix "$WORK/final" >/dev/null 2>&1 || fail "DESTDIR install"
  cfg=$(find "$WORK/dest" -path '*/ringrun/_config.py' | head -1)
  [[ -n $cfg ]] && grep -q "\"$WORK/final/" "$cfg" || fail "DESTDIR: _config.py missing or wrong"
  [[ ! -e $WORK/final ]] || fail "DESTDIR install wrote outside DESTDIR"
  # A virtual environment made with --system-site-packages, as docs/python.md says.
  $PY -m venv --system-site-packages "$WORK/venv" || fail "venv"
  vsite=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  RINGRUN_PYTHON_SITE=$vsite cmake --install "$build" --prefix "$prefix" --component python \
    >"$WORK/install2.log" 2>&1 || { cat "$WORK/install2.log"; fail "cmake --install into the venv"; }
  (cd / && env -i PATH=/usr/bin:/bin "$WORK/venv/bin/python" -c 'import ringrun.torch as hvd; hvd.init(); print(hvd.size())') \
    >"$WORK/venv.out" 2>&1 || { cat "$WORK/venv.out"; fail "import in the venv"; }
  [[ $(cat "$WORK/venv.out") == 1 ]] || fail "venv: $(cat "$WORK/venv.out")"
  # ... and a job: ringrun -np 2 with the venv's interpreter.
  (cd / && env -i PATH=/usr/bin:/bin "$BIN/ringrun" -np 2 "$WORK/venv/bin/python" -c \
    'import ringrun.torch as hvd, torch; hvd.init(); print(hvd.allreduce(torch.ones(1), op=hvd.Sum).item())') \
    >"$WORK/job.out" 2>&1 || { cat "$WORK/job.out"; fail "job with the venv"; }
  [[ $(grep -c ':2.0$' "$WORK/job.out") == 2 ]] || fail "venv job: $(cat "$WORK/job.out")"
  echo "installed and imported: $site, $vsite" ;;
torchrun|torchrun_kill|torchrun_nodes)
  # Debian's torchrun (torch 1.13, Python 3.11) fails at start without --redirects 1 --tee 1.
  if command -v torchrun >/dev/null; then tr=(torchrun); else tr=($PY -m torch.distributed.run); fi
  port=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  job=$here/torchrun_job.py
  if [[ $1 == torchrun_kill ]]; then
    timeout 120 "${tr[@]}" --nproc_per_node 2 --redirects 1 --tee 1 --master_addr 127.0.0.1 \
      --master_port "$port" "$job" kill >"$WORK/out" 2>&1
    rc=$?
    cat "$WORK/out"
    [[ $rc != 0 && $rc != 124 ]] || fail "torchrun exited $rc"
    grep -q 'rank 0 failed: .*rank 1' "$WORK/out" || fail "rank 0 did not fail naming rank 1"
    exit 0
  fi
  if [[ $1 == torchrun_nodes ]]; then
    for node in 0 1; do
      timeout 120 "${tr[@]}" --nnodes 2 --node_rank $node --nproc_per_node 2 --redirects 1 --tee 1 \
        --master_addr 127.0.0.1 --master_port "$port" "$job" nodes >"$WORK/out$node" 2>&1 &
    done
    wait %1; rc0=$?
    wait %2; rc1=$?
    cat "$WORK/out0" "$WORK/out1"
    ((rc0 == 0 && rc1 == 0)) || fail "torchrun nodes exited $rc0 and $rc1"
    [[ $(cat "$WORK/out0" "$WORK/out1" | grep -c 'of 4: local [0-3] of 4, allreduce 10.0') == 4 ]] || fail "every rank must allreduce"
    [[ $(cat "$WORK/out0" "$WORK/out1" | grep -c 'several torchrun nodes run on this host') == 4 ]] || fail "no warning"
    exit 0
  fi
  for rdzv in static c10d; do
    args=(--master_addr 127.0.0.1 --master_port "$port")
    [[ $rdzv == c10d ]] && args=(--rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$port" --rdzv_id "ringrun-test-$$")
    timeout 120 "${tr[@]}" --nproc_per_node 2 --redirects 1 --tee 1 "${args[@]}" "$job" \
      >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "torchrun ($rdzv)"; }
    cat "$WORK/out"
    [[ $(grep -c 'of 2: local [01] of 2, allreduce 3.0' "$WORK/out") == 2 ]] || fail "torchrun ($rdzv): both ranks must allreduce"
    [[ $(grep -c "found its peers through torchrun's store" "$WORK/out") == 2 ]] || fail "torchrun ($rdzv): no log of the source"
  done ;;
mpirun)
  command -v mpirun >/dev/null || { echo "needs openmpi-bin"; exit 77; }
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np 4 $PY -c '
import os, torch
import ringrun.torch as hvd
hvd.init()
env = [int(os.environ["OMPI_COMM_WORLD_" + k]) for k in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE")]
shape = [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()]
assert shape == env, (shape, env)
total = hvd.allreduce(torch.full((1000,), float(hvd.rank() + 1)), op=hvd.Sum, name="ranks")
assert total.eq(10).all(), total[:4]
print(f"rank {hvd.rank()} of {hvd.size()}: local {hvd.local_rank()} of {hvd.local_size()}, "
      f"allreduce {total[0].item()}", flush=True)
hvd.shutdown()' >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "mpirun"; }
  cat "$WORK/out"
  # Counted as matches, not lines: mpirun's output forwarding can put two ranks' lines on one.
  [[ $(grep -o 'of 4: local [0-3] of 4, allreduce 10.0' "$WORK/out" | wc -l) == 4 ]] || fail "every rank must allreduce"
  [[ $(grep -o "found its peers through PMIx (mpirun (Open MPI)" "$WORK/out" | wc -l) == 4 ]] || fail "no log of the source" ;;
refuse_size1)
  closed=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  try() {  # try LABEL EXPECTED VAR=VALUE...: init() must fail within 20 s with EXPECTED in its message
    local label=$1 expected=$2 start out
    shift 2
    start=$(date +%s)
    out=$(env -u RINGRUN_RANK -u RINGRUN_SIZE RINGRUN_JOIN_TIMEOUT_MS=2000 "$@" timeout 60 $PY -c \
      'import ringrun
try:
    ringrun.init()
except ringrun.RingrunError as e:
    print(e); raise SystemExit(3)
print("size", ringrun.size())' 2>&1)
    rc=$?
    [[ $rc == 3 ]] || fail "$label: exit $rc: $out"
    grep -qF -- "$expected" <<<"$out" || fail "$label: '$expected' not in: $out"
    (($(date +%s) - start < 20)) || fail "$label: took $(($(date +%s) - start)) s"
    echo "$label: $out"
  }
  try "no MASTER_ADDR" "started by torchrun (torch's env:// contract) (WORLD_SIZE=2 RANK=0)" WORLD_SIZE=2 RANK=0
  try "no store at MASTER_ADDR:MASTER_PORT" "torch's store at 127.0.0.1:$closed (torchrun: RANK=1 WORLD_SIZE=2) could not be joined" \
    WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$closed
  try "rank 0 alone" "rank 0: rank 1 (of 2) did not join within the join timeout" \
    WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$closed
  try "mpirun" "started by mpirun (Open MPI) (OMPI_COMM_WORLD_SIZE=4" OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=1
  out=$(env -u RINGRUN_RANK -u RINGRUN_SIZE WORLD_SIZE=1 RANK=0 $PY -c 'import ringrun; ringrun.init(); print("size", ringrun.size())') || fail "single: $out"
  [[ $out == "size 1" ]] || fail "a single process: $out" ;;
elastic_example | elastic_example_kill)
  ex_dir=$here/../../examples/elastic
  ex=$ex_dir/pytorch_synthetic_elastic.py
  if [[ $1 == elastic_example ]]; then
    timeout 120 "$BIN/ringrun" -np 2 $PY "$ex" >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "np=2"; }
  else
    timeout 120 "$BIN/ringrun" -np 4 --min-np 2 -H localhost:2,127.0.0.1:2 $PY "$ex" \
      --kill-worker 3 --kill-at 23 >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "np=4, worker 3 killed"; }
  fi
  timeout 120 $PY "$ex" --reference >"$WORK/ref" 2>&1 || { cat "$WORK/ref"; fail "--reference"; }
  cat "$WORK/out" "$WORK/ref"
  if [[ $1 == elastic_example ]]; then
    grep -q 'epoch 5 done on 2 ranks' "$WORK/out" || fail "the job did not train 5 epochs on 2 ranks"
    ! grep -q 'reset:' "$WORK/out" || fail "the job reset without a failure"
  else
    grep -q 'epoch 1 done on 4 ranks' "$WORK/out" || fail "the first epoch did not run on 4 ranks"
    grep -q 'generation 2: 2 ranks (was 4), reset 1' "$WORK/out" || fail "no reset line from ringrun"
    [[ $(grep -c 'reset: 2 ranks' "$WORK/out") == 1 ]] || fail "not one reset to 2 ranks"
    grep -q 'epoch 5 done on 2 ranks' "$WORK/out" || fail "the job did not finish on 2 ranks"
    ! grep -q '^\[[23]\]<stdout>:' "$WORK/out" || fail "workers 2 and 3 printed (only rank 0 logs)"
  fi
  [[ $(grep -c 'final loss=' "$WORK/out") == 1 ]] || fail "not one final line (rank 0's)"
  d=$($PY "$ex_dir/compare_final.py" "$WORK/out" "$WORK/ref") || fail "the job and --reference differ: $d"
  echo "the job against --reference: max abs difference $d"
  ;;
elastic_example_grow | elastic_example_shrink)
  ex_dir=$here/../../examples/elastic
  ex=$ex_dir/pytorch_synthetic_elastic.py
  args=(--epochs 8 --step-delay 0.2 --log-steps)
  # The hosts file is replaced whole (mv), so that a run of the script never reads half of it.
  write_hosts() { printf '%s\n' "$@" >"$WORK/hosts.new" && mv "$WORK/hosts.new" "$WORK/hosts"; }
  if [[ $1 == elastic_example_grow ]]; then
    write_hosts localhost:2
    flags=(-np 2 --max-np 4) from=2 to=4
  else
    write_hosts localhost:2 127.0.0.1:2
    flags=(-np 4 --min-np 2) from=4 to=2
  fi
  timeout 150 "$BIN/ringrun" "${flags[@]}" --host-discovery-script "cat $WORK/hosts" \
    $PY "$ex" "${args[@]}" >"$WORK/out" 2>&1 &
  pid=$!
  end=$((SECONDS + 60))
  until grep -q "^\[0\]<stdout>:step 10 " "$WORK/out"; do
    (( SECONDS < end )) && kill -0 $pid 2>/dev/null || { cat "$WORK/out"; fail "the job did not reach step 10"; }
    sleep 0.2
  done
  if [[ $1 == elastic_example_grow ]]; then write_hosts localhost:2 127.0.0.1:2; else write_hosts localhost:2; fi
  wait $pid || { cat "$WORK/out"; fail "the job failed"; }
  timeout 120 $PY "$ex" --reference --epochs 8 >"$WORK/ref" 2>&1 || { cat "$WORK/ref"; fail "--reference"; }
  grep -v '<stdout>:step ' "$WORK/out"; cat "$WORK/ref"
  grep -q "generation 2: $to ranks (was $from), reset 1" "$WORK/out" || fail "no change to $to ranks"
  [[ $(grep -c "reset: $to ranks" "$WORK/out") == 1 ]] || fail "not one reset to $to ranks"
  grep -q "epoch 8 done on $to ranks" "$WORK/out" || fail "the job did not finish on $to ranks"
  [[ $(grep -c 'final loss=' "$WORK/out") == 1 ]] || fail "not one final line (rank 0's)"
  d=$($PY "$ex_dir/compare_final.py" "$WORK/out" "$WORK/ref") || fail "the job and --reference differ: $d"
  echo "the job against --reference: max abs difference $d"
  # Rank 0's steps run once each (no failure sent it back to a commit: the change was a clean
  # interrupt). The survivors' pause: the gap between rank 0's last step at the old size and
  # its first at the new one, less the median gap between two steps.
  $PY - "$WORK/out" "$from" "$to" <<'PYEOF' || fail "a step ran twice, or no step at each size"
import re, statistics, sys
steps = [(int(m[1]), int(m[2]), float(m[3])) for m in
         re.finditer(r"^\[0\]<stdout>:step (\d+) size=(\d+) t=([0-9.]+)$", open(sys.argv[1]).read(), re.M)]
frm, to = int(sys.argv[2]), int(sys.argv[3])
gaps = [b[2] - a[2] for a, b in zip(steps, steps[1:]) if a[1] == b[1]]
change = [b[2] - a[2] for a, b in zip(steps, steps[1:]) if a[1] == frm and b[1] == to]
if [n for n, _, _ in steps] != list(range(1, len(steps) + 1)) or not change or not gaps:
    sys.exit(1)
step = statistics.median(gaps)
print(f"pause: {change[0] - step:.3f} s (gap {change[0]:.3f} s across the change, a step {step:.3f} s)")
PYEOF
  ;;
*)
  sed -n '2,/^set /p' "$0" | sed '$d'; exit 2 ;;
esac
