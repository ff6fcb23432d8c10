#!/usr/bin/env bash
# Does a kernel part time the same beside others (canonical --parallel) as
# alone? One JAX part (causal at 4k and 8k, every JAX backend, full-size
# check on) runs alone on the first GPU, then on every GPU at once, each
# process pinned to its share of the CPU cores as --parallel pins them;
# the last lines compare each side-by-side copy with the lone run, case by
# case (lcab.experiments.run_record.comparison: within 10 % is the same).
#
#   experiments/lab/parallel_check.sh OUT COMMIT [SEQLENS]   (SEQLENS: 4k,8k)
set -euo pipefail
out=${1:?usage: $0 OUT COMMIT [SEQLENS]}
commit=${2:?usage: $0 OUT COMMIT [SEQLENS]}
seqlens=${3:-4k,8k}
flags=(--flagfile=experiments/seed_blog.flags --framework=jax "--seqlens=$seqlens" --masks=causal
       "--git_commit=$commit" --noprogress --nosummary)
gpus=$(nvidia-smi -L | wc -l)
cores=$(nproc)
share=$((cores / gpus))
CUDA_VISIBLE_DEVICES=0 taskset -c 0-$((share - 1)) \
  python3 -m lcab.experiments "${flags[@]}" --out="$out/alone"
for gpu in $(seq 0 $((gpus - 1))); do
  CUDA_VISIBLE_DEVICES=$gpu taskset -c $((gpu * share))-$(((gpu + 1) * share - 1)) \
    python3 -m lcab.experiments "${flags[@]}" --out="$out/beside-$gpu" &
done
wait
for gpu in $(seq 0 $((gpus - 1))); do
  python3 - "$out" "$gpu" <<'PY'
import pathlib, sys
from lcab.experiments.run_record import comparison
out, gpu = pathlib.Path(sys.argv[1]), sys.argv[2]
lines, worst = comparison(out / "alone", out / f"beside-{gpu}")
print(f"GPU {gpu} beside the others, against GPU 0 alone: {lines[-1].strip()}")
PY
done
