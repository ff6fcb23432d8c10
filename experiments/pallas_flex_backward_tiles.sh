#!/usr/bin/env bash
# jax.pallas_flex's backward under other tiles and launch options (issue #6),
# one process per option set, on one GPU:
#
#   experiments/pallas_flex_backward_tiles.sh OUT [EXTRA_ARGS...]
#
# full and causal_document at 32k, 64:8 heads, d=128, bf16, fwd and bwd
# (the forward is unchanged by these options: it shows the runs agree),
# one warm-up and five timed repeats. Each option set's rows land in
# OUT/<set>/ with the options in their `options` column; a set that does
# not fit the GPU's shared memory writes OOM rows. EXTRA_ARGS are appended
# (a CPU dry run: "--seqlens=512 --heads=4:2"). LCAB_OPTION_SETS (sets
# separated by spaces, keys inside a set by commas) replaces the list below.
set -u
out=$1
shift
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
option_sets=(
  default
  backward_num_warps=4
  backward_num_stages=3
  backward_num_warps=4,backward_num_stages=3
  backward_block_q=32,backward_block_k=128
  backward_block_q=32,backward_block_k=128,backward_num_warps=4,backward_num_stages=3
  backward_block_q=128,backward_block_k=64
  backward_block_q=128,backward_block_k=32,backward_num_warps=4
)
[ -n "${LCAB_OPTION_SETS:-}" ] && read -r -a option_sets <<<"$LCAB_OPTION_SETS"
for set in "${option_sets[@]}"; do
  options=()
  if [ "$set" != default ]; then
    options=(--backend_options="jax.pallas_flex:${set//,/,jax.pallas_flex:}")
  fi
  dir=$out/${set//[,=]/_}
  mkdir -p "$dir"
  echo "== $(date -u +%H:%M:%S) $set"
  timeout 90 python3 -m lcab.experiments --flagfile=experiments/common.flags --suite=kernel \
    --framework=jax --backends=jax.pallas_flex --masks=full,causal_document --seqlens=32k \
    --doc_distribution=chatqa2_long_sft --warmup=1 --iters=5 --noprogress --nosummary \
    --git_commit="${LCAB_COMMIT:-unknown}" --out="$dir" "${options[@]}" "$@" >"$dir/log" 2>&1
  echo "   exit $?"
done
python3 - "$out" <<'PY'
import sys
from lcab import results
frame = results.load([sys.argv[1]])
if len(frame):
    frame["tflops"] = frame["tflops"].round(0)
    cols = ["options", "mask", "direction", "status", "tflops", "compile_s"]
    print(frame[cols].to_string(index=False, max_rows=200))
PY
