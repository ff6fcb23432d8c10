#!/usr/bin/env bash
# jax.pallas_flex's forward lowered through Triton and through Mosaic GPU
# (option forward_lowering=mosaic, Hopper only; issue #6), on one GPU:
#
#   experiments/pallas_flex_lowering.sh OUT [check] [speed] [stages] [table] [paper]
#                                           [backward] [mosaic_backward] [flex_table]
#                                           [fused_backward] [fused_check]
#                                           [persistent] [persistent_check]
#
# check: the Mosaic forward on all 14 families at 2k tokens, 8:2 heads,
#   fwd and bwd (the default backward, from its out and lse), one repeat:
#   every row passes the correctness probe or shows MISMATCH.
# speed: the forward of the seed's six masks at LCAB_SEQLENS (16k,32k),
#   64:8 heads, d=128, bf16, one warm-up and five repeats: pallas_flex
#   with each lowering, jax.fa3 in the Triton run's process.
# stages: the speed part's Mosaic run with a 3-slot K/V ring.
# table: the README's kernel table: fwd and bwd of the six masks at
#   LCAB_SEQLENS, pallas_flex (default lowering), jax.fa3 and jax.cudnn in
#   one process, torch.flex in a second.
# paper: the paper's masks outside the seed's six, and full, fwd and bwd
#   at LCAB_SEQLENS (32k), prolong64k documents as in
#   experiments/paper_*_masks.flags: pallas_flex, then torch.flex.
# backward: the Mosaic backward (backward_lowering=mosaic, 128 x 128
#   tiles): the check part's 14 families with it, then the six seed masks
#   at LCAB_SEQLENS, fwd and bwd, with each backward lowering. The Mosaic
#   kernels split each tile into LCAB_BACKWARD_PARTS strips (default 1).
# mosaic_backward: the backward part without its Triton run, the timed
#   rows first.
# flex_table: the table part's pallas_flex rows alone (default options).
# fused_backward: the one-pass Mosaic backward (fused_backward=true;
#   v7): the six seed masks at LCAB_SEQLENS timed, fwd and bwd.
# fused_check: the check part's 14 families with fused_backward=true.
# persistent: the persistent Mosaic forward (forward_persistent=true;
#   v8): the speed part's masks, one process with it and one without
#   (same call).
# persistent_check: the check part's 14 families with forward_persistent=true.
# Rows land in OUT/<part>/<lowering>/; a short table is printed last.
set -u
out=$1
shift
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
all_masks=full,causal,sliding_window,sliding_window_causal,global_sliding_window,full_document,causal_document,block_causal_document,share_question,causal_blockwise,prefix_lm_document,prefix_lm_causal,block_sparse,var_block_sparse
seed_masks=full,causal,full_document,causal_document,sliding_window_causal,block_causal_document
run() {  # DIR ARGS...
  local dir=$1
  shift
  mkdir -p "$dir"
  echo "== $(date -u +%H:%M:%S) $dir"
  timeout "${LCAB_RUN_TIMEOUT:-300}" python3 -m lcab.experiments --suite=kernel --framework=jax \
    --batch=1 --head_dim=128 --dtype=bfloat16 --mask_seed=0 --seed=0 --window=1024 \
    --doc_distribution=chatqa2_long_sft --noprogress --nosummary \
    --git_commit="${LCAB_COMMIT:-unknown}" --out="$dir" "$@" >"$dir/log" 2>&1
  echo "   exit $?"
}
mosaic=--backend_options=jax.pallas_flex:forward_lowering=mosaic
for part in "$@"; do
  case $part in
    check)
      run "$out/check/mosaic" --backends=jax.pallas_flex "$mosaic" --masks=$all_masks \
        --seqlens=2k --heads=8:2 --directions=fwd,bwd --warmup=0 --iters=1 --flush_l2=false ;;
    speed)
      speed=(--masks=$seed_masks --seqlens="${LCAB_SEQLENS:-16k,32k}" --heads=64:8
             --directions=fwd --warmup=1 --iters=5)
      run "$out/speed/mosaic" --backends=jax.pallas_flex "$mosaic" "${speed[@]}"
      run "$out/speed/triton" --backends=jax.pallas_flex,jax.fa3 \
        --backend_options=jax.pallas_flex:forward_lowering=triton "${speed[@]}" ;;
    stages)
      run "$out/stages/mosaic3" --backends=jax.pallas_flex "$mosaic" \
        --backend_options=jax.pallas_flex:forward_stages=3 --masks=$seed_masks \
        --seqlens="${LCAB_SEQLENS:-16k,32k}" --heads=64:8 --directions=fwd --warmup=1 --iters=5 ;;
    table)
      table=(--masks=$seed_masks --seqlens="${LCAB_SEQLENS:-16k,32k}" --heads=64:8
             --directions=fwd,bwd --warmup=1 --iters=5)
      run "$out/table/jax" --backends=jax.pallas_flex,jax.fa3,jax.cudnn "${table[@]}"
      run "$out/table/torch" --framework=torch --backends=torch.flex "${table[@]}" ;;
    fused_backward)
      fused=--backend_options=jax.pallas_flex:fused_backward=true
      run "$out/fused_backward/timed" --backends=jax.pallas_flex "$fused" --masks=$seed_masks \
        --seqlens="${LCAB_SEQLENS:-16k,32k}" --heads=64:8 --directions=fwd,bwd --warmup=1 --iters=5 ;;
    fused_check)
      run "$out/fused_backward/check" --backends=jax.pallas_flex \
        --backend_options=jax.pallas_flex:fused_backward=true --masks=$all_masks \
        --seqlens=2k --heads=8:2 --directions=fwd,bwd --warmup=0 --iters=1 --flush_l2=false ;;
    persistent)
      speed=(--masks=$seed_masks --seqlens="${LCAB_SEQLENS:-16k,32k}" --heads=64:8
             --directions=fwd --warmup=1 --iters=5)
      run "$out/persistent/on" --backends=jax.pallas_flex \
        --backend_options=jax.pallas_flex:forward_persistent=true "${speed[@]}"
      run "$out/persistent/off" --backends=jax.pallas_flex "${speed[@]}" ;;
    persistent_check)
      run "$out/persistent/check" --backends=jax.pallas_flex \
        --backend_options=jax.pallas_flex:forward_persistent=true --masks=$all_masks \
        --seqlens=2k --heads=8:2 --directions=fwd,bwd --warmup=0 --iters=1 --flush_l2=false ;;
    flex_table)
      run "$out/flex_table/${LCAB_SEQLENS:-16k,32k}" --backends=jax.pallas_flex --masks=$seed_masks \
        --seqlens="${LCAB_SEQLENS:-16k,32k}" --heads=64:8 --directions=fwd,bwd --warmup=1 --iters=5 ;;
    paper)
      paper=(--masks=full,sliding_window,global_sliding_window,share_question,causal_blockwise,prefix_lm_document,prefix_lm_causal,block_sparse,var_block_sparse
             --doc_distribution=prolong64k --seqlens="${LCAB_SEQLENS:-32k}" --heads=64:8
             --directions=fwd,bwd --warmup=1 --iters=3)
      run "$out/paper/jax" --backends=jax.pallas_flex "${paper[@]}"
      run "$out/paper/torch" --framework=torch --backends=torch.flex "${paper[@]}" ;;
    backward|mosaic_backward)
      backward=--backend_options=jax.pallas_flex:backward_lowering=mosaic,jax.pallas_flex:backward_parts=${LCAB_BACKWARD_PARTS:-1}
      timed=(--masks=$seed_masks --seqlens="${LCAB_SEQLENS:-16k,32k}" --heads=64:8
             --directions=fwd,bwd --warmup=1 --iters=5)
      check=(--masks=$all_masks --seqlens=2k --heads=8:2 --directions=fwd,bwd --warmup=0
             --iters=1 --flush_l2=false)
      if [ "$part" = backward ]; then
        run "$out/backward/check" --backends=jax.pallas_flex "$backward" "${check[@]}"
        run "$out/backward/mosaic" --backends=jax.pallas_flex "$backward" "${timed[@]}"
        run "$out/backward/triton" --backends=jax.pallas_flex \
          --backend_options=jax.pallas_flex:backward_lowering=triton "${timed[@]}"
      else
        run "$out/mosaic_backward/timed" --backends=jax.pallas_flex "$backward" "${timed[@]}"
        run "$out/mosaic_backward/check" --backends=jax.pallas_flex "$backward" "${check[@]}"
      fi ;;
    *) echo "unknown part $part (check, speed, stages, table, flex_table, paper, backward, mosaic_backward, fused_backward, fused_check, persistent, persistent_check)"; exit 2 ;;
  esac
done
python3 - "$out" <<'PY'
import sys
from lcab import results
frame = results.load([sys.argv[1]])
if len(frame):
    frame["tflops"] = frame["tflops"].round(0)
    frame["max_err"] = frame["max_err"].round(4)
    cols = ["backend", "options", "mask", "seqlen", "direction", "status", "tflops", "max_err"]
    print(frame[cols].to_string(index=False, max_rows=300))
PY
