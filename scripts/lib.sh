# Shared by the scripts (source it). Every documented build path configures through the presets
# of CMakePresets.json, so the folders they share agree on generator and options.

# configure PRESET: configures the preset's folder. A folder that already has a CMake cache is
# re-configured with what it was made with (its generator included), so a folder made by hand,
# even with another generator, is reused instead of failing with "generator ... does not match".
configure() {
  local preset=$1 dir
  dir=$(preset_dir "$preset")
  if [[ -f $dir/CMakeCache.txt ]]; then
    cmake -S . -B "$dir" >/dev/null
  elif ! cmake --preset "$preset" >"${TMPDIR:-/tmp}/ringrun-configure-$$.log" 2>&1; then
    cat "${TMPDIR:-/tmp}/ringrun-configure-$$.log" >&2
    rm -f "${TMPDIR:-/tmp}/ringrun-configure-$$.log"
    echo "configure failed: are the dependencies installed? (scripts/install-deps.sh, as root)" >&2
    return 1
  fi
  rm -f "${TMPDIR:-/tmp}/ringrun-configure-$$.log"
}

# preset_dir PRESET: the build folder of a configure preset (build, build-nonccl, ...).
preset_dir() {
  case $1 in
    default) echo build ;;
    *) echo "build-$1" ;;
  esac
}

# The build's parallelism: RINGRUN_BUILD_JOBS, else every CPU.
build_jobs() { echo "${RINGRUN_BUILD_JOBS:-$(nproc)}"; }
