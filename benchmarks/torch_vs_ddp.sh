#!/usr/bin/env bash
# Training throughput of ringrun.torch.DistributedOptimizer against torch DDP (gloo) on the same
# models, batch and threads (one OpenMP and one BLAS thread per rank, as the anchor sets).
# The two alternate in rounds; the table gives the median samples/s over rounds.
#   benchmarks/torch_vs_ddp.sh [BUILD_DIR]     env: ROUNDS (5), STEPS (30), BATCH (32),
#                                              MODELS ("mlp deep convnet"), NPS ("1 2"),
#                                              BIND (none|core: ringrun's --bind-to; default none)
# The anchor is /work/shared/anchors/run.sh train NP MODEL STEPS BATCH (torch_ddp_train.py),
# ANCHORS=DIR to use another copy.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
anchors=${ANCHORS:-/work/shared/anchors}
rounds=${ROUNDS:-5} steps=${STEPS:-30} batch=${BATCH:-32}
models=${MODELS:-mlp deep convnet} nps=${NPS:-1 2} bind=${BIND:-none}
export PYTHONPATH=$build/python
out=$(mktemp /tmp/ringrun-torch-bench.XXXXXX)
trap 'rm -f "$out"' EXIT

source "$here/lib.sh"
for ((round = 1; round <= rounds; round++)); do
  for model in $models; do
    for np in $nps; do
      ddp=$("$anchors/run.sh" train "$np" "$model" "$steps" "$batch" | field samples_per_s)
      rr=$("$build/bin/ringrun" -np "$np" --bind-to "$bind" -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 \
             /usr/bin/python3 "$here/torch_train.py" "$model" "$steps" "$batch" 2>/dev/null |
           field samples_per_s)
      echo "$round $model $np ${ddp:-0} ${rr:-0}" | tee -a "$out" >&2
    done
  done
done

# ringrun / DDP both ways: the ratio of the two medians, and the median of each round's ratio
# (the two runs of a round are a minute apart, so the latter follows a changing load better).
echo "| model | np | DDP samples/s | ringrun samples/s | ringrun / DDP | per-round ratio (median) | ringrun np=N / np=1 |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for model in $models; do
  base=""
  for np in $nps; do
    d=$(awk -v m="$model" -v n="$np" '$2 == m && $3 == n { print $4 }' "$out" | median)
    r=$(awk -v m="$model" -v n="$np" '$2 == m && $3 == n { print $5 }' "$out" | median)
    q=$(awk -v m="$model" -v n="$np" '$2 == m && $3 == n && $4 > 0 { print $5 / $4 }' "$out" | median)
    [[ -z $base ]] && base=$r
    awk -v m="$model" -v n="$np" -v d="$d" -v r="$r" -v b="$base" -v q="$q" 'BEGIN {
      printf "| %s | %d | %.1f | %.1f | %.2fx | %.2fx | %.2fx |\n", m, n, d, r, (d > 0 ? r / d : 0), q, (b > 0 ? r / b : 0) }'
  done
done
