#!/usr/bin/env bash
# The Mosaic backward's partial-tile mask tests, per kernel, against the
# default (bounds in both), on one GPU (docs/pallas_flex.md, v14;
# predictions written there before any run):
#   dq_mask_test=offset   dQ tests an element by one unsigned compare, as
#     the forward does since v13 (dQ spilled nothing either way in v12's
#     check): backward +1-2 % on sliding_window_causal and causal_document.
#   dkv_mask_test=folded  dK/dV compares its tile's own query columns
#     against the row's bounds less the tile's first column (per row)
#     instead of adding that column to every element: one operation an
#     element fewer and no per-element column held; +0.5-1.5 % backward
#     there if ptxas spills no more than the default's 244 bytes.
# dQ and dK/dV are separate kernels, so the two options' times add: no run
# of both together.
# Parts (one device call each, about 7 minutes on an H200):
#   check     every mask family at 2k with both options, forward and
#             backward, full-size check on (a wrong mask shows as
#             MISMATCH); ptxas's register and spill report per kernel
#             (MOSAIC_GPU_DUMP_PTXAS)
#   ab        forward and backward, A/B/C/A: default, dq offset, dkv
#             folded, default; sliding_window_causal and causal_document
#             at 16k and 32k
# Each run writes OUT/<name>/ and OUT/<name>.log, packed after each run
# into OUT/rows.tgz (pack.sh says why). The last lines are one short
# table per run.
#
#   experiments/lab/backward_mask_tests.sh OUT COMMIT check|ab
#
# COMMIT: the full hash, written out (experiments/README.md says why).
# LCAB_LAB_SEQLENS (default 16k,32k) and LCAB_LAB_CHECK_SEQLEN (2k) shrink
# it for a rehearsal on a CPU, where the Triton kernels run instead.
set -uo pipefail
usage="usage: $0 OUT COMMIT check|ab"
out=${1:?$usage}
commit=${2:?$usage}
part=${3:?$usage}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
mkdir -p "$out"
source "$(dirname "$0")/pack.sh"
run() {  # name, then lcab.experiments flags
  run_packed "$out" "$1" timeout 600 python3 -m lcab.experiments \
    --flagfile=experiments/seed_blog.flags --framework=jax --backends=jax.pallas_flex \
    "--git_commit=$commit" --noprogress --nosummary --out="$out/$1" "${@:2}"
}
option() { echo "--backend_options=jax.pallas_flex:$1"; }
cut=(--seqlens="${LCAB_LAB_SEQLENS:-16k,32k}" --masks=sliding_window_causal,causal_document)
case $part in
  check)
    families=$(python3 -c "from lcab.masks import MASK_NAMES; print(','.join(MASK_NAMES))")
    MOSAIC_GPU_DUMP_PTXAS=1 run check-options --masks="$families" \
      --seqlens="${LCAB_LAB_CHECK_SEQLEN:-2k}" "$(option dq_mask_test=offset)" \
      "$(option dkv_mask_test=folded)"
    echo "## ptxas, check-options: registers and spills per kernel"
    grep -A3 "entry function 'lcab_flex" "$out/check-options.log" \
      | grep -oE "entry function '[a-z_]+|[0-9]+ bytes spill stores|Used [0-9]+ registers" \
      | paste -d' ' - - - | sort | uniq -c ;;
  ab)
    run default-1 "${cut[@]}"
    run dq-offset "${cut[@]}" "$(option dq_mask_test=offset)"
    run dkv-folded "${cut[@]}" "$(option dkv_mask_test=folded)"
    run default-2 "${cut[@]}" ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
summaries "$out"
