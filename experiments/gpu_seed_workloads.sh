#!/usr/bin/env bash
# The seeds' workloads on one GPU, in parts that each fit one 10-minute call
# of the device tool, rows in OUT/rows/PART/ (--resume continues a part that
# ran out of time when those rows are there):
#
#   experiments/gpu_seed_workloads.sh OUT blog
#       the seed blog's document masks (full_document, causal_document,
#       varlen_block_causal: magi_pack documents) at 16k, 32k and 64k,
#       pallas_flex.flags' setting
#   experiments/gpu_seed_workloads.sh OUT paper
#       the paper's fourteen masks at 32k (pallas_flex_paper.flags: longca
#       documents, longca_global_window, the paper's block-sparse masks)
#   experiments/gpu_seed_workloads.sh OUT sparsity
#       the paper's sparsity sweep at 16k (paper_block_sparse.flags, and
#       paper_var_block_sparse.flags at average blocks 128 and 512)
#
# Each part runs jax.pallas_flex, jax.fa3 and jax.cudnn in one process, then
# torch.flex in another, the full-size check on. Set LCAB_COMMIT to the
# commit being measured; LCAB_DEADLINE (seconds, default 560) bounds the part.
set -u
out=$1 part=$2
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
deadline=$((SECONDS + ${LCAB_DEADLINE:-560}))
left() { echo $((deadline - SECONDS > 1 ? deadline - SECONDS : 1)); }
case $part in
  blog) runs=("--flagfile=experiments/pallas_flex.flags --masks=full_document,causal_document,varlen_block_causal --seqlens=16k,32k,64k") ;;
  paper) runs=("--flagfile=experiments/pallas_flex_paper.flags --seqlens=32k") ;;
  sparsity) runs=("--flagfile=experiments/paper_block_sparse.flags --seqlens=16k"
                  "--flagfile=experiments/paper_var_block_sparse.flags --seqlens=16k --sparse_block=128,512") ;;
  *) echo "part $part is not blog, paper or sparsity" >&2; exit 2 ;;
esac
rows=$out/rows/$part
mkdir -p "$rows"
for run in "${runs[@]}"; do
  for framework in jax torch; do
    backends=jax.pallas_flex,jax.fa3,jax.cudnn
    [ "$framework" = torch ] && backends=torch.flex
    # shellcheck disable=SC2086 # $run is a list of flags
    timeout "$(left)" python3 -m lcab.experiments $run --framework=$framework \
      --backends=$backends --resume --git_commit="${LCAB_COMMIT:-unknown}" --noprogress \
      --nosummary --out="$rows" >>"$rows/log" 2>&1
    echo "$part $framework: exit $? at $SECONDS s" >>"$rows/log"
  done
done
tail -n 4 "$rows/log"
python3 -m lcab.report --results "$rows" --summary 2>&1 | tail -n 40
