#!/usr/bin/env bash
# Do our forward figures move with the clock, and the clock with what ran
# before? On one GPU: pallas_flex, FA3 and cuDNN for JAX on full and causal
# at 32k, the forward timed alone (back-to-back samples), then beside its
# backward (samples in turn, as every table row), then alone again (drift);
# each row carries the SM clock and board power nvidia-smi read while its
# samples ran (the `clocks` column, docs/harness.md). Same forward, lower
# clock beside the backward: the tables' forward is partly power-bound
# (results/gpu/2026-12-02-h200-one-pass/README.md says why we ask).
# Needs the tokamax/FA3 wheels on PYTHONPATH (docs/device.md); each run
# writes OUT/<name>/ and OUT/<name>.log, packed into OUT/rows.tgz after
# each. The last lines: TFLOP/s, MHz and W per row.
#
#   experiments/lab/clocks.sh OUT COMMIT
#
# COMMIT: the full hash, written out (experiments/README.md says why).
set -uo pipefail
usage="usage: $0 OUT COMMIT"
source "$(dirname "$0")/pack.sh"
lab_start "$1" "${2:-}" clocks
run() {  # name, seconds, then lcab.experiments flags
  local name=$1 seconds=$2; shift 2
  run_packed "$out" "$name" timeout -k 10 "$seconds" python3 -m lcab.experiments \
    --flagfile=experiments/seed_blog.flags --framework=jax \
    --backends=jax.pallas_flex,jax.fa3,jax.cudnn --masks=full,causal \
    --seqlens="${LCAB_LAB_SEQLENS:-32k}" --reference_cache="$out/references" \
    "--git_commit=$commit" --noprogress --nosummary --out="$out/$name" "$@"
}
run alone-1 200 --directions=fwd
run pair 240 --directions=fwd,bwd
run alone-2 200 --directions=fwd
for name in "${RUNS[@]}"; do
  echo "## $name"
  python3 - "$out/$name" <<'EOF'
import sys
from lcab import results
print("| backend | mask | dir | TFLOP/s | SM MHz (min) | W |")
print("|---|---|---|---|---|---|")
for row in results.read_rows(sorted(__import__("pathlib").Path(sys.argv[1]).glob("*.jsonl"))):
    clocks = results.json_field(row.get("clocks"))
    tflops = f"{row['tflops']:.1f}" if row.get("tflops") else row["status"]
    print(f"| {row['backend']} | {row['mask']} | {row['direction']} | {tflops} | "
          f"{clocks.get('sm_mhz', '-')} ({clocks.get('sm_mhz_min', '-')}) | "
          f"{clocks.get('power_w', '-')} |")
EOF
done
