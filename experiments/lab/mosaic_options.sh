#!/usr/bin/env bash
# Two options of jax.pallas_flex's Mosaic kernels against the defaults, on
# one GPU (docs/pallas_flex.md, v10 and v12; predictions written there
# before any run):
#   forward_schedule=handoff  the forward's compute warpgroups take turns as
#     FA3 does (hardware named barriers, the turn handed over once the
#     scores' matmul is issued) instead of meeting at one mbarrier twice a
#     tile: +1-3 % forward on full and causal, +0-2 % on the others; with
#     rows_launch=head_major +2-3 % more on full and causal at 32k.
#   mask_test=offset  a partial tile's elements tested by one unsigned
#     compare instead of two compares and an and (forward, dQ, dK/dV):
#     +4-7 % forward on sliding_window_causal, +3-6 % on causal_document
#     at 16k-32k, backward +1-4 % there, if the arithmetic is the cost.
# Parts (one device call each, about 8, 7 and 6 minutes on an H200 with a
# warm machine):
#   check     every mask family at 2k with both options, forward and
#             backward, full-size check on (a race or a wrong mask shows as
#             MISMATCH, a deadlock as a timeout); ptxas's register and
#             spill report of each kernel with the options
#             (MOSAIC_GPU_DUMP_PTXAS; the defaults' report, 168 registers
#             and 108 / 0 / 244 bytes spilled in the forward / dQ / dK/dV,
#             is in results/gpu/2026-11-29-h200-mosaic-options/)
#   forward   forward only, A/B/C/D/E/A: default, handoff, head_major,
#             handoff with head_major, offset, default; seed blog's full,
#             causal, causal_document and sliding_window_causal at 16k and
#             32k
#   backward  forward and backward, A/B/A: default, offset, default, on
#             causal_document and sliding_window_causal at 16k and 32k
# Each run writes OUT/<name>/ and OUT/<name>.log, packed after each run
# into OUT/rows.tgz (pack.sh says why). The last lines are one short
# table per run.
#
#   experiments/lab/mosaic_options.sh OUT COMMIT check|forward|backward
#
# LCAB_LAB_SEQLENS (default 16k,32k) and LCAB_LAB_CHECK_SEQLEN (2k) shrink
# it for a rehearsal on a CPU, where the Triton kernels run instead.
set -uo pipefail
usage="usage: $0 OUT COMMIT check|forward|backward"
out=${1:?$usage}
commit=${2:?$usage}
part=${3:?$usage}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
mkdir -p "$out"
source "$(dirname "$0")/pack.sh"
runs=()
run() {  # name, then lcab.experiments flags
  local name=$1; shift
  runs+=("$name")
  timeout 600 python3 -m lcab.experiments --flagfile=experiments/seed_blog.flags \
    --framework=jax --backends=jax.pallas_flex "--git_commit=$commit" --noprogress \
    --nosummary --out="$out/$name" "$@" >"$out/$name.log" 2>&1
  echo "$name: exit $?"
  pack_runs "$out" "${runs[@]}"
}
option() { echo "--backend_options=jax.pallas_flex:$1"; }
lengths=--seqlens="${LCAB_LAB_SEQLENS:-16k,32k}"
ab=("$lengths" --masks=full,causal,causal_document,sliding_window_causal --directions=fwd)
cut=("$lengths" --masks=causal_document,sliding_window_causal)
check_seqlen=${LCAB_LAB_CHECK_SEQLEN:-2k}
case $part in
  check)
    families=$(python3 -c "from lcab.masks import MASK_NAMES; print(','.join(MASK_NAMES))")
    MOSAIC_GPU_DUMP_PTXAS=1 run check-options --masks="$families" --seqlens="$check_seqlen" \
      "$(option forward_schedule=handoff)" "$(option mask_test=offset)"
    echo "## ptxas, check-options: registers and spills per kernel"
    grep -A3 "entry function 'lcab_flex" "$out/check-options.log" \
      | grep -oE "entry function '[a-z_]+|[0-9]+ bytes spill stores|Used [0-9]+ registers" \
      | paste -d' ' - - - | sort | uniq -c ;;
  forward)
    run default-1 "${ab[@]}"
    run handoff "${ab[@]}" "$(option forward_schedule=handoff)"
    run head_major "${ab[@]}" "$(option rows_launch=head_major)"
    run handoff-head_major "${ab[@]}" "$(option forward_schedule=handoff)" \
      "$(option rows_launch=head_major)"
    run offset "${ab[@]}" "$(option mask_test=offset)"
    run default-2 "${ab[@]}" ;;
  backward)
    run default-1 "${cut[@]}"
    run offset "${cut[@]}" "$(option mask_test=offset)"
    run default-2 "${cut[@]}" ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
for name in "${runs[@]}"; do
  echo "## $name"
  python3 -m lcab.report --results="$out/$name" --summary 2>/dev/null | grep '^|'
done
