#!/usr/bin/env bash
# ringrun.torch training throughput under ringrun and under torchrun, and torch DDP (gloo) under
# torchrun, on the same models, batch and threads (one OpenMP and one BLAS thread per rank).
# The three alternate in rounds; the table gives the median samples/s over rounds.
#   benchmarks/torch_launchers.sh [BUILD_DIR]   env: ROUNDS (5), STEPS (30), BATCH (32),
#                                               MODELS ("mlp deep"), NP (2)
# DDP is the anchor's torch_ddp_train.py (ANCHORS=DIR, default /work/shared/anchors).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
anchors=${ANCHORS:-/work/shared/anchors}
rounds=${ROUNDS:-5} steps=${STEPS:-30} batch=${BATCH:-32} models=${MODELS:-mlp deep} np=${NP:-2}
export PYTHONPATH=$build/python OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
out=$(mktemp /tmp/ringrun-torch-launchers.XXXXXX)
trap 'rm -f "$out"' EXIT

source "$here/lib.sh"
port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# Debian's torchrun (torch 1.13, Python 3.11) fails at start without --redirects 1 --tee 1.
torchrun() {
  /usr/bin/python3 -m torch.distributed.run --nproc_per_node "$np" --redirects 1 --tee 1 \
    --master_addr 127.0.0.1 --master_port "$(port)" "$@" 2>/dev/null
}
for ((round = 1; round <= rounds; round++)); do
  for model in $models; do
    a=$("$build/bin/ringrun" -np "$np" /usr/bin/python3 "$here/torch_train.py" "$model" "$steps" \
          "$batch" 2>/dev/null | field samples_per_s)
    b=$(torchrun "$here/torch_train.py" "$model" "$steps" "$batch" | field samples_per_s)
    c=$(torchrun "$anchors/torch_ddp_train.py" "$model" "$steps" "$batch" | field samples_per_s)
    echo "$round $model ${a:-0} ${b:-0} ${c:-0}" | tee -a "$out" >&2
  done
done

# Ratios of the medians, and in brackets the median of each round's ratio (the runs of a round
# are close in time, so it follows a changing load better).
echo "| model | np | ringrun.torch under ringrun | ringrun.torch under torchrun | DDP under torchrun | torchrun / ringrun | ringrun.torch / DDP (torchrun) |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for model in $models; do
  col() { awk -v m="$model" -v k="$1" '$2 == m { print $k }' "$out" | median; }
  ratio() { awk -v m="$model" -v x="$1" -v y="$2" '$2 == m && $y > 0 { print $x / $y }' "$out" | median; }
  a=$(col 3) b=$(col 4) c=$(col 5) ba=$(ratio 4 3) bc=$(ratio 4 5)
  awk -v m="$model" -v n="$np" -v a="$a" -v b="$b" -v c="$c" -v ba="$ba" -v bc="$bc" 'BEGIN {
    printf "| %s | %d | %.1f | %.1f | %.1f | %.2fx (%.2fx) | %.2fx (%.2fx) |\n", m, n, a, b, c,
      (a > 0 ? b / a : 0), ba, (c > 0 ? b / c : 0), bc }'
done
