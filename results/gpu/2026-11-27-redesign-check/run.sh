#!/usr/bin/env bash
# The redesign against the commit before it, on one machine in one call:
# jax.pallas_flex at full and causal_document 32k (one GPU) and jax.cp_ring
# at cp 2 on the same masks, old tree then new tree, ROUNDS times.
#
#   results/gpu/2026-11-27-redesign-check/run.sh OUT OLD_TREE NEW_COMMIT [ROUNDS]
#
# OLD_TREE holds `git archive 6444b84 jax_backends lcab experiments
# pyproject.toml`; the new tree is the working directory. LCAB_EXTRA adds
# flags (a CPU dry run: "--seqlens=256 --heads=4:2 --head_dim=64");
# LCAB_ORDER="new old" runs the new tree first.
set -u
out=$1 old=$2 commit=$3 rounds=${4:-1}
export XLA_PYTHON_CLIENT_PREALLOCATE=false NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
common=(--flagfile=experiments/common.flags --framework=jax --masks=full,causal_document
        --seqlens=32k --doc_distribution=chatqa2_long_sft --warmup=1 --iters=5
        --noprogress --nosummary)
kernel=(--suite=kernel --backends=jax.pallas_flex)
cp=(--suite=cp --backends=jax.cp_ring --cp_size=2 --dispatch=balanced)
new=$PWD
for round in $(seq 1 "$rounds"); do
  for tree in ${LCAB_ORDER:-old new}; do
    if [ "$tree" = old ]; then dir=$old; sha=6444b84; else dir=$new; sha=$commit; fi
    for suite in kernel cp; do
      if [ "$suite" = kernel ]; then args=("${kernel[@]}"); else args=("${cp[@]}"); fi
      where=$out/round$round/$tree/$suite
      mkdir -p "$where"
      echo "== $(date -u +%H:%M:%S) round $round $tree $suite"
      (cd "$dir" && timeout 280 python3 -m lcab.experiments "${common[@]}" "${args[@]}" \
        --git_commit="$sha" --out="$where" ${LCAB_EXTRA:-} >"$where/log" 2>&1) || echo "   exit $?"
    done
  done
done
python3 - "$out" <<'PY'
import sys
from lcab import results
frame = results.load([sys.argv[1]])
frame["tree"] = frame["git_commit"].map(lambda c: "old" if c == "6444b84" else "new")
ok = frame[frame["status"] == "OK"]
table = ok.pivot_table(index=["backend", "mask", "direction"], columns="tree",
                       values="tflops", aggfunc="median")
table["new/old"] = table["new"] / table["old"]
print(table.round(3).to_string())
bad = frame[frame["status"] != "OK"][["backend", "mask", "direction", "tree", "status",
                                      "reason"]]
print(bad.to_string() if len(bad) else "every row OK")
PY
