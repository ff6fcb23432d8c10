#!/usr/bin/env bash
# Does the Mosaic forward gain from FA3's way of taking turns
# (forward_schedule=handoff: hardware named barriers, a warpgroup hands the
# tensor cores over once its scores' matmul is issued and waits only before
# its P @ V) over the mbarrier rendezvous it runs now, alone and with the
# forward's programs head after head (rows_launch=head_major)? One call, one
# GPU: first every mask family at 2k through the handoff forward with the
# full-size check (a schedule that races shows as MISMATCH, one that
# deadlocks as a timeout), then forward-only A/B/C/A on the seed blog's
# full, causal, causal_document and sliding_window_causal at 16k and 32k.
# Predicted (docs/pallas_flex.md, v10, written before any run): handoff
# +1-3 % forward on full and causal, +0-2 % on the others; with head_major
# on full and causal at 32k +2-3 % more (measured before on an H200).
# The first two runs print ptxas's register and spill report of every
# kernel they compile (MOSAIC_GPU_DUMP_PTXAS=1): the forward's lines come
# last, per schedule, to see whether the partial tiles' path spills (a
# partial tile costs 1.8-2.1x a whole one forward on causal-edged masks,
# docs/pallas_flex.md). Each run writes OUT/<name>/; the last lines are one
# short table per run.
#
#   experiments/lab/forward_schedule.sh OUT COMMIT
set -uo pipefail
out=${1:?usage: $0 OUT COMMIT}
commit=${2:?usage: $0 OUT COMMIT}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
mkdir -p "$out"
runs=()
run() {  # name, then lcab.experiments flags
  local name=$1; shift
  runs+=("$name")
  timeout 600 python3 -m lcab.experiments --flagfile=experiments/seed_blog.flags \
    --framework=jax --backends=jax.pallas_flex "--git_commit=$commit" --noprogress \
    --nosummary --out="$out/$name" "$@" >"$out/$name.log" 2>&1
  echo "$name: exit $?"
}
families=$(python3 -c "from lcab.masks import MASK_NAMES; print(','.join(MASK_NAMES))")
MOSAIC_GPU_DUMP_PTXAS=1 run handoff-families --masks="$families" --seqlens=2k \
  --backend_options=jax.pallas_flex:forward_schedule=handoff
ab=(--directions=fwd --seqlens=16k,32k
    --masks=full,causal,causal_document,sliding_window_causal)
MOSAIC_GPU_DUMP_PTXAS=1 run rendezvous-1 "${ab[@]}"
run handoff "${ab[@]}" --backend_options=jax.pallas_flex:forward_schedule=handoff
run handoff-head_major "${ab[@]}" --backend_options=jax.pallas_flex:forward_schedule=handoff \
  --backend_options=jax.pallas_flex:rows_launch=head_major
run rendezvous-2 "${ab[@]}"
for name in handoff-families rendezvous-1; do
  echo "## ptxas, the forward, $name"
  grep -A4 "entry function 'lcab_flex_forward_mosaic" "$out/$name.log" | grep -E "spill|Used" | sort | uniq -c
done
for name in "${runs[@]}"; do
  echo "## $name"
  python3 -m lcab.report --results="$out/$name" --summary 2>/dev/null | grep '^|'
done
