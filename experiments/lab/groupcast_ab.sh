#!/usr/bin/env bash
# Group-cast variants against its default, A/B/A/B, at cp 4, 8k tokens per
# GPU, on causal_document and full_document. One call, one machine of 4
# GPUs, every run one after another on the same GPUs. Each run writes
# OUT/<name>/ and OUT/<name>.log, packed after each run into OUT/rows.tgz
# (pack.sh says why); the last lines are one short table per run.
# Predictions (docs/context_parallel.md, written before any run):
#
# - tiles: does group-cast gain from a dispatch that evens the kernel's
#   tiles (--dispatch=groupcast_tiles) instead of area (balanced)?
#   pallas_flex alone on GPU 0 at the global length first (the ratio's
#   reference, same call), then groupcast_tiles and balanced alternated,
#   all-gather with balanced between them. Predicted: group-cast +5 % on
#   causal_document and +2 % on full_document both ways.
# - transpose: does its backward gain from summing each chunk's returned
#   dK/dV by a fixed table (transpose=gather) instead of JAX's scatter-add
#   (scatter, the default)? Predicted: backward +1 to +3 % on
#   causal_document and +0.5 to +2 % on full_document, forward unchanged.
#
#   experiments/lab/groupcast_ab.sh OUT COMMIT tiles|transpose
set -uo pipefail
out=${1:?usage: $0 OUT COMMIT tiles|transpose}
commit=${2:?usage: $0 OUT COMMIT tiles|transpose}
experiment=${3:?usage: $0 OUT COMMIT tiles|transpose}
export XLA_PYTHON_CLIENT_PREALLOCATE=false NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
mkdir -p "$out"
source "$(dirname "$0")/pack.sh"
run() {  # name, then lcab.experiments flags
  run_packed "$out" "$1" python3 -m lcab.experiments --flagfile=experiments/cp_jax.flags \
    "--git_commit=$commit" --seqlens=32k --masks=causal_document,full_document --noprogress \
    --nosummary --reference_cache=/tmp/lcab-reference-cache --out="$out/$1" "${@:2}"
}
cp4=(--cp_size=4 --backends=jax.cp_groupcast)
case $experiment in
  tiles)
    CUDA_VISIBLE_DEVICES=0 run kernel --suite=kernel --backends=jax.pallas_flex
    run tiles-1 "${cp4[@]}" --dispatch=groupcast_tiles
    run balanced-1 "${cp4[@]}" --dispatch=balanced
    run allgather --cp_size=4 --backends=jax.cp_allgather --dispatch=balanced
    run tiles-2 "${cp4[@]}" --dispatch=groupcast_tiles
    run balanced-2 "${cp4[@]}" --dispatch=balanced ;;
  transpose)
    for round in 1 2; do
      run "scatter-$round" "${cp4[@]}" --backend_options=jax.cp_groupcast:transpose=scatter
      run "gather-$round" "${cp4[@]}" --backend_options=jax.cp_groupcast:transpose=gather
    done ;;
  *) echo "unknown experiment $experiment: choose tiles or transpose" >&2; exit 2 ;;
esac
summaries "$out"
