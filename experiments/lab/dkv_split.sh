#!/usr/bin/env bash
# Should short sequences split each K/V head's dK/dV programs over its query
# heads? On one GPU, pallas_flex's backward with dkv_split=auto (v22, the
# default since: 64:8 heads at 1k make 64 dK/dV programs for 132 SMs, and
# a causal pass waits on its heaviest; auto splits where its estimate says
# the pass shortens, schedule.dkv_split) against 1 (every row before it).
# check: all 16 families at 1k with auto, the full-size check on, and
# ptxas's report; ab: 1 and auto in turn (one round a call,
# LCAB_LAB_ROUNDS) on four masks at 1k, 2k and 4k, forward and backward:
# on an H200 auto split full 1k, causal and causal_document 1k and 2k
# and left the rest at 1, which show the runs' drift
# (results/gpu/2026-12-02-h200-dkv-split/README.md). Each run writes
# OUT/<name>/ and its .log, packed into OUT/rows.tgz after each; the last
# lines are one short table per run.
#
#   experiments/lab/dkv_split.sh OUT COMMIT check|ab
#
# COMMIT: the full hash, written out (experiments/README.md says why).
set -uo pipefail
usage="usage: $0 OUT COMMIT check|ab"
source "$(dirname "$0")/pack.sh"
lab_start "$@"
case $part in
  check)
    check_every_family check-auto dkv_split=auto ;;
  ab)
    ab_rounds dkv_split 260 "1 auto" --seqlens="${LCAB_LAB_SEQLENS:-1k,2k,4k}" \
      --masks=full,causal,causal_document,sliding_window_causal ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
summaries "$out"
