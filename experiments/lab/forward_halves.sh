#!/usr/bin/env bash
# Should a Mosaic forward warpgroup take only the seen 64-key half of a
# partial tile? On one GPU, pallas_flex's forward with forward_halves=all
# (the default: both warpgroups take every partial tile's 128 keys, the
# pairs their rows do not see masked out) and seen (v32: a warpgroup whose
# 64 query rows see only one 64-key half of the tile, by the plan's
# quarter codes, runs its scores and P @ V on that half alone).
# check: the GPU tests (seen against the float64 reference and the
# default on six families, per item and persistent), then all 16 families
# at 1k with seen, forward and backward, the full-size check on, under
# ptxas's report; ab: all and seen in turn (two rounds, LCAB_LAB_ROUNDS),
# forward, the documents and the window at 2k, 16k and 32k; guard: the
# same on full and causal at 2k and 32k (the option has nothing to do on
# full: any move there is the branch's cost or noise). Each run writes
# OUT/<name>/ and its .log, packed into OUT/rows.tgz after each; the last
# lines are one short table per run. LCAB_LAB_SEQLENS narrows ab's and
# guard's lengths where a call's ten minutes would not hold them all.
#
#   experiments/lab/forward_halves.sh OUT COMMIT check|ab|guard
#
# COMMIT: the full hash, written out (experiments/README.md says why).
#
# Written before any run (v32 in docs/pallas_flex.md): correct on every
# family, output within a few bf16 steps of the default's; forward spills
# still 0. The plan's quarter codes (numpy, the seed blog's masks) give
# the half steps' saving, as a share of a warpgroup's tile work: the
# window 5.6 % at every length, causal_document 21.5 / 3.7 / 2.9 % at
# 2k / 16k / 32k, full_document 13.4 / 2.8 / 1.7 %, causal 2.9 / 0.4 /
# 0.2 %, full 0. A partial tile costs 1.75-2 whole ones in the forward
# and a half step about 0.6 of a partial one, so in time the window saves
# about 7 % and causal_document about 4-5 % at 16k-32k; at v29's
# realised 0.5-0.8 of such a prediction: sliding_window_causal +3.5-6 %,
# causal_document +2-4 % at 16k-32k and +10-15 % at 2k, full_document
# +1-2 % at 16k-32k, causal within 1 % at 32k, full within 0.5 %. seen
# becomes the default if ab gains beyond the two rounds' spread on the
# window and causal_document at 16k and 32k and guard loses nowhere by
# more than 0.5 %; else it leaves main with its rows.
set -uo pipefail
usage="usage: $0 OUT COMMIT check|ab|guard"
source "$(dirname "$0")/pack.sh"
lab_start "$@"
case $part in
  check)
    kernel_gpu_test seen_halves 240
    check_every_family check-seen forward_halves=seen ;;
  ab)
    ab_rounds forward_halves "${LCAB_LAB_SECONDS:-120}" "all seen" --directions=fwd \
      "--seqlens=${LCAB_LAB_SEQLENS:-2k,16k,32k}" --masks=causal_document,full_document,sliding_window_causal ;;
  guard)
    ab_rounds forward_halves "${LCAB_LAB_SECONDS:-100}" "all seen" --directions=fwd \
      "--seqlens=${LCAB_LAB_SEQLENS:-2k,32k}" --masks=full,causal ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
summaries "$out"
