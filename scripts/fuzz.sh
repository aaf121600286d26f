#!/usr/bin/env bash
# Runs each libFuzzer target for a while (docs/testing-hardening.md).
#
#   scripts/fuzz.sh [-t SECONDS] [-b BUILD_DIR] [-m] [TARGET...]
#
# TARGET is a name under tests/fuzz/corpus/ (default: all of them). Each runs for SECONDS
# (default 25) from its committed corpus, with tests/fuzz/<target>.dict when there is one, under
# ASan and UBSan, in an empty working directory. BUILD_DIR (default build-asan) must be
# configured with -DRINGRUN_FUZZ=ON (scripts/sanitize.sh asan does that); missing binaries are
# built. New inputs go to a scratch directory; -m merges those that add coverage into the
# committed corpus. A crash, a failed property (FUZZ_CHECK), a leak, a timeout (10 s per input)
# or an out-of-memory fails the run: the input is kept in BUILD_DIR/fuzz-artifacts/ and printed
# in hex. To keep it as a regression test, copy it into tests/fuzz/corpus/<target>/ (every build
# replays the corpus: ctest -L fuzz) and write a unit test for the bug it found.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
secs=25
build=build-asan
merge=
while getopts "t:b:mh" opt; do
  case $opt in
    t) secs=$OPTARG ;;
    b) build=$OPTARG ;;
    m) merge=1 ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
targets=("$@")
if ((${#targets[@]} == 0)); then
  for d in tests/fuzz/corpus/*/; do targets+=("$(basename "$d")"); done
fi
grep -q '^RINGRUN_FUZZ:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null ||
  { echo "fuzz: $build is not a -DRINGRUN_FUZZ=ON build (run scripts/sanitize.sh asan)" >&2; exit 2; }
cmake --build "$build" -j"${RINGRUN_BUILD_JOBS:-2}" --target "${targets[@]/#/fuzz_}"

artifacts=$SRC/$build/fuzz-artifacts
mkdir -p "$artifacts"
scratch=$(mktemp -d /tmp/ringrun-fuzz.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for t in "${targets[@]}"; do
  bin=$SRC/$build/bin/fuzz_$t
  corpus=$SRC/tests/fuzz/corpus/$t
  [[ -x $bin && -d $corpus ]] || { echo "fuzz: no target $t ($bin, $corpus)" >&2; exit 2; }
  mkdir -p "$scratch/$t/new" "$scratch/$t/cwd"
  args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$artifacts/$t-")
  [[ -f tests/fuzz/$t.dict ]] && args+=(-dict="$SRC/tests/fuzz/$t.dict")
  echo "fuzz: $t for ${secs}s"
  if (cd "$scratch/$t/cwd" && "$bin" "${args[@]}" "$scratch/$t/new" "$corpus") >"$scratch/$t.log" 2>&1; then
    grep -E '^stat::(number_of_executed_units|new_units_added|peak_rss_mb)' "$scratch/$t.log" |
      tr '\n' ' ' | sed "s/^/fuzz: $t: /; s/\$/\n/"
    if [[ -n $merge ]]; then
      "$bin" -merge=1 "$corpus" "$scratch/$t/new" >/dev/null 2>&1
      echo "fuzz: $t: corpus now $(ls "$corpus" | wc -l) inputs"
    fi
  else
    failed+=("$t")
    echo "fuzz: $t FAILED:"
    grep -vE '^(#[0-9]+|INFO:|MS:|Dictionary:)' "$scratch/$t.log" | head -60
    for a in $(grep -oE "$artifacts/$t-[a-z]+-[0-9a-f]+" "$scratch/$t.log" | sort -u); do
      echo "fuzz: input kept in $a:"
      od -A x -t x1z "$a" | head -20
    done
  fi
done
if ((${#failed[@]})); then echo "fuzz: failed: ${failed[*]}"; exit 1; fi
echo "fuzz: ${#targets[@]} targets, ${secs}s each, no failure"
