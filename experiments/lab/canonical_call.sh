#!/bin/bash
# One device call that continues the canonical sweeps on a one-GPU machine
# whose checkout is a fresh copy of the tree (rows written into it would be
# lost): the committed runs under results/ are copied to /tmp/r, each SPEC
# whose card matches this machine's runs in turn within BUDGET_S seconds
# (`python -m lcab.experiments.canonical --results_root=/tmp/r`, so the
# card picks the run folder), and /tmp/r is packed into OUT/rows.tgz after
# each, so a call cut short keeps what it measured. Unpack the archive over
# results/ to bring the rows and records back.
#
#   canonical_call.sh OUT COMMIT BUDGET_S 'h100 blog' 'h200 paper' \
#       'h200 blog --out=@R/2026-11-27-h200-blog --parts=changed --measure_again=changed'
#
# A SPEC is the card's short name (h100, h200: a substring of nvidia-smi's
# name), the sweep, and flags for the runner (split at spaces, so no value
# may hold one); @R stands for /tmp/r. Run it with the GPU wheels installed
# on PYTHONPATH (tokamax, flash_attn3_jax); for the tree and the wheels to
# fit one call, leave the settled studies (results/gpu, results/model,
# results/cpu, the CP runs, docs/results) out of the copy: the code the
# sweeps run does not read them.
set -u
usage="usage: canonical_call.sh OUT COMMIT BUDGET_S 'CARD SWEEP [FLAGS]'..."
out=${1:?$usage}
commit=${2:?$usage}
budget=${3:?$usage}
shift 3
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# tokamax imports xprof only for a profiling helper LCAB never calls; its
# wheel (32 MB) does not fit beside the others (delete it from the wheel
# folder before carrying that), so an empty module stands in, in
# /tmp/site, where the wheels' install line puts them (on PYTHONPATH).
if ! python3 -c "import xprof" 2>/dev/null; then
  stub=/tmp/site/xprof/cli/tools
  mkdir -p "$stub"
  touch /tmp/site/xprof/__init__.py /tmp/site/xprof/cli/__init__.py \
    "$stub/__init__.py" "$stub/get_kernel_stats_tool.py"
fi

root=/tmp/r
mkdir -p "$out"
# A machine still warm from an earlier call keeps that call's rows here,
# newer than the tree's copy of them: copying over them would lose them.
if [ -d "$root" ]; then
  echo "going on with $root from an earlier call on this machine"
else
  mkdir -p "$root" && cp -r results/20* "$root/"
fi
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr '[:upper:]' '[:lower:]')
echo "card: $card"
end=$((SECONDS + budget))
for spec in "$@"; do
  read -r want sweep flags <<<"$spec"
  [[ "$card" == *"$want"* ]] || continue
  left=$((end - SECONDS))
  [ "$left" -lt 60 ] && break
  echo "== $sweep ${flags:-} ($left s left)"
  # shellcheck disable=SC2086  # the flags split into words on purpose
  python3 -m lcab.experiments.canonical "$sweep" --results_root="$root" --budget_s="$left" \
    --git_commit="$commit" ${flags//@R/$root}
  tar czf "$out/rows.tgz.part" -C "$root" . && mv "$out/rows.tgz.part" "$out/rows.tgz"
done
