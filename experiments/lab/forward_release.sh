#!/usr/bin/env bash
# How the Mosaic forward's compute warpgroups hand a used K/V ring slot back
# (option forward_release, v18 in docs/pallas_flex.md, its prediction
# written there before any run), on one GPU, forward only (the backward
# does not take it):
#   mbarrier    the default: every compute thread arrives on the slot's
#               mbarrier, the memory warpgroup polls it
#   named       a non-waiting bar.arrive on the slot's named barrier, met by
#               the memory warpgroup's bar.sync
#   named_warp  the same met by one warp, which alone issues the copies
# Parts (one device call each, about 4-6 minutes on an H200):
#   check  every mask family at 2k with named_warp and three with named,
#          full-size check on (a wrong output shows as MISMATCH; a hang as
#          the run's timeout), and ptxas's registers and spills
#   ab     A/B/C/A/B/C: mbarrier, named, named_warp, twice; full, causal,
#          causal_document and sliding_window_causal at 16k and 32k
# Each run writes OUT/<name>/ and OUT/<name>.log, packed after each run into
# OUT/rows.tgz (pack.sh says why). The last lines are one short table per run.
#
#   experiments/lab/forward_release.sh OUT COMMIT check|ab
#
# COMMIT: the full hash, written out (experiments/README.md says why).
# LCAB_LAB_SEQLENS (default 16k,32k) and LCAB_LAB_CHECK_SEQLEN (2k) shrink
# it for a rehearsal on a CPU, where the Triton kernels run instead.
set -uo pipefail
usage="usage: $0 OUT COMMIT check|ab"
source "$(dirname "$0")/pack.sh"
lab_start "$@"
run() { pallas_flex_run "$@" --directions=fwd; }  # name, seconds, then lcab.experiments flags
release() { echo "--backend_options=jax.pallas_flex:forward_release=$1"; }
case $part in
  check)
    families=$(python3 -c "from lcab.masks import MASK_NAMES; print(','.join(MASK_NAMES))")
    seqlen=--seqlens="${LCAB_LAB_CHECK_SEQLEN:-2k}"
    # named (the barriers) on three families first, then named_warp (the
    # same barriers and the one-warp feed) on every family, unless named
    # hung (its timeout: the pairing of arrivals and waits is wrong): about
    # 30 s a family (compiling).
    MOSAIC_GPU_DUMP_PTXAS=1 run check-named 150 --masks=full,causal_document,sliding_window_causal \
      "$seqlen" "$(release named)"
    if [ "$LAST_EXIT" != 124 ]; then
      MOSAIC_GPU_DUMP_PTXAS=1 run check-named_warp 330 --masks="$families" "$seqlen" \
        "$(release named_warp)"
    fi
    ptxas_report "$out" check-named
    ptxas_report "$out" check-named_warp ;;
  ab)
    cut=(--seqlens="${LCAB_LAB_SEQLENS:-16k,32k}"
         --masks=full,causal,causal_document,sliding_window_causal)
    ab_rounds forward_release 200 "mbarrier named named_warp" "${cut[@]}" ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
summaries "$out"
