#!/usr/bin/env bash
# Do the Mosaic kernels' launch orders, now as named (docs/pallas_flex.md,
# v9), pay? One call, one machine: pallas_flex alone with the dK/dV launch
# forced each way and with auto (which of the forced runs each mask's
# rows ran before v9: "head_major" on documents at 16k-32k, "heads_together"
# on full and causal from 32k), and the forward and dQ head after head;
# with 2 GPUs, group-cast at cp 2 (8k tokens per GPU) with its inner
# pallas_flex the same ways. With 4 GPUs or more the kernel runs go side by
# side, one GPU each, and then the two group-cast runs, two GPUs each (each
# run's log names its GPUs). Each run writes OUT/<name>/ and OUT/<name>.log,
# packed into OUT/rows.tgz after each run or batch of runs side by side
# (pack.sh says why); the last lines are one short table per run.
#
#   experiments/lab/launch_orders.sh OUT COMMIT [kernel|cp|both]
set -uo pipefail
out=${1:?usage: $0 OUT COMMIT [kernel|cp|both]}
commit=${2:?usage: $0 OUT COMMIT [kernel|cp|both]}
what=${3:-both}
export XLA_PYTHON_CLIENT_PREALLOCATE=false NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
source "$(dirname "$0")/pack.sh"
run() {  # GPUs ("" for all), name, then lcab.experiments flags; in the background with 4+ GPUs
  local devices=$1 name=$2; shift 2
  RUNS+=("$name")
  (
    if [[ -n $devices && $gpus -ge 4 ]]; then export CUDA_VISIBLE_DEVICES=$devices; fi
    echo "GPUs: ${CUDA_VISIBLE_DEVICES:-all}" >"$out/$name.log"
    python3 -m lcab.experiments --flagfile=experiments/cp_jax.flags "--git_commit=$commit" \
      --noprogress --nosummary --out="$out/$name" "$@" >>"$out/$name.log" 2>&1
    echo "$name: exit $?"
  ) &
  if [[ $gpus -lt 4 ]]; then wait; pack_runs "$out" "${RUNS[@]}"; fi
}
mkdir -p "$out"
if [[ $what != cp ]]; then
  one=(--suite=kernel --backends=jax.pallas_flex --seqlens=16k,32k
       --masks=causal_document,full_document,full,causal)
  run 0 kernel-auto "${one[@]}"
  run 1 kernel-dkv_head_major "${one[@]}" --backend_options=jax.pallas_flex:dkv_launch=head_major
  run 2 kernel-dkv_heads_together "${one[@]}" \
    --backend_options=jax.pallas_flex:dkv_launch=heads_together
  run 3 kernel-rows_head_major "${one[@]}" --backend_options=jax.pallas_flex:rows_launch=head_major
  wait
  pack_runs "$out" "${RUNS[@]}"
fi
if [[ $what != kernel ]]; then
  cp=(--cp_size=2 --seqlens=16k --masks=causal_document,full_document
      --backends=jax.cp_groupcast)
  run 0,1 groupcast-auto "${cp[@]}"
  run 2,3 groupcast-dkv_head_major "${cp[@]}" --backend_options=jax.cp_groupcast:dkv_launch=head_major
  wait
  pack_runs "$out" "${RUNS[@]}"
fi
summaries "$out"
