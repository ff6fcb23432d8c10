#!/usr/bin/env bash
# Does the Mosaic forward gain from 192-key steps? On one GPU, pallas_flex's
# forward with block_k=128 (the default) and 192 (v26) in turn. FA3 steps
# 176 keys where the mask is neither causal nor local and leads pallas_flex
# there (full 0.94-0.97x on H200 rows) but not on causal, where both step
# 128 (docs/pallas_flex.md, "The forward's key step"). 192 runs one program
# per item (its ring leaves no room for the persistent grid's output tile),
# so where the default is persistent (programs that walk under 16k keys:
# causal at 24k, the documents, the window) the arms differ in grid too.
# check: the GPU test of the 192-key forward at a length no block divides
# (tests/test_pallas_flex_kernels.py), every family at 1k with block_k=192,
# the full-size check on, and ptxas's report (spills decide it: the scores
# take 96 registers a thread where 128 keys take 64); ab: both in turn (one
# round a call, LCAB_LAB_ROUNDS), forward only, at LCAB_LAB_SEQLENS
# (default 24k,32k,64k: 24k and 48k are multiples of 192, 32k and 64k pad
# one partial block) on LCAB_LAB_MASKS (default full, causal, full_document,
# sliding_window_causal). Each run writes OUT/<name>/ and its .log, packed
# into OUT/rows.tgz after each; the last lines are one short table per run.
#
#   experiments/lab/key_step.sh OUT COMMIT check|ab
#
# COMMIT: the full hash, written out (experiments/README.md says why).
#
# Written before any run (v26 in docs/pallas_flex.md): correct on every
# family; ptxas spills at most a few bytes a thread (tens would make it a
# loss, as spills did to v12's and v17's backward); forward full +3 to +6 %
# at 24k-64k; causal +1 to +4 % at 32k-64k (its diagonal's cut tiles grow
# 1.5x, under 1 % of its area there) and 0 to +3 % at 24k (where the
# default arm is persistent); full_document -5 to +2 % and
# sliding_window_causal -18 to -8 % (the persistent grid lost: v23 measured
# it +3 to +9 % on them at 16k-32k; and the tiles' share of the mask falls
# from 0.95-0.98 to 0.94-0.97 on full_document, from 0.89 to 0.80 on the
# window, by the plan on a CPU). A rule, not a default everywhere: 192
# where the forward runs one program per item anyway (schedule.forward_grid:
# 16k keys a program or more), if full and causal gain there beyond the two
# rounds' spread in both rounds and nothing the rule would cover loses.
# paper: the same on the paper's masks whose programs walk long rows at 32k
# or 40k (its document sampler; the rule's own cells and their neighbours),
# with a third arm, the default (block_k unset: the rule itself).
# cut: 128 and 192 in two rounds on the paper's masks at 40k whose programs
# walk long rows but whose tiles the mask cuts more (longca_global_window
# 2.3 %, full_document 1.8 %, causal_blockwise 1.3 %) or less
# (prefix_lm_causal 0.4 %) than the rule's 1 % (schedule.WIDE_MAX_CUT_SHARE).
# Written before: 192 loses on the first three (-3 to 0 %), gains +1 to +3 %
# on prefix_lm_causal.
set -uo pipefail
usage="usage: $0 OUT COMMIT check|ab|paper|cut"
source "$(dirname "$0")/pack.sh"
lab_start "$@"
case $part in
  check)
    kernel_gpu_test wide_key_block 180
    check_every_family check-wide block_k=192 --directions=fwd ;;
  ab)
    ab_rounds block_k "${LCAB_LAB_SECONDS:-270}" "128 192" --directions=fwd \
      --seqlens="${LCAB_LAB_SEQLENS:-24k,32k,64k}" \
      --masks="${LCAB_LAB_MASKS:-full,causal,full_document,sliding_window_causal}" ;;
  paper)  # the paper's masks at 32k and 40k: 128, 192 and the default (block_k unset)
    flagfile=experiments/paper.flags
    ab_rounds block_k "${LCAB_LAB_SECONDS:-150}" "128 192 default" --directions=fwd \
      --seqlens=32k,40k \
      --masks=full,longca_global_window,prefix_lm_causal,causal_blockwise,full_document ;;
  cut)
    flagfile=experiments/paper.flags
    ab_rounds block_k "${LCAB_LAB_SECONDS:-120}" "128 192" --directions=fwd --seqlens=40k \
      --masks=longca_global_window,full_document,causal_blockwise,prefix_lm_causal ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
summaries "$out"
