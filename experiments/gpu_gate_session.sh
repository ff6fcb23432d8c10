#!/usr/bin/env bash
# The full-size gate on one machine of several GPUs, in parts that each fit
# one 10-minute call of the device tool:
#
#   experiments/gpu_gate_session.sh OUT conformance
#       pytest -m gpu's full-size conformance suite (tests/conformance.py,
#       AtFullSize), LCAB_SHARDS_PER_GPU (default 2) shards per GPU; OUT/conformance.jsonl holds one
#       line per case, OUT/conformance.log the pytest logs, and the summary
#       (experiments/conformance_summary.py) is printed last.
#   experiments/gpu_gate_session.sh OUT table ROWS_DIR
#       the jax.pallas_flex table's cases (experiments/pallas_flex.flags,
#       the seed's six masks at 16k-64k, and pallas_flex_paper.flags, the
#       paper's fourteen at 32k) with jax.pallas_flex, jax.fa3 and
#       jax.cudnn, then torch.flex, the full-size check on. The workloads
#       are split in four shares over the GPUs so that every workload's
#       backends share one GPU; rows go to ROWS_DIR/gpuN/ and --resume continues a part that
#       ran out of time. OUT/table.jsonl gets every row, the summary last.
#
# Set LCAB_COMMIT to the commit being measured; LCAB_DEADLINE (seconds,
# default 560) bounds the whole part, and a run past it keeps its rows.
set -u
out=$1 part=$2
export XLA_PYTHON_CLIENT_PREALLOCATE=false NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
deadline=$((SECONDS + ${LCAB_DEADLINE:-560}))
gpus=$(nvidia-smi -L | wc -l)
# LCAB_GPUS (e.g. "0 2 3") confines the conformance part to those GPUs.
read -r -a gpu_list <<<"${LCAB_GPUS:-$(seq -s ' ' 0 $((gpus - 1)))}"
left() { echo $((deadline - SECONDS > 1 ? deadline - SECONDS : 1)); }

if [ "$part" = conformance ]; then
  shards=$((${LCAB_SHARDS_PER_GPU:-2} * ${#gpu_list[@]}))
  for ((i = 0; i < shards; i++)); do
    CUDA_VISIBLE_DEVICES=${gpu_list[$((i % ${#gpu_list[@]}))]} LCAB_TEST_SHARD="$i/$shards" \
      LCAB_CONFORMANCE_ROWS="$out/rows$i.jsonl" \
      timeout "$(left)" python3 -m pytest -m gpu -q -rfE -p no:cacheprovider --durations=5 \
      tests/test_conformance.py -k AtFullSize >"$out/shard$i.log" 2>&1 &
  done
  wait
  cat "$out"/rows*.jsonl >"$out/conformance.jsonl" 2>/dev/null
  for ((i = 0; i < shards; i++)); do
    echo "=== shard $i/$shards"; cat "$out/shard$i.log"
  done >"$out/conformance.log"
  rm -f "$out"/rows*.jsonl "$out"/shard*.log
  grep -h -E "passed|failed" "$out/conformance.log" | tail -n "$shards"
  python3 experiments/conformance_summary.py "$out/conformance.jsonl"
  exit 0
fi

rows=$3
seed=(--flagfile=experiments/pallas_flex.flags --seqlens=16k,32k,64k)
paper=(--flagfile=experiments/pallas_flex_paper.flags --seqlens=32k)
# Four shares of about equal work (the seed's 64k cases weigh most).
shares=(
  "seed:full,causal"
  "seed:full_document,causal_document,sliding_window_causal,varlen_block_causal"
  "paper:full,causal,sliding_window,sliding_window_causal,longca_global_window,full_document,causal_document"
  "paper:block_causal_document,share_question,causal_blockwise,prefix_lm_document,prefix_lm_causal,block_sparse,var_block_sparse"
)
run_share() {  # GPU SHARE
  local gpu=$1 which=${2%%:*} masks=${2#*:} flags
  if [ "$which" = seed ]; then flags=("${seed[@]}"); else flags=("${paper[@]}"); fi
  mkdir -p "$rows/gpu$gpu"
  for framework in jax torch; do
    local backends=jax.pallas_flex,jax.fa3,jax.cudnn
    [ "$framework" = torch ] && backends=torch.flex
    CUDA_VISIBLE_DEVICES=$gpu timeout "$(left)" python3 -m lcab.experiments "${flags[@]}" \
      --framework=$framework --backends=$backends --masks="$masks" --resume \
      --git_commit="${LCAB_COMMIT:-unknown}" --noprogress --nosummary \
      --out="$rows/gpu$gpu/$which" >>"$rows/gpu$gpu/log" 2>&1
    echo "gpu$gpu $which $framework: exit $? at $SECONDS s" >>"$rows/gpu$gpu/log"
  done
}
# LCAB_SHARES (e.g. "1") runs only those shares, each on the GPU of its index.
if [ -n "${LCAB_SHARES:-}" ]; then
  for s in $LCAB_SHARES; do run_share "$((s % gpus))" "${shares[$s]}" & done
else
  for ((g = 0; g < gpus && g < ${#shares[@]}; g++)); do
    (for ((s = g; s < ${#shares[@]}; s += gpus)); do run_share "$g" "${shares[$s]}"; done) &
  done
fi
wait
find "$rows" -name '*.jsonl' -exec cat {} + >"$out/table.jsonl"
tail -n 3 "$rows"/gpu*/log
python3 -m lcab.report --results "$out/table.jsonl" --summary 2>&1 | tail -n 60
