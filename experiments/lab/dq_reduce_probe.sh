#!/usr/bin/env bash
# Can a one-pass backward's dQ be summed by bulk reduce-adds from a warp of
# the memory warpgroup without slowing the compute warpgroups, and at a
# 64-key kernel's traffic too? The timing probe of option dq_reduce_probe
# (v30 in docs/pallas_flex.md, its prediction written there before any run)
# in today's dK/dV kernel, on one GPU:
#   none       the default
#   handshake  each strip, each compute warpgroup waits for its staging
#              slot and hands it to the reducer warp (named barriers)
#   reduce     the same, and the warp reduce-adds the slot (64 x 64 float32)
#              into a thrown-away float32 buffer by TMA: a one-pass kernel's
#              dQ traffic at 128 keys a program
#   reduce2    the same twice: about the L2 bytes a 64-key one-pass kernel
#              moves beside the same matmuls
# handshake - none is the handover's cost, reduce - handshake and
# reduce2 - handshake the reduce-adds'. dK and dV stay exact (the full-size
# check still applies); dQ comes from the dQ kernel as always.
# Where the reduce-adds land (option dq_reduce_layout, v31): rows (Q's
# layout, the v30 runs), strips (FA3's: each share one contiguous block),
# rotated (strips, each program's strips shifted so programs in step meet
# no shared strip).
# Parts (one device call each, about 3-8 minutes):
#   check  reduce2 into rotated strips on five families at 2k, forward and
#          backward, full-size check on (a hang ends at the run's timeout),
#          and ptxas's registers and spills beside the default's
#   ab     A/B/C/D/A/B/C/D: none, handshake, reduce, reduce2 (rows), twice;
#          full and causal at 32k, forward and backward (LCAB_LAB_ROUNDS=1,
#          then =2, splits it over two calls)
#   layout handshake, then reduce into rows, strips and rotated, then
#          reduce2 into strips and rotated, twice, as ab (about 7 minutes
#          a round: LCAB_LAB_ROUNDS=1, then =2)
# Each run writes OUT/<name>/ and OUT/<name>.log, packed after each run into
# OUT/rows.tgz (pack.sh says why). The last lines are one short table per run.
#
#   experiments/lab/dq_reduce_probe.sh OUT COMMIT check|ab|layout
#
# COMMIT: the full hash, written out (experiments/README.md says why).
# LCAB_LAB_SEQLENS (default 32k) and LCAB_LAB_CHECK_SEQLEN (2k) shrink it
# for a rehearsal on a CPU, where the Triton kernels run instead.
set -uo pipefail
usage="usage: $0 OUT COMMIT check|ab|layout"
source "$(dirname "$0")/pack.sh"
lab_start "$@"
# probe PROBE [LAYOUT]: the run's flag for dq_reduce_probe (and dq_reduce_layout).
probe() {
  echo "--backend_options=jax.pallas_flex:dq_reduce_probe=$1${2:+,jax.pallas_flex:dq_reduce_layout=$2}"
}
cut=(--seqlens="${LCAB_LAB_SEQLENS:-32k}" --masks=full,causal)
case $part in
  check)
    seqlen=--seqlens="${LCAB_LAB_CHECK_SEQLEN:-2k}"
    masks=--masks=full,causal,causal_document,sliding_window_causal,var_block_sparse
    MOSAIC_GPU_DUMP_PTXAS=1 run check-reduce2 300 "$masks" "$seqlen" "$(probe reduce2 rotated)"
    MOSAIC_GPU_DUMP_PTXAS=1 run check-none 150 --masks=full "$seqlen" "$(probe none)"
    ptxas_report "$out" check-reduce2
    ptxas_report "$out" check-none ;;
  ab)
    ab_rounds dq_reduce_probe 150 "none handshake reduce reduce2" "${cut[@]}" ;;
  layout)
    for round in ${LCAB_LAB_ROUNDS:-1 2}; do
      for pair in handshake:rows reduce:rows reduce:strips reduce:rotated reduce2:strips \
          reduce2:rotated; do
        run "${pair/:/-}-$round" 150 "${cut[@]}" "$(probe "${pair%:*}" "${pair#*:}")"
      done
    done ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
summaries "$out"
