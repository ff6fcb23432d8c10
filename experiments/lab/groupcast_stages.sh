#!/usr/bin/env bash
# Does overlapping group-cast's transfer with the own keys' kernel pay (and
# does a dispatch by kernel tiles)?
# jax.cp_groupcast at stages 1, 2 and 3 beside jax.cp_allgather (the best
# other JAX strategy on documents at cp 4), at cp CP with 8k tokens per GPU
# on both document masks, then pallas_flex alone at the same global length:
# one machine, one call. Each run writes under OUT/<name>/; the last lines
# are one short table of every row (python -m lcab.report --summary).
#
#   experiments/lab/groupcast_stages.sh OUT COMMIT [CP] [TRANSFER] [DISPATCH]
#       CP: 4 (default) or 2; TRANSFER: all_to_all (default) or shifts;
#       DISPATCH: balanced (default), tile_balanced or another of lcab.cp's
set -uo pipefail
out=${1:?usage: $0 OUT COMMIT [CP] [TRANSFER] [DISPATCH]}
commit=${2:?usage: $0 OUT COMMIT [CP] [TRANSFER] [DISPATCH]}
cp=${3:-4}
transfer=${4:-all_to_all}
dispatch=${5:-balanced}
export XLA_PYTHON_CLIENT_PREALLOCATE=false NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
length="$((8 * cp))k"
flags=(--flagfile=experiments/cp_jax.flags "--cp_size=$cp" "--seqlens=$length"
       --masks=causal_document,full_document "--dispatch=$dispatch" "--git_commit=$commit"
       --noprogress --nosummary --reference_cache=/tmp/lcab-reference-cache)
for stages in 1 2 3; do
  python3 -m lcab.experiments "${flags[@]}" --backends=jax.cp_groupcast \
    "--backend_options=jax.cp_groupcast:stages=$stages,jax.cp_groupcast:transfer=$transfer" \
    --out="$out/groupcast-stages$stages" >"$out/groupcast-stages$stages.log" 2>&1
  echo "groupcast stages=$stages: exit $?"
done
python3 -m lcab.experiments "${flags[@]}" --backends=jax.cp_allgather --out="$out/allgather" \
  >"$out/allgather.log" 2>&1
echo "allgather: exit $?"
python3 -m lcab.experiments "${flags[@]}" --suite=kernel --backends=jax.pallas_flex \
  --out="$out/one-gpu" >"$out/one-gpu.log" 2>&1
echo "one GPU: exit $?"
for run in groupcast-stages1 groupcast-stages2 groupcast-stages3 allgather one-gpu; do
  python3 -m lcab.report --results="$out/$run" --summary 2>/dev/null | grep '^|'
done
