#!/usr/bin/env bash
# The Mosaic forward's "one_sided" partial-tile test against its default
# ("offset"), on one GPU (docs/pallas_flex.md, v16; prediction written
# there before any run): a partial tile that a single slice cuts on one
# side only (a causal diagonal, a window's far edge, a document's first
# columns) is tested by one compare an element, a tile whose rows each see
# all of it or none by a select on the row, any other as before.
# Parts (one device call each, about 7 minutes on an H200):
#   check   every mask family at 2k with the option, forward and backward,
#           full-size check on (a wrong mask shows as MISMATCH); ptxas's
#           register and spill report per kernel (MOSAIC_GPU_DUMP_PTXAS)
#   ab      forward only, A/B/A/B: default, one_sided, default, one_sided;
#           sliding_window_causal, causal_document, causal and full_document
#           at 16k and 32k
# Each run writes OUT/<name>/ and OUT/<name>.log, packed after each run
# into OUT/rows.tgz (pack.sh says why). The last lines are one short
# table per run.
#
#   experiments/lab/one_sided_tiles.sh OUT COMMIT check|ab
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
one_sided=--backend_options=jax.pallas_flex:forward_mask_test=one_sided
cut=(--seqlens="${LCAB_LAB_SEQLENS:-16k,32k}" --directions=fwd
     --masks=sliding_window_causal,causal_document,causal,full_document)
case $part in
  check)
    families=$(python3 -c "from lcab.masks import MASK_NAMES; print(','.join(MASK_NAMES))")
    MOSAIC_GPU_DUMP_PTXAS=1 run check-one_sided --masks="$families" \
      --seqlens="${LCAB_LAB_CHECK_SEQLEN:-2k}" "$one_sided"
    echo "## ptxas, check-one_sided: registers and spills per kernel"
    grep -A3 "entry function 'lcab_flex" "$out/check-one_sided.log" \
      | grep -oE "entry function '[a-z_]+|[0-9]+ bytes spill stores|Used [0-9]+ registers" \
      | paste -d' ' - - - | sort | uniq -c ;;
  ab)
    run default-1 "${cut[@]}"
    run one_sided-1 "${cut[@]}" "$one_sided"
    run default-2 "${cut[@]}"
    run one_sided-2 "${cut[@]}" "$one_sided" ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
summaries "$out"
