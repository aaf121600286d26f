#!/usr/bin/env bash
# Autotune (HOROVOD_AUTOTUNE=1) against fixed settings, np=2 on one host: the steady-state step
# after tuning has ended, against the defaults and a few other fixed settings.
#   benchmarks/autotune.sh [BUILD_DIR]    env: ROUNDS (5), CASES ("grad mlp deep"),
#                                         SETTINGS (all of those below), STEPS (30),
#                                         AT_WARMUP (1), AT_STEPS (2), AT_MAX (10)
# Cases: grad = grad_step_bench's engine step of ResNet-50's gradients (GRAD_STEP_ONLY=engine);
# mlp, deep = torch_train.py. Each run is a fresh job; a round runs every case under every
# setting in turn (starting one further each round), so the settings alternate under the same
# load. The autotuned runs first train untimed until tuning has ended (with AT_*:
# (AT_WARMUP + AT_MAX) trials of 5 samples of AT_STEPS steps, plus one step each), and so do
# the fixed ones, for the same number of steps.
# Prints each run (round case setting step_ms), then the median step_ms per case and setting,
# and the settings that autotune chose (the last line of each of its logs).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
rounds=${ROUNDS:-5} steps=${STEPS:-30}
cases=${CASES:-grad mlp deep}
settings=${SETTINGS:-default fusion4 fusion1 burst0 burst32 autotune}
at_warmup=${AT_WARMUP:-1} at_steps=${AT_STEPS:-2} at_max=${AT_MAX:-10}
warm=$(((at_warmup + at_max) * (5 * at_steps + 1) + 10))
export PYTHONPATH=$build/python
work=$(mktemp -d /tmp/ringrun-autotune-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
source "$here/lib.sh"

# The launcher's -x flags of a setting.
flags() {
  case $1 in
  default) ;;
  fusion4) echo "-x RINGRUN_FUSION_THRESHOLD=4194304" ;;
  fusion1) echo "-x RINGRUN_FUSION_THRESHOLD=1048576" ;;
  burst0) echo "-x RINGRUN_BURST_QUIET_US=0" ;;
  burst32) echo "-x RINGRUN_BURST_QUIET_US=32" ;;
  autotune)
    echo "-x HOROVOD_AUTOTUNE=1 -x HOROVOD_AUTOTUNE_LOG=$work/$2.$3.csv" \
      "-x HOROVOD_AUTOTUNE_WARMUP_SAMPLES=$at_warmup -x HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE=$at_steps" \
      "-x HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=$at_max" ;;
  *) echo "unknown setting $1" >&2; exit 2 ;;
  esac
}

runs=$work/runs
for ((round = 1; round <= rounds; round++)); do
  # The settings in turn, starting one further each round: none always runs first or last.
  read -ra order <<<"$settings"
  shift_by=$(((round - 1) % ${#order[@]}))
  order=("${order[@]:shift_by}" "${order[@]:0:shift_by}")
  for c in $cases; do
    for s in "${order[@]}"; do
      # shellcheck disable=SC2046
      if [[ $c == grad ]]; then
        ms=$("$build/bin/ringrun" -np 2 -x GRAD_STEP_ONLY=engine $(flags "$s" "$c" "$round") \
               "$build/bin/grad_step_bench" --model "$here/models/resnet50.txt" --rounds "$steps" \
               --small-reps 1 --warm-steps "$warm" 2>/dev/null | sed 's/^\[[0-9]*\]<stdout>://' |
             awk '$1 == "engine" { print $2 }')
      else
        ms=$("$build/bin/ringrun" -np 2 -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1 \
               $(flags "$s" "$c" "$round") /usr/bin/python3 "$here/torch_train.py" "$c" "$steps" 32 \
               "$warm" 2>/dev/null | field step_ms)
      fi
      echo "$round $c $s ${ms:-0} load=$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$runs" >&2
    done
  done
done

echo "| case | $(tr ' ' '\n' <<<"$settings" | paste -sd'|' | sed 's/|/ | /g') |"
echo "|$(for s in $settings case; do printf ' --- |'; done)"
for c in $cases; do
  row="| $c |"
  for s in $settings; do
    row+=" $(awk -v c="$c" -v s="$s" '$2 == c && $3 == s { print $4 }' "$runs" | median) |"
  done
  echo "$row"
done
echo "median step_ms over $rounds rounds; autotune's choices (hierarchical,allgather,torus,cache,cycle_ms,fusion_MiB,score):"
for f in "$work"/*.csv; do
  [[ -e $f ]] && echo "  $(basename "$f" .csv): $(tail -1 "$f")"
done
