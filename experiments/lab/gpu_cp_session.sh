#!/usr/bin/env bash
# The CP measurements (both frameworks' strategies, the attention module,
# the collectives, profiles) on one machine of several GPUs, in parts that
# each fit one 10-minute call of the device tool:
#
#   experiments/lab/gpu_cp_session.sh OUT PART [PART ...]
#
# Parts (rows land in OUT/<part, with ':' ',' '+' as '_'>/):
#   FRAMEWORK:CP:TOKENS   e.g. jax:2:8k,32k or torch:4:8k -- the single-GPU
#                         kernels at the global lengths (TOKENS per GPU x CP),
#                         then every strategy of experiments/cp_FRAMEWORK.flags
#                         at cp CP (JAX: jax.pallas_flex inside and alone;
#                         torch: torch.flex, and torch.sdpa_cudnn for the
#                         native strategy on full and causal)
#   FRAMEWORK:CP:TOKENS:BACKENDS[:MASKS]
#                         only these strategies ('+' between names) on these
#                         masks (default: the flagfile's four), no single-GPU
#                         rows, e.g. jax:4:32k:jax.cp_usp+jax.cp_double_ring
#   single:FRAMEWORK:LENGTHS[:MASKS]
#                         the single-GPU kernels alone at these global lengths
#   module:CP             jax.module, the seed's and the paper's layer
#                         (experiments/module_*.flags), 8k tokens per GPU
#   comm                  the collectives alone over 2 and 4 GPUs (JAX, torch)
#   profile               jax.cp_ring and jax.cp_allgather at cp 2, 64k, full
#                         and causal_document, once more under JAX's profiler:
#                         PART/overlap.md says how much of the transfers the
#                         compute hid (lcab.trace_overlap); traces copied flat
#
# Four masks (full, causal, full_document, causal_document), 64:8 heads,
# d=128, bf16, the balanced dispatch (experiments/cp_*.flags), common.flags'
# 3 warm-ups (then the runtime's steady warm-up) and 10 timed repeats. Each run has a time limit; a run past it keeps
# the rows it wrote. Set LCAB_COMMIT to the commit being measured;
# LCAB_EXTRA_ARGS is appended to every run (a CPU dry run: "--seqlens=512
# --heads=4:2"); LCAB_LIMIT (seconds) replaces every run's own time limit.
# The torch parts need yunchang (experiments/cp_torch.flags says how to
# carry it). After each part, its rows' short table (python -m lcab.report
# --summary).
set -u
out=$1
shift
export XLA_PYTHON_CLIENT_PREALLOCATE=false NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
common=(--git_commit="${LCAB_COMMIT:-unknown}" --noprogress --nosummary --warmup=3 --iters=10
        --reference_cache=/tmp/lcab-reference-cache)  # each run checks the same workloads

lcab() {  # LIMIT_SECONDS DIR ARGS...: one CLI run, its output in DIR/log
  local limit=$1 dir=$2
  shift 2
  mkdir -p "$dir"
  echo "== $(date -u +%H:%M:%S) $*"
  timeout "$limit" python3 -m lcab.experiments "$@" "${common[@]}" --out="$dir" \
    ${LCAB_EXTRA_ARGS:-} >>"$dir/log" 2>&1
  echo "   exit $? after $SECONDS s"
}

limit_for() {  # DEFAULT_SECONDS: LCAB_LIMIT (seconds) overrides a part's limit
  echo "${LCAB_LIMIT:-$1}"
}

global_lengths() {  # CP TOKENS_PER_GPU_LIST -> global lengths, e.g. 2 8k,32k -> 16k,64k
  local cp=$1 out="" tokens
  for tokens in ${2//,/ }; do
    out="$out,$(( ${tokens%k} * cp ))k"
  done
  echo "${out#,}"
}

singles() {  # FRAMEWORK GLOBAL_LENGTHS DIR [MASKS]: the kernels CP is compared with
  local masks=(${4:+--masks="$4"})
  if [ "$1" = jax ]; then
    lcab "$(limit_for 150)" "$3" --flagfile=experiments/cp_jax.flags --suite=kernel \
      --backends=jax.pallas_flex --seqlens="$2" "${masks[@]}"
  else
    lcab "$(limit_for 120)" "$3" --flagfile=experiments/cp_torch.flags --suite=kernel \
      --backends=torch.flex --seqlens="$2" "${masks[@]}"
    lcab "$(limit_for 40)" "$3" --flagfile=experiments/cp_torch.flags --suite=kernel \
      --backends=torch.sdpa_cudnn --masks=full,causal --seqlens="$2"
  fi
}

strategies() {  # FRAMEWORK CP TOKENS DIR [BACKENDS [MASKS]]
  local lengths extra=()
  lengths=$(global_lengths "$2" "$3")
  [ -z "${5:-}" ] && singles "$1" "$lengths" "$4"
  [ -n "${5:-}" ] && extra+=(--backends="${5//+/,}")
  [ -n "${6:-}" ] && extra+=(--masks="$6")
  if [ "$1" = jax ]; then
    lcab "$(limit_for 400)" "$4" --flagfile=experiments/cp_jax.flags --cp_size="$2" \
      --seqlens="$lengths" "${extra[@]}"
  else
    lcab "$(limit_for 400)" "$4" --flagfile=experiments/cp_torch.flags --cp_size="$2" \
      --seqlens="$lengths" "${extra[@]}"
  fi
}

for part in "$@"; do
  dir=$out/$(echo "$part" | tr ':,+' '___')
  case $part in
    single:*)
      IFS=: read -r _ framework lengths masks <<<"$part"
      singles "$framework" "$lengths" "$dir" "$masks" ;;
    jax:*:* | torch:*:*)
      IFS=: read -r framework cp tokens backends masks <<<"$part"
      strategies "$framework" "$cp" "$tokens" "$dir" "$backends" "$masks" ;;
    module:*)
      cp=${part#module:}
      lcab "$(limit_for 250)" "$dir" --flagfile=experiments/module_seed.flags --cp_size="$cp" \
        --seqlens="$(global_lengths "$cp" 8k)"
      lcab "$(limit_for 250)" "$dir" --flagfile=experiments/module_paper.flags --cp_size="$cp" \
        --seqlens="$(global_lengths "$cp" 8k)" ;;
    comm) lcab "$(limit_for 60)" "$dir" --suite=comm --framework=jax --comm_ranks=2,4
      lcab "$(limit_for 90)" "$dir" --suite=comm --framework=torch --comm_ranks=2,4 ;;
    profile) lcab "$(limit_for 300)" "$dir" --flagfile=experiments/cp_jax.flags --cp_size=2 --seqlens=64k \
        --masks=full,causal_document --backends=jax.cp_ring,jax.cp_allgather \
        --profile_dir="$dir/traces"
      python3 -m lcab.trace_overlap "$dir/traces" >"$dir/overlap.md" 2>&1
      cat "$dir/overlap.md"
      for trace in "$dir"/traces/*/plugins/profile/*/perfetto_trace.json.gz; do
        case_dir=${trace#"$dir"/traces/}
        cp "$trace" "$dir/${case_dir%%/*}.perfetto_trace.json.gz"
      done ;;
    *) echo "unknown part $part (FRAMEWORK:CP:TOKENS[:BACKENDS[:MASKS]], single:FRAMEWORK:LENGTHS[:MASKS], module:CP, comm, profile)"
      exit 2 ;;
  esac
  python3 -m lcab.report --results="$dir" --summary
done
