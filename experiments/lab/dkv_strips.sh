#!/usr/bin/env bash
# The Mosaic dK/dV kernel in 32-query strips (option dkv_strips=4, v21 in
# docs/pallas_flex.md, its prediction written there before any run) against
# today's 64-query strips (2), on one GPU:
#   check  every family at 2k, forward and backward, full-size check on (a
#          wrong dK or dV shows as MISMATCH), with ptxas's registers and
#          spills for 4 beside 2's on full
#   ab     2/4/2/4 on full, causal, causal_document and sliding_window_causal
#          at 16k and 32k
# Each run writes OUT/<name>/ and OUT/<name>.log, packed after each run into
# OUT/rows.tgz (pack.sh says why). The last lines are one short table per run.
#
#   experiments/lab/dkv_strips.sh OUT COMMIT check|ab
#
# COMMIT: the full hash, written out (experiments/README.md says why).
# LCAB_LAB_ROUNDS (default "1 2") runs some of ab's rounds (one a call);
# LCAB_LAB_SEQLENS (default 16k,32k) and LCAB_LAB_CHECK_SEQLEN (2k) shrink
# it for a rehearsal on a CPU, where the Triton kernels run instead.
set -uo pipefail
usage="usage: $0 OUT COMMIT check|ab"
source "$(dirname "$0")/pack.sh"
lab_start "$@"
run() { pallas_flex_run "$@"; }  # name, seconds, then lcab.experiments flags
strips() { echo "--backend_options=jax.pallas_flex:dkv_strips=$1"; }
case $part in
  check)
    seqlen=--seqlens="${LCAB_LAB_CHECK_SEQLEN:-2k}"
    all=$(python3 -c "from lcab.masks import MASK_NAMES; print(','.join(MASK_NAMES))")
    MOSAIC_GPU_DUMP_PTXAS=1 run check-4 420 --masks="$all" "$seqlen" "$(strips 4)"
    MOSAIC_GPU_DUMP_PTXAS=1 run check-2 60 --masks=full "$seqlen" "$(strips 2)"
    ptxas_report "$out" check-4
    ptxas_report "$out" check-2 ;;
  ab)
    cut=(--seqlens="${LCAB_LAB_SEQLENS:-16k,32k}"
         --masks=full,causal,causal_document,sliding_window_causal)
    ab_rounds dkv_strips 240 "2 4" "${cut[@]}" ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
summaries "$out"
