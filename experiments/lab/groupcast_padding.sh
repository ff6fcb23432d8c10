#!/usr/bin/env bash
# Does group-cast's backward pay for scatter-adding its padding? One call,
# one machine of 4 GPUs: jax.cp_groupcast at cp 4, 8k tokens per GPU, on
# causal_document and full_document, padding=zeros and the default copy
# alternated (A/B/A/B, so a drift of the machine shows as a difference
# between repeats); the second pair also writes one profiled call per case
# (--profile_dir) for `python -m lcab.trace_overlap` and a per-kernel sum.
# Each run writes OUT/<name>/; the last lines are one short table per run.
# Measured at fcd1851 (results/gpu/2026-11-28-h200x4-groupcast-padding/);
# zeros won and the option left main at bf4c1cc, so rerun it from fcd1851.
#
#   experiments/lab/groupcast_padding.sh OUT COMMIT
set -uo pipefail
out=${1:?usage: $0 OUT COMMIT}
commit=${2:?usage: $0 OUT COMMIT}
export XLA_PYTHON_CLIENT_PREALLOCATE=false NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
mkdir -p "$out"
run() {  # name, then lcab.experiments flags
  local name=$1; shift
  python3 -m lcab.experiments --flagfile=experiments/cp_jax.flags "--git_commit=$commit" \
    --cp_size=4 --seqlens=32k --masks=causal_document,full_document \
    --backends=jax.cp_groupcast --noprogress --nosummary --out="$out/$name" "$@" \
    >"$out/$name.log" 2>&1
  echo "$name: exit $?"
}
zeros=--backend_options=jax.cp_groupcast:padding=zeros
run zeros-1 "$zeros"
run copy-1
run zeros-2 "$zeros" --profile_dir="$out/profile-zeros"
run copy-2 --profile_dir="$out/profile-copy"
for name in zeros-1 copy-1 zeros-2 copy-2; do
  echo "## $name"
  python3 -m lcab.report --results="$out/$name" --summary 2>/dev/null | grep '^|'
done
