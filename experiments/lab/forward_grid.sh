#!/usr/bin/env bash
# Should the Mosaic forward run one program per SM? On one GPU, pallas_flex's
# forward with forward_grid=per_item (the default: one program per q block
# and head) and persistent (v23: one program per SM walking items in turn,
# the next item's Q and K/V loaded while this one finishes) in turn.
# Short rows are where it should act: at 1k-4k a program walks at most
# 8-32 K/V tiles and the forward reads 0.75-0.92x FA3 (H200 blog rows).
# check: the GPU test of the persistent grid across items that see
# nothing (tests/test_pallas_flex_kernels.py, one program and several),
# all 16 families at 1k persistent, the full-size check on, and ptxas's
# report; ab: per_item and persistent in turn (one round a call,
# LCAB_LAB_ROUNDS) on four masks, forward only, at LCAB_LAB_SEQLENS
# (default 1k,2k,4k; 16k,32k is the long-row control); LCAB_LAB_OPTION
# (KEY=VALUE) sets one more pallas_flex option for both (e.g.
# rows_launch=head_major). Each run writes
# OUT/<name>/ and its .log, packed into OUT/rows.tgz after each; the last
# lines are one short table per run.
#
#   experiments/lab/forward_grid.sh OUT COMMIT check|ab
#
# COMMIT: the full hash, written out (experiments/README.md says why).
set -uo pipefail
usage="usage: $0 OUT COMMIT check|ab"
source "$(dirname "$0")/pack.sh"
lab_start "$@"
case $part in
  check)
    kernel_gpu_test persistent_mosaic_forward 120
    check_every_family check-persistent forward_grid=persistent --directions=fwd ;;
  ab)
    ab_rounds forward_grid 270 "per_item persistent" --directions=fwd \
      --seqlens="${LCAB_LAB_SEQLENS:-1k,2k,4k}" \
      --masks=full,causal,causal_document,sliding_window_causal \
      ${LCAB_LAB_OPTION:+"--backend_options=jax.pallas_flex:$LCAB_LAB_OPTION"} ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
summaries "$out"
