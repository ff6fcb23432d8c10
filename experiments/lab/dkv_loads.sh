#!/usr/bin/env bash
# Should the Mosaic dK/dV kernel read a strip's lse and delta before the
# products they follow are issued? On one GPU, pallas_flex's backward with
# dkv_loads=late (the default: lse read after S^T is waited for, delta
# after dV and dP^T are, so their consumers wait on the shared-memory
# load) and early (v28: each read before those products are issued).
# check: all 16 families at 1k with early, forward and backward, the
# full-size check on, under ptxas's report; kernels: dK/dV timed alone
# (experiments/lab/backward_kernels.py) late, early, late, early on four
# masks at 16k and 32k, under ptxas's report; ab: late and early in turn
# through the harness (two rounds, LCAB_LAB_ROUNDS), backward, four masks
# at 16k and 32k. Each run writes OUT/<name>/ and
# its .log, packed into OUT/rows.tgz after each; the last lines are one
# short table per run.
#
#   experiments/lab/dkv_loads.sh OUT COMMIT check|kernels|ab
#
# COMMIT: the full hash, written out (experiments/README.md says why).
#
# Written before any run (v28 in docs/pallas_flex.md): correct on every
# family. The profile (results/gpu/2026-12-06-h100-backward-profile/) puts
# 7.7 % of dK/dV's stall samples on short-scoreboard waits, most on the
# instructions that consume lse and delta right after their loads (dQ,
# which holds both in registers: 0); early hides those loads under the
# matmuls. dK/dV alone +2-5 % on full and causal, +1-4 % on
# causal_document and sliding_window_causal; the whole backward about
# 0.6 of that (dK/dV is 59-60 % of it). A loss like v17's if ptxas spills
# more in dK/dV (lse's 16 registers a thread now live across S^T's
# product, delta's across dV's and dP^T's): under 250 bytes a thread the
# gain should hold. early becomes the default if ab gains beyond the two
# rounds' spread on full and causal and loses nowhere by more than 0.5 %;
# else it leaves main with its rows.
set -uo pipefail
usage="usage: $0 OUT COMMIT check|kernels|ab"
source "$(dirname "$0")/pack.sh"
lab_start "$@"
run() { pallas_flex_run "$@"; }  # name, seconds, then lcab.experiments flags
masks=full,causal,causal_document,sliding_window_causal
case $part in
  check)
    check_every_family check-early dkv_loads=early ;;
  kernels)
    for name in late-1 early-1 late-2 early-2; do
      mkdir -p "$out/kernels-$name"
      MOSAIC_GPU_DUMP_PTXAS=1 run_packed "$out" "kernels-$name" timeout -k 10 \
        "${LCAB_LAB_SECONDS:-130}" python3 experiments/lab/backward_kernels.py --kernels=dkv \
        --masks=$masks --seqlens=16k,32k "--options=dkv_loads=${name%-*}" \
        "--out=$out/kernels-$name/rows.jsonl"
      ptxas_report "$out" "kernels-$name"
      grep '^|' "$out/kernels-$name.log"
    done
    exit 0 ;;
  ab)
    ab_rounds dkv_loads "${LCAB_LAB_SECONDS:-130}" "late early" --directions=bwd \
      --seqlens=16k,32k --masks=$masks ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
summaries "$out"
