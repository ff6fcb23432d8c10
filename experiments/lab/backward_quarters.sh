#!/usr/bin/env bash
# Should the Mosaic backward pass over the strips of a partial tile whose
# quarter tiles the mask does not see? On one GPU, pallas_flex's backward
# with backward_quarters=all (the default: every strip of a partial tile
# computed, its unseen pairs masked to zeros) and seen (v29: each
# warpgroup branches on the plan's quarter code and passes over a strip
# whose 64 x 64 quarter holds no pair; exact, since those products add
# nothing, and the same barriers are waited for either way).
# check: the GPU tests (seen against all, bit for bit, and against the
# float64 reference on six families, one and two strips), then all 16
# families at 1k with seen, forward and backward, the full-size check on,
# under ptxas's report; kernels: dQ and dK/dV timed alone
# (experiments/lab/backward_kernels.py), all, seen, all, seen, on the
# documents and the window at 16k and 32k; ab: all and seen in turn (two rounds,
# LCAB_LAB_ROUNDS), backward, the documents and the window at 2k, 16k
# and 32k; guard: the same on full and causal at 16k and 32k. Each run
# writes OUT/<name>/ and its .log, packed into OUT/rows.tgz after each;
# the last lines are one short table per run. LCAB_LAB_SEQLENS narrows
# ab's and guard's lengths (say 2k,16k) where a call's ten minutes would
# not hold them all.
#
#   experiments/lab/backward_quarters.sh OUT COMMIT check|kernels|ab|guard
#
# COMMIT: the full hash, written out (experiments/README.md says why).
#
# Written before any run (v29 in docs/pallas_flex.md): correct and equal
# bit for bit on every family. The plan's quarter codes (numpy, the seed
# blog's masks) put the computed quarters that hold no pair at
# causal_document 30.9 / 23.0 / 5.5 / 3.5 % of all at 1k / 2k / 16k /
# 32k, full_document 25.0 / 17.9 / 3.7 / 2.3 %, sliding_window_causal
# 5.6 % at every length, causal 5.6 / 2.9 / 0.4 / 0.2 %, full 0. A
# skipped strip saves a partial strip's time (about 1.3 full ones), less
# the branch: the backward gains about 0.7-1.2x that share, so
# causal_document +15-30 % at 2k, +3-7 % at 16k, +2-4 % at 32k;
# full_document +12-20 %, +2-4 %, +1.5-3 %; sliding_window_causal
# +3.5-7 %; causal within 1 % at 16k-32k, full within 0.5 %. Two risks
# would shrink it: the two compute warpgroups release each ring slot
# together (two slots), so a warpgroup that passes a strip can run ahead
# by a tile or two only, and the gain falls towards the slower
# warpgroup's (at most 0 on causal's dQ, where only warpgroup 0 passes;
# the window's dQ passes on warpgroup 0 at the diagonal and 1 at the far
# edge, so it balances); and ptxas may spill more in dK/dV across the
# branches (232-280 bytes a thread now). seen becomes the default if ab gains beyond the two
# rounds' spread on every cell and guard loses nowhere by more than
# 0.5 %; else it leaves main with its rows.
set -uo pipefail
usage="usage: $0 OUT COMMIT check|kernels|ab|guard"
source "$(dirname "$0")/pack.sh"
lab_start "$@"
case $part in
  check)
    kernel_gpu_test unseen_quarters 240
    check_every_family check-seen backward_quarters=seen ;;
  kernels)
    for name in all-1 seen-1 all-2 seen-2; do
      mkdir -p "$out/kernels-$name"
      MOSAIC_GPU_DUMP_PTXAS=1 run_packed "$out" "kernels-$name" timeout -k 10 \
        "${LCAB_LAB_SECONDS:-130}" python3 experiments/lab/backward_kernels.py --kernels=dq,dkv \
        --masks=causal_document,full_document,sliding_window_causal --seqlens=16k,32k \
        "--options=backward_quarters=${name%-*}" "--out=$out/kernels-$name/rows.jsonl"
      ptxas_report "$out" "kernels-$name"
      grep '^|' "$out/kernels-$name.log"
    done
    exit 0 ;;
  ab)
    ab_rounds backward_quarters "${LCAB_LAB_SECONDS:-150}" "all seen" --directions=bwd \
      "--seqlens=${LCAB_LAB_SEQLENS:-2k,16k,32k}" --masks=causal_document,full_document,sliding_window_causal ;;
  guard)
    ab_rounds backward_quarters "${LCAB_LAB_SECONDS:-130}" "all seen" --directions=bwd \
      "--seqlens=${LCAB_LAB_SEQLENS:-16k,32k}" --masks=full,causal ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
summaries "$out"
