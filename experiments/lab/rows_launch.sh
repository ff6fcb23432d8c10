#!/usr/bin/env bash
# Should the Mosaic forward run its rows head after head? On one GPU, the
# forward with rows_launch=heads_together and head_major in
# turn, twice (A/B/A/B), on the seed blog's six masks at 16k, 32k and 64k,
# forward only, full-size check on. Under forward_grid=auto the order is
# the per-item grid's launch order where rows are long (full and causal
# from 32k) and the persistent grid's deal of items elsewhere (v23).
# v9's A/B (results/gpu/2026-11-28-h200-rows-launch/) had head after head
# +2-3 % on full and causal at 32k and left the document masks and other
# lengths unsettled (docs/pallas_flex.md, "Launch orders"): this decides a
# default, or a rule by plan (run 2026-12-04 on an H200, v25: the rule
# rows_launch=auto by the keys a program walks, results/gpu/
# 2026-12-04-h200-rows-launch/). Each run writes OUT/<order>-<round>/ and its
# .log, packed into OUT/rows.tgz after each; the last lines are one short
# table per run.
#
#   experiments/lab/rows_launch.sh OUT COMMIT
#
# COMMIT: the full hash, written out (experiments/README.md says why).
# LCAB_LAB_ROUNDS (default "1 2") runs some rounds only (one a call);
# LCAB_LAB_SEQLENS (default 16k,32k,64k) and LCAB_LAB_MASKS (default the six)
# shrink it.
#
# dQ's order (still heads together under auto): LCAB_LAB_VALUES="auto
# head_major" LCAB_LAB_DIRECTIONS=fwd,bwd LCAB_LAB_MASKS=full,causal
# LCAB_LAB_SEQLENS=32k,64k LCAB_LAB_SECONDS=240, one round a call. Where rows
# are long both arms run the forward head after head, so the backward's
# difference is dQ's order alone (head_major pins it head after head too);
# the forward, the same in both arms, is the call's control. Written before
# any run: dQ walks its row's K/V as the forward does, so the same L2 reading
# predicts dQ +2-4 % at 32k-64k, the backward (dQ about 0.38 of its time)
# +0.7-1.5 %; a default for dQ (auto following the forward) if both rounds
# gain beyond the forward's spread between the arms.
set -uo pipefail
usage="usage: $0 OUT COMMIT"
source "$(dirname "$0")/pack.sh"
lab_start "$1" "${2:-}" rows_launch
ab_rounds rows_launch "${LCAB_LAB_SECONDS:-270}" "${LCAB_LAB_VALUES:-heads_together head_major}" \
  --seqlens="${LCAB_LAB_SEQLENS:-16k,32k,64k}" --directions="${LCAB_LAB_DIRECTIONS:-fwd}" \
  ${LCAB_LAB_MASKS:+--masks=$LCAB_LAB_MASKS}
summaries "$out"
