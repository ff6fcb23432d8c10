#!/usr/bin/env bash
# Group-cast variants against its default, A/B/A/B, at cp 4 on
# causal_document and full_document, TOKENS_PER_GPU (8k, the default, or
# 32k) tokens per GPU; MASKS narrows the masks (at 32k per GPU one call of
# ten minutes holds about one mask). One call, one machine of 4 GPUs,
# every run one after another on the same GPUs. Each run writes
# OUT/<name>/ and OUT/<name>.log, packed after each run into OUT/rows.tgz
# (pack.sh says why); the last lines are one short table per run.
# Predictions (docs/context_parallel.md, written before any run; the
# slowest rank's tiles from experiments/lab/groupcast_counts.py):
#
# - tiles: does group-cast gain from a dispatch that evens the kernel's
#   tiles (--dispatch=groupcast_tiles) instead of area (balanced)?
#   pallas_flex alone on GPU 0 at the global length first (the ratio's
#   reference, same call), then groupcast_tiles and balanced alternated,
#   all-gather with balanced between them. Predicted at 8k per GPU:
#   group-cast +5 % on causal_document and +2 % on full_document both
#   ways; at 32k per GPU (tiles 1.033 -> 1.017 and 1.045 -> 1.023):
#   +1.5 % and +2 %.
# - chunks: do group-cast and all-gather gain from the balanced dispatch
#   at eight chunks a rank (dispatch_chunks=8) instead of its four? The
#   kernel alone first, then each strategy both ways, alternated.
#   Predicted (the slowest rank's tiles, and what group-cast's all_to_all
#   moves over a ring's): at 32k per GPU causal_document 1.033 -> 1.003
#   and 0.50 -> 0.41, full_document 1.045 -> 1.010 and 0.75 -> 0.66, so
#   group-cast +3 % and +3.5 % both ways and all-gather about the same;
#   at 8k per GPU 1.076 -> 1.018 with 0.62 -> 0.75 moved, and 1.040 ->
#   1.023 with 0.94 both ways: group-cast +4 % and +1.5 %.
# - transpose: does its backward gain from summing each chunk's returned
#   dK/dV by a fixed table (transpose=gather) instead of JAX's scatter-add
#   (scatter, the default)? Predicted: backward +1 to +3 % on
#   causal_document and +0.5 to +2 % on full_document at 8k per GPU,
#   under 1 % at 32k, forward unchanged.
#
#   [TOKENS_PER_GPU=32k] [MASKS=causal_document] \
#     experiments/lab/groupcast_ab.sh OUT COMMIT tiles|chunks|transpose
set -uo pipefail
out=${1:?usage: $0 OUT COMMIT tiles|chunks|transpose}
commit=${2:?usage: $0 OUT COMMIT tiles|chunks|transpose}
experiment=${3:?usage: $0 OUT COMMIT tiles|chunks|transpose}
export XLA_PYTHON_CLIENT_PREALLOCATE=false NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
mkdir -p "$out"
source "$(dirname "$0")/pack.sh"
case ${TOKENS_PER_GPU:-8k} in
  8k) seqlen=32k ;;
  32k) seqlen=128k ;;
  *) echo "TOKENS_PER_GPU=$TOKENS_PER_GPU: choose 8k or 32k" >&2; exit 2 ;;
esac
masks=${MASKS:-causal_document,full_document}
run() {  # name, then lcab.experiments flags
  run_packed "$out" "$1" python3 -m lcab.experiments --flagfile=experiments/cp_jax.flags \
    "--git_commit=$commit" "--seqlens=$seqlen" "--masks=$masks" --noprogress \
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
  chunks)
    CUDA_VISIBLE_DEVICES=0 run kernel --suite=kernel --backends=jax.pallas_flex
    eight=--backend_options=jax.cp_groupcast:dispatch_chunks=8,jax.cp_allgather:dispatch_chunks=8
    both=(--cp_size=4 --backends=jax.cp_groupcast,jax.cp_allgather --dispatch=balanced)
    for round in 1 2; do
      run "chunks8-$round" "${both[@]}" "$eight"
      run "chunks4-$round" "${both[@]}"
    done ;;
  transpose)
    for round in 1 2; do
      run "scatter-$round" "${cp4[@]}" --backend_options=jax.cp_groupcast:transpose=scatter
      run "gather-$round" "${cp4[@]}" --backend_options=jax.cp_groupcast:transpose=gather
    done ;;
  *) echo "unknown experiment $experiment: choose tiles, chunks or transpose" >&2; exit 2 ;;
esac
summaries "$out"
