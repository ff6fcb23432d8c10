# Sourced by the lab scripts. pack_runs OUT NAME... packs the named runs'
# folders and logs under OUT into OUT/rows.tgz: one file, because the
# device tool returns only a few files from a call (rows left out are
# lost), and rewritten after each run, so a call cut short keeps the runs
# before it. Written beside and then moved, so the archive is always whole.
pack_runs() {
  local out=$1; shift
  local items=() name
  for name in "$@"; do
    [ -e "$out/$name" ] && items+=("$name")
    [ -e "$out/$name.log" ] && items+=("$name.log")
  done
  tar czf "$out/rows.tgz.part" -C "$out" --exclude=.lcab.lock "${items[@]}" \
    && mv "$out/rows.tgz.part" "$out/rows.tgz"
}

# run_packed OUT NAME COMMAND...: COMMAND with its output in OUT/NAME.log,
# its exit status said (and kept in LAST_EXIT), then every run so far
# (RUNS, in order) packed.
RUNS=()
LAST_EXIT=0
run_packed() {
  local out=$1 name=$2; shift 2
  RUNS+=("$name")
  "$@" >"$out/$name.log" 2>&1
  LAST_EXIT=$?
  echo "$name: exit $LAST_EXIT"
  pack_runs "$out" "${RUNS[@]}"
}

# summaries OUT: the short table of each run in RUNS, in order.
summaries() {
  local name
  for name in "${RUNS[@]}"; do
    echo "## $name"
    python3 -m lcab.report --results="$1/$name" --summary 2>/dev/null | grep '^|'
  done
}

# ptxas_report OUT NAME: registers and bytes spilled per pallas_flex kernel in
# OUT/NAME.log (a run under MOSAIC_GPU_DUMP_PTXAS=1), counted.
ptxas_report() {
  echo "## ptxas, $2: registers and spills per kernel"
  grep -A3 "entry function 'lcab_flex" "$1/$2.log" 2>/dev/null \
    | grep -oE "entry function '[a-z_]+|[0-9]+ bytes spill stores|Used [0-9]+ registers" \
    | paste -d' ' - - - | sort | uniq -c
}

# The one-GPU kernel helpers below (lab_start, pallas_flex_run, run, ab_rounds,
# kernel_gpu_test, check_every_family, ptxas_report) serve clocks.sh,
# rows_launch.sh, dkv_split.sh, forward_grid.sh, key_step.sh and
# forward_overlap.sh; earlier
# scripts that used them left main with their options: forward_release.sh
# is at commit a32f37e, dq_reduce_probe.sh at a32f37e (v19) and 90d886b
# (v30, v31), one_pass.sh at 520f3a5,
# dkv_strips.sh at 28b11ca, dq_grid.sh at 5e02067, dkv_loads.sh (its option
# became the only order) at 74ef073, backward_quarters.sh at d1227e1,
# forward_halves.sh at a6824bf.

# lab_start OUT COMMIT PART: a one-GPU lab script's arguments into out,
# commit and part (a missing one exits with $usage), its environment, OUT.
lab_start() {
  out=${1:?$usage}
  commit=${2:?$usage}
  part=${3:?$usage}
  export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
  mkdir -p "$out"
}

# pallas_flex_run NAME SECONDS FLAGS...: jax.pallas_flex alone on the seed
# blog's workloads at $commit into $out/NAME (run_packed), killed after
# SECONDS, the full-size check's references shared between runs; the
# paper's workloads instead where the script sets flagfile=experiments/paper.flags.
pallas_flex_run() {
  local name=$1 seconds=$2; shift 2
  run_packed "$out" "$name" timeout -k 10 "$seconds" python3 -m lcab.experiments \
    "--flagfile=${flagfile:-experiments/seed_blog.flags}" --framework=jax --backends=jax.pallas_flex \
    --reference_cache="$out/references" "--git_commit=$commit" --noprogress --nosummary \
    --out="$out/$name" "$@"
}

# run NAME SECONDS FLAGS...: the run ab_rounds makes, pallas_flex_run unless
# a script defines its own after sourcing this file (clocks.sh does).
run() { pallas_flex_run "$@"; }

# ab_rounds OPTION SECONDS "VALUES" FLAGS...: the script's run (name, seconds,
# flags) of each of jax.pallas_flex's OPTION VALUES in turn, twice
# (A/B/C/A/B/C: drift shows as a difference between rounds), as VALUE-ROUND;
# the value "default" leaves OPTION unset. LCAB_LAB_ROUNDS (default "1 2")
# runs some rounds only: one round a device call when two would pass the
# call's ten minutes.
ab_rounds() {
  local option=$1 seconds=$2 values=$3 round value set; shift 3
  for round in ${LCAB_LAB_ROUNDS:-1 2}; do
    for value in $values; do
      set=("--backend_options=jax.pallas_flex:$option=$value")
      [ "$value" = default ] && set=()
      run "$value-$round" "$seconds" "$@" "${set[@]}"
    done
  done
}

# kernel_gpu_test FILTER SECONDS: the GPU tests of tests/test_pallas_flex_kernels.py
# that pytest's -k FILTER selects, killed after SECONDS, as run gpu-test.
kernel_gpu_test() {
  run_packed "$out" gpu-test timeout -k 10 "$2" python3 -m pytest -q -p no:cacheprovider \
    tests/test_pallas_flex_kernels.py -k "$1"
}

# check_every_family NAME OPTION FLAGS...: jax.pallas_flex with OPTION
# (key=value, or several joined by commas) on every mask family at 1k,
# the full-size check on, as run NAME (pallas_flex_run, 420 s) under
# ptxas's report, then the report.
check_every_family() {
  local name=$1 option=$2 all; shift 2
  all=$(python3 -c "from lcab.masks import MASK_NAMES; print(','.join(MASK_NAMES))")
  MOSAIC_GPU_DUMP_PTXAS=1 pallas_flex_run "$name" 420 --masks="$all" --seqlens=1k \
    "--backend_options=jax.pallas_flex:${option//,/,jax.pallas_flex:}" "$@"
  ptxas_report "$out" "$name"
}
