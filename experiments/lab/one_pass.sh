#!/usr/bin/env bash
# The one-pass Mosaic backward (option backward_passes=1, v20 in
# docs/pallas_flex.md, its prediction written there before any run)
# against the two kernels it would replace, on one GPU:
#   check  full and causal_document at 2k first (a hang ends at the run's
#          timeout, and the rest is skipped), then every other family,
#          forward and backward, full-size check on (a wrong dQ, dK or dV
#          shows as MISMATCH), with ptxas's registers and spills beside the
#          two-kernel backward's
#   ab     2/1/2/1: backward_passes=2 and 1 in turn, twice, on full, causal,
#          causal_document and sliding_window_causal at 16k and 32k
# Each run writes OUT/<name>/ and OUT/<name>.log, packed after each run into
# OUT/rows.tgz (pack.sh says why). The last lines are one short table per run.
#
#   experiments/lab/one_pass.sh OUT COMMIT check|ab
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
passes() { echo "--backend_options=jax.pallas_flex:backward_passes=$1"; }
case $part in
  check)
    seqlen=--seqlens="${LCAB_LAB_CHECK_SEQLEN:-2k}"
    MOSAIC_GPU_DUMP_PTXAS=1 run check-first 150 --masks=full,causal_document "$seqlen" \
      "$(passes 1)"
    if [ "$LAST_EXIT" != 124 ]; then
      rest=$(python3 -c "from lcab.masks import MASK_NAMES
print(','.join(m for m in MASK_NAMES if m not in ('full', 'causal_document')))")
      run check-rest 330 --masks="$rest" "$seqlen" "$(passes 1)"
    fi
    MOSAIC_GPU_DUMP_PTXAS=1 run check-two 60 --masks=full "$seqlen" "$(passes 2)"
    ptxas_report "$out" check-first
    ptxas_report "$out" check-two ;;
  ab)
    cut=(--seqlens="${LCAB_LAB_SEQLENS:-16k,32k}"
         --masks=full,causal,causal_document,sliding_window_causal)
    ab_rounds backward_passes 240 "2 1" "${cut[@]}" ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
summaries "$out"
