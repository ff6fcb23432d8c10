#!/usr/bin/env bash
# Does group-cast gain from a dispatch that evens the kernel's tiles
# (--dispatch=groupcast_tiles) instead of area (balanced)? One call, one
# machine of 4 GPUs, everything one after another on the same GPUs:
# pallas_flex alone on GPU 0 at the global length (the ratio's reference,
# same call), then at cp 4, 8k tokens per GPU, on causal_document and
# full_document: group-cast with groupcast_tiles and with balanced
# alternated (A/B/A/B) and all-gather with balanced between them.
# Predicted (docs/context_parallel.md, written before any run): group-cast
# +5 % on causal_document and +2 % on full_document both ways. Each run
# writes OUT/<name>/ and OUT/<name>.log, packed after each run into
# OUT/rows.tgz (pack.sh says why); the last lines are one short table per
# run.
#
#   experiments/lab/groupcast_tiles.sh OUT COMMIT
set -uo pipefail
out=${1:?usage: $0 OUT COMMIT}
commit=${2:?usage: $0 OUT COMMIT}
export XLA_PYTHON_CLIENT_PREALLOCATE=false NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
mkdir -p "$out"
source "$(dirname "$0")/pack.sh"
run() {  # name, then lcab.experiments flags
  run_packed "$out" "$1" python3 -m lcab.experiments --flagfile=experiments/cp_jax.flags \
    "--git_commit=$commit" --seqlens=32k --masks=causal_document,full_document --noprogress \
    --nosummary --reference_cache=/tmp/lcab-reference-cache --out="$out/$1" "${@:2}"
}
cp4=(--cp_size=4 --backends=jax.cp_groupcast)
CUDA_VISIBLE_DEVICES=0 run kernel --suite=kernel --backends=jax.pallas_flex
run tiles-1 "${cp4[@]}" --dispatch=groupcast_tiles
run balanced-1 "${cp4[@]}" --dispatch=balanced
run allgather --cp_size=4 --backends=jax.cp_allgather --dispatch=balanced
run tiles-2 "${cp4[@]}" --dispatch=groupcast_tiles
run balanced-2 "${cp4[@]}" --dispatch=balanced
summaries "$out"
