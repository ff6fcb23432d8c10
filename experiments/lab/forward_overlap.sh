#!/usr/bin/env bash
# Should a Mosaic forward warpgroup run a tile's softmax under the last
# tile's P @ V? On one GPU, pallas_flex's forward with forward_overlap=none
# (the default: each visit waits for its scores, runs the softmax, then
# issues P @ V and waits for it) and intra (v33, FA3's IntraWGOverlap: a
# turn issues tile j's scores and tile j-1's P @ V together, the softmax
# of tile j runs while P @ V does).
# check: the GPU tests (intra against the float64 reference and the
# default on seven families, per item, persistent and at 192 keys, and
# across items that see nothing; with FA3's 240 / 24 registers on three),
# then all 16 families at 1k with intra,
# forward and backward, the full-size check on, under ptxas's report (read
# its spills first: about 192 registers a thread are live at 128 keys,
# about 256 at 192); ab: none and intra in turn (two rounds,
# LCAB_LAB_ROUNDS), forward, full, causal, causal_document and
# sliding_window_causal at 16k and 32k; short: the same at 2k; keys128:
# the default (192-key steps there, v26), then none and intra with
# 128-key steps forced (block_k=128), on full and causal at 32k: if intra spills
# at 192 keys, ab's 32k rows measure the spills, and this part the
# overlap alone (the GPU tests' 192-key kernels are in check's ptxas
# report, the 1k runs' are all 128-key ones); registers: none and intra,
# each with 232 / 40 registers (the default) and FA3's 240 / 24
# (forward_registers=240), on full and causal at 32k (192-key steps),
# under ptxas's report: whether 8 more registers spare intra its spills
# at 192 keys. Each run
# writes OUT/<name>/ and its .log, packed into OUT/rows.tgz after each;
# the last lines are one short table per run. LCAB_LAB_SEQLENS narrows the
# lengths where a call's ten minutes would not hold them all.
#
#   experiments/lab/forward_overlap.sh OUT COMMIT check|ab|short|keys128|registers
#
# COMMIT: the full hash, written out (experiments/README.md says why).
#
# Written before any run (v33 in docs/pallas_flex.md): correct on every
# family, output within a few bf16 steps of the default's. Forward +3-6 %
# on full and causal at 16k-32k at 128-key tiles (FA3 runs this overlap
# and reads 664 against our 623 on full at 32k, +6.6 %), as much or more
# on causal_document and the window, whose per-tile softmax work is the
# larger share (v32); at 192-key tiles a loss if ptxas spills. intra
# becomes the default where ab gains beyond the two rounds' spread on
# every mask and short loses nowhere by more than 0.5 %; else it leaves
# main with its rows.
set -uo pipefail
usage="usage: $0 OUT COMMIT check|ab|short|keys128|registers"
source "$(dirname "$0")/pack.sh"
lab_start "$@"
masks=full,causal,causal_document,sliding_window_causal
case $part in
  check)
    MOSAIC_GPU_DUMP_PTXAS=1 kernel_gpu_test "overlapped or empty_items or register_split" 300
    ptxas_report "$out" gpu-test
    check_every_family check-intra forward_overlap=intra ;;
  ab)
    ab_rounds forward_overlap "${LCAB_LAB_SECONDS:-120}" "none intra" --directions=fwd \
      "--seqlens=${LCAB_LAB_SEQLENS:-16k,32k}" --masks=$masks ;;
  short)
    ab_rounds forward_overlap "${LCAB_LAB_SECONDS:-100}" "none intra" --directions=fwd \
      "--seqlens=${LCAB_LAB_SEQLENS:-2k}" --masks=$masks ;;
  keys128)
    for round in ${LCAB_LAB_ROUNDS:-1 2}; do
      run "default-$round" "${LCAB_LAB_SECONDS:-100}" --directions=fwd --seqlens=32k \
        --masks=full,causal
      for value in none intra; do
        run "$value-keys128-$round" "${LCAB_LAB_SECONDS:-100}" --directions=fwd \
          --seqlens=32k --masks=full,causal \
          "--backend_options=jax.pallas_flex:forward_overlap=$value,jax.pallas_flex:block_k=128"
      done
    done ;;
  registers)
    for round in ${LCAB_LAB_ROUNDS:-1}; do
      for value in none intra; do
        for registers in 232 240; do
          name=$value-registers$registers-$round
          MOSAIC_GPU_DUMP_PTXAS=1 run "$name" "${LCAB_LAB_SECONDS:-100}" --directions=fwd \
            --seqlens=32k --masks=full,causal \
            "--backend_options=jax.pallas_flex:forward_overlap=$value,jax.pallas_flex:forward_registers=$registers"
          ptxas_report "$out" "$name"
        done
      done
    done ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
summaries "$out"
