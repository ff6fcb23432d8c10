#!/usr/bin/env bash
# The Mosaic backward's products issued ahead of their waits (option
# backward_overlap, v17 in docs/pallas_flex.md, its prediction written there
# before any run), against the default, on one GPU:
#   dq    dQ issues S = Q K^T and dP = dO V^T together and waits for S alone,
#         so P's exponentials run while dP's wgmma does
#   dkv   dK/dV likewise for S^T and dP^T, then issues dV += P^T dO before
#         waiting for dP^T, so dS^T runs while dV's wgmma does
#   both  the two (dQ and dK/dV are separate kernels: their times add)
# Parts (one device call each, about 7-8 minutes on an H200):
#   check  every mask family at 2k with backward_overlap=both, forward and
#          backward, full-size check on (a wrong gradient shows as
#          MISMATCH); ptxas's register and spill report per kernel
#          (MOSAIC_GPU_DUMP_PTXAS), beside the default's
#   ab     backward (and forward, which it leaves alone) A/B/C/D/A: default,
#          dq, dkv, both, default; full, causal, causal_document and
#          sliding_window_causal at 16k and 32k
#   kernels  each backward kernel alone (backward_kernels.py) under every
#          overlap, the same four masks at 32k: where the time goes
# Each run writes OUT/<name>/ and OUT/<name>.log, packed after each run
# into OUT/rows.tgz (pack.sh says why). The last lines are one short
# table per run.
#
#   experiments/lab/backward_overlap.sh OUT COMMIT check|ab|kernels
#
# COMMIT: the full hash, written out (experiments/README.md says why).
# LCAB_LAB_SEQLENS (default 16k,32k) and LCAB_LAB_CHECK_SEQLEN (2k) shrink
# it for a rehearsal on a CPU, where the Triton kernels run instead.
set -uo pipefail
usage="usage: $0 OUT COMMIT check|ab|kernels"
out=${1:?$usage}
commit=${2:?$usage}
part=${3:?$usage}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
# backward_kernels.py runs as a script: the checkout must be importable (run from its root).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$out"
source "$(dirname "$0")/pack.sh"
run() {  # name, then lcab.experiments flags
  run_packed "$out" "$1" timeout 600 python3 -m lcab.experiments \
    --flagfile=experiments/seed_blog.flags --framework=jax --backends=jax.pallas_flex \
    "--git_commit=$commit" --noprogress --nosummary --out="$out/$1" "${@:2}"
}
overlap() { echo "--backend_options=jax.pallas_flex:backward_overlap=$1"; }
ptxas() {  # the ptxas report of a run's kernels: registers and spills, counted
  echo "## ptxas, $1: registers and spills per kernel"
  grep -A3 "entry function 'lcab_flex" "$out/$1.log" \
    | grep -oE "entry function '[a-z_]+|[0-9]+ bytes spill stores|Used [0-9]+ registers" \
    | paste -d' ' - - - | sort | uniq -c
}
cut=(--seqlens="${LCAB_LAB_SEQLENS:-16k,32k}"
     --masks=full,causal,causal_document,sliding_window_causal)
case $part in
  check)
    families=$(python3 -c "from lcab.masks import MASK_NAMES; print(','.join(MASK_NAMES))")
    seqlen=--seqlens="${LCAB_LAB_CHECK_SEQLEN:-2k}"
    MOSAIC_GPU_DUMP_PTXAS=1 run check-both --masks="$families" "$seqlen" "$(overlap both)"
    MOSAIC_GPU_DUMP_PTXAS=1 run check-default --masks=full,causal_document "$seqlen"
    ptxas check-both
    ptxas check-default ;;
  ab)
    run default-1 "${cut[@]}"
    run dq "${cut[@]}" "$(overlap dq)"
    run dkv "${cut[@]}" "$(overlap dkv)"
    run both "${cut[@]}" "$(overlap both)"
    run default-2 "${cut[@]}" ;;
  kernels)  # its rows are JSON lines of its own (not the harness's): its table is its log's
    run_packed "$out" kernels timeout 600 python3 experiments/lab/backward_kernels.py \
      --overlaps=none,dq,dkv,both --seqlens=32768 --out="$out/kernels"
    grep '^|' "$out/kernels.log"
    exit ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
summaries "$out"
