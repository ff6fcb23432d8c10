#!/usr/bin/env bash
# The CP measurements of issues #7, #8 and #10 on one machine of 4 GPUs,
# in parts that each fit one 10-minute call of the device tool:
#
#   experiments/gpu_cp_session.sh OUT PART [PART ...]
#
# Parts (rows land in OUT/PART/):
#   comm        the collectives alone over 2 and 4 GPUs (JAX)
#   jax_cp2     JAX: jax.pallas_flex on one GPU at 16k and 64k, then every JAX
#               strategy at cp 2 on them (8k and 32k tokens per GPU)
#   jax_cp4     the same at cp 4 and 32k, 128k (8k and 32k per GPU)
#   torch_cp2   torch: torch.flex (every mask) and torch.sdpa_cudnn (full,
#               causal) on one GPU, then every torch strategy at cp 2
#   torch_cp4   the same at cp 4
#   profile     jax.cp_ring and jax.cp_allgather at cp 2, 64k, full and
#               causal_document, each run once more under JAX's profiler:
#               PART/overlap.md says how much of the transfers the compute hid
#               (lcab.trace_overlap); the traces are copied to PART/ flat
#
# Four masks (full, causal, full_document, causal_document), 64:8 heads,
# d=128, bf16, the balanced dispatch (experiments/cp_*.flags), one warm-up
# and three timed repeats (fewer than common.flags' 3 + 10, to fit the
# session's device time). A part that runs past its limit keeps the rows it
# wrote. Set LCAB_COMMIT to the commit being measured; LCAB_EXTRA_ARGS is
# appended to every run (a CPU dry run: "--seqlens=512 --heads=4:2"). The
# torch parts need yunchang (experiments/cp_torch.flags says how to carry it).
set -u
out=$1
shift
export XLA_PYTHON_CLIENT_PREALLOCATE=false NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
common=(--git_commit="${LCAB_COMMIT:-unknown}" --noprogress --nosummary --warmup=1 --iters=3)

lcab() {  # LIMIT_SECONDS DIR ARGS...: one CLI run, its output in DIR/log
  local limit=$1 dir=$2
  shift 2
  mkdir -p "$dir"
  echo "== $(date -u +%H:%M:%S) $*"
  timeout "$limit" python3 -m lcab.experiments "$@" "${common[@]}" --out="$dir" ${LCAB_EXTRA_ARGS:-} >>"$dir/log" 2>&1
  echo "   exit $? after $SECONDS s"
}

single() {  # FRAMEWORK SEQLENS DIR: the single-GPU kernels CP is compared with
  if [ "$1" = jax ]; then
    lcab 150 "$3" --flagfile=experiments/cp_jax.flags --suite=kernel \
      --backends=jax.pallas_flex --seqlens="$2"
  else
    lcab 150 "$3" --flagfile=experiments/cp_torch.flags --suite=kernel \
      --backends=torch.flex --seqlens="$2"
    lcab 60 "$3" --flagfile=experiments/cp_torch.flags --suite=kernel \
      --backends=torch.sdpa_cudnn --masks=full,causal --seqlens="$2"
  fi
}

for part in "$@"; do
  dir=$out/$part
  case $part in
    comm) lcab 60 "$dir" --suite=comm --framework=jax --comm_ranks=2,4 ;;
    jax_cp2) single jax 16k,64k "$dir"
      lcab 330 "$dir" --flagfile=experiments/cp_jax.flags --cp_size=2 --seqlens=16k,64k ;;
    jax_cp4) lcab 360 "$dir" --flagfile=experiments/cp_jax.flags --cp_size=4 --seqlens=32k,128k
      single jax 32k,128k "$dir" ;;
    torch_cp2) single torch 16k,64k "$dir"
      lcab 330 "$dir" --flagfile=experiments/cp_torch.flags --cp_size=2 --seqlens=16k,64k ;;
    torch_cp4) lcab 360 "$dir" --flagfile=experiments/cp_torch.flags --cp_size=4 \
        --seqlens=32k,128k
      single torch 32k,128k "$dir" ;;
    profile) lcab 300 "$dir" --flagfile=experiments/cp_jax.flags --cp_size=2 --seqlens=64k \
        --masks=full,causal_document --backends=jax.cp_ring,jax.cp_allgather \
        --profile_dir="$dir/traces"
      python3 -m lcab.trace_overlap "$dir/traces" >"$dir/overlap.md" 2>&1
      cat "$dir/overlap.md"
      for trace in "$dir"/traces/*/plugins/profile/*/perfetto_trace.json.gz; do
        case_dir=${trace#"$dir"/traces/}
        cp "$trace" "$dir/${case_dir%%/*}.perfetto_trace.json.gz"
      done ;;
    *) echo "unknown part $part (comm, jax_cp2, jax_cp4, torch_cp2, torch_cp4, profile)"
      exit 2 ;;
  esac
  python3 - "$dir" <<'EOF'
import sys
import pandas as pd
from lcab import results
frame = results.load([sys.argv[1]])
if len(frame):
    frame["tflops"] = frame["tflops"].round(0)
    cols = ["backend", "cp_size", "mask", "seqlen", "direction", "status", "tflops", "compile_s"]
    print(frame[cols].to_string(index=False, max_rows=200))
EOF
done
