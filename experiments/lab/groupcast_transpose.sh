#!/usr/bin/env bash
# Does group-cast's backward gain from summing each chunk's returned dK/dV
# by a fixed table (transpose=gather) instead of JAX's scatter-add
# (transpose=scatter, the default)? One call, one machine of 4 GPUs, one run
# after another on the same GPUs, at cp 4, 8k tokens per GPU, on
# causal_document and full_document: scatter and gather alternated
# (A/B/A/B). Predicted (docs/context_parallel.md, written before any run):
# backward +1 to +3 % on causal_document and +0.5 to +2 % on full_document,
# the forward unchanged. Each run writes OUT/<name>/ and OUT/<name>.log,
# packed after each run into OUT/rows.tgz (pack.sh says why); the last
# lines are one short table per run.
#
#   experiments/lab/groupcast_transpose.sh OUT COMMIT
set -uo pipefail
out=${1:?usage: $0 OUT COMMIT}
commit=${2:?usage: $0 OUT COMMIT}
export XLA_PYTHON_CLIENT_PREALLOCATE=false NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
mkdir -p "$out"
source "$(dirname "$0")/pack.sh"
run() {  # name, transpose
  run_packed "$out" "$1" python3 -m lcab.experiments --flagfile=experiments/cp_jax.flags \
    "--git_commit=$commit" --seqlens=32k --masks=causal_document,full_document --noprogress \
    --nosummary --reference_cache=/tmp/lcab-reference-cache --out="$out/$1" --cp_size=4 \
    --backends=jax.cp_groupcast "--backend_options=jax.cp_groupcast:transpose=$2"
}
run scatter-1 scatter
run gather-1 gather
run scatter-2 scatter
run gather-2 gather
summaries "$out"
