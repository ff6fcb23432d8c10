#!/usr/bin/env bash
# Should the Mosaic forward merge a partial tile's slices per row before it
# tests the tile's elements? On one GPU, pallas_flex's forward with
# forward_ranges=looped (the default: a masked copy of the scores built
# slice after slice, the scores held beside it across the loop) and merged
# (v27: the slices' column ranges merged on row vectors, then one test an
# element, where every row sees one run of each tile:
# Geometry.one_range_rows) in turn.
# check: the GPU test of the merged forward at 128 and 192 keys
# (tests/test_pallas_flex_kernels.py), every family at 1k merged at 128
# and at 192 keys, the full-size check on, each under ptxas's report;
# ab: looped and merged in turn at 128 keys (two rounds, LCAB_LAB_ROUNDS)
# on four masks at 16k and 32k, forward only; wide: the same at 192 keys
# (block_k=192 on both arms) at 32k, after one run at 128 keys as the
# reference. Each run writes OUT/<name>/ and its .log, packed into
# OUT/rows.tgz after each; the last lines are one short table per run.
#
#   experiments/lab/merged_ranges.sh OUT COMMIT check|ab|wide
#
# COMMIT: the full hash, written out (experiments/README.md says why).
#
# Written before any run (v27 in docs/pallas_flex.md): correct on every
# family; ptxas: 0 bytes spilled at 128 either way, and at 192 merged
# spills under 100 bytes a thread where looped spills 844 (the loop over a
# tile's slices holds the scores beside their masked copy: 2 x 96 float32
# registers at 192 beside the output's 64, 2 x 64 at 128). ab at 128:
# causal_document +0.5 to +3 % and full_document 0 to +2 % at 16k-32k
# (their document-edge tiles carry two slices or more: one element pass
# instead of one a slice), causal and sliding_window_causal within
# +-0.7 % (one slice a tile nearly everywhere). wide: against looped at
# 192, merged gains on full_document and sliding_window_causal by the
# spills' share, so their loss against 128 (v26: -14 % and -40 % at 32k)
# shrinks to -8 to -4 % on full_document and -35 to -30 % on the window
# (its loss is mostly the wider tiles' waste and the persistent grid 192
# cannot take); full unchanged (no partial tiles). merged becomes the
# default where the plan allows it if ab gains beyond the two rounds'
# spread on the documents and loses nowhere by more than 0.5 %; else it
# leaves main with its rows.
set -uo pipefail
usage="usage: $0 OUT COMMIT check|ab|wide"
source "$(dirname "$0")/pack.sh"
lab_start "$@"
run() { pallas_flex_run "$@"; }  # name, seconds, then lcab.experiments flags
case $part in
  check)
    kernel_gpu_test merged_ranges 240
    check_every_family check-merged forward_ranges=merged --directions=fwd
    check_every_family check-merged-wide block_k=192,forward_ranges=merged --directions=fwd ;;
  ab)
    ab_rounds forward_ranges "${LCAB_LAB_SECONDS:-130}" "looped merged" --directions=fwd \
      --seqlens=16k,32k --masks=causal_document,full_document,sliding_window_causal,causal ;;
  wide)
    run ref128-1 "${LCAB_LAB_SECONDS:-110}" --directions=fwd --seqlens=32k \
      --masks=full_document,sliding_window_causal,causal_document,full \
      --backend_options=jax.pallas_flex:block_k=128
    ab_rounds forward_ranges "${LCAB_LAB_SECONDS:-110}" "looped merged" --directions=fwd \
      --seqlens=32k --masks=full_document,sliding_window_causal,causal_document,full \
      --backend_options=jax.pallas_flex:block_k=192 ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
summaries "$out"
